"""grok.py's attention, with interchangeable backends.

Every backend computes the same function (FACTS.md §1):
    logits = (q . k) * attn_output_multiplier        fp32, GQA by grouping
    logits = cap(logits)                             tanh / soft_sign / off
    logits = where(mask, logits, -1e30); softmax over keys (fp32); out = probs @ v

Shapes: q [B, T, Hq, K]; k, v [B, S, Hkv, K]; out [B, T, Hq, K].
A backend is one function plus one entry in BACKENDS (with its capabilities).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .masks import AttentionMask

MASK_VALUE = -1e30
CAP_METHODS = ("tanh", "soft_sign", "none")


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


def naive_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                    need_weights: bool = False) -> AttentionOutput:
    """grok.py line for line: materialises the [B, Hkv, G, T, S] logits."""
    B, T, Hq, K = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    qg = q.reshape(B, T, Hkv, G, K)                                    # [B, T, Hkv, G, K]
    logits = torch.einsum("bthgd,bshd->bhgts", qg, k).float()          # [B, Hkv, G, T, S]
    logits = logits * multiplier
    logits = apply_cap(logits, cap, cap_method)
    m = mask.dense().to(q.device)[:, :, None]                          # [B|1, 1, 1, T, S]
    masked = torch.where(m, logits, torch.full_like(logits, MASK_VALUE))
    probs = torch.softmax(masked, dim=-1).to(q.dtype)
    out = torch.einsum("bhgts,bshd->bthgd", probs, v).reshape(B, T, Hq, K)
    if not need_weights:
        return AttentionOutput(out)
    return AttentionOutput(out, probs.reshape(B, Hq, T, -1), logits.reshape(B, Hq, T, -1))


@dataclass(frozen=True)
class Backend:
    fn: Callable[..., AttentionOutput]
    description: str
    devices: tuple = ("cpu", "cuda")
    dtypes: tuple = ("float32", "float16", "bfloat16")
    cap_methods: tuple = CAP_METHODS
    returns_weights: bool = False
    # available() -> None when usable here, else the reason in plain words
    available: Callable[[], Optional[str]] = field(default=lambda: None)


BACKENDS: dict[str, Backend] = {
    "naive": Backend(naive_attention, "materialised [B, H, T, T] logits and probabilities, as grok.py",
                     returns_weights=True),
}


def unavailable_reason(backend: str, *, device: str = "cpu", dtype: str = "float32",
                       cap: float = 30.0, cap_method: str = "tanh",
                       need_weights: bool = False) -> Optional[str]:
    """None if `backend` can run this exactly, else why not (shown in the app)."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}"
    b = BACKENDS[backend]
    why = b.available()
    if why:
        return why
    dev = torch.device(device).type
    if dev not in b.devices:
        return f"{backend} needs {' or '.join(b.devices).upper()}"
    if dtype not in b.dtypes:
        return f"{backend} does not run {dtype}; it takes {', '.join(b.dtypes)}"
    method = cap_method if cap_active(cap, cap_method) else "none"
    if method not in b.cap_methods:
        return f"{backend} has no {method} logit cap (it is exact only with the cap " \
               f"{' or '.join(b.cap_methods)})"
    if need_weights and not b.returns_weights:
        return f"{backend} does not return attention weights; heatmaps need naive"
    return None


def attend(q, k, v, mask: AttentionMask, *, multiplier: float = 1.0, cap: float = 30.0,
           cap_method: str = "tanh", backend: str = "naive", need_weights: bool = False) -> AttentionOutput:
    why = unavailable_reason(backend, device=q.device.type, dtype=str(q.dtype).removeprefix("torch."),
                             cap=cap, cap_method=cap_method, need_weights=need_weights)
    if why:
        raise ValueError(f"backend: {why}")
    return BACKENDS[backend].fn(q, k, v, mask, multiplier=multiplier, cap=cap, cap_method=cap_method,
                                need_weights=need_weights)
