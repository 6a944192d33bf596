"""The presets: one table of named geometries and sequence layouts.

The models build their configs from an entry (``transformer`` for grok.py's trunk, ``xrex_config`` for
production's), the app offers every entry by name (``?preset=...``), and the attention benchmark times an
entry's heads, head dim and sequence (explorer.measure). Numbers: docs/originals.md §3.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .grok import TransformerConfig
from .recsys import RecsysConfig, SequenceLayout
from .xrex import XrexConfig, round_up


@dataclass(frozen=True)
class Geometry:
    """The trunk's size, in the field names both families' configs share."""
    emb_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    key_size: int
    widening_factor: float


@dataclass(frozen=True)
class Preset:
    """A named starting point: the trunk family, its geometry and the sequence it reads."""
    description: str
    family: str                 # "grok": grok.py's 2025 trunk (models.grok); "xrex": production's 2026 trunk
    geometry: Geometry
    layout: SequenceLayout
    xrex_options: dict = field(default_factory=dict)   # XrexConfig fields where a production config departs
                                                       # from the flagship's (cap, qk_norm, primer_norm)

    @property
    def transformer(self) -> TransformerConfig:
        """grok.py's trunk at this geometry, q.k scaled by 1/sqrt(key_size)."""
        g = self.geometry
        return TransformerConfig(emb_size=g.emb_size, key_size=g.key_size, num_q_heads=g.num_q_heads,
                                 num_kv_heads=g.num_kv_heads, num_layers=g.num_layers,
                                 widening_factor=g.widening_factor, attn_output_multiplier=1 / math.sqrt(g.key_size))

    def recsys_config(self, transformer: Optional[TransformerConfig] = None, **changes) -> RecsysConfig:
        """grok.py's ranker around `transformer` (default: this preset's trunk)."""
        return RecsysConfig(transformer or self.transformer, **changes)

    def xrex_config(self) -> XrexConfig:
        """Production's trunk at this geometry: P = the layout's user tokens, L = its history slots."""
        g = self.geometry
        return XrexConfig(emb_size=g.emb_size, num_layers=g.num_layers, num_q_heads=g.num_q_heads,
                          num_kv_heads=g.num_kv_heads, key_size=g.key_size, widening_factor=g.widening_factor,
                          num_user_prefix_tokens=self.layout.num_user, history_seq_len=self.layout.num_history,
                          **self.xrex_options)


# docs/originals.md §3: both ranking geometries read 1022 history events and score 64 candidates
RANKING_PROD = Geometry(emb_size=2560, num_layers=8, num_q_heads=20, num_kv_heads=4, key_size=128, widening_factor=2.0)
RANKING_NANO = Geometry(emb_size=512, num_layers=4, num_q_heads=4, num_kv_heads=2, key_size=128, widening_factor=2.0)
RANKING_HISTORY = 1022
RANKING_CANDIDATES = 64


def production_layout(num_prefix: int = 2, num_history: int = RANKING_HISTORY,
                      num_candidates: int = RANKING_CANDIDATES) -> SequenceLayout:
    """Production's sequence [P | L | C] with empty candidate slots padding T to a multiple of 128
    (recsys_model.py pad_to_next_128_multiple: the tiles its kernels run over)."""
    slots = round_up(num_prefix + num_history + num_candidates, 128) - num_prefix - num_history
    return SequenceLayout(num_prefix, num_history, slots, candidate_padding=slots - num_candidates)


PRESETS: dict[str, Preset] = {
    "lecture": Preset("course notebook 000: small enough to read every number", "grok",
                      Geometry(64, 2, 4, 2, 16, 4.0), SequenceLayout(1, 5, 3)),
    "lecture-003": Preset("course notebook 003's translation of grok.py", "grok",
                          Geometry(128, 2, 2, 2, 64, 4.0), SequenceLayout(1, 8, 4)),
    # grok.py reduces the user to one token (docs/originals.md §2: candidates start at 1 + S)
    "phoenix-nano": Preset("phoenix ranking nano geometry (docs/originals.md §3)", "grok",
                           RANKING_NANO, SequenceLayout(1, RANKING_HISTORY, RANKING_CANDIDATES)),
    "phoenix-prod": Preset("phoenix ranking production geometry (docs/originals.md §3)", "grok",
                           RANKING_PROD, SequenceLayout(1, RANKING_HISTORY, RANKING_CANDIDATES)),
    # production's configs/xrecsys.py: a user token and a user-features token before the history
    "phoenix-2026": Preset("production ranking, home_direct_packed: qk_norm, no cap", "xrex",
                           RANKING_PROD, production_layout()),
    "phoenix-2026-nano": Preset("production ranking, home_direct_packed_nano: qk_norm, no cap", "xrex",
                                RANKING_NANO, production_layout()),
    "phoenix-2026-seqpack": Preset("production ranking, xrecsys_seqpack: soft_sign cap 80, primer_norm, no qk_norm",
                                   "xrex", RANKING_PROD, production_layout(),
                                   dict(qk_norm=False, attn_logit_cap=80.0, attn_logit_cap_method="soft_sign",
                                        primer_norm=True)),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset: got {name!r}; allowed: {', '.join(PRESETS)}")
    return PRESETS[name]
