"""The production Phoenix port (models/xrex.py) computes production's function: checked against an
independent float64 NumPy forward written from docs/originals.md (tests/reference_xrex.py), the port run in
float64 end to end so that the float64 rounding bound (~1e-12) applies and a planted 1e-5 error fails it,
plus one float32 run within the float32 bound (what the page runs); then the properties that set it apart
from grok.py's trunk (right-anchored RoPE, bidirectional prefix, isolation, batch invariance) and the
loader's contract on production's stacked parameter tree. Parity, batch invariance and backend agreement
are exact in real arithmetic (within the rounding bound of tests/tolerances.py); isolation and padding are
bit-exact by construction (assert_bit_exact)."""
import math

import numpy as np
import pytest
import torch

import reference_xrex as ref
from test_grok import float_dtypes
from tolerances import (PARITY_RTOL, assert_beyond_rounding, assert_bit_exact, assert_rounding_close, forward_bound,
                        relative_error, rounding_bound)
from models import xrex
from models.grok import RMSNorm as GrokRMSNorm
from models.presets import PRESETS
from models.xrex import (XrexConfig, XrexRanker, init_xrex, load_xrex_params, param_spec, right_anchored_positions,
                         xrex_params)

P, L, C = 2, 6, 4          # 2 prefix tokens, 6 history slots, 4 candidates: T = 12

FLAGSHIP = dict(qk_norm=True, attn_logit_cap=-1.0, primer_norm=False)                       # home_direct_packed
SEQPACK = dict(qk_norm=False, attn_logit_cap=80.0, attn_logit_cap_method="soft_sign", primer_norm=True)


def config(q=4, kv=2, **kw):
    base = dict(emb_size=64, num_layers=2, num_q_heads=q, num_kv_heads=kv, key_size=16,
                num_user_prefix_tokens=P, history_seq_len=L)
    return XrexConfig(**{**base, **kw})


def loaded(cfg, seed):
    params = ref.random_xrex_params(np.random.default_rng(seed), emb_size=cfg.emb_size, num_layers=cfg.num_layers,
                                    num_q_heads=cfg.num_q_heads, num_kv_heads=cfg.num_kv_heads,
                                    key_size=cfg.key_size, widening_factor=cfg.widening_factor,
                                    qk_norm=cfg.qk_norm, primer_norm=cfg.primer_norm)
    return load_xrex_params(XrexRanker(cfg), params), params


def inputs(seed, batch=3, D=64):
    """Embeddings and a padding mask: row 0 serving layout (4 history events left-aligned, 2 padded slots,
    last candidate padded), row 1 three padded slots before its events, row 2 a hole mid-history."""
    rng = np.random.default_rng(1000 + seed)
    T = P + L + C
    x = rng.normal(0, 1, (batch, T, D)).astype(np.float32)
    valid = np.ones((batch, T), bool)
    valid[0, P + 4:P + L] = False
    valid[0, T - 1] = False
    valid[1 % batch, P:P + 3] = False
    valid[2 % batch, P + 2] = False
    return x, valid


def run(model, x, valid, dtype=torch.float32, **kw):
    """model on x read as `dtype` (float64: run model.double() for a float64 forward)."""
    with torch.no_grad():
        return model(torch.from_numpy(x).to(dtype), torch.from_numpy(valid), **kw)


def tolerance(cfg, T=P + L + C + 2, dtype=torch.float32):
    """Rounding bound of cfg's forward on T positions in `dtype`: all that may separate it from the float64
    reference or from the same function computed in another order. A float64 bound stays within PARITY_RTOL."""
    bound = forward_bound(cfg.num_layers, cfg.emb_size, cfg.ffn_hidden, T, dtype=dtype)
    assert dtype != torch.float64 or bound <= PARITY_RTOL, bound
    return bound


def forward_rounding(cfg, T=P + L + C + 2):
    """tolerance(cfg, T)'s bound as rounding_bound's arguments (for assert_beyond_rounding)."""
    return dict(n=max(cfg.emb_size, cfg.ffn_hidden, T), depth=6 * cfg.num_layers + 1)


def errors(cfg, params, model, x, valid, dtype=torch.float64):
    """(trunk, logits) relative errors vs the NumPy reference (with cfg's settings), valid positions only,
    `model` run in `dtype` (float64: end to end)."""
    out = run(model.to(dtype), x, valid, dtype)
    trunk, logits = ref.xrex_forward(params, x, valid, P=P, L=L, num_q_heads=cfg.num_q_heads,
                                     num_kv_heads=cfg.num_kv_heads, key_size=cfg.key_size, qk_norm=cfg.qk_norm,
                                     attn_logit_cap=cfg.attn_logit_cap,
                                     attn_logit_cap_method=cfg.attn_logit_cap_method, primer_norm=cfg.primer_norm,
                                     rope_base=cfg.rope_base_exponent)
    return (relative_error(out.trunk, trunk, valid), relative_error(out.logits, logits, valid[:, P + L:]))


# --- parity with the NumPy reference ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("heads", [(4, 2), (10, 2), (4, 4)])
@pytest.mark.parametrize("kind", ["flagship", "seqpack"])
def test_matches_numpy_reference(kind, heads, seed, dtype):
    """float64: the port's function, to float64 rounding; float32 (what the page runs): to float32 rounding."""
    cfg = config(*heads, **(FLAGSHIP if kind == "flagship" else SEQPACK))
    model, params = loaded(cfg, seed)
    x, valid = inputs(seed)
    trunk_err, logit_err = errors(cfg, params, model, x, valid, dtype)
    assert max(trunk_err, logit_err) <= tolerance(cfg, dtype=dtype), (trunk_err, logit_err)


@pytest.mark.parametrize("changes", [dict(attn_logit_cap=2.0, attn_logit_cap_method="tanh"),
                                     dict(attn_logit_cap=2.0, attn_logit_cap_method="soft_sign"),
                                     dict(key_size=32, widening_factor=1.3), dict(rope_base_exponent=500)],
                         ids=["tanh-cap-bites", "soft_sign-cap-bites", "key32-ffn-rounded", "rope-base-500"])
def test_variants_match_numpy_reference(changes):
    cfg = config(4, 2, **changes)
    assert cfg.ffn_hidden == ref.ffn_hidden(64, cfg.widening_factor)
    model, params = loaded(cfg, 5)
    x, valid = inputs(5)
    assert max(errors(cfg, params, model, x, valid)) <= tolerance(cfg, dtype=torch.float64)


def test_float64_forward_computes_nothing_in_another_float_dtype():
    """model.double() on float64 embeddings (numerics "fp32": full precision) computes everything in float64,
    through every layer's recording and both attention paths; the logits come back float64."""
    model = init_xrex(XrexRanker(config(4, 2, **SEQPACK)), 0).double()
    x, valid = inputs(0)
    x, valid = torch.from_numpy(x).double(), torch.from_numpy(valid)
    outputs = []

    def forward():
        outputs.extend((model(x, valid, record=True), model(x, valid, backend="structured")))
    assert float_dtypes(forward).keys() == {torch.float64}
    assert all(o.logits.dtype == o.trunk.dtype == torch.float64 for o in outputs)


# a relative error of ~1e-5 planted in one constant of the port, the reference keeping the true value:
# name -> the config of both. Cap 30 on logits of a few units bends them by ~(s/30)^2 (soft_sign) or ~(s/30)^3
# (tanh), so the cap's value matters a little.
PLANTS = {"logit scale * (1 + 1e-5)": FLAGSHIP, "RMSNorm eps 1e-4, not 1e-5": FLAGSHIP,
          "soft_sign cap 30.01, not 30": {**FLAGSHIP, "attn_logit_cap": 30.0, "attn_logit_cap_method": "soft_sign"},
          "tanh cap 30.01, not 30": {**FLAGSHIP, "attn_logit_cap": 30.0, "attn_logit_cap_method": "tanh"},
          "RoPE base * (1 + 1e-5)": FLAGSHIP}


def planted(monkeypatch, what, model):
    """`model` with the plant `what` (a scale planted on XrexConfig itself, undone after the test)."""
    c = model.config
    if what == "logit scale * (1 + 1e-5)":
        monkeypatch.setattr(XrexConfig, "attn_scale", property(lambda cfg: math.sqrt(128) / cfg.key_size * (1 + 1e-5)))
    elif what == "RMSNorm eps 1e-4, not 1e-5":
        for m in model.modules():
            if isinstance(m, GrokRMSNorm):      # xrex's RMSNorm: the qk norms and final_layer_norm too
                m.eps = 1e-4
    elif what == "RoPE base * (1 + 1e-5)":
        for layer in model.transformer.layers:
            layer.multi_head_attention.rotary.base_exponent = c.rope_base_exponent * (1 + 1e-5)
            layer.multi_head_attention.rotary._inv_freq.clear()     # built from the old base
    else:
        model = load_xrex_params(XrexRanker(c.replace(attn_logit_cap=30.01)), xrex_params(model))
    return model


@pytest.mark.parametrize("plant", list(PLANTS))
def test_planted_1e5_errors_fail_parity_in_float64_only(monkeypatch, plant):
    """The parity comparison above, on a port with one constant off by ~1e-5 relative: in float64 the error
    lands far above the rounding bound; in float32 the same plant would have passed (why parity runs float64)."""
    cfg = config(4, 2, **PLANTS[plant])
    model, params = loaded(cfg, 6)
    x, valid = inputs(6)
    model = planted(monkeypatch, plant, model)
    assert max(errors(cfg, params, model, x, valid, torch.float64)) > 1e4 * tolerance(cfg, dtype=torch.float64)
    assert max(errors(cfg, params, model, x, valid, torch.float32)) <= tolerance(cfg)


# --- each production rule is load-bearing: the plausible alternative fails the reference -----------

def error_after(monkeypatch, seed, target, name, replacement):
    """The port matches the reference; with `target.name` replaced by the alternative, the smaller of its
    trunk / logits errors in units of the rounding bound."""
    cfg = config(4, 2, **FLAGSHIP)
    model, params = loaded(cfg, seed)
    x, valid = inputs(seed)
    bound = tolerance(cfg, dtype=torch.float64)
    assert max(errors(cfg, params, model, x, valid)) <= bound
    monkeypatch.setattr(target, name, replacement)
    return min(errors(cfg, params, model, x, valid)) / bound


def sequential_positions(mask, num_user_prefix_tokens, history_seq_len):
    return torch.arange(mask.shape[1]).expand(mask.shape)


def test_naive_qkv_split_fails_the_reference(monkeypatch):
    """The merged weight is interleaved per KV group; reading it as [all q | all k | all v] is wrong."""
    def naive_split(self, h):
        c = self.config
        B, T, _ = h.shape
        q, k, v = self.qkv(h).split([c.num_q_heads * c.key_size, c.num_kv_heads * c.key_size,
                                     c.num_kv_heads * c.key_size], dim=-1)
        return (q.view(B, T, c.num_q_heads, c.key_size), k.view(B, T, c.num_kv_heads, c.key_size),
                v.view(B, T, c.num_kv_heads, c.key_size))
    assert error_after(monkeypatch, 2, xrex.MultiHeadAttention, "split_qkv", naive_split) > 1


def test_per_head_qk_norm_fails_the_reference(monkeypatch):
    """qk_norm is one RMSNorm over all heads' features flattened; normalising each head alone is wrong."""
    original = xrex.MultiHeadAttention.split_qkv

    def per_head_normed_split(self, h):
        # each head brought to unit RMS first: the all-heads norm that follows then changes nothing but
        # the scale, so this is per-head RMSNorm with the same scales
        q, k, v = original(self, h)

        def per_head(t):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5)
        return per_head(q), per_head(k), v
    assert error_after(monkeypatch, 3, xrex.MultiHeadAttention, "split_qkv", per_head_normed_split) > 1


def test_sequential_positions_fail_the_reference(monkeypatch):
    assert error_after(monkeypatch, 4, xrex, "right_anchored_positions", sequential_positions) > 1


def test_right_anchored_positions_by_hand():
    # P=2, L=6, C=4; row 0: 4 events left-aligned then 2 padded slots, last candidate padded;
    # rows 1 and 2 break serving's left alignment; the formula counts slots, not events (as production's
    # right_anchored_rope_positions does; seqpack builds its own positions), so row 1's events (3 padded
    # slots first) sit at 8..10 and row 2's event after its hole at slot 2 lands one further right
    _, valid = inputs(0, batch=3)
    got = right_anchored_positions(torch.from_numpy(valid), P, L).tolist()
    assert got[0] == [0, 1, 4, 5, 6, 7, 0, 0, 8, 8, 8, 0]        # last event at P+L-1 = 7, candidates at 8
    assert got[1] == [0, 1, 0, 0, 0, 8, 9, 10, 8, 8, 8, 8]
    assert got[2] == [0, 1, 3, 4, 0, 6, 7, 8, 8, 8, 8, 8]
    full = torch.ones(1, 12, dtype=torch.bool)
    assert right_anchored_positions(full, P, L).tolist()[0] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    assert_bit_exact(np.asarray(got, np.float64), ref.right_anchored(valid, P, L), "no rounding")   # whole numbers


# --- properties --------------------------------------------------------------------------------

def random_model(seed=0, **kw):
    return init_xrex(XrexRanker(config(**{**FLAGSHIP, **kw})), seed)


@pytest.mark.parametrize("kind", ["flagship", "seqpack"])
@pytest.mark.parametrize("j", [0, 2])
def test_candidate_isolation_bit_exact(kind, j):
    """Perturbing candidate j changes no other candidate's trunk output or logits by a single bit."""
    model = random_model(1, **(FLAGSHIP if kind == "flagship" else SEQPACK))
    x, valid = inputs(0)
    moved = x.copy()
    moved[:, P + L + j] += np.random.default_rng(j).normal(0, 3, x.shape[-1]).astype(np.float32)
    a, b = run(model, x, valid), run(model, moved, valid)
    others = [c for c in range(C) if c != j]
    assert_bit_exact(b.trunk[:, :P + L], a.trunk[:, :P + L], "isolation")
    assert_bit_exact(b.trunk[:, [P + L + c for c in others]], a.trunk[:, [P + L + c for c in others]], "isolation")
    assert_bit_exact(b.logits[:, others], a.logits[:, others], "isolation")
    assert_beyond_rounding(b.logits[:, j], a.logits[:, j], **forward_rounding(model.config))


def test_padding_content_never_reaches_a_valid_output():
    model = random_model(2)
    x, valid = inputs(1)
    junk = np.where(valid[..., None], x, 1e3 * np.random.default_rng(0).normal(size=x.shape)).astype(np.float32)
    a, b = run(model, x, valid), run(model, junk, valid)
    v = torch.from_numpy(valid)
    assert_bit_exact(b.trunk[v], a.trunk[v], "isolation")


@pytest.mark.parametrize("backend", ["naive", "structured"])
def test_serving_kernel_padding_lets_padded_history_reach_valid_candidates(backend):
    """Production's serving kernels take only the bound (0, P+L, P+L, T): under attention_padding
    "serving-kernel" what sits in a padded history slot moves every valid candidate's output; under the
    default "masked" not a bit moves. With nothing padded the two are the same function, bit for bit."""
    masked = random_model(2)
    kernel = XrexRanker(masked.config.replace(attention_padding="serving-kernel"))
    kernel.load_state_dict(masked.state_dict())
    x, valid = inputs(1)
    junk = x.copy()
    junk[0, P + 4:P + L] += np.random.default_rng(0).normal(0, 3, junk[0, P + 4:P + L].shape).astype(np.float32)
    assert not valid[0, P + 4:P + L].any() and valid[0, P + L:P + L + 2].all()
    a, b = run(masked, x, valid, backend=backend), run(masked, junk, valid, backend=backend)
    assert_bit_exact(b.logits[0, :2], a.logits[0, :2], "isolation")
    a, b = run(kernel, x, valid, backend=backend), run(kernel, junk, valid, backend=backend)
    assert (a.logits[0, :2] - b.logits[0, :2]).abs().min() > tolerance(kernel.config) * a.logits.abs().max()
    full = np.ones_like(valid)
    # nothing padded: both masks are the unpadded one, so the two forwards run the same operations
    assert_bit_exact(run(kernel, x, full, backend=backend).logits, run(masked, x, full, backend=backend).logits,
                     "same computation")


def test_an_all_valid_mask_takes_the_unpadded_path():
    """A host mask with nothing padded is dropped before the forward (the unpadded fast paths on every
    device); None means the same; a padded one is kept."""
    model = random_model(0)
    x, valid = inputs(0)
    full = torch.ones(valid.shape, dtype=torch.bool)
    assert model.attention_mask(full).valid is None and model.attention_mask(None, seq_len=valid.shape[1]).valid is None
    assert model.attention_mask(torch.from_numpy(valid)).padded
    with torch.no_grad():
        assert_bit_exact(model(torch.from_numpy(x), full).logits, model(torch.from_numpy(x), None).logits,
                         "same computation")


def test_prefix_is_bidirectional():
    """Production's user and history attend both ways: the first token depends on the last history event."""
    model = random_model(3)
    x, valid = inputs(2)
    moved = x.copy()
    moved[:, P + 1] += 1.0
    a, b = run(model, x, valid), run(model, moved, valid)
    assert relative_error(b.trunk[:, 0], a.trunk[:, 0]) > tolerance(model.config)


@pytest.mark.parametrize("kind", ["flagship", "seqpack"])
def test_candidate_scores_batch_invariant(kind):
    """Every candidate sits at P+L and sees only prefix + self: a candidate's score does not depend on
    its slot or on which other candidates share the request (permute, drop, add). Exact in real arithmetic:
    the batch's shape changes how reductions are blocked, so fp32 agrees within the rounding bound."""
    model = random_model(4, **(FLAGSHIP if kind == "flagship" else SEQPACK))
    x, valid = inputs(3)
    base = run(model, x, valid).logits
    perm = [3, 0, 2, 1]
    xp = np.concatenate([x[:, :P + L], x[:, P + L:][:, perm]], axis=1)
    vp = np.concatenate([valid[:, :P + L], valid[:, P + L:][:, perm]], axis=1)
    permuted = run(model, xp, vp).logits
    alone = run(model, x[:, :P + L + 1], valid[:, :P + L + 1]).logits              # only candidate 0
    extra = np.concatenate([x, x[:, P + L:P + L + 2] * 2], axis=1)                  # two more candidates
    added = run(model, extra, np.concatenate([valid, valid[:, P + L:P + L + 2]], axis=1)).logits
    cv = torch.from_numpy(valid[:, P + L:])
    for got, want, keep in ((permuted, base[:, perm], cv[:, perm]), (alone, base[:, :1], cv[:, :1]),
                            (added[:, :C], base, cv)):
        assert relative_error(got, want, keep) <= tolerance(model.config)


def test_sequential_positions_break_batch_invariance(monkeypatch):
    """The same permutation under positions 0..T-1 moves scores: right-anchoring is what makes them invariant."""
    monkeypatch.setattr(xrex, "right_anchored_positions", sequential_positions)
    model = random_model(4)
    x, valid = inputs(3)
    valid[:] = True
    base = run(model, x, valid).logits
    perm = [3, 0, 2, 1]
    xp = np.concatenate([x[:, :P + L], x[:, P + L:][:, perm]], axis=1)
    assert relative_error(run(model, xp, valid).logits, base[:, perm]) > tolerance(model.config)


def test_record_traces_the_same_forward():
    model = random_model(5)
    x, valid = inputs(4)
    plain, traced = run(model, x, valid), run(model, x, valid, record=True)
    assert_bit_exact(traced.logits, plain.logits, "same computation") and plain.layers is None
    assert len(traced.layers) == model.config.num_layers
    probs = traced.layers[0].probs                                                  # [B, Hq, T, T]
    T = x.shape[1]
    cand = probs[:, :, P + L:, P + L:]
    assert_bit_exact(cand * (1 - torch.eye(C)), torch.zeros_like(cand), "isolation")  # no candidate sees another
    assert_rounding_close(probs.sum(-1), torch.ones(3, 4, T), n=T)                 # softmax rows sum to 1
    assert_bit_exact(traced.layers[-1].after_ffn, traced.trunk, "same computation")


@pytest.mark.parametrize("backend", ["structured", "sdpa"])
def test_backends_agree_with_naive(backend):
    model = random_model(6)                                                          # flagship: no cap, so SDPA runs
    x, valid = inputs(5)
    a, b = run(model, x, valid), run(model, x, valid, backend=backend)
    v = torch.from_numpy(valid)
    assert relative_error(b.trunk, a.trunk, v) <= tolerance(model.config)


def test_bf16_numerics_switch():
    """Production's numerics: bf16 activations with fp32 accumulation, so bf16 logits differ from fp32 by
    more than fp32 rounding and less than a bf16 rounding per reduction; isolation still bit-exact."""
    cfg = config(4, 2, **FLAGSHIP)
    model, params = loaded(cfg, 7)
    x, valid = inputs(7)
    fp32, bf16 = run(model, x, valid), run(model, x, valid, numerics="bf16")
    assert bf16.logits.dtype == torch.float32 and bf16.trunk.dtype == torch.float32
    cv = torch.from_numpy(valid[:, P + L:])
    err = relative_error(bf16.logits, fp32.logits, cv)
    bf16_rounding = rounding_bound(torch.bfloat16, n=1, depth=6 * cfg.num_layers + 1)   # one rounding per stage
    assert tolerance(cfg) < err <= bf16_rounding, err
    moved = x.copy()
    moved[:, P + L] += 1.0
    assert_bit_exact(run(model, moved, valid, numerics="bf16").logits[:, 1:], bf16.logits[:, 1:], "isolation")


# --- parameters: production's stacked tree ------------------------------------------------------

def test_spec_matches_production_shapes():
    """docs/originals.md §6, home_direct_packed: the stacked names and shapes (checked without allocating)."""
    spec = {k: v[1] for k, v in param_spec(PRESETS["phoenix-2026"].xrex_config()).items()}
    s = "transformer/layer_stack/decoder_layer_0"
    assert spec == {
        f"{s}/pre_attn_norm/scale": (8, 2560), f"{s}/multi_head_attention/qkv/w": (8, 2560, 3584),
        f"{s}/multi_head_attention/q_norm/scale": (8, 2560), f"{s}/multi_head_attention/k_norm/scale": (8, 512),
        f"{s}/multi_head_attention/out/w": (8, 2560, 2560), f"{s}/pre_ffn_norm/scale": (8, 2560),
        f"{s}/up_proj/w": (8, 2560, 5120), f"{s}/down_proj/w": (8, 5120, 2560),
        "recsys_aggregated_model/final_layer_norm/scale": (2560,),
        "recsys_aggregated_model/unembeddings": (2560, 64),
        "recsys_aggregated_model/continuous_unembeddings": (2560, 8)}
    seqpack = param_spec(PRESETS["phoenix-2026-seqpack"].xrex_config())
    assert f"{s}/post_attn_norm/scale" in seqpack and f"{s}/post_ffn_norm/scale" in seqpack
    assert f"{s}/multi_head_attention/q_norm/scale" not in seqpack


@pytest.mark.parametrize("kind", ["flagship", "seqpack"])
def test_load_production_tree_round_trips(kind):
    cfg = config(10, 2, **(FLAGSHIP if kind == "flagship" else SEQPACK))
    model, params = loaded(cfg, 8)
    back = xrex_params(model)
    assert {k: set(v) for k, v in back.items()} == {k: set(v) for k, v in params.items()}
    for module, inner in params.items():
        for name, arr in inner.items():
            assert_bit_exact(back[module][name], arr, "no rounding")                  # float32 in, float32 out
    layer1 = model.transformer.layers[1].multi_head_attention.qkv.w.detach().numpy()
    assert_bit_exact(layer1, params[f"{ref.MHA}/qkv"]["w"][1], "no rounding")      # axis 0 is the layer


def test_load_nano_preset_tree():
    """A full phoenix-2026-nano tree (D 512, 4 layers, 4 q / 2 kv heads of 128) loads; bf16-like inputs too."""
    cfg = PRESETS["phoenix-2026-nano"].xrex_config()
    params = ref.random_xrex_params(np.random.default_rng(0), emb_size=512, num_layers=4, num_q_heads=4,
                                    num_kv_heads=2, key_size=128)
    params[f"{ref.STACK}/up_proj"]["w"] = torch.from_numpy(params[f"{ref.STACK}/up_proj"]["w"]).bfloat16()
    model = load_xrex_params(XrexRanker(cfg), params)
    assert model.transformer.layers[3].dense_block.up_proj.w.shape == (512, 1024)
    out = run(model, np.random.default_rng(1).normal(size=(1, 1088, 512)).astype(np.float32),
              np.ones((1, 1088), bool))
    assert out.logits.shape == (1, 64, 64) and torch.isfinite(out.logits).all()


def _broken(params, how):
    bad = {k: dict(v) for k, v in params.items()}
    if how == "missing":
        del bad[f"{ref.MHA}/k_norm"]
        return bad, "multi_head_attention/k_norm/scale is missing"
    if how == "shape":
        bad[f"{ref.MHA}/qkv"]["w"] = bad[f"{ref.MHA}/qkv"]["w"][:1]                   # one layer, not two
        return bad, "multi_head_attention/qkv/w has shape [1, 64, 128], expected [2, 64, 128]"
    if how == "unexpected":
        bad["transformer/decoder_layer_0/multi_head_attention/query"] = {"w": np.zeros((64, 64), np.float32)}
        return bad, "transformer/decoder_layer_0/multi_head_attention/query/w is unexpected"
    if how == "nan":
        bad[ref.HEAD]["unembeddings"] = np.full((64, 64), np.nan, np.float32)
        return bad, "recsys_aggregated_model/unembeddings contains NaN"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["missing", "shape", "unexpected", "nan"])
def test_bad_mapping_refused_by_name_nothing_loaded(how):
    cfg = config(4, 2, **FLAGSHIP)
    _, params = loaded(cfg, 9)
    model = random_model(9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad, message = _broken(params, how)
    with pytest.raises(ValueError) as e:
        load_xrex_params(model, bad)
    assert str(e.value).startswith("params: 1 problem(s)") and message in str(e.value), str(e.value)
    for k, v in model.state_dict().items():
        assert_bit_exact(v, before[k], "no rounding")                               # nothing loaded


def test_primer_tree_needs_post_norms_and_flagship_refuses_them():
    _, seqpack_params = loaded(config(4, 2, **SEQPACK), 0)
    with pytest.raises(ValueError, match="post_attn_norm/scale is unexpected"):
        load_xrex_params(XrexRanker(config(4, 2, **{**SEQPACK, "primer_norm": False})), seqpack_params)
    with pytest.raises(ValueError, match="q_norm/scale is missing"):
        load_xrex_params(XrexRanker(config(4, 2, **{**SEQPACK, "qk_norm": True})), seqpack_params)


# --- config, inputs, presets ---------------------------------------------------------------------

@pytest.mark.parametrize("changes, field", [
    (dict(num_q_heads=5, num_kv_heads=2), "num_q_heads"), (dict(key_size=15), "key_size"),
    (dict(attn_logit_cap_method="clip"), "attn_logit_cap_method"), (dict(history_seq_len=-1), "history_seq_len"),
    (dict(widening_factor=0.0), "widening_factor"), (dict(qk_norm="yes"), "qk_norm"),
    (dict(emb_size=0), "emb_size"), (dict(attention_padding="none"), "attention_padding")])
def test_bad_config_names_the_field(changes, field):
    with pytest.raises(ValueError, match=f"^{field}: got .*; allowed: "):
        config(**changes)


def test_bad_inputs_name_the_field():
    model = random_model(0)
    x, valid = inputs(0)
    with pytest.raises(ValueError, match=r"^embeddings: got T = 7; allowed: T >= 8"):
        run(model, x[:, :7], valid[:, :7])
    with pytest.raises(ValueError, match=r"^padding_mask: got \(3, 11\); allowed"):
        run(model, x, valid[:, :11])
    with pytest.raises(ValueError, match=r"^embeddings: got \(3, 12, 32\); allowed"):
        run(model, x[..., :32], valid)
    with pytest.raises(ValueError, match="^numerics: got 'fp16'; allowed: fp32, bf16"):
        run(model, x, valid, numerics="fp16")


def test_presets_follow_the_production_table():
    flag, nano, seq = (PRESETS[n].xrex_config() for n in ("phoenix-2026", "phoenix-2026-nano", "phoenix-2026-seqpack"))
    assert (flag.emb_size, flag.num_layers, flag.num_q_heads, flag.num_kv_heads, flag.key_size,
            flag.ffn_hidden) == (2560, 8, 20, 4, 128, 5120)
    assert (nano.emb_size, nano.num_layers, nano.num_q_heads, nano.num_kv_heads,
            nano.ffn_hidden) == (512, 4, 4, 2, 1024)
    assert flag.qk_norm and flag.attn_logit_cap <= 0 and not flag.primer_norm
    assert (not seq.qk_norm and seq.attn_logit_cap == 80.0 and seq.attn_logit_cap_method == "soft_sign"
            and seq.primer_norm)
    assert flag.output_scale == pytest.approx(0.8944, abs=1e-4) and nano.output_scale == 2.0
    assert flag.attn_scale == pytest.approx(1 / math.sqrt(128))
    assert {n for n, p in PRESETS.items() if p.family == "xrex"} == {"phoenix-2026", "phoenix-2026-nano",
                                                                     "phoenix-2026-seqpack"}


# --- production's quirks in the bug zoo (docs/originals.md §7) -------------------------------------------

def trunk(seed=0, **kw):
    from models.xrex import XrexTrunk
    cfg = config(4, 2, **{**FLAGSHIP, **kw})
    model = XrexTrunk(cfg)
    model.ranker = loaded(cfg, seed)[0]
    return model


def test_serving_kernel_counts_by_hand():
    from models.bugzoo import serving_kernel_counts
    aligned = serving_kernel_counts(6, 4, None)             # history blocks end exactly at P+L = 4
    assert aligned.tolist() == [[1, 1, 1, 1, 0, 0]] * 4 + [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]]
    rounded = serving_kernel_counts(6, 4, 128)              # one 128-block holds everything, unmasked
    assert rounded.tolist() == [[1] * 6] * 4 + [[1, 1, 1, 1, 2, 1], [1, 1, 1, 1, 1, 2]]
    assert torch.equal(serving_kernel_counts(132, 128, 128), serving_kernel_counts(132, 128, None))


def test_serving_padding_caught_by_parity_only_when_history_is_padded():
    from models.bugzoo import BUGS, with_bug
    from models.probes import run_probe
    model = trunk(10)
    x, valid = (torch.from_numpy(a) for a in inputs(10))
    buggy = with_bug(model, "serving-padding")
    assert BUGS["serving-padding"].probe == "parity"
    assert run_probe("parity", buggy, x, valid, P + L).flagged
    assert not run_probe("parity", model, x, valid, P + L).flagged
    assert not run_probe("isolation", buggy, x, valid, P + L).flagged          # candidates stay isolated
    full = torch.ones_like(valid)
    assert run_probe("parity", buggy, x, full, P + L).value <= tolerance(model.config)  # no padding: same function


def test_serving_block_rounding_caught_by_isolation_exact_at_a_multiple_of_128():
    from models.bugzoo import BUGS, with_bug
    from models.probes import run_probe
    model = trunk(11)
    x, valid = (torch.from_numpy(a) for a in inputs(11))
    buggy = with_bug(model, "serving-block-rounding")
    assert BUGS["serving-block-rounding"].probe == "isolation"
    assert run_probe("isolation", buggy, x, valid, P + L).flagged               # P+L = 8: candidates see each other
    assert not run_probe("isolation", model, x, valid, P + L).flagged
    # production's layout: P+L a multiple of 128 and no padded history -> the kernel is exact
    aligned = trunk(12, emb_size=32, num_layers=1, history_seq_len=126)
    xa = torch.randn(1, 132, 32, generator=torch.Generator().manual_seed(0))
    full = torch.ones(1, 132, dtype=torch.bool)
    buggy = with_bug(aligned, "serving-block-rounding")
    assert not run_probe("isolation", buggy, xa, full, 128).flagged
    assert run_probe("parity", buggy, xa, full, 128).value <= tolerance(aligned.config, T=132)


def test_quirks_belong_to_production_and_notebook_bugs_to_grok():
    from models.bugzoo import bug_names, bug_report, with_bug
    from models.presets import get_preset
    from models.grok import Transformer
    assert set(bug_names("xrex")) == {"serving-padding", "serving-block-rounding"}
    with pytest.raises(ValueError, match="^bug: got 'serving-padding'; allowed: none, unmasked-decoder"):
        with_bug(Transformer(get_preset("lecture").transformer), "serving-padding")
    with pytest.raises(ValueError, match="^bug: got 'exact-gelu'; allowed: none, serving-padding"):
        with_bug(trunk(0), "exact-gelu")
    x, valid = (torch.from_numpy(a) for a in inputs(0))
    rows = {r["bug"]: r for r in bug_report(trunk(0), x, valid, P + L)}
    assert set(rows) == {"none", "serving-padding", "serving-block-rounding"}
    assert rows["none"]["flagged"] == ["causality"]                  # bidirectional prefix, by design
    assert "parity" in rows["serving-padding"]["flagged"]
    assert "isolation" in rows["serving-block-rounding"]["flagged"]
