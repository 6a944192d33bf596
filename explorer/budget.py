"""One memory budget for the explorer: every cache of models, forwards and probes (a ``ByteCache``) and
every running view (``within_budget``: its estimated peak from explorer.views.View.estimate, reserved before
it starts) share one ceiling in bytes, explorer.limits.memory_ceiling() (env EXPLORER_MEMORY_BYTES). On a GPU
what lives in its memory (weights, recorded attention, probe passes) is a second account under the GPU's own
ceiling, explorer.limits.device_memory_ceiling() (env EXPLORER_DEVICE_MEMORY_BYTES). Least
recently used entries go first; a view that does not fit waits until running ones finish; each cache entry
is computed once under its own lock, so different settings run concurrently and equal ones wait for the
first. Work above LARGE_REQUEST_FLOPS runs on threads of lower OS priority, so small views keep the cores.
"""
from __future__ import annotations

import concurrent.futures
import contextvars
import ctypes
import dataclasses
import functools
import gc
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from .limits import LARGE_REQUEST_FLOPS, device_memory_ceiling, memory_ceiling, request_bytes


# --- caches and running requests under one ceiling in bytes ----------------------------------

def nbytes(value, seen: set | None = None) -> int:
    """Bytes held by a cached value: tensors, arrays, modules, and containers / dataclasses of them. A
    tensor's bytes count once however many hold them (models sharing one state's weights: runs.Weights)."""
    return sum(footprint(value, seen))


_SCALARS = (str, int, float, type(None))


def footprint(value, seen: set | None = None) -> tuple[int, int]:
    """nbytes(value) as (host bytes, bytes in a GPU's own memory): its tensors by where they are."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        size = value.numel() * value.element_size()
        key = (value.device, value.data_ptr(), size) if size else None
        if key in seen:
            return 0, 0
        seen.add(key)
        return (size, 0) if value.device.type == "cpu" else (0, size)
    if isinstance(value, np.ndarray):
        return value.nbytes, 0
    if isinstance(value, (bytes, bytearray)):   # a rendered file (explorer.export.RENDERED)
        return len(value), 0
    if hasattr(value, "held_bytes"):            # a value that counts itself (explorer.figures.Figure)
        return value.held_bytes(), 0
    if isinstance(value, nn.Module):
        parts = [footprint(t, seen) for t in (*value.parameters(), *value.buffers())]
    elif isinstance(value, dict):       # scalars hold nothing counted: skipped without a call (a figure's labels)
        parts = [footprint(v, seen) for v in value.values() if not isinstance(v, _SCALARS)]
    elif isinstance(value, (list, tuple)):
        parts = [footprint(v, seen) for v in value if not isinstance(v, _SCALARS)]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = [footprint(getattr(value, f.name), seen) for f in dataclasses.fields(value)]
    else:
        return 0, 0
    return sum(h for h, _ in parts), sum(d for _, d in parts)


class Memory:
    """The one account of what the explorer holds: cache entries (least recently used first),
    reservations of running requests, and what is held outside them for a while (`hold`: the export
    browser while it runs). Bytes in a GPU's own memory are counted apart, under its own ceiling (on a CPU
    there are none: the models' memory is the host's)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.entries: OrderedDict = OrderedDict()       # (cache, key) -> (host bytes, device bytes), oldest first
        self.cached = 0                                 # host bytes
        self.cached_device = 0
        self.reserved = 0
        self.reserved_device = 0
        self.outside: dict[str, int] = {}               # name -> bytes held outside requests and caches
        self.caches: list["ByteCache"] = []
        self._held = threading.local()                  # this thread's reservation, for nested views
        self.last_active = time.monotonic()             # a request started or ended
        self.trimmed = True                             # nothing ran since the last trim

    def add(self, cache, key, size: int, device_size: int = 0) -> None:
        with self.cond:
            self.entries[(cache, key)] = (size, device_size)
            self.cached += size
            self.cached_device += device_size
            self._evict(self._room(), self._device_room())

    def touch(self, cache, key) -> None:
        with self.cond:
            if (cache, key) in self.entries:
                self.entries.move_to_end((cache, key))

    def drop(self, cache, key) -> None:
        with self.cond:
            host, dev = self.entries.pop((cache, key), (0, 0))
            self.cached -= host
            self.cached_device -= dev

    def _room(self) -> int:
        """(call under self.cond) What the caches may hold beside the running requests and `outside`."""
        return memory_ceiling() - self.reserved - sum(self.outside.values())

    def _device_room(self) -> Optional[int]:
        """(call under self.cond) _room in the GPU's memory; None while nothing is held there."""
        if not (self.cached_device or self.reserved_device):
            return None
        return device_memory_ceiling() - self.reserved_device

    def hold(self, name: str, size: int) -> None:
        """Count `size` bytes held outside any request (until `release(name)`): the caches make room."""
        with self.cond:
            self.outside[name] = size
            self._evict(self._room())

    def release(self, name: str) -> None:
        with self.cond:
            self.outside.pop(name, None)
            self.cond.notify_all()

    def _evict(self, allowed: int, allowed_device: Optional[int] = None) -> None:
        """Drop least recently used entries until the caches' host bytes are within `allowed` and their
        device bytes within `allowed_device` (None: as they are). An entry held in the GPU's memory alone
        stays while only the host's is over."""
        def over() -> tuple[bool, bool]:
            return (self.cached > max(0, allowed),
                    allowed_device is not None and self.cached_device > max(0, allowed_device))
        if not any(over()):
            return
        for (cache, key), (host, dev) in list(self.entries.items()):
            host_over, device_over = over()
            if not (host_over or device_over):
                return
            if (host_over and (host or not dev)) or (device_over and dev):
                self.drop(cache, key)
                cache.entries.pop(key, None)

    @contextmanager
    def reserve(self, size: int, device_size: int = 0):
        """Hold `size` bytes (and `device_size` in a GPU's memory) for a request; wait while they do not fit
        beside the running ones (caches are evicted to make room; one request always runs). A small request
        (the mask view, tens of MiB) never waits behind large ones: the abuse soak's lecture /mask, 14 ms
        alone, waited seconds for cap-sized probe passes to finish."""
        if getattr(self._held, "depth", 0):             # a view inside another view: already admitted
            yield
            return

        def fits() -> bool:
            host = size <= small_request_bytes() or self._room() >= size
            return host and (not device_size or device_memory_ceiling() - self.reserved_device >= device_size)
        with self.cond:
            while (self.reserved or self.reserved_device) and not fits():
                self.cond.wait()
            self.reserved += size
            self.reserved_device += device_size
            self._evict(self._room(), self._device_room())
            self.last_active, self.trimmed = time.monotonic(), False
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            with self.cond:
                self.reserved -= size
                self.reserved_device -= device_size
                self.last_active = time.monotonic()
                self.cond.notify_all()

    def trim_if_idle(self, idle_s: float, keep_bytes: int) -> bool:
        """Once no request has run for `idle_s`: evict down to `keep_bytes` of host memory (least recently
        used first) and hand the freed pages back to the OS. The ceiling bounds memory under load; this brings a
        Space back near its start after the load (a free Space shares its 16 GB with nothing else,
        but a freed tensor stays in the process's heap until malloc_trim). A GPU's memory is left as it is:
        no other process shares it, and its weights are what a GPU machine builds at start-up. True if it
        trimmed."""
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
            self.cached = self.cached_device = 0


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

    def __init__(self, fn: Optional[Callable] = None):
        self.fn = fn
        self.entries: dict = {}
        self.key_locks: dict = {}
        if fn is not None:
            functools.update_wrapper(self, fn)
        MEMORY.caches.append(self)

    def __call__(self, *args):
        return self.get(args, lambda: self.fn(*args))

    def get(self, key, compute: Callable, keep: Callable[[Any], bool] = lambda value: True):
        """The value cached for `key`, else compute() kept when keep(value) (one computation per key at a
        time: a second caller of the same key waits for the first's value)."""
        with MEMORY.cond:
            if key in self.entries:
                MEMORY.entries.move_to_end((self, key))
                return self.entries[key]
            lock = self.key_locks.setdefault(key, threading.Lock())
        with lock:
            with MEMORY.cond:
                if key in self.entries:
                    return self.entries[key]
            try:
                value = compute()
            finally:
                with MEMORY.cond:
                    self.key_locks.pop(key, None)
            if keep(value):
                with MEMORY.cond:
                    self.entries[key] = value
                    MEMORY.add(self, key, *footprint(value))
            return value

    def peek(self, key, max_bytes: Optional[int] = None):
        """The value cached for `key` (now the most recently used) where it is counted at most `max_bytes`,
        else None; nothing is computed."""
        with MEMORY.cond:
            size = MEMORY.entries.get((self, key))
            if key not in self.entries or size is None or (max_bytes is not None and size[0] > max_bytes):
                return None
            MEMORY.entries.move_to_end((self, key))
            return self.entries[key]

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
# OS priority (nice +19, Linux sets it per thread): alone they run as fast, beside small ones they
# yield. Threads of their own, because a thread cannot take its priority back without privileges,
# and Gradio's worker threads serve every request. +19 rather than +10: in the all-modes soak, three
# alternated pairs of runs, honest model views p95 8.8-10.0 s against 10.9-13.0 s at +10, classroom
# 7.9-9.2 s against 10.0-11.5 s, 20 % more honest requests served
# (benchmarks/results/load-soak-ab-nice-2026-11-27.json).
LOW_PRIORITY_NICE = 19


def _lower_this_threads_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOW_PRIORITY_NICE)
    except (AttributeError, OSError):       # not Linux, or not allowed: same priority as the rest
        pass


LOW_PRIORITY = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="large-request",
                                                     initializer=_lower_this_threads_priority)


def on_low_priority(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs) on a low-priority thread, in this thread's context (check_wanted asks about the same
    request); this thread waits (using no CPU) and returns its result or raises its exception. The memory
    reservation of the caller holds for the call."""
    def run():
        MEMORY._held.depth = 1                  # already admitted: nested views do not reserve again
        try:
            return fn(*args, **kwargs)
        finally:
            MEMORY._held.depth = 0
    return LOW_PRIORITY.submit(contextvars.copy_context().run, run).result()


# --- Abandoned work: long work stops between its steps once its requester has gone ----------------
# A lecture pack draws and renders every figure (tens of seconds on a busy Space); a requester whose page closed
# or whose connection dropped is answered nothing, yet the work ran to its end: in the soak of issue 34 a
# botnet's pack rendered on for 17 s after its client left, holding the export browser's memory
# (benchmarks/results/load-soak-rss-after-2026-11-27.json).
class Abandoned(Exception):
    """The requester of the work running has gone: the work stops at its next step and nothing is answered."""


_still_wanted: Callable[[], bool] = lambda: True


def answer_wanted(still_wanted: Callable[[], bool]) -> None:
    """Install how long work asks whether its requester still waits (server.gradio_patches.stop_abandoned_work:
    its event alive in the server's queue). Until then, and in a direct call, it always does."""
    global _still_wanted
    _still_wanted = still_wanted


def check_wanted() -> None:
    """Between the steps of long work: Abandoned once its requester has gone."""
    if not _still_wanted():
        raise Abandoned("the requester has gone")


def within_budget(cost, fn: Callable):
    """fn() once `cost.peak_bytes` fits under the ceiling (reserved while it runs), at a lower CPU
    priority when its work is large (`cost`: explorer.views.View.estimate, already within the device's
    budget). A view drawn inside another's reservation does not reserve again."""
    nested = getattr(MEMORY._held, "depth", 0)
    with MEMORY.reserve(*request_bytes(cost)):
        if cost.flops > LARGE_REQUEST_FLOPS and not nested:
            return on_low_priority(fn)
        return fn()
