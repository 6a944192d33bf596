"""The Isolation tab: perturb one candidate and see where the change goes, layer by layer and in every
candidate's logits, under the model's own mask (nowhere else) and under a causal mask (later candidates
move). Its functions, its cost, its exports' captions and its record.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import plotly.graph_objects as go
import torch

from models.probes import PERTURBATIONS, other_candidates, perturb

from .. import budget, runs
from ..figures import Panel, grouped_bar_figure, heatmap_figure
from ..limits import Cost, forward_cost, recorded_bytes
from ..schema import Control, ModelSettings, Settings
from .panels import SINGLE_MAX_CELLS, row_note
from .records import Export, Part, Plot, Text, View, recorded_cost

# the tab's own controls (beside candidate j, which the invariance view's 'drop' reads too)
PERTURBATION = Control("perturbation", "scale", "perturbation", choices=PERTURBATIONS)
DELTA = Control("delta", 2.0, "size (scale factor / noise σ)", number=float, lo=-1e6, hi=1e6,
                why="the perturbation size")
REPLACE_WITH = Control("replace_with", 1, "replace with item hash", number=int, lo=1, hi=1023, why="an item hash")

# The tab asks models.probes.PROBES["isolation"]'s question of the ranker the sidebar built, with that
# probe's perturbation (models.probes.perturb) and the same candidates looked at (other_candidates),
# and draws where the change goes layer by layer. It shows that probe only: the others answer questions
# about a trunk's wiring (causality, parity with grok.py), asked of every planted bug in the Variants
# tab's bug zoo table (bug_zoo_view), which lists every PROBES entry.

@dataclass
class Largest:
    """The largest change of one quantity on any candidate other than the perturbed one, and where."""
    value: float
    where: str                  # that candidate's label ('none': no other real candidate)

    def __str__(self) -> str:
        return f"{self.value:.6g}" + (f" ({self.where})" if self.value else "")


@dataclass
class IsolationReading:
    """What the Isolation tab draws for one mask kind, and the largest change on another candidate in each
    of the two quantities drawn: the residual stream (the heatmap) and the logits (the bars)."""
    mask_kind: str
    change: np.ndarray          # [L, T] max |Δ residual| over the embedding, per layer and position
    logit_change: np.ndarray    # [C] max |Δ logit| over actions, per candidate
    valid: np.ndarray           # [T] bool
    residual: Largest           # over every layer, as the heatmap draws it
    logits: Largest             # as the bars draw it

    @property
    def isolated(self) -> bool:
        # exact, tighter than the probe's tolerance: both runs share one batch shape, so rounding is identical
        return self.residual.value == 0.0 and self.logits.value == 0.0


def perturbed_embeddings(s: Settings) -> torch.Tensor:
    """The trunk's input of the shown batch row with candidate j changed as the settings ask ([1, T, D])."""
    emb = runs.forward(s).embeddings[s.row:s.row + 1]
    pos = s.candidate_start_offset + s.candidate
    replacement = None
    if PERTURBATION.of(s) == "replace":     # another item's hashes in candidate j's slot
        batch = runs.batch_for(s)
        post = batch.candidate_post_hashes.clone()
        post[:, s.candidate] = REPLACE_WITH.of(s)
        replacement = runs.score(s, replace(batch, candidate_post_hashes=post)).embeddings[s.row:s.row + 1, pos]
    return perturb(emb, pos, PERTURBATION.of(s), DELTA.of(s), seed=s.seed + 7, replacement=replacement)


def isolation_reading(s: Settings, mask_kind: str | None = None) -> IsolationReading:
    """Run the model twice (as is, and with candidate j perturbed) under one mask kind."""
    kind = mask_kind or s.mask_kind
    probe = (s.row, s.candidate, PERTURBATION.of(s), DELTA.of(s), REPLACE_WITH.of(s))
    return _isolation_reading(s.model, probe, kind)


@budget.ByteCache
def _isolation_reading(m: ModelSettings, probe: tuple, kind: str) -> IsolationReading:
    s = Settings(m, row=probe[0], candidate=probe[1]).with_view(
        {PERTURBATION: probe[2], DELTA: probe[3], REPLACE_WITH: probe[4]})
    r = slice(s.row, s.row + 1)          # the shown batch row, kept as a batch of one
    base_emb, pert_emb = runs.forward(s).embeddings[r], perturbed_embeddings(s)
    if kind == s.mask_kind:
        # the recorded forward already is the unperturbed run under the model's own mask; the perturbed
        # run keeps its batch shape ([B, T, D], row replaced): the same shapes and rows, so every row the
        # perturbation never reaches is the same computation, bit for bit
        base = runs.forward(s)
        batch_emb = base.embeddings.clone()
        batch_emb[r] = pert_emb
        pert = runs.score(s, embeddings=batch_emb, mask_kind=kind, record=True)
        base_layers = [replace(t, after_ffn=t.after_ffn[r]) for t in base.trunk.layers]
        pert_layers = [replace(t, after_ffn=t.after_ffn[r]) for t in pert.trunk.layers]
        base_logits, pert_logits = base.logits[r], pert.logits[r]
    else:
        both = runs.score(s, embeddings=torch.cat([base_emb, pert_emb]), mask_kind=kind, record=True)
        base_layers = [replace(t, after_ffn=t.after_ffn[:1]) for t in both.trunk.layers]
        pert_layers = [replace(t, after_ffn=t.after_ffn[1:]) for t in both.trunk.layers]
        base_logits, pert_logits = both.logits[:1], both.logits[1:]
    change = torch.stack([(a.after_ffn - b.after_ffn).abs().amax(-1)[0]
                          for a, b in zip(pert_layers, base_layers)]).float().cpu().numpy()
    logit_change = (pert_logits - base_logits).abs().amax(-1)[0].float().cpu().numpy()
    valid = runs.forward(s).valid[s.row].cpu()
    off, labels = s.candidate_start_offset, s.layout.token_labels()
    others = other_candidates(valid[None], off, s.candidate)[0].numpy()
    if not others.any():
        none = Largest(0.0, "none")
        return IsolationReading(kind, change, logit_change, valid.numpy(), none, none)

    def largest(per_position: np.ndarray) -> Largest:
        worst = int(np.argmax(np.where(others, per_position, -np.inf)))
        return Largest(float(per_position[worst]), labels[worst])
    logits = np.zeros(len(labels), dtype=np.float32)
    logits[off:off + len(logit_change)] = logit_change
    return IsolationReading(kind, change, logit_change, valid.numpy(), largest(change.max(0)), largest(logits))


def verdict(r: IsolationReading) -> str:
    """One line per mask: isolated or not, and the largest change on another candidate in each quantity drawn."""
    if r.residual.where == "none":
        return f"{r.mask_kind}: no other real candidate to compare with."
    state = "isolated" if r.isolated else "NOT isolated"
    return (f"{r.mask_kind}: {state} — largest change on any other candidate: residual stream {r.residual}, "
            f"logits {r.logits}")


def isolation_view(s: Settings) -> tuple[go.Figure, go.Figure, str]:
    ours, causal = isolation_reading(s), isolation_reading(s, "causal")
    labels, seg = s.layout.token_labels(), s.layout.segments()
    layers = [f"layer {i}" for i in range(s.num_layers)]
    j = labels[s.candidate_start_offset + s.candidate]
    panels = [Panel(np.where(r.valid[None], r.change, np.nan), layers, labels,
                    f"{r.mask_kind} mask: {'isolated' if r.isolated else 'NOT isolated'}<br>largest on another "
                    f"candidate: {r.residual}", None, seg) for r in (ours, causal)]
    fig = heatmap_figure(panels, cols=2, title=(f"|change| in the residual stream after perturbing {j} "
                         f"({PERTURBATION.of(s)}, {DELTA.of(s):g})" if PERTURBATION.of(s) != "replace" else
                         f"|change| in the residual stream after replacing {j} with item {REPLACE_WITH.of(s)}")
                         + row_note(s),
                         value_name="max |Δh|", row_title="layer", col_title="position",
                         max_cells=SINGLE_MAX_CELLS, height=360 + 24 * s.num_layers)
    C = s.num_candidates
    cand_labels = labels[s.candidate_start_offset:]
    bar_labels = [f"{c} (perturbed)" if c == j else c for c in cand_labels]
    bars = grouped_bar_figure(bar_labels, {f"{r.mask_kind} mask (largest on another candidate: {r.logits})":
                                           r.logit_change for r in (ours, causal)},
                              title=f"|change| in each candidate's logits after perturbing {j} (max over "
                                    f"{len(runs.action_names(s))} actions)",
                              value_name="max |Δ logit|", text=C <= 16)
    text = "\n\n".join(["**" + verdict(ours) + "**", verdict(causal),
                        "Logits per candidate (isolation mask | causal mask): "
                        + ", ".join(f"{cand_labels[c]}: {ours.logit_change[c]:.6g} | {causal.logit_change[c]:.6g}"
                                    for c in range(min(C, 16))) + (" ..." if C > 16 else "")])
    return fig, bars, text


def _isolation_cost(s: Settings) -> Cost:
    """The recorded forward, the perturbed batch recorded, and both rows again under a causal mask."""
    B, kept = s.batch_size, recorded_bytes(s, s.batch_size)  # the first stays while the others run
    return (recorded_cost(s) + forward_cost(s, B, record=True).holding(kept, on_device=True)
            + forward_cost(s, 2, record=True).holding(kept, on_device=True)
            + (forward_cost(s, B) if PERTURBATION.of(s) == "replace" else Cost()))


def _perturbed_facts(s: Settings) -> dict:
    return dict(candidate=f"perturbing {s.layout.token_labels()[s.candidate_start_offset + s.candidate]}")


EXPORT_ISOLATION = (
    Export("isolation", lambda s, f, chosen: (
        f"How far the residual stream moves, per layer and position, after {f.get('candidate')} "
        f"({PERTURBATION.of(s)}): "
        f"under the '{s.mask_kind}' mask only its own column changes; under a causal mask the change reaches later "
        "candidates."), facts=_perturbed_facts),
    Export("isolation_logits", lambda s, f, chosen: (
        f"The largest change in each candidate's action logits after {f.get('candidate')}, for the "
        f"'{s.mask_kind}' mask and the causal mask."), facts=_perturbed_facts))


VIEW = View(
    "isolation", "3 · Isolation",
    look_for="Look for: under the recsys mask, perturbing candidate j changes only its own column; under the "
             "causal mask the change leaks into every later candidate.",
    teaches="Perturb one candidate (scale, noise, replace) and no other candidate changes by a single bit "
            "under the recsys mask; under a causal mask later candidates move.",
    parts=(Part(isolation_view, (Plot("change per layer and position", "isolation-plot", exports=EXPORT_ISOLATION[:1]),
                                 Plot("change per candidate", "isolation-logits-plot", exports=EXPORT_ISOLATION[1:]),
                                 Text()),
                model=True),),
    cost=_isolation_cost, controls=("candidate", PERTURBATION, DELTA, REPLACE_WITH), gpu=True)
