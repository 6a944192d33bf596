"""The tolerance rule holds itself: a bit-for-bit comparison of floats in a test goes through
assert_bit_exact with one of the BIT_EXACT reasons (tests/conftest.py refuses any other), each call site names
its reason in plain sight, and the float64 parity bound is tight enough that a 1e-5 error cannot hide in it."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from tolerances import (BIT_EXACT, PARITY_RTOL, assert_beyond_rounding, assert_bit_exact, assert_rounding_close,
                        forward_bound)

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("compare", [torch.equal, np.array_equal, np.testing.assert_array_equal,
                                     np.testing.assert_equal,
                                     lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=0)])
def test_a_raw_bit_comparison_of_floats_in_a_test_is_refused(compare):
    x = torch.ones(3)
    with pytest.raises(AssertionError, match=r"on floating-point values in test_tolerances\.py:\d+: bits agree "
                                             r"only for the same computation"):
        compare(x if compare is torch.equal else x.numpy(), x.clone() if compare is torch.equal else x.numpy())


def test_integers_bools_and_tolerances_pass_the_guard():
    assert torch.equal(torch.arange(3), torch.arange(3)) and np.array_equal(np.ones(2, bool), np.ones(2, bool))
    np.testing.assert_array_equal(np.arange(4), np.arange(4))
    np.testing.assert_allclose(np.ones(2), np.ones(2) + 1e-12, rtol=1e-9)


def test_assert_bit_exact_takes_only_the_named_reasons_and_sees_one_ulp():
    x = torch.tensor([1.0, float("nan")])
    assert_bit_exact(x, x.clone(), "same computation")                       # NaN equals NaN
    with pytest.raises(ValueError, match=r"because: got 'close enough'; allowed: isolation, same computation"):
        assert_bit_exact(x, x, "close enough")
    with pytest.raises(AssertionError, match=r"not bit-exact \(isolation: "):
        assert_bit_exact(x, torch.nextafter(x, torch.full_like(x, 2.0)), "isolation")


def bit_exact_reasons() -> dict[str, list[str]]:
    """Every assert_bit_exact call in the tests: {reason: ["file:line", ...]}; a reason that is not a string
    literal is listed under '<computed>'."""
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "assert_bit_exact":
                because = node.args[2] if len(node.args) > 2 else next(
                    (k.value for k in node.keywords if k.arg == "because"), None)
                reason = because.value if isinstance(because, ast.Constant) else "<computed>"
                found.setdefault(reason, []).append(f"{path.name}:{node.lineno}")
    return found


def test_every_bit_exact_comparison_names_an_allowed_reason_in_plain_sight():
    """The allowed list is the call sites: each names a BIT_EXACT reason as a literal, so a reviewer can read
    why the bits agree where they are compared (tests/test_tolerances.py itself checks the refusal)."""
    found = bit_exact_reasons()
    found.pop("close enough", None)                    # this file's own refused example
    assert set(found) <= set(BIT_EXACT), {k: v for k, v in found.items() if k not in BIT_EXACT}
    assert set(found) == set(BIT_EXACT)                # every reason is in use: none is dead


def test_float64_parity_bounds_are_tight_enough_for_a_1e5_error():
    """The float64 bound of the largest parity forward (phoenix-nano's shape: 2 layers here, T 128, D 256)
    is below PARITY_RTOL, and a 1e-5 relative error is far outside it, while the float32 bound would hide it."""
    bound64 = forward_bound(2, 256, 688, 128, dtype=torch.float64)
    assert bound64 <= PARITY_RTOL < 1e-5
    assert forward_bound(2, 256, 688, 128, dtype=torch.float32) > 1e-5
    want = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert_rounding_close(want * (1 + 1e-15), want, n=128, depth=13, dtype=torch.float64)
    assert_beyond_rounding(want * (1 + 1e-5), want, n=128, depth=13, dtype=torch.float64)


def test_storage_forward_bound_holds_in_bf16_and_a_mask_leak_lands_above_it():
    """The CUDA trunk tests' bound, on CPU: the lecture trunk stored in bf16 with another attention backend stays
    within storage_forward_bound of naive in bf16, and the bug zoo's leaked decoder mask lands above it."""
    from models.bugzoo import with_bug
    from models.grok import Transformer, init_params
    from models.presets import get_preset
    from tolerances import relative_error, storage_forward_bound
    config = get_preset("lecture").transformer.replace(cap_method="tanh", logit_cap=2.0)
    model = init_params(Transformer(config), "random", seed=1).to(torch.bfloat16)
    emb = torch.randn(2, 9, config.emb_size, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, 4:6] = False
    with torch.no_grad():
        recorded = model(emb, valid, 6, record=True)
        ref = recorded.embeddings
        other = model(emb, valid, 6, backend="structured").embeddings
        leaked = with_bug(model, "unmasked-decoder")(emb, valid, 6).embeddings
    logit_max = max(float(layer.logits.float().abs().max()) for layer in recorded.layers)
    bound = storage_forward_bound(config.num_layers, config.emb_size, config.ffn_hidden, 9, logit_max=logit_max)
    assert relative_error(other, ref, valid) <= bound < relative_error(leaked, ref, valid)


def test_softmax_bound_holds_and_is_reached_by_the_worst_rounding():
    """Logits each moved by at most e (here u |s| of bf16's rounding, signs chosen worst: the largest logit
    up, the rest down) change every probability by a relative amount within softmax_bound(e), and the worst
    case comes within a factor 2 of it: the bound is the softmax's own conditioning, not a loose guess."""
    from tolerances import softmax_bound, unit_roundoff
    s = torch.tensor([22.0, 21.0, 3.0, -5.0, 0.5], dtype=torch.float64)
    e = unit_roundoff(torch.bfloat16) * float(s.abs().max())
    p = torch.softmax(s, 0)
    worst = 0.0
    for signs in torch.cartesian_prod(*[torch.tensor([-1.0, 1.0], dtype=torch.float64)] * len(s)):
        moved = torch.softmax(s + signs * e, 0)
        worst = max(worst, float(((moved - p).abs() / p).max()))
    assert softmax_bound(e) / 2 < worst <= softmax_bound(e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_benchmarks_attention_bound_is_this_rule(dtype):
    """explorer.measure checks every timed point with its own copy of attention_bound (the benchmark cannot
    import the tests): the two agree at the lecture's, phoenix-prod's and the long grid's shapes."""
    from explorer.measure import attention_error_bound
    from tolerances import attention_bound
    for keys, head_dim, logit_max, dot_max in [(12, 8, 3.0, 10.0), (1087, 128, 22.2, 60.0), (32768, 128, 6.0, 30.0)]:
        assert attention_error_bound(str(dtype).removeprefix("torch."), keys, head_dim, logit_max, dot_max) == \
            pytest.approx(attention_bound(dtype, keys, head_dim, logit_max, dot_max), rel=1e-12)
