"""Every attention system the course notebooks teach, one registry, one instrumentation.

Each variant is a small model over embeddings that returns ``TransformerOutput`` with one
``LayerTrace`` per layer (``probs [B, H, Tq, Tk]``), exactly what the Phoenix trunk records, so the
explorer's heatmaps, probes and timings work on all of them unchanged.

    model = build_variant("gqa", VariantConfig(num_heads=4, num_kv_heads=2), seed=0)
    out = model(**variant_inputs("gqa", VariantConfig()), record=True)
    out.layers[0].probs                                  # [B, H, T, T]

Notebook 002: causal MHA, MQA, GQA (grouped and repeat-interleave), MLA, talking heads, DIN target
attention. Notebook 004: encoder blocks, pre-LN vs post-LN, ReLU / GELU / SwiGLU. Notebook 001:
encoder-decoder cross-attention (non-square maps). All share ``attention_core``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .attention import grouped_attention
from .grok import Linear, LayerTrace, TransformerOutput, ffn_size, init_params

ATTENTION_KINDS = ("mha", "mqa", "gqa", "gqa-repeat", "mla", "talking-heads")
FFN_KINDS = ("relu", "gelu", "swiglu")
NORM_POSITIONS = ("pre", "post")


@dataclass(frozen=True)
class VariantConfig:
    emb_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2          # gqa / gqa-repeat (mha uses num_heads, mqa 1)
    num_layers: int = 2
    latent_dim: int = 16           # mla: the width of the cached K/V latent
    ffn: str = "gelu"              # relu | gelu | swiglu
    widening_factor: float = 4.0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "ffn":
                if v not in FFN_KINDS:
                    raise ValueError(f"ffn: got {v!r}; allowed: {', '.join(FFN_KINDS)}")
            elif f.name == "widening_factor":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ValueError(f"widening_factor: got {v!r}; allowed: a number > 0")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f.name}: got {v!r}; allowed: a positive integer")
        if self.emb_size % self.num_heads:
            raise ValueError(f"num_heads: got {self.num_heads}; allowed: a divisor of emb_size {self.emb_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads: got {self.num_kv_heads}; allowed: a divisor of num_heads "
                             f"{self.num_heads} (each KV head serves a group of query heads)")

    @property
    def key_size(self) -> int:
        return self.emb_size // self.num_heads

    def replace(self, **changes) -> "VariantConfig":
        return replace(self, **changes)


# --- the one attention core ----------------------------------------------------------------

def attention_core(q, k, v, allowed=None, *, scale: float, cap: float = 0.0, cap_method: str = "tanh",
                   mix_logits=None, mix_probs=None):
    """q [B, Tq, Hq, K]; k, v [B, Tk, Hkv, K] (Hkv divides Hq: query head h reads KV head h // G);
    allowed [B|1, 1, Tq, Tk] bool or None. mix_logits / mix_probs [Hq, Hq]: talking heads.
    -> (out [B, Tq, Hq, K], probs [B, Hq, Tq, Tk], logits [B, Hq, Tq, Tk]): models.attention's one core."""
    out, probs, logits, _ = grouped_attention(q, k, v, multiplier=scale, cap=cap, cap_method=cap_method,
                                              allowed=allowed, mix_logits=mix_logits, mix_probs=mix_probs)
    return out, probs, logits


def key_padding(mask: Optional[torch.Tensor], q_len: int, causal: bool, device=None) -> Optional[torch.Tensor]:
    """mask [B, Tk] bool (True = valid key) -> allowed [B|1, 1, Tq, Tk] (causal: Tq == Tk)."""
    allowed = None
    if causal:
        allowed = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()[None, None]
    if mask is not None:
        pad = mask.bool()[:, None, None, :]
        allowed = pad if allowed is None else allowed & pad
    return allowed


class Attention(nn.Module):
    """Self- or cross-attention in every flavour of notebook 002; weights [in, out] as grok.py."""

    def __init__(self, c: VariantConfig, kind: str = "mha"):
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention: got {kind!r}; allowed: {', '.join(ATTENTION_KINDS)}")
        self.kind, self.num_heads, self.key_size = kind, c.num_heads, c.key_size
        self.num_kv_heads = {"mha": c.num_heads, "talking-heads": c.num_heads, "mla": c.num_heads,
                             "mqa": 1}.get(kind, c.num_kv_heads)
        D, H, K = c.emb_size, c.num_heads, c.key_size
        self.query = Linear(D, H * K)
        if kind == "mla":
            # K and V are decoded from one shared latent: only [latent_dim] per token is cached
            self.kv_down = Linear(D, c.latent_dim)
            self.key_up = Linear(c.latent_dim, H * K)
            self.value_up = Linear(c.latent_dim, H * K)
        else:
            self.key = Linear(D, self.num_kv_heads * K)
            self.value = Linear(D, self.num_kv_heads * K)
        self.linear = Linear(H * K, D)
        if kind == "talking-heads":
            self.mix_logits = nn.Parameter(torch.eye(H))
            self.mix_probs = nn.Parameter(torch.eye(H))

    def kv_cache_per_token(self) -> int:
        """Numbers a decoder caches per token per layer: what MQA / GQA / MLA exist to shrink."""
        return self.kv_down.w.shape[1] if self.kind == "mla" else 2 * self.num_kv_heads * self.key_size

    def forward(self, x, memory=None, allowed=None):
        """x [B, Tq, D]; memory [B, Tk, D] (cross-attention) or None (self) -> ([B, Tq, D], probs, logits)."""
        src = x if memory is None else memory
        B, Tq, _ = x.shape
        Tk, H, K = src.shape[1], self.num_heads, self.key_size
        q = self.query(x).view(B, Tq, H, K)
        if self.kind == "mla":
            latent = self.kv_down(src)                                            # [B, Tk, latent]
            k, v = self.key_up(latent).view(B, Tk, H, K), self.value_up(latent).view(B, Tk, H, K)
        else:
            k = self.key(src).view(B, Tk, self.num_kv_heads, K)                 # [B, Tk, Hkv, K]
            v = self.value(src).view(B, Tk, self.num_kv_heads, K)
        if self.kind == "gqa-repeat":
            # notebook 002's first GQA: copy each KV head G times (memory), then plain MHA
            G = H // self.num_kv_heads
            k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)   # [B, Tk, H, K]
        mix = (self.mix_logits, self.mix_probs) if self.kind == "talking-heads" else (None, None)
        out, probs, logits = attention_core(q, k, v, allowed, scale=1 / math.sqrt(K),
                                            mix_logits=mix[0], mix_probs=mix[1])
        return self.linear(out.reshape(B, Tq, H * K)), probs, logits


class FeedForward(nn.Module):
    """Notebook 004's three FFNs. SwiGLU keeps the parameter count with the 2/3 hidden rule."""

    def __init__(self, c: VariantConfig):
        super().__init__()
        D, self.kind = c.emb_size, c.ffn
        hidden = ffn_size(D, c.widening_factor) if c.ffn == "swiglu" else int(c.widening_factor * D)
        self.linear = Linear(D, hidden)
        if c.ffn == "swiglu":
            self.linear_v = Linear(D, hidden)
        self.linear_1 = Linear(hidden, D)

    def forward(self, x):
        h = self.linear(x)
        if self.kind == "swiglu":
            return self.linear_1(F.silu(h) * self.linear_v(x))
        return self.linear_1(F.relu(h) if self.kind == "relu" else F.gelu(h))


@dataclass
class CrossLayerTrace(LayerTrace):
    """A decoder layer of the encoder-decoder: ``probs`` is the cross-attention [B, H, Tq, Tsrc]."""
    self_probs: Optional[torch.Tensor] = None      # [B, H, Tq, Tq] the decoder's causal self-attention


class Block(nn.Module):
    """pre-LN: x + f(LN(x)) (GPT-2, LLaMA); post-LN: LN(x + f(x)) (the 2017 Transformer, BERT).
    With `cross`, a cross-attention sub-layer over the encoder output sits between the two."""

    def __init__(self, c: VariantConfig, kind: str = "mha", norm_position: str = "pre", cross: bool = False):
        super().__init__()
        if norm_position not in NORM_POSITIONS:
            raise ValueError(f"norm_position: got {norm_position!r}; allowed: {', '.join(NORM_POSITIONS)}")
        self.pre = norm_position == "pre"
        self.attention = Attention(c, kind)
        self.norm_attention = nn.LayerNorm(c.emb_size)
        self.cross_attention = Attention(c, "mha") if cross else None
        self.norm_cross = nn.LayerNorm(c.emb_size) if cross else None
        self.feed_forward = FeedForward(c)
        self.norm_ffn = nn.LayerNorm(c.emb_size)

    def sublayer(self, x, norm, fn):
        if self.pre:
            y, *attn = fn(norm(x))
            return x + y, attn
        y, *attn = fn(x)
        return norm(x + y), attn

    def forward(self, x, allowed, memory=None, memory_allowed=None):
        h, (probs, logits) = self.sublayer(x, self.norm_attention, lambda z: self.attention(z, None, allowed))
        self_probs = None
        if self.cross_attention is not None:
            self_probs = probs
            h, (probs, logits) = self.sublayer(
                h, self.norm_cross, lambda z: self.cross_attention(z, memory, memory_allowed))
        after_attention = h
        h, _ = self.sublayer(h, self.norm_ffn, lambda z: (self.feed_forward(z),))
        if self.cross_attention is not None:
            return h, CrossLayerTrace(probs, logits, after_attention, h, self_probs=self_probs)
        return h, LayerTrace(probs, logits, after_attention, h)


class VariantStack(nn.Module):
    """A stack of Blocks over embeddings: causal (a decoder, notebook 002) or bidirectional (an
    encoder, notebook 004). forward(embeddings [B, T, D], mask [B, T] bool) -> TransformerOutput."""

    def __init__(self, c: VariantConfig, kind: str = "mha", norm_position: str = "pre", causal: bool = True):
        super().__init__()
        self.config, self.causal = c, causal
        self.layers = nn.ModuleList(Block(c, kind, norm_position) for _ in range(c.num_layers))

    def forward(self, embeddings, mask=None, candidate_start_offset=None, *, record: bool = False
                ) -> TransformerOutput:
        """The trunk's call signature, so models.probes run on variants too; there is no candidate
        block here, so candidate_start_offset is accepted and ignored."""
        allowed = key_padding(mask, embeddings.shape[1], self.causal, embeddings.device)
        h, traces = embeddings, []
        for layer in self.layers:
            h, trace = layer(h, allowed)
            traces.append(trace)
        return TransformerOutput(h, traces if record else None)


class EncoderDecoder(nn.Module):
    """Notebook 001: a bidirectional encoder over the source, a causal decoder whose queries
    cross-attend to the encoder output. The recorded maps are the cross-attention [B, H, Tt, Ts]."""

    def __init__(self, c: VariantConfig):
        super().__init__()
        self.config = c
        self.encoder = VariantStack(c, "mha", "pre", causal=False)
        self.decoder = nn.ModuleList(Block(c, "mha", "pre", cross=True) for _ in range(c.num_layers))
        self.norm = nn.LayerNorm(c.emb_size)

    def forward(self, embeddings, mask=None, *, memory, memory_mask=None, record: bool = False) -> TransformerOutput:
        """embeddings [B, Tt, D] target; memory [B, Ts, D] source; masks [B, T] bool."""
        enc = self.norm(self.encoder(memory, memory_mask).embeddings)
        allowed = key_padding(mask, embeddings.shape[1], True, embeddings.device)
        memory_allowed = key_padding(memory_mask, embeddings.shape[1], False, embeddings.device)
        h, traces = embeddings, []
        for layer in self.decoder:
            h, trace = layer(h, allowed, enc, memory_allowed)
            traces.append(trace)
        return TransformerOutput(h, traces if record else None)


class TargetAttention(nn.Module):
    """DIN-style target attention (notebook 002): each candidate is one query over the user's
    behaviour sequence; its output is the candidate-specific user interest vector. One layer,
    no mask but padding: there is no order to respect, only relevance to the candidate.
    forward(embeddings [B, L, D] behaviours, mask [B, L], candidates [B, C, D]) -> [B, C, D]."""

    def __init__(self, c: VariantConfig):
        super().__init__()
        self.config = c
        self.attention = Attention(c, "mha")

    def forward(self, embeddings, mask=None, *, candidates, record: bool = False) -> TransformerOutput:
        allowed = key_padding(mask, candidates.shape[1], False, embeddings.device)
        out, probs, logits = self.attention(candidates, embeddings, allowed)        # probs [B, H, C, L]
        trace = LayerTrace(probs, logits, out, out)
        return TransformerOutput(out, [trace] if record else None)


# --- the registry ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    build: Callable[[VariantConfig], nn.Module]
    notebook: str
    teaches: str
    inputs: str = "self"          # self | cross | target: what forward() takes besides embeddings


def _decoder(kind):
    return lambda c: VariantStack(c, kind, "pre", causal=True)


def _encoder(norm_position):
    return lambda c: VariantStack(c, "mha", norm_position, causal=False)


VARIANTS: dict[str, Variant] = {
    "mha": Variant(_decoder("mha"), "002", "causal multi-head attention: every query head has its own K and V"),
    "mqa": Variant(_decoder("mqa"), "002", "multi-query: all query heads share one K/V head — the smallest KV cache"),
    "gqa": Variant(_decoder("gqa"), "002", "grouped-query by grouping query heads over shared K/V (grok.py's way, "
                   "no copies)"),
    "gqa-repeat": Variant(_decoder("gqa-repeat"), "002", "grouped-query by repeat_interleave of K/V: the same "
                          "numbers as gqa, with memory spent on copies"),
    "mla": Variant(_decoder("mla"), "002", "multi-head latent attention: K and V decoded from one small cached "
                   "latent (latent_dim)"),
    "talking-heads": Variant(_decoder("talking-heads"), "002", "talking heads: learned head mixing just before "
                             "and after the softmax"),
    "encoder-pre-ln": Variant(_encoder("pre"), "004", "bidirectional encoder block, x + f(LN(x)): stable deep "
                              "training without warm-up"),
    "encoder-post-ln": Variant(_encoder("post"), "004", "bidirectional encoder block, LN(x + f(x)): the 2017 "
                               "original; gradients shrink with depth"),
    "encoder-decoder": Variant(EncoderDecoder, "001", "decoder queries cross-attend to encoder keys: "
                               "non-square [target x source] maps", inputs="cross"),
    "din-target-attention": Variant(TargetAttention, "002", "DIN: one candidate attends over the behaviour "
                                    "sequence — the Phoenix candidate row without a transformer around it",
                                    inputs="target"),
}


def _check_name(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"variant: got {name!r}; allowed: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def build_variant(name: str, config: VariantConfig = VariantConfig(), seed: int = 0) -> nn.Module:
    """The named variant with seeded random weights (LayerNorms start at 1/0, talking-heads mixes
    at the identity: the untrained model is then the plain one)."""
    model = _check_name(name).build(config)
    init_params(model, "random", seed)
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.fill_(1.0)
                mod.bias.zero_()
            if isinstance(mod, Attention) and mod.kind == "talking-heads":
                H = mod.num_heads
                mod.mix_logits.copy_(torch.eye(H) + 0.1 * torch.randn(H, H, generator=g))
                mod.mix_probs.copy_(torch.eye(H) + 0.1 * torch.randn(H, H, generator=g))
    return model.eval()


def variant_inputs(name: str, config: VariantConfig = VariantConfig(), seed: int = 0, batch: int = 1,
                   seq_len: int = 8, source_len: Optional[int] = None) -> dict:
    """Random keyword inputs for ``model(**inputs, record=True)``: embeddings [B, T, D] and
    mask, plus memory (cross: source_len tokens) or candidates (target: 3 candidates)."""
    v = _check_name(name)
    g = torch.Generator().manual_seed(int(seed))
    D = config.emb_size
    kw = {"embeddings": torch.randn(batch, seq_len, D, generator=g),
          "mask": torch.ones(batch, seq_len, dtype=torch.bool)}
    if v.inputs == "cross":
        S = source_len or seq_len + 2
        kw.update(memory=torch.randn(batch, S, D, generator=g), memory_mask=torch.ones(batch, S, dtype=torch.bool))
    elif v.inputs == "target":
        kw["candidates"] = torch.randn(batch, 3, D, generator=g)
    return kw


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parameter_table(config: VariantConfig = VariantConfig()) -> list[dict]:
    """One row per variant: parameters, attention parameters, KV-cache numbers per token per layer."""
    rows = []
    for name, v in VARIANTS.items():
        model = v.build(config)
        attn = [m for m in model.modules() if isinstance(m, Attention)]
        rows.append({"variant": name, "notebook": v.notebook, "parameters": parameter_count(model),
                     "attention_parameters": sum(parameter_count(a) for a in attn),
                     "kv_cache_per_token": attn[0].kv_cache_per_token(), "teaches": v.teaches})
    return rows
