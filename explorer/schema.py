"""What a configuration is: the frozen ``Settings`` every view reads, and ``ValidationError``, which every
layer above raises when a value will not do (a ValueError whose message names the field, the value and what
is allowed; server/guard.py turns it into ``gr.Error``). The bottom of the settings modules: explorer.limits and
explorer.families read these; explorer.settings parses raw values into them.

Settings holds two parts: ``model``, a ``ModelSettings`` (the model's layout, geometry, weights and RoPE: the key
of the model caches), and ``shown``, a ``Shown`` (the view fields every tab shares: the row, layer, head, query,
zoom ... and, in ``view``, the values of the views' own controls: each a ``Control`` declared in the module of the
view that owns it (explorer/views/), read with ``control.of(s)``). Also the scalar checks (``check_int``,
``check_float``, ``check_choice``) every control is parsed with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Optional

from models.demo import demo_config
from models.grok import ROPE_MODES, TransformerConfig
from models.masks import model_mask_kind
from models.presets import PRESETS
from models.recsys import RecsysConfig, SequenceLayout
from models.xrex import XrexConfig

# the choices of the view fields every tab shares (the page draws the value kinds and colour scales itself)
VALUE_KINDS = ("probabilities", "capped logits", "masked logits")
COLOR_SCALES = ("linear", "log", "quantile")
# heatmap regions drawn at full resolution (explorer.views.zoom_region)
ZOOMS = ("all", "candidates", "history tail", "query row")
# the fields that decide the weights' shapes: uploaded weights are held to the values they were loaded at
WEIGHT_GEOMETRY = ("preset", "family", "num_user", "emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers",
                   "widening_factor")


class ValidationError(ValueError):
    """A control holds a value the explorer cannot use. The message names field, value and what is allowed;
    `also`: the other fields whose values make it invalid (KV heads for a query-head count they do not divide)."""

    def __init__(self, field: str, value: Any, allowed: str, also: tuple = ()):
        self.field, self.value, self.allowed, self.also = field, value, allowed, tuple(also)
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"{field}: got {shown}; allowed: {allowed}")

    def __reduce__(self):
        # as made, not from its message: a refusal drawn in another process (server.drawing) arrives whole
        return type(self), (self.field, self.value, self.allowed, self.also)


# --- scalar checks: each raises ValidationError naming the field ------------------------

def check_int(name: str, value: Any, lo: Optional[int] = None, hi: Optional[int] = None, why: str = "",
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


def check_float(name: str, value: Any, lo: Optional[float] = None, hi: Optional[float] = None,
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


def check_choice(name: str, value: Any, choices) -> str:
    v = value.strip() if isinstance(value, str) else None     # only a name is a choice (a list is unhashable)
    if v is None or v not in choices:
        raise ValidationError(name, value, ", ".join(map(str, choices)))
    return v


# --- a view's own control ------------------------------------------------------------------

@dataclass(frozen=True)
class Control:
    """A control a view owns: declared in its view's module and named in its record's `controls`
    (explorer.views.records.View). From this record alone it is parsed and refused by name
    (explorer.settings), kept in links and the API (explorer.query_string, explorer.controls.CONTROL_FIELDS),
    labelled and built on its tab (app.py), and left out of the model's cache key (its value is in
    Settings.shown.view, not Settings.model). A number (`number` int or float, within [lo, hi], `why` said in a
    refusal) or one of `choices`; `check` replaces both where the allowed values depend on the settings parsed
    before it (the bug zoo's bugs on the family): check(value, parsed) -> the value, or ValidationError."""
    name: str                   # its key in links and the API, one name across the views
    default: Any
    label: str                  # on the page (explorer.controls.LABELS)
    choices: tuple = ()
    number: Optional[type] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    why: str = ""
    check: Optional[Callable[[Any, Mapping[str, Any]], Any]] = None
    menu: bool = False          # a menu (many choices), else a radio
    page_choices: Optional[Callable[[], list]] = None   # what the page's menu lists, where not `choices`
    info: Optional[str] = None  # the line under it on the page

    def parse(self, value: Any, parsed: Mapping[str, Any]) -> Any:
        """A raw value -> the value, or ValidationError naming this control (`parsed`: the model's fields)."""
        if self.check is not None:
            return self.check(value, parsed)
        if self.number is int:
            return check_int(self.name, value, self.lo, self.hi, why=self.why)
        if self.number is float:
            return check_float(self.name, value, self.lo, self.hi, why=self.why)
        return check_choice(self.name, value, self.choices)

    def of(self, s: "Settings") -> Any:
        """Its value in `s`."""
        return s.view.get(self.name, self.default)


@dataclass(frozen=True)
class ViewOptions:
    """The views' own controls' values in a Settings, by name: only those that differ from their control's
    default (so settings that show the same compare equal, however they were made); frozen and hashable."""
    items: tuple = ()           # ((name, value), ...) sorted by name

    def get(self, name: str, default: Any) -> Any:
        return dict(self.items).get(name, default)

    def set(self, values: Mapping[Control, Any]) -> "ViewOptions":
        """These options with each control of `values` set (a default value left out)."""
        kept = dict(self.items)
        for control, value in values.items():
            kept.pop(control.name, None)
            if value != control.default:
                kept[control.name] = value
        return ViewOptions(tuple(sorted(kept.items())))


@dataclass(frozen=True)
class ModelSettings:
    """What the model, its inputs and its weights depend on: the key of every model cache (explorer.runs,
    the probes' caches in explorer/views/), so settings that differ only in what is shown share one model and
    one recorded forward, with no list of fields to keep."""
    preset: str = "lecture"
    family: str = "grok"             # explorer.families.FAMILIES: grok.py's trunk or production's (2026)
    # sequence layout
    num_user: int = 1
    num_history: int = 5
    num_candidates: int = 3
    history_padding: int = 0
    candidate_padding: int = 0
    batch_size: int = 1              # rows of inputs generated and run together
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


@dataclass(frozen=True)
class Shown:
    """What is shown of the model's run, never the model, its inputs or its weights: the view fields every tab
    shares (part of the URL so a link reproduces the picture) and, in `view`, each view's own controls."""
    row: int = 0                     # the batch row every view shows
    layer: int = 0
    head: int = -1                   # -1: every head of the layer as a grid
    values: str = "probabilities"
    color: str = "linear"
    query: int = -1                  # -1: the first candidate
    zoom: str = "all"                # ZOOMS: the whole sequence, or one region at full resolution
    candidate: int = 0               # candidate j of the probes (Isolation's control, Invariance's 'drop')
    # each view's own controls (explorer/views/: each a Control in its view's module)
    view: ViewOptions = ViewOptions()


MODEL_FIELDS = tuple(f.name for f in fields(ModelSettings))
VIEW_FIELDS = tuple(f.name for f in fields(Shown))
# Every field but `view` in the order links and the API's positional controls write them (explorer.controls.
# CONTROL_FIELDS; the views' own controls follow), each ModelSettings' or Shown's (tests/test_explorer_settings.py)
FIELDS = ("preset", "family", "num_user", "num_history", "num_candidates", "history_padding", "candidate_padding",
          "batch_size", "row", "emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers", "widening_factor",
          "multiplier", "cap_method", "logit_cap", "prefix", "weights", "seed", "rope_base", "rope_offset",
          "rope_mode", "layer", "head", "values", "color", "query", "zoom", "candidate")
FIELD_TYPES = {f.name: f.type for part in (ModelSettings, Shown) for f in fields(part) if f.name in FIELDS}


@dataclass(frozen=True, init=False)
class Settings:
    """A configuration: the model's part and the shown part, each frozen and hashable, so Settings is too.
    Made and changed by field name, `Settings(preset="phoenix-nano", head=0)` and `replace(s, head=2)` (which
    calls this __init__ with model, shown and the changes); every field is read as `s.head`, as are the
    model's layout and configs (`s.layout`, `s.recsys_config()`)."""
    model: ModelSettings = ModelSettings()
    shown: Shown = Shown()

    def __init__(self, model: ModelSettings = ModelSettings(), shown: Shown = Shown(), **changes):
        unknown = changes.keys() - {*MODEL_FIELDS, *VIEW_FIELDS}
        if unknown:
            raise TypeError(f"Settings has no field {', '.join(sorted(unknown))}")
        to_model = {k: v for k, v in changes.items() if k in MODEL_FIELDS}
        to_shown = {k: v for k, v in changes.items() if k in VIEW_FIELDS}
        object.__setattr__(self, "model", replace(model, **to_model) if to_model else model)
        object.__setattr__(self, "shown", replace(shown, **to_shown) if to_shown else shown)

    @property
    def query_position(self) -> int:
        return self.candidate_start_offset if self.query < 0 else self.query

    def with_view(self, values: Mapping[Control, Any]) -> "Settings":
        """These settings with the views' controls of `values` set: {control: value}."""
        return replace(self, view=self.view.set(values))

    def to_dict(self) -> dict:
        """Every field's value by name, the views' own controls' among them where not at their default
        (explorer.settings.parse_settings takes it back)."""
        out = {name: getattr(self, name) for name in FIELDS}
        return {**out, **dict(self.view.items)}


class _ReadFrom:
    """Settings.<name>, read from one part: `s.head` is `s.shown.head`; on the class, the default, as a
    dataclass field reads (`Settings.preset`). Read-only, as Settings is frozen."""

    def __init__(self, part: str, name: str):
        self.part, self.name = part, name

    def __get__(self, s: Optional[Settings], owner: type) -> Any:
        return getattr(getattr(owner if s is None else s, self.part), self.name)


for _name in (*MODEL_FIELDS, "layout", "mask_kind", "seq_len", "candidate_start_offset", "xrex_config", "attn_scale",
              "transformer_config", "recsys_config"):
    setattr(Settings, _name, _ReadFrom("model", _name))
for _name in VIEW_FIELDS:
    setattr(Settings, _name, _ReadFrom("shown", _name))
