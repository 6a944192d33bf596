"""Models and forwards, cached by settings: a control change re-runs only what it changed.

``build_model(s)`` depends on the model options only (``s.model``), and the weights
underneath on the geometry and weight source only: they are made once, put on the device once, and every
model over them (one per mask, RoPE mode, cap ...) reads the same tensors, so another model option costs
no copy and no memory. ``forward(s)`` runs the ranking model once with ``record=True`` and every view
reads the same traces. Both are memoised on the frozen ``s.model``, in explorer.budget's byte-bounded caches.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from models import demo
from models.bugzoo import with_bug
from models.grok import init_params
from models.recsys import RecsysBatch, RecsysModel, RecsysOutput, init_recsys, synthetic_batch
from models.weights import EXTENSIONS, FAMILY_NAMES, WrongFamily, load_weights
from models.xrex import XrexRecsys

from .budget import MEMORY, ByteCache
from .families import FAMILIES
from .limits import device, estimate_params
from .schema import WEIGHT_GEOMETRY, ModelSettings, Settings, ValidationError

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


@dataclass
class Weights:
    """One geometry's weights from one source, on the explorer's device, and the models built over them
    (build_model): they share these tensors, so the cache counts them once (explorer.budget.nbytes) and
    evicting the weights drops their models too. A model is modules only (~ms to build): the last
    MODELS_PER_WEIGHTS used are kept, and beside each its trunk's bugged copies (bugged_trunk), which go
    with it."""
    state: dict[str, torch.Tensor]
    models: OrderedDict = field(default_factory=OrderedDict)     # model settings -> the model over `state`
    bugged: dict = field(default_factory=dict)     # (model settings, bug) -> its trunk with the bug, over `state`
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


MODELS_PER_WEIGHTS = 16


@ByteCache
def _weights(geometry: tuple) -> Weights:
    """The weights for a geometry and a weight source, moved to the device once; shared by every
    attention option."""
    s = ModelSettings(**dict(geometry))
    if s.weights == "demo":             # explorer.settings refused "demo" already if the file is missing
        state = (demo.load_xrex_demo_model() if s.family == "xrex" else demo.load_demo_model()).state_dict()
    elif s.weights in ("random", "zeros"):
        state = _initialised(s).state_dict()
    else:
        state = upload_state(s.weights)
    dev = device()
    return Weights({k: v.to(dev) for k, v in state.items()})


class _NoRandomFills(TorchFunctionMode):
    """Random fills of meta tensors do nothing (there is nothing to fill): nn.Embedding's default init
    would otherwise reach torch's Python meta kernels, whose first call imports torch._dynamo (~2.5 s)."""

    FILLS = (torch.nn.init.normal_, torch.nn.init.uniform_, torch.Tensor.normal_, torch.Tensor.uniform_)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        filled = (args[0] if args else kwargs.get("tensor")) if func in self.FILLS else None
        if isinstance(filled, torch.Tensor) and filled.is_meta:
            return filled
        return func(*args, **kwargs)


def _unfilled(s: ModelSettings) -> RecsysModel | XrexRecsys:
    """The settings' family's ranker built on the meta device: its modules and parameter shapes, no memory
    yet (its constructors' zeros and default inits would all be overwritten)."""
    with torch.device("meta"), _NoRandomFills():
        if s.family == "xrex":
            return demo.xrex_demo_model(s.xrex_config()) if s.weights == "demo" else XrexRecsys(s.xrex_config())
        return RecsysModel(s.recsys_config())


def _initialised(s: ModelSettings, for_file: bool = False) -> RecsysModel | XrexRecsys:
    """The settings' family's ranker with `s.weights` ("random" seeded by `s.seed`, or grok.py's "zeros"),
    on the CPU (the seeded generator is the CPU's: the same weights on any device). Every parameter is
    written by the init, so the memory starts unfilled. `for_file`: about to load a weight file — grok.py's
    family draws only its hash tables (the file writes the rest, whose draws would be thrown away; a file
    without tables keeps these: the same weights after the load); production's draws all, since its input
    layer keeps its draws, which follow the trunk's from one generator."""
    model = _unfilled(s).to_empty(device="cpu")
    if s.family == "xrex":
        return init_params(model, s.weights, s.seed)
    return init_recsys(model, s.weights, s.seed, tables_only=for_file)


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
        model = _initialised(replace(s.model, weights="random"), for_file=True)
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
    """The ranking model for these settings, in eval mode, on the explorer's device: built once per model
    settings over the geometry's shared weights (no copy: a new mask or RoPE mode takes milliseconds)."""
    return _built(s.model)


def _built(m: ModelSettings) -> RecsysModel | XrexRecsys:
    weights = _weights(tuple((k, getattr(m, k)) for k in _GEOMETRY))
    with weights.lock:
        if m not in weights.models:
            model = _unfilled(m)
            model.load_state_dict(weights.state, assign=True)
            weights.models[m] = model.eval()
            while len(weights.models) > MODELS_PER_WEIGHTS:
                evicted, _ = weights.models.popitem(last=False)
                for key in [key for key in weights.bugged if key[0] == evicted]:
                    del weights.bugged[key]
        weights.models.move_to_end(m)
        return weights.models[m]


def bugged_trunk(s: Settings, bug: str) -> nn.Module:
    """build_model(s).transformer with `bug` planted (models.bugzoo.with_bug): copied once per model and
    kept beside it, for every bug report and bug zoo view of these settings (six copies a report, each a walk
    of the module tree holding the GIL). A copy is modules only over the model's own tensors, so it costs the byte
    account nothing more than the model (explorer.budget.nbytes counts a tensor once); the model's eviction
    (_built) or its weights' takes its copies with it. "none": the trunk itself."""
    return _bugged(s.model, bug)


def _bugged(m: ModelSettings, bug: str) -> nn.Module:
    trunk = _built(m).transformer
    if bug in (None, "none"):
        return trunk
    weights = _weights(tuple((k, getattr(m, k)) for k in _GEOMETRY))
    with weights.lock:
        model = weights.models.get(m)
        if model is None or model.transformer is not trunk:
            return with_bug(trunk, bug)            # evicted (or rebuilt) since: nothing to keep it beside
        if (m, bug) not in weights.bugged:
            weights.bugged[(m, bug)] = with_bug(trunk, bug)
        return weights.bugged[(m, bug)]


_GEOMETRY = (*WEIGHT_GEOMETRY, "weights", "seed")


def make_batch(s: ModelSettings, seed: int) -> RecsysBatch:
    """Inputs for these settings drawn with `seed`: the demo world's for demo weights, else random
    hashes in the model's vocabulary. Uncached; views use batch_for."""
    if s.weights == "demo":
        return demo.demo_batch(s.layout, seed, s.batch_size)
    return synthetic_batch(s.recsys_config(), s.layout, seed, s.batch_size)


@ByteCache
def _batch_for(m: ModelSettings) -> RecsysBatch:
    return make_batch(m, m.seed)


def batch_for(s: Settings) -> RecsysBatch:
    return _batch_for(s.model)


@ByteCache
def _forward(m: ModelSettings) -> RecsysOutput:
    model = _built(m)
    batch = _to_device(_batch_for(m))
    with torch.no_grad():
        return model(batch, record=True, backend="naive")


def forward(s: Settings) -> RecsysOutput:
    """One recorded forward per model-relevant settings, reused by every view."""
    return _forward(s.model)


# What a server builds and runs once at start-up (app.warm_up), so that no visitor's first call pays for it: the
# default view's model and phoenix-nano's; on a GPU the production presets' too, whose seeded weights take ~12 s of
# one CPU thread at phoenix-prod (models.grok.truncated_normal_ draws a whole tensor again while any value is out of
# range: ~7 normals a weight) and whose first forward starts CUDA — then a first call is the view's own work. Not
# on a CPU, which refuses those presets, nor on ZeroGPU, where a GPU exists only inside a @spaces.GPU call.
WARM_UP = ("lecture", "phoenix-nano")
WARM_UP_ON_GPU = ("phoenix-prod", "phoenix-2026", "phoenix-2026-seqpack")


def warm_up_queries() -> tuple[str, ...]:
    """The links app.warm_up runs (runs.forward) in the background after start-up, in order."""
    gpu = device() == "cuda" and not os.environ.get("SPACES_ZERO_GPU")
    return tuple(f"preset={p}" for p in WARM_UP + (WARM_UP_ON_GPU if gpu else ()))


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
