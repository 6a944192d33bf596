"""Models and forwards, cached by settings: a control change re-runs only what it changed.

``build_model(s)`` depends on the model options only (view options are reset first), and the weights
underneath on the geometry and weight source only; ``forward(s)`` runs the ranking model once with
``record=True`` and every view reads the same traces. Both are memoised on the frozen Settings.

Memory is bounded in bytes, not entries: every cache here (and the probe caches in explorer.views)
is a ``ByteCache``; their entries and the requests running (``within_budget``: a view's estimated peak
from explorer.views.View.estimate, reserved before it starts) share one ceiling,
explorer.limits.memory_ceiling() (env EXPLORER_MEMORY_BYTES). Least recently used entries go first;
a request that does not fit waits until running ones finish. Each cache entry is computed once
under its own lock, so different settings run concurrently and equal ones wait for the first.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import gc
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn

from models import demo
from models.grok import init_params
from models.recsys import RecsysBatch, RecsysModel, RecsysOutput, init_recsys, synthetic_batch
from models.weights import EXTENSIONS, FAMILY_NAMES, WrongFamily, load_weights
from models.xrex import XrexRecsys

from .families import FAMILIES
from .limits import LARGE_REQUEST_FLOPS, device, estimate_params, memory_ceiling
from .schema import Settings, ValidationError
from .settings import WEIGHT_GEOMETRY

log = logging.getLogger("explorer")


# --- memory: caches and running requests under one ceiling in bytes ---------------------------

def nbytes(value) -> int:
    """Bytes held by a cached value: tensors, arrays, modules, and containers / dataclasses of them."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, nn.Module):
        return sum(nbytes(t) for t in (*value.parameters(), *value.buffers()))
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
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


def _no_uploads(weights: str) -> dict[str, torch.Tensor]:
    raise ValidationError("weights", weights, "an uploaded file the server still holds; upload it again")


# Where the tensors behind "upload:<name>" weights come from: the server's store of each visitor's
# uploads (server.uploads sets it when imported); none without a server.
upload_state: Callable[[str], dict[str, torch.Tensor]] = _no_uploads


MAX_UPLOAD_BYTES = 200 * 2**20      # one file; phoenix-nano in fp32 is ~45 MB


@ByteCache
def _weights(geometry: tuple) -> dict[str, torch.Tensor]:
    """State dict for a geometry and a weight source; shared by every attention option."""
    s = Settings(**dict(geometry))
    if s.weights == "demo":             # explorer.settings refused "demo" already if the file is missing
        return dict((demo.load_xrex_demo_model() if s.family == "xrex" else demo.load_demo_model()).state_dict())
    if s.weights in ("random", "zeros"):
        return dict(_initialised(s).state_dict())
    return upload_state(s.weights)


def _initialised(s: Settings) -> RecsysModel | XrexRecsys:
    """The settings' family's ranker with `s.weights` ("random" seeded by `s.seed`, or grok.py's "zeros")."""
    if s.family == "xrex":
        return init_params(XrexRecsys(s.xrex_config()), s.weights, s.seed)
    return init_recsys(RecsysModel(s.recsys_config()), s.weights, s.seed)


def check_upload(s: Settings, path: str, room: Callable[[int], None] = lambda nbytes: None
                 ) -> tuple[str, dict[str, torch.Tensor]]:
    """Check an uploaded .npz / .safetensors file against the configuration -> (its name: the file's
    content hash, its fp32 state dict). On any problem a ValidationError names it: the file's type or
    size, shapes, dtypes and values (models.weights), the other family's names; `room(nbytes)` may refuse
    the state's size first, before anything is built (the server's upload store, server.uploads).

    grok.py's family reads the original's names (models.weights.recsys_spec) over seeded hash tables;
    production's reads its stacked trunk and head (models.xrex.param_spec) into XrexRecsys' ranker, whose
    simplified input layer keeps its seeded weights (production's feature prep is not modelled)."""
    filename = Path(path).name
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise ValidationError("weights file", filename, "a .npz or .safetensors file (never pickle)")
    size = Path(path).stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise ValidationError("weights file", f"{size:,} bytes", f"at most {MAX_UPLOAD_BYTES:,} bytes")
    expected = 4 * estimate_params(s)           # the fp32 state it would be: checked before any is built
    room(expected)
    # seeded first: a file exported from the original has no hash tables (production's: no input layer
    # this port models), and the model keeps these
    with MEMORY.reserve(2 * expected):          # the model, and the file's tensors while they are copied in
        model = _initialised(replace(s, weights="random"))
        try:
            load_weights(model.ranker if isinstance(model, XrexRecsys) else model, path, max_bytes=MAX_UPLOAD_BYTES)
        except WrongFamily as e:
            raise ValidationError("weights file", filename, f"weights of the model family chosen, "
                                  f"{FAMILIES[s.family]}: this file holds {FAMILY_NAMES[e.found]} — choose the "
                                  f"family {FAMILIES[e.found]} first") from None
        except ValueError as e:
            raise ValidationError("weights file", filename, "weights that match the configuration. "
                                  + str(e).split(":", 1)[-1].strip()) from None
    with open(path, "rb") as f:
        name = hashlib.file_digest(f, "sha256").hexdigest()[:16]
    return name, dict(model.state_dict())


def action_names(s: Settings) -> tuple[str, ...]:
    """What each logit of the settings' ranker predicts (19 for grok.py's, 64 for production's)."""
    model = build_model(s)
    return model.action_names if isinstance(model, XrexRecsys) else model.config.action_names


def build_model(s: Settings) -> RecsysModel | XrexRecsys:
    """The ranking model for these settings, in eval mode, on the explorer's device."""
    return _build_model(model_settings(s))


_GEOMETRY = (*WEIGHT_GEOMETRY, "weights", "seed")


@ByteCache
def _build_model(s: Settings) -> RecsysModel:
    state = _weights(tuple((k, getattr(s, k)) for k in _GEOMETRY))
    if s.family == "xrex":
        model = demo.xrex_demo_model(s.xrex_config()) if s.weights == "demo" else XrexRecsys(s.xrex_config())
    else:
        model = RecsysModel(s.recsys_config())
    model.load_state_dict(state)
    return model.eval().to(device())


def model_settings(s: Settings) -> Settings:
    """The settings with the view options reset: two settings that differ only in what is shown
    share one model and one forward."""
    d = Settings()
    return replace(s, row=d.row, layer=d.layer, head=d.head, values=d.values, color=d.color, query=d.query, zoom=d.zoom,
                   candidate=d.candidate, perturbation=d.perturbation, delta=d.delta,
                   replace_with=d.replace_with, operation=d.operation, compare=d.compare,
                   variant=d.variant, bug=d.bug)


def make_batch(s: Settings, seed: int) -> RecsysBatch:
    """Inputs for these settings drawn with `seed`: the demo world's for demo weights, else random
    hashes in the model's vocabulary. Uncached; views use batch_for."""
    if s.weights == "demo":
        return demo.demo_batch(s.layout, seed, s.batch_size)
    return synthetic_batch(s.recsys_config(), s.layout, seed, s.batch_size)


@ByteCache
def _batch_for(s: Settings) -> RecsysBatch:
    return make_batch(s, s.seed)


def batch_for(s: Settings) -> RecsysBatch:
    return _batch_for(model_settings(s))


@ByteCache
def _forward(s: Settings) -> RecsysOutput:
    model = build_model(s)
    batch = _to_device(batch_for(s))
    with torch.no_grad():
        return model(batch, record=True, backend="naive")


def forward(s: Settings) -> RecsysOutput:
    """One recorded forward per model-relevant settings, reused by every view."""
    return _forward(model_settings(s))


def score(s: Settings, batch: Optional[RecsysBatch] = None, embeddings=None, *, mask_kind=None,
          record: bool = False) -> RecsysOutput:
    """An uncached run for probes: a changed batch or perturbed embeddings, in naive attention (the
    attention weights the views draw and the exact reference every backend is tested against)."""
    model = build_model(s)
    with torch.no_grad():
        if embeddings is not None:      # [B', T, D]: every row shares the layout's padding
            out = forward(s)
            valid = out.valid[:1].expand(embeddings.shape[0], -1)
            return model.score_embeddings(embeddings, valid, out.candidate_start_offset,
                                          record=record, mask_kind=mask_kind, backend="naive")
        return model(_to_device(batch), record=record, mask_kind=mask_kind, backend="naive")


def _to_device(batch: RecsysBatch) -> RecsysBatch:
    dev = device()
    if dev == "cpu":
        return batch
    return RecsysBatch(*(getattr(batch, f).to(dev) for f in batch.__dataclass_fields__))


def clear_caches() -> None:
    """After CUDA out-of-memory: drop every cached model, forward and probe result, then free the allocator."""
    MEMORY.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
