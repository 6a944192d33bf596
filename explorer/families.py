"""The model families and the values each preset brings with it: every preset belongs to one family
(grok.py's 2025 trunk or production's 2026 one), and ``defaults(preset, family)`` is what a configuration
holds before any field is set — the preset's values, plus what production's family fixes when a 2025 preset
runs on it. explorer.settings fills left-out fields from it; its ``with_family`` moves settings between them.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, replace
from typing import Optional

from models.demo import DEMO_WEIGHTS, demo_config
from models.grok import TransformerConfig
from models.presets import PRESETS
from models.xrex import XrexConfig

from .schema import Settings, ValidationError

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


def preset_family(name: str) -> str:
    """The family a preset belongs to: production's presets imply it, grok.py's start on grok.py's."""
    return PRESETS[name].family


def preset_defaults(name: str) -> dict:
    """Every field a preset sets, its family included (a new dict each call)."""
    if name not in PRESETS:
        raise ValidationError("preset", name, ", ".join(PRESETS))
    values = _preset_values(name)
    if "weights" in values:                     # a production preset's: random
        return dict(values)
    return dict(values, weights="demo" if name == "lecture" and DEMO_WEIGHTS.exists() else "random")


@functools.lru_cache(maxsize=None)
def _preset_values(name: str) -> dict:
    """preset_defaults less the weights of a grok.py preset (whether the demo's file is here), worked out once
    per preset (the registry is fixed): every request's settings start from it, admission's on the event loop."""
    p = PRESETS[name]
    shape = dict(preset=name, family=p.family, **asdict(p.layout), **asdict(p.geometry))
    if p.family == "xrex":
        return {**shape, **_xrex_settings(p.xrex_config())}
    t = p.transformer
    return dict(shape, multiplier=t.attn_output_multiplier, cap_method=t.cap_method, logit_cap=t.logit_cap,
                prefix=t.prefix, rope_base=t.rope_base, rope_offset=t.rope_offset, rope_mode=t.rope_mode)


def _xrex_settings(c: XrexConfig) -> dict:
    """What a production preset sets beyond its shape (docs/originals.md §3): its scale and cap, the bidirectional
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


def preset_settings(name: str) -> Settings:
    """A preset's settings as its link `preset=<name>` parses them, for a figure that compares presets (the
    mask's kernel notes, the timing tab's work per forward); the device's model limits left out
    (tests/test_presets.py: the same as explorer.settings.parse_settings gives)."""
    return replace(Settings(), **defaults(name, preset_family(name)))


def demo_transformer() -> Optional[TransformerConfig]:
    """The trained demo model's geometry, or None in a checkout without the weights file
    (python -m models.train_demo writes it)."""
    return demo_config().transformer if DEMO_WEIGHTS.exists() else None
