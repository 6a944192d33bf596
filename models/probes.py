"""Model-level probes: questions asked of a trunk by perturbing its inputs, each answered by one number.

Every probe takes a trunk-like model ``model(embeddings [B, T, D], mask [B, T] bool,
candidate_start_offset) -> TransformerOutput`` — a ``Transformer``, a ``models.bugzoo`` copy of
one, or a self-attention stack from ``models.variants`` (isolation / causality; parity needs a
grok ``Transformer`` to rebuild the correct reference from) — and returns the largest change (or error) it found; ``run_probe`` compares that with the probe's
tolerance. 0 means the property holds exactly.

    isolation_probe(model, x, mask, off, candidate=0)  perturb one candidate: max change on the others
    causality_probe(model, x, mask, off)               perturb each position: max change on earlier ones
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


def _perturbation(x: torch.Tensor, positions, scale: float, seed: int) -> torch.Tensor:
    """x plus seeded unit noise times `scale` at `positions` (a [B, T] bool)."""
    g = torch.Generator().manual_seed(int(seed))
    noise = torch.randn(x.shape, generator=g, dtype=torch.float32).to(x) * scale
    return torch.where(positions[..., None], x + noise, x)


@torch.no_grad()
def isolation_probe(model, embeddings, mask, candidate_start_offset: int, *, candidate: int = 0,
                    scale: float = 1.0, seed: int = 0) -> float:
    """Perturb candidate `candidate`'s input embedding; return the max |change| in the outputs of
    every other valid candidate. 0 = candidates are isolated (each score depends on the user,
    the history and that candidate only)."""
    B, T, _ = embeddings.shape
    pos = candidate_start_offset + candidate
    if not candidate_start_offset <= pos < T:
        raise ValueError(f"candidate: got {candidate}; allowed: 0..{T - candidate_start_offset - 1} "
                         f"(the number of candidates)")
    target = torch.zeros(B, T, dtype=torch.bool, device=embeddings.device)
    target[:, pos] = True
    before = _trunk_out(model, embeddings, mask, candidate_start_offset)
    after = _trunk_out(model, _perturbation(embeddings, target, scale, seed), mask, candidate_start_offset)
    others = mask.to(embeddings.device, dtype=torch.bool, copy=True)
    others[:, :candidate_start_offset] = False
    others[:, pos] = False
    change = (after - before).abs().amax(-1)                                     # [B, T]
    return float(change.masked_fill(~others, 0).amax())          # the one host read: the answer


@torch.no_grad()
def causality_probe(model, embeddings, mask, candidate_start_offset: Optional[int] = None, *,
                    scale: float = 1.0, seed: int = 0) -> float:
    """Does any position depend on a later one? For each position p, perturb its input and take
    the max |change| at valid positions before p; return the largest. 0 = causal. (grok.py's
    recsys mask is causal; production phoenix's bidirectional prefix is not, by design.)"""
    B, T, D = embeddings.shape
    before = _trunk_out(model, embeddings, mask, candidate_start_offset)
    worst = 0.0
    for p in range(1, T):
        target = torch.zeros(B, T, dtype=torch.bool, device=embeddings.device)
        target[:, p] = True
        after = _trunk_out(model, _perturbation(embeddings, target, scale, seed + p), mask, candidate_start_offset)
        earlier = mask.bool()[:, :p]
        change = (after - before)[:, :p].abs().amax(-1)                          # [B, p]
        if earlier.any():
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


PROBES: dict[str, Probe] = {
    "isolation": Probe(isolation_probe, 1e-6, "does changing one candidate change another's output?"),
    "causality": Probe(causality_probe, 1e-6, "does any position depend on a later one?"),
    # room for fp32 rounding when the reference runs other kernels (the port vs NumPy: ~1e-6)
    "parity": Probe(parity_probe, 2e-5, "does it compute grok.py's numbers (the correct trunk, same weights)?"),
}


@dataclass
class ProbeResult:
    probe: str
    value: float
    tolerance: float
    flagged: bool          # value > tolerance: the property is broken

    def __str__(self):
        return f"{self.probe}: {self.value:.3g} ({'FLAGGED' if self.flagged else 'ok'}, tolerance {self.tolerance:g})"


def run_probe(name: str, model, embeddings, mask, candidate_start_offset=None, **kwargs) -> ProbeResult:
    if name not in PROBES:
        raise ValueError(f"probe: got {name!r}; allowed: {', '.join(PROBES)}")
    p = PROBES[name]
    value = p.fn(model, embeddings, mask, candidate_start_offset, **kwargs)
    return ProbeResult(name, value, p.tolerance, value > p.tolerance)

