"""Attention masks, each written once as a predicate.

A mask is a ``mask_mod(b, h, q_idx, kv_idx) -> bool`` — the signature FlexAttention's
``mask_mod`` takes (attention-gym style). The same predicate produces the dense tensor the
model multiplies in (``dense``), the FlexAttention block mask (models.attention) and the
pictures the explorer draws. True = the query may attend to the key.

grok.py's ``make_recsys_attn_mask`` is kept with its own name and signature; a test proves it
equals the predicate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

PREFIX_MODES = ("causal", "bidirectional")


# --- predicates -------------------------------------------------------------------------

def causal_mask() -> MaskMod:
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx
    return causal


def full_mask() -> MaskMod:
    def full(b, h, q_idx, kv_idx):
        return kv_idx >= 0  # always true, written as a tensor op so it broadcasts and traces
    return full


def recsys_mask(candidate_start_offset: int, prefix: str = "causal") -> MaskMod:
    """Candidates see the prefix (user + history) and themselves, never each other.

    prefix="causal" is grok.py's ``make_recsys_attn_mask``; "bidirectional" is production
    phoenix, where user and history attend to each other freely.
    """
    off = int(candidate_start_offset)
    if prefix == "causal":
        def recsys_causal(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & ((kv_idx < off) | (kv_idx == q_idx))
        return recsys_causal
    if prefix == "bidirectional":
        def recsys_bidirectional(b, h, q_idx, kv_idx):
            # a prefix query (q < off) sees the whole prefix; a candidate sees prefix + itself
            return (kv_idx < off) | (kv_idx == q_idx)
        return recsys_bidirectional
    raise ValueError(f"prefix: got {prefix!r}; allowed: {', '.join(PREFIX_MODES)}")


def padding_mask(valid: torch.Tensor) -> MaskMod:
    """Keys at padded slots are hidden (grok.py: ``mask[:, None, None, :]``). valid: [B, T] bool."""
    def padding(b, h, q_idx, kv_idx):
        return valid[b, kv_idx]
    return padding


def and_masks(*mods: MaskMod) -> MaskMod:
    def combined(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            out = out & m(b, h, q_idx, kv_idx)
        return out
    return combined


MASK_KINDS: dict[str, Callable[..., MaskMod]] = {
    # kind -> builder(candidate_start_offset) ; one entry per mask kind
    "recsys": lambda off: recsys_mask(off, "causal"),
    "recsys-bidirectional": lambda off: recsys_mask(off, "bidirectional"),
    "causal": lambda off: causal_mask(),
    "full": lambda off: full_mask(),
}


def dense(mask_mod: MaskMod, q_len: int, kv_len: Optional[int] = None, batch: int = 1) -> torch.Tensor:
    """Evaluate a predicate on the whole grid by broadcasting: [batch, 1, q_len, kv_len] bool."""
    kv_len = q_len if kv_len is None else kv_len
    b = torch.arange(batch)[:, None, None, None]
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    q = torch.arange(q_len)[None, None, :, None]
    kv = torch.arange(kv_len)[None, None, None, :]
    out = mask_mod(b, h, q, kv)
    return out.expand(batch, 1, q_len, kv_len).bool()


# --- the description backends receive --------------------------------------------------

@dataclass(frozen=True, eq=False)
class AttentionMask:
    """Everything a backend may need to know about the mask, from which it builds its own form.

    kind: a key of MASK_KINDS; candidate_start_offset: where candidates begin (recsys kinds);
    valid: optional [B, T] bool key-padding; seq_len: T.
    """
    kind: str
    seq_len: int
    candidate_start_offset: Optional[int] = None
    valid: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.kind not in MASK_KINDS:
            raise ValueError(f"mask kind: got {self.kind!r}; allowed: {', '.join(MASK_KINDS)}")
        if self.kind.startswith("recsys"):
            off = self.candidate_start_offset
            if off is None or not 0 <= off <= self.seq_len:
                raise ValueError(
                    f"candidate_start_offset: got {off!r}; allowed: an integer in [0, {self.seq_len}] "
                    f"(the sequence length)")
        if self.valid is not None and (self.valid.dim() != 2 or self.valid.shape[1] != self.seq_len):
            raise ValueError(f"mask: got shape {tuple(self.valid.shape)}; allowed: [B, {self.seq_len}] "
                             f"(batch, sequence length)")

    @property
    def prefix(self) -> str:
        return "bidirectional" if self.kind == "recsys-bidirectional" else "causal"

    def structure_mod(self) -> MaskMod:
        return MASK_KINDS[self.kind](self.candidate_start_offset)

    def mask_mod(self) -> MaskMod:
        s = self.structure_mod()
        return s if self.valid is None else and_masks(s, padding_mask(self.valid))

    def dense(self) -> torch.Tensor:
        """[B or 1, 1, T, T] bool — what grok.py multiplies together."""
        batch = 1 if self.valid is None else self.valid.shape[0]
        return dense(self.mask_mod(), self.seq_len, batch=batch)


def allowed_pairs(mask: torch.Tensor) -> int:
    return int(mask.sum())


# --- grok.py's own function ------------------------------------------------------------

def make_recsys_attn_mask(seq_len: int, candidate_start_offset: int, dtype=torch.float32) -> torch.Tensor:
    """grok.py's name and signature: [1, 1, T, T], 1 = may attend."""
    if not 0 <= candidate_start_offset <= seq_len:
        raise ValueError(f"candidate_start_offset: got {candidate_start_offset}; allowed: [0, {seq_len}]")
    return dense(recsys_mask(candidate_start_offset, "causal"), seq_len).to(dtype)
