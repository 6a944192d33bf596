"""grok.py's attention, with interchangeable backends.

Every backend computes the same function (docs/originals.md §1):
    logits = (q . k) * attn_output_multiplier        fp32 (float64 stays float64), GQA by grouping
    logits = cap(logits)                             tanh / soft_sign / off
    logits = where(mask, logits, -1e30); softmax over keys (fp32 likewise); out = probs @ v

Shapes: q [B, T, Hq, K]; k, v [B, S, Hkv, K]; out [B, T, Hq, K].
A backend is one function plus one entry in BACKENDS (with its capabilities):

    naive           grok.py line for line; the reference, and the only one returning weights
    sdpa[-kernel]   torch SDPA with one kernel pinned (math / flash / efficient / cudnn); no logit cap,
                    so offered only with the cap off
    flex            FlexAttention: the mask predicate as mask_mod, multiplier + cap as score_mod
    structured      the recsys decomposition below, from plain torch pieces (runs anywhere)
    flash_attn      the same decomposition from Dao-AILab FlashAttention 2 (CUDA, tanh cap or none);
                    padded batches as one flash_attn_varlen_func call per piece (cu_seqlens)
    fa4             FlashAttention-4 (CuTe DSL, Hopper / Blackwell): the whole mask in one call, as
                    block-sparse tiles (full tiles unmasked, partial tiles through a mask_mod)

Nothing here reads a tensor back to the host: whether a mask is padded is AttentionMask.padded
(its layout), and the mask's dense / block / tile forms are built on the inputs' device once per
mask (models.masks), so a forward makes no host sync and a timed call builds no mask.

Each backend's entry in BACKENDS says what it runs (device, dtype, mask kind, cap, padding, head dim);
unavailable_reason() says in plain words why a combination is refused. attend() runs a backend that
computes this function or raises with that reason; the one approximation is the flash kernels' own:
flash_attn's and fa4's tanh softcap uses the GPU's fast tanh (tanh.approx.f32, ~5e-4 relative).
fa4 has run on an H100 (benchmarks/results/); both flash backends are also tested on CPU against stand-ins for
their calls. A query with no allowed key (only ever a padded position) gets uniform weights from naive/sdpa
(grok.py's -1e30) and zeros from the others. In bf16 / fp16 naive's q.k einsum rounds the logits to that dtype
(as grok.py's does) and the fused kernels keep them in fp32, so they are the closer to the fp32 result.
"""
from __future__ import annotations

import functools
import importlib.util
import os
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .masks import KERNEL_TILINGS, MASK_KINDS, AttentionMask

MASK_VALUE = -1e30
CAP_METHODS = ("tanh", "soft_sign", "none")


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in its compute dtype: float32 for bf16 / fp16 / fp32 (grok.py's fp32 softmax, norms and RoPE),
    float64 stays float64, so a float64 forward rounds nowhere to float32."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def apply_cap(logits: torch.Tensor, cap: float, method: str) -> torch.Tensor:
    """Production's two soft caps; cap <= 0 or method 'none' means off."""
    if method == "none" or cap <= 0:
        return logits
    if method == "tanh":
        return cap * torch.tanh(logits / cap)
    if method == "soft_sign":
        return logits / (1 + logits.abs() / cap)
    raise ValueError(f"cap_method: got {method!r}; allowed: {', '.join(CAP_METHODS)}")


def cap_active(cap: float, method: str) -> bool:
    return method != "none" and cap > 0


@dataclass
class AttentionOutput:
    out: torch.Tensor                       # [B, T, Hq, K]
    probs: Optional[torch.Tensor] = None    # [B, Hq, T, S] softmax weights (naive only)
    logits: Optional[torch.Tensor] = None   # [B, Hq, T, S] capped logits before masking


def grouped_attention(q, k, v, *, multiplier: float, cap: float = 0.0, cap_method: str = "none",
                      allowed: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                      mix_logits: Optional[torch.Tensor] = None, mix_probs: Optional[torch.Tensor] = None,
                      lse: bool = False):
    """The one attention core (naive, the decomposition's pieces, the variants, the bug zoo's kernel).

    q [B, Tq, Hq, K]; k, v [B, Tk, Hkv, K]: query head h reads KV head h // G (G = Hq / Hkv).
    logits = cap(q . k * multiplier) in fp32 (upcast) -> talking heads' mix_logits [Hq, Hq] -> -1e30 where not
    `allowed` ([B|1, 1, Tq, Tk] bool; grok.py's value) -> + `bias` (log weights: a kernel's key counts)
    -> softmax over keys -> mix_probs -> probs @ v. `lse`: masked with -inf and normalised by the
    log-sum-exp instead (a row with no allowed key gets zeros), which is returned for merging.
    -> (out [B, Tq, Hq, K], probs [B, Hq, Tq, Tk], logits [B, Hq, Tq, Tk] before the mask, lse [B, Tq, Hq] | None)"""
    B, Tq, Hq, K = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    logits = upcast(torch.einsum("bthgd,bshd->bhgts", q.reshape(B, Tq, Hkv, G, K), k)) * multiplier
    logits = apply_cap(logits, cap, cap_method)                                   # [B, Hkv, G, Tq, Tk]
    if mix_logits is not None:                       # heads talk before the softmax ...
        logits = torch.einsum("bhts,hg->bgts", logits.reshape(B, Hq, Tq, Tk), mix_logits).reshape(logits.shape)
    masked = logits
    if allowed is not None:                          # masked_fill: no second [B, H, Tq, Tk] tensor
        masked = masked.masked_fill(~allowed[:, :, None], float("-inf") if lse else MASK_VALUE)
    if bias is not None:
        masked = masked + bias
    if lse:
        log_sum = torch.logsumexp(masked, dim=-1)                                 # [B, Hkv, G, Tq]
        probs = torch.exp(masked - log_sum[..., None]).nan_to_num(0.0).to(q.dtype)   # empty row -> zeros
    else:
        probs = torch.softmax(masked, dim=-1).to(q.dtype)
    if mix_probs is not None:                        # ... and after it
        probs = torch.einsum("bhts,hg->bgts", probs.reshape(B, Hq, Tq, Tk), mix_probs).reshape(probs.shape)
    out = torch.einsum("bhgts,bshd->bthgd", probs, v).reshape(B, Tq, Hq, K)
    return (out, probs.reshape(B, Hq, Tq, Tk), logits.reshape(B, Hq, Tq, Tk),
            log_sum.permute(0, 3, 1, 2).reshape(B, Tq, Hq) if lse else None)


def naive_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                    need_weights: bool = False) -> AttentionOutput:
    """grok.py line for line: materialises the [B, Hq, T, S] logits."""
    out, probs, logits, _ = grouped_attention(q, k, v, multiplier=multiplier, cap=cap, cap_method=cap_method,
                                              allowed=mask.dense(q.device))
    return AttentionOutput(out, probs, logits) if need_weights else AttentionOutput(out)


# --- SDPA: torch's fused kernels, one explicit kernel per backend -----------------------

def _sdpa_kernel(name: str):
    from torch.nn.attention import SDPBackend
    return {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]


def _additive_mask(mask: AttentionMask, dtype, device) -> torch.Tensor:
    """[B|1, 1, T, S]: 0 where allowed, -1e30 where not. Adding -1e30 to a logit gives exactly -1e30
    in fp32, so this is grok.py's where(mask, logits, -1e30), fully masked rows (uniform) included.
    fp16 cannot hold -1e30: it gets its most negative number, exact on every row with an allowed key."""
    fill = max(MASK_VALUE, torch.finfo(dtype).min)
    dev = torch.device(device)
    return mask.cached(("additive", dtype, str(dev)),
                       lambda: torch.where(mask.dense(dev), 0.0, fill).to(dtype))


def sdpa_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                   need_weights: bool = False, kernel: str = "math") -> AttentionOutput:
    """torch SDPA with the kernel pinned (never a silent fallback). Exact only with the cap off, which
    the registry (BACKENDS) enforces: SDPA has no logit cap."""
    from torch.nn.attention import sdpa_kernel
    Hq, Hkv = q.shape[2], k.shape[2]
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))                # [B, H, T, K]
    if kernel in ("efficient", "cudnn") and Hq != Hkv:
        # these kernels take no enable_gqa: give each query head its KV head (h -> h // G, as grok.py)
        kh, vh = (x.repeat_interleave(Hq // Hkv, dim=1) for x in (kh, vh))
    plain = not mask.has_candidates and not mask.padded        # causal / full: no mask tensor needed
    bias = None if plain else _additive_mask(mask, q.dtype, q.device)
    with sdpa_kernel([_sdpa_kernel(kernel)]):
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias, is_causal=plain and mask.prefix_causal,
                                             scale=multiplier, enable_gqa=Hq != kh.shape[1])
    return AttentionOutput(out.transpose(1, 2))                         # [B, T, Hq, K]


# --- FlexAttention: the mask predicate itself, compiled ---------------------------------

@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention
    # Each layout (mask kind, offset, T) and each (multiplier, cap) is its own compiled kernel: dynamo
    # guards on the predicates' closures. Past the recompile limit (default 8) it would quietly fall
    # back to eager flex (still exact, but it materialises the scores), so calls of this function run
    # with a higher limit; the patch is thread-local and ends with the call (the process keeps its own).
    # eager flex_attention materialises the scores; compiled it is a fused kernel, CPU included. fullgraph:
    # a graph break would run (and time) part of it eagerly without a word, so it raises instead
    compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    return torch._dynamo.config.patch(recompile_limit=max(torch._dynamo.config.recompile_limit, 64))(compiled)


@functools.lru_cache(maxsize=64)
def _grok_score_mod(multiplier: float, cap: float, cap_method: str):
    """score_mod for grok.py's multiplier then soft cap; cached so a layout compiles once."""
    method = cap_method if cap_active(cap, cap_method) else "none"

    def grok_score(score, b, h, q_idx, kv_idx):
        return apply_cap(score * multiplier, cap, method)
    return grok_score


_BLOCK_MASKS: "OrderedDict[tuple, object]" = OrderedDict()


def flex_block_mask(mask: AttentionMask, device):
    """The BlockMask for this mask on `device`, built from mask.mask_mod() (padding reads valid[b, kv]).
    An unpadded layout's is shared by every mask of that (kind, T, offset, device); a padded one is
    kept on its AttentionMask (one per forward), never keyed by reading the padding back."""
    from torch.nn.attention.flex_attention import create_block_mask
    dev = torch.device(device)

    def build():
        batch = mask.valid.shape[0] if mask.padded else None     # None: one mask broadcast over the batch
        return create_block_mask(mask.mask_mod(dev), batch, None, mask.seq_len, mask.seq_len, device=dev)
    if mask.padded:
        return mask.cached(("flex", str(dev)), build)
    key = (mask.kind, mask.seq_len, mask.candidate_start_offset, str(dev))
    if key not in _BLOCK_MASKS:
        _BLOCK_MASKS[key] = build()
        while len(_BLOCK_MASKS) > 32:
            _BLOCK_MASKS.popitem(last=False)
    _BLOCK_MASKS.move_to_end(key)
    return _BLOCK_MASKS[key]


def flex_refused() -> Optional[str]:
    """Compiled or not at all: eager flex materialises the scores, which is no flash kernel."""
    if os.environ.get("SPACES_ZERO_GPU"):
        return ("flex needs torch.compile, which Hugging Face ZeroGPU does not support "
                "(uncompiled it would materialise the scores)")
    return None


def flex_cpu_refused() -> Optional[str]:
    """torch.compile's CPU FlexAttention kernel needs AVX2 (torch/_inductor/kernel/flex/flex_cpu.py asks the
    same two things); without it compiled flex raises, and uncompiled it is no flash kernel."""
    why = flex_refused()
    if why:
        return why
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        return "flex on CPU needs AVX2, which ATEN_CPU_CAPABILITY=default turns off"
    if not torch.cpu._is_avx2_supported():
        return "flex on CPU needs AVX2, which this CPU does not have"
    return None


def flex_cpu_known_failure(dtype: str, padding: bool) -> Optional[str]:
    """torch 2.13's compiled CPU flex kernel built for AVX2 (an AMD Zen 2/3, a Xeon without AVX-512, or
    ATEN_CPU_CAPABILITY=avx2) reads the padding past the last key in bf16 and fails 'index out of bounds'
    (T 1087; T 1024, fp32 and fp16 run). Measured on this project's CI machine's AVX2 path."""
    if dtype == "bfloat16" and padding and torch.backends.cpu.get_cpu_capability() == "AVX2":
        return ("flex on this CPU (AVX2 kernels) fails on bf16 with key padding (torch's compiled CPU kernel "
                "reads past the last key); pick float32 or float16, or no padding")
    return None


def flex_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                   need_weights: bool = False) -> AttentionOutput:
    """A query with no allowed key gets zeros here (grok.py: uniform weights); such rows are padding."""
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError("backend: flex on CPU is inference-only (no backward there); "
                         "call the model under torch.no_grad()")
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))                # [B, H, T, K]
    out = _compiled_flex()(qh, kh, vh, score_mod=_grok_score_mod(float(multiplier), float(cap), cap_method),
                           block_mask=flex_block_mask(mask, q.device), scale=1.0,
                           enable_gqa=q.shape[2] != k.shape[2])
    return AttentionOutput(out.transpose(1, 2))                         # [B, T, Hq, K]


# --- the recsys mask without the candidate x candidate block -------------------------------
# A candidate sees the prefix (user + history) and itself. So its softmax splits into two parts:
#   (b) the prefix keys, a plain non-causal attention that also returns log-sum-exp lse_p, and
#   (c) its own key, one logit s_self = cap(multiplier * q_i . k_i).
# With lse = logaddexp(lse_p, s_self):  out_i = exp(lse_p - lse) * out_p + exp(s_self - lse) * v_i,
# exactly the softmax over prefix + self. The prefix queries (a) see only the prefix (causal or not).
# Any kernel that returns lse (flash_attn, or plain torch below) serves as a "piece".

def math_piece(q, k, v, *, causal: bool, key_valid: Optional[torch.Tensor], multiplier: float,
               cap: float, cap_method: str):
    """One dense block in plain torch: q [B,Tq,Hq,K], k/v [B,S,Hkv,K] -> out [B,Tq,Hq,K], lse [B,Tq,Hq] (upcast)."""
    Tq, S = q.shape[1], k.shape[1]
    allowed = torch.ones(Tq, S, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril()
    allowed = allowed[None, None]                                                   # [1, 1, Tq, S]
    if key_valid is not None:
        allowed = allowed & key_valid[:, None, None, :]
    out, _, _, lse = grouped_attention(q, k, v, multiplier=multiplier, cap=cap, cap_method=cap_method,
                                       allowed=allowed, lse=True)
    return out, lse


def decomposed_attention(q, k, v, mask: AttentionMask, piece, *, multiplier: float, cap: float,
                         cap_method: str) -> torch.Tensor:
    """grok.py's attention for any mask kind from `piece` calls that never see candidate x candidate.
    Reads the mask's structure: prefix length P, prefix causal or not, candidates from P on."""
    B, T, Hq, K = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    P = mask.prefix_len                                      # no candidates: the whole sequence is prefix
    valid = mask.valid_on(q.device)
    kw = dict(multiplier=multiplier, cap=cap, cap_method=cap_method)
    out = torch.zeros_like(q)
    if P > 0:                                                                       # (a)
        out[:, :P] = piece(q[:, :P], k[:, :P], v[:, :P], causal=mask.prefix_causal,
                           key_valid=None if valid is None else valid[:, :P], **kw)[0]
    if P == T:
        return out
    C = T - P
    qc = q[:, P:].reshape(B, C, Hkv, G, K)                                          # [B, C, Hkv, G, K]
    kc, vc = k[:, P:], v[:, P:]                                                     # [B, C, Hkv, K]
    s_self = apply_cap((upcast(qc) * upcast(kc[:, :, :, None])).sum(-1) * multiplier, cap, cap_method)
    s_self = s_self.reshape(B, C, Hq)                                               # (c) [B, C, Hq]
    if valid is not None:
        s_self = s_self.masked_fill(~valid[:, P:, None], float("-inf"))
    if P > 0:                                                                       # (b)
        out_p, lse_p = piece(q[:, P:], k[:, :P], v[:, :P], causal=False,
                             key_valid=None if valid is None else valid[:, :P], **kw)
    else:
        out_p, lse_p = torch.zeros_like(q[:, P:]), torch.full_like(s_self, float("-inf"))
    lse = torch.logaddexp(lse_p, s_self)                                            # [B, C, Hq]
    w_prefix = torch.exp(lse_p - lse).nan_to_num(0.0)[..., None]                    # empty row -> zeros
    w_self = torch.exp(s_self - lse).nan_to_num(0.0)[..., None]
    v_self = vc.repeat_interleave(G, dim=2)                                         # [B, C, Hq, K]
    out[:, P:] = (w_prefix * upcast(out_p) + w_self * upcast(v_self)).to(q.dtype)
    return out


def structured_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                         need_weights: bool = False) -> AttentionOutput:
    """The flash_attn decomposition in plain torch: runs anywhere, proves the decomposition on CPU."""
    return AttentionOutput(decomposed_attention(q, k, v, mask, math_piece, multiplier=multiplier, cap=cap,
                                                cap_method=cap_method))


# --- flash_attn: Dao-AILab's FlashAttention 2 --------------------------------------------

def _flash_attn_funcs():
    """(flash_attn_func, flash_attn_varlen_func): a seam the CPU tests fill with stand-ins."""
    from flash_attn import flash_attn_func, flash_attn_varlen_func
    return flash_attn_func, flash_attn_varlen_func


def _import_failure(module: str, load: Callable[[], object], package: str) -> Optional[str]:
    """None when `load()` works; "<package> not installed" when `module` is absent; otherwise the
    import error itself (a build that cannot load its CUDA library is not a missing package)."""
    try:
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            return f"{package} not installed"
    except ImportError:
        return f"{package} not installed"
    except Exception as e:  # noqa: BLE001 — the package's own __init__ failed while looking for `module`
        return f"{package} is installed but does not load ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
    try:
        load()
    except Exception as e:  # noqa: BLE001
        return f"{package} is installed but does not load ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
    return None


@functools.lru_cache(maxsize=None)
def flash_attn_missing() -> Optional[str]:
    """Checked once per process (attend() asks on every call)."""
    # flash-attn-4 installs flash_attn/cute without flash_attn/__init__: FA2 is then still missing
    return _import_failure("flash_attn.flash_attn_interface", _flash_attn_funcs, "flash-attn")


def pack_rows(valid: torch.Tensor):
    """Varlen packing without a host read. valid [B, L] bool ->
    (dest [B, L] long: each token's row in a [B*L] buffer, valid tokens of row b contiguous at
     cu[b]:cu[b+1] and padded ones after cu[B]; cu [B+1] int32 cumulative valid lengths)."""
    B, L = valid.shape
    counts = valid.sum(1)                                                           # [B]
    cu = F.pad(counts.cumsum(0), (1, 0))                                            # [B+1]
    rank = valid.long().cumsum(1) - 1                                               # index among row's valid
    pad_rank = (~valid).flatten().long().cumsum(0).reshape(B, L) - 1                # index among all padded
    dest = torch.where(valid, cu[:-1, None] + rank, cu[-1] + pad_rank)
    return dest, cu.to(torch.int32)


def _pack(x, dest):
    """x [B, L, ...] -> [B*L, ...] with row dest[b, t] = x[b, t]."""
    flat = x.flatten(0, 1)
    return torch.empty_like(flat).index_copy_(0, dest.flatten(), flat)


def flash_attn_piece(q, k, v, *, causal: bool, key_valid, multiplier: float, cap: float, cap_method: str):
    """FlashAttention 2 on one block: [B, T, H, D], GQA natively, tanh softcap; -> out, lse [B, Tq, Hq].
    With key padding: one flash_attn_varlen_func call, each row's valid keys packed by cu_seqlens
    (a causal block packs its queries the same way, so "earlier" keeps its meaning)."""
    dense_fn, varlen_fn = _flash_attn_funcs()
    softcap = float(cap) if cap_active(cap, cap_method) else 0.0
    if key_valid is None:
        out, lse, _ = dense_fn(q, k, v, softmax_scale=float(multiplier), causal=causal, softcap=softcap,
                               return_attn_probs=True)
        return out, lse.transpose(1, 2)                                             # lse [B, Tq, Hq]
    B, Tq, Hq, _ = q.shape
    S = k.shape[1]
    k_dest, cu_k = pack_rows(key_valid)
    if causal:                                                                      # Tq == S
        q_dest, cu_q, q_valid = k_dest, cu_k, key_valid
    else:
        q_valid = torch.ones(B, Tq, dtype=torch.bool, device=q.device)
        q_dest, cu_q = pack_rows(q_valid)
    # max_seqlen: an upper bound sizes the launch grid exactly as well as the true maximum would
    out, lse, _ = varlen_fn(_pack(q, q_dest), _pack(k, k_dest), _pack(v, k_dest), cu_q, cu_k, Tq, S,
                            softmax_scale=float(multiplier), causal=causal, softcap=softcap,
                            return_attn_probs=True)
    out = out[q_dest]                                                               # [B, Tq, Hq, D]
    lse = lse.transpose(0, 1)[q_dest]                                               # [B, Tq, Hq]
    # rows past cu_q[-1] were never written, and a row with no keys gets lse = +inf from the kernel
    has_keys = (key_valid.sum(1) > 0)[:, None, None] & q_valid[..., None]           # [B, Tq, 1]
    return (torch.where(has_keys[..., None], out, torch.zeros((), dtype=out.dtype, device=out.device)),
            torch.where(has_keys, lse, torch.full((), float("-inf"), device=lse.device)))


def flash_attn_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                         need_weights: bool = False) -> AttentionOutput:
    return AttentionOutput(decomposed_attention(q, k, v, mask, flash_attn_piece, multiplier=multiplier,
                                                cap=cap, cap_method=cap_method))


# --- fa4: FlashAttention-4 (CuTe DSL), the whole mask in one block-sparse call ---------------
# flash_attn.cute.flash_attn_func takes a CuTe mask_mod(batch, head, m_idx, n_idx, seqlen_info,
# aux_tensors) and BlockSparseTensorsTorch: per query tile, the kv tiles to run unmasked ("full")
# and those to run through mask_mod ("mask"); every other tile is skipped. Both come from the
# mask's own structure and its tile map (AttentionMask.tiles), so for the recsys mask the prefix
# tiles run full, each candidate tile runs its prefix tiles plus its diagonal tile, and the
# candidate x candidate block is never computed. pack_gqa stays off so tiles are token tiles.

FA4_BLOCK_KV = KERNEL_TILINGS["fa4"].block_kv    # the tiling the Mask view draws and counts


def _fa4_block_q(device) -> int:
    """Query tile: 128 on Hopper; Blackwell runs two 128-row Q stages per CTA, so 256 there."""
    return 256 if torch.cuda.get_device_capability(device)[0] >= 10 else 128


def fa4_mask_mod_body(prefix_causal: bool, padded: bool, *, prefix_len, key_valid):
    """The mask as FA4 evaluates it on partial tiles, written once for both the CuTe kernel and the CPU
    stand-in. Runtime data arrives in aux_tensors: [0] = P as a one-element int32 tensor (so one
    compiled kernel serves every layout), [1] = key padding [B, T] int32 (1 = valid) when padded.
    `prefix_len(aux)` and `key_valid(aux, batch, n_idx)` read them as index-typed values. The Python
    `if`s run while the kernel is traced: each (prefix_causal, padded) compiles to straight-line code."""
    def prefix_and_self(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        return (n_idx < prefix_len(aux_tensors)) | (n_idx == m_idx)

    def causal_prefix(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        return prefix_and_self(batch, head, m_idx, n_idx, seqlen_info, aux_tensors) & (n_idx <= m_idx)

    structure = causal_prefix if prefix_causal else prefix_and_self
    if not padded:
        return structure

    def with_padding(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        return (structure(batch, head, m_idx, n_idx, seqlen_info, aux_tensors)
                & key_valid(aux_tensors, batch, n_idx))
    return with_padding


@functools.lru_cache(maxsize=None)
def _fa4_mask_mod(prefix_causal: bool, padded: bool):
    """The CuTe version (compiled by FA4 on first use and cached by it), reading aux tensors element by
    element as FA4's own document mask does."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    def prefix_len(aux):
        return utils.scalar_to_ssa(aux[0][0], cutlass.Int32)

    def key_valid(aux, batch, n_idx):
        return utils.scalar_to_ssa(aux[1][batch[0], n_idx[0]], cutlass.Int32) == utils.scalar_to_ssa(1, cutlass.Int32)
    return cute.jit(fa4_mask_mod_body(prefix_causal, padded, prefix_len=prefix_len, key_valid=key_valid))


def _fa4_func():
    """(flash_attn_func, BlockSparseTensorsTorch): a seam the CPU tests fill with stand-ins."""
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    return flash_attn_func, BlockSparseTensorsTorch


@functools.lru_cache(maxsize=None)
def _fa4_import_failure() -> Optional[str]:
    return _import_failure("flash_attn.cute", _fa4_func, "flash-attn-4")


@functools.lru_cache(maxsize=None)
def fa4_missing() -> Optional[str]:
    """None when fa4 can run in this process, else why not (cached: attend() asks on every call)."""
    why = _fa4_import_failure()
    if why is None and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if major not in (9, 10, 11):
            return (f"fa4 runs on Hopper (SM90) and Blackwell (SM100/SM110) GPUs; this one is "
                    f"SM{major}{minor}")
    return why


def fa4_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                  need_weights: bool = False) -> AttentionOutput:
    flash_attn_func, BlockSparse = _fa4_func()
    block_q = _fa4_block_q(q.device)

    def sparse():
        full_cnt, full_idx, part_cnt, part_idx = KERNEL_TILINGS["fa4"].tiles(
            mask, q.device, block_q=block_q, block_kv=FA4_BLOCK_KV).block_sparse()
        return BlockSparse(mask_block_cnt=part_cnt, mask_block_idx=part_idx, full_block_cnt=full_cnt,
                           full_block_idx=full_idx, block_size=(block_q, FA4_BLOCK_KV))
    blocks = mask.cached(("fa4-blocks", block_q, str(q.device)), sparse)

    def aux_tensors():
        P = torch.full((1,), mask.prefix_len, dtype=torch.int32, device=q.device)
        return [P] + ([mask.valid_on(q.device).to(torch.int32)] if mask.padded else [])
    out, _ = flash_attn_func(q, k, v, softmax_scale=float(multiplier), causal=False,
                             softcap=float(cap) if cap_active(cap, cap_method) else 0.0, pack_gqa=False,
                             mask_mod=_fa4_mask_mod(mask.prefix_causal, mask.padded),
                             aux_tensors=mask.cached(("fa4-aux", str(q.device)), aux_tensors),
                             block_sparse_tensors=blocks)
    return AttentionOutput(out)


# --- the registry: what each backend runs ------------------------------------------------------

def _needs_cuda_build() -> Optional[str]:
    return None if torch.cuda.is_available() else "needs CUDA"


@dataclass(frozen=True)
class Backend:
    fn: Callable[..., AttentionOutput]
    description: str
    speed_reason: str                   # why it is fast or slow (the timing tab's note; a device's own in per_device)
    devices: tuple = ("cpu", "cuda")
    dtypes: tuple = ("float32", "float16", "bfloat16")
    cap_methods: tuple = CAP_METHODS
    returns_weights: bool = False
    # available() -> None when usable here, else the reason in plain words
    available: Callable[[], Optional[str]] = field(default=lambda: None)
    mask_kinds: tuple = tuple(MASK_KINDS)
    padding: bool = True                # key padding (mask.valid) supported
    max_head_dim: Optional[int] = None
    head_dim_multiple: Optional[int] = None
    gqa: str = "grouped einsum"         # how query heads share KV heads
    empty_rows: str = "uniform"         # a query with no allowed key: "uniform" (grok.py) or "zeros"
    per_device: dict = field(default_factory=dict)   # device -> fields that differ there
    # known_failure(dtype, padding) -> None, or why this machine's build of the kernel fails on that case
    known_failure: Callable[[str, bool], Optional[str]] = field(default=lambda dtype, padding: None)

    def on(self, device: str) -> "Backend":
        """This backend's capabilities on one device."""
        return replace(self, **self.per_device.get(device, {}))


_CUDA_SDPA = ("float16", "bfloat16")
# grouped_attention's backends also run float64 end to end (parity with the float64 references)
_WITH_FLOAT64 = ("float32", "float16", "bfloat16", "float64")

BACKENDS: dict[str, Backend] = {
    "naive": Backend(naive_attention, "materialised [B, H, T, T] logits and probabilities, as grok.py; in bf16 its "
                                      "einsum rounds the logits, so the fused kernels land closer to fp32",
                     "memory-bound: it writes and reads every logit and probability, traffic growing as T²",
                     dtypes=_WITH_FLOAT64, returns_weights=True),
    "sdpa": Backend(functools.partial(sdpa_attention, kernel="math"),
                    "torch SDPA, math kernel: additive -1e30 mask; no logit cap",
                    "the same materialised scores as naive, plus an additive mask tensor",
                    cap_methods=("none",), gqa="native (enable_gqa)"),
    "sdpa-flash": Backend(functools.partial(sdpa_attention, kernel="flash"),
                          "torch SDPA, flash kernel (on CPU it takes the mask; on CUDA causal/full only)",
                          "fused and tiled (no [T, T] probabilities kept), but it reads a dense mask and skips no "
                          "tile", cap_methods=("none",), gqa="native (enable_gqa)",
                          per_device={"cuda": dict(dtypes=_CUDA_SDPA, mask_kinds=("causal", "full"),
                                                   padding=False, max_head_dim=256,
                                                   speed_reason="FlashAttention 2 inside torch: fused and tiled")}),
    "sdpa-efficient": Backend(functools.partial(sdpa_attention, kernel="efficient"),
                              "torch SDPA, memory-efficient (xformers) kernel with an additive mask",
                              "fused, but it reads the dense [T, T] mask and skips no tile",
                              devices=("cuda",), cap_methods=("none",), gqa="repeated K/V"),
    "sdpa-cudnn": Backend(functools.partial(sdpa_attention, kernel="cudnn"),
                          "torch SDPA, cuDNN kernel (causal or full masks only)", "fused and tiled",
                          devices=("cuda",), dtypes=_CUDA_SDPA, cap_methods=("none",), mask_kinds=("causal", "full"),
                          padding=False, max_head_dim=128, gqa="repeated K/V"),
    "flex": Backend(flex_attention,
                    "FlexAttention: the mask predicate as mask_mod, multiplier + cap as score_mod, compiled",
                    "one fused kernel (Triton on CUDA) that skips empty 128×128 tiles",
                    gqa="native (enable_gqa)", empty_rows="zeros", available=flex_refused,
                    per_device={"cpu": dict(available=flex_cpu_refused, known_failure=flex_cpu_known_failure, speed_reason="one fused kernel that skips empty 128×128 tiles; each "
                                                         "new length compiles first (~20-40 s here, never timed, "
                                                         "then cached)")}),
    "structured": Backend(structured_attention,
                          "recsys decomposition (prefix | candidates x prefix with LSE | self) in plain torch; "
                          "never builds the candidate x candidate block",
                          "several launches and a log-sum-exp merge", dtypes=_WITH_FLOAT64, empty_rows="zeros",
                          per_device={"cpu": dict(speed_reason="separate dense calls: no fused kernel on CPU, so "
                                                               "more passes over memory than naive")}),
    "flash_attn": Backend(flash_attn_attention,
                          "Dao-AILab FlashAttention 2 + the recsys decomposition merged by log-sum-exp; "
                          "key padding packed with cu_seqlens (flash_attn_varlen_func)",
                          "fused and tiled, no [T, T] in memory",
                          devices=("cuda",), dtypes=_CUDA_SDPA, cap_methods=("tanh", "none"),
                          available=flash_attn_missing, max_head_dim=256, head_dim_multiple=8,
                          gqa="native", empty_rows="zeros"),
    "fa4": Backend(fa4_attention,
                   "FlashAttention-4 (CuTe DSL, Hopper / Blackwell): the whole mask in one call, full tiles "
                   "unmasked, partial tiles through a mask_mod, empty tiles (candidate x candidate) skipped",
                   "one fused call, no [T, T] in memory",
                   devices=("cuda",), dtypes=_CUDA_SDPA, cap_methods=("tanh", "none"), available=fa4_missing,
                   max_head_dim=128, head_dim_multiple=8, gqa="native (pack_gqa off: token tiles)",
                   empty_rows="zeros"),
}


def unavailable_reason(backend: str, *, device: str = "cpu", dtype: str = "float32",
                       cap: float = 30.0, cap_method: str = "tanh", mask_kind: Optional[str] = None,
                       padding: bool = False, head_dim: Optional[int] = None,
                       need_weights: bool = False) -> Optional[str]:
    """None if `backend` can run this exactly, else why not in plain words (shown in the app).
    No backend is run on something it would only approximate (the flash kernels' fast tanh aside)."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}"
    dev = torch.device(device).type
    if dev == "meta":       # shape-only runs (tests/test_device.py): the plain-torch backends run there as on CPU
        dev = "cpu"
    base = BACKENDS[backend]
    if dev not in base.devices:
        return f"{backend} needs {' or '.join(d.upper() for d in base.devices)}"
    b = base.on(dev)
    why = (_needs_cuda_build() if dev == "cuda" else None) or b.available()
    if why:
        return why
    if dtype not in b.dtypes:
        return f"{backend} on {dev} does not run {dtype}; it takes {', '.join(b.dtypes)}"
    method = cap_method if cap_active(cap, cap_method) else "none"
    if method not in b.cap_methods:
        if b.cap_methods == ("none",):
            return f"{backend}: SDPA has no logit cap (exact only with the cap off)"
        return f"{backend} has no {method} logit cap (it takes {' or '.join(b.cap_methods)})"
    if mask_kind is not None and mask_kind not in b.mask_kinds:
        return f"{backend} on {dev} takes no {mask_kind} mask (only {', '.join(b.mask_kinds)})"
    if padding and not b.padding:
        return f"{backend} on {dev} does not support key padding"
    why = b.known_failure(dtype, padding)
    if why:
        return why
    if head_dim is not None and b.max_head_dim is not None and head_dim > b.max_head_dim:
        return f"{backend} takes head dim up to {b.max_head_dim}, got {head_dim}"
    if head_dim is not None and b.head_dim_multiple and head_dim % b.head_dim_multiple:
        return f"{backend} takes head dims that are multiples of {b.head_dim_multiple}, got {head_dim}"
    if need_weights and not b.returns_weights:
        return f"{backend} does not return attention weights; heatmaps need naive"
    return None


def attend(q, k, v, mask: AttentionMask, *, multiplier: float = 1.0, cap: float = 30.0,
           cap_method: str = "tanh", backend: str = "naive", need_weights: bool = False) -> AttentionOutput:
    """q [B, T, Hq, K]; k, v [B, S, Hkv, K] -> AttentionOutput(out [B, T, Hq, K]) via the named backend."""
    why = unavailable_reason(backend, device=q.device.type, dtype=str(q.dtype).removeprefix("torch."),
                             cap=cap, cap_method=cap_method, mask_kind=mask.kind, padding=mask.padded,
                             head_dim=q.shape[-1], need_weights=need_weights)
    if why:
        raise ValueError(f"backend: {why}")
    return BACKENDS[backend].fn(q, k, v, mask, multiplier=multiplier, cap=cap, cap_method=cap_method,
                                need_weights=need_weights)
