"""How close two floating-point results must be: the one tolerance rule the numerics tests share.

Each numerics test checks one of two kinds of property, and says which:

- **bit-exact by construction**: both sides run the same operations on the same numbers (candidate isolation:
  a perturbed candidate's row never enters another row's reductions). Compare with ``torch.equal``; a
  tolerance there would hide a leak.
- **exact in real arithmetic**: both sides compute the same real number by different roundings (another
  candidate order or batch size, another kernel, GQA against repeated heads, fp32 against a float64
  reference). How a reduction is split depends on the CPU (SIMD width via ATEN_CPU_CAPABILITY, MKL's code
  path, the thread count), so such results agree only within ``rounding_bound``.

The bound (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1): a sum or dot product of
n terms, computed in any order, satisfies |fl(s) - s| <= gamma_n * sum|terms| with gamma_n = n*u / (1 - n*u)
and u = eps/2 the unit roundoff, so two orderings differ by at most 2 * gamma_n * sum|terms|. A forward pass
chains ``depth`` such reductions; normalisations (RMSNorm, softmax) keep every stage's terms at the scale of
the compared values, so the errors add and

    max |got - want| <= depth * 2 * gamma_n * max |want|,   n the longest reduction.

This is a worst case: observed differences are a few eps (errors of random sign grow like sqrt(n), not n),
while a real bug (a leaked mask entry, a wrong sign, a misread weight) moves results by a visible fraction of
max |want|; the tests that plant such bugs check they land above this bound.
"""
import numpy as np
import torch


def rounding_bound(dtype, n: int, depth: int = 1) -> float:
    """depth * 2 * gamma_n for ``dtype``: the largest max|got - want| / max|want| rounding can explain when
    `depth` chained reductions of at most `n` terms are computed in two different orders."""
    u = torch.finfo(dtype).eps / 2
    assert n * u < 0.5, f"n: got {n}; allowed: n * unit roundoff < 1/2 for {dtype} (the bound says nothing)"
    return depth * 2 * n * u / (1 - n * u)


def forward_bound(num_layers: int, *lengths: int, dtype=torch.float32) -> float:
    """rounding_bound of a decoder forward: per layer q.k, the softmax's sum, probs @ v, the output
    projection and the FFN's two matmuls, then the unembedding; n the longest of `lengths` (the embedding
    size, FFN width, sequence length)."""
    return rounding_bound(dtype, max(lengths), depth=6 * num_layers + 1)


def relative_error(got, want, valid=None) -> float:
    """max |got - want| / max |want| over the rows `valid` selects (all rows when None), in float64."""
    got, want = (np.asarray(t.detach().cpu().double() if torch.is_tensor(t) else t, dtype=np.float64)
                 for t in (got, want))
    if valid is not None:
        keep = np.asarray(valid.cpu() if torch.is_tensor(valid) else valid, dtype=bool)
        got, want = got[keep], want[keep]
    scale = np.abs(want).max()
    return float(np.abs(got - want).max() / scale) if scale > 0 else float(np.abs(got).max())


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
