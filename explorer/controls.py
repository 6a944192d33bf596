"""The page's controls: their on-screen labels, and settings that keep their valid parts.

``keep_valid(values, last)`` repairs the page's control values (an invalid control falls back to its
last valid value, every control involved in the problem is named); ``from_link(params)`` repairs a
shared link (a bad value is dropped, the rest kept). Both answer in the labels a visitor sees, not
field names; API clients keep explorer.settings' field-named refusals.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Mapping, Optional

from explorer.limits import MAX_BATCH
from explorer.schema import FIELD_TYPES, FIELDS, Settings, ValidationError
from explorer.settings import control_value, parse_settings, view_controls

# Every control of the page, in the order links write them and the API's events take them: the Settings
# fields, then the views' own controls (each declared in its view's module: explorer.settings.view_controls).
# Read once, as this module is imported: a view registered after that is not on the page.
_OWN = view_controls()
CONTROL_FIELDS = [*FIELDS] + [c.name for c in _OWN]
NUMBER_FIELDS = {f for f in FIELDS if FIELD_TYPES[f] in ("int", "float")} | {c.name for c in _OWN if c.number}

# every control's label on the page (app.py builds the controls with these): the sidebar's and the shared view
# fields' here, each view's own from its record
LABELS = {
    "preset": "preset", "family": "model family", "weights": "weights", "seed": "seed (weights and inputs)",
    "num_user": "user tokens", "num_history": "history length",
    "num_candidates": "candidates (slots, padded ones included)",
    "history_padding": "padded history slots", "candidate_padding": "padded candidate slots",
    "batch_size": f"batch size (1–{MAX_BATCH})", "row": "batch row shown",
    "emb_size": "emb size", "key_size": "key size", "num_q_heads": "query heads", "num_kv_heads": "KV heads",
    "num_layers": "layers", "widening_factor": "widening factor",
    "multiplier": "attention multiplier (grok.py; production: √128 / key size)",
    "cap_method": "logit cap", "logit_cap": "cap value",
    "prefix": "prefix (causal: grok.py; bidirectional: production)",
    "rope_base": "RoPE base", "rope_offset": "RoPE offset", "rope_mode": "candidate positions",
    "layer": "layer", "head": "head", "values": "values", "color": "colour",
    "query": "query row (a position, or click a heatmap row)", "zoom": "heatmap zoom (full resolution)",
    "candidate": "candidate j",
    **{c.name: c.label for c in _OWN},
}
assert set(LABELS) == set(CONTROL_FIELDS), set(CONTROL_FIELDS) ^ set(LABELS)


# the line under a control while it is not marked (a mark's message takes its place until it is fixed)
INFO = {"query": "−1 shows the first candidate, whatever the layout", **{c.name: c.info for c in _OWN if c.info}}
assert set(INFO) <= set(LABELS)


def short_label(field: str) -> str:
    """A control's label without its parenthesised hint: 'seed (weights and inputs)' -> 'seed'."""
    return LABELS.get(field, field).split(" (")[0]


# field names that read as code (num_kv_heads); the one-word ones read as the words they are
_FIELD_NAME = re.compile(r"\b(" + "|".join(sorted((f for f in LABELS if "_" in f), key=len, reverse=True)) + r")\b")


def on_screen(e: ValidationError) -> str:
    """The message in the page's words: 'KV heads: got 3; allowed: ...', field names in it replaced by
    the labels on screen. Markdown's link form is broken up (a control's info line renders
    `[text](url)` as a link, and the value may come from a stranger's link)."""
    allowed = _FIELD_NAME.sub(lambda m: short_label(m.group(1)), e.allowed)
    shown = as_typed(e.value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{short_label(e.field)}: got {shown}; allowed: {allowed}".replace("](", "] (")


def as_typed(value) -> str:
    """A value as a visitor typed it: a number box sends 1e9 as 1000000000, which reads back as 1e9; text
    is quoted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    plain = str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else repr(float(value))
    short = f"{value:g}"
    if "e" in short and float(short) == value:              # 1e9, 2.5e-07: as short as it was typed
        mantissa, exponent = short.split("e")
        return f"{mantissa}e{int(exponent)}"
    return plain


def involved(e: ValidationError) -> tuple:
    """Every control the problem involves: the field named and the fields whose values make it invalid."""
    return tuple(dict.fromkeys((e.field, *e.also)))


def keep_valid(values: Mapping[str, Any], last: Settings, uploaded=None) -> tuple[Settings, dict[str, str]]:
    """The page's control values -> (settings to draw, {field: message} for every control to mark).
    A control with a problem takes its last valid value in the drawn settings, and so does every other
    control the problem involves (8 query heads then 3 KV heads marks both), so the other controls keep
    working. An emptied or non-numeric number box (None from the page) is a problem too. When the last
    valid values fail as well, `last` is drawn. The device's model limits are not checked here."""
    raw, problems = {f: values[f] for f in CONTROL_FIELDS if f in values}, {}
    for f in NUMBER_FIELDS & raw.keys():
        if raw[f] is None or (isinstance(raw[f], str) and not raw[f].strip()):
            problems[f] = (f"{short_label(f)}: empty, or not a number yet; allowed: a number (the figures keep "
                           f"{as_typed(control_value(last, f))})")
            raw[f] = control_value(last, f)
    for _ in range(len(CONTROL_FIELDS) + 1):
        try:
            return parse_settings(raw, uploaded=uploaded, need_model=False), problems
        except ValidationError as e:
            fields_here = [f for f in involved(e) if f in raw]
            if not fields_here or all(raw[f] == control_value(last, f) for f in fields_here):
                problems.setdefault(fields_here[0] if fields_here else "preset", on_screen(e))
                return last, problems
            for f in fields_here:
                problems.setdefault(f, on_screen(e))
                raw[f] = control_value(last, f)
    return last, problems


def from_link(params: Mapping[str, Any], uploaded=None) -> tuple[Settings, dict[str, str]]:
    """A shared link's parameters -> (settings, {field: message} for each value dropped). A bad value
    is dropped and the preset's value takes its place; the rest of the link is kept
    (?preset=phoenix-2026-nano&family=grok opens phoenix-2026-nano). Keys that are no control are ignored."""
    raw, problems = {k: v for k, v in params.items() if k in LABELS}, {}
    for _ in range(len(CONTROL_FIELDS) + 1):
        try:
            return parse_settings(raw, uploaded=uploaded, need_model=False), problems
        except ValidationError as e:
            fields_here = [f for f in involved(e) if f in raw]
            if not fields_here:
                break
            for f in fields_here:
                problems.setdefault(f, on_screen(e))
                del raw[f]
    problems.setdefault("preset", "preset: the link's settings could not be read; opened lecture")
    return parse_settings({"preset": "lecture"}, uploaded=uploaded, need_model=False), problems


def last_valid_note(problems: Optional[Mapping[str, str]]) -> str:
    """The line above the figures while controls are marked: the figures show the last valid settings."""
    if not problems:
        return ""
    names = ", ".join(f"**{short_label(f)}**" for f in problems)
    return f"⚠ The figures show the last valid settings: {names} {'is' if len(problems) == 1 else 'are'} marked."


# presentation mode's keys: what each steps, and by how much
STEPS = {"query+": ("query", 1), "query-": ("query", -1), "head+": ("head", 1), "head-": ("head", -1),
         "layer+": ("layer", 1), "layer-": ("layer", -1)}


def step_view(s: Settings, key: str) -> Settings:
    """One keyboard step of the view: the query row through the sequence, the head through 'all heads'
    (-1) and each head, the layer through the layers; each stops at its ends."""
    if key not in STEPS:
        raise ValidationError("key", key, ", ".join(STEPS))
    field, delta = STEPS[key]
    if field == "query":
        value, lo, hi = s.query_position + delta, 0, s.seq_len - 1
    elif field == "head":
        value, lo, hi = s.head + delta, -1, s.num_q_heads - 1
    else:
        value, lo, hi = s.layer + delta, 0, s.num_layers - 1
    return replace(s, **{field: min(hi, max(lo, value))})
