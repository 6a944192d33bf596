"""Each notebook bug is caught by its probe; the correct trunk passes every probe. The structural probes
are bit-exact by construction (0 on the correct trunk); parity and the CPU stand-ins agree within the
rounding bound of tests/tolerances.py."""
import numpy as np
import pytest
import torch

import reference_numpy as ref
from models.attention import naive_attention
from models.bugzoo import BUGS, bug_names, flash_attn_func_cpu, with_bug
from models.grok import RotaryEmbedding, Transformer, init_params
from models.masks import AttentionMask
from models.probes import PROBES, causality_probe, isolation_probe, parity_probe, perturb, run_probe
from models.presets import get_preset
from models.recsys import RecsysModel, init_recsys, synthetic_batch
from models.weights import load_haiku_params
from tolerances import (assert_beyond_rounding, assert_bit_exact, assert_rounding_close, forward_bound, relative_error,
                        rounding_bound)

CFG = get_preset("lecture").transformer
OFFSET = 6                                        # user + 5 history, then 3 candidates


def trunk(seed=0):
    """The lecture trunk with random weights and random (non-unit) norm scales from the NumPy side."""
    params = ref.random_haiku_params(np.random.default_rng(seed), CFG.emb_size, CFG.key_size, CFG.num_q_heads,
                                     CFG.num_kv_heads, CFG.num_layers, CFG.ffn_hidden)
    return load_haiku_params(Transformer(CFG), params), params


def inputs(seed=0):
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(2, 9, CFG.emb_size, generator=g)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 5] = False                            # an empty history slot
    mask[1, 8] = False                            # an empty candidate slot
    return x, mask


@pytest.mark.parametrize("seed", [0, 1])
def test_correct_trunk_passes_every_probe(seed):
    model, _ = trunk(seed)
    x, mask = inputs(seed)
    for name in PROBES:
        result = run_probe(name, model, x, mask, OFFSET)
        assert not result.flagged, result


@pytest.mark.parametrize("bug", bug_names("grok"))
def test_each_bug_is_flagged_by_its_probe(bug):
    model, _ = trunk(0)
    x, mask = inputs(0)
    result = run_probe(BUGS[bug].probe, with_bug(model, bug), x, mask, OFFSET)
    assert result.flagged, result
    assert not run_probe(BUGS[bug].probe, model, x, mask, OFFSET).flagged


@pytest.mark.parametrize("bug", bug_names("grok"))
def test_bug_breaks_parity_with_the_numpy_reference(bug):
    """Independent of the torch port: the float64 NumPy grok.py agrees with the correct trunk to
    fp32 rounding and disagrees with every bug — even exact GELU, by far more than rounding."""
    model, params = trunk(1)
    x, mask = inputs(1)
    expected = ref.transformer_forward(params, x.numpy(), mask.numpy(), OFFSET, num_q_heads=CFG.num_q_heads,
                                       num_kv_heads=CFG.num_kv_heads, key_size=CFG.key_size,
                                       attn_output_multiplier=CFG.attn_output_multiplier)

    def error(m):
        with torch.no_grad():
            return relative_error(m(x, mask, OFFSET).embeddings, expected, mask)
    tolerance = PROBES["parity"].tolerance
    correct, buggy = error(model), error(with_bug(model, bug))
    assert correct < tolerance < 5 * tolerance < buggy
    assert buggy > 50 * correct


def test_unmasked_decoder_also_breaks_causality_and_isolation_on_every_candidate():
    model, _ = trunk(0)
    x, mask = inputs(0)
    buggy = with_bug(model, "unmasked-decoder")
    assert causality_probe(buggy, x, mask, OFFSET) > 1e-3
    for j in range(3):
        assert isolation_probe(buggy, x, mask, OFFSET, candidate=j) > 1e-3
        assert isolation_probe(model, x, mask, OFFSET, candidate=j) == 0


def test_flash_layout_fools_isolation_and_causality_and_records_the_identity():
    """Attention over heads: no token reads another, so the structural probes pass — only parity
    sees that the model no longer computes grok.py's function."""
    model, _ = trunk(0)
    x, mask = inputs(0)
    buggy = with_bug(model, "flash-layout")
    assert isolation_probe(buggy, x, mask, OFFSET) == 0 and causality_probe(buggy, x, mask, OFFSET) == 0
    assert parity_probe(buggy, x, mask, OFFSET) > 0.1
    probs = buggy(x, mask, OFFSET, record=True).layers[0].probs
    assert_bit_exact(probs, torch.eye(9).expand_as(probs), "no rounding")      # recorded as torch.eye itself


def test_flash_attn_func_cpu_honours_its_layout_contract():
    """Called with the layout it documents, [B, T, H, D], the CPU stand-in is unmasked attention (exact in real
    arithmetic, another grouping of the sums: within the rounding bound of q.k, softmax sum, probs @ v)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 7, 4, 16, generator=g), torch.randn(2, 7, 2, 16, generator=g),
               torch.randn(2, 7, 2, 16, generator=g))
    expected = naive_attention(q, k, v, AttentionMask("full", 7), multiplier=0.25, cap=0.0, cap_method="none").out
    assert_rounding_close(flash_attn_func_cpu(q, k, v, softmax_scale=0.25), expected, n=16, depth=3)
    causal = naive_attention(q, k, v, AttentionMask("causal", 7), multiplier=0.25, cap=0.0, cap_method="none").out
    assert_rounding_close(flash_attn_func_cpu(q, k, v, softmax_scale=0.25, causal=True), causal, n=16, depth=3)
    with pytest.raises(TypeError):      # flash_attn_func has no such keyword: a typo is an error, not a no-op
        flash_attn_func_cpu(q, k, v, softmax_scal=0.25)


def test_interleaved_rope_is_still_a_relative_rotation():
    """Why the bug looks plausible: q.k still depends only on the position difference."""
    rope = RotaryEmbedding(16, interleaved=True)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def dot(pq, pk):
        return float((rope(q, torch.tensor([[pq]])) * rope(k, torch.tensor([[pk]]))).sum())
    # rounding: a 2-deep reduction over K = 16, plus the angle m * theta off by up to u * m (m <= 13)
    scale = float(q.norm() * k.norm())
    bound = (rounding_bound(torch.float32, 16, depth=2) + rounding_bound(torch.float32, 13)) * scale
    assert abs(dot(5.0, 2.0) - dot(13.0, 10.0)) <= bound
    assert abs(dot(5.0, 2.0) - dot(5.0, 4.0)) > bound


def test_residual_from_input_drops_attention_from_the_stream():
    """With the FFN zeroed, the correct layer's output is h + attention; the buggy one returns h."""
    model = init_params(Transformer(CFG), "random", 0)
    with torch.no_grad():
        for layer in model.layers:
            layer.dense_block.linear_1.w.zero_()
    x, mask = inputs(0)
    buggy = with_bug(model, "residual-from-input")
    assert_bit_exact(buggy(x, mask, OFFSET).embeddings, x, "no rounding")      # h + 0
    assert (model(x, mask, OFFSET).embeddings - x).abs().max() > 0.1


def test_with_bug_copies_and_works_on_the_ranking_model():
    preset = get_preset("lecture")
    ranker = init_recsys(RecsysModel(preset.recsys_config()), "random", 0)
    batch = synthetic_batch(ranker.config, preset.layout, seed=0, batch=2)
    before = ranker(batch).logits
    buggy = with_bug(ranker, "unmasked-decoder")
    t = ranker.config.transformer
    assert relative_error(buggy(batch).logits, before) > forward_bound(t.num_layers, t.emb_size, t.ffn_hidden,
                                                                        preset.layout.seq_len)
    assert_bit_exact(ranker(batch).logits, before, "same computation")      # the original is untouched
    assert with_bug(ranker, None) is ranker


def test_unknown_bug_and_probe_list_the_allowed():
    model, _ = trunk(0)
    with pytest.raises(ValueError, match="bug: got 'typo'; allowed: none, unmasked-decoder"):
        with_bug(model, "typo")
    with pytest.raises(ValueError, match="probe: got 'typo'; allowed: isolation, causality, parity"):
        run_probe("typo", model, *inputs(0), OFFSET)
    with pytest.raises(ValueError, match="candidate: got 5; allowed: 0..2"):
        isolation_probe(model, *inputs(0), OFFSET, candidate=5)


def test_perturb_changes_one_position_as_named_and_nothing_else():
    """The one perturbation of the probes and the Isolation tab: every other position is bit-identical;
    scale multiplies, noise adds seeded noise of the asked size, replace puts the replacement there."""
    x, _ = inputs(0)
    for how in ("scale", "noise", "replace"):
        out = perturb(x, 7, how, 3.0, seed=5, replacement=torch.ones(2, CFG.emb_size))
        if how == "scale":
            assert_bit_exact(out[:, 7], x[:, 7] * 3.0, "same computation")
        elif how == "noise":
            assert 2.0 < float((out[:, 7] - x[:, 7]).std()) < 4.0
        else:
            assert_bit_exact(out[:, 7], torch.ones(2, CFG.emb_size), "no rounding")
        keep = torch.ones(9, dtype=torch.bool)
        keep[7] = False
        assert_bit_exact(out[:, keep], x[:, keep], "no rounding")             # copied
    same, other = perturb(x, 7, "noise", 1.0, seed=5), perturb(x, 7, "noise", 1.0, seed=6)
    assert_bit_exact(perturb(x, 7, "noise", 1.0, seed=5), same, "same computation")
    assert_beyond_rounding(other, same, n=1)                                  # another seed, another draw
    assert_beyond_rounding(same[1, 7] - x[1, 7], same[0, 7] - x[0, 7], n=1)   # each row its own draw
    with pytest.raises(ValueError, match="perturbation: got 'typo'; allowed: scale, noise, replace"):
        perturb(x, 7, "typo")
    with pytest.raises(ValueError, match="perturbation: got 'replace' without a replacement"):
        perturb(x, 7, "replace")


def test_isolation_probe_takes_every_perturbation():
    """Scale, noise and replacement of a candidate: the correct trunk isolates each, the unmasked one none."""
    model, _ = trunk(0)
    x, mask = inputs(0)
    buggy = with_bug(model, "unmasked-decoder")
    for how in ("scale", "noise", "replace"):
        kw = dict(candidate=1, perturbation=how, scale=3.0, replacement=torch.ones(2, CFG.emb_size))
        assert isolation_probe(model, x, mask, OFFSET, **kw) == 0, how
        assert isolation_probe(buggy, x, mask, OFFSET, **kw) > 1e-3, how


def test_bug_report_on_the_trained_demo_trunk():
    """The same verdicts on trained weights and world inputs, as the app shows them."""
    from models.bugzoo import bug_report
    from models.demo import demo_batch, load_demo_model
    from models.recsys import SequenceLayout
    ranker = load_demo_model()
    emb, valid, offset = ranker.embed(demo_batch(SequenceLayout(1, 5, 3, history_padding=1), seed=0, batch=2))
    rows = {r["bug"]: r for r in bug_report(ranker.transformer, emb.detach(), valid, offset)}
    assert rows["none"]["flagged"] == []
    for bug in bug_names("grok"):
        assert BUGS[bug].probe in rows[bug]["flagged"]


def family_model(family):
    """A small model of each family, its inputs (padded history) and offset."""
    if family == "grok":
        model, _ = trunk(0)
        return model, *inputs(0), OFFSET
    from models.xrex import XrexConfig, XrexTrunk, init_xrex
    config = XrexConfig(emb_size=32, num_layers=2, num_q_heads=4, num_kv_heads=2, key_size=8,
                        num_user_prefix_tokens=2, history_seq_len=6)
    model = XrexTrunk(config)
    init_xrex(model.ranker, seed=0)
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 6:8] = False
    return model, x, mask, 8


@pytest.mark.parametrize("family", ["grok", "xrex"])
def test_bug_report_runs_each_models_pass_on_its_input_once(family):
    """The report's numbers are each probe's own (run_probe on each bugged copy, parity against the model),
    from 4 forwards a model instead of 6: isolation's unperturbed pass serves parity, and the faithful trunk's
    serves every parity reference."""
    from models.bugzoo import bug_report
    model, x, mask, offset = family_model(family)
    names = ["none", *bug_names(family)]
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))      # copied into each bugged copy
    rows = bug_report(model, x, mask, offset)
    assert len(calls) == 4 * len(names)
    hook.remove()
    assert [r["bug"] for r in rows] == names
    for row, bug in zip(rows, names):
        buggy = with_bug(model, bug)
        alone = {p: run_probe(p, buggy, x, mask, offset, **({"reference": model} if p == "parity" else {})).value
                 for p in PROBES}
        assert {p: row[p] for p in PROBES} == alone, bug


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_bug_shares_the_models_weights_and_leaves_the_model_as_it_was(bug):
    """with_bug copies the modules, not the weights (a production trunk's are 1.3 GB): every parameter of the
    buggy model is the model's own tensor; the buggy model computes what a deep copy with the bug computes, bit
    for bit, and the model computes what it did before."""
    import copy
    model, x, mask, off = family_model(BUGS[bug].family)
    with torch.no_grad():
        before = model(x, mask, off).embeddings
        buggy = with_bug(model, bug)
        assert [p.data_ptr() for p in buggy.parameters()] == [p.data_ptr() for p in model.parameters()]
        deep = copy.deepcopy(model)
        BUGS[bug].patch(deep)
        assert_bit_exact(buggy(x, mask, off).embeddings, deep(x, mask, off).embeddings, "same computation")
        assert_bit_exact(model(x, mask, off).embeddings, before, "same computation")
        # every module is the copy's own, its containers too: a hook on the copy never runs in the model
        assert not {id(m) for m in buggy.modules()} & {id(m) for m in model.modules()}
        seen = []
        for m in buggy.modules():
            m.register_forward_hook(lambda module, *a: seen.append(id(module)))
        model(x, mask, off)
        assert not seen
        buggy(x, mask, off)
        assert seen


@pytest.mark.parametrize("bug", list(BUGS))
def test_bugs_are_planted_through_the_models_own_extension_points(bug, monkeypatch):
    """No forward is copied and no method patched: every module of the buggy copy is the model's own
    class with no instance attribute shadowing a method, and a change to the classes' forwards (here a
    count of every decoder layer's and attention's calls) reaches the bug."""
    import models.grok as grok
    import models.xrex as xrex
    family = BUGS[bug].family
    model, x, mask, off = family_model(family)
    buggy = with_bug(model, bug)
    for m in buggy.modules():
        assert type(m).__module__ != "models.bugzoo", type(m)
        shadowed = [n for n in vars(m) if callable(getattr(type(m), n, None))]
        assert not shadowed, (type(m).__name__, shadowed)
    calls = []
    source = grok if family == "grok" else xrex
    for cls in (source.DecoderLayer, source.MultiHeadAttention):
        real = cls.forward
        monkeypatch.setattr(cls, "forward", lambda self, *a, _real=real, **k: calls.append(type(self)) or
                            _real(self, *a, **k))
    with torch.no_grad():
        buggy(x, mask, off)
    layers = [m for m in buggy.modules() if isinstance(m, source.DecoderLayer)]
    assert len(calls) == 2 * len(layers) > 0
