"""The original's models around the trunk: the ranker and the retrieval model give the same numbers
as an independent float64 NumPy recsys_model.py / recsys_retrieval_model.py on parameters named and shaped
as the original's init returns them, with embeddings given from outside or looked up in the project's
tables; batch invariance under shared / no RoPE; the retrieval towers' contracts. Parity runs the models in
float64 end to end, within the float64 rounding bound (a planted 1e-5 error fails it), plus one float32 run
within the float32 bound (what the page runs). Parity and invariance are exact in real arithmetic (within
the rounding bound of tests/tolerances.py); isolation and lookups are bit-exact by construction
(assert_bit_exact)."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import reference_numpy as ref
from models.recsys import (ACTIONS, PhoenixRetrievalModel, RecsysConfig, RecsysEmbeddings, RecsysModel, SequenceLayout,
                           init_recsys, synthetic_batch)
from models.grok import Linear, RMSNorm, RotaryEmbedding
from models.presets import get_preset
from models.weights import haiku_params, load_haiku_params
from tolerances import (PARITY_RTOL, assert_beyond_rounding, assert_bit_exact, assert_rounding_close, forward_bound,
                        relative_error, rounding_bound)


def ranker(seed=0, layout=None, **transformer_changes):
    preset = get_preset("lecture")
    cfg = preset.recsys_config(preset.transformer.replace(**transformer_changes))
    model = init_recsys(RecsysModel(cfg), "random", seed)
    # random (non-unit) norm scales so the reference has to get every norm right
    params = haiku_params(model)
    rng = np.random.default_rng(seed)
    for module, inner in params.items():
        if "scale" in inner:
            inner["scale"] = rng.normal(1.0, 0.5, inner["scale"].shape).astype(np.float32)
    return load_haiku_params(model, params), params, layout or preset.layout


def embed_tolerance(model, dtype=torch.float32):
    """Rounding bound of the embedding stage: the action projection, then the widest input projection."""
    widest = max(m.w.shape[0] for m in model.modules() if isinstance(m, Linear))
    return rounding_bound(dtype, widest, depth=2)


def tolerance(model, T=None, dtype=torch.float32):
    """Rounding bound of embeddings -> trunk -> logits on T positions (LAYOUT's by default): the stages add.
    A float64 bound (parity with the float64 reference) stays within PARITY_RTOL."""
    t = model.config.transformer
    bound = embed_tolerance(model, dtype) + forward_bound(t.num_layers, t.emb_size, t.ffn_hidden,
                                                          T or LAYOUT.seq_len, dtype=dtype)
    assert dtype != torch.float64 or bound <= PARITY_RTOL, bound
    return bound


def batch_arrays(batch):
    return [t.numpy() for t in (batch.user_hashes, batch.history_post_hashes, batch.history_author_hashes,
                                batch.history_actions, batch.history_product_surface,
                                batch.candidate_post_hashes, batch.candidate_author_hashes,
                                batch.candidate_product_surface)]


def ranker_errors(model, params, batch):
    """(embeddings, logits) relative errors of `model` (in its own dtype) against the NumPy ranker on the
    model's own hash tables, with the settings of model.config."""
    with torch.no_grad():
        out = model(batch)
    emb, valid, off = ref.recsys_embed(params, *batch_arrays(batch))
    assert off == out.candidate_start_offset
    np.testing.assert_array_equal(valid, out.valid.numpy())
    t = model.config.transformer
    kw = dict(attn_output_multiplier=t.attn_output_multiplier, logit_cap=t.logit_cap, cap_method=t.cap_method,
              prefix=t.prefix, rope_base=t.rope_base, eps=t.norm_eps)
    trunk = ref.transformer_forward(params, emb, valid, off, num_q_heads=t.num_q_heads,
                                    num_kv_heads=t.num_kv_heads, key_size=t.key_size, **kw)
    expected = ref.recsys_logits(params, trunk, off, eps=t.norm_eps)                           # [B, C, A]
    return relative_error(out.embeddings, emb, valid), relative_error(out.logits, expected, valid[:, off:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("prefix", ["causal", "bidirectional"])
def test_logits_match_numpy_reference(seed, prefix, dtype):
    """float64: the port's function, to float64 rounding; float32 (what the page runs): to float32 rounding."""
    layout = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
    model, params, _ = ranker(seed, layout, prefix=prefix)
    batch = synthetic_batch(model.config, layout, seed=seed, batch=2)
    emb_err, logit_err = ranker_errors(model.to(dtype), params, batch)
    assert emb_err <= embed_tolerance(model, dtype)
    assert logit_err <= tolerance(model, dtype=dtype)


def planted(model, what):
    """`model` with one constant off by ~1e-5 relative (the reference keeps the true value)."""
    t = model.config.transformer
    if what == "logit scale * (1 + 1e-5)":
        for layer in model.transformer.layers:
            mha = layer.multi_head_attention
            mha.config = mha.config.replace(attn_output_multiplier=t.attn_output_multiplier * (1 + 1e-5))
    elif what == "tanh cap 30.01, not 30":
        for layer in model.transformer.layers:
            mha = layer.multi_head_attention
            mha.config = mha.config.replace(logit_cap=30.01)
    elif what == "RoPE base * (1 + 1e-5)":
        for m in model.modules():
            if isinstance(m, RotaryEmbedding):
                m.base_exponent = t.rope_base * (1 + 1e-5)
                m._inv_freq.clear()                  # its frequencies were built from the old base
    else:                                            # an eps: every RMSNorm, or the head's alone
        for m in (model.modules() if what == "RMSNorm eps 1e-4, not 1e-5" else [model.rms_norm]):
            if isinstance(m, RMSNorm):
                m.eps = 1e-4
    return model


@pytest.mark.parametrize("what", ["logit scale * (1 + 1e-5)", "RMSNorm eps 1e-4, not 1e-5", "head RMSNorm eps 1e-4",
                                  "tanh cap 30.01, not 30", "RoPE base * (1 + 1e-5)"])
def test_planted_1e5_errors_fail_ranker_parity_in_float64_only(what):
    """The ranker's parity comparison on a model with one constant off by ~1e-5 relative: in float64 the
    logits' error lands far above the rounding bound; the float32 bound would have let it pass."""
    layout = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
    model, params, _ = ranker(0, layout, logit_cap=30.0, cap_method="tanh")   # logits of a few units: cap bends them
    batch = synthetic_batch(model.config, layout, seed=0, batch=2)
    model = planted(model, what)
    assert ranker_errors(model.double(), params, batch)[1] > 1e4 * tolerance(model, dtype=torch.float64)
    assert ranker_errors(model.float(), params, batch)[1] <= tolerance(model)


# --- the original's interface: parameters from its init, embeddings from outside -------------------

LAYOUT = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
T_CFG = get_preset("lecture").transformer


def original(kind, seed, **transformer_changes):
    """A model of `kind` loaded with a mapping named and shaped as the original's init returns it."""
    t = T_CFG.replace(**transformer_changes)
    params = ref.phoenix_init_params(np.random.default_rng(seed), "phoenix_model" if kind is RecsysModel
                                     else "phoenix_retrieval_model", emb_size=t.emb_size, key_size=t.key_size,
                                     num_q_heads=t.num_q_heads, num_kv_heads=t.num_kv_heads,
                                     num_layers=t.num_layers, ffn_hidden=t.ffn_hidden)
    return load_haiku_params(kind(RecsysConfig(t)), params), params


def outside_embeddings(config, batch, seed, dtype=torch.float32):
    """Float embeddings as an outside lookup would give them (not from the model's tables): float32 values,
    as tensors of `dtype` and as the arrays the reference reads."""
    rng = np.random.default_rng(seed)
    B, S = batch.history_post_hashes.shape[:2]
    C, D = batch.candidate_post_hashes.shape[1], config.emb_size
    shapes = {"user_embeddings": (B, config.num_user_hashes, D),
              "history_post_embeddings": (B, S, config.num_item_hashes, D),
              "candidate_post_embeddings": (B, C, config.num_item_hashes, D),
              "history_author_embeddings": (B, S, config.num_author_hashes, D),
              "candidate_author_embeddings": (B, C, config.num_author_hashes, D)}
    arrays = {k: rng.normal(size=v).astype(np.float32) for k, v in shapes.items()}
    return RecsysEmbeddings(**{k: torch.from_numpy(v).to(dtype) for k, v in arrays.items()}), arrays


def original_batch(config, seed):
    batch = synthetic_batch(config, LAYOUT, seed=seed, batch=2)
    batch.history_actions[0, 1] = 0                      # an event with no action: its action embedding is 0
    batch.candidate_product_surface[1, 0] = config.num_product_surfaces   # outside the vocabulary: one_hot is 0
    return batch


def trunk_kwargs(t):
    return dict(num_q_heads=t.num_q_heads, num_kv_heads=t.num_kv_heads, key_size=t.key_size,
                attn_output_multiplier=t.attn_output_multiplier)


@pytest.mark.parametrize("seed", [0, 1])
def test_ranker_from_original_params_and_outside_embeddings_matches_reference(seed):
    model, params = original(RecsysModel, seed)
    assert model.config.num_actions == len(ACTIONS) == 19 and model.config.num_product_surfaces == 16
    batch = original_batch(model.config, seed)
    emb, arrays = outside_embeddings(model.config, batch, seed, torch.float64)
    with torch.no_grad():
        out = model.double()(batch, emb)
    x, valid, off = ref.recsys_embed(params, *batch_arrays(batch), arrays)
    np.testing.assert_array_equal(valid, out.valid.numpy())
    assert off == out.candidate_start_offset == 1 + LAYOUT.num_history
    trunk = ref.transformer_forward(params, x, valid, off, **trunk_kwargs(model.config.transformer))
    expected = ref.recsys_logits(params, trunk, off)
    assert relative_error(out.embeddings, x, valid) <= embed_tolerance(model, torch.float64)
    assert relative_error(out.logits, expected, valid[:, off:]) <= tolerance(model, dtype=torch.float64)


def test_own_tables_are_the_outside_lookup():
    """Without embeddings the model looks the hashes up itself: the same as handing it that lookup."""
    model, _, layout = ranker(3)
    batch = synthetic_batch(model.config, layout, seed=2, batch=2)
    with torch.no_grad():           # model(batch) looks up with model.lookup: the same ops, same numbers
        assert_bit_exact(model(batch).logits, model(batch, model.lookup(batch)).logits, "same computation")


@pytest.mark.parametrize("seed", [0, 1])
def test_retrieval_user_tower_matches_reference(seed):
    model, params = original(PhoenixRetrievalModel, seed)
    batch = original_batch(model.config, seed)
    emb, arrays = outside_embeddings(model.config, batch, seed, torch.float64)
    with torch.no_grad():
        rep, norm = model.double().build_user_representation(batch, emb)
    arr = batch_arrays(batch)
    expected, expected_norm = ref.retrieval_user(params, arr[0], arr[1], arr[3], arr[4], arrays,
                                                 **trunk_kwargs(model.config.transformer))
    assert rep.shape == (2, 64) and norm.shape == (2, 1)
    assert relative_error(rep, expected) <= tolerance(model, dtype=torch.float64)
    assert relative_error(norm, expected_norm) <= tolerance(model, dtype=torch.float64)
    assert_rounding_close(rep.norm(dim=-1), torch.ones(2), n=64, depth=2, dtype=torch.float64)  # re-measured


def test_retrieval_candidate_tower_matches_reference():
    model, params = original(PhoenixRetrievalModel, 2)
    batch = original_batch(model.config, 2)
    emb, arrays = outside_embeddings(model.config, batch, 2, torch.float64)
    with torch.no_grad():
        rep, valid = model.double().build_candidate_representation(batch, emb)
    expected = ref.retrieval_candidates(params, arrays["candidate_post_embeddings"],
                                        arrays["candidate_author_embeddings"])
    assert rep.shape == (2, LAYOUT.num_candidates, 64)
    np.testing.assert_array_equal(valid.numpy(), LAYOUT.valid()[LAYOUT.candidate_start_offset:].expand(2, -1))
    assert relative_error(rep, expected) <= embed_tolerance(model, torch.float64)      # two projections


def test_retrieval_user_independent_of_candidates_and_prefix_mode():
    """The user tower reads user + history only, always causally (the ranker's prefix mode aside)."""
    model, _ = original(PhoenixRetrievalModel, 4)
    bidirectional, _ = original(PhoenixRetrievalModel, 4, prefix="bidirectional")
    batch = synthetic_batch(model.config, LAYOUT, seed=5, batch=3)
    fresh = synthetic_batch(model.config, SequenceLayout(1, 6, 7), seed=9, batch=3)
    other = replace(batch, candidate_post_hashes=fresh.candidate_post_hashes,        # 7 other candidates
                    candidate_author_hashes=fresh.candidate_author_hashes,
                    candidate_product_surface=fresh.candidate_product_surface)
    init_recsys(model, "random", 0)   # give it hash tables to look up
    bidirectional.load_state_dict(model.state_dict())
    with torch.no_grad():           # neither the candidates nor the prefix mode enter the user tower
        u = model.build_user_representation(batch)[0]
        assert_bit_exact(model.build_user_representation(other)[0], u, "isolation")
        assert_bit_exact(bidirectional.build_user_representation(batch)[0], u, "isolation")
        changed = synthetic_batch(model.config, LAYOUT, seed=6, batch=3)
        assert relative_error(model.build_user_representation(changed)[0], u) > tolerance(model)


def test_outside_embeddings_of_the_wrong_shape_named():
    model, _ = original(RecsysModel, 0)
    batch = original_batch(model.config, 0)
    emb, _ = outside_embeddings(model.config, batch, 0)
    bad = replace(emb, candidate_author_embeddings=emb.candidate_author_embeddings[:, :, :1])
    with pytest.raises(ValueError, match=r"embeddings\.candidate_author_embeddings: got \[2, 4, 1, 64\]; "
                                         r"allowed: \[B, C, num_author_hashes, emb_size\] = \[2, 4, 2, 64\]"):
        model(batch, bad)
    with pytest.raises(ValueError, match=r"action_names: got \(\); allowed"):
        RecsysConfig(T_CFG, action_names=())


def permuted_scores(model, layout, perm):
    batch = synthetic_batch(model.config, layout, seed=3, batch=2)
    with torch.no_grad():
        base = model(batch).logits
        moved = model(batch.select_candidates(perm)).logits
    return base[:, perm], moved


@pytest.mark.parametrize("rope_mode", ["shared", "none"])
def test_shared_or_no_rope_scores_invariant_to_candidate_order(rope_mode):
    model, _, layout = ranker(0, rope_mode=rope_mode)
    """Exact in real arithmetic: the order changes only how fp32 sums are blocked."""
    expected, got = permuted_scores(model, layout, torch.tensor([2, 0, 1]))
    assert relative_error(got, expected) <= tolerance(model, layout.seq_len)


def test_sequential_rope_scores_depend_on_candidate_order():
    model, _, layout = ranker(0, rope_mode="sequential")
    expected, got = permuted_scores(model, layout, torch.tensor([2, 0, 1]))
    assert relative_error(got, expected) > tolerance(model, layout.seq_len)


def test_candidate_scores_isolated():
    """Changing one candidate's post hashes changes its logits and no other candidate's."""
    model, _, layout = ranker(1)
    batch = synthetic_batch(model.config, layout, seed=4)
    changed = synthetic_batch(model.config, layout, seed=4)
    changed.candidate_post_hashes[:, 1] = (changed.candidate_post_hashes[:, 1] + 7) % 1000 + 1
    with torch.no_grad():
        a, b = model(batch).logits, model(changed).logits
    assert_bit_exact(b[:, [0, 2]], a[:, [0, 2]], "isolation")
    t, widest = model.config.transformer, max(m.w.shape[0] for m in model.modules() if isinstance(m, Linear))
    # tolerance()'s stages (embedding, trunk, head) as one bound: their depths add, n the longest reduction
    assert_beyond_rounding(b[:, 1], a[:, 1], n=max(widest, t.ffn_hidden, layout.seq_len), depth=6 * t.num_layers + 3)


def test_padding_from_zero_hashes_matches_layout():
    layout = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
    model, _, _ = ranker(0, layout)
    batch = synthetic_batch(model.config, layout, seed=0, batch=2)
    _, valid, off = model.embed(batch)
    assert off == layout.candidate_start_offset
    assert torch.equal(valid, layout.valid().expand(2, -1))


def test_bad_recsys_inputs():
    with pytest.raises(ValueError, match="preset: got 'huge'; allowed: lecture, lecture-003"):
        get_preset("huge")
    with pytest.raises(ValueError, match=r"history_padding: got 7; allowed: 0\.\.5"):
        SequenceLayout(1, 5, 3, history_padding=7)
    model, _, _ = ranker(0)
    with pytest.raises(ValueError, match=r"num_user: got 2; allowed: 1"):
        synthetic_batch(model.config, SequenceLayout(2, 5, 3))
