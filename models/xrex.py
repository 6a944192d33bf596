"""The 2026 production Phoenix ranker (xai-org/x-algorithm ``phoenix/xrex/``): trunk and output head.

``models/grok.py`` ports the 2025 open-source ``grok.py``; this file ports what X's ranking configs
(``home_direct_packed`` and its ``_nano`` / ``xrecsys_seqpack`` siblings) run in 2026. The two differ
in nearly every piece that touches attention (docs/originals.md §8):

    grok.py (models/grok.py)                 xrex (this file)
    causal user + history                    bidirectional prefix; each candidate sees prefix + self
    RoPE at 0..T-1                           right-anchored: last history event at P+L-1, candidates at P+L
    pre + post RMSNorm on both sub-layers    pre-norm only (post-norms only with primer_norm)
    separate query / key / value             one merged ``qkv``, interleaved per KV group
    no qk norm                               qk_norm: one RMSNorm over all heads flattened, before RoPE
    30 * tanh cap, attn_output_multiplier    no cap (or soft_sign / tanh), scale sqrt(128) / key_size
    GeGLU, ffn round_up(2/3 * wf * D, 8)     plain tanh-GELU ``up_proj`` / ``down_proj``, round_up(wf * D, 32)
    per-layer parameters                     layers stacked on axis 0 under ``layer_stack/decoder_layer_0``
    rms_norm -> unembedding                  ``final_layer_norm`` -> ``unembeddings`` * sqrt(512 / D) * 2

Names follow production (``pre_attn_norm``, ``multi_head_attention/qkv``, ``q_norm``, ``out``,
``up_proj``, ``down_proj``, ``final_layer_norm``, ``unembeddings``); ``load_xrex_params`` reads the
exact tree the original's ``hk.transform(...).init`` returns. Linear weights are ``[in, out]`` as in
Haiku, so ``x @ w`` is the original line.

Scope: the trunk and its output head, from the trunk's input embeddings (after production's
"project-then-sum" feature prep and its ``* sqrt(D)`` input scale) to the 64 action logits. The
continuous head's weights (``continuous_unembeddings``) are loaded and kept; its activations (dwell
gallery, sigmoid * 30) are not modelled.

Numerics. ``forward(..., numerics="fp32")`` (the default) computes at full precision: everything in
float32, or in float64 when the embeddings are float64 (``model.double()``: what the NumPy reference
checks, nothing rounded to float32 on the way). ``numerics="bf16"`` reproduces production's
(docs/originals.md §4): parameters read as bfloat16 (norm scales included), a bfloat16 residual stream,
RMSNorm, RoPE and softmax in float32 and cast back, attention probabilities cast to bfloat16 before
``probs @ v``, bfloat16 logits times the output scale. Logits come back as float32 (float64 for a
float64 forward).

Attention runs through ``models.attention.attend`` (the same backends and ``record=True`` traces as
grok.py's trunk): production's attention is grok.py's function with multiplier sqrt(128)/key_size, the
chosen cap, and the ``recsys-bidirectional`` mask with padded keys hidden — or, with
``attention_padding="serving-kernel"``, attended as production's serving kernels attend them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .attention import CAP_METHODS, AttentionOutput, attend, upcast
from .grok import (LayerTrace, Linear, RecordedAttention, RotaryEmbedding, TransformerOutput, _positive_int,
                   init_params)
from .grok import RMSNorm as GrokRMSNorm
from .haiku_tree import checked_arrays, flatten
from .masks import AttentionMask, key_padding

NUMERICS = ("fp32", "bf16")
# how attention treats padded keys (XrexRanker.attention_mask): hidden, or attended as production's serving
# kernels attend them (they take only the bound (0, P+L, P+L, T); the FA3 path passes no segment ids)
ATTENTION_PADDING = ("masked", "serving-kernel")
PARAMS_FIELD = "params"


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def ffn_size(emb_size: int, widening_factor: float, base_size: int = 32) -> int:
    """Production's non-gated MLP width: int(widening_factor * D) rounded up to a multiple of 32."""
    return round_up(int(widening_factor * emb_size), base_size)


@dataclass(frozen=True)
class XrexConfig:
    emb_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    key_size: int
    widening_factor: float = 2.0        # FFN hidden = round_up(int(widening_factor * emb_size), 32)
    num_user_prefix_tokens: int = 2     # P: user token + user-features token
    history_seq_len: int = 1022         # L; candidates start at P + L
    qk_norm: bool = True
    attn_logit_cap: float = -1.0        # <= 0: no cap
    attn_logit_cap_method: str = "soft_sign"   # or "tanh" ("none" also turns it off)
    primer_norm: bool = False
    rope_base_exponent: int = 10000
    output_vocab_size: int = 64
    num_continuous_actions: int = 8
    attention_padding: str = "masked"   # padded keys: "masked" (hidden) | "serving-kernel" (attended, as served)

    def __post_init__(self):
        for name in ("emb_size", "num_layers", "num_q_heads", "num_kv_heads", "key_size", "output_vocab_size",
                     "num_continuous_actions"):
            _positive_int(name, getattr(self, name))
        for name in ("num_user_prefix_tokens", "history_seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: got {v!r}; allowed: an integer >= 0")
        if self.key_size % 2:
            raise ValueError(f"key_size: got {self.key_size}; allowed: an even number (RoPE rotates halves)")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads: got {self.num_q_heads} with num_kv_heads {self.num_kv_heads}; "
                             f"allowed: a multiple of num_kv_heads (qkv interleaves q heads per KV group)")
        if self.attn_logit_cap_method not in CAP_METHODS:
            raise ValueError(f"attn_logit_cap_method: got {self.attn_logit_cap_method!r}; "
                             f"allowed: {', '.join(CAP_METHODS)}")
        for name in ("widening_factor", "attn_logit_cap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name}: got {v!r}; allowed: a finite number")
        if self.widening_factor <= 0:
            raise ValueError(f"widening_factor: got {self.widening_factor}; allowed: greater than 0")
        if isinstance(self.rope_base_exponent, bool) or not isinstance(self.rope_base_exponent, int) \
                or self.rope_base_exponent < 2:
            raise ValueError(f"rope_base_exponent: got {self.rope_base_exponent!r}; allowed: an integer >= 2")
        if self.attention_padding not in ATTENTION_PADDING:
            raise ValueError(f"attention_padding: got {self.attention_padding!r}; allowed: {', '.join(ATTENTION_PADDING)}")
        for name in ("qk_norm", "primer_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: got {getattr(self, name)!r}; allowed: True or False")

    @property
    def ffn_hidden(self) -> int:
        return ffn_size(self.emb_size, self.widening_factor)

    @property
    def candidate_start_offset(self) -> int:
        """P + L: where candidates begin, and every candidate's RoPE position."""
        return self.num_user_prefix_tokens + self.history_seq_len

    @property
    def attn_scale(self) -> float:
        """scaling.py attn_output_scale: sqrt(128) / key_size (= 1/sqrt(128) at key_size 128)."""
        return math.sqrt(128) / self.key_size

    @property
    def output_scale(self) -> float:
        """scaling.py output_scale: sqrt(512 / D) * 2 (0.894 at D = 2560, 2.0 at 512)."""
        return math.sqrt(512 / self.emb_size) * 2.0

    def make(self) -> "XrexRanker":
        return XrexRanker(self)

    def replace(self, **changes) -> "XrexConfig":
        return replace(self, **changes)


# --- building blocks ------------------------------------------------------------------------

class RMSNorm(GrokRMSNorm):
    """normalization.py RMSNorm: fp32 (``upcast``) ``x * rsqrt(mean x^2 + eps) * scale``, cast back, scale init 1.
    Unlike grok.py's port, the scale is read in the activation dtype first (production reads every
    parameter as bf16, norm scales included); in fp32 the two are the same."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__(dim, eps)
        nn.init.ones_(self.scale)

    def forward(self, x):
        xf = upcast(x)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (upcast(self.scale.to(x.dtype)) * normed).to(x.dtype)


def right_anchored_positions(padding_mask: torch.Tensor, num_user_prefix_tokens: int,
                             history_seq_len: int) -> torch.Tensor:
    """recsys_model.py right_anchored_rope_positions: [B, T] bool -> [B, T] integer positions.

    prefix token i -> i; history slot k -> P + L - n_valid + k (n_valid: valid history slots of the row,
    so with events left-aligned the last one sits at P + L - 1); every candidate -> P + L; padding -> 0.
    A candidate's rotation is therefore the same in every slot and every batch row. The formula counts
    slots, not events: it assumes serving's left-aligned history (seqpack builds its own positions)."""
    P, L = num_user_prefix_tokens, history_seq_len
    B, T = padding_mask.shape
    idx = torch.arange(T, device=padding_mask.device)[None, :].expand(B, T)        # [B, T]
    n_valid = padding_mask[:, P:P + L].sum(1, keepdim=True)                         # [B, 1]
    in_history = (idx >= P) & (idx < P + L)
    positions = torch.where(in_history, P + L - n_valid + (idx - P), idx)
    positions = torch.where(idx >= P + L, torch.full_like(idx, P + L), positions)
    return torch.where(padding_mask, positions, torch.zeros_like(idx))


class MultiHeadAttention(nn.Module):
    """layers.py MultiHeadAttention with qkv_merge, qk_norm and 1-D RoPE."""

    def __init__(self, config: XrexConfig):
        super().__init__()
        c = config
        self.config = c
        K = c.key_size
        self.qkv = Linear(c.emb_size, (c.num_q_heads + 2 * c.num_kv_heads) * K)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.num_q_heads * K)
            self.k_norm = RMSNorm(c.num_kv_heads * K)
        self.out = Linear(c.num_q_heads * K, c.emb_size)
        self.rotary = RotaryEmbedding(K, float(c.rope_base_exponent))
        # the attention function this layer calls, attend's signature: the hook models.bugzoo plants into
        self.attention_fn: Callable[..., AttentionOutput] = attend

    def split_qkv(self, x):
        """x [B, T, D] -> q [B, T, Hq, K], k, v [B, T, Hkv, K].

        The merged weight's columns are grouped by KV head: group g holds its r = Hq / Hkv query
        heads (g*r .. g*r + r-1), then k_g, then v_g — not [all q | all k | all v]."""
        c = self.config
        B, T, _ = x.shape
        r = c.num_q_heads // c.num_kv_heads
        qkv = self.qkv(x).view(B, T, c.num_kv_heads, r + 2, c.key_size)            # [B, T, Hkv, r+2, K]
        q = qkv[:, :, :, :r].reshape(B, T, c.num_q_heads, c.key_size)               # [B, T, Hq, K]
        return q, qkv[:, :, :, r], qkv[:, :, :, r + 1]                              # k, v [B, T, Hkv, K]

    def forward(self, x, mask: AttentionMask, positions, backend="naive", need_weights=False):
        c = self.config
        B, T, _ = x.shape
        q, k, v = self.split_qkv(x)
        if c.qk_norm:   # one norm over every head's features at once, before RoPE
            q = self.q_norm(q.reshape(B, T, -1)).view_as(q)
            k = self.k_norm(k.reshape(B, T, -1)).view_as(k)
        q, k = self.rotary(q, positions), self.rotary(k, positions)
        # softmax(cap(q.k * sqrt(128)/key_size) | mask) v through the named backend
        a = self.attention_fn(q, k, v, mask, multiplier=c.attn_scale, cap=c.attn_logit_cap,
                              cap_method=c.attn_logit_cap_method, backend=backend, need_weights=need_weights)
        if need_weights:                # recording: keep what the weights were computed from
            a = RecordedAttention(**vars(a), q=q, k=k, v=v)
        return self.out(a.out.reshape(B, T, c.num_q_heads * c.key_size)), a


class DenseBlock(nn.Module):
    """transformer.py DenseBlock with gated_mlp=False: down_proj(gelu_tanh(up_proj(x)))."""

    def __init__(self, config: XrexConfig):
        super().__init__()
        self.up_proj = Linear(config.emb_size, config.ffn_hidden)
        self.down_proj = Linear(config.ffn_hidden, config.emb_size)

    def forward(self, x):
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class DecoderLayer(nn.Module):
    """Pre-norm residual block; post-norms on both sub-layers only when primer_norm."""

    def __init__(self, config: XrexConfig):
        super().__init__()
        D = config.emb_size
        self.primer_norm = config.primer_norm
        self.pre_attn_norm = RMSNorm(D)
        self.multi_head_attention = MultiHeadAttention(config)
        self.pre_ffn_norm = RMSNorm(D)
        self.dense_block = DenseBlock(config)
        if config.primer_norm:
            self.post_attn_norm = RMSNorm(D)
            self.post_ffn_norm = RMSNorm(D)

    def forward(self, h, mask, positions, backend="naive", record=False):
        attn, a = self.multi_head_attention(self.pre_attn_norm(h), mask, positions, backend, record)
        h = h + (self.post_attn_norm(attn) if self.primer_norm else attn)
        after_attention = h
        ffn = self.dense_block(self.pre_ffn_norm(h))
        h = h + (self.post_ffn_norm(ffn) if self.primer_norm else ffn)
        return h, (LayerTrace(a.probs, a.logits, after_attention, h, a.q, a.k, a.v, a.out) if record else None)


class Transformer(nn.Module):
    """The stack of decoder layers; no final norm here (the ranker applies final_layer_norm)."""

    def __init__(self, config: XrexConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))

    def forward(self, h, mask, positions, backend="naive", record=False):
        traces = [] if record else None
        for layer in self.layers:
            h, trace = layer(h, mask, positions, backend, record)
            if record:
                traces.append(trace)
        return h, traces


@dataclass
class XrexOutput:
    # float32 (float64 for a float64 forward):
    trunk: torch.Tensor     # [B, T, D]: transformer output before final_layer_norm
    logits: torch.Tensor    # [B, T - (P + L), V]: final_layer_norm(trunk)[:, P+L:] @ unembeddings * sqrt(512/D) * 2
    layers: Optional[list[LayerTrace]] = None   # per-layer attention and residual stream when record=True


class XrexRanker(nn.Module):
    """recsys_model.py RecsysAggregatedModel from the trunk's input on: trunk -> final_layer_norm ->
    candidate rows -> unembeddings * output_scale. Padded keys are hidden by default
    (config.attention_padding "masked": nothing in padding reaches a valid output, the property the probes
    check); "serving-kernel" runs production's serving mask, the bound (0, P+L, P+L, T) with padding unmasked."""

    def __init__(self, config: XrexConfig):
        super().__init__()
        if not isinstance(config, XrexConfig):
            raise ValueError(f"config: got {type(config).__name__}; allowed: XrexConfig")
        c = config
        self.config = c
        self.transformer = Transformer(c)
        self.final_layer_norm = RMSNorm(c.emb_size)
        self.unembeddings = nn.Parameter(torch.zeros(c.emb_size, c.output_vocab_size))
        self.continuous_unembeddings = nn.Parameter(torch.zeros(c.emb_size, c.num_continuous_actions))

    def attention_mask(self, padding_mask: Optional[torch.Tensor], mask_kind: Optional[str] = None,
                       candidate_start_offset: Optional[int] = None, seq_len: Optional[int] = None) -> AttentionMask:
        """Key j is visible to query i when j is a prefix / history token, or j == i. Padded keys per
        ``config.attention_padding``: "masked" (the default) hides them, so nothing in padding reaches a
        valid output; "serving-kernel" does as production's ranker kernels do, which take only the bound
        (0, P+L, P+L, T) and never mask a padded history slot. A padding mask with nothing padded is
        dropped (models.masks.key_padding). `mask_kind`: another models.masks kind instead, for probes
        that compare production's mask with one that leaks."""
        T = padding_mask.shape[1] if padding_mask is not None else seq_len
        valid = key_padding(padding_mask) if self.config.attention_padding == "masked" else None
        return AttentionMask(mask_kind or "recsys-bidirectional", T,
                             self.config.candidate_start_offset if candidate_start_offset is None
                             else candidate_start_offset, valid)

    def forward(self, embeddings: torch.Tensor, padding_mask: torch.Tensor, *, numerics: str = "fp32",
                backend: str = "naive", record: bool = False, mask_kind: Optional[str] = None,
                history_seq_len: Optional[int] = None) -> XrexOutput:
        """embeddings float [B, T, D] (the trunk's input), padding_mask bool [B, T] (True = valid) or None when
        nothing is padded, T >= P + L. Logits come back as float32 (float64 for a float64 forward)."""
        c = self.config if history_seq_len is None else self.config.replace(history_seq_len=history_seq_len)
        if numerics not in NUMERICS:
            raise ValueError(f"numerics: got {numerics!r}; allowed: {', '.join(NUMERICS)}")
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 3 or embeddings.shape[-1] != c.emb_size:
            shape = tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
            raise ValueError(f"embeddings: got {shape}; allowed: a tensor [B, T, {c.emb_size}] (emb_size)")
        B, T, _ = embeddings.shape
        if T < c.candidate_start_offset:
            raise ValueError(f"embeddings: got T = {T}; allowed: T >= {c.candidate_start_offset} "
                             f"(num_user_prefix_tokens + history_seq_len)")
        if padding_mask is not None and (not isinstance(padding_mask, torch.Tensor)
                                         or tuple(padding_mask.shape) != (B, T)):
            shape = tuple(padding_mask.shape) if isinstance(padding_mask, torch.Tensor) else type(padding_mask).__name__
            raise ValueError(f"padding_mask: got {shape}; allowed: a bool tensor [{B}, {T}] (the embeddings' "
                             f"batch and sequence length)")
        padding_mask = key_padding(padding_mask)           # read on the host when it is there; None: unpadded
        padding_mask = (torch.ones(B, T, dtype=torch.bool, device=embeddings.device) if padding_mask is None
                        else padding_mask.to(embeddings.device))
        # fp32 is full precision: float32, or float64 for float64 embeddings (bf16 / fp16 ones read as float32)
        h = embeddings.to(torch.bfloat16) if numerics == "bf16" else upcast(embeddings)
        dtype = h.dtype
        positions = right_anchored_positions(padding_mask, c.num_user_prefix_tokens, c.history_seq_len)
        mask = self.attention_mask(padding_mask, mask_kind, c.candidate_start_offset)
        h, traces = self.transformer(h, mask, positions, backend, record)                # [B, T, D]
        candidates = self.final_layer_norm(h)[:, c.candidate_start_offset:]           # [B, C, D]
        logits = (candidates @ self.unembeddings.to(dtype)) * c.output_scale           # [B, C, V]
        return XrexOutput(upcast(h), upcast(logits), traces)


class XrexTrunk(nn.Module):
    """The ranker as a trunk, ``(embeddings, mask, candidate_start_offset) -> TransformerOutput`` like
    grok.py's ``Transformer``: the interface models.probes and models.bugzoo take. The offset defaults to
    the config's P + L; another one keeps P and takes the history as what lies between (probes run on
    capped layouts)."""

    def __init__(self, config: XrexConfig):
        super().__init__()
        self.config = config
        self.ranker = XrexRanker(config)

    def forward(self, embeddings, mask, candidate_start_offset: Optional[int] = None, *, backend: str = "naive",
                record: bool = False, numerics: str = "fp32", mask_kind: Optional[str] = None) -> TransformerOutput:
        P = self.config.num_user_prefix_tokens
        if candidate_start_offset is not None and (isinstance(candidate_start_offset, bool)
                                                   or not isinstance(candidate_start_offset, int)
                                                   or candidate_start_offset < P):
            raise ValueError(f"candidate_start_offset: got {candidate_start_offset!r}; allowed: an integer >= {P} "
                             f"(num_user_prefix_tokens; the history is what lies between)")
        L = None if candidate_start_offset is None else candidate_start_offset - P
        out = self.ranker(embeddings, mask, numerics=numerics, backend=backend, record=record, mask_kind=mask_kind,
                          history_seq_len=L)
        return TransformerOutput(out.trunk, out.layers)


# --- a production-shaped ranker around the trunk: hashes in, 64 action logits out ---------------------

# production's heads are recsys.proto ActionName i (docs/originals.md §5); the ones it names, the rest by index
ACTION_NAMES = tuple({1: "FAV", 4: "REPLY", 5: "QUOTE", 6: "RETWEET", 16: "REPORT", 21: "FOLLOW", 29: "CLICK",
                      36: "BOOKMARK", 37: "SHARE", 39: "OPEN_LINK", 59: "POST_UNEXPLORED"}.get(i, f"action_{i}")
                     for i in range(64))


class ProjectThenSum(nn.Module):
    """A simplified ``recsys_feature_prep`` "project-then-sum": every hash looks its row up in one shared
    table [V, W], each hash slot has its own [W, D] projection, a token is the sum of its projections
    (history adds its actions @ [A, D] and a product-surface row), times sqrt(D). Production's other
    features (post age, time zone, hour, SIDs, dwell, the user-features token's country, language,
    location ...) are left out: the prefix tokens here are P sums of the user's hash projections."""

    def __init__(self, config: XrexConfig, *, hash_vocab_size: int = 1024, table_width: int = 128,
                 num_hashes: int = 2, num_history_actions: int = 19, num_product_surfaces: int = 16):
        super().__init__()
        c, D, W = config, config.emb_size, table_width
        self.config = c
        self.table = nn.Embedding(hash_vocab_size, W)
        self.user_proj = nn.ModuleList(Linear(W, D) for _ in range(c.num_user_prefix_tokens * num_hashes))
        self.post_proj = nn.ModuleList(Linear(W, D) for _ in range(2 * num_hashes))     # history, candidate
        self.author_proj = nn.ModuleList(Linear(W, D) for _ in range(2 * num_hashes))
        self.hist_action_emb = nn.Parameter(torch.zeros(num_history_actions, D))
        self.product_surface_emb = nn.Embedding(num_product_surfaces, D)

    def _sum(self, hashes, projections):
        """hashes [B, N, H] -> [B, N, D]: slot h's table row through its own projection, summed."""
        return sum(proj(self.table(hashes[..., h])) for h, proj in enumerate(projections))

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A models.recsys.RecsysBatch -> (trunk input [B, P + L + C, D], valid [B, T] bool)."""
        c, H = self.config, len(self.post_proj) // 2
        P = c.num_user_prefix_tokens
        B = batch.user_hashes.shape[0]
        user = batch.user_hashes[:, None, :H]                                               # [B, 1, H]
        prefix = torch.cat([self._sum(user, self.user_proj[p * H:(p + 1) * H]) for p in range(P)], 1)  # [B, P, D]
        history = (self._sum(batch.history_post_hashes, self.post_proj[:H])
                   + self._sum(batch.history_author_hashes, self.author_proj[:H])
                   + batch.history_actions.to(self.hist_action_emb.dtype) @ self.hist_action_emb
                   + self.product_surface_emb(batch.history_product_surface))                # [B, L, D]
        candidates = (self._sum(batch.candidate_post_hashes, self.post_proj[H:])
                      + self._sum(batch.candidate_author_hashes, self.author_proj[H:])
                      + self.product_surface_emb(batch.candidate_product_surface))           # [B, C, D]
        emb = torch.cat([prefix, history, candidates], 1) * math.sqrt(c.emb_size)
        valid = torch.cat([(batch.user_hashes[:, :1] != 0).expand(B, P), batch.history_post_hashes[..., 0] != 0,
                           batch.candidate_post_hashes[..., 0] != 0], 1)
        return emb, valid


def project_then_sum_params(config: XrexConfig, *, hash_vocab_size: int = 1024, table_width: int = 128,
                            num_hashes: int = 2, num_history_actions: int = 19, num_product_surfaces: int = 16) -> int:
    """ProjectThenSum(config, ...)'s parameter count, from its shapes (no module built): the shared table,
    one [W, D] projection per user hash of each prefix token and per post / author hash of history and
    candidates, the history actions and the product surfaces."""
    D, W, P = config.emb_size, table_width, config.num_user_prefix_tokens
    projections = P * num_hashes + 2 * num_hashes + 2 * num_hashes
    return hash_vocab_size * W + projections * W * D + (num_history_actions + num_product_surfaces) * D


class XrexRecsys(nn.Module):
    """ProjectThenSum -> XrexRanker: a production-shaped ranker on the explorer's batches, with the
    interface of models.recsys.RecsysModel (forward(batch), score_embeddings, .transformer) so the
    same probes and views run on both families."""

    def __init__(self, config: XrexConfig, **input_options):
        super().__init__()
        self.xrex = config
        self.inputs = ProjectThenSum(config, **input_options)
        self.trunk = XrexTrunk(config)

    @property
    def ranker(self) -> XrexRanker:
        return self.trunk.ranker

    @property
    def transformer(self) -> XrexTrunk:
        """The trunk as models.probes and models.bugzoo take it."""
        return self.trunk

    @property
    def num_actions(self) -> int:
        return self.xrex.output_vocab_size

    @property
    def action_names(self) -> tuple[str, ...]:
        V = self.xrex.output_vocab_size
        return ACTION_NAMES[:V] + tuple(f"action_{i}" for i in range(len(ACTION_NAMES), V))

    def score_embeddings(self, embeddings, valid, candidate_start_offset=None, *, record: bool = False,
                         backend: str = "naive", mask_kind: Optional[str] = None, numerics: str = "fp32"):
        from .recsys import RecsysOutput
        off = self.xrex.candidate_start_offset if candidate_start_offset is None else candidate_start_offset
        out = self.ranker(embeddings, valid, record=record, backend=backend, mask_kind=mask_kind, numerics=numerics,
                          history_seq_len=off - self.xrex.num_user_prefix_tokens)
        return RecsysOutput(out.logits, TransformerOutput(out.trunk, out.layers), embeddings, valid, off)

    def forward(self, batch, **kwargs):
        """The batch's own layout: P from the config, L = the batch's history length."""
        emb, valid = self.inputs(batch)
        P = self.xrex.num_user_prefix_tokens
        return self.score_embeddings(emb, valid, P + batch.history_post_hashes.shape[1], **kwargs)


# --- parameters: the original's init tree ------------------------------------------------------

STACK = "transformer/layer_stack/decoder_layer_0"
HEAD = "recsys_aggregated_model"


def param_spec(config: XrexConfig) -> dict[str, tuple[str, tuple, str]]:
    """production key -> (torch name with {i} for the layer, expected shape, what the shape is).
    Layer parameters are stacked: their leading axis is num_layers."""
    c = config
    n, D, K, F_ = c.num_layers, c.emb_size, c.key_size, c.ffn_hidden
    q, kv = c.num_q_heads * K, c.num_kv_heads * K
    mha, layer = f"{STACK}/multi_head_attention", "transformer.layers.{i}"
    spec = {
        f"{STACK}/pre_attn_norm/scale": (f"{layer}.pre_attn_norm.scale", (n, D), "[num_layers, emb_size]"),
        f"{mha}/qkv/w": (f"{layer}.multi_head_attention.qkv.w", (n, D, q + 2 * kv),
                         "[num_layers, emb_size, (num_q_heads + 2*num_kv_heads)*key_size]"),
        f"{mha}/out/w": (f"{layer}.multi_head_attention.out.w", (n, q, D),
                         "[num_layers, num_q_heads*key_size, emb_size]"),
        f"{STACK}/pre_ffn_norm/scale": (f"{layer}.pre_ffn_norm.scale", (n, D), "[num_layers, emb_size]"),
        f"{STACK}/up_proj/w": (f"{layer}.dense_block.up_proj.w", (n, D, F_), "[num_layers, emb_size, ffn_size]"),
        f"{STACK}/down_proj/w": (f"{layer}.dense_block.down_proj.w", (n, F_, D), "[num_layers, ffn_size, emb_size]"),
        f"{HEAD}/final_layer_norm/scale": ("final_layer_norm.scale", (D,), "[emb_size]"),
        f"{HEAD}/unembeddings": ("unembeddings", (D, c.output_vocab_size), "[emb_size, output_vocab_size]"),
        f"{HEAD}/continuous_unembeddings": ("continuous_unembeddings", (D, c.num_continuous_actions),
                                            "[emb_size, num_continuous_actions]"),
    }
    if c.qk_norm:
        spec[f"{mha}/q_norm/scale"] = (f"{layer}.multi_head_attention.q_norm.scale", (n, q),
                                       "[num_layers, num_q_heads*key_size] (qk_norm)")
        spec[f"{mha}/k_norm/scale"] = (f"{layer}.multi_head_attention.k_norm.scale", (n, kv),
                                       "[num_layers, num_kv_heads*key_size] (qk_norm)")
    if c.primer_norm:
        for norm in ("post_attn_norm", "post_ffn_norm"):
            spec[f"{STACK}/{norm}/scale"] = (f"{layer}.{norm}.scale", (n, D), "[num_layers, emb_size] (primer_norm)")
    return spec


def load_xrex_params(model: XrexRanker, params: Mapping[str, Mapping[str, np.ndarray]], *,
                     field: str = PARAMS_FIELD) -> XrexRanker:
    """Copy the original's ``{module_path: {param_name: array}}`` init tree into ``model``.

    Every key and shape is checked against the config first; on any problem one ValueError (its message
    starting with `field`) lists all of them by name and the model keeps its weights. Arrays may be numpy,
    jax (bf16 too) or torch; values are checked after the cast to fp32 (finite, |w| <= 1e4), as grok.py's
    loader checks them. Weight files: models.weights.load_weights / save_weights."""
    if not isinstance(model, XrexRanker):
        raise ValueError(f"model: got {type(model).__name__}; allowed: XrexRanker")
    c = model.config
    spec = param_spec(c)
    arrays = checked_arrays(spec, flatten(params), field,
                            f"emb_size={c.emb_size}, num_layers={c.num_layers}, num_q_heads={c.num_q_heads}, "
                            f"num_kv_heads={c.num_kv_heads}, key_size={c.key_size}, ffn_size={c.ffn_hidden}, "
                            f"qk_norm={c.qk_norm}, primer_norm={c.primer_norm}")
    tensors = dict(model.named_parameters())
    with torch.no_grad():
        for key, arr in arrays.items():
            name = spec[key][0]
            if "{i}" in name:
                for i in range(c.num_layers):
                    p = tensors[name.format(i=i)]
                    p.copy_(torch.from_numpy(arr[i]).to(p.dtype))
            else:
                p = tensors[name]
                p.copy_(torch.from_numpy(arr).to(p.dtype))
    return model


def xrex_params(model: XrexRanker) -> dict[str, dict[str, np.ndarray]]:
    """The original's init tree for ``model`` (stacked layers), as fp32 numpy copies: the inverse of
    ``load_xrex_params``."""
    tensors = dict(model.named_parameters())
    nested: dict[str, dict] = {}
    for key, (name, _, _) in param_spec(model.config).items():
        if "{i}" in name:
            arr = np.stack([tensors[name.format(i=i)].detach().float().numpy()
                            for i in range(model.config.num_layers)])
        else:
            arr = tensors[name].detach().float().numpy().copy()
        module, _, leaf = key.rpartition("/")
        nested.setdefault(module, {})[leaf] = arr
    return nested


def init_xrex(model: XrexRanker, seed: int = 0) -> XrexRanker:
    """Seeded random weights (fan-average truncated normal, as grok.py's ``random`` init), norm scales 1."""
    return init_params(model, "random", seed)
