"""Models and forwards, cached by settings: a control change re-runs only what it changed.

``build_model(s)`` depends on the model options only (view options are reset first), and the weights
underneath on the geometry and weight source only; ``forward(s)`` runs the ranking model once with
``record=True`` and every view reads the same traces. Both are memoised on the frozen Settings.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch

from models import demo
from models.recsys import RecsysBatch, RecsysConfig, RecsysModel, RecsysOutput, get_preset, init_recsys, synthetic_batch

from .settings import WEIGHT_GEOMETRY, Settings, ValidationError, device

MAX_UPLOAD_BYTES = 200 * 2**20      # one file; phoenix-nano in fp32 is ~45 MB


def recsys_config(s: Settings) -> RecsysConfig:
    """The ranking model's config: the demo world's vocabulary for demo weights, else the preset's."""
    if s.weights == "demo":
        return replace(demo.demo_config(), transformer=s.transformer_config())
    return get_preset(s.preset).recsys_config(s.transformer_config(), num_user_tokens=s.num_user)


@functools.lru_cache(maxsize=8)
def _weights(geometry: tuple) -> dict[str, torch.Tensor]:
    """State dict for a geometry and a weight source; shared by every attention option."""
    s = Settings(**dict(geometry))
    if s.weights == "demo":             # explorer.settings refused "demo" already if the file is missing
        return dict(demo.load_demo_model().state_dict())
    model = RecsysModel(recsys_config(s))
    if s.weights in ("random", "zeros"):
        init_recsys(model, s.weights, s.seed)
        return dict(model.state_dict())
    return _upload_state(s.weights)


# --- uploaded weights: each visitor's own -----------------------------------------------------
# Held per session (Gradio's session hash; gradio_client keeps one per Client) and never listed to
# anyone else; forgotten UPLOAD_TTL_S after their last use, or when the page is closed. A session
# keeps its newest UPLOADS_PER_SESSION; one visitor's uploads never evict another's: when every
# session's uploads together fill MAX_UPLOAD_STORE_BYTES, a new upload is refused by name instead.
# Names are the file's content hash, so two sessions holding one name hold the same weights.
UPLOADS_PER_SESSION = 2
MAX_UPLOAD_STORE_BYTES = 512 * 2**20        # as fp32 tensors: ~3 models at the CPU's 40M-parameter cap
UPLOAD_TTL_S = 3600.0


@dataclass
class Upload:
    state: dict[str, torch.Tensor]
    geometry: dict[str, Any]            # the settings its shapes were checked against
    nbytes: int
    used: float                         # time.monotonic() of the last use


_UPLOADS: dict[str, dict[str, Upload]] = {}     # session -> name -> upload, oldest first
_uploads_lock = threading.Lock()


def _expire_uploads(now: float) -> None:
    for session in list(_UPLOADS):
        mine = _UPLOADS[session]
        for name in [n for n, u in mine.items() if now - u.used > UPLOAD_TTL_S]:
            del mine[name]
        if not mine:
            del _UPLOADS[session]


def uploads(session: str) -> dict[str, dict[str, Any]]:
    """This session's uploads: name -> the geometry they fit (explorer.settings' `uploaded`). Asking
    counts as a use, so weights a visitor is looking at do not expire."""
    now = time.monotonic()
    with _uploads_lock:
        _expire_uploads(now)
        mine = _UPLOADS.get(session, {})
        for u in mine.values():
            u.used = now
        return {name: dict(u.geometry) for name, u in mine.items()}


def forget_uploads(session: str) -> None:
    with _uploads_lock:
        _UPLOADS.pop(session, None)


def _upload_state(weights: str) -> dict[str, torch.Tensor]:
    """The tensors behind "upload:<name>": the validation layer has checked that the asking session
    holds that name, and equal names are equal files, so any session's copy serves."""
    name = weights[len("upload:"):]
    with _uploads_lock:
        for mine in _UPLOADS.values():
            if name in mine:
                return mine[name].state
    raise ValidationError("weights", weights, "an uploaded file the server still holds; upload it again")


def load_upload(s: Settings, path: str, session: str) -> str:
    """Check an uploaded .npz / .safetensors file against the current configuration and keep it for
    this session.

    -> its name for ``Settings.weights = "upload:<name>"``. On any problem a ValidationError names it
    and nothing changes (the current weights stay): shapes, dtypes and values (models.weights), or a
    store without room."""
    from models.weights import EXTENSIONS, load_weights
    filename = Path(path).name
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise ValidationError("weights file", filename, "a .npz or .safetensors file (never pickle)")
    size = Path(path).stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise ValidationError("weights file", f"{size:,} bytes", f"at most {MAX_UPLOAD_BYTES:,} bytes")
    # seeded first: a file exported from the original has no hash tables, and the model keeps these
    model = init_recsys(RecsysModel(recsys_config(replace(s, weights="random"))), "random", s.seed)
    try:
        load_weights(model, path, max_bytes=MAX_UPLOAD_BYTES)
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
        mine = _UPLOADS.get(session, {})
        mine.pop(name, None)                     # uploaded again: now the newest, with this geometry
        evicted = list(mine)[:max(0, len(mine) - UPLOADS_PER_SESSION + 1)]
        held = sum(u.nbytes for m in _UPLOADS.values() for n, u in m.items() if m is not mine or n not in evicted)
        if held + nbytes > MAX_UPLOAD_STORE_BYTES:
            raise ValidationError("weights file", f"{nbytes:,} bytes of weights",
                                  f"room in the server's upload store ({MAX_UPLOAD_STORE_BYTES - held:,} of "
                                  f"{MAX_UPLOAD_STORE_BYTES:,} bytes free; uploads are forgotten "
                                  f"{UPLOAD_TTL_S / 60:.0f} minutes after their last use) — try again later")
        for n in evicted:
            del mine[n]
        mine[name] = Upload(state, geometry, nbytes, now)
        _UPLOADS[session] = mine
    return name


def build_model(s: Settings) -> RecsysModel:
    """The ranking model for these settings, in eval mode, on the explorer's device."""
    return _build_model(model_settings(s))


_GEOMETRY = (*WEIGHT_GEOMETRY, "weights", "seed")


@functools.lru_cache(maxsize=8)
def _build_model(s: Settings) -> RecsysModel:
    state = _weights(tuple((k, getattr(s, k)) for k in _GEOMETRY))
    model = RecsysModel(recsys_config(s))
    model.load_state_dict(state)
    return model.eval().to(device())


def model_settings(s: Settings) -> Settings:
    """The settings with the view options reset: two settings that differ only in what is shown
    share one model and one forward."""
    d = Settings()
    return replace(s, row=d.row, layer=d.layer, head=d.head, values=d.values, color=d.color, query=d.query,
                   candidate=d.candidate, perturbation=d.perturbation, delta=d.delta,
                   replace_with=d.replace_with, operation=d.operation, compare=d.compare, backend=d.backend,
                   variant=d.variant, bug=d.bug)


@functools.lru_cache(maxsize=8)
def _batch_for(s: Settings) -> RecsysBatch:
    if s.weights == "demo":
        return demo.demo_batch(s.layout, s.seed, s.batch_size)
    return synthetic_batch(build_model(s).config, s.layout, s.seed, s.batch_size)


def batch_for(s: Settings) -> RecsysBatch:
    return _batch_for(model_settings(s))


DEFAULT_THREADS = torch.get_num_threads()
SMALL_WORK = 1 << 16      # seq_len * emb_size below which one CPU thread is fastest


@contextlib.contextmanager
def cpu_threads(s: Settings):
    """One intra-op thread for lecture-sized work: on a busy 2-core machine a second thread makes a
    3 ms forward wait ~300 ms at OpenMP barriers. Large models keep every thread."""
    small = s.seq_len * s.emb_size <= SMALL_WORK
    torch.set_num_threads(1 if small else DEFAULT_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(DEFAULT_THREADS)


_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _forward(s: Settings) -> RecsysOutput:
    model = build_model(s)
    batch = _to_device(batch_for(s))
    with torch.no_grad(), _lock, cpu_threads(s):
        return model(batch, record=True, backend="naive")


def forward(s: Settings) -> RecsysOutput:
    """One recorded forward per model-relevant settings, reused by every view."""
    return _forward(model_settings(s))


def score(s: Settings, batch: Optional[RecsysBatch] = None, embeddings=None, *, mask_kind=None,
          record: bool = False, backend: str = "naive") -> RecsysOutput:
    """An uncached run for probes: a changed batch or perturbed embeddings."""
    model = build_model(s)
    with torch.no_grad(), cpu_threads(s):
        if embeddings is not None:      # [B', T, D]: every row shares the layout's padding
            out = forward(s)
            valid = out.valid[:1].expand(embeddings.shape[0], -1)
            return model.score_embeddings(embeddings, valid, out.candidate_start_offset,
                                          record=record, mask_kind=mask_kind, backend=backend)
        return model(_to_device(batch), record=record, mask_kind=mask_kind, backend=backend)


def _to_device(batch: RecsysBatch) -> RecsysBatch:
    dev = device()
    if dev == "cpu":
        return batch
    return RecsysBatch(*(getattr(batch, f).to(dev) for f in batch.__dataclass_fields__))


EXTRA_CACHES: list = []     # probe caches elsewhere register here so an OOM frees them too


def clear_caches() -> None:
    """After CUDA out-of-memory: drop every cached model and forward, then free the allocator."""
    for f in (_weights, _build_model, _batch_for, _forward, *EXTRA_CACHES):
        f.cache_clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
