"""What a configuration is: the frozen ``Settings`` every view reads, and ``ValidationError``, which every
layer above raises when a value will not do (a ValueError whose message names the field, the value and what
is allowed; server/guard.py turns it into ``gr.Error``). The bottom of the settings modules: explorer.limits and
explorer.families read these; explorer.settings parses raw values into them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from models.demo import demo_config
from models.grok import ROPE_MODES, TransformerConfig
from models.masks import model_mask_kind
from models.presets import PRESETS
from models.recsys import RecsysConfig, SequenceLayout
from models.xrex import XrexConfig


class ValidationError(ValueError):
    """A control holds a value the explorer cannot use. The message names field, value and what is allowed;
    `also`: the other fields whose values make it invalid (KV heads for a query-head count they do not divide)."""

    def __init__(self, field: str, value: Any, allowed: str, also: tuple = ()):
        self.field, self.value, self.allowed, self.also = field, value, allowed, tuple(also)
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(f"{field}: got {shown}; allowed: {allowed}")


@dataclass(frozen=True)
class Settings:
    preset: str = "lecture"
    family: str = "grok"             # explorer.families.FAMILIES: grok.py's trunk or production's (2026)
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
    # view options (part of the URL so a link reproduces the picture; VIEW_FIELDS below)
    layer: int = 0
    head: int = -1                   # -1: every head of the layer as a grid
    values: str = "probabilities"
    color: str = "linear"
    query: int = -1                  # -1: the first candidate
    zoom: str = "all"                # explorer.settings.ZOOMS: the whole sequence, or one region at full resolution
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


# The fields that change only what is shown, never the model, its inputs or its weights: the view options and
# the batch row shown. explorer.runs.model_settings resets them, so settings that differ only here share one
# model and one recorded forward (a field missing here would build and run the model again at each change of
# it). Every other field picks the model, its layout or its weights; tests/test_explorer_settings.py fails on
# a field that is neither.
VIEW_FIELDS = ("row", "layer", "head", "values", "color", "query", "zoom", "candidate", "perturbation", "delta",
               "replace_with", "operation", "compare", "variant", "bug")
