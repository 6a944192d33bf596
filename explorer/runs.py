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
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from models import demo
from models.recsys import RecsysBatch, RecsysConfig, RecsysModel, RecsysOutput, get_preset, init_recsys, synthetic_batch

from .settings import Settings, ValidationError, device

# uploaded weight files, by name: {name: {parameter name: tensor}} (kept small: a few entries)
UPLOADED: dict[str, dict[str, torch.Tensor]] = {}
_lock = threading.Lock()
MAX_UPLOAD_BYTES = 200 * 2**20      # phoenix-nano in fp32 is ~45 MB


def uploaded_names() -> frozenset:
    return frozenset(UPLOADED)


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
    name = s.weights[len("upload:"):]
    if name not in UPLOADED:
        raise ValidationError("weights", s.weights, "an uploaded file the server still holds; upload it again")
    return UPLOADED[name]


def load_upload(s: Settings, path: str) -> str:
    """Check an uploaded .npz / .safetensors file against the current configuration and keep it.

    -> its name for ``Settings.weights = "upload:<name>"``. On any problem a ValidationError lists
    every mismatch and nothing changes (the current weights stay)."""
    from models.weights import EXTENSIONS, load_weights
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise ValidationError("weights file", Path(path).name, "a .npz or .safetensors file (never pickle)")
    size = Path(path).stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise ValidationError("weights file", f"{size:,} bytes", f"at most {MAX_UPLOAD_BYTES:,} bytes")
    # seeded first: a file exported from the original has no hash tables, and the model keeps these
    model = init_recsys(RecsysModel(recsys_config(replace(s, weights="random"))), "random", s.seed)
    try:
        load_weights(model, path, max_bytes=MAX_UPLOAD_BYTES)
    except ValueError as e:
        raise ValidationError("weights file", Path(path).name, "weights that match the configuration. "
                              + str(e).split(":", 1)[-1].strip()) from None
    name = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    with _lock:
        while len(UPLOADED) >= 4:              # keep memory bounded: forget the oldest
            UPLOADED.pop(next(iter(UPLOADED)))
        UPLOADED[name] = dict(model.state_dict())
    return name


def build_model(s: Settings) -> RecsysModel:
    """The ranking model for these settings, in eval mode, on the explorer's device."""
    return _build_model(model_settings(s))


_GEOMETRY = ("preset", "num_user", "emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers",
             "widening_factor", "weights", "seed")


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
