"""One memory budget for the explorer: every cache of models, forwards and probes (a ``ByteCache``) and
every running view (``within_budget``: its estimated peak from explorer.views.View.estimate, reserved before
it starts) share one ceiling in bytes, explorer.limits.memory_ceiling() (env EXPLORER_MEMORY_BYTES). Least
recently used entries go first; a view that does not fit waits until running ones finish; each cache entry
is computed once under its own lock, so different settings run concurrently and equal ones wait for the
first. Work above LARGE_REQUEST_FLOPS runs on threads of lower OS priority, so small views keep the cores.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import gc
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable

import numpy as np
import torch
from torch import nn

from .limits import LARGE_REQUEST_FLOPS, memory_ceiling


# --- caches and running requests under one ceiling in bytes ----------------------------------

def nbytes(value, seen: set | None = None) -> int:
    """Bytes held by a cached value: tensors, arrays, modules, and containers / dataclasses of them. A
    tensor's bytes count once however many hold them (models sharing one state's weights: runs.Weights)."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        size = value.numel() * value.element_size()
        key = (value.device, value.data_ptr(), size) if size else None
        if key in seen:
            return 0
        seen.add(key)
        return size
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, nn.Module):
        return sum(nbytes(t, seen) for t in (*value.parameters(), *value.buffers()))
    if isinstance(value, dict):
        return sum(nbytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v, seen) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    return 0


class Memory:
    """The one account of what the explorer holds: cache entries (least recently used first),
    reservations of running requests, and what is held outside them for a while (`hold`: the export
    browser while it runs)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.entries: OrderedDict = OrderedDict()       # (cache, key) -> bytes, oldest first
        self.cached = 0
        self.reserved = 0
        self.outside: dict[str, int] = {}               # name -> bytes held outside requests and caches
        self.caches: list["ByteCache"] = []
        self._held = threading.local()                  # this thread's reservation, for nested views
        self.last_active = time.monotonic()             # a request started or ended
        self.trimmed = True                             # nothing ran since the last trim

    def add(self, cache, key, size: int) -> None:
        with self.cond:
            self.entries[(cache, key)] = size
            self.cached += size
            self._evict(self._room())

    def touch(self, cache, key) -> None:
        with self.cond:
            if (cache, key) in self.entries:
                self.entries.move_to_end((cache, key))

    def drop(self, cache, key) -> None:
        with self.cond:
            self.cached -= self.entries.pop((cache, key), 0)

    def _room(self) -> int:
        """(call under self.cond) What the caches may hold beside the running requests and `outside`."""
        return memory_ceiling() - self.reserved - sum(self.outside.values())

    def hold(self, name: str, size: int) -> None:
        """Count `size` bytes held outside any request (until `release(name)`): the caches make room."""
        with self.cond:
            self.outside[name] = size
            self._evict(self._room())

    def release(self, name: str) -> None:
        with self.cond:
            self.outside.pop(name, None)
            self.cond.notify_all()

    def _evict(self, allowed: int) -> None:
        while self.cached > max(0, allowed) and self.entries:
            (cache, key), size = self.entries.popitem(last=False)
            self.cached -= size
            cache.entries.pop(key, None)

    @contextmanager
    def reserve(self, size: int):
        """Hold `size` bytes for a request; wait while they do not fit beside the running ones
        (caches are evicted to make room; one request always runs). A small request (the mask view,
        tens of MiB) never waits behind large ones: the abuse soak's lecture /mask, 14 ms alone,
        waited seconds for cap-sized probe passes to finish."""
        if getattr(self._held, "depth", 0):             # a view inside another view: already admitted
            yield
            return
        with self.cond:
            while self.reserved and size > small_request_bytes() and self._room() < size:
                self.cond.wait()
            self.reserved += size
            self._evict(self._room())
            self.last_active, self.trimmed = time.monotonic(), False
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            with self.cond:
                self.reserved -= size
                self.last_active = time.monotonic()
                self.cond.notify_all()

    def trim_if_idle(self, idle_s: float, keep_bytes: int) -> bool:
        """Once no request has run for `idle_s`: evict down to `keep_bytes` (least recently used first)
        and hand the freed pages back to the OS. The ceiling bounds memory under load; this brings a
        Space back near its start after the load (a free Space shares its 16 GB with nothing else,
        but a freed tensor stays in the process's heap until malloc_trim). True if it trimmed."""
        with self.cond:
            if self.trimmed or self.reserved or time.monotonic() - self.last_active < idle_s:
                return False
            self._evict(keep_bytes)
            self.trimmed = True
        gc.collect()
        release_freed_memory()
        return True

    def clear(self) -> None:
        with self.cond:
            for cache in self.caches:
                cache.entries.clear()
            self.entries.clear()
            self.cached = 0


def small_request_bytes() -> int:
    """Requests up to 1/24 of the ceiling run at once (170 MiB of 4 GiB; the mask view at the longest
    layout holds its masks and both its figures on their way out, 148 MiB): the light lane runs at most
    4 of them, so they pass the ceiling by at most 1/6 of it."""
    return memory_ceiling() // 24


MEMORY = Memory()


def release_freed_memory() -> None:
    """glibc keeps freed heap pages (tensors under its mmap threshold, up to 32 MB) for reuse:
    malloc_trim(0) returns them to the OS. Measured after four phoenix-nano views: RSS 2.37 GB,
    1.14 GB with the caches emptied, 0.31 GB after the trim. A no-op where libc is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class ByteCache:
    """Memoise `fn` on its (hashable) arguments, sized in bytes in MEMORY. Each key is computed once
    under its own lock: concurrent calls with other keys run in parallel."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.entries: dict = {}
        self.key_locks: dict = {}
        functools.update_wrapper(self, fn)
        MEMORY.caches.append(self)

    def __call__(self, *args):
        with MEMORY.cond:
            if args in self.entries:
                MEMORY.entries.move_to_end((self, args))
                return self.entries[args]
            lock = self.key_locks.setdefault(args, threading.Lock())
        with lock:
            with MEMORY.cond:
                if args in self.entries:
                    return self.entries[args]
            try:
                value = self.fn(*args)
            finally:
                with MEMORY.cond:
                    self.key_locks.pop(args, None)
            with MEMORY.cond:
                self.entries[args] = value
                MEMORY.add(self, args, nbytes(value))
            return value

    def cache_clear(self) -> None:
        with MEMORY.cond:
            for key in list(self.entries):
                MEMORY.drop(self, key)
            self.entries.clear()


# --- CPU share: large requests yield to small ones ---------------------------------------------
# On a 2-core Space, two phoenix-nano probe passes and a timing sweep leave a 14 ms lecture request
# a small share of the cores: the abuse soak's lecture /mask took 0.55 s at its median (measured
# from a separate process too, so not the clients' own load; py-spy: the GIL held under half the
# time, so the cores, not the GIL). Requests above LARGE_REQUEST_FLOPS run on threads of a lower
# OS priority (nice +10, Linux sets it per thread): alone they run as fast, beside small ones they
# yield. Threads of their own, because a thread cannot take its priority back without privileges,
# and Gradio's worker threads serve every request.
LOW_PRIORITY_NICE = 10


def _lower_this_threads_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOW_PRIORITY_NICE)
    except (AttributeError, OSError):       # not Linux, or not allowed: same priority as the rest
        pass


LOW_PRIORITY = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="large-request",
                                                     initializer=_lower_this_threads_priority)


def on_low_priority(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs) on a low-priority thread; this thread waits (using no CPU) and returns its
    result or raises its exception. The memory reservation of the caller holds for the call."""
    def run():
        MEMORY._held.depth = 1                  # already admitted: nested views do not reserve again
        try:
            return fn(*args, **kwargs)
        finally:
            MEMORY._held.depth = 0
    return LOW_PRIORITY.submit(run).result()


def within_budget(cost, fn: Callable):
    """fn() once `cost.peak_bytes` fits under the ceiling (reserved while it runs), at a lower CPU
    priority when its work is large (`cost`: explorer.views.View.estimate, already within the device's
    budget). A view drawn inside another's reservation does not reserve again."""
    nested = getattr(MEMORY._held, "depth", 0)
    with MEMORY.reserve(cost.peak_bytes):
        if cost.flops > LARGE_REQUEST_FLOPS and not nested:
            return on_low_priority(fn)
        return fn()
