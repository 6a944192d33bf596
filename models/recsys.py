"""The ranking model around the trunk (phoenix ``recsys_model.py``), the retrieval user tower,
synthetic inputs and the preset registry.

Sequence: [user tokens | history | candidates]; ``candidate_start_offset = U + S``.
Hash 0 marks an empty slot (padding). Output: ``rms_norm(trunk)[:, offset:] @ unembedding``
-> [B, C, num_actions] logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch import nn

from .grok import Linear, RMSNorm, Transformer, TransformerConfig, TransformerOutput, init_params

ACTIONS = ("like", "reply", "repost", "click", "profile_click", "share", "dwell", "not_interested")


@dataclass(frozen=True)
class SequenceLayout:
    """Where each token sits. Padded slots are the last ones of their block."""
    num_user: int = 1
    num_history: int = 5
    num_candidates: int = 3
    history_padding: int = 0
    candidate_padding: int = 0

    def __post_init__(self):
        for name in ("num_user", "num_history", "num_candidates", "history_padding", "candidate_padding"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: got {v!r}; allowed: an integer >= 0")
        if self.num_user < 1:
            raise ValueError(f"num_user: got {self.num_user}; allowed: at least 1 (the user token)")
        if self.history_padding > self.num_history:
            raise ValueError(f"history_padding: got {self.history_padding}; allowed: 0..{self.num_history} "
                             f"(the history length)")
        if self.candidate_padding > self.num_candidates:
            raise ValueError(f"candidate_padding: got {self.candidate_padding}; allowed: "
                             f"0..{self.num_candidates} (the number of candidates)")

    @property
    def candidate_start_offset(self) -> int:
        return self.num_user + self.num_history

    @property
    def seq_len(self) -> int:
        return self.candidate_start_offset + self.num_candidates

    def segments(self) -> list[str]:
        """One letter per position: U, H, C, or P (padded slot)."""
        return (["U"] * self.num_user
                + ["H"] * (self.num_history - self.history_padding) + ["P"] * self.history_padding
                + ["C"] * (self.num_candidates - self.candidate_padding) + ["P"] * self.candidate_padding)

    def token_labels(self) -> list[str]:
        labels = [f"U{i}" if self.num_user > 1 else "U" for i in range(self.num_user)]
        labels += [f"H{i}" if i < self.num_history - self.history_padding else f"pad·H{i}"
                   for i in range(self.num_history)]
        labels += [f"C{i}" if i < self.num_candidates - self.candidate_padding else f"pad·C{i}"
                   for i in range(self.num_candidates)]
        return labels

    def valid(self) -> torch.Tensor:
        return torch.tensor([s != "P" for s in self.segments()])


@dataclass(frozen=True)
class RecsysConfig:
    transformer: TransformerConfig
    num_user_hashes: int = 2
    num_item_hashes: int = 2
    num_author_hashes: int = 2
    num_actions: int = len(ACTIONS)
    num_product_surfaces: int = 8
    hash_vocab_size: int = 1024
    num_user_tokens: int = 1   # phoenix reduces the user to one token; the explorer may widen it

    @property
    def emb_size(self) -> int:
        return self.transformer.emb_size


@dataclass
class RecsysBatch:
    user_hashes: torch.Tensor               # [B, n_user_hashes] long
    history_post_hashes: torch.Tensor       # [B, S, n_item_hashes]
    history_author_hashes: torch.Tensor     # [B, S, n_author_hashes]
    history_actions: torch.Tensor           # [B, S, num_actions] multi-hot float
    history_product_surface: torch.Tensor   # [B, S] long
    candidate_post_hashes: torch.Tensor     # [B, C, n_item_hashes]
    candidate_author_hashes: torch.Tensor   # [B, C, n_author_hashes]
    candidate_product_surface: torch.Tensor  # [B, C]

    def select_candidates(self, index: torch.Tensor) -> "RecsysBatch":
        """Keep / reorder candidates (index: [C'] long) — for batch-invariance probes."""
        return replace(self, candidate_post_hashes=self.candidate_post_hashes[:, index],
                       candidate_author_hashes=self.candidate_author_hashes[:, index],
                       candidate_product_surface=self.candidate_product_surface[:, index])


@dataclass
class RecsysOutput:
    logits: torch.Tensor          # [B, C, num_actions]
    trunk: TransformerOutput      # the trunk's output (and traces when recorded)
    embeddings: torch.Tensor      # [B, T, D] the trunk's input
    valid: torch.Tensor           # [B, T] bool
    candidate_start_offset: int


class RecsysModel(nn.Module):
    """Phoenix ranking model: block reduce -> trunk (recsys mask) -> rms_norm -> unembedding."""

    def __init__(self, config: RecsysConfig):
        super().__init__()
        c = config
        D = c.emb_size
        self.config = c
        self.user_embeddings = nn.Embedding(c.hash_vocab_size, D)
        self.post_embeddings = nn.Embedding(c.hash_vocab_size, D)
        self.author_embeddings = nn.Embedding(c.hash_vocab_size, D)
        self.product_surface_embeddings = nn.Embedding(c.num_product_surfaces, D)
        self.action_projection = nn.Parameter(torch.zeros(c.num_actions, D))
        self.user_projection = Linear(c.num_user_hashes * D, c.num_user_tokens * D)
        self.history_projection = Linear((c.num_item_hashes + c.num_author_hashes) * D + 2 * D, D)
        self.candidate_projection = Linear((c.num_item_hashes + c.num_author_hashes) * D + D, D)
        self.transformer = Transformer(c.transformer)
        self.rms_norm = RMSNorm(D, c.transformer.norm_eps)
        self.unembedding = nn.Parameter(torch.zeros(D, c.num_actions))

    # --- the three blocks -----------------------------------------------------------------
    def embed(self, batch: RecsysBatch):
        """-> (embeddings [B, T, D], valid [B, T] bool, candidate_start_offset)."""
        c, D = self.config, self.config.emb_size
        B = batch.user_hashes.shape[0]
        user = self.user_embeddings(batch.user_hashes).reshape(B, 1, -1)            # [B, 1, n*D]
        user = self.user_projection(user).reshape(B, c.num_user_tokens, D)          # [B, U, D]
        user_valid = (batch.user_hashes[:, :1] != 0).expand(B, c.num_user_tokens)

        S = batch.history_post_hashes.shape[1]
        actions = batch.history_actions.float()
        action_emb = (2 * actions - 1) @ self.action_projection                     # [B, S, D]
        action_emb = action_emb * actions.any(-1, keepdim=True)                     # no action -> 0
        history = torch.cat([
            self.post_embeddings(batch.history_post_hashes).flatten(2),
            self.author_embeddings(batch.history_author_hashes).flatten(2),
            action_emb,
            self.product_surface_embeddings(batch.history_product_surface),
        ], dim=-1)
        history = self.history_projection(history)                                  # [B, S, D]
        history_valid = batch.history_post_hashes[:, :, 0] != 0

        C = batch.candidate_post_hashes.shape[1]
        cand = torch.cat([
            self.post_embeddings(batch.candidate_post_hashes).flatten(2),
            self.author_embeddings(batch.candidate_author_hashes).flatten(2),
            self.product_surface_embeddings(batch.candidate_product_surface),
        ], dim=-1)
        cand = self.candidate_projection(cand)                                      # [B, C, D]
        cand_valid = batch.candidate_post_hashes[:, :, 0] != 0

        emb = torch.cat([user, history, cand], dim=1)
        valid = torch.cat([user_valid, history_valid, cand_valid], dim=1)
        return emb, valid, c.num_user_tokens + S

    def score_embeddings(self, embeddings, valid, candidate_start_offset, **trunk_kwargs) -> RecsysOutput:
        """Run the trunk and head on given embeddings (probes perturb them here)."""
        out = self.transformer(embeddings, valid, candidate_start_offset, **trunk_kwargs)
        cand = self.rms_norm(out.embeddings)[:, candidate_start_offset:]            # [B, C, D]
        logits = cand @ self.unembedding.to(cand.dtype)                             # [B, C, A]
        return RecsysOutput(logits, out, embeddings, valid, candidate_start_offset)

    def forward(self, batch: RecsysBatch, **trunk_kwargs) -> RecsysOutput:
        emb, valid, off = self.embed(batch)
        return self.score_embeddings(emb, valid, off, **trunk_kwargs)


class RetrievalUserTower(nn.Module):
    """The retrieval user tower: the same trunk in causal mode over user + history,
    mean-pooled over valid positions and L2-normalised. Shares the ranker's embedding blocks."""

    def __init__(self, ranker: RecsysModel):
        super().__init__()
        self.ranker = ranker

    def forward(self, batch: RecsysBatch, **trunk_kwargs) -> torch.Tensor:
        emb, valid, off = self.ranker.embed(batch)
        emb, valid = emb[:, :off], valid[:, :off]
        h = self.ranker.transformer(emb, valid, None, **trunk_kwargs).embeddings     # causal
        h = self.ranker.rms_norm(h)
        w = valid.unsqueeze(-1).to(h.dtype)
        pooled = (h * w).sum(1) / w.sum(1).clamp_min(1)                             # [B, D]
        return torch.nn.functional.normalize(pooled, dim=-1)


def init_recsys(model: RecsysModel, mode: str = "random", seed: int = 0) -> RecsysModel:
    """Trunk per grok.py's modes; embedding tables N(0, 1) seeded (zeros leaves them random too,
    so zeros-init still has distinct tokens to look at)."""
    init_params(model, mode, seed)
    g = torch.Generator().manual_seed(int(seed) + 1)
    with torch.no_grad():
        for emb in (model.user_embeddings, model.post_embeddings, model.author_embeddings,
                    model.product_surface_embeddings):
            emb.weight.copy_(torch.randn(emb.weight.shape, generator=g))
        if mode == "zeros":
            # grok.py inits only the trunk to zeros; the reduce projections must pass information
            for lin in (model.user_projection, model.history_projection, model.candidate_projection):
                t = torch.randn(lin.w.shape, generator=g) / math.sqrt(lin.w.shape[0])
                lin.w.copy_(t)
    return model


def synthetic_batch(config: RecsysConfig, layout: SequenceLayout, seed: int = 0, batch: int = 1) -> RecsysBatch:
    """Random hashes in [1, vocab); the layout's padded slots get hash 0. Deterministic in seed."""
    if layout.num_user != config.num_user_tokens:
        raise ValueError(f"num_user: got {layout.num_user}; allowed: {config.num_user_tokens} "
                         f"(the model's num_user_tokens)")
    g = torch.Generator().manual_seed(int(seed))
    V, S, C = config.hash_vocab_size, layout.num_history, layout.num_candidates

    def hashes(*shape):
        return torch.randint(1, V, shape, generator=g)

    hist_post, hist_author = hashes(batch, S, config.num_item_hashes), hashes(batch, S, config.num_author_hashes)
    actions = (torch.rand(batch, S, config.num_actions, generator=g) < 0.3).float()
    surf_h = torch.randint(0, config.num_product_surfaces, (batch, S), generator=g)
    cand_post, cand_author = hashes(batch, C, config.num_item_hashes), hashes(batch, C, config.num_author_hashes)
    surf_c = torch.randint(0, config.num_product_surfaces, (batch, C), generator=g)
    if layout.history_padding:
        hist_post[:, S - layout.history_padding:] = 0
        hist_author[:, S - layout.history_padding:] = 0
        actions[:, S - layout.history_padding:] = 0
    if layout.candidate_padding:
        cand_post[:, C - layout.candidate_padding:] = 0
        cand_author[:, C - layout.candidate_padding:] = 0
    return RecsysBatch(hashes(batch, config.num_user_hashes), hist_post, hist_author, actions, surf_h,
                       cand_post, cand_author, surf_c)


# --- presets: one registry -------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    description: str
    transformer: TransformerConfig
    layout: SequenceLayout
    recsys: dict = field(default_factory=dict)

    def recsys_config(self, transformer: Optional[TransformerConfig] = None, **changes) -> RecsysConfig:
        return RecsysConfig(transformer or self.transformer, **{**self.recsys, **changes})


def _geometry(emb, layers, q, kv, key, widening, **kw) -> TransformerConfig:
    return TransformerConfig(emb_size=emb, key_size=key, num_q_heads=q, num_kv_heads=kv, num_layers=layers,
                             widening_factor=widening, attn_output_multiplier=1 / math.sqrt(key), **kw)


PRESETS: dict[str, Preset] = {
    "lecture": Preset("course notebook 000: small enough to read every number",
                      _geometry(64, 2, 4, 2, 16, 4.0), SequenceLayout(1, 5, 3)),
    "lecture-003": Preset("course notebook 003's translation of grok.py",
                          _geometry(128, 2, 2, 2, 64, 4.0), SequenceLayout(1, 8, 4)),
    "phoenix-nano": Preset("phoenix ranking nano geometry (FACTS.md §3)",
                           _geometry(512, 4, 4, 2, 128, 2.0), SequenceLayout(1, 1022, 64)),
    "phoenix-prod": Preset("phoenix ranking production geometry (FACTS.md §3)",
                           _geometry(2560, 8, 20, 4, 128, 2.0), SequenceLayout(1, 1022, 64)),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset: got {name!r}; allowed: {', '.join(PRESETS)}")
    return PRESETS[name]
