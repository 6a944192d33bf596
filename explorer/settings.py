"""The one validation layer: every control of the explorer, parsed from raw UI / API / URL values.

``parse_settings(raw)`` turns a mapping of strings or numbers (a URL query string's pairs, the UI's control
values, a gradio_client call) into a frozen, hashable ``explorer.schema.Settings``, one step per group of
fields (layout, model, weights, RoPE, view options), each checked against the fields before it. Fields left
out take the preset's values (explorer.families.defaults), so ``preset=phoenix-nano`` alone is a full
configuration; the device's limits come from explorer.limits. Every violation raises ``ValidationError``
naming the field, the value and what is allowed. ``with_family`` re-parses settings under another family.
The views' own controls are parsed from their records (``view_controls``: every Control the views in
explorer.views.VIEWS name), so a view's control is declared in its module and nowhere else.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from models.attention import CAP_METHODS
from models.demo import XREX_DEMO_WEIGHTS
from models.grok import ROPE_MODES
from models.masks import PREFIX_MODES
from models.presets import PRESETS

from .families import FAMILIES, GROK_COUNTERPART, XREX_FIXED, XREX_ROPE, defaults, demo_transformer, preset_family
from .limits import MAX_BATCH, check_model_fits, limits_device, max_seq_len
from .schema import (COLOR_SCALES, FIELDS, VALUE_KINDS, WEIGHT_GEOMETRY, ZOOMS, Control, Settings, ValidationError,
                     ViewOptions)
from .schema import check_choice as _choice
from .schema import check_float as _float
from .schema import check_int as _int
from .views import VIEWS
from .views.invariance_rope import INVARIANCE_OPS     # noqa: F401  (its control's choices, named here as before)

WEIGHT_SOURCES = ("random", "zeros", "demo", "upload")


# The order links and the API's positional controls have always written these views' controls in (to_query,
# explorer.controls.CONTROL_FIELDS): kept, so a link and an API call read as they did. Every other control
# follows them in tab order: a new view's control needs nothing here.
_FIRST = ("perturbation", "delta", "replace_with", "operation", "compare", "variant", "bug")


def view_controls() -> tuple[Control, ...]:
    """Every view's own control (explorer.views.VIEWS, read at each call: a view registered later counts),
    in the order links write them."""
    found = {}
    for view in VIEWS.values():
        for c in view.controls:
            if isinstance(c, Control):
                if found.setdefault(c.name, c) != c or c.name in FIELDS:
                    raise RuntimeError(f"two controls named {c.name!r}: each control has a name of its own")
    first = [found.pop(name) for name in _FIRST if name in found]
    return (*first, *found.values())


def control_value(s: Settings, name: str) -> Any:
    """A control's value in `s`, by name: a Settings field's, or a view's own control's."""
    if name in FIELDS:
        return getattr(s, name)
    own = {c.name: c for c in view_controls()}
    if name not in own:
        raise ValidationError("settings", name, "one of " + ", ".join([*FIELDS, *own]))
    return own[name].of(s)


def all_values(s: Settings) -> dict[str, Any]:
    """Every control's value in `s`, by name (the Settings fields', then the views' own controls')."""
    return {**{f: getattr(s, f) for f in FIELDS}, **{c.name: c.of(s) for c in view_controls()}}


# fields old links may still carry: dropped on parsing (links open), and named in a note on page load
RETIRED_FIELDS = {
    "backend": "the views' attention-backend control was removed (it changed nothing: every view and probe "
               "runs naive attention, whose weights the heatmaps read); the Timing tab times every backend",
}


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


def parse_settings(raw: Mapping[str, Any] | None = None, *,
                   uploaded: Optional[Mapping[str, Mapping[str, Any]]] = None, need_model: bool = True) -> Settings:
    """Raw values (strings from a URL, numbers from the UI) -> a valid Settings, or ValidationError.

    `uploaded`: the weight files this visitor has uploaded, name -> the WEIGHT_GEOMETRY values they
    were checked against ("upload:<name>" is then valid with those values).
    `need_model=False` leaves out the device's model limits (check_model_fits): the mask view
    draws phoenix-prod's layout on a CPU without building the model.
    """
    preset, family, merged, own = _merged(raw)
    v: dict[str, Any] = {"preset": preset, "family": family}
    # each step adds its fields to v, in this order: a field's bounds may depend on those parsed before it
    _parse_layout(v, merged)
    _parse_model(v, merged)
    _parse_weights(v, merged, uploaded or {})
    _parse_rope(v, merged)
    _parse_view_options(v, merged)
    s = Settings(**v, view=ViewOptions().set({c: c.parse(merged[c.name], v) for c in own}))
    if need_model:
        check_model_fits(s)
    return s


def _merged(raw: Mapping[str, Any] | None) -> tuple[str, str, dict, tuple[Control, ...]]:
    """The preset, the family, every field's raw value: what was sent (retired fields dropped, None left
    out) over the preset's defaults for that family (a view's control: its own default), and the views' own
    controls. Unknown fields are refused."""
    raw = {k: v for k, v in dict(raw or {}).items() if k not in RETIRED_FIELDS}
    own = view_controls()
    names = [*FIELDS, *(c.name for c in own)]
    unknown = sorted(k for k in raw if k not in names)
    if unknown:
        raise ValidationError("settings", unknown[0], "one of " + ", ".join(names))
    preset = _choice("preset", raw.get("preset", Settings.preset), PRESETS)
    family = _choice("family", preset_family(preset) if raw.get("family") is None else raw["family"], tuple(FAMILIES))
    merged = {**all_values(Settings()), **defaults(preset, family),
              **{k: v for k, v in raw.items() if v is not None}}
    return preset, family, merged, own


def _parse_layout(v: dict, merged: Mapping[str, Any]) -> None:
    """The sequence layout and the batch: user, history and candidate tokens within this device's longest."""
    T_cap = max_seq_len()
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
                              f"user + history + candidates <= {T_cap} on {limits_device().upper()} "
                              f"(here {T}; production's padded sequence is 1152)", also=("num_user", "num_candidates"))


def _parse_model(v: dict, merged: Mapping[str, Any]) -> None:
    """The trunk's geometry and attention: sizes, heads (query heads grouped over KV heads), cap and prefix."""
    family = v["family"]
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


def _parse_weights(v: dict, merged: Mapping[str, Any], uploaded: Mapping[str, Mapping[str, Any]]) -> None:
    """Weights and seed: an upload holds the geometry it was loaded at, the demo weights theirs."""
    family = v["family"]
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


def _parse_rope(v: dict, merged: Mapping[str, Any]) -> None:
    """RoPE's base, offset and mode: production's family has its own right-anchored positions."""
    family = v["family"]
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


def _parse_view_options(v: dict, merged: Mapping[str, Any]) -> None:
    """What every view shows (layer, head, query, candidate ...): within the layout and model above. Each view's
    own controls are parsed after these, from their records (parse_settings)."""
    T = v["num_user"] + v["num_history"] + v["num_candidates"]
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
    out = parse_settings({**s.to_dict(), "preset": preset, "family": family, "bug": "none", **fixed}, need_model=False)
    if s.weights == "demo" and out.weights != "demo":
        try:
            return parse_settings({**out.to_dict(), "weights": "demo"}, need_model=False)
        except ValidationError:
            pass
    return out
