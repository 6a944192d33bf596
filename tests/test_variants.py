"""Every variant records the trunk's instrumentation, and each one computes what it claims. Two groupings
of the same sums agree within the rounding bound of tests/tolerances.py; causality is bit-exact."""
import pytest
import torch

from models.probes import run_probe
from models.variants import (VARIANTS, VariantConfig, attention_core, build_variant, parameter_count, parameter_table,
                             variant_inputs)
from tolerances import assert_bit_exact, assert_rounding_close, forward_bound, relative_error, rounding_bound

C = VariantConfig(emb_size=32, num_heads=4, num_kv_heads=2, num_layers=2, latent_dim=8)
# two computations of the same real numbers (another grouping, another batch): within fp32's rounding bound
TOL = forward_bound(C.num_layers, C.emb_size, int(C.emb_size * C.widening_factor), 16)


def run(name, config=C, seed=0, **kw):
    model = build_variant(name, config, seed)
    inputs = variant_inputs(name, config, seed, **kw)
    return model, inputs, model(**inputs, record=True)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_records_probs_per_layer(name):
    model, inputs, out = run(name, batch=2, seq_len=6)
    B, T = inputs["embeddings"].shape[:2]
    Tq = inputs["candidates"].shape[1] if "candidates" in inputs else T
    Tk = inputs["memory"].shape[1] if "memory" in inputs else T
    assert out.embeddings.shape == (B, Tq, C.emb_size)
    assert len(out.layers) == (1 if name == "din-target-attention" else C.num_layers)
    for trace in out.layers:
        assert trace.probs.shape == (B, C.num_heads, Tq, Tk)
        if name != "talking-heads":          # heads mix after the softmax there
            assert_rounding_close(trace.probs.sum(-1), torch.ones(B, C.num_heads, Tq), n=Tk)
    assert model(**inputs).layers is None    # record=False records nothing


def test_cross_attention_maps_are_non_square():
    _, inputs, out = run("encoder-decoder", seq_len=3, source_len=7)
    assert out.layers[0].probs.shape[-2:] == (3, 7)
    assert out.layers[0].self_probs.shape[-2:] == (3, 3)


@pytest.mark.parametrize("name, causal", [("mha", True), ("mla", True), ("encoder-pre-ln", False),
                                          ("encoder-post-ln", False)])
def test_decoders_are_causal_encoders_are_not(name, causal):
    model, inputs, out = run(name)
    x = inputs["embeddings"].clone()
    x[:, -1] += torch.randn(x[:, -1].shape, generator=torch.Generator().manual_seed(9))  # only the last position
    earlier = model(x).embeddings[:, :-1]
    if causal:                                           # bit-exact: the last row enters no earlier row's sums
        assert_bit_exact(earlier, out.embeddings[:, :-1], "isolation")
    else:
        assert relative_error(earlier, out.embeddings[:, :-1]) > TOL


@pytest.mark.parametrize("name", ["mqa", "gqa", "talking-heads", "encoder-post-ln"])
def test_trunk_probes_run_on_variants(name):
    model, inputs, _ = run(name, batch=2)
    flagged = run_probe("causality", model, inputs["embeddings"], inputs["mask"]).flagged
    assert flagged == name.startswith("encoder")


def test_grouped_gqa_equals_repeat_interleave_gqa():
    """notebook 002's two GQAs: same weights, same numbers; only the memory differs."""
    grouped, inputs, out = run("gqa")
    repeated = build_variant("gqa-repeat", C, seed=1)
    repeated.load_state_dict(grouped.state_dict())
    out_r = repeated(**inputs, record=True)
    assert relative_error(out_r.embeddings, out.embeddings) <= TOL
    assert relative_error(out_r.layers[1].probs, out.layers[1].probs) <= TOL


def test_core_grouping_is_head_to_group_by_integer_division():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 6, 8, generator=g), torch.randn(2, 7, 2, 8, generator=g),
               torch.randn(2, 7, 2, 8, generator=g))
    out, probs, _ = attention_core(q, k, v, scale=0.3)
    for h in range(6):                                   # query head h reads KV head h // 3
        p = torch.softmax(torch.einsum("btd,bsd->bts", q[:, :, h], k[:, :, h // 3]) * 0.3, -1)
        assert_rounding_close(probs[:, h], p, n=8, depth=2)                   # q.k, softmax sum
        assert_rounding_close(out[:, :, h], p @ v[:, :, h // 3], n=8, depth=3)  # and probs @ v


def test_mha_is_gqa_with_as_many_kv_heads_and_talking_heads_at_identity_is_mha():
    full = C.replace(num_kv_heads=C.num_heads)
    mha, inputs, out = run("mha", full)
    for other in ("gqa", "talking-heads"):
        m = build_variant(other, full, seed=3)
        state = mha.state_dict()
        if other == "talking-heads":
            state = {**state, **{k: torch.eye(C.num_heads) for k in m.state_dict() if "mix_" in k}}
        m.load_state_dict(state)
        assert relative_error(m(**inputs).embeddings, out.embeddings) <= TOL


def test_mla_keys_live_in_a_latent_of_latent_dim():
    model = build_variant("mla", C)
    att = model.layers[0].attention
    keys = att.key_up(att.kv_down(torch.randn(50, C.emb_size)))            # [50, H*K]
    assert torch.linalg.matrix_rank(keys) == C.latent_dim
    assert att.kv_cache_per_token() == C.latent_dim
    bigger = parameter_count(build_variant("mla", C.replace(latent_dim=16)))
    assert bigger > parameter_count(model)


def test_parameter_table_orders_kv_sharing():
    rows = {r["variant"]: r for r in parameter_table(C)}
    assert rows["mqa"]["attention_parameters"] < rows["gqa"]["attention_parameters"] < rows["mha"]["attention_parameters"]
    assert rows["mqa"]["kv_cache_per_token"] < rows["gqa"]["kv_cache_per_token"] < rows["mha"]["kv_cache_per_token"]
    assert rows["gqa"]["parameters"] == rows["gqa-repeat"]["parameters"]
    for name, row in rows.items():
        assert row["parameters"] == parameter_count(build_variant(name, C))


@pytest.mark.parametrize("ffn", ["relu", "gelu", "swiglu"])
def test_ffn_kinds_have_about_the_same_size(ffn):
    """SwiGLU's 2/3 hidden rule keeps the parameter count of the ReLU/GELU FFN (within 5%)."""
    base = parameter_count(build_variant("encoder-pre-ln", C.replace(ffn="relu")))
    assert abs(parameter_count(build_variant("encoder-pre-ln", C.replace(ffn=ffn))) - base) / base < 0.05


def test_post_ln_normalises_the_stream_pre_ln_does_not():
    for name, normalised in (("encoder-post-ln", True), ("encoder-pre-ln", False)):
        h = run(name)[2].embeddings
        is_normed = h.mean(-1).abs().max() <= rounding_bound(torch.float32, C.emb_size, depth=2) * h.abs().max()
        assert is_normed == normalised


def test_din_ignores_padding_and_other_candidates():
    model, inputs, out = run("din-target-attention", batch=2, seq_len=6)
    mask = inputs["mask"].clone()
    mask[:, 4:] = False
    padded = model(inputs["embeddings"], mask, candidates=inputs["candidates"], record=True)
    hidden = padded.layers[0].probs[..., 4:]
    assert_bit_exact(hidden, torch.zeros_like(hidden), "isolation")        # padded keys: exactly 0
    single = model(inputs["embeddings"], mask, candidates=inputs["candidates"][:, 1:2])
    assert relative_error(single.embeddings[:, 0], padded.embeddings[:, 1]) <= TOL


@pytest.mark.parametrize("changes, field", [(dict(num_heads=3), "num_heads"), (dict(num_kv_heads=3), "num_kv_heads"),
                                            (dict(ffn="tanh"), "ffn"), (dict(latent_dim=0), "latent_dim"),
                                            (dict(widening_factor=-1.0), "widening_factor")])
def test_bad_config_names_the_field(changes, field):
    with pytest.raises(ValueError, match=f"^{field}: got"):
        C.replace(**changes)


def test_unknown_variant_lists_the_allowed():
    with pytest.raises(ValueError, match="variant: got 'gpt'; allowed: mha, mqa"):
        build_variant("gpt")
