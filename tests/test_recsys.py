"""The ranking model around the trunk: same logits as an independent NumPy recsys_model.py,
batch invariance under shared / no RoPE, and the retrieval tower's contract."""
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import reference_numpy as ref
from models.recsys import (PRESETS, RecsysModel, RetrievalUserTower, SequenceLayout, get_preset, init_recsys,
                           synthetic_batch)
from models.weights import haiku_params, load_haiku_params


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


def batch_arrays(batch):
    return [t.numpy() for t in (batch.user_hashes, batch.history_post_hashes, batch.history_author_hashes,
                                batch.history_actions, batch.history_product_surface,
                                batch.candidate_post_hashes, batch.candidate_author_hashes,
                                batch.candidate_product_surface)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("prefix", ["causal", "bidirectional"])
def test_logits_match_numpy_reference(seed, prefix):
    layout = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
    model, params, _ = ranker(seed, layout, prefix=prefix)
    batch = synthetic_batch(model.config, layout, seed=seed, batch=2)
    with torch.no_grad():
        out = model(batch)
    emb, valid, off = ref.recsys_embed(params, *batch_arrays(batch))
    assert off == out.candidate_start_offset
    np.testing.assert_array_equal(valid, out.valid.numpy())
    t = model.config.transformer
    trunk = ref.transformer_forward(params, emb, valid, off, num_q_heads=t.num_q_heads,
                                    num_kv_heads=t.num_kv_heads, key_size=t.key_size,
                                    attn_output_multiplier=t.attn_output_multiplier, prefix=prefix)
    expected = ref.recsys_logits(params, trunk, off)                       # [B, C, A]
    cand_valid = valid[:, off:]
    assert ref.relative_error(out.embeddings.numpy(), emb, valid) <= 2e-6
    assert ref.relative_error(out.logits.numpy(), expected, cand_valid) <= 2e-5


def permuted_scores(model, layout, perm):
    batch = synthetic_batch(model.config, layout, seed=3, batch=2)
    with torch.no_grad():
        base = model(batch).logits
        moved = model(batch.select_candidates(perm)).logits
    return base[:, perm], moved


@pytest.mark.parametrize("rope_mode", ["shared", "none"])
def test_shared_or_no_rope_scores_invariant_to_candidate_order(rope_mode):
    model, _, layout = ranker(0, rope_mode=rope_mode)
    expected, got = permuted_scores(model, layout, torch.tensor([2, 0, 1]))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_sequential_rope_scores_depend_on_candidate_order():
    model, _, layout = ranker(0, rope_mode="sequential")
    expected, got = permuted_scores(model, layout, torch.tensor([2, 0, 1]))
    assert (got - expected).abs().max() > 1e-3


def test_candidate_scores_isolated():
    """Changing one candidate's post hashes changes its logits and no other candidate's."""
    model, _, layout = ranker(1)
    batch = synthetic_batch(model.config, layout, seed=4)
    changed = synthetic_batch(model.config, layout, seed=4)
    changed.candidate_post_hashes[:, 1] = (changed.candidate_post_hashes[:, 1] + 7) % 1000 + 1
    with torch.no_grad():
        a, b = model(batch).logits, model(changed).logits
    assert torch.equal(a[:, [0, 2]], b[:, [0, 2]])
    assert not torch.equal(a[:, 1], b[:, 1])


def test_retrieval_tower_unit_norm_and_independent_of_candidates():
    model, _, layout = ranker(2)
    tower = RetrievalUserTower(model)
    batch = synthetic_batch(model.config, layout, seed=5, batch=3)
    fresh = synthetic_batch(model.config, SequenceLayout(1, 5, 7), seed=9, batch=3)
    other = replace(batch, candidate_post_hashes=fresh.candidate_post_hashes,        # 7 other candidates
                    candidate_author_hashes=fresh.candidate_author_hashes,
                    candidate_product_surface=fresh.candidate_product_surface)
    with torch.no_grad():
        u, v = tower(batch), tower(other)
    torch.testing.assert_close(u.norm(dim=-1), torch.ones(3), rtol=0, atol=1e-6)
    assert torch.equal(u, v)
    history_changed = synthetic_batch(model.config, layout, seed=6, batch=3)
    assert not torch.allclose(tower(history_changed), u, atol=1e-3)


def test_padding_from_zero_hashes_matches_layout():
    layout = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
    model, _, _ = ranker(0, layout)
    batch = synthetic_batch(model.config, layout, seed=0, batch=2)
    _, valid, off = model.embed(batch)
    assert off == layout.candidate_start_offset
    assert torch.equal(valid, layout.valid().expand(2, -1))


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_scale_by_key_size(name):
    t = PRESETS[name].transformer
    assert t.attn_output_multiplier == pytest.approx(1 / math.sqrt(t.key_size))
    assert PRESETS[name].layout.candidate_start_offset == 1 + PRESETS[name].layout.num_history


def test_bad_recsys_inputs():
    with pytest.raises(ValueError, match="preset: got 'huge'; allowed: lecture, lecture-003"):
        get_preset("huge")
    with pytest.raises(ValueError, match=r"history_padding: got 7; allowed: 0\.\.5"):
        SequenceLayout(1, 5, 3, history_padding=7)
    model, _, _ = ranker(0)
    with pytest.raises(ValueError, match=r"num_user: got 2; allowed: 1"):
        synthetic_batch(model.config, SequenceLayout(2, 5, 3))
