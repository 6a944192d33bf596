"""The Invariance & RoPE tab: permute, drop or add candidates and see whose score moves under each RoPE
position mode (batch invariance), and the rotary embedding itself — its angles per dimension pair and
position, and q·k depending only on distance. Its functions, its cost, its exports' captions and its record.
(Named for the tab's two parts: ``invariance`` is the function that scores a changed batch.)
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import torch

from models.grok import RotaryEmbedding
from models.recsys import RecsysBatch
from models.xrex import right_anchored_positions

from .. import budget, runs
from ..figures import Panel, grouped_bar_figure, heatmap_figure, line_figure
from ..limits import Cost, forward_cost
from ..schema import Control, ModelSettings, Settings
from .panels import row_note
from .records import Export, Part, Plot, Text, View

# the tab's own control: what is done to the candidate set
INVARIANCE_OPS = ("permute", "drop", "add")
OPERATION = Control("operation", "permute", "operation", choices=INVARIANCE_OPS)


def changed_batch(s: Settings, batch: RecsysBatch) -> tuple[RecsysBatch, list[tuple[int, int]]]:
    """Apply the operation to the real candidates -> (new batch, [(old index, new index)] kept)."""
    C = batch.candidate_post_hashes.shape[1]
    real = C - s.candidate_padding
    pads = list(range(real, C))
    if OPERATION.of(s) == "permute":
        order = list(reversed(range(real))) + pads
    elif OPERATION.of(s) == "drop":
        order = [c for c in range(real) if c != s.candidate] + pads
    else:
        order = list(range(C))
    new = batch.select_candidates(torch.tensor(order, dtype=torch.long))    # [] stays a long index
    pairs = sorted((old, new_i) for new_i, old in enumerate(order) if old < real)
    if OPERATION.of(s) == "add":
        # one new candidate per row before the padded slots: the first candidate of a batch drawn the
        # same way from another seed, so its hashes are in this model's vocabulary (the demo world's too)
        extra = runs.make_batch(s.model, s.seed + 1000)

        def insert(field):
            t, row = getattr(new, field), getattr(extra, field)[:, :1]
            return torch.cat([t[:, :real], row, t[:, real:]], dim=1)
        new = replace(new, **{f: insert(f) for f in ("candidate_post_hashes", "candidate_author_hashes",
                                                      "candidate_product_surface")})
        pairs = [(c, c) for c in range(real)]
    return new, pairs


def invariance(s: Settings) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Scores before and after the operation for the kept candidates: ([N, A], [N, A], pairs)."""
    return _invariance(s.model, OPERATION.of(s), s.candidate, s.row)


@budget.ByteCache
def _invariance(m: ModelSettings, operation: str, candidate: int, row: int):
    s = Settings(m, candidate=candidate, row=row).with_view({OPERATION: operation})
    batch = runs.batch_for(s)
    new, pairs = changed_batch(s, batch)
    # unrecorded: the other RoPE modes need no traces (a recorded forward per mode would hold 3x the memory)
    before = runs.score(s, batch).logits[row].float().cpu().numpy()
    if not pairs:                # dropped the only real candidate: nothing left to score or compare
        empty = before[:0]
        return empty, empty, pairs
    after = runs.score(s, new).logits[row].float().cpu().numpy()
    return before[[o for o, _ in pairs]], after[[n for _, n in pairs]], pairs


def invariance_view(s: Settings) -> tuple[go.Figure, str]:
    labels = s.layout.token_labels()[s.candidate_start_offset:]
    per_mode = {}
    modes = (s.rope_mode,) if s.family == "xrex" else ("sequential", "shared", "none")   # production: one
    for mode in modes:
        b, a, pairs = invariance(replace(s, rope_mode=mode))
        per_mode[mode] = np.abs(a - b).max(-1)
    b, a, pairs = invariance(s)      # pairs are in candidate order (old index ascending)
    if not pairs:
        return (grouped_bar_figure([], {}, title="Nothing to compare", value_name="max |Δ logit|"),
                f"Dropping {labels[s.candidate]}, the only real candidate, leaves no candidate whose score "
                "could move: add candidates, or choose permute or add.")
    cats = [labels[o] for o, _ in pairs]
    fig = grouped_bar_figure(cats, {f"RoPE {m}": v for m, v in per_mode.items()},
                             title=f"Batch invariance: |score change| per candidate after '{OPERATION.of(s)}' "
                                   f"(max over actions){row_note(s)}", value_name="max |Δ logit|")
    rounding_floor(fig, per_mode.values())
    head = ("| candidate | " + " | ".join(runs.action_names(s)[:4])
            + " (before → after) | max abs diff |")
    rows = [head, "|---|" + "---|" * 5]
    for (o, n), bb, aa in list(zip(pairs, b, a))[:16]:
        rows.append(f"| {labels[o]} → slot {n} | " + " | ".join(f"{x:.4f} → {y:.4f}" for x, y in zip(bb[:4], aa[:4]))
                    + f" | {np.abs(aa - bb).max():.3g} |")
    largest = {m: float(v.max()) if v.size else 0.0 for m, v in per_mode.items()}
    summary = (f"Largest score change under '{OPERATION.of(s)}' — " + ", ".join(
        f"{m}: {v:.3g}" + (" (within fp32 rounding: invariant)" if v < FP32_TOLERANCE else " (moves)")
        for m, v in largest.items()) + f"; current mode: **{s.rope_mode}**.\n\n"
        + WHAT_OPERATION_DOES[OPERATION.of(s)].format(candidate=labels[s.candidate]) + "\n\n"
        + (WHY_RIGHT_ANCHORED if s.family == "xrex" else WHY_ROPE) + "\n\n" + "\n".join(rows))
    return fig, summary


def rounding_floor(fig: go.Figure, values) -> None:
    """Changes below FP32_TOLERANCE are rounding, not change: the axis reaches at least 1e-3 (rounding
    noise is never drawn full-height), and such bars say '~0' (or '0' where the scores came out equal)."""
    top = max((float(np.max(v)) for v in values if np.size(v)), default=0.0)
    fig.update_yaxes(range=[0, max(1.15 * top, 1e-3)])
    for trace in fig.data:
        if len(trace.y) <= 16:
            trace.text = ["0" if y == 0 else "~0" if y < FP32_TOLERANCE else f"{y:.2g}" for y in trace.y]
            trace.textposition = "outside"
    fig.add_annotation(text=f"0 or ~0: within fp32 rounding (< {FP32_TOLERANCE:g}), not a change",
                       xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom", showarrow=False,
                       font=dict(size=13, color="#555555"))


# another batch shape or row position changes how fp32 reductions round inside matmuls: ~1e-6, not a real change
FP32_TOLERANCE = 1e-4

# what each operation does to the batch, and what the mask and RoPE make of it ({candidate}: the one dropped)
WHAT_OPERATION_DOES = {
    "permute": "**Permute** reverses the order of the real candidates: each keeps its own inputs and only its "
               "slot changes. Under the mask it still sees only the user, the history and itself, so only its "
               "position can move its score.",
    "drop": "**Drop** removes {candidate}: the candidates before it keep their slots, those after it move one slot "
            "earlier, and the sequence is one shorter. No candidate ever saw {candidate} (the mask), so only a "
            "moved slot can change a score; the shorter sequence may change fp32 rounding.",
    "add": "**Add** puts a new candidate after the real ones: every existing candidate keeps its slot and none of "
           "them can see the newcomer (the mask), so their scores stay put even with sequential positions — up to "
           "fp32 rounding from the longer sequence.",
}
assert set(WHAT_OPERATION_DOES) == set(INVARIANCE_OPS)

WHY_ROPE = ("**Why.** The mask already stops candidates from seeing each other, so a candidate's score can "
            "depend only on the user, the history and itself — *and on where it sits*. RoPE rotates queries and "
            "keys by their position, so with `sequential` positions moving a candidate to another slot changes "
            "the angle between it and every history key, and its score moves with it. With `shared` every "
            "candidate sits at the same position (the first candidate slot), and with `none` there is no "
            "rotation at all: the slot no longer matters and the score is batch-invariant. "
            "Production phoenix serves with this property.")


WHY_RIGHT_ANCHORED = (
    "**Why production is invariant by construction.** Production's positions are right-anchored "
    "(models.xrex.right_anchored_positions): prefix token i sits at i, the history ends at P+L-1 whatever its "
    "length, and *every* candidate sits at P+L. A candidate's query and key are therefore rotated by the same "
    "angle in every slot and every batch; with the mask hiding other candidates, nothing a candidate computes "
    "depends on where it sits or on who else is in the batch — a permutation gives the same scores in real "
    "arithmetic. In fp32 they agree to rounding: a moved candidate is another row of every matrix product, "
    "which some CPUs round differently, and adding or dropping candidates changes T, and with it the order "
    "of fp32 sums.")


def rope_positions(s: Settings) -> np.ndarray:
    """[T] the RoPE position of each token of the shown layout: grok.py's 0..T-1 (+ offset, candidates
    shared or unrotated by rope_mode), or production's right-anchored positions."""
    if s.family == "xrex":
        return right_anchored_positions(s.layout.valid()[None], s.num_user, s.num_history)[0].long().numpy()
    return np.arange(s.seq_len) + s.rope_offset


def rope_view(s: Settings) -> tuple[go.Figure, go.Figure, str]:
    K, T = s.key_size, s.seq_len
    rot = RotaryEmbedding(K, s.rope_base)
    inv = rot.inv_freq().double().numpy()                               # [K/2]
    positions = rope_positions(s)
    angle = np.mod(positions[None, :] * inv[:, None], 2 * math.pi)     # [K/2, T]
    pos_labels = ([f"{tok} @{p}" for tok, p in zip(s.layout.token_labels(), positions)] if s.family == "xrex"
                  else [str(p) for p in positions])
    pair_labels = [f"pair {j}" for j in range(K // 2)]
    fig_angle = heatmap_figure([Panel(angle, pair_labels, pos_labels, "")], title=f"RoPE rotation angle "
                               f"(mod 2π) per dimension pair vs position (base {s.rope_base:g}, offset {s.rope_offset})",
                               value_name="angle (rad)", colorscale="Twilight", zmin=0, zmax=2 * math.pi,
                               row_title="dimension pair", col_title="position", height=420)
    # q . k for q = k = ones after rotation, as a function of the distance between them
    dist = np.arange(T)
    qk = 2 * np.cos(dist[:, None] * inv[None, :]).sum(-1)              # Σ over both halves
    x = torch.ones(1, 2, 1, K)
    t = torch.tensor([[float(s.rope_offset), float(s.rope_offset + min(T - 1, 10))]])
    r = rot(x, t)[0, :, 0]
    check = float(r[0] @ r[1])
    fig_qk = line_figure({"q·k (q = k = 1)": (dist, qk)}, title="q·k against relative distance",
                         x_title="distance (positions)", y_title="q·k", markers=T <= 64)
    text = (f"q·k depends only on the distance between the two positions: the offset ({s.rope_offset}) rotates both "
            f"by the same extra angle and cancels (distance {min(T - 1, 10)}: {check:.6g} at this offset vs "
            f"{qk[min(T - 1, 10)]:.6g} from the formula). Low pairs turn fast (pair 0: one turn every "
            f"{2 * math.pi / inv[0]:.1f} positions), high pairs slowly (pair {K // 2 - 1}: every "
            f"{2 * math.pi / inv[-1]:.3g}).")
    if s.family == "xrex":
        P_L, labels = s.candidate_start_offset, s.layout.token_labels()
        shown = ", ".join(f"{t} @{p}" for t, p in list(zip(labels, positions))[:P_L + 2])
        text = (f"**Production: right-anchored positions** ({shown}{', …' if T > P_L + 2 else ''}). The last real "
                f"history event sits at P+L-1 = {P_L - 1} however long the history is, padded slots at 0, and every "
                f"candidate at P+L = {P_L}: a candidate is rotated the same in any slot, so its score cannot depend on "
                "its slot or its neighbours — the Invariance view above measures it.\n\n" + text)
    return fig_angle, fig_qk, text


def _invariance_cost(s: Settings) -> Cost:
    """Three RoPE modes x (before, after), unrecorded."""
    one = forward_cost(s, s.batch_size)
    return Cost(6 * s.batch_size, 6 * one.flops, one.peak_bytes, one.device_bytes)


EXPORT_INVARIANCE = Export("invariance", lambda s, f, chosen: (
    f"Each kept candidate's score change after '{OPERATION.of(s)}' on the candidate set, for each RoPE position mode: "
    "zero means the score does not depend on the other candidates or its slot."))
EXPORT_ROPE = (
    Export("rope_angles", lambda s, f, chosen: (
        f"The rotary embedding's angle (mod 2π) for each dimension pair and position (base {s.rope_base:g}, "
        f"offset {s.rope_offset}): low pairs turn fast, high pairs slowly.")),
    Export("rope_qk", lambda s, f, chosen: (
        "q·k for q = k = 1 after rotation, against the distance between the two positions: it depends only on "
        "the distance, not on the absolute positions.")))


VIEW = View(
    "invariance", "4 · Invariance & RoPE",
    look_for="Look for: with sequential RoPE positions, reordering candidates moves their scores; with shared "
             "or no positions they stay put (batch invariance).",
    teaches="Permute, drop or add candidates: with `sequential` RoPE a candidate's slot changes its score; "
            "`shared` positions or no RoPE make scoring batch-invariant. The RoPE panel shows rotation angles "
            "and that q·k depends only on distance.",
    parts=(Part(invariance_view, (Plot("score change", "invariance-plot", exports=(EXPORT_INVARIANCE,)), Text()),
                model=True),
           Part(rope_view, (Plot("RoPE angles", exports=EXPORT_ROPE[:1]),
                            Plot("q·k vs distance", exports=EXPORT_ROPE[1:]), Text()))),
    cost=_invariance_cost, controls=(OPERATION,), gpu=True)
