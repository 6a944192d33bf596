"""The Anatomy tab: one query row of one head step by step from the recorded forward — q and every k after
RoPE, q·k per key, times the multiplier, the cap, the mask, the softmax and the weighted sum of V — each
step's figure and numbers, recomputed where they can be and checked against the model's own. Its
functions, its exports' captions and its record.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from models.attention import apply_cap

from .. import runs
from ..figures import DIVERGING, SEGMENT_NAMES, Panel, heatmap_figure, stacked_bars_figure
from ..schema import Settings
from .panels import SINGLE_MAX_CELLS, mask_dense, row_note
from .records import Export, Part, Plot, Text, View, caption_query, caption_where, recorded_cost


@dataclass
class RowAnatomy:
    """Every step from q and k to the head's output for one query row, from the recorded forward."""
    query: int                  # position of the query row
    head: int
    kv_head: int
    q: np.ndarray               # [K] the query after RoPE
    k: np.ndarray               # [T, K] keys after RoPE (the query head's KV head)
    v: np.ndarray               # [T, K] values
    raw: np.ndarray             # [T] q·k
    scaled: np.ndarray          # [T] times the attention multiplier
    capped: np.ndarray          # [T] the model's recorded logits (after the cap, before the mask)
    allowed: np.ndarray         # [T] bool: the mask row
    probs: np.ndarray           # [T] the model's recorded softmax weights
    out: np.ndarray             # [K] the model's recorded weighted sum of V
    logit_error: float          # max |cap(multiplier · q·k) recomputed - recorded logits|
    out_error: float            # max |Σ p v recomputed - recorded output|


def row_anatomy(s: Settings) -> RowAnatomy:
    head = max(s.head, 0)
    G = s.num_q_heads // s.num_kv_heads
    i, r = s.query_position, s.row
    t = runs.forward(s).trunk.layers[s.layer]
    q, k, v = t.q[r, i, head].float(), t.k[r, :, head // G].float(), t.v[r, :, head // G].float()
    raw = k @ q                                                             # [T]
    scaled = raw * s.attn_scale
    capped = t.logits[r, head, i].float()
    probs, out = t.probs[r, head, i].float(), t.heads_out[r, i, head].float()
    return RowAnatomy(
        i, head, head // G, q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), raw.cpu().numpy(),
        scaled.cpu().numpy(), capped.cpu().numpy(), mask_dense(s, s.mask_kind)[i], probs.cpu().numpy(),
        out.cpu().numpy(), float((apply_cap(scaled, s.logit_cap, s.cap_method) - capped).abs().max()),
        float((probs @ v - out).abs().max()))


def anatomy_view(s: Settings) -> tuple[go.Figure, go.Figure, go.Figure, str]:
    """One attention row step by step: q and k after RoPE; q·k per key; times the multiplier; the cap;
    the mask; the softmax; the weighted sum of V. Every number is read from the recorded forward (the
    first two recomputed from its q and k, and checked against its logits)."""
    a = row_anatomy(s)
    labels, seg = s.layout.token_labels(), s.layout.segments()
    K = s.key_size
    where = f"layer {s.layer}, query head {a.head} (KV head {a.kv_head}), query {labels[a.query]}{row_note(s)}"
    dims = [f"d{j}" for j in range(K)]
    qk = np.vstack([a.q[None], a.k])
    lim = float(np.abs(qk).max()) or 1.0
    fig_qk = heatmap_figure([Panel(qk, [f"q · {labels[a.query]}"] + [f"k · {x}" for x in labels], dims, "",
                                   None, None)], title=f"1 · q and every k after {'qk_norm and ' if s.family == 'xrex' and s.xrex_config().qk_norm else ''}"
                                  f"RoPE — {where}",
                            value_name="component", colorscale=DIVERGING, zmin=-lim, zmax=lim,
                            row_title="vector", col_title="dimension", max_cells=SINGLE_MAX_CELLS,
                            height=260 + 14 * min(len(labels), 40))
    cap = ("no cap" if s.cap_method == "none" or s.logit_cap <= 0 else
           f"{s.logit_cap:g}·tanh(x/{s.logit_cap:g})" if s.cap_method == "tanh" else
           f"x / (1 + |x|/{s.logit_cap:g})")
    masked = np.where(a.allowed, a.capped, np.nan)
    scale_name = (f"scale √128/key size = {s.attn_scale:.4g}" if s.family == "xrex"
                  else f"multiplier {s.multiplier:g}")
    fig_steps = stacked_bars_figure(labels, [
        ("2 · q·k per key", a.raw),
        (f"3 · × {scale_name}", a.scaled),
        (f"4 · cap: {cap}", a.capped),
        ("5 · mask: keys it may not see → −∞", masked),
        ("6 · softmax → weights (sum 1): exactly 0 where −∞", a.probs)],
        title=f"Steps 2–6, one bar per key — {where}", segments=seg, gap_text="−∞")
    contrib = a.probs[:, None] * a.v
    fig_out = heatmap_figure([Panel(np.vstack([contrib, a.out[None]]), [f"{p:.3f} × v · {x}" if len(labels) <= 40
                                    else x for p, x in zip(a.probs, labels)] + ["Σ = output"], dims, "")],
                             title=f"7 · weighted sum of V, last row the head's output — {where}",
                             value_name="component",
                             colorscale=DIVERGING, zmin=-(float(np.abs(contrib).max()) or 1.0),
                             zmax=float(np.abs(contrib).max()) or 1.0, row_title="weight × value",
                             col_title="dimension", max_cells=SINGLE_MAX_CELLS,
                             height=260 + 14 * min(len(labels), 40))
    keys = list(range(len(labels))) if len(labels) <= 24 else sorted(np.argsort(-a.probs)[:8])
    rows = [f"| key | segment | q·k | × {'scale' if s.family == 'xrex' else 'multiplier'} | capped | mask | weight |",
            "|---|---|---|---|---|---|---|"]
    for j in keys:
        rows.append(f"| {labels[j]} | {SEGMENT_NAMES.get(seg[j], seg[j])} | {a.raw[j]:.4g} | {a.scaled[j]:.4g} | "
                    f"{a.capped[j]:.4g} | {'sees' if a.allowed[j] else '−∞'} | {a.probs[j]:.4g} |")
    text = (f"**{where}.** " + ("" if len(labels) <= 24 else "The 8 keys with the most weight: ")
            + "\n\n" + "\n".join(rows) + f"\n\nRead from the model's recorded forward: the capped logits "
            f"recomputed from its q and k differ from the ones it used by at most {a.logit_error:.2g}, and Σ weight × v "
            f"from its output by {a.out_error:.2g} (float32 rounding). The weights over masked keys sum to "
            f"{a.probs[~a.allowed].sum():.3g}.")
    return fig_qk, fig_steps, fig_out, text


def _one_row_facts(s: Settings) -> dict:
    return dict(layer=f"layer {s.layer}", head=f"query head {max(s.head, 0)}", row=caption_query(s))


EXPORT_ANATOMY = (
    Export("anatomy_qk", lambda s, f, chosen: (
        f"Step 1 for {f.get('row')} ({caption_where(f)}): the query vector and every key vector after the rotary "
        "position embedding, one row each, one column per dimension."), facts=_one_row_facts),
    Export("anatomy_steps", lambda s, f, chosen: (
        f"Steps 2–6 for {f.get('row')} ({caption_where(f)}): the dot product q·k per key, times the attention "
        f"{'scale √128/key size' if s.family == 'xrex' else 'multiplier'} {s.attn_scale:.4g}, after the "
        f"{s.cap_method} cap, with masked keys removed, and after the softmax: the attention weights."),
        facts=_one_row_facts),
    Export("anatomy_sum", lambda s, f, chosen: (
        f"Step 7 for {f.get('row')} ({caption_where(f)}): each key's value vector times its attention weight, and "
        "their sum (last row), the head's output."), facts=_one_row_facts))


VIEW = View(
    "anatomy", "2b · Anatomy",
    look_for="Look for: how one query row is built — q·k per key, scaled, capped, masked to −∞, normalised by "
             "the softmax, and the weights mixing the values into the output. Layer, head (the grid shows "
             "head 0) and query row are chosen at the top of the sidebar.",
    teaches="One query row of one head, step by step from the recorded forward: q and every k after RoPE, q·k "
            "per key, × the multiplier, the cap, the mask, the softmax, and the weighted sum of V — a small "
            "figure and the numbers for each step.",
    parts=(Part(anatomy_view, (Plot("q and k after RoPE", "anatomy-plot", exports=EXPORT_ANATOMY[:1]),
                               Plot("q·k → weights, step by step", "anatomy-steps-plot",
                                    exports=EXPORT_ANATOMY[1:2]),
                               Plot("weighted sum of V", exports=EXPORT_ANATOMY[2:]), Text()), model=True),),
    cost=recorded_cost)
