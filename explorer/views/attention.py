"""The Attention tab: the model's own attention weights (or its capped or masked logits), every layer and
head as a grid or one head at full resolution, and where one query row's attention goes. Where the page
draws query rows itself, a small model's one-head figure carries every value kind, layer and head (hidden)
for the page to show instead (static/page.js). Its functions, its exports' captions and its record.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import torch

from .. import runs
from ..figures import DIVERGING, SEQUENTIAL, bar_figure, heatmap_figure
from ..page_contract import FIGURE_TEXT, fill
from ..schema import VALUE_KINDS, Settings
from .panels import (GRID_MAX_CELLS, SINGLE_MAX_CELLS, cells, layout_mask, layout_panel, mask_dense, masked_over,
                     row_note, zoom_note)
from .records import Export, Part, Plot, Text, View, caption_layout, caption_query, caption_where, recorded_cost

GRID_MAX_COLS = 16        # panel columns (query heads and KV-group spacers) in the layer x head grid
# a one-head view carries other panels (value kinds, layers, heads; hidden) up to this many cells in all
# (float32: 256 KB); see panels_on_page
HEADS_ON_PAGE_CELLS = 2 ** 16
QUERY_ROWS_ON_PAGE = 256  # the page draws a query row itself (its mask row travels) up to this sequence length


def attention_values(s: Settings, layer: int) -> torch.Tensor:
    """[Hq, T, T] float32 for the chosen value kind, read from the recorded forward where it lives: on a
    GPU it stays there, and the heatmap builder copies only the cells it draws (explorer.figures.pool)."""
    trace = runs.forward(s).trunk.layers[layer]
    if s.values == "probabilities":
        return trace.probs[s.row].float()
    logits = trace.logits[s.row].float()
    if s.values == "capped logits":
        return logits
    allowed = layout_mask(s, s.mask_kind).dense()[0, 0].to(logits.device)
    # masked: a gap, numpy's quiet NaN (a host value copied over, so its bits are the host's on any device)
    return torch.where(allowed[None], logits, logits.new_tensor(math.nan))


def grid_heads(num_q_heads: int, num_kv_heads: int) -> list[int]:
    """The query heads the every-head grid draws: whole KV groups (with a spacer column between them)
    while they fit GRID_MAX_COLS columns, else the first GRID_MAX_COLS heads of KV head 0. Past that
    count a panel is too narrow to read."""
    G = num_q_heads // num_kv_heads
    if G > GRID_MAX_COLS:
        return list(range(GRID_MAX_COLS))
    groups = max(1, min(num_kv_heads, (GRID_MAX_COLS + 1) // (G + 1)))
    return list(range(groups * G))


VALUE_LOOK = {"probabilities": dict(value_name="weight", colorscale=SEQUENTIAL, zmin=0),
              "capped logits": dict(value_name="logit", colorscale=DIVERGING, zmin=None),
              "masked logits": dict(value_name="logit", colorscale=DIVERGING, zmin=None)}


def panels_on_page(s: Settings) -> list[tuple[str, int, int]]:
    """The (values, layer, head) panels a one-head view carries, its own shown and the rest hidden, for the
    page to show one instead (static/page.js drawPanel: the values radio, the layer, the head): every value
    kind, layer and head where they fit in HEADS_ON_PAGE_CELLS, else the layer's heads (probabilities:
    the bars come from them), else its own alone. Only where the page draws query rows (whole rows)."""
    own = [(s.values, s.layer, s.head)]
    if s.zoom != "all" or s.seq_len > QUERY_ROWS_ON_PAGE:
        return own
    every = [(v, layer, h) for v in VALUE_KINDS for layer in range(s.num_layers) for h in range(s.num_q_heads)]
    if len(every) * s.seq_len ** 2 <= HEADS_ON_PAGE_CELLS:
        return every
    if s.values == "probabilities" and s.num_q_heads * s.seq_len ** 2 <= HEADS_ON_PAGE_CELLS:
        return [(s.values, s.layer, h) for h in range(s.num_q_heads)]
    return own


def attention_view(s: Settings) -> tuple[go.Figure, go.Figure, str]:
    G = s.num_q_heads // s.num_kv_heads
    look = VALUE_LOOK[s.values]
    if s.head < 0:
        # every layer and head; query heads ordered by KV head with a spacer column between groups
        heads = grid_heads(s.num_q_heads, s.num_kv_heads)
        panels, groups, hidden = [], [], masked_over(s.values, ~mask_dense(s, s.mask_kind))
        for layer in range(s.num_layers):
            vals = attention_values(s, layer)
            for i, h in enumerate(heads):
                if i and h % G == 0:
                    panels.append(None)
                    groups.append("") if layer == 0 else None
                panels.append(layout_panel(s, vals[h], f"L{layer} · q head {h}", dict(layer=layer, head=h),
                                     masked=hidden))
                groups.append(f"KV head {h // G}") if layer == 0 else None
        cols = len(panels) // s.num_layers
        shown = (f"every layer and head ({s.num_q_heads} query heads share {s.num_kv_heads} KV heads)"
                 if len(heads) == s.num_q_heads else
                 f"every layer, query heads 0-{heads[-1]} of {s.num_q_heads} ({s.num_q_heads} query heads "
                 f"share {s.num_kv_heads} KV heads; pick a head to see any other)")
        n = cells(s, GRID_MAX_CELLS, sum(p is not None for p in panels))
        fig = heatmap_figure(panels, cols=cols, title=f"Attention {s.values}: {shown}{row_note(s)}{zoom_note(s, n)}",
                             max_cells=n, column_groups=groups, outline_row=s.query_position, color=s.color,
                             page_meta=query_meta(s, 0) if s.values == "probabilities" else {}, **look)
        bar_head = 0
    else:
        # where the page draws query rows itself and the model is small, other value kinds, layers and heads
        # travel hidden: a pick of one is then drawn by the page (static/page.js drawPanel)
        on_page = panels_on_page(s)
        values = {(v, layer): attention_values(replace(s, values=v), layer)
                  for v, layer in dict.fromkeys((v, layer) for v, layer, _ in on_page)}
        max_cells = cells(s, SINGLE_MAX_CELLS)

        def title(v: str, layer: int, h: int) -> str:
            return (f"Attention {v}: layer {layer}, query head {h} (KV head {h // G}){row_note(s)}"
                    f"{zoom_note(s, max_cells)}")

        alternatives = len(on_page) > 1
        hidden = ~mask_dense(s, s.mask_kind)
        panels = [layout_panel(s, values[v, layer][h], "", dict(layer=layer, head=h, values=v),
                         look=dict(title=title(v, layer, h), **VALUE_LOOK[v]) if alternatives else None,
                         masked=masked_over(v, hidden))
                  for v, layer, h in on_page]
        holds_bars = ("probabilities", s.layer, s.head) in on_page
        fig = heatmap_figure(panels, title=title(s.values, s.layer, s.head), color=s.color, max_cells=max_cells,
                             outline_row=s.query_position, page_meta=query_meta(s, s.head) if holds_bars else {},
                             shown_panel=on_page.index((s.values, s.layer, s.head)) if alternatives else None,
                             cell_text=True, **look)
        bar_head = s.head
    bars, text = query_row_view(s, s.layer, bar_head)
    return fig, bars, text


def query_meta(s: Settings, bar_head: int) -> dict:
    """What the page needs to draw another query row itself (static/page.js queryRow): the bar chart's
    panel (layer, head), the head chosen (-1: all), the values shown, the first candidate (query -1) and,
    per query row, the keys its mask hides ('1'). Only where the heatmap holds whole rows and the figure
    holds the bars' probabilities. Its keys and types: explorer.page_contract.QUERY."""
    if s.zoom != "all" or s.seq_len > QUERY_ROWS_ON_PAGE:
        return {}
    hidden = ~mask_dense(s, s.mask_kind)
    return dict(query=dict(layer=s.layer, head=bar_head, selected=s.head, values=s.values,
                           offset=s.candidate_start_offset,
                           masked=["".join("1" if m else "0" for m in row) for row in hidden]))


def query_row_view(s: Settings, layer: int, head: int) -> tuple[go.Figure, str]:
    """Where one query's attention goes: its row of probabilities as bars."""
    q = s.query_position
    probs = runs.forward(s).trunk.layers[layer].probs[s.row, head, q].float().cpu().numpy()
    labels, seg = s.layout.token_labels(), s.layout.segments()
    fig = bar_figure(labels, probs, title=fill(FIGURE_TEXT["bars_title"], label=labels[q], layer=layer, head=head),
                     value_name="weight", segments=seg)
    top = np.argsort(-probs, kind="stable")[:3]          # ties in position order, as the page breaks them
    text = (f"Query **{labels[q]}** puts " + ", ".join(f"{probs[i]:.4f} on {labels[i]}" for i in top)
            + f"; weights over masked keys sum to {probs[~mask_dense(s, s.mask_kind)[q]].sum(dtype=np.float64):.3g}.")
    return fig, text


def _attention_facts(s: Settings) -> dict:
    if s.head >= 0:
        return dict(layer=f"layer {s.layer}", head=f"query head {s.head}")
    heads = grid_heads(s.num_q_heads, s.num_kv_heads)
    return dict(layer="every layer", head="and head" if len(heads) == s.num_q_heads
                else f"query heads 0-{heads[-1]} of {s.num_q_heads}")


EXPORT_ATTENTION = Export("attention", lambda s, f, chosen: (
    f"Attention {s.values} of {caption_where(f)}, from the model's own forward pass ({s.weights} weights) over "
    f"{caption_layout(s)}; colour scale {s.color}."), facts=_attention_facts)
EXPORT_QUERY_ROW = Export("query_row", lambda s, f, chosen: (
    f"The attention weights of {f.get('row')} in {caption_where(f)}: one bar per key, coloured by segment (user, "
    "history, candidate)."),
    facts=lambda s: dict(layer=f"layer {s.layer}", head=f"head {max(s.head, 0)}", row=caption_query(s)))


VIEW = View(
    "attention", "2 · Attention",
    look_for="Look for: candidate rows attend to history and to themselves only; heads sharing a KV head "
             "(grouped query attention) often look alike; switch colour to quantile or log on random weights.",
    teaches="The model's own attention weights, layer × head, query heads grouped under their shared KV head "
            "(GQA). Pick a query row to see where its attention goes; switch to capped or masked logits and "
            "log colour (a symmetric log that keeps the sign of logits) to see the soft cap at work; quantile "
            "colour shows structure in random weights. Long sequences are pooled in blocks that never cross a "
            "segment boundary; *heatmap zoom* draws the candidate block, the history tail or one query row at "
            "full resolution. Hover a cell for query, key, their segments and the value; click a cell to pick "
            "its query row (the link follows), and the chosen row is outlined in every panel (the Mask tab's "
            "too).",
    parts=(Part(attention_view, (Plot("attention", "attention-plot", exports=(EXPORT_ATTENTION,)),
                                 Plot("query row", "query-bars-plot", exports=(EXPORT_QUERY_ROW,)),
                                 Text("query-text")), model=True),),
    cost=recorded_cost, controls=("values", "color"))
