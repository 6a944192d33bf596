"""Model-level probes: questions asked of a trunk by perturbing its inputs, each answered by one number.

Every probe takes a trunk-like model ``model(embeddings [B, T, D], mask [B, T] bool,
candidate_start_offset) -> TransformerOutput`` — a ``Transformer``, a ``models.bugzoo`` copy of
one, or a self-attention stack from ``models.variants`` (isolation / causality; parity needs a
grok ``Transformer`` to rebuild the correct reference from) — and returns the largest change (or error) it found; ``run_probe`` compares that with the probe's
tolerance. 0 means the property holds exactly.

    isolation_probe(model, x, mask, off, candidate=0)  perturb one candidate: max change on the others
    causality_probe(model, x, mask, off)               perturb each position: max change on earlier ones
                                                       (T-1 perturbed rows, batched; long inputs: capped_layout)
    parity_probe(model, x, mask, off)                  max relative error vs the correct trunk

Only valid (unpadded) positions are compared: outputs at padded slots mean nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .grok import Transformer


def _trunk_out(model, x, mask, offset) -> torch.Tensor:
    return model(x, mask, offset).embeddings


PERTURBATIONS = ("scale", "noise", "replace")


def perturb(x: torch.Tensor, position: int, how: str = "noise", size: float = 1.0, seed: int = 0,
            replacement: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The one perturbation of every probe (and of the explorer's Isolation tab): `x` ([B, T, D]) with
    `position` changed in every row. noise: plus `size` times seeded unit noise (one draw of [B, D]);
    scale: times `size`; replace: `replacement` ([B, D], e.g. another item's embedding) put there."""
    out = x.clone()
    if how == "noise":
        g = torch.Generator().manual_seed(int(seed))
        out[:, position] = x[:, position] + torch.randn(x.shape[0], x.shape[-1], generator=g,
                                                        dtype=torch.float32).to(x) * size
    elif how == "scale":
        out[:, position] = x[:, position] * size
    elif how == "replace" and replacement is not None:
        out[:, position] = replacement.to(x)
    else:
        raise ValueError(f"perturbation: got {how!r}{' without a replacement' if how == 'replace' else ''}; "
                         f"allowed: {', '.join(PERTURBATIONS)} (replace with a [B, D] replacement)")
    return out


def other_candidates(mask: torch.Tensor, candidate_start_offset: int, candidate: int) -> torch.Tensor:
    """[B, T] bool: the valid candidates other than `candidate` — where an isolation probe looks."""
    others = mask.to(dtype=torch.bool, copy=True)
    others[:, :candidate_start_offset] = False
    others[:, candidate_start_offset + candidate] = False
    return others


@torch.no_grad()
def isolation_probe(model, embeddings, mask, candidate_start_offset: int, *, candidate: int = 0,
                    scale: float = 1.0, seed: int = 0, perturbation: str = "noise",
                    replacement: Optional[torch.Tensor] = None) -> float:
    """Perturb candidate `candidate`'s input embedding (``perturb``: noise of size `scale` unless told
    otherwise); return the max |change| in the outputs of every other valid candidate. 0 = candidates
    are isolated (each score depends on the user, the history and that candidate only)."""
    B, T, _ = embeddings.shape
    pos = candidate_start_offset + candidate
    if not candidate_start_offset <= pos < T:
        raise ValueError(f"candidate: got {candidate}; allowed: 0..{T - candidate_start_offset - 1} "
                         f"(the number of candidates)")
    before = _trunk_out(model, embeddings, mask, candidate_start_offset)
    after = _trunk_out(model, perturb(embeddings, pos, perturbation, scale, seed, replacement), mask,
                       candidate_start_offset)
    others = other_candidates(mask.to(embeddings.device), candidate_start_offset, candidate)
    change = (after - before).abs().amax(-1)                                     # [B, T]
    return float(change.masked_fill(~others, 0).amax())          # the one host read: the answer


CAUSALITY_CHUNK = 16      # perturbed copies per batched forward


def capped_layout(embeddings, mask, candidate_start_offset: Optional[int], max_positions: int):
    """The same input cut to at most `max_positions` positions, keeping its structure: the first
    prefix positions (user, then history) and the first candidates — a quarter of the cap, at least
    one — so the recsys mask still has both parts. -> (embeddings, mask, offset). A trunk's
    causality is a property of its wiring, not of the length, so a short layout asks the same question."""
    T = embeddings.shape[1]
    if T <= max_positions:
        return embeddings, mask, candidate_start_offset
    if candidate_start_offset is None:
        return embeddings[:, :max_positions], mask[:, :max_positions], None
    candidates = min(T - candidate_start_offset, max(1, max_positions // 4))
    prefix = min(candidate_start_offset, max_positions - candidates)
    keep = torch.cat([torch.arange(prefix), candidate_start_offset + torch.arange(candidates)])
    return embeddings[:, keep], mask[:, keep], prefix


@torch.no_grad()
def causality_probe(model, embeddings, mask, candidate_start_offset: Optional[int] = None, *,
                    scale: float = 1.0, seed: int = 0, chunk: int = CAUSALITY_CHUNK) -> float:
    """Does any position depend on a later one? For each position p, perturb its input and take
    the max |change| at valid positions before p; return the largest. 0 = causal. (grok.py's
    recsys mask is causal; production phoenix's bidirectional prefix is not, by design.)

    The T-1 perturbed copies run `chunk` at a time as one batch, and the unperturbed input runs as
    a batch of the same shape: every row then goes through the same kernels in the same reduction
    order, so a causal model gives exactly 0, not fp32 rounding. Still T-1 rows of work: callers
    with long inputs pass a ``capped_layout``."""
    B, T, D = embeddings.shape
    positions = list(range(1, T))
    if not positions:
        return 0.0
    k = min(chunk, len(positions))
    x_rep, mask_rep = embeddings.repeat(k, 1, 1), mask.repeat(k, 1)                 # [k*B, T, D], row r*B+b
    before = _trunk_out(model, x_rep, mask_rep, candidate_start_offset)
    valid = mask.bool()
    worst = 0.0
    for start in range(0, len(positions), k):
        ps = positions[start:start + k]
        x = x_rep.clone()
        for r, p in enumerate(ps):
            x[r * B:(r + 1) * B] = perturb(embeddings, p, "noise", scale, seed + p)
        after = _trunk_out(model, x, mask_rep, candidate_start_offset)
        for r, p in enumerate(ps):
            rows = slice(r * B, (r + 1) * B)
            earlier = valid[:, :p]
            if earlier.any():
                change = (after[rows] - before[rows])[:, :p].abs().amax(-1)            # [B, p]
                worst = max(worst, float(change[earlier].max()))
    return worst


def correct_reference(model) -> Transformer:
    """The faithful trunk with `model`'s weights (same dtype): what every bug is measured against.
    A grok.py ``Transformer`` or a production ``models.xrex.XrexTrunk``: a bugzoo copy keeps its class,
    so ``type(model)(model.config)`` rebuilds the unpatched one. (Both are checked against independent
    float64 NumPy forwards: tests/test_grok.py, tests/test_xrex.py.)"""
    ref = type(model)(model.config)
    ref.load_state_dict(model.state_dict())
    return ref.to(next(model.parameters()).dtype)


@torch.no_grad()
def parity_probe(model, embeddings, mask, candidate_start_offset: Optional[int] = None, *,
                 reference=None) -> float:
    """max |model - reference| / max |reference| over valid positions. reference defaults to the
    correct trunk with the same weights (``correct_reference``); tests/test_bugzoo.py also checks
    the bugs against the independent float64 NumPy forward."""
    reference = correct_reference(model) if reference is None else reference
    out = _trunk_out(model, embeddings, mask, candidate_start_offset).double()
    ref = _trunk_out(reference, embeddings, mask, candidate_start_offset).double()
    valid = mask.bool()
    return float((out - ref).abs()[valid].max() / ref.abs()[valid].max().clamp_min(1e-30))


# --- registry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    fn: Callable[..., float]
    tolerance: float
    question: str
    max_positions: Optional[int] = None    # longer inputs are cut to a capped_layout first (work ~ T rows)


PROBES: dict[str, Probe] = {
    "isolation": Probe(isolation_probe, 1e-6, "does changing one candidate change another's output?"),
    "causality": Probe(causality_probe, 1e-6, "does any position depend on a later one?", max_positions=16),
    # room for fp32 rounding when the reference runs other kernels (the port vs NumPy: ~1e-6)
    "parity": Probe(parity_probe, 2e-5, "does it compute grok.py's numbers (the correct trunk, same weights)?"),
}


@dataclass
class ProbeResult:
    probe: str
    value: float
    tolerance: float
    flagged: bool          # value > tolerance: the property is broken
    positions: int = 0     # the input length it looked at (shorter than the input's when capped)

    def __str__(self):
        return f"{self.probe}: {self.value:.3g} ({'FLAGGED' if self.flagged else 'ok'}, tolerance {self.tolerance:g})"


def run_probe(name: str, model, embeddings, mask, candidate_start_offset=None, **kwargs) -> ProbeResult:
    if name not in PROBES:
        raise ValueError(f"probe: got {name!r}; allowed: {', '.join(PROBES)}")
    p = PROBES[name]
    if p.max_positions is not None:
        embeddings, mask, candidate_start_offset = capped_layout(embeddings, mask, candidate_start_offset,
                                                                 p.max_positions)
    value = p.fn(model, embeddings, mask, candidate_start_offset, **kwargs)
    return ProbeResult(name, value, p.tolerance, value > p.tolerance, embeddings.shape[1])

