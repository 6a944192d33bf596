"""The original Phoenix models around the trunk: the ranker of ``recsys_model.py`` and the
two-tower retrieval model of ``recsys_retrieval_model.py``, at the original's interface, and synthetic
inputs (the presets that size them: models.presets).

The original takes the hash embeddings already looked up (``RecsysEmbeddings``); so does
``forward(batch, embeddings)`` here. Without ``embeddings`` the models look the hashes up in their
own tables, which the original keeps outside the model (the demo world and the app use them).

Sequence: [user tokens | history | candidates]; ``candidate_start_offset = U + S``.
Hash 0 marks an empty slot (padding). Ranker output: ``rms_norm(trunk)[:, offset:] @ unembeddings``
-> [B, C, num_actions] logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch
from torch import nn

from .grok import Linear, RMSNorm, Transformer, TransformerConfig, TransformerOutput, init_params

# the engagement actions the original ranker predicts, in its order (phoenix runners.ACTIONS)
ACTIONS = ("favorite_score", "reply_score", "repost_score", "photo_expand_score", "click_score",
           "profile_click_score", "vqv_score", "share_score", "share_via_dm_score", "share_via_copy_link_score",
           "dwell_score", "quote_score", "quoted_click_score", "follow_author_score", "not_interested_score",
           "block_author_score", "mute_author_score", "report_score", "dwell_time")
L2_EPS = 1e-12   # recsys_retrieval_model.py: norm = sqrt(max(sum(x^2), EPS))


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
    """PhoenixModelConfig / PhoenixRetrievalModelConfig of the original, with the same defaults."""
    transformer: TransformerConfig
    num_user_hashes: int = 2
    num_item_hashes: int = 2
    num_author_hashes: int = 2
    action_names: tuple[str, ...] = ACTIONS    # what each logit predicts; num_actions = their count
    num_product_surfaces: int = 16             # the original's product_surface_vocab_size
    hash_vocab_size: int = 1024                # the project's own hash tables (the original's live outside)
    num_user_tokens: int = 1   # phoenix reduces the user to one token; the explorer may widen it

    def __post_init__(self):
        names = self.action_names
        if (isinstance(names, str) or not isinstance(names, (tuple, list)) or not names
                or not all(isinstance(a, str) and a for a in names) or len(set(names)) != len(names)):
            raise ValueError(f"action_names: got {names!r}; allowed: distinct non-empty names, one per "
                             f"logit, e.g. the original's {', '.join(ACTIONS[:3])}, ...")
        object.__setattr__(self, "action_names", tuple(names))
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{f.name}: got {v!r}; allowed: an integer >= 1")

    @property
    def emb_size(self) -> int:
        return self.transformer.emb_size

    @property
    def num_actions(self) -> int:
        return len(self.action_names)


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
class RecsysEmbeddings:
    """The hash embeddings already looked up, as the original's models take them."""
    user_embeddings: torch.Tensor              # [B, n_user_hashes, D]
    history_post_embeddings: torch.Tensor      # [B, S, n_item_hashes, D]
    candidate_post_embeddings: torch.Tensor    # [B, C, n_item_hashes, D]
    history_author_embeddings: torch.Tensor    # [B, S, n_author_hashes, D]
    candidate_author_embeddings: torch.Tensor  # [B, C, n_author_hashes, D]

    def check(self, config: RecsysConfig, batch: RecsysBatch) -> "RecsysEmbeddings":
        """Every shape against the config and the batch; a ValueError names the first that differs."""
        B, S = batch.history_post_hashes.shape[:2]
        C, D = batch.candidate_post_hashes.shape[1], config.emb_size
        expected = {"user_embeddings": ((B, config.num_user_hashes, D), "[B, num_user_hashes, emb_size]"),
                    "history_post_embeddings": ((B, S, config.num_item_hashes, D),
                                                "[B, S, num_item_hashes, emb_size]"),
                    "candidate_post_embeddings": ((B, C, config.num_item_hashes, D),
                                                  "[B, C, num_item_hashes, emb_size]"),
                    "history_author_embeddings": ((B, S, config.num_author_hashes, D),
                                                  "[B, S, num_author_hashes, emb_size]"),
                    "candidate_author_embeddings": ((B, C, config.num_author_hashes, D),
                                                    "[B, C, num_author_hashes, emb_size]")}
        for name, (shape, what) in expected.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
                got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"embeddings.{name}: got {got}; allowed: {what} = {list(shape)}")
        return self


@dataclass
class RecsysOutput:
    logits: torch.Tensor          # [B, C, num_actions]
    trunk: TransformerOutput      # the trunk's output (and traces when recorded)
    embeddings: torch.Tensor      # [B, T, D] the trunk's input
    valid: torch.Tensor           # [B, T] bool
    candidate_start_offset: int


class _PhoenixInputs(nn.Module):
    """What the ranker and the retrieval model share: the trunk, the user and history reductions
    (``block_user_reduce`` / ``block_history_reduce``: proj_mat_1, proj_mat_3), the action projection,
    the product-surface table, and the project's own hash tables."""

    def __init__(self, config: RecsysConfig):
        super().__init__()
        c, D = config, config.emb_size
        self.config = c
        self.user_embeddings = nn.Embedding(c.hash_vocab_size, D)
        self.post_embeddings = nn.Embedding(c.hash_vocab_size, D)
        self.author_embeddings = nn.Embedding(c.hash_vocab_size, D)
        self.product_surface_embeddings = nn.Embedding(c.num_product_surfaces, D)
        self.action_projection = nn.Parameter(torch.zeros(c.num_actions, D))
        self.user_projection = Linear(c.num_user_hashes * D, c.num_user_tokens * D)
        self.history_projection = Linear((c.num_item_hashes + c.num_author_hashes) * D + 2 * D, D)
        self.transformer = Transformer(c.transformer)

    def lookup(self, batch: RecsysBatch) -> RecsysEmbeddings:
        """The hash embeddings from the model's own tables (the original looks them up outside)."""
        return RecsysEmbeddings(self.user_embeddings(batch.user_hashes),
                                self.post_embeddings(batch.history_post_hashes),
                                self.post_embeddings(batch.candidate_post_hashes),
                                self.author_embeddings(batch.history_author_hashes),
                                self.author_embeddings(batch.candidate_author_hashes))

    def _hash_embeddings(self, batch: RecsysBatch, embeddings: Optional[RecsysEmbeddings]) -> RecsysEmbeddings:
        return self.lookup(batch) if embeddings is None else embeddings.check(self.config, batch)

    def _product_surface(self, index: torch.Tensor) -> torch.Tensor:
        """one_hot(index, vocab) @ table, as the original: an index outside the vocabulary gives zeros."""
        table = self.product_surface_embeddings.weight
        inside = (index >= 0) & (index < table.shape[0])
        return table[index.clamp(0, table.shape[0] - 1)] * inside.unsqueeze(-1).to(table.dtype)

    def _user(self, batch: RecsysBatch, e: RecsysEmbeddings):
        """-> (user tokens [B, U, D], valid [B, U]); valid where the first user hash is not 0."""
        c, D = self.config, self.config.emb_size
        B = e.user_embeddings.shape[0]
        user = self.user_projection(e.user_embeddings.reshape(B, 1, -1)).reshape(B, c.num_user_tokens, D)
        return user, (batch.user_hashes[:, :1] != 0).expand(B, c.num_user_tokens)

    def _history(self, batch: RecsysBatch, e: RecsysEmbeddings):
        """-> (history tokens [B, S, D], valid [B, S])."""
        actions = batch.history_actions.to(self.action_projection.dtype)                 # multi-hot: exact
        action_emb = (2 * actions - 1) @ self.action_projection                     # [B, S, D]
        action_emb = action_emb * actions.any(-1, keepdim=True)                     # no action -> 0
        history = torch.cat([e.history_post_embeddings.flatten(2), e.history_author_embeddings.flatten(2),
                             action_emb, self._product_surface(batch.history_product_surface)], dim=-1)
        return self.history_projection(history), batch.history_post_hashes[:, :, 0] != 0


class RecsysModel(_PhoenixInputs):
    """The original ranker (``PhoenixModel``): reduce -> trunk (recsys mask) -> rms_norm -> unembeddings."""

    def __init__(self, config: RecsysConfig):
        super().__init__(config)
        c, D = config, config.emb_size
        self.candidate_projection = Linear((c.num_item_hashes + c.num_author_hashes) * D + D, D)
        self.rms_norm = RMSNorm(D, c.transformer.norm_eps)
        self.unembedding = nn.Parameter(torch.zeros(D, c.num_actions))

    def embed(self, batch: RecsysBatch, embeddings: Optional[RecsysEmbeddings] = None):
        """-> (trunk input [B, T, D], valid [B, T] bool, candidate_start_offset)."""
        e = self._hash_embeddings(batch, embeddings)
        user, user_valid = self._user(batch, e)
        history, history_valid = self._history(batch, e)
        cand = torch.cat([e.candidate_post_embeddings.flatten(2), e.candidate_author_embeddings.flatten(2),
                          self._product_surface(batch.candidate_product_surface)], dim=-1)
        cand = self.candidate_projection(cand)                                      # [B, C, D]
        cand_valid = batch.candidate_post_hashes[:, :, 0] != 0
        emb = torch.cat([user, history, cand], dim=1)
        valid = torch.cat([user_valid, history_valid, cand_valid], dim=1)
        return emb, valid, user.shape[1] + history.shape[1]

    def score_embeddings(self, embeddings, valid, candidate_start_offset, **trunk_kwargs) -> RecsysOutput:
        """Run the trunk and head on given trunk inputs (probes perturb them here)."""
        out = self.transformer(embeddings, valid, candidate_start_offset, **trunk_kwargs)
        cand = self.rms_norm(out.embeddings)[:, candidate_start_offset:]            # [B, C, D]
        logits = cand @ self.unembedding.to(cand.dtype)                             # [B, C, A]
        return RecsysOutput(logits, out, embeddings, valid, candidate_start_offset)

    def forward(self, batch: RecsysBatch, embeddings: Optional[RecsysEmbeddings] = None,
                **trunk_kwargs) -> RecsysOutput:
        """``embeddings`` given: used exactly as recsys_model.py uses them; else looked up here."""
        emb, valid, off = self.embed(batch, embeddings)
        return self.score_embeddings(emb, valid, off, **trunk_kwargs)


class CandidateTower(nn.Module):
    """recsys_retrieval_model.py's candidate tower: concat(post, author hash embeddings)
    -> Linear 2D -> SiLU -> Linear D -> L2-normalised."""

    def __init__(self, in_size: int, emb_size: int):
        super().__init__()
        self.projection_1 = Linear(in_size, 2 * emb_size)
        self.projection_2 = Linear(2 * emb_size, emb_size)

    def forward(self, post: torch.Tensor, author: torch.Tensor) -> torch.Tensor:
        """post [B, C, n_item_hashes, D], author [B, C, n_author_hashes, D] -> [B, C, D]."""
        x = torch.cat([post, author], dim=2).flatten(2)
        x = self.projection_2(torch.nn.functional.silu(self.projection_1(x)))
        return x / x.pow(2).sum(-1, keepdim=True).clamp_min(L2_EPS).sqrt()


class PhoenixRetrievalModel(_PhoenixInputs):
    """The original two-tower retrieval model: the trunk in causal mode over user + history,
    mean-pooled raw (no final norm) over valid tokens and L2-normalised; candidates through
    ``CandidateTower``. Same ``RecsysConfig`` as the ranker."""

    def __init__(self, config: RecsysConfig):
        super().__init__(config)
        D = config.emb_size
        self.candidate_tower = CandidateTower((config.num_item_hashes + config.num_author_hashes) * D, D)

    def build_user_representation(self, batch: RecsysBatch, embeddings: Optional[RecsysEmbeddings] = None):
        """-> (user_representation [B, D] unit norm, user_norm [B, 1] its norm before normalising)."""
        e = self._hash_embeddings(batch, embeddings)
        user, user_valid = self._user(batch, e)
        history, history_valid = self._history(batch, e)
        valid = torch.cat([user_valid, history_valid], dim=1)
        h = self.transformer(torch.cat([user, history], dim=1), valid, None).embeddings    # causal
        w = valid.unsqueeze(-1).to(h.dtype)
        pooled = (h * w).sum(1) / w.sum(1).clamp_min(1.0)                                # [B, D]
        norm = pooled.pow(2).sum(-1, keepdim=True).clamp_min(L2_EPS).sqrt()               # [B, 1]
        return pooled / norm, norm

    def build_candidate_representation(self, batch: RecsysBatch, embeddings: Optional[RecsysEmbeddings] = None):
        """-> (candidate_representation [B, C, D] unit norm, candidate_padding_mask [B, C] True = valid)."""
        e = self._hash_embeddings(batch, embeddings)
        rep = self.candidate_tower(e.candidate_post_embeddings, e.candidate_author_embeddings)
        return rep, batch.candidate_post_hashes[:, :, 0] != 0


def init_recsys(model, mode: str = "random", seed: int = 0, tables_only: bool = False):
    """RecsysModel or PhoenixRetrievalModel. Trunk per grok.py's modes; embedding tables N(0, 1) seeded
    (zeros leaves them random too, so zeros-init still has distinct tokens to look at), from a generator of
    their own. `tables_only`: every other parameter zero instead — for a model about to load a weight file,
    which writes each of them (models.weights: all required), so their seeded draws would be thrown away."""
    if tables_only:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    else:
        init_params(model, mode, seed)
    g = torch.Generator().manual_seed(int(seed) + 1)
    with torch.no_grad():
        for emb in (model.user_embeddings, model.post_embeddings, model.author_embeddings,
                    model.product_surface_embeddings):
            emb.weight.copy_(torch.randn(emb.weight.shape, generator=g))
        if mode == "zeros":
            # grok.py inits only the trunk to zeros; the reduce projections must pass information
            for lin in (model.user_projection, model.history_projection,
                        getattr(model, "candidate_projection", None)):
                if lin is None:     # the retrieval model has no candidate projection
                    continue
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
