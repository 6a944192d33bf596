"""How close two floating-point results must be: the one tolerance rule the numerics tests share.

Each numerics test checks one of two kinds of property, and says which:

- **bit-exact by construction**: both sides are the same computation — the same operations on the same
  numbers, at the same shapes and row positions, with the same thread count, in one process. Three reasons
  qualify (``BIT_EXACT``): candidate isolation (a perturbed row never enters the compared rows' reductions),
  one computation read twice (a cached forward, a view of it, the page drawing the server's numbers), and no
  rounding at all (copies, loads, casts and operations exact in floating point). Compare with
  ``assert_bit_exact(got, want, because)``; a tolerance there would hide a leak. tests/conftest.py refuses
  any other bit-for-bit comparison of floating-point values in a test (``torch.equal``, ``np.array_equal``,
  ``np.testing.assert_array_equal``): the hardware promises nothing more.
- **exact in real arithmetic**: both sides compute the same real number by different roundings (another
  candidate order or batch size, another thread count or process, another kernel, GQA against repeated
  heads, a model against a float64 reference). How a reduction is split depends on the CPU (SIMD width via
  ATEN_CPU_CAPABILITY, MKL's code path — another one on AMD than on Intel —, the thread count, a row's
  position in a matrix product), so such results agree only within ``rounding_bound``.

Parity with the float64 NumPy references runs the models in float64 end to end, where the bound below
is ~1e-12: a planted relative error of 1e-5 anywhere (a scale, an eps, a cap, a RoPE base) lands orders of
magnitude above it. ``PARITY_RTOL`` caps every float64 parity bound.

The bound (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1): a sum or dot product of
n terms, computed in any order, satisfies |fl(s) - s| <= gamma_n * sum|terms| with gamma_n = n*u / (1 - n*u)
and u = eps/2 the unit roundoff, so two orderings differ by at most 2 * gamma_n * sum|terms|. A forward pass
chains ``depth`` such reductions; normalisations (RMSNorm, softmax) keep every stage's terms at the scale of
the compared values, so the errors add and

    max |got - want| <= depth * 2 * gamma_n * max |want|,   n the longest reduction.

This is a worst case: observed differences are a few eps (errors of random sign grow like sqrt(n), not n),
while a real bug (a leaked mask entry, a wrong sign, a misread weight) moves results by a visible fraction of
max |want|; the tests that plant such bugs check they land above this bound.

**The softmax is not a normalisation of that kind.** Its output depends on its logits' differences, so a
logit s rounded to bf16 / fp16 (grok.py's q.k einsum returns the input dtype) moves by up to u |s|, and its
probability p_j = exp(s_j) / sum_k exp(s_k) by a factor within exp(±2u max|s|): the softmax's condition
number is the size of its logits, not 1 (``softmax_bound``). At the GPU test's shapes (|s| up to 22) that is
17 % of a weight in bf16, where ``rounding_bound(bf16, 1)`` is 0.8 %. An attention output is a weighted
average of v rows, so it moves by at most that fraction of the same average of |v| (``attention_bound``:
element by element against the fp32 reference's own weights applied to |v|, a bound a missing cap or a
leaked mask entry lands far above). The flash kernels keep their logits in fp32, so in bf16 they sit much
closer to the fp32 result than grok.py's own einsum does (benchmarks/results/numerics-*.json measures how
much).
"""
import math

import numpy as np
import torch

# what makes two floating-point results the same bits: the only reasons assert_bit_exact takes
BIT_EXACT = {
    "isolation": "the changed inputs never enter the compared values' reductions (same shapes, rows, threads)",
    "same computation": "one computation read twice in one process: a cached forward, a view drawing its "
                        "tensors, the page drawing the numbers the server sent",
    "no rounding": "nothing is rounded between the two: copies, loads, casts that round-trip, x + 0, x * 1",
}

# the largest relative error a float64 parity test may allow (its rounding bound must be below this)
PARITY_RTOL = 1e-10


def rounding_bound(dtype, n: int, depth: int = 1) -> float:
    """depth * 2 * gamma_n for ``dtype``: the largest max|got - want| / max|want| rounding can explain when
    `depth` chained reductions of at most `n` terms are computed in two different orders."""
    u = unit_roundoff(dtype)
    assert n * u < 0.5, f"n: got {n}; allowed: n * unit roundoff < 1/2 for {dtype} (the bound says nothing)"
    return depth * 2 * n * u / (1 - n * u)


def unit_roundoff(dtype) -> float:
    return torch.finfo(dtype).eps / 2


def softmax_bound(logit_error: float) -> float:
    """The largest relative change of any softmax probability when each logit moves by at most
    `logit_error`: the numerator exp(s_j) and the sum each move by a factor within exp(±logit_error)."""
    return math.expm1(2 * logit_error)


def attention_bound(dtype, keys: int, head_dim: int, logit_max: float, dot_max: float) -> float:
    """C with |got - want| <= C * (P|v|) element by element, where want is grok.py's attention in fp32 on the
    same `dtype`-valued inputs, P|v| the same weights applied to |v| (what every output is an average of), and
    got that attention from any backend storing `dtype` and summing in fp32, its keys split into pieces or not.
    logit_max: max |logit| entering the softmax (after the cap: a tanh cap passes a raw logit's u|s| on as at
    most u |cap(s)|, since x sech^2 x <= tanh x); dot_max: a bound on multiplier * sum_d |q_d k_d| (the
    fp32 dot products' error scale, e.g. multiplier * max|q_i| * max|k_j| in 2-norms).
    - the logits rounded to `dtype` once (u max|s|; none in fp32) and each side's fp32 dot product
      (gamma_K dot_max each) move every weight by softmax_bound of their sum;
    - the probabilities, a piece's output and the merged output rounded to `dtype` once each: 3u;
    - each side's fp32 sums over the keys (the softmax's normaliser, probs @ v) and merging pieces by their
      log-sum-exp: 6 gamma_keys (rounding_bound(float32, keys, depth=3))."""
    u = 0.0 if torch.finfo(dtype).bits >= 32 else unit_roundoff(dtype)
    gamma_dot = rounding_bound(torch.float32, head_dim) / 2
    return (softmax_bound(u * logit_max + 2 * gamma_dot * dot_max) + 3 * u
            + rounding_bound(torch.float32, keys, depth=3))


def assert_attention_close(got, ref, *, dtype, valid=None):
    """`got` is attention on `dtype` inputs within attention_bound of `ref` (explorer.measure.reference_attention
    of the same inputs: .out, .scale = P|v|, .logit_max, .dot_max), element by element over the query rows
    `valid` selects ([B, T] bool; all when None)."""
    keys, head_dim = ref.out.shape[1], ref.out.shape[-1]
    bound = attention_bound(dtype, keys, head_dim, ref.logit_max, ref.dot_max)
    ratio = attention_error_ratio(got, ref, valid) / bound
    assert ratio <= 1, (f"|got - want| reaches {ratio:.3g} x the attention rounding bound {bound:.3g} x P|v| "
                        f"(dtype {dtype}, max |logit| {ref.logit_max:.3g})")


def attention_error_ratio(got, ref, valid=None) -> float:
    """max |got - ref.out| / ref.scale over the valid query rows (in float64; NaN anywhere gives inf)."""
    diff = (got.detach().double() - ref.out.double()).abs() / ref.scale.double().clamp_min(1e-300)
    if valid is not None:
        diff = diff[valid.to(diff.device)]
    return float("inf") if bool(diff.isnan().any()) else float(diff.max())


def forward_bound(num_layers: int, *lengths: int, dtype=torch.float32) -> float:
    """rounding_bound of a decoder forward: per layer q.k, the softmax's sum, probs @ v, the output
    projection and the FFN's two matmuls, then the unembedding; n the longest of `lengths` (the embedding
    size, FFN width, sequence length)."""
    return rounding_bound(dtype, max(lengths), depth=6 * num_layers + 1)


def storage_forward_bound(num_layers: int, *lengths: int, logit_max: float, dtype=torch.bfloat16) -> float:
    """forward_bound for a decoder whose values are stored in `dtype` (bf16 / fp16: the trunks of
    tests/test_device.py) and whose reductions accumulate in fp32, against the same model in `dtype` with
    another attention backend: the fp32 reductions' forward_bound, plus each of its 6 * num_layers + 1
    stages rounding its output to `dtype` once on each side (rounding_bound with n = 1, the same depth), plus
    each layer's softmax moved by its logits' rounding (softmax_bound of u * logit_max, the largest |logit|
    of any layer: naive's einsum rounds them to `dtype`, a fused kernel keeps them in fp32)."""
    return (forward_bound(num_layers, *lengths) + rounding_bound(dtype, 1, depth=6 * num_layers + 1)
            + num_layers * softmax_bound(unit_roundoff(dtype) * logit_max))


def relative_error(got, want, valid=None) -> float:
    """max |got - want| / max |want| over the rows `valid` selects (all rows when None), in float64."""
    got, want = (np.asarray(t.detach().cpu().double() if torch.is_tensor(t) else t, dtype=np.float64)
                 for t in (got, want))
    if valid is not None:
        keep = np.asarray(valid.cpu() if torch.is_tensor(valid) else valid, dtype=bool)
        got, want = got[keep], want[keep]
    scale = np.abs(want).max()
    return float(np.abs(got - want).max() / scale) if scale > 0 else float(np.abs(got).max())


def assert_bit_exact(got, want, because: str, what: str = ""):
    """`got` and `want` hold the same bits (NaN equal to NaN), for one of the BIT_EXACT reasons; `what` names
    the compared values in the failure."""
    if because not in BIT_EXACT:
        raise ValueError(f"because: got {because!r}; allowed: {', '.join(BIT_EXACT)} (tests/tolerances.py: "
                         f"anything else is exact in real arithmetic only — use assert_rounding_close)")
    got, want = (np.asarray(t.detach().cpu() if torch.is_tensor(t) else t) for t in (got, want))
    assert got.shape == want.shape, f"{what} shapes differ: {got.shape} != {want.shape} ({because})"
    same = np.array_equal(got, want, equal_nan=got.dtype.kind in "fc" and want.dtype.kind in "fc")
    if not same:
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        raise AssertionError(f"{what} not bit-exact ({because}: {BIT_EXACT[because]}): max |got - want| = "
                             f"{np.nanmax(diff):.3g} at {np.unravel_index(np.nanargmax(diff), diff.shape)}")


def assert_rounding_close(got, want, *, n: int, depth: int = 1, dtype=torch.float32, valid=None):
    """`got` and `want` are the same real numbers up to rounding: their relative error is within
    ``rounding_bound(dtype, n, depth)``."""
    err, bound = relative_error(got, want, valid), rounding_bound(dtype, n, depth)
    assert err <= bound, f"max|got - want| / max|want| = {err:.3g} > rounding bound {bound:.3g} (n={n}, depth={depth})"


def assert_beyond_rounding(got, want, *, n: int, depth: int = 1, dtype=torch.float32, valid=None):
    """`got` and `want` differ by more than rounding can explain: a real change, not a reordering."""
    err, bound = relative_error(got, want, valid), rounding_bound(dtype, n, depth)
    assert err > bound, f"max|got - want| / max|want| = {err:.3g} <= rounding bound {bound:.3g}: no real change"


def randn_attention_abs_bound(n: int, dtype=torch.float32) -> float:
    """Absolute rounding bound for attention over at most `n` keys (or head dims) on standard-normal q, k, v,
    as the benchmarks draw them: 4 deep (q.k, softmax sum, probs @ v, merging a backend's pieces), scaled by
    max|out| <= max|v| < 6 (a standard normal passes 6 with probability 2e-9)."""
    return 6 * rounding_bound(dtype, n, depth=4)
