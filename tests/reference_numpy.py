"""An independent NumPy forward of phoenix grok.py, recsys_model.py and recsys_retrieval_model.py,
written from docs/originals.md.

Imports nothing from models/: it reads the same haiku ``{module_path: {param_name: array}}``
mapping the port loads through ``load_haiku_params`` and computes in float64, so agreement with
the PyTorch model run in float64 (to float64 rounding, ~1e-12) means the port computes grok.py's function,
not merely its own.
"""
from __future__ import annotations

import numpy as np

MASK_VALUE = -1e30
CANDIDATE_TOWER = "phoenix_retrieval_model/~build_candidate_representation/candidate_tower"


def ffn_size(emb_size, widening_factor, multiple_of=8):
    r = int(widening_factor * emb_size) * 2 // 3
    return r + (multiple_of - r) % multiple_of


def random_haiku_params(rng, emb_size, key_size, num_q_heads, num_kv_heads, num_layers, ffn_hidden):
    """Random weights and random (non-unit) norm scales under grok.py's haiku paths."""
    D, K, F = emb_size, key_size, ffn_hidden

    def w(fan_in, fan_out):
        return {"w": rng.normal(0.0, 1.0 / np.sqrt(fan_in), (fan_in, fan_out)).astype(np.float32)}

    params = {}
    for i in range(num_layers):
        p = f"transformer/decoder_layer_{i}"
        for norm in ("rms_norm", "rms_norm_1", "rms_norm_2", "rms_norm_3"):
            params[f"{p}/{norm}"] = {"scale": rng.normal(1.0, 0.5, (D,)).astype(np.float32)}
        params[f"{p}/multi_head_attention/query"] = w(D, num_q_heads * K)
        params[f"{p}/multi_head_attention/key"] = w(D, num_kv_heads * K)
        params[f"{p}/multi_head_attention/value"] = w(D, num_kv_heads * K)
        params[f"{p}/multi_head_attention/linear"] = w(num_q_heads * K, D)
        params[f"{p}/linear"] = w(D, F)
        params[f"{p}/linear_v"] = w(D, F)
        params[f"{p}/linear_1"] = w(F, D)
    return params


def phoenix_init_params(rng, model, *, emb_size, key_size, num_q_heads, num_kv_heads, num_layers, ffn_hidden,
                        num_actions=19, product_surface_vocab_size=16, num_user_hashes=2, num_item_hashes=2,
                        num_author_hashes=2):
    """What the original's ``hk.transform(forward).init`` returns, names and shapes written out from
    docs/originals.md §2 (random values): model "phoenix_model" (recsys_model.py's ranker) or
    "phoenix_retrieval_model" (recsys_retrieval_model.py). No hash tables: the original keeps none."""
    D = emb_size
    params = random_haiku_params(rng, D, key_size, num_q_heads, num_kv_heads, num_layers, ffn_hidden)

    def w(fan_in, fan_out):
        return rng.normal(0.0, 1.0 / np.sqrt(fan_in), (fan_in, fan_out)).astype(np.float32)

    items = (num_item_hashes + num_author_hashes) * D
    own = {"proj_mat_1": w(num_user_hashes * D, D), "proj_mat_3": w(items + 2 * D, D),
           "action_projection": w(num_actions, D), "product_surface_embedding_table": w(product_surface_vocab_size, D)}
    if model == "phoenix_model":
        params["phoenix_model"] = {**own, "proj_mat_2": w(items + D, D), "unembeddings": w(D, num_actions)}
        params["phoenix_model/rms_norm"] = {"scale": rng.normal(1.0, 0.5, (D,)).astype(np.float32)}
    elif model == "phoenix_retrieval_model":
        params["phoenix_retrieval_model"] = own
        # haiku names a submodule made in a method other than __call__ "parent/~method/child"; the original
        # makes its CandidateTower in build_candidate_representation
        params[CANDIDATE_TOWER] = {"candidate_tower_projection_1": w(items, 2 * D),
                                   "candidate_tower_projection_2": w(2 * D, D)}
    else:
        raise AssertionError(model)
    return params


# --- building blocks ----------------------------------------------------------------------

def rms_norm(x, scale, eps=1e-5):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def rope(x, positions, base=10000.0):
    """x [B, T, H, K]; positions [T]. Halves, not interleaved pairs."""
    K = x.shape[-1]
    inv_freq = 1.0 / base ** (np.arange(0, K, 2, dtype=np.float64) / K)     # [K/2]
    phase = positions[:, None].astype(np.float64) * inv_freq[None, :]       # [T, K/2]
    phase = np.concatenate([phase, phase], axis=-1)[None, :, None, :]        # [1, T, 1, K]
    x1, x2 = x[..., : K // 2], x[..., K // 2:]
    rotated = np.concatenate([-x2, x1], axis=-1)
    return x * np.cos(phase) + rotated * np.sin(phase)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def cap_logits(x, cap, method):
    if method == "none" or cap <= 0:
        return x
    if method == "tanh":
        return cap * np.tanh(x / cap)
    if method == "soft_sign":
        return x / (1.0 + np.abs(x) / cap)
    raise AssertionError(method)


def structure_mask(seq_len, candidate_start_offset=None, prefix="causal"):
    """[T, T] bool. grok.py: tril; with an offset zero the candidate block, then set its diagonal.
    Production phoenix opens the prefix block both ways."""
    m = np.tril(np.ones((seq_len, seq_len), dtype=bool))
    if candidate_start_offset is None:
        return m
    off = candidate_start_offset
    if prefix == "bidirectional":
        m[:off, :off] = True
    m[off:, off:] = False
    idx = np.arange(off, seq_len)
    m[idx, idx] = True
    return m


def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


# --- the trunk ------------------------------------------------------------------------------

def transformer_forward(params, embeddings, valid, candidate_start_offset=None, *, num_q_heads, num_kv_heads,
                        key_size, attn_output_multiplier, logit_cap=30.0, cap_method="tanh", prefix="causal",
                        positions="sequential", rope_base=10000.0, eps=1e-5, structure=None):
    """embeddings [B, T, D]; valid [B, T] bool; positions: "sequential" | "none" | array [T].
    structure: optional [T, T] bool overriding the recsys/causal choice. Returns [B, T, D] float64."""
    h = np.asarray(embeddings, dtype=np.float64)
    B, T, D = h.shape
    Hq, Hkv, K = num_q_heads, num_kv_heads, key_size
    G = Hq // Hkv
    if structure is None:
        structure = structure_mask(T, candidate_start_offset, prefix)
    allowed = structure[None, None, None] & np.asarray(valid, bool)[:, None, None, None, :]  # [B, 1, 1, T, S]
    if isinstance(positions, str):
        positions = None if positions == "none" else np.arange(T)
    num_layers = len({k.split("/")[1] for k in params if k.startswith("transformer/decoder_layer_")})

    def p(path, name="w"):
        return np.asarray(params[path][name], dtype=np.float64)

    for i in range(num_layers):
        pre = f"transformer/decoder_layer_{i}"
        x = rms_norm(h, p(f"{pre}/rms_norm", "scale"), eps)
        q = (x @ p(f"{pre}/multi_head_attention/query")).reshape(B, T, Hq, K)
        k = (x @ p(f"{pre}/multi_head_attention/key")).reshape(B, T, Hkv, K)
        v = (x @ p(f"{pre}/multi_head_attention/value")).reshape(B, T, Hkv, K)
        if positions is not None:
            q, k = rope(q, positions, rope_base), rope(k, positions, rope_base)
        q = q.reshape(B, T, Hkv, G, K)                                    # query head h -> kv head h // G
        logits = np.einsum("bthgd,bshd->bhgts", q, k) * attn_output_multiplier
        logits = cap_logits(logits, logit_cap, cap_method)
        logits = np.where(allowed, logits, MASK_VALUE)
        probs = softmax(logits)
        attn = np.einsum("bhgts,bshd->bthgd", probs, v).reshape(B, T, Hq * K)
        attn = attn @ p(f"{pre}/multi_head_attention/linear")
        h = h + rms_norm(attn, p(f"{pre}/rms_norm_1", "scale"), eps)

        x = rms_norm(h, p(f"{pre}/rms_norm_2", "scale"), eps)
        dense = (gelu_tanh(x @ p(f"{pre}/linear")) * (x @ p(f"{pre}/linear_v"))) @ p(f"{pre}/linear_1")
        h = h + rms_norm(dense, p(f"{pre}/rms_norm_3", "scale"), eps)
    return h


# --- the ranking model (recsys_model.py, docs/originals.md §2) -----------------------------------------
# The original takes the hash embeddings already looked up: `emb` is a dict with its five
# RecsysEmbeddings fields. Its own parameters sit directly under its module (`root`).

def lookup(params, user_hashes, hist_post, hist_author, cand_post, cand_author):
    """The project's own hash tables -> the five embedding arrays the original takes from outside."""
    def table(name):
        return np.asarray(params["hash_tables"][f"{name}_embeddings"], dtype=np.float64)
    user, post, author = table("user"), table("post"), table("author")
    return {"user_embeddings": user[user_hashes], "history_post_embeddings": post[hist_post],
            "candidate_post_embeddings": post[cand_post], "history_author_embeddings": author[hist_author],
            "candidate_author_embeddings": author[cand_author]}


def _one_hot_lookup(table, index):
    """jax.nn.one_hot(index, V) @ table: an index outside [0, V) gives a zero row."""
    return (np.asarray(index)[..., None] == np.arange(table.shape[0])).astype(np.float64) @ table


def _user_and_history(params, root, user_hashes, hist_post, hist_actions, hist_surface, emb, num_user_tokens):
    def own(name):
        return np.asarray(params[root][name], dtype=np.float64)
    f64 = {k: np.asarray(v, dtype=np.float64) for k, v in emb.items()}
    B, S = hist_post.shape[:2]
    D = own("proj_mat_3").shape[1]
    user = (f64["user_embeddings"].reshape(B, 1, -1) @ own("proj_mat_1")).reshape(B, num_user_tokens, D)
    actions = np.asarray(hist_actions, dtype=np.float64)
    action_emb = ((2 * actions - 1) @ own("action_projection")) * actions.any(-1, keepdims=True)
    history = np.concatenate([f64["history_post_embeddings"].reshape(B, S, -1),
                              f64["history_author_embeddings"].reshape(B, S, -1), action_emb,
                              _one_hot_lookup(own("product_surface_embedding_table"), hist_surface)],
                             axis=-1) @ own("proj_mat_3")
    valid = np.concatenate([np.repeat(user_hashes[:, :1] != 0, num_user_tokens, axis=1), hist_post[:, :, 0] != 0],
                           axis=1)
    return np.concatenate([user, history], axis=1), valid, f64


def recsys_embed(params, user_hashes, hist_post, hist_author, hist_actions, hist_surface,
                 cand_post, cand_author, cand_surface, emb=None, *, num_user_tokens=1):
    """-> (trunk input [B, T, D], valid [B, T], candidate_start_offset). Hash 0 = empty slot.
    emb None: looked up in the project's hash tables."""
    if emb is None:
        emb = lookup(params, user_hashes, hist_post, hist_author, cand_post, cand_author)
    prefix, prefix_valid, f64 = _user_and_history(params, "phoenix_model", user_hashes, hist_post, hist_actions,
                                                  hist_surface, emb, num_user_tokens)
    B, C = cand_post.shape[:2]
    surface = np.asarray(params["phoenix_model"]["product_surface_embedding_table"], dtype=np.float64)
    cand = np.concatenate([f64["candidate_post_embeddings"].reshape(B, C, -1),
                           f64["candidate_author_embeddings"].reshape(B, C, -1),
                           _one_hot_lookup(surface, cand_surface)], axis=-1) @ np.asarray(
        params["phoenix_model"]["proj_mat_2"], dtype=np.float64)
    valid = np.concatenate([prefix_valid, cand_post[:, :, 0] != 0], axis=1)
    return np.concatenate([prefix, cand], axis=1), valid, prefix.shape[1]


def recsys_logits(params, trunk_out, candidate_start_offset, eps=1e-5):
    """rms_norm(trunk)[:, offset:] @ unembeddings -> [B, C, num_actions]."""
    scale = np.asarray(params["phoenix_model/rms_norm"]["scale"], dtype=np.float64)
    unembeddings = np.asarray(params["phoenix_model"]["unembeddings"], dtype=np.float64)
    return rms_norm(trunk_out, scale, eps)[:, candidate_start_offset:] @ unembeddings


# --- the retrieval model (recsys_retrieval_model.py, docs/originals.md §2) -------------------------------

def l2_normalise(x, eps=1e-12):
    """-> (x / norm, norm) with norm = sqrt(max(sum(x^2), eps))."""
    norm = np.sqrt(np.maximum((x * x).sum(-1, keepdims=True), eps))
    return x / norm, norm


def retrieval_user(params, user_hashes, hist_post, hist_actions, hist_surface, emb, *, num_user_tokens=1,
                   **trunk):
    """User tower: the trunk in causal mode over user + history, the RAW output (no final norm)
    mean-pooled over valid tokens, then L2. -> (representation [B, D], norm [B, 1])."""
    x, valid, _ = _user_and_history(params, "phoenix_retrieval_model", user_hashes, hist_post, hist_actions,
                                    hist_surface, emb, num_user_tokens)
    out = transformer_forward(params, x, valid, None, **trunk)
    w = valid[..., None].astype(np.float64)
    pooled = (out * w).sum(1) / np.maximum(w.sum(1), 1.0)
    return l2_normalise(pooled)


def retrieval_candidates(params, cand_post_emb, cand_author_emb):
    """Candidate tower: concat(post, author hash embeddings) -> @ W1 [., 2D] -> SiLU -> @ W2 [2D, D] -> L2."""
    tower = params[CANDIDATE_TOWER]
    B, C = cand_post_emb.shape[:2]
    x = np.concatenate([np.asarray(cand_post_emb, np.float64).reshape(B, C, -1),
                        np.asarray(cand_author_emb, np.float64).reshape(B, C, -1)], axis=-1)
    hidden = x @ np.asarray(tower["candidate_tower_projection_1"], np.float64)
    hidden = hidden / (1.0 + np.exp(-hidden))                                   # SiLU
    return l2_normalise(hidden @ np.asarray(tower["candidate_tower_projection_2"], np.float64))[0]
