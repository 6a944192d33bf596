"""Models and forwards, cached by settings: a control change re-runs only what it changed.

``build_model(s)`` depends on the model options only (view options are reset first), and the weights
underneath on the geometry and weight source only; ``forward(s)`` runs the ranking model once with
``record=True`` and every view reads the same traces. Both are memoised on the frozen Settings, in
explorer.budget's byte-bounded caches.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import torch

from models import demo
from models.grok import init_params
from models.recsys import RecsysBatch, RecsysModel, RecsysOutput, init_recsys, synthetic_batch
from models.weights import EXTENSIONS, FAMILY_NAMES, WrongFamily, load_weights
from models.xrex import XrexRecsys

from .budget import MEMORY, ByteCache
from .families import FAMILIES
from .limits import device, estimate_params
from .schema import Settings, ValidationError
from .settings import WEIGHT_GEOMETRY

log = logging.getLogger("explorer")


def _no_uploads(weights: str) -> dict[str, torch.Tensor]:
    raise ValidationError("weights", weights, "an uploaded file the server still holds; upload it again")


# Where the tensors behind "upload:<name>" weights come from (serve_uploads); none without a server.
upload_state: Callable[[str], dict[str, torch.Tensor]] = _no_uploads


def serve_uploads(source: Callable[[str], dict[str, torch.Tensor]]) -> None:
    """Take "upload:<name>" weights from `source` (weights -> state dict): the server's store of each
    visitor's uploads, set once at start-up (app.build_app)."""
    global upload_state
    upload_state = source


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
