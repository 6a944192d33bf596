"""Models and forwards, cached by settings: a control change re-runs only what it changed.

``build_model(s)`` depends on the model options only (view options are reset first), and the weights
underneath on the geometry and weight source only; ``forward(s)`` runs the ranking model once with
``record=True`` and every view reads the same traces. Both are memoised on the frozen Settings.

Memory is bounded in bytes, not entries: every cache here (and the probe caches in explorer.views)
is a ``ByteCache``; their entries and the requests running (``within_budget``: a view's estimated peak
from explorer.views.View.estimate, reserved before it starts) share one ceiling,
explorer.settings.memory_ceiling() (env EXPLORER_MEMORY_BYTES). Least recently used entries go first;
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

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


MAX_UPLOAD_BYTES = 200 * 2**20      # one file; phoenix-nano in fp32 is ~45 MB


@ByteCache
def _weights(geometry: tuple) -> dict[str, torch.Tensor]:
    """State dict for a geometry and a weight source; shared by every attention option."""
    s = Settings(**dict(geometry))
    if s.weights == "demo":             # explorer.settings refused "demo" already if the file is missing
        return dict((demo.load_xrex_demo_model() if s.family == "xrex" else demo.load_demo_model()).state_dict())
    if s.weights in ("random", "zeros"):
        return dict(_initialised(s).state_dict())
    return _upload_state(s.weights)


def _initialised(s: Settings) -> RecsysModel | XrexRecsys:
    """The settings' family's ranker with `s.weights` ("random" seeded by `s.seed`, or grok.py's "zeros")."""
    if s.family == "xrex":
        return init_params(XrexRecsys(s.xrex_config()), s.weights, s.seed)
    return init_recsys(RecsysModel(s.recsys_config()), s.weights, s.seed)


# --- uploaded weights: each visitor's own -----------------------------------------------------
# Held per session (Gradio's session hash; gradio_client keeps one per Client) and never listed to
# anyone else; forgotten UPLOAD_TTL_S after their last use, or PAGE_GONE_GRACE_S after the page
# was closed (a dropped heartbeat of an open page is back within seconds). A session keeps its newest
# UPLOADS_PER_SESSION; the sessions of one visitor key (server.admission: an address or a signed-in
# user) hold at most UPLOAD_SHARE_BYTES together, and nobody's uploads evict another's: when the
# store (MAX_UPLOAD_STORE_BYTES) is full, a new upload is refused by name instead.
# Names are the file's content hash, so two sessions holding one name hold the same weights.
UPLOADS_PER_SESSION = 2
MAX_UPLOAD_STORE_BYTES = 512 * 2**20        # as fp32 tensors: ~3 models at the CPU's 40M-parameter cap
UPLOAD_SHARE_BYTES = MAX_UPLOAD_STORE_BYTES * 3 // 8    # one visitor: one cap-sized model, or a few small
UPLOAD_TTL_S = 3600.0
PAGE_GONE_GRACE_S = 600.0


@dataclass
class Upload:
    state: dict[str, torch.Tensor]
    geometry: dict[str, Any]            # the settings its shapes were checked against
    nbytes: int
    used: float                         # time.monotonic() of the last use
    visitor: str = "local"              # server.admission's visitor key of the session that loaded it


_UPLOADS: dict[str, dict[str, Upload]] = {}     # session -> name -> upload, oldest first
_GONE: dict[str, float] = {}                    # session -> when its page was closed
_FORGOTTEN: dict[str, tuple[set, str]] = {}     # session -> (names forgotten, why), for the next message
_uploads_lock = threading.Lock()


def _expire_uploads(now: float) -> None:
    for session in list(_UPLOADS):
        mine = _UPLOADS[session]
        gone = _GONE.get(session)
        if gone is not None and now - gone > PAGE_GONE_GRACE_S:
            why = f"{PAGE_GONE_GRACE_S / 60:.0f} minutes after the page was closed"
            expired = list(mine)
        else:
            why = f"{UPLOAD_TTL_S / 60:.0f} minutes after their last use"
            expired = [n for n, u in mine.items() if now - u.used > UPLOAD_TTL_S]
        for name in expired:
            del mine[name]
        if expired:
            names, _ = _FORGOTTEN.get(session, (set(), ""))
            _FORGOTTEN[session] = (names | set(expired), why)
        if not mine:
            del _UPLOADS[session]
            _GONE.pop(session, None)
    while len(_FORGOTTEN) > 10_000:                 # notes for sessions that never came back
        _FORGOTTEN.pop(next(iter(_FORGOTTEN)))


def uploads(session: str) -> dict[str, dict[str, Any]]:
    """This session's uploads: name -> the geometry they fit (explorer.settings' `uploaded`). Asking
    counts as a use (and as the page being open), so weights a visitor is looking at do not expire."""
    now = time.monotonic()
    with _uploads_lock:
        _expire_uploads(now)
        _GONE.pop(session, None)
        mine = _UPLOADS.get(session, {})
        for u in mine.values():
            u.used = now
        return {name: dict(u.geometry) for name, u in mine.items()}


def forgotten(session: str, name: str) -> Optional[str]:
    """Why this session's upload `name` was forgotten (e.g. '10 minutes after the page was closed'),
    or None if it never held it."""
    with _uploads_lock:
        names, why = _FORGOTTEN.get(session, (set(), ""))
        return why if name in names else None


def page_gone(session: str) -> None:
    """The page of `session` was closed (or lost its connection): its uploads go after
    PAGE_GONE_GRACE_S unless it comes back."""
    with _uploads_lock:
        if session in _UPLOADS:
            _GONE[session] = time.monotonic()


def _check_room(session: str, visitor: str, nbytes: int, name: str = "") -> dict[str, Upload]:
    """(call under _uploads_lock) Refuse by name an upload of `nbytes` past the visitor's share or the store;
    -> the session's uploads. The visitor's closed pages' uploads go first (a reload leaves its old page's
    uploads behind: they are this visitor's own, and counted against the same share), then the session's
    oldest past UPLOADS_PER_SESSION."""
    for other in [o for o in _UPLOADS if o in _GONE and o != session]:
        if any(u.visitor == visitor for u in _UPLOADS[other].values()):
            _forget(other, "when your reloaded page uploaded again")
    mine = _UPLOADS.get(session, {})
    others = [n for n in mine if n != name]     # `name` is replaced; the oldest past the session's count go
    evicted = set(others[:max(0, len(others) - UPLOADS_PER_SESSION + 1)]) | {name}
    kept = [u for m in _UPLOADS.values() for n, u in m.items() if m is not mine or n not in evicted]
    ours = sum(u.nbytes for u in kept if u.visitor == visitor)
    if ours + nbytes > UPLOAD_SHARE_BYTES:
        raise ValidationError("weights file", f"{ours + nbytes:,} bytes of weights held by your uploads",
                              f"{UPLOAD_SHARE_BYTES:,} bytes per visitor (every page and client of one "
                              f"address together) — close another page's uploads or wait "
                              f"{UPLOAD_TTL_S / 60:.0f} minutes for them to be forgotten")
    held = sum(u.nbytes for u in kept)
    if held + nbytes > MAX_UPLOAD_STORE_BYTES:
        raise ValidationError("weights file", f"{nbytes:,} bytes of weights",
                              f"room in the server's upload store ({MAX_UPLOAD_STORE_BYTES - held:,} of "
                              f"{MAX_UPLOAD_STORE_BYTES:,} bytes free; uploads are forgotten "
                              f"{UPLOAD_TTL_S / 60:.0f} minutes after their last use) — try again later")
    return mine


def _forget(session: str, why: str) -> None:
    """(call under _uploads_lock) Drop every upload of `session`, noting why for its next message."""
    names, _ = _FORGOTTEN.get(session, (set(), ""))
    _FORGOTTEN[session] = (names | set(_UPLOADS.pop(session, {})), why)
    _GONE.pop(session, None)


def adopt(session: str, visitor: str, name: str) -> bool:
    """A page opened on a link naming `upload:<name>` takes that upload over from a closed page of the same
    visitor (a reload: a new session hash, the old one gone), so it is not left counting against the share
    until it expires. -> whether it did."""
    with _uploads_lock:
        for other, theirs in _UPLOADS.items():
            u = theirs.get(name)
            if other != session and other in _GONE and u is not None and u.visitor == visitor:
                mine = _UPLOADS.setdefault(session, {})
                mine[name] = theirs.pop(name)
                if not theirs:
                    del _UPLOADS[other]
                    _GONE.pop(other, None)
                return True
    return False


def _upload_state(weights: str) -> dict[str, torch.Tensor]:
    """The tensors behind "upload:<name>": the validation layer has checked that the asking session
    holds that name, and equal names are equal files, so any session's copy serves."""
    name = weights[len("upload:"):]
    with _uploads_lock:
        for mine in _UPLOADS.values():
            if name in mine:
                return mine[name].state
    raise ValidationError("weights", weights, "an uploaded file the server still holds; upload it again")


def load_upload(s: Settings, path: str, session: str, visitor: str = "local") -> str:
    """Check an uploaded .npz / .safetensors file against the current configuration and keep it for
    this session.

    -> its name for ``Settings.weights = "upload:<name>"``. On any problem a ValidationError names it
    and nothing changes (the current weights stay): shapes, dtypes and values (models.weights), the other
    family's names, or a store without room.

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
    with _uploads_lock:
        _expire_uploads(time.monotonic())
        _check_room(session, visitor, expected)
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
    state = dict(model.state_dict())
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    geometry = {f: getattr(s, f) for f in WEIGHT_GEOMETRY}
    now = time.monotonic()
    with _uploads_lock:
        _expire_uploads(now)
        mine = _check_room(session, visitor, nbytes, name)
        mine.pop(name, None)                     # uploaded again: now the newest, with this geometry
        for n in list(mine)[:max(0, len(mine) - UPLOADS_PER_SESSION + 1)]:
            del mine[n]
        mine[name] = Upload(state, geometry, nbytes, now, visitor)
        _UPLOADS[session] = mine
        _FORGOTTEN.pop(session, None)
    return name


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
