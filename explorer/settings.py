"""The one validation layer: every control of the explorer, parsed from raw UI / API / URL values.

``parse_settings(raw)`` turns a mapping of strings or numbers (a URL query string, the UI's control
values, a gradio_client call) into a frozen, hashable ``Settings``. Fields left out take the preset's
values, so ``?preset=phoenix-nano`` alone is a full configuration. Every violation raises
``ValidationError(field, value, allowed)`` — a ValueError whose message names all three; app.py turns
it into ``gr.Error``. ``to_query`` writes only what differs from the preset, and
``parse_query(to_query(s)) == s``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Optional
from urllib.parse import parse_qsl, urlencode

import torch

from models.attention import BACKENDS, CAP_METHODS, unavailable_reason
from models.bugzoo import bug_names
from models.demo import DEMO_WEIGHTS, demo_config
from models.grok import ROPE_MODES, TransformerConfig
from models.masks import MASK_KINDS, PREFIX_MODES, model_mask_kind
from models.recsys import PRESETS, SequenceLayout, get_preset
from models.variants import VARIANTS

WEIGHT_SOURCES = ("random", "zeros", "demo", "upload")
# the fields that decide the weights' shapes: uploaded weights are held to the values they were loaded at
WEIGHT_GEOMETRY = ("preset", "num_user", "emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers",
                   "widening_factor")
VALUE_KINDS = ("probabilities", "capped logits", "masked logits")
COLOR_SCALES = ("linear", "log")
PERTURBATIONS = ("scale", "noise", "replace")
INVARIANCE_OPS = ("permute", "drop", "add")

# What one CPU visitor may ask for: heatmaps up to the phoenix-nano sequence (1 + 1022 + 64) and a
# model of about phoenix-nano's size. On a GPU the caps are wider.
CPU_MAX_SEQ_LEN = 1087
GPU_MAX_SEQ_LEN = 4096
CPU_MAX_PARAMS = 40_000_000
GPU_MAX_PARAMS = 1_500_000_000
# The recorded forward keeps every layer's attention weights and capped logits ([Hq, T, T] fp32 each)
# and runs.forward caches 8 of them: phoenix-nano needs 144 MiB; 64 heads x 16 layers at T 1087 9 GiB.
CPU_MAX_TRACE_BYTES = 512 * 2**20
GPU_MAX_TRACE_BYTES = 8 * 2**30
MAX_BATCH = 8                       # rows of inputs per forward; the views show one of them
MAX_SWEEP_SECONDS_CPU = 30.0
MAX_SWEEP_SECONDS_GPU = 120.0


class ValidationError(ValueError):
    """A control holds a value the explorer cannot use. The message names field, value and what is allowed."""

    def __init__(self, field: str, value: Any, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
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


def sweep_budget_s() -> float:
    return MAX_SWEEP_SECONDS_GPU if device() == "cuda" else MAX_SWEEP_SECONDS_CPU


@dataclass(frozen=True)
class Settings:
    preset: str = "lecture"
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
    backend: str = "naive"
    # view options (part of the URL so a link reproduces the picture)
    layer: int = 0
    head: int = -1                   # -1: every head of the layer as a grid
    values: str = "probabilities"
    color: str = "linear"
    query: int = -1                  # -1: the first candidate
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

    def transformer_config(self, **changes) -> TransformerConfig:
        cfg = TransformerConfig(
            emb_size=self.emb_size, key_size=self.key_size, num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads, num_layers=self.num_layers,
            widening_factor=self.widening_factor, attn_output_multiplier=self.multiplier,
            logit_cap=self.logit_cap, cap_method=self.cap_method, rope_base=self.rope_base,
            rope_mode=self.rope_mode, rope_offset=self.rope_offset, prefix=self.prefix)
        return cfg.replace(**changes) if changes else cfg

    @property
    def query_position(self) -> int:
        return self.candidate_start_offset if self.query < 0 else self.query

    def to_dict(self) -> dict:
        return asdict(self)


_FIELDS = {f.name: f for f in fields(Settings)}


def preset_defaults(name: str) -> dict:
    if name not in PRESETS:
        raise ValidationError("preset", name, ", ".join(PRESETS))
    p = get_preset(name)
    t, lay = p.transformer, p.layout
    return dict(preset=name, num_user=lay.num_user, num_history=lay.num_history,
                num_candidates=lay.num_candidates, history_padding=lay.history_padding,
                candidate_padding=lay.candidate_padding, emb_size=t.emb_size, key_size=t.key_size,
                num_q_heads=t.num_q_heads, num_kv_heads=t.num_kv_heads, num_layers=t.num_layers,
                widening_factor=t.widening_factor, multiplier=t.attn_output_multiplier,
                cap_method=t.cap_method, logit_cap=t.logit_cap, prefix=t.prefix, rope_base=t.rope_base,
                rope_offset=t.rope_offset, rope_mode=t.rope_mode,
                weights="demo" if name == "lecture" and demo_transformer() is not None else "random")


# --- scalar parsers: each raises ValidationError naming the field ------------------------

def _int(name: str, value: Any, lo: Optional[int] = None, hi: Optional[int] = None, why: str = "") -> int:
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
        raise ValidationError(name, value, allowed)
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
    v = value.strip() if isinstance(value, str) else value
    if v not in choices:
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
                                  f"(choose random or zeros weights for another geometry)")
    if v["num_user"] != 1:
        raise ValidationError("num_user", v["num_user"], "1 with the trained demo weights")


def _check_upload_geometry(v: dict, weights: str, geometry: Mapping[str, Any]) -> None:
    changed = [f for f in WEIGHT_GEOMETRY if v[f] != geometry[f]]
    if changed:
        raise ValidationError("weights", weights, "these uploaded weights are for "
                              + ", ".join(f"{f}={geometry[f]:g}" if isinstance(geometry[f], float)
                                          else f"{f}={geometry[f]}" for f in changed)
                              + " (here " + ", ".join(f"{f}={v[f]}" for f in changed)
                              + "); set it back, or choose random, zeros or demo weights")


def estimate_params(s: Settings) -> int:
    """Trunk + embedding tables + projections, enough to refuse a model too big for the device."""
    D, K = s.emb_size, s.key_size
    cfg_ffn = TransformerConfig(D, K, s.num_q_heads, s.num_kv_heads, 1, s.widening_factor).ffn_hidden
    attn = D * K * (2 * s.num_q_heads + 2 * s.num_kv_heads)
    trunk = s.num_layers * (attn + 3 * D * cfg_ffn + 4 * D)
    return trunk + 3 * 1024 * D + 12 * D * D


def parse_settings(raw: Mapping[str, Any] | None = None, *,
                   uploaded: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Settings:
    """Raw values (strings from a URL, numbers from the UI) -> a valid Settings, or ValidationError.

    `uploaded`: the weight files this visitor has uploaded, name -> the WEIGHT_GEOMETRY values they
    were checked against ("upload:<name>" is then valid with those values).
    """
    uploaded = uploaded or {}
    raw = dict(raw or {})
    unknown = sorted(k for k in raw if k not in _FIELDS)
    if unknown:
        raise ValidationError("settings", unknown[0], "one of " + ", ".join(_FIELDS))
    preset = _choice("preset", raw.get("preset", Settings.preset), tuple(PRESETS))
    merged = {**asdict(Settings()), **preset_defaults(preset), **{k: v for k, v in raw.items() if v is not None}}
    T_cap = max_seq_len()
    v: dict[str, Any] = {"preset": preset}

    v["num_user"] = _int("num_user", merged["num_user"], 1, 8)
    v["num_history"] = _int("num_history", merged["num_history"], 0, T_cap)
    v["num_candidates"] = _int("num_candidates", merged["num_candidates"], 1, 512,
                               why="a recsys mask needs at least one candidate")
    v["history_padding"] = _int("history_padding", merged["history_padding"], 0, v["num_history"],
                                why="padded slots are part of the history")
    v["candidate_padding"] = _int("candidate_padding", merged["candidate_padding"], 0, v["num_candidates"] - 1,
                                  why="at least one real candidate")
    v["batch_size"] = _int("batch_size", merged["batch_size"], 1, MAX_BATCH)
    v["row"] = _int("row", merged["row"], 0, v["batch_size"] - 1, why="a row of the batch")
    T = v["num_user"] + v["num_history"] + v["num_candidates"]
    if T > T_cap:
        raise ValidationError("num_history", v["num_history"],
                              f"user + history + candidates <= {T_cap} on {device().upper()} "
                              f"(here {T}; the phoenix-nano sequence is 1087)")

    v["emb_size"] = _int("emb_size", merged["emb_size"], 8, 4096)
    v["key_size"] = _int("key_size", merged["key_size"], 2, 256)
    if v["key_size"] % 2:
        raise ValidationError("key_size", v["key_size"], "an even number (RoPE rotates two halves)")
    v["num_q_heads"] = _int("num_q_heads", merged["num_q_heads"], 1, 64)
    v["num_kv_heads"] = _int("num_kv_heads", merged["num_kv_heads"], 1, 64)
    if v["num_q_heads"] % v["num_kv_heads"]:
        raise ValidationError("num_q_heads", v["num_q_heads"],
                              f"a multiple of num_kv_heads = {v['num_kv_heads']} (GQA groups query heads per KV head)")
    v["num_layers"] = _int("num_layers", merged["num_layers"], 1, 16)
    v["widening_factor"] = _float("widening_factor", merged["widening_factor"], 0.25, 8)
    v["multiplier"] = _float("multiplier", merged["multiplier"], 0, 100, lo_open=True)
    v["cap_method"] = _choice("cap_method", merged["cap_method"], CAP_METHODS)
    v["logit_cap"] = _float("logit_cap", merged["logit_cap"], 0, 1000, why="0 turns the cap off")
    v["prefix"] = _choice("prefix", merged["prefix"], PREFIX_MODES)

    weights = merged["weights"]
    if isinstance(weights, str) and weights.startswith("upload:") and weights[7:] in uploaded:
        _check_upload_geometry(v, weights, uploaded[weights[7:]])
        v["weights"] = weights
    elif weights == "upload":
        raise ValidationError("weights", weights, "upload a .npz or .safetensors file first")
    else:
        v["weights"] = _choice("weights", weights, tuple(w for w in WEIGHT_SOURCES if w != "upload"))
    v["seed"] = _int("seed", merged["seed"], 0, 2**31 - 1)
    if v["weights"] == "demo":
        _check_demo_geometry(v)

    v["rope_base"] = _float("rope_base", merged["rope_base"], 1, 1e9, lo_open=True)
    v["rope_offset"] = _int("rope_offset", merged["rope_offset"], 0, 1_000_000)
    v["rope_mode"] = _choice("rope_mode", merged["rope_mode"], ROPE_MODES)
    v["backend"] = _choice("backend", merged["backend"], tuple(BACKENDS))

    v["layer"] = _int("layer", merged["layer"], 0, v["num_layers"] - 1)
    v["head"] = _int("head", merged["head"], -1, v["num_q_heads"] - 1, why="-1 shows every head")
    v["values"] = _choice("values", merged["values"], VALUE_KINDS)
    v["color"] = _choice("color", merged["color"], COLOR_SCALES)
    v["query"] = _int("query", merged["query"], -1, T - 1, why="a position in the sequence; -1: first candidate")
    C = v["num_candidates"]
    v["candidate"] = _int("candidate", merged["candidate"], 0, C - v["candidate_padding"] - 1,
                          why="a real (not padded) candidate")
    v["perturbation"] = _choice("perturbation", merged["perturbation"], PERTURBATIONS)
    v["delta"] = _float("delta", merged["delta"], -1e6, 1e6, why="the perturbation size")
    v["replace_with"] = _int("replace_with", merged["replace_with"], 1, 1023, why="an item hash")
    v["operation"] = _choice("operation", merged["operation"], INVARIANCE_OPS)
    v["compare"] = _choice("compare", merged["compare"], tuple(MASK_KINDS))
    v["variant"] = _choice("variant", merged["variant"], tuple(VARIANTS))
    v["bug"] = _choice("bug", merged["bug"], ("none", *bug_names("grok")))

    s = Settings(**v)
    n = estimate_params(s)
    if n > max_params():
        raise ValidationError("emb_size", s.emb_size,
                              f"a model of at most {max_params() / 1e6:.0f}M parameters on {device().upper()} "
                              f"(this one has about {n / 1e6:.0f}M; phoenix-prod needs a GPU)")
    if trace_bytes(s) > max_trace_bytes() and trace_bytes(replace(s, batch_size=1)) <= max_trace_bytes():
        raise ValidationError("batch_size", s.batch_size,
                              f"a batch whose recorded attention fits in {max_trace_bytes() / 2**20:.0f} MiB on "
                              f"{device().upper()} (here {trace_bytes(s) / 2**20:.0f} MiB): fewer rows")
    if trace_bytes(s) > max_trace_bytes():
        raise ValidationError("num_layers", s.num_layers,
                              f"layers x query heads x T^2 within {max_trace_bytes() / 2**20:.0f} MiB of recorded "
                              f"attention on {device().upper()} (here {s.num_layers} x {s.num_q_heads} x "
                              f"{s.seq_len}^2 needs {trace_bytes(s) / 2**20:.0f} MiB): fewer layers, heads or tokens")
    return s


def trace_bytes(s: Settings) -> int:
    """Memory of one recorded forward's attention: probabilities and logits, fp32 [B, Hq, T, T] per layer."""
    return 2 * 4 * s.batch_size * s.num_layers * s.num_q_heads * s.seq_len ** 2


def check_backend(s: Settings, *, need_weights: bool = False) -> None:
    """The chosen backend must run these settings exactly on this device (the capability table)."""
    why = unavailable_reason(s.backend, device=device(), cap=s.logit_cap, cap_method=s.cap_method,
                             mask_kind=s.mask_kind,
                             padding=bool(s.history_padding or s.candidate_padding), head_dim=s.key_size,
                             need_weights=need_weights)
    if why:
        raise ValidationError("backend", s.backend, f"a backend that runs here ({why})")


# --- URL query string --------------------------------------------------------------------

def to_query(s: Settings) -> str:
    """Only what differs from the preset, so links stay short; the preset always comes first."""
    base = {**asdict(Settings()), **preset_defaults(s.preset)}
    diff = {k: val for k, val in asdict(s).items() if k != "preset" and val != base[k]}
    return urlencode({"preset": s.preset, **{k: _fmt(val) for k, val in diff.items()}})


def _fmt(val: Any) -> str:
    return repr(val) if isinstance(val, float) else str(val)


def parse_query(query: str, *, uploaded: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Settings:
    if not isinstance(query, str):
        raise ValidationError("query string", query, "text like 'preset=lecture&num_candidates=4'")
    if len(query) > 4000:
        raise ValidationError("query string", query, "at most 4000 characters")
    pairs = parse_qsl(query.lstrip("?"), keep_blank_values=True)
    return parse_settings(dict(pairs), uploaded=uploaded)
