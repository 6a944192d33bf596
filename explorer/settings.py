"""The one validation layer: every control of the explorer, parsed from raw UI / API / URL values.

``parse_settings(raw)`` turns a mapping of strings or numbers (a URL query string, the UI's control
values, a gradio_client call) into a frozen, hashable ``Settings``. Fields left out take the preset's
values, so ``?preset=phoenix-nano`` alone is a full configuration. Every violation raises
``ValidationError(field, value, allowed)`` — a ValueError whose message names all three; handlers.py turns
it into ``gr.Error``. ``to_query`` writes only what differs from the preset, and
``parse_query(to_query(s)) == s``.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Mapping, Optional
from urllib.parse import parse_qsl, urlencode

import torch

from models.attention import CAP_METHODS
from models.bugzoo import bug_names
from models.demo import DEMO_WEIGHTS, XREX_DEMO_WEIGHTS, demo_config
from models.grok import ROPE_MODES, TransformerConfig
from models.masks import MASK_KINDS, PREFIX_MODES, model_mask_kind
from models.probes import PERTURBATIONS
from models.presets import PRESETS
from models.recsys import RecsysConfig, SequenceLayout
from models.variants import VARIANTS
from models.weights import recsys_spec
from models.xrex import XrexConfig, param_spec as xrex_spec, project_then_sum_params

WEIGHT_SOURCES = ("random", "zeros", "demo", "upload")
# the fields that decide the weights' shapes: uploaded weights are held to the values they were loaded at
WEIGHT_GEOMETRY = ("preset", "family", "num_user", "emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers",
                   "widening_factor")
# the model family every view runs: grok.py's port (models/grok.py, models/recsys.py) or production's
# 2026 trunk (models/xrex.py) behind a production-shaped input (models.xrex.XrexRecsys)
FAMILIES = {"grok": "grok.py (2025 open source)", "xrex": "production (2026)"}
XREX_ROPE = "right-anchored"        # production's positions; grok.py's rope modes do not apply to it
# what the production family fixes when a 2025 preset runs on it (a link or a family switch)
XREX_FIXED = dict(prefix="bidirectional", rope_mode=XREX_ROPE, cap_method="none", weights="random", rope_offset=0)
# Every preset (models.presets.PRESETS) belongs to one family: grok.py's may be moved to production's trunk
# with the family control; production's imply it. Leaving production's family from one of its presets goes to
# grok.py's preset of the same geometry.
GROK_COUNTERPART = {name: next(grok for grok, q in PRESETS.items()
                               if q.family == "grok" and q.geometry == p.geometry)
                    for name, p in PRESETS.items() if p.family == "xrex"}
VALUE_KINDS = ("probabilities", "capped logits", "masked logits")
COLOR_SCALES = ("linear", "log", "quantile")
# heatmap regions drawn at full resolution (explorer.views.zoom_region)
ZOOMS = ("all", "candidates", "history tail", "query row")
INVARIANCE_OPS = ("permute", "drop", "add")

# The longest layout any view draws (the mask view builds no model: two [T, T] masks and tile maps):
# production's padded sequence (2 + 1022 + 128 = 1152) and more. What a model view may run is bounded by
# its memory and work instead (check_model_fits, check_budget), which name the field to turn down.
CPU_MAX_SEQ_LEN = 2048
GPU_MAX_SEQ_LEN = 4096
# ... and on a CPU a model of about phoenix-nano's size.
CPU_MAX_PARAMS = 40_000_000
GPU_MAX_PARAMS = 1_500_000_000
# The recorded forward keeps every layer's attention weights and capped logits ([Hq, T, T] fp32 each)
# and runs.forward caches 8 of them: phoenix-nano needs 144 MiB; 64 heads x 16 layers at T 1087 9 GiB.
CPU_MAX_TRACE_BYTES = 512 * 2**20
GPU_MAX_TRACE_BYTES = 8 * 2**30
MAX_BATCH = 8                       # rows of inputs per forward; the views show one of them
MAX_SWEEP_SECONDS_CPU = 30.0
MAX_SWEEP_SECONDS_GPU = 120.0
# What one request may cost, estimated from the settings before it runs (explorer.views.View.estimate):
# floating-point work of every forward it runs (probe passes included) — a 2-core CPU Space does
# ~20-40 GFLOP/s per thread, so 600 GFLOP is well under a minute — and the memory it holds while it runs.
CPU_MAX_REQUEST_FLOPS = 600e9
GPU_MAX_REQUEST_FLOPS = 200e12
# Everything the explorer keeps (cached models, recorded forwards, probe results) plus what running
# requests hold stays under this many bytes (explorer.runs admits requests and evicts caches against
# it). 4 GiB leaves a free 16 GB Space (and the process's own ~1 GB) plenty of headroom.
MEMORY_CEILING_ENV = "EXPLORER_MEMORY_BYTES"
DEFAULT_MEMORY_CEILING = 4 * 2**30
# What a view sends back is bounded before it runs: heatmap cells per figure (a zoomed grid is pooled
# past it), each ~6 bytes on the wire (float32 as base64 plus the JSON around it), held about three
# times over while it is serialised (figure, JSON, response) — counted in every view's peak bytes.
MAX_FIGURE_CELLS = 2_200_000
FIGURE_PEAK_BYTES = 3 * 6 * MAX_FIGURE_CELLS
# The timing tab's sequence lengths: memory-bound backends are refused per point by the benchmark's RAM
# guard, and the sweep by its time budget; on a GPU flash goes on to 32k where naive runs out of memory.
TIMING_MAX_LEN_CPU = 2048
TIMING_MAX_LEN_GPU = 32768


class ValidationError(ValueError):
    """A control holds a value the explorer cannot use. The message names field, value and what is allowed;
    `also`: the other fields whose values make it invalid (KV heads for a query-head count they do not divide)."""

    def __init__(self, field: str, value: Any, allowed: str, also: tuple = ()):
        self.field, self.value, self.allowed, self.also = field, value, allowed, tuple(also)
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"{field}: got {shown}; allowed: {allowed}")


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def max_seq_len() -> int:
    return GPU_MAX_SEQ_LEN if device() == "cuda" else CPU_MAX_SEQ_LEN


def max_params() -> int:
    return GPU_MAX_PARAMS if device() == "cuda" else CPU_MAX_PARAMS


def max_trace_bytes() -> int:
    return GPU_MAX_TRACE_BYTES if device() == "cuda" else CPU_MAX_TRACE_BYTES


def timing_max_len() -> int:
    return TIMING_MAX_LEN_GPU if device() == "cuda" else TIMING_MAX_LEN_CPU


def sweep_budget_s() -> float:
    return MAX_SWEEP_SECONDS_GPU if device() == "cuda" else MAX_SWEEP_SECONDS_CPU


def memory_ceiling() -> int:
    """Bytes the explorer's caches and running requests may hold together (env EXPLORER_MEMORY_BYTES)."""
    raw = os.environ.get(MEMORY_CEILING_ENV, "")
    try:
        value = int(float(raw)) if raw.strip() else DEFAULT_MEMORY_CEILING
    except ValueError:
        raise ValidationError(MEMORY_CEILING_ENV, raw, "a number of bytes, e.g. 4e9") from None
    if value < 2**28:
        raise ValidationError(MEMORY_CEILING_ENV, raw, "at least 268435456 (256 MiB)")
    return value


def max_request_bytes() -> int:
    """One request may hold at most half the ceiling, so two of the largest can run side by side."""
    return memory_ceiling() // 2


# A request estimated above this is large: it runs at a lower CPU priority (explorer.runs) in the server's heavy
# lane, one at a time (explorer.admission). Lecture views are < 0.3 GFLOP; phoenix-nano's 26-150; a mask view
# of T 2048, 2.
LARGE_REQUEST_FLOPS = 1e9


def max_request_flops() -> float:
    return GPU_MAX_REQUEST_FLOPS if device() == "cuda" else CPU_MAX_REQUEST_FLOPS


@dataclass(frozen=True)
class Settings:
    preset: str = "lecture"
    family: str = "grok"             # FAMILIES: grok.py's trunk or production's (2026)
    # sequence layout
    num_user: int = 1
    num_history: int = 5
    num_candidates: int = 3
    history_padding: int = 0
    candidate_padding: int = 0
    batch_size: int = 1              # rows of inputs generated and run together
    row: int = 0                     # the batch row every view shows
    # model geometry and attention
    emb_size: int = 64
    key_size: int = 16
    num_q_heads: int = 4
    num_kv_heads: int = 2
    num_layers: int = 2
    widening_factor: float = 4.0
    multiplier: float = 0.25
    cap_method: str = "tanh"
    logit_cap: float = 30.0
    prefix: str = "causal"
    # weights and data
    weights: str = "random"
    seed: int = 0
    # RoPE
    rope_base: float = 10000.0
    rope_offset: int = 0
    rope_mode: str = "sequential"
    # view options (part of the URL so a link reproduces the picture)
    layer: int = 0
    head: int = -1                   # -1: every head of the layer as a grid
    values: str = "probabilities"
    color: str = "linear"
    query: int = -1                  # -1: the first candidate
    zoom: str = "all"                # ZOOMS: the whole sequence, or one region at full resolution
    candidate: int = 0
    perturbation: str = "scale"
    delta: float = 2.0
    replace_with: int = 1
    operation: str = "permute"
    compare: str = "causal"          # the mask kind drawn beside the model's own
    variant: str = "gqa"             # models.variants.VARIANTS, drawn in the Variants view
    bug: str = "none"                # models.bugzoo.BUGS planted in the trunk, or none

    # --- what the models need --------------------------------------------------------
    @property
    def layout(self) -> SequenceLayout:
        return SequenceLayout(self.num_user, self.num_history, self.num_candidates,
                              self.history_padding, self.candidate_padding)

    @property
    def mask_kind(self) -> str:
        """The model's own mask: grok.py's recsys mask, or production's bidirectional prefix."""
        return model_mask_kind(self.prefix)

    @property
    def seq_len(self) -> int:
        return self.num_user + self.num_history + self.num_candidates

    @property
    def candidate_start_offset(self) -> int:
        return self.num_user + self.num_history

    def xrex_config(self) -> XrexConfig:
        """Production's trunk at this geometry (family xrex): P = num_user, L = num_history, attention
        scale sqrt(128)/key_size (the multiplier control is grok.py's); qk_norm and primer_norm as the
        production preset sets them (flagship's, qk_norm on and no primer norm, under a 2025 preset)."""
        base = PRESETS[self.preset].xrex_config()
        return XrexConfig(emb_size=self.emb_size, num_layers=self.num_layers, num_q_heads=self.num_q_heads,
                          num_kv_heads=self.num_kv_heads, key_size=self.key_size,
                          widening_factor=self.widening_factor, num_user_prefix_tokens=self.num_user,
                          history_seq_len=self.num_history, attn_logit_cap=self.logit_cap,
                          attn_logit_cap_method=self.cap_method, rope_base_exponent=int(self.rope_base),
                          qk_norm=base.qk_norm, primer_norm=base.primer_norm)

    @property
    def attn_scale(self) -> float:
        """What q.k is multiplied by: grok.py's multiplier control, or production's sqrt(128)/key_size."""
        return self.xrex_config().attn_scale if self.family == "xrex" else self.multiplier

    def transformer_config(self, **changes) -> TransformerConfig:
        cfg = TransformerConfig(
            emb_size=self.emb_size, key_size=self.key_size, num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads, num_layers=self.num_layers,
            widening_factor=self.widening_factor, attn_output_multiplier=self.multiplier,
            logit_cap=self.logit_cap, cap_method=self.cap_method, rope_base=self.rope_base,
            # production's right-anchored positions have no grok.py mode: its grok config serves shapes and costs
            rope_mode=changes.pop("rope_mode", self.rope_mode if self.rope_mode in ROPE_MODES else "sequential"),
            rope_offset=self.rope_offset, prefix=self.prefix)
        return cfg.replace(**changes) if changes else cfg

    def recsys_config(self) -> RecsysConfig:
        """The ranking model's config: the demo world's vocabulary for demo weights, else the preset's.
        For the production family only the batch's vocabularies and shapes are read from it."""
        if self.family == "grok" and self.weights == "demo":
            return replace(demo_config(), transformer=self.transformer_config())
        return RecsysConfig(self.transformer_config(), num_user_tokens=self.num_user)

    @property
    def query_position(self) -> int:
        return self.candidate_start_offset if self.query < 0 else self.query

    def to_dict(self) -> dict:
        return asdict(self)


_FIELDS = {f.name: f for f in fields(Settings)}
# fields old links may still carry: dropped on parsing (links open), and named in a note on page load
RETIRED_FIELDS = {
    "backend": "the views' attention-backend control was removed (it changed nothing: every view and probe "
               "runs naive attention, whose weights the heatmaps read); the Timing tab times every backend",
}


def retired_note(keys) -> str:
    """What an old link's retired fields were, and why they are ignored ('' when it has none)."""
    return "; ".join(f"{k}: ignored ({RETIRED_FIELDS[k]})" for k in sorted(set(keys) & RETIRED_FIELDS.keys()))


def preset_family(name: str) -> str:
    """The family a preset belongs to: production's presets imply it, grok.py's start on grok.py's."""
    return PRESETS[name].family


def preset_defaults(name: str) -> dict:
    """Every field a preset sets, its family included."""
    if name not in PRESETS:
        raise ValidationError("preset", name, ", ".join(PRESETS))
    p = PRESETS[name]
    shape = dict(preset=name, family=p.family, **asdict(p.layout), **asdict(p.geometry))
    if p.family == "xrex":
        return {**shape, **_xrex_settings(p.xrex_config())}
    t = p.transformer
    return dict(shape, multiplier=t.attn_output_multiplier, cap_method=t.cap_method, logit_cap=t.logit_cap,
                prefix=t.prefix, rope_base=t.rope_base, rope_offset=t.rope_offset, rope_mode=t.rope_mode,
                weights="demo" if name == "lecture" and demo_transformer() is not None else "random")


def _xrex_settings(c: XrexConfig) -> dict:
    """What a production preset sets beyond its shape (PRODUCTION.md §1): its scale and cap, the bidirectional
    prefix, right-anchored positions, random weights."""
    capped = c.attn_logit_cap > 0 and c.attn_logit_cap_method != "none"
    return dict(multiplier=c.attn_scale, cap_method=c.attn_logit_cap_method if capped else "none",
                logit_cap=c.attn_logit_cap if capped else Settings.logit_cap, prefix="bidirectional",
                rope_base=float(c.rope_base_exponent), rope_offset=0, rope_mode=XREX_ROPE, weights="random")


def defaults(preset: str, family: str) -> dict:
    """What a configuration holds before any field is set: the preset's values, and what production's
    family fixes when a 2025 preset runs on it. A production preset runs on production's family only."""
    d = preset_defaults(preset)
    if family == d["family"]:
        return d
    if family == "grok":
        raise ValidationError("family", family, f"xrex (production, 2026) with the production preset {preset}; "
                              f"for grok.py's trunk at this geometry choose the preset {GROK_COUNTERPART[preset]}")
    return {**d, "family": family, **XREX_FIXED}


# --- scalar parsers: each raises ValidationError naming the field ------------------------

def _int(name: str, value: Any, lo: Optional[int] = None, hi: Optional[int] = None, why: str = "",
         also: tuple = ()) -> int:
    allowed = ("an integer" if lo is None else f"an integer in [{lo}, {hi}]" if hi is not None
               else f"an integer >= {lo}") + (f" ({why})" if why else "")
    if isinstance(value, bool):
        raise ValidationError(name, value, allowed)
    try:
        if isinstance(value, str):
            value = value.strip()
            v = float(value) if value else float("nan")
        else:
            v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValidationError(name, value, allowed) from None
    if not math.isfinite(v) or v != int(v):
        raise ValidationError(name, value, allowed)
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValidationError(name, value, allowed, also)
    return v


def _float(name: str, value: Any, lo: Optional[float] = None, hi: Optional[float] = None,
           lo_open: bool = False, why: str = "") -> float:
    bound = []
    if lo is not None:
        bound.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        bound.append(f"<= {hi:g}")
    allowed = "a finite number" + (" " + " and ".join(bound) if bound else "") + (f" ({why})" if why else "")
    if isinstance(value, bool):
        raise ValidationError(name, value, allowed)
    try:
        v = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise ValidationError(name, value, allowed) from None
    if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) \
            or (hi is not None and v > hi):
        raise ValidationError(name, value, allowed)
    return v


def _choice(name: str, value: Any, choices) -> str:
    v = value.strip() if isinstance(value, str) else None     # only a name is a choice (a list is unhashable)
    if v is None or v not in choices:
        raise ValidationError(name, value, ", ".join(map(str, choices)))
    return v


def demo_transformer() -> Optional[TransformerConfig]:
    """The trained demo model's geometry, or None in a checkout without the weights file
    (python -m models.train_demo writes it)."""
    return demo_config().transformer if DEMO_WEIGHTS.exists() else None


def _check_demo_geometry(v: dict) -> None:
    demo = demo_transformer()
    if demo is None:
        raise ValidationError("weights", "demo", "random or zeros (this build has no trained demo weights)")
    for name in ("emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers", "widening_factor"):
        if v[name] != getattr(demo, name):
            raise ValidationError(name, v[name], f"{getattr(demo, name)} with the trained demo weights "
                                  f"(choose random or zeros weights for another geometry)", also=("weights",))
    if v["num_user"] != 1:
        raise ValidationError("num_user", v["num_user"], "1 with the trained demo weights", also=("weights",))


def _check_upload_geometry(v: dict, weights: str, geometry: Mapping[str, Any]) -> None:
    changed = [f for f in WEIGHT_GEOMETRY if v[f] != geometry[f]]
    if changed:
        raise ValidationError("weights", weights, "these uploaded weights are for "
                              + ", ".join(f"{f}={geometry[f]:g}" if isinstance(geometry[f], float)
                                          else f"{f}={geometry[f]}" for f in changed)
                              + " (here " + ", ".join(f"{f}={v[f]}" for f in changed)
                              + "); set it back, or choose random, zeros or demo weights", also=changed)


def estimate_params(s: Settings) -> int:
    """The ranking model's parameter count, from its own shapes: grok.py's (models.weights.recsys_spec:
    the embedding tables, the user / history / candidate projections and the trunk), or production's
    (its trunk and head, models.xrex.param_spec, and the input layer's tables and projections)."""
    if s.family == "xrex":
        return _xrex_params(s.xrex_config())
    return sum(math.prod(shape) for _, shape, _ in recsys_spec(s.recsys_config()).values())


def _xrex_params(config: XrexConfig) -> int:
    """models.xrex.XrexRecsys's parameters from its shapes: the trunk and head (param_spec) and the input
    layer (project_then_sum_params); no module is built (a visitor may send a new geometry per request)."""
    return (sum(math.prod(shape) for _, shape, _ in xrex_spec(config).values())
            + project_then_sum_params(config))


def trunk_params(s: Settings) -> int:
    """The parameters every token passes through: the trunk's layers (no embedding tables or head)."""
    spec = xrex_spec(s.xrex_config()) if s.family == "xrex" else recsys_spec(s.recsys_config())
    return sum(math.prod(shape) for key, (_, shape, _) in spec.items() if key.startswith("transformer/"))


def parse_settings(raw: Mapping[str, Any] | None = None, *,
                   uploaded: Optional[Mapping[str, Mapping[str, Any]]] = None, need_model: bool = True) -> Settings:
    """Raw values (strings from a URL, numbers from the UI) -> a valid Settings, or ValidationError.

    `uploaded`: the weight files this visitor has uploaded, name -> the WEIGHT_GEOMETRY values they
    were checked against ("upload:<name>" is then valid with those values).
    `need_model=False` leaves out the device's model limits (check_model_fits): the mask view
    draws phoenix-prod's layout on a CPU without building the model.
    """
    uploaded = uploaded or {}
    raw = {k: v for k, v in dict(raw or {}).items() if k not in RETIRED_FIELDS}
    unknown = sorted(k for k in raw if k not in _FIELDS)
    if unknown:
        raise ValidationError("settings", unknown[0], "one of " + ", ".join(_FIELDS))
    preset = _choice("preset", raw.get("preset", Settings.preset), PRESETS)
    family = _choice("family", preset_family(preset) if raw.get("family") is None else raw["family"], tuple(FAMILIES))
    merged = {**asdict(Settings()), **defaults(preset, family), **{k: v for k, v in raw.items() if v is not None}}
    T_cap = max_seq_len()
    v: dict[str, Any] = {"preset": preset, "family": family}

    v["num_user"] = _int("num_user", merged["num_user"], 1, 8)
    v["num_history"] = _int("num_history", merged["num_history"], 0, T_cap)
    v["num_candidates"] = _int("num_candidates", merged["num_candidates"], 1, 512,
                               why="a recsys mask needs at least one candidate")
    v["history_padding"] = _int("history_padding", merged["history_padding"], 0, v["num_history"],
                                why="padded slots are part of the history", also=("num_history",))
    v["candidate_padding"] = _int("candidate_padding", merged["candidate_padding"], 0, v["num_candidates"] - 1,
                                  why="at least one real candidate", also=("num_candidates",))
    v["batch_size"] = _int("batch_size", merged["batch_size"], 1, MAX_BATCH)
    v["row"] = _int("row", merged["row"], 0, v["batch_size"] - 1, why="a row of the batch", also=("batch_size",))
    T = v["num_user"] + v["num_history"] + v["num_candidates"]
    if T > T_cap:
        raise ValidationError("num_history", v["num_history"],
                              f"user + history + candidates <= {T_cap} on {device().upper()} "
                              f"(here {T}; production's padded sequence is 1152)", also=("num_user", "num_candidates"))

    v["emb_size"] = _int("emb_size", merged["emb_size"], 8, 4096)
    v["key_size"] = _int("key_size", merged["key_size"], 2, 256)
    if v["key_size"] % 2:
        raise ValidationError("key_size", v["key_size"], "an even number (RoPE rotates two halves)")
    v["num_q_heads"] = _int("num_q_heads", merged["num_q_heads"], 1, 64)
    v["num_kv_heads"] = _int("num_kv_heads", merged["num_kv_heads"], 1, 64)
    if v["num_q_heads"] % v["num_kv_heads"]:
        raise ValidationError("num_q_heads", v["num_q_heads"],
                              f"a multiple of num_kv_heads = {v['num_kv_heads']} (GQA groups query heads per KV head)",
                              also=("num_kv_heads",))
    v["num_layers"] = _int("num_layers", merged["num_layers"], 1, 16)
    v["widening_factor"] = _float("widening_factor", merged["widening_factor"], 0.25, 8)
    v["multiplier"] = _float("multiplier", merged["multiplier"], 0, 100, lo_open=True)
    v["cap_method"] = _choice("cap_method", merged["cap_method"], CAP_METHODS)
    v["logit_cap"] = _float("logit_cap", merged["logit_cap"], 0, 1000, why="0 turns the cap off")
    v["prefix"] = _choice("prefix", merged["prefix"], PREFIX_MODES)
    if family == "xrex" and v["prefix"] != "bidirectional":
        raise ValidationError("prefix", v["prefix"], "bidirectional with the production (2026) family: its "
                              "prefix attends both ways", also=("family",))

    weights = merged["weights"]
    if isinstance(weights, str) and weights.startswith("upload:") and weights[7:] in uploaded:
        _check_upload_geometry(v, weights, uploaded[weights[7:]])
        v["weights"] = weights
    elif weights == "upload":
        raise ValidationError("weights", weights, "upload a .npz or .safetensors file first")
    else:
        v["weights"] = _choice("weights", weights, tuple(w for w in WEIGHT_SOURCES if w != "upload"))
    v["seed"] = _int("seed", merged["seed"], 0, 2**31 - 1)
    if family == "xrex" and v["weights"] == "demo" and not XREX_DEMO_WEIGHTS.exists():
        raise ValidationError("weights", "demo", "random or zeros with the production (2026) family (this build "
                              "has no trained production demo: python -m models.train_demo --family xrex)",
                              also=("family",))
    if v["weights"] == "demo":
        _check_demo_geometry(v)

    v["rope_base"] = _float("rope_base", merged["rope_base"], 1, 1e9, lo_open=True)
    v["rope_offset"] = _int("rope_offset", merged["rope_offset"], 0, 1_000_000)
    if family == "xrex":
        if merged["rope_mode"] != XREX_ROPE:
            raise ValidationError("rope_mode", merged["rope_mode"], f"{XREX_ROPE} with the production (2026) family "
                                  "(history ends at P+L-1, every candidate at P+L)", also=("family",))
        v["rope_mode"] = XREX_ROPE
        if v["rope_base"] != int(v["rope_base"]) or v["rope_offset"]:
            field = "rope_offset" if v["rope_offset"] else "rope_base"
            raise ValidationError(field, v[field], "an integer RoPE base and offset 0 with the production (2026) "
                                  "family (its positions are right-anchored, base an integer exponent)",
                                  also=("family",))
    else:
        v["rope_mode"] = _choice("rope_mode", merged["rope_mode"], ROPE_MODES)

    v["layer"] = _int("layer", merged["layer"], 0, v["num_layers"] - 1, also=("num_layers",))
    v["head"] = _int("head", merged["head"], -1, v["num_q_heads"] - 1, why="-1 shows every head",
                     also=("num_q_heads",))
    v["values"] = _choice("values", merged["values"], VALUE_KINDS)
    v["color"] = _choice("color", merged["color"], COLOR_SCALES)
    v["query"] = _int("query", merged["query"], -1, T - 1, why="a position in the sequence; -1: first candidate",
                      also=("num_history", "num_candidates"))
    v["zoom"] = _choice("zoom", merged["zoom"], ZOOMS)
    C = v["num_candidates"]
    v["candidate"] = _int("candidate", merged["candidate"], 0, C - v["candidate_padding"] - 1,
                          why="a real (not padded) candidate", also=("num_candidates", "candidate_padding"))
    v["perturbation"] = _choice("perturbation", merged["perturbation"], PERTURBATIONS)
    v["delta"] = _float("delta", merged["delta"], -1e6, 1e6, why="the perturbation size")
    v["replace_with"] = _int("replace_with", merged["replace_with"], 1, 1023, why="an item hash")
    v["operation"] = _choice("operation", merged["operation"], INVARIANCE_OPS)
    v["compare"] = _choice("compare", merged["compare"], tuple(MASK_KINDS))
    v["variant"] = _choice("variant", merged["variant"], tuple(VARIANTS))
    v["bug"] = merged["bug"].strip() if isinstance(merged["bug"], str) else merged["bug"]
    if v["bug"] not in ("none", *bug_names(family)):
        other = [f for f in FAMILIES if f != family and v["bug"] in bug_names(f)]
        elsewhere = (f" with the {FAMILIES[family]} family; it is a bug of {FAMILIES[other[0]]}: switch the model "
                     "family to plant it") if other else ""
        raise ValidationError("bug", merged["bug"], ", ".join(("none", *bug_names(family))) + elsewhere,
                              also=("family",) if other else ())

    s = Settings(**v)
    if need_model:
        check_model_fits(s)
    return s


def check_model_fits(s: Settings) -> None:
    """The model and its recorded attention fit this device, or ValidationError naming the field."""
    n = estimate_params(s)
    if n > max_params():
        raise ValidationError("emb_size", s.emb_size,
                              f"a model of at most {max_params() / 1e6:.0f}M parameters on {device().upper()} "
                              f"(this one has about {n / 1e6:.0f}M: it needs a GPU, as phoenix-prod, phoenix-2026 and "
                              f"phoenix-2026-seqpack do)")
    if trace_bytes(s) > max_trace_bytes() and trace_bytes(replace(s, batch_size=1)) <= max_trace_bytes():
        raise ValidationError("batch_size", s.batch_size,
                              f"a batch whose recorded attention fits in {max_trace_bytes() / 2**20:.0f} MiB on "
                              f"{device().upper()} (here {trace_bytes(s) / 2**20:.0f} MiB): fewer rows")
    if trace_bytes(s) > max_trace_bytes():
        raise ValidationError("num_layers", s.num_layers,
                              f"layers x query heads x T^2 within {max_trace_bytes() / 2**20:.0f} MiB of recorded "
                              f"attention on {device().upper()} (here {s.num_layers} x {s.num_q_heads} x "
                              f"{s.seq_len}^2 needs {trace_bytes(s) / 2**20:.0f} MiB): fewer layers, heads or tokens")


def trace_bytes(s: Settings, rows: Optional[int] = None) -> int:
    """Memory of one recorded forward's attention: probabilities and logits, fp32 [B, Hq, T, T] per layer."""
    return 2 * 4 * (s.batch_size if rows is None else rows) * s.num_layers * s.num_q_heads * s.seq_len ** 2


# --- what a request costs, estimated before it starts ------------------------------------------

@dataclass(frozen=True)
class Cost:
    """Work and memory of one view's request, from the settings alone."""
    forwards: int = 0          # passes through the trunk, each counted once per batch row
    flops: float = 0.0         # their floating-point work: matmuls on every token + attention's T^2
    peak_bytes: int = 0        # what it holds while it runs: recorded traces, probe passes, model copies

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.forwards + other.forwards, self.flops + other.flops,
                    max(self.peak_bytes, other.peak_bytes))

    def holding(self, extra_bytes: int) -> "Cost":
        return replace(self, peak_bytes=self.peak_bytes + extra_bytes)


def forward_cost(s: Settings, rows: int = 1, seq_len: Optional[int] = None, record: bool = False) -> Cost:
    """One trunk pass over `rows` sequences of `seq_len` (default the layout's) tokens: 2 x trunk
    parameters per token, plus q.k and p.v (4 x T^2 x key_size per query head) per layer. Memory: one
    layer's [rows, Hq, T, T] logits, capped logits and probabilities while it runs, the residual
    stream, and with `record` every layer's traces."""
    T = s.seq_len if seq_len is None else seq_len
    flops = rows * (2 * T * trunk_params(s) + s.num_layers * 4 * s.num_q_heads * T * T * s.key_size)
    ffn = s.xrex_config().ffn_hidden if s.family == "xrex" else s.transformer_config().ffn_hidden
    held = 3 * 4 * rows * s.num_q_heads * T * T + 4 * 4 * rows * T * max(s.emb_size, ffn)
    return Cost(rows, float(flops), held + (recorded_bytes(s, rows, T) if record else 0))


def recorded_bytes(s: Settings, rows: int, seq_len: Optional[int] = None) -> int:
    """What a recorded forward keeps after it ran: every layer's probabilities and logits
    [rows, Hq, T, T] and its two residual streams [rows, T, D], fp32."""
    T = s.seq_len if seq_len is None else seq_len
    return 2 * 4 * rows * s.num_layers * T * (s.num_q_heads * T + s.emb_size)


def model_bytes(s: Settings) -> int:
    return 4 * estimate_params(s)


# the fields a visitor can turn down to make a request cheaper, in the order they are suggested
_COST_FIELDS = ("batch_size", "num_history", "num_candidates", "num_layers", "num_q_heads", "emb_size")


def check_budget(s: Settings, view: str, estimate: Callable[[Settings], Cost]) -> Cost:
    """Refuse, by name, a request of the `view` view whose estimated work or memory (`estimate`, e.g.
    explorer.views.VIEWS[view].estimate) exceeds this device's budget. The field named is the one whose
    halving saves the most. -> the cost, when it fits."""
    cost = estimate(s)
    flops, held = max_request_flops(), max_request_bytes()
    if cost.flops <= flops and cost.peak_bytes <= held:
        return cost
    over = max(cost.flops / flops, cost.peak_bytes / held)

    def after_halving(name):
        lo = 1 if name != "num_history" else 0
        half = max(lo, getattr(s, name) // 2)
        if name == "num_q_heads":
            half = max(s.num_kv_heads, half - half % s.num_kv_heads)
        t = replace(s, **{name: half}, **({"candidate_padding": 0} if name == "num_candidates" else {}),
                    **({"history_padding": 0} if name == "num_history" else {}), row=0)
        c = estimate(t)
        return max(c.flops / flops, c.peak_bytes / held)
    field = min((f for f in _COST_FIELDS if getattr(s, f) > 1), key=after_halving, default="num_history")
    raise ValidationError(field, getattr(s, field),
                          f"a smaller value: the {view} view would run {cost.forwards} trunk passes "
                          f"({cost.flops / 1e9:,.0f} GFLOP) holding {cost.peak_bytes / 2**20:,.0f} MiB, "
                          f"{over:.1f}x this {device().upper()}'s budget per request of {flops / 1e9:,.0f} GFLOP "
                          f"and {held / 2**20:,.0f} MiB")


# --- URL query string --------------------------------------------------------------------

def to_query(s: Settings) -> str:
    """Only what differs from the preset, so links stay short; the preset always comes first."""
    base = {**asdict(Settings()), **defaults(s.preset, s.family), "family": preset_family(s.preset)}
    diff = {k: val for k, val in asdict(s).items() if k != "preset" and val != base[k]}
    return urlencode({"preset": s.preset, **{k: _fmt(val) for k, val in diff.items()}})


def _fmt(val: Any) -> str:
    return repr(val) if isinstance(val, float) else str(val)


def parse_query(query: str, *, uploaded: Optional[Mapping[str, Mapping[str, Any]]] = None,
                need_model: bool = True) -> Settings:
    if not isinstance(query, str):
        raise ValidationError("query string", query, "text like 'preset=lecture&num_candidates=4'")
    if len(query) > 4000:
        raise ValidationError("query string", query, "at most 4000 characters")
    pairs = parse_qsl(query.lstrip("?"), keep_blank_values=True)
    return parse_settings(dict(pairs), uploaded=uploaded, need_model=need_model)


def with_family(s: Settings, family: str) -> Settings:
    """The settings moved to another model family, the rest kept: what the family fixes (production:
    bidirectional prefix, right-anchored RoPE, no cap, random weights; grok.py: the preset's values back),
    no planted bug. Leaving production's family from a production preset goes to grok.py's preset of the
    same geometry (a production preset implies production's family). The device's model limits are left to
    whoever runs the model (the mask view draws any preset). Trained demo weights stay where the new family
    has them at this geometry."""
    family = _choice("family", family, tuple(FAMILIES))
    preset = GROK_COUNTERPART.get(s.preset, s.preset) if family == "grok" else s.preset
    moved = ("logit_cap", "multiplier", "rope_base") if preset != s.preset else ()     # grok.py's own values
    fixed = {k: defaults(preset, family)[k] for k in (*XREX_FIXED, *moved)}
    out = parse_settings({**asdict(s), "preset": preset, "family": family, "bug": "none", **fixed}, need_model=False)
    if s.weights == "demo" and out.weights != "demo":
        try:
            return parse_settings({**asdict(out), "weights": "demo"}, need_model=False)
        except ValidationError:
            pass
    return out

