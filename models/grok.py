"""PyTorch port of X's phoenix ``grok.py`` (JAX/Haiku), same names, same numbers.

Read it beside the original: ``ffn_size``, ``make_recsys_attn_mask``, ``TransformerConfig``,
``RMSNorm``, ``RotaryEmbedding``, ``MultiHeadAttention``, ``DenseBlock``, ``DecoderLayer``,
``Transformer``. Linear weights are stored ``[in, out]`` as in Haiku, so ``x @ w`` is the
original line and loading Haiku params is a copy (models.weights).

Added for the explorer, each defaulting to grok.py's behaviour: the logit-cap method, RoPE
position mode, prefix mode (causal as grok.py, bidirectional as production phoenix),
backend selection and instrumentation (``record=True`` returns what each layer computed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .attention import CAP_METHODS, BACKENDS, AttentionOutput, attend, upcast
from .masks import PREFIX_MODES, AttentionMask, key_padding, make_recsys_attn_mask, model_mask_kind  # noqa: F401  (grok.py's name)

ROPE_MODES = ("sequential", "shared", "none")
INIT_MODES = ("zeros", "random")


def ffn_size(emb_size: int, widening_factor: float, multiple_of: int = 8) -> int:
    """grok.py: r = int(w * D) * 2 // 3, rounded up to a multiple of `multiple_of`."""
    r = int(widening_factor * emb_size) * 2 // 3
    return r + (multiple_of - r) % multiple_of


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: got {value!r}; allowed: a positive integer")


@dataclass(frozen=True)
class TransformerConfig:
    emb_size: int
    key_size: int
    num_q_heads: int
    num_kv_heads: int
    num_layers: int
    widening_factor: float = 4.0
    attn_output_multiplier: float = 1.0
    # explorer knobs; defaults are grok.py
    logit_cap: float = 30.0
    cap_method: str = "tanh"            # tanh | soft_sign | none  (cap <= 0 also means off)
    rope_base: float = 10000.0
    rope_mode: str = "sequential"       # sequential | shared | none
    rope_offset: int = 0
    prefix: str = "causal"              # causal (grok.py) | bidirectional (production phoenix)
    norm_eps: float = 1e-5
    ffn_multiple_of: int = 8

    def __post_init__(self):
        for name in ("emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers", "ffn_multiple_of"):
            _positive_int(name, getattr(self, name))
        if self.key_size % 2:
            raise ValueError(f"key_size: got {self.key_size}; allowed: an even number (RoPE rotates halves)")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads: got {self.num_q_heads} with num_kv_heads {self.num_kv_heads}; "
                             f"allowed: a multiple of num_kv_heads (GQA groups query heads per KV head)")
        if self.cap_method not in CAP_METHODS:
            raise ValueError(f"cap_method: got {self.cap_method!r}; allowed: {', '.join(CAP_METHODS)}")
        if self.rope_mode not in ROPE_MODES:
            raise ValueError(f"rope_mode: got {self.rope_mode!r}; allowed: {', '.join(ROPE_MODES)}")
        if self.prefix not in PREFIX_MODES:
            raise ValueError(f"prefix: got {self.prefix!r}; allowed: {', '.join(PREFIX_MODES)}")
        for name in ("widening_factor", "attn_output_multiplier", "logit_cap", "rope_base", "norm_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name}: got {v!r}; allowed: a finite number")
        if self.widening_factor <= 0 or self.rope_base <= 1 or self.norm_eps <= 0:
            bad = [n for n, ok in (("widening_factor", self.widening_factor > 0),
                                   ("rope_base", self.rope_base > 1), ("norm_eps", self.norm_eps > 0)) if not ok][0]
            raise ValueError(f"{bad}: got {getattr(self, bad)}; allowed: "
                             + ("greater than 1" if bad == "rope_base" else "greater than 0"))
        if isinstance(self.rope_offset, bool) or not isinstance(self.rope_offset, int):
            raise ValueError(f"rope_offset: got {self.rope_offset!r}; allowed: an integer")

    @property
    def ffn_hidden(self) -> int:
        return ffn_size(self.emb_size, self.widening_factor, self.ffn_multiple_of)

    def make(self) -> "Transformer":
        return Transformer(self)

    def replace(self, **changes) -> "TransformerConfig":
        return replace(self, **changes)


class Linear(nn.Module):
    """hk.Linear without bias: ``w`` is [in, out]."""

    def __init__(self, in_size: int, out_size: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(in_size, out_size))

    def forward(self, x):
        return x @ self.w.to(x.dtype)


class RMSNorm(nn.Module):
    """Computed in fp32 (float64 stays float64: ``upcast``), ``x * rsqrt(mean(x^2) + eps) * scale``, cast
    back; no bias."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = upcast(x)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (upcast(self.scale) * normed).to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE over halves (not interleaved pairs). positions t: [B, T] whole numbers (integer or float); the
    phase is computed in x's compute dtype (``upcast``: float32, float64 stays float64). ``interleaved``
    rotates pairs (x0, x1), (x2, x3), ... instead (GPT-J's layout; the bug zoo's "rope-interleaved")."""

    def __init__(self, dim: int, base_exponent: float = 10000.0, interleaved: bool = False):
        super().__init__()
        self.dim = dim
        self.base_exponent = base_exponent
        self.interleaved = interleaved
        # per (device, dtype): built there in that dtype, never copied from the host nor rounded from another
        self._inv_freq: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def inv_freq(self, device=None, dtype=torch.float32) -> torch.Tensor:
        """[K/2] frequencies in `dtype` on `device` (default CPU), built there once."""
        key = (str(torch.device("cpu" if device is None else device)), dtype)
        if key not in self._inv_freq:
            exponents = torch.arange(0, self.dim, 2, dtype=dtype, device=key[0])
            self._inv_freq[key] = 1.0 / (self.base_exponent ** (exponents / self.dim))    # [K/2]
        return self._inv_freq[key]

    def forward(self, x, t):
        # x: [B, T, H, K]; t: [B, T] whole numbers, exact in the compute dtype (float32 or float64)
        xf = upcast(x)
        phase = torch.einsum("bi,j->bij", t.to(xf.dtype), self.inv_freq(x.device, xf.dtype))
        phase = phase[:, :, None, :]                                                  # [B, T, 1, K/2]
        if self.interleaved:
            cos, sin = torch.cos(phase), torch.sin(phase)
            even, odd = xf[..., 0::2], xf[..., 1::2]                                  # [B, T, H, K/2]
            return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2).to(x.dtype)
        phase = torch.cat((phase, phase), dim=-1)                                     # [B, T, 1, K]
        return (xf * torch.cos(phase) + rotate_half(xf) * torch.sin(phase)).to(x.dtype)


def rope_positions(config: TransformerConfig, batch: int, seq_len: int,
                   candidate_start_offset: Optional[int], device=None) -> Optional[torch.Tensor]:
    """[B, T] integer positions for the configured mode, or None when RoPE is off (RoPE reads them in its
    compute dtype: float32, or float64 for a float64 forward)."""
    if config.rope_mode == "none":
        return None
    t = torch.arange(seq_len, device=device)
    if config.rope_mode == "shared" and candidate_start_offset is not None:
        # every candidate sits at the first candidate slot: its slot no longer changes its rotation
        t = torch.where(t >= candidate_start_offset, torch.full_like(t, candidate_start_offset), t)
    return (t + config.rope_offset).expand(batch, seq_len)


@dataclass
class LayerTrace:
    """What one decoder layer computed, recorded in the same forward that produced the output."""
    probs: torch.Tensor            # [B, Hq, T, T] attention weights
    logits: torch.Tensor           # [B, Hq, T, T] capped logits, before masking
    after_attention: torch.Tensor  # [B, T, D] residual stream after the attention sub-layer
    after_ffn: torch.Tensor        # [B, T, D] residual stream after the dense sub-layer
    # the attention's own inputs and output, for stepping through one row (None when not recorded)
    q: Optional[torch.Tensor] = None          # [B, T, Hq, K] queries after RoPE
    k: Optional[torch.Tensor] = None          # [B, T, Hkv, K] keys after RoPE
    v: Optional[torch.Tensor] = None          # [B, T, Hkv, K] values
    heads_out: Optional[torch.Tensor] = None  # [B, T, Hq, K] weighted sums of V, before the output projection


@dataclass
class RecordedAttention(AttentionOutput):
    """An attention result with the q, k (after RoPE) and v it was computed from."""
    q: Optional[torch.Tensor] = None
    k: Optional[torch.Tensor] = None
    v: Optional[torch.Tensor] = None


@dataclass
class TransformerOutput:
    embeddings: torch.Tensor                       # [B, T, D]
    layers: Optional[list[LayerTrace]] = None      # filled when record=True


class MultiHeadAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.config = c
        self.query = Linear(c.emb_size, c.num_q_heads * c.key_size)
        self.key = Linear(c.emb_size, c.num_kv_heads * c.key_size)
        self.value = Linear(c.emb_size, c.num_kv_heads * c.key_size)
        self.linear = Linear(c.num_q_heads * c.key_size, c.emb_size)
        self.rotary = RotaryEmbedding(c.key_size, c.rope_base)
        # the attention function this layer calls, attend's signature: the hook models.bugzoo plants into
        self.attention_fn: Callable[..., AttentionOutput] = attend

    def forward(self, x, mask: AttentionMask, positions, backend="naive", need_weights=False):
        c = self.config
        B, T, _ = x.shape
        q = self.query(x).view(B, T, c.num_q_heads, c.key_size)      # [B, T, Hq, K]
        k = self.key(x).view(B, T, c.num_kv_heads, c.key_size)       # [B, T, Hkv, K]
        v = self.value(x).view(B, T, c.num_kv_heads, c.key_size)     # [B, T, Hkv, K]
        if positions is not None:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        a = self.attention_fn(q, k, v, mask, multiplier=c.attn_output_multiplier, cap=c.logit_cap,
                              cap_method=c.cap_method, backend=backend, need_weights=need_weights)
        if need_weights:                # recording: keep what the weights were computed from
            a = RecordedAttention(**vars(a), q=q, k=k, v=v)
        return self.linear(a.out.reshape(B, T, c.num_q_heads * c.key_size)), a


class DenseBlock(nn.Module):
    """GeGLU: (gelu_tanh(x @ W) * (x @ V)) @ W_out, names as Haiku gives them."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d, f = config.emb_size, config.ffn_hidden
        self.linear_v = Linear(d, f)
        self.linear = Linear(d, f)
        self.linear_1 = Linear(f, d)
        self.gelu_approximate = "tanh"        # grok.py's; "none" is exact GELU (the bug zoo's exact-gelu)

    def forward(self, x):
        return self.linear_1(F.gelu(self.linear(x), approximate=self.gelu_approximate) * self.linear_v(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        d, eps = config.emb_size, config.norm_eps
        self.rms_norm = RMSNorm(d, eps)       # pre-attention
        self.rms_norm_1 = RMSNorm(d, eps)     # post-attention
        self.rms_norm_2 = RMSNorm(d, eps)     # pre-FFN
        self.rms_norm_3 = RMSNorm(d, eps)     # post-FFN
        self.multi_head_attention = MultiHeadAttention(config)
        self.dense_block = DenseBlock(config)
        # grok.py adds the FFN to the stream after attention; True adds it to the layer's input instead,
        # dropping attention from the stream (notebook 000's mistake, the bug zoo's residual-from-input)
        self.residual_from_input = False

    def forward(self, h, mask, positions, backend="naive", record=False):
        attn, a = self.multi_head_attention(self.rms_norm(h), mask, positions, backend, record)
        after_attention = h + self.rms_norm_1(attn)
        h = (h if self.residual_from_input else after_attention) + \
            self.rms_norm_3(self.dense_block(self.rms_norm_2(after_attention)))
        trace = None
        if record:
            trace = LayerTrace(a.probs, a.logits, after_attention, h, a.q, a.k, a.v, a.out)
        return h, trace


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))

    def attention_mask(self, mask: Optional[torch.Tensor], candidate_start_offset: Optional[int],
                       mask_kind: Optional[str] = None, seq_len: Optional[int] = None) -> AttentionMask:
        """grok.py: recsys mask when an offset is given (its prefix per config.prefix), causal otherwise;
        padding on keys, dropped when nothing is padded (models.masks.key_padding: a host mask is read
        on the host, a device mask is kept unread, None is unpadded), so no forward makes a host sync."""
        if mask_kind is None:
            mask_kind = "causal" if candidate_start_offset is None else model_mask_kind(self.config.prefix)
        T = mask.shape[1] if mask is not None else seq_len
        return AttentionMask(mask_kind, T, candidate_start_offset, key_padding(mask))

    def forward(self, embeddings: torch.Tensor, mask: Optional[torch.Tensor],
                candidate_start_offset: Optional[int] = None, *, backend: str = "naive",
                record: bool = False, mask_kind: Optional[str] = None) -> TransformerOutput:
        """embeddings [B, T, D]; mask [B, T] bool (True = valid), or None when nothing is padded
        -> TransformerOutput([B, T, D])."""
        if embeddings.dim() != 3 or embeddings.shape[-1] != self.config.emb_size:
            raise ValueError(f"embeddings: got shape {tuple(embeddings.shape)}; allowed: "
                             f"[B, T, {self.config.emb_size}] (emb_size)")
        B, T, _ = embeddings.shape
        if mask is not None and tuple(mask.shape) != (B, T):
            raise ValueError(f"mask: got shape {tuple(mask.shape)}; allowed: [{B}, {T}] "
                             f"(the embeddings' batch and sequence length)")
        if candidate_start_offset is not None and not 0 <= candidate_start_offset <= T:
            raise ValueError(f"candidate_start_offset: got {candidate_start_offset}; allowed: [0, {T}]")
        attn_mask = self.attention_mask(mask, candidate_start_offset, mask_kind, T)
        positions = rope_positions(self.config, B, T, candidate_start_offset, embeddings.device)
        h = embeddings
        traces = [] if record else None
        for layer in self.layers:
            h, trace = layer(h, attn_mask, positions, backend, record)
            if record:
                traces.append(trace)
        return TransformerOutput(h, traces)


# --- initialisation ---------------------------------------------------------------------

def init_params(module: nn.Module, mode: str = "random", seed: int = 0) -> nn.Module:
    """zeros: grok.py's own init (every layer the identity, every attention row uniform).
    random: seeded; truncated-normal fan-average variance scaling for Linear, scale 1 for norms
    (Haiku's VarianceScaling(1.0, 'fan_avg', 'truncated_normal'))."""
    if mode not in INIT_MODES:
        raise ValueError(f"init: got {mode!r}; allowed: {', '.join(INIT_MODES)}")
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if mode == "zeros":
                p.zero_()
            elif name.endswith(".scale") or name == "scale":
                p.fill_(1.0)
            else:
                fan_in, fan_out = (p.shape[0], p.shape[1]) if p.dim() == 2 else (p.shape[-1], p.shape[-1])
                std = math.sqrt(1.0 / max(1.0, (fan_in + fan_out) / 2)) / 0.87962566103423978
                truncated_normal_(p, g).mul_(std)
    return module


def truncated_normal_(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`t` filled in place with standard normal draws in [-2, 2], as torch.nn.init.trunc_normal_(t, 0, 1, -2, 2)
    draws them since torch 2.12 (normal draws; while any is out of range, a fresh tensor of draws for those): one
    seed's weights are then the same bits on every torch version, where 2.11's trunc_normal_ (an inverse CDF of
    uniform draws) gave others — a lecturer's link shows the same model on a GPU image's torch and a Space's. Each
    redraw is a whole tensor of draws (that is what moves the generator), but only the values still out of range
    are read and checked: 2.4x faster than torch's (phoenix-prod's 429 M weights: 28 s -> 12 s of one thread)."""
    flat = t.normal_(0.0, 1.0, generator=generator).view(-1)
    out = ((flat < -2.0) | (flat > 2.0)).nonzero().squeeze(1)      # only these change from here on
    fresh = torch.empty_like(flat) if len(out) else None
    while len(out):
        drawn = fresh.normal_(0.0, 1.0, generator=generator)[out]    # a whole tensor drawn, as torch draws
        flat[out] = drawn
        out = out[(drawn < -2.0) | (drawn > 2.0)]
    return t
