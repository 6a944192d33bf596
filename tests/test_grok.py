"""The trunk computes grok.py's function: checked against an independent float64 NumPy forward
(tests/reference_numpy.py) on the same haiku params, the model run in float64 end to end so that the float64
rounding bound (~1e-12) applies and a planted 1e-5 error fails it, plus one float32 run within the float32
bound (what the page runs); then the properties the explorer shows. Parity, GQA against repeated heads and
RoPE's relative rotation are exact in real arithmetic (within the rounding bound of tests/tolerances.py);
candidate isolation and the zero init are bit-exact by construction (assert_bit_exact)."""
import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import reference_numpy as ref
from models.attention import naive_attention
from models.grok import (RMSNorm, RotaryEmbedding, Transformer, TransformerConfig, ffn_size, init_params,
                         truncated_normal_)
from models.masks import AttentionMask
from models.presets import get_preset
from models.recsys import PhoenixRetrievalModel, RecsysModel, init_recsys, synthetic_batch
from models.weights import load_haiku_params
from tolerances import (PARITY_RTOL, assert_beyond_rounding, assert_bit_exact, assert_rounding_close, forward_bound,
                        relative_error, rounding_bound)


def config(q=4, kv=2, **kw):
    base = dict(emb_size=64, key_size=16, num_q_heads=q, num_kv_heads=kv, num_layers=2,
                attn_output_multiplier=1 / math.sqrt(16))
    return TransformerConfig(**{**base, **kw})


def loaded(cfg, seed):
    """A Transformer and the random haiku params (random norm scales too) loaded into it."""
    rng = np.random.default_rng(seed)
    params = ref.random_haiku_params(rng, cfg.emb_size, cfg.key_size, cfg.num_q_heads, cfg.num_kv_heads,
                                     cfg.num_layers, ref.ffn_size(cfg.emb_size, cfg.widening_factor,
                                                                  cfg.ffn_multiple_of))
    return load_haiku_params(Transformer(cfg), params), params


def inputs(seed, batch=2, user=1, history=6, candidates=4):
    """Embeddings plus a padding mask with padded history and candidate slots (differing per row)."""
    rng = np.random.default_rng(1000 + seed)
    T = user + history + candidates
    x = rng.normal(0, 1, (batch, T, 64)).astype(np.float32)
    valid = np.ones((batch, T), bool)
    valid[0, user + history - 2:user + history] = False     # last two history slots empty
    valid[0, T - 1] = False                                 # last candidate empty
    valid[1 % batch, user + 1] = False                      # a hole in the middle of history
    return x, valid, user + history


def tolerance(cfg, T=11, dtype=torch.float64):
    """Rounding bound of cfg's trunk on T positions in `dtype`: exact in real arithmetic against the float64
    reference, so rounding is all that may separate them. A float64 bound stays within PARITY_RTOL."""
    bound = forward_bound(cfg.num_layers, cfg.emb_size, cfg.ffn_hidden, T, dtype=dtype)
    assert dtype != torch.float64 or bound <= PARITY_RTOL, bound
    return bound


def compare(cfg, params, model, x, valid, offset, dtype=torch.float64, **ref_kw):
    """Relative error against the NumPy reference with `model` run in `dtype` (float64: end to end), in
    units of that dtype's rounding bound (> 1: a real difference)."""
    with torch.no_grad():
        out = model.to(dtype)(torch.from_numpy(x).to(dtype), torch.from_numpy(valid), offset).embeddings
    kw = dict(num_q_heads=cfg.num_q_heads, num_kv_heads=cfg.num_kv_heads, key_size=cfg.key_size,
              attn_output_multiplier=cfg.attn_output_multiplier, logit_cap=cfg.logit_cap,
              cap_method=cfg.cap_method, prefix=cfg.prefix, rope_base=cfg.rope_base, eps=cfg.norm_eps)
    expected = ref.transformer_forward(params, x, valid, offset, **{**kw, **ref_kw})
    return relative_error(out, expected, valid) / tolerance(cfg, x.shape[1], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["causal", "recsys"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 1), (2, 2)])
def test_matches_numpy_reference(heads, mode, seed, dtype):
    """float64: the port's function, to float64 rounding; float32 (what the page runs): to float32 rounding."""
    cfg = config(*heads)
    model, params = loaded(cfg, seed)
    x, valid, offset = inputs(seed)
    assert compare(cfg, params, model, x, valid, offset if mode == "recsys" else None, dtype) <= 1


VARIANTS = {
    # name: (config changes, reference keyword arguments given the offset and T)
    "grok default multiplier 1.0": (dict(attn_output_multiplier=1.0), {}),
    "bidirectional prefix": (dict(prefix="bidirectional"), {}),
    "tanh cap 2 (it bites)": (dict(logit_cap=2.0), {}),
    "soft_sign cap 2": (dict(cap_method="soft_sign", logit_cap=2.0), {}),
    "cap off (method none)": (dict(cap_method="none"), {}),
    "cap off (cap 0)": (dict(logit_cap=0.0), {}),
    "rope none": (dict(rope_mode="none"), {"positions": "none"}),
    "rope shared": (dict(rope_mode="shared"),
                    {"positions": lambda off, T: np.minimum(np.arange(T), off)}),
    "rope offset 5": (dict(rope_offset=5), {"positions": lambda off, T: np.arange(T) + 5}),
    "rope base 500": (dict(rope_base=500.0), {}),
    "ffn multiple_of 256, widening 2": (dict(ffn_multiple_of=256, widening_factor=2.0), {}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_match_numpy_reference(name):
    changes, ref_kw = VARIANTS[name]
    cfg = config(4, 2, **changes)
    model, params = loaded(cfg, seed=7)
    x, valid, offset = inputs(7)
    if callable(ref_kw.get("positions")):
        ref_kw = {"positions": ref_kw["positions"](offset, x.shape[1])}
    assert compare(cfg, params, model, x, valid, offset, **ref_kw) <= 1


@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 12),
                    reason="torch's own trunc_normal_ drew by an inverse CDF before 2.12")
@pytest.mark.parametrize("seed", range(4))
def test_truncated_normal_draws_what_torchs_trunc_normal_draws(seed):
    """models.grok.truncated_normal_ is torch.nn.init.trunc_normal_(t, 0, 1, -2, 2) of torch >= 2.12 in the repo
    (so that torch 2.11 draws the same weights): the same bits for tensors under and over the 16 values torch's
    vectorised normal_ fills at once, and the generator left where torch leaves it (the next parameter's draws)."""
    ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for shape in [(1,), (5,), (16,), (33, 65), (257, 1031)]:
        a, b = torch.empty(shape), torch.empty(shape)
        truncated_normal_(a, ours)
        torch.nn.init.trunc_normal_(b, 0.0, 1.0, -2.0, 2.0, generator=theirs)
        assert_bit_exact(a, b, "same computation", shape)
        assert a.abs().max() <= 2.0
    assert_bit_exact(torch.randn(64, generator=ours), torch.randn(64, generator=theirs), "same computation")


def test_reference_comparison_can_fail():
    """The reference notices a double 1/sqrt(K), the wrong prefix, a cap that is not applied."""
    cfg = config(4, 2)
    model, params = loaded(cfg, seed=3)
    x, valid, offset = inputs(3)
    wrong = config(4, 2, attn_output_multiplier=cfg.attn_output_multiplier / math.sqrt(16))
    assert compare(cfg, params, load_haiku_params(Transformer(wrong), params), x, valid, offset) > 1
    assert compare(cfg, params, model, x, valid, offset, prefix="bidirectional") > 1
    capped = config(4, 2, logit_cap=2.0)
    assert compare(capped, params, load_haiku_params(Transformer(capped), params), x, valid, offset,
                   cap_method="none") > 1


# a relative error of ~1e-5 planted in one constant of the model, the reference keeping the true value:
# name -> the config of both. Cap 30 on logits of a few units: tanh bends them by ~(s/30)^3, so the cap's
# value matters a little.
PLANTS = {"logit scale * (1 + 1e-5)": {}, "RMSNorm eps 1e-4, not 1e-5": {},
          "tanh cap 30.01, not 30": dict(logit_cap=30.0, cap_method="tanh"), "RoPE base * (1 + 1e-5)": {}}


def planted(what, cfg, params):
    """A Transformer with `params` and the plant `what`."""
    if what == "logit scale * (1 + 1e-5)":
        cfg = cfg.replace(attn_output_multiplier=cfg.attn_output_multiplier * (1 + 1e-5))
    elif what == "tanh cap 30.01, not 30":
        cfg = cfg.replace(logit_cap=30.01)
    model = load_haiku_params(Transformer(cfg), params)
    for m in model.modules():
        if what == "RMSNorm eps 1e-4, not 1e-5" and isinstance(m, RMSNorm):
            m.eps = 1e-4
        if what == "RoPE base * (1 + 1e-5)" and isinstance(m, RotaryEmbedding):
            m.base_exponent = cfg.rope_base * (1 + 1e-5)
            m._inv_freq.clear()                  # its frequencies were built from the old base
    return model


@pytest.mark.parametrize("plant", list(PLANTS))
def test_planted_1e5_errors_fail_parity_in_float64_only(plant):
    """The parity comparison above, on a model with one constant off by ~1e-5 relative: in float64 the error
    lands far above the rounding bound; in float32 the same plant would have passed (why parity runs float64)."""
    cfg = config(4, 2, **PLANTS[plant])
    _, params = loaded(cfg, seed=4)
    model = planted(plant, cfg, params)
    x, valid, offset = inputs(4)
    assert compare(cfg, params, model, x, valid, offset, torch.float64) > 1e4
    assert compare(cfg, params, model, x, valid, offset, torch.float32) <= 1


class FloatDtypes(TorchFunctionMode):
    """While active, records the dtype of every floating tensor a torch call returns (dtype -> first such call)."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if torch.is_tensor(t) and t.is_floating_point():
                self.seen.setdefault(t.dtype, getattr(func, "__name__", repr(func)))
        return out


def float_dtypes(forward) -> dict:
    """The floating dtypes `forward()` computes in: dtype -> the first torch call that returned one."""
    with torch.no_grad(), FloatDtypes() as record:
        forward()
    return record.seen


def grok_family_forward(kind):
    """() -> a float64 forward of `kind` (model.double(), float64 inputs), through every layer's recording."""
    preset = get_preset("lecture")
    if kind == "Transformer":
        model = init_params(Transformer(config(logit_cap=2.0)), "random", 0).double()
        x, valid, offset = inputs(0)
        x, valid = torch.from_numpy(x).double(), torch.from_numpy(valid)
        return lambda: (model(x, valid, offset, record=True), model(x, valid, offset, backend="structured"))
    model = init_recsys({"RecsysModel": RecsysModel, "PhoenixRetrievalModel": PhoenixRetrievalModel}[kind](
        preset.recsys_config()), "random", 0).double()
    batch = synthetic_batch(model.config, preset.layout, seed=0, batch=2)
    if kind == "RecsysModel":
        return lambda: model(batch, record=True)
    return lambda: (model.build_user_representation(batch), model.build_candidate_representation(batch))


@pytest.mark.parametrize("kind", ["Transformer", "RecsysModel", "PhoenixRetrievalModel"])
def test_float64_forward_computes_nothing_in_another_float_dtype(kind):
    """model.double() on float64 inputs computes everything in float64: no upcast to float32 on the way
    (the parity tests' float64 bound holds only then)."""
    assert float_dtypes(grok_family_forward(kind)).keys() == {torch.float64}


# --- candidate isolation ------------------------------------------------------------------

def random_model(seed=0, **kw):
    return init_params(Transformer(config(**kw)), "random", seed)


@pytest.mark.parametrize("prefix", ["causal", "bidirectional"])
@pytest.mark.parametrize("j", [0, 2, 3])
def test_candidate_isolation(prefix, j):
    model = random_model(prefix=prefix)
    x, valid, offset = inputs(0)
    x, valid = torch.from_numpy(x), torch.from_numpy(valid)
    T = x.shape[1]
    perturbed = x.clone()
    perturbed[:, offset + j] += torch.randn(x.shape[-1], generator=torch.Generator().manual_seed(j))
    a = model(x, valid, offset, record=True)
    b = model(perturbed, valid, offset, record=True)
    others = [t for t in range(T) if t != offset + j]
    cfg = model.config
    forward = dict(n=max(cfg.emb_size, cfg.ffn_hidden, T), depth=6 * cfg.num_layers + 1)   # forward_bound's
    for la, lb in zip(a.layers, b.layers):
        for name in ("after_attention", "after_ffn"):
            assert_bit_exact(getattr(lb, name)[:, others], getattr(la, name)[:, others], "isolation")
        assert_bit_exact(lb.probs[:, :, others], la.probs[:, :, others], "isolation")
        assert_beyond_rounding(lb.after_ffn[:, offset + j], la.after_ffn[:, offset + j], **forward)
    # the causal mask leaks: every later position changes
    ca = model(x, valid, offset, mask_kind="causal").embeddings
    cb = model(perturbed, valid, offset, mask_kind="causal").embeddings
    for t in range(offset + j + 1, T):
        assert_beyond_rounding(cb[:, t], ca[:, t], **forward)
    assert_bit_exact(cb[:, :offset + j], ca[:, :offset + j], "isolation")


# --- GQA, RoPE, init ----------------------------------------------------------------------

def test_gqa_grouping_equals_mha_with_repeat_interleaved_kv():
    g = torch.Generator().manual_seed(0)
    B, T, Hq, Hkv, K = 2, 7, 6, 2, 8
    q, k, v = torch.randn(B, T, Hq, K, generator=g), torch.randn(B, T, Hkv, K, generator=g), \
        torch.randn(B, T, Hkv, K, generator=g)
    mask = AttentionMask("recsys", T, 4, torch.rand(B, T, generator=g) > 0.2)
    kw = dict(multiplier=0.3, cap=30.0, cap_method="tanh")
    grouped = naive_attention(q, k, v, mask, **kw).out
    mha = naive_attention(q, k.repeat_interleave(Hq // Hkv, 2), v.repeat_interleave(Hq // Hkv, 2), mask, **kw).out
    attention_bound = rounding_bound(torch.float32, max(K, T), depth=3)           # q.k, softmax sum, probs @ v
    assert relative_error(grouped, mha) <= attention_bound                        # exact in real arithmetic
    # and not the other tiling: query head h uses kv head h // G, not h % Hkv
    tiled = naive_attention(q, k.repeat(1, 1, Hq // Hkv, 1), v.repeat(1, 1, Hq // Hkv, 1), mask, **kw).out
    assert relative_error(tiled, grouped) > attention_bound


def test_gqa_model_equals_mha_model_with_repeated_kv_weights():
    gqa, params = loaded(config(4, 2), seed=5)
    mha_params = {k: dict(v) for k, v in params.items()}
    for i in range(2):
        for name in ("key", "value"):
            w = params[f"transformer/decoder_layer_{i}/multi_head_attention/{name}"]["w"]   # [D, Hkv*K]
            w = np.repeat(w.reshape(64, 2, 16), 2, axis=1).reshape(64, 4 * 16)          # kv head per group
            mha_params[f"transformer/decoder_layer_{i}/multi_head_attention/{name}"] = {"w": w}
    mha = load_haiku_params(Transformer(config(4, 4)), mha_params)
    x, valid, offset = inputs(5)
    x, valid = torch.from_numpy(x).double(), torch.from_numpy(valid)            # exact in real arithmetic:
    got, want = gqa.double()(x, valid, offset).embeddings, mha.double()(x, valid, offset).embeddings   # float64
    assert relative_error(got, want) <= tolerance(config())


def test_rope_dot_product_depends_only_on_position_difference():
    K = 16
    rotary = RotaryEmbedding(K)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, K, generator=g), torch.randn(1, 1, 1, K, generator=g)

    def score(m, n):
        qm = rotary(q, torch.tensor([[float(m)]]))
        kn = rotary(k, torch.tensor([[float(n)]]))
        return float((qm * kn).sum())

    # exact in real arithmetic; in fp32 the angle m * theta is off by up to u * m (the form of an m-term sum's
    # bound) and the rotated dot product is a 2-deep reduction over K
    scale, m = float(q.norm() * k.norm()), 47
    bound = (rounding_bound(torch.float32, K, depth=2) + rounding_bound(torch.float32, m)) * scale
    for d in (0, 1, 3, 7):
        values = [score(n + d, n) for n in (0, 2, 5, 11, 40)]
        assert max(values) - min(values) <= bound
    assert abs(score(3, 0) - score(1, 0)) > bound   # and the difference does matter


def test_zeros_init_is_identity_with_uniform_attention():
    model = init_params(Transformer(config()), "zeros")
    x, valid, offset = inputs(0)
    x, valid = torch.from_numpy(x), torch.from_numpy(valid)
    out = model(x, valid, offset, record=True)
    assert_bit_exact(out.embeddings, x, "no rounding")               # every layer adds rms_norm(...) * 0 = 0
    allowed = AttentionMask("recsys", x.shape[1], offset, valid).dense().float()    # [B, 1, T, T]
    uniform = allowed / allowed.sum(-1, keepdim=True)
    for layer in out.layers:
        assert_rounding_close(layer.probs, uniform.expand_as(layer.probs), n=x.shape[1])


@pytest.mark.parametrize("emb,w,multiple,expected", [
    (128, 4.0, 8, 344), (64, 4.0, 8, 176), (512, 2.0, 8, 688), (2560, 2.0, 8, 3416),
    (128, 4.0, 256, 512), (2560, 2.0, 256, 3584),
])
def test_ffn_size_table(emb, w, multiple, expected):
    assert ffn_size(emb, w, multiple) == expected


def test_record_does_not_change_output():
    model = random_model(seed=3)
    x, valid, offset = inputs(3)
    x, valid = torch.from_numpy(x), torch.from_numpy(valid)
    plain = model(x, valid, offset)
    recorded = model(x, valid, offset, record=True)
    assert plain.layers is None and len(recorded.layers) == 2
    assert_bit_exact(recorded.embeddings, plain.embeddings, "same computation")   # naive computes probs either way
    assert_bit_exact(recorded.layers[-1].after_ffn, recorded.embeddings, "same computation")


# --- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("changes,field,allowed", [
    (dict(num_q_heads=3, num_kv_heads=2), "num_q_heads", "multiple of num_kv_heads"),
    (dict(key_size=15), "key_size", "even"),
    (dict(cap_method="relu"), "cap_method", "tanh, soft_sign, none"),
    (dict(rope_mode="alibi"), "rope_mode", "sequential, shared, none"),
    (dict(prefix="full"), "prefix", "causal, bidirectional"),
    (dict(num_layers=0), "num_layers", "positive integer"),
])
def test_bad_config_names_field_and_allowed(changes, field, allowed):
    with pytest.raises(ValueError, match=field) as e:
        config(**changes)
    assert allowed in str(e.value)


@pytest.mark.parametrize("offset", [-1, 12])
def test_offset_outside_sequence_rejected(offset):
    model = random_model()
    x, valid, _ = inputs(0)   # T = 11
    with pytest.raises(ValueError, match=r"candidate_start_offset.*\[0, 11\]"):
        model(torch.from_numpy(x), torch.from_numpy(valid), offset)


def test_mask_shape_mismatch_rejected():
    model = random_model()
    x, valid, offset = inputs(0)
    with pytest.raises(ValueError, match=r"mask: got shape \(2, 10\); allowed: \[2, 11\]"):
        model(torch.from_numpy(x), torch.from_numpy(valid[:, :10]), offset)
    with pytest.raises(ValueError, match=r"embeddings: .*emb_size"):
        model(torch.from_numpy(x[..., :32]), torch.from_numpy(valid), offset)


def test_an_all_valid_mask_takes_the_unpadded_path():
    """A host mask with nothing padded is dropped (the unpadded fast paths, on every device: reading it on
    the host costs no device sync); None means the same; a padded one is kept; the outputs agree."""
    model = init_params(Transformer(TransformerConfig(64, 16, 4, 2, 2)), "random", seed=0)
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(0))
    full, padded = torch.ones(2, 9, dtype=torch.bool), torch.ones(2, 9, dtype=torch.bool)
    padded[0, 4] = False
    assert model.attention_mask(full, 6).valid is None and model.attention_mask(None, 6, seq_len=9).valid is None
    assert model.attention_mask(padded, 6).padded
    with torch.no_grad():
        assert_bit_exact(model(x, full, 6).embeddings, model(x, None, 6).embeddings, "same computation")
