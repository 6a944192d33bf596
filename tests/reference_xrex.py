"""An independent NumPy forward of the 2026 production Phoenix ranker (xrex), written from docs/originals.md.

Imports nothing from models/: it reads the original's init tree (layers stacked on axis 0 under
``transformer/layer_stack/decoder_layer_0``) and computes in float64, so agreement with the PyTorch
port run in float64 (to float64 rounding, ~1e-12) means the port computes production's function, not
merely its own. Each rule is written the way docs/originals.md states it (§4 layer math, §5 output head,
§5 names), loops where that is clearer.
"""
from __future__ import annotations

import numpy as np

STACK = "transformer/layer_stack/decoder_layer_0"
MHA = STACK + "/multi_head_attention"
HEAD = "recsys_aggregated_model"
MASK_VALUE = -1e30


def ffn_hidden(emb_size, widening_factor=2.0):
    h = int(widening_factor * emb_size)
    return (h + 31) // 32 * 32


def random_xrex_params(rng, *, emb_size, num_layers, num_q_heads, num_kv_heads, key_size, widening_factor=2.0,
                       qk_norm=True, primer_norm=False, output_vocab_size=64, num_continuous_actions=8):
    """Random weights and random (non-unit) norm scales, in production's stacked tree (§5)."""
    n, D, K, F = num_layers, emb_size, key_size, ffn_hidden(emb_size, widening_factor)

    def w(fan_in, fan_out):
        return rng.normal(0.0, 1.0 / np.sqrt(fan_in), (n, fan_in, fan_out)).astype(np.float32)

    def scale(dim, stacked=True):
        return rng.normal(1.0, 0.3, (n, dim) if stacked else (dim,)).astype(np.float32)

    params = {
        f"{STACK}/pre_attn_norm": {"scale": scale(D)},
        f"{MHA}/qkv": {"w": w(D, (num_q_heads + 2 * num_kv_heads) * K)},
        f"{MHA}/out": {"w": w(num_q_heads * K, D)},
        f"{STACK}/pre_ffn_norm": {"scale": scale(D)},
        f"{STACK}/up_proj": {"w": w(D, F)},
        f"{STACK}/down_proj": {"w": w(F, D)},
        f"{HEAD}/final_layer_norm": {"scale": scale(D, stacked=False)},
        HEAD: {"unembeddings": rng.normal(0, 1 / np.sqrt(D), (D, output_vocab_size)).astype(np.float32),
               "continuous_unembeddings": rng.normal(0, 1 / np.sqrt(D), (D, num_continuous_actions)).astype(np.float32)},
    }
    if qk_norm:
        params[f"{MHA}/q_norm"] = {"scale": scale(num_q_heads * K)}
        params[f"{MHA}/k_norm"] = {"scale": scale(num_kv_heads * K)}
    if primer_norm:
        params[f"{STACK}/post_attn_norm"] = {"scale": scale(D)}
        params[f"{STACK}/post_ffn_norm"] = {"scale": scale(D)}
    return params


# --- pieces, one per rule of docs/originals.md §4 ----------------------------------------------------

def rms_norm(x, scale, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def right_anchored(valid, P, L):
    """[B, T] positions: prefix i -> i; history slot k -> P+L-n_valid+k; candidates -> P+L; padding -> 0."""
    B, T = valid.shape
    pos = np.zeros((B, T))
    for b in range(B):
        n_valid = int(valid[b, P:P + L].sum())
        for t in range(T):
            if not valid[b, t]:
                pos[b, t] = 0
            elif t < P:
                pos[b, t] = t
            elif t < P + L:
                pos[b, t] = P + L - n_valid + (t - P)
            else:
                pos[b, t] = P + L
    return pos


def allowed(valid, P, L):
    """[B, T, T]: key j is visible to query i iff j is a valid prefix/history token, or j == i."""
    B, T = valid.shape
    j = np.arange(T)
    prefix_key = (j < P + L)[None, None, :] & valid[:, None, :]
    return prefix_key | np.eye(T, dtype=bool)[None]


def rope(x, positions, base=10000.0):
    """x [B, T, H, K]; positions [B, T]. Halves: x*cos + [-x2, x1]*sin, phase [t*theta, t*theta]."""
    K = x.shape[-1]
    theta = base ** (-np.arange(0, K, 2, dtype=np.float64) / K)
    phase = positions[..., None] * theta                                   # [B, T, K/2]
    phase = np.concatenate([phase, phase], -1)[:, :, None, :]
    x1, x2 = x[..., :K // 2], x[..., K // 2:]
    return x * np.cos(phase) + np.concatenate([-x2, x1], -1) * np.sin(phase)


def cap(s, value, method):
    if value <= 0 or method == "none":
        return s
    if method == "tanh":
        return value * np.tanh(s / value)
    return s / (1.0 + np.abs(s) / value)        # soft_sign


def attention(x, i, params, ok, positions, *, Hq, Hkv, K, qk_norm, cap_value, cap_method, rope_base):
    B, T, _ = x.shape
    r = Hq // Hkv
    w = params[f"{MHA}/qkv"]["w"][i].astype(np.float64)                    # [D, Hkv*(r+2)*K]
    qkv = (x @ w).reshape(B, T, Hkv, r + 2, K)
    q = np.zeros((B, T, Hq, K))
    k = np.zeros((B, T, Hkv, K))
    v = np.zeros((B, T, Hkv, K))
    for g in range(Hkv):                 # group g: slots 0..r-1 = q heads g*r+j, slot r = k_g, r+1 = v_g
        for jj in range(r):
            q[:, :, g * r + jj] = qkv[:, :, g, jj]
        k[:, :, g] = qkv[:, :, g, r]
        v[:, :, g] = qkv[:, :, g, r + 1]
    if qk_norm:                          # one RMSNorm over all heads flattened, before RoPE
        q = rms_norm(q.reshape(B, T, Hq * K), params[f"{MHA}/q_norm"]["scale"][i]).reshape(B, T, Hq, K)
        k = rms_norm(k.reshape(B, T, Hkv * K), params[f"{MHA}/k_norm"]["scale"][i]).reshape(B, T, Hkv, K)
    q, k = rope(q, positions, rope_base), rope(k, positions, rope_base)
    out = np.zeros((B, T, Hq, K))
    for h in range(Hq):
        g = h // r
        s = np.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) * (np.sqrt(128.0) / K)
        s = np.where(ok, cap(s, cap_value, cap_method), MASK_VALUE)
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(-1, keepdims=True)
        out[:, :, h] = np.einsum("bts,bsd->btd", p, v[:, :, g])
    return out.reshape(B, T, Hq * K) @ params[f"{MHA}/out"]["w"][i].astype(np.float64)


def xrex_forward(params, x, valid, *, P, L, num_q_heads, num_kv_heads, key_size, qk_norm=True,
                 attn_logit_cap=-1.0, attn_logit_cap_method="soft_sign", primer_norm=False, rope_base=10000.0,
                 positions=None):
    """-> (trunk [B, T, D], logits [B, T-(P+L), V]) in float64. positions defaults to right-anchored."""
    h = np.asarray(x, np.float64)
    valid = np.asarray(valid, bool)
    n = params[f"{STACK}/pre_attn_norm"]["scale"].shape[0]
    pos = right_anchored(valid, P, L) if positions is None else np.asarray(positions, np.float64)
    ok = allowed(valid, P, L)
    kw = dict(Hq=num_q_heads, Hkv=num_kv_heads, K=key_size, qk_norm=qk_norm, cap_value=attn_logit_cap,
              cap_method=attn_logit_cap_method, rope_base=rope_base)
    for i in range(n):
        a = attention(rms_norm(h, params[f"{STACK}/pre_attn_norm"]["scale"][i]), i, params, ok, pos, **kw)
        if primer_norm:
            a = rms_norm(a, params[f"{STACK}/post_attn_norm"]["scale"][i])
        h = h + a
        f = gelu_tanh(rms_norm(h, params[f"{STACK}/pre_ffn_norm"]["scale"][i]) @ params[f"{STACK}/up_proj"]["w"][i])
        f = f @ params[f"{STACK}/down_proj"]["w"][i]
        if primer_norm:
            f = rms_norm(f, params[f"{STACK}/post_ffn_norm"]["scale"][i])
        h = h + f
    D = h.shape[-1]
    normed = rms_norm(h, params[f"{HEAD}/final_layer_norm"]["scale"])
    logits = normed[:, P + L:] @ params[HEAD]["unembeddings"] * (np.sqrt(512.0 / D) * 2.0)
    return h, logits
