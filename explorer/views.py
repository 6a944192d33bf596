"""What each view of the explorer shows: plain functions ``Settings -> (figures, text)``.

They read the one recorded forward (explorer.runs.forward) and draw through explorer.figures; tests
call them without a browser, app.py only wires them to controls.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np
import plotly.graph_objects as go
import torch

from models.attention import apply_cap
from models.bugzoo import BUGS, bug_names, bug_report, with_bug
from models.masks import EMPTY, FULL, KERNEL_TILINGS, AttentionMask, kernel_work, ranker_bounds
from models.presets import PRESETS
from models.probes import PROBES, capped_layout, other_candidates, perturb
from models.grok import RotaryEmbedding
from models.recall import load_trained_variant, recall_example
from models.recsys import RecsysBatch
from models.runinfo import RESULTS_DIR
from models.variants import VARIANTS, VariantConfig, build_variant, variant_inputs
from models.xrex import right_anchored_positions

from . import budget, runs
from .figures import (DIVERGING, MASK_SCALE, SEGMENT_NAMES, SEQUENTIAL, TILE_SCALE, Panel, TileGrid, bar_figure,
                      grouped_bar_figure, heatmap_figure, line_figure, stacked_bars_figure)
from .limits import (FIGURE_PEAK_BYTES, MAX_FIGURE_CELLS, Cost, check_budget, forward_cost, model_bytes,
                     recorded_bytes)
from .schema import Settings, ValidationError
from .settings import INVARIANCE_OPS, VALUE_KINDS, parse_settings
from .gpu_results import evidence_view, gpu_run, kernel_caption, trunk_caption
from .timing import recorded_view

# The bug zoo (bug_zoo_view) probes six models on a capped layout of at most this many positions;
# causality perturbs each of at most 16 of them (models.probes.PROBES["causality"].max_positions).
BUG_ZOO_MAX_POSITIONS = 128

# the mask table's tile column: production's H100 serving tiles (64 query rows x 128 keys)
BLOCK_Q, BLOCK_KV = KERNEL_TILINGS["h100-serve"].block_q, KERNEL_TILINGS["h100-serve"].block_kv
GRID_MAX_CELLS = 128      # per axis, per panel, in the layer x head grid
GRID_MAX_COLS = 16        # panel columns (query heads and KV-group spacers) in the layer x head grid
SINGLE_MAX_CELLS = 512
# a one-head view carries other panels (value kinds, layers, heads; hidden) up to this many cells in all
# (float32: 256 KB); see panels_on_page
HEADS_ON_PAGE_CELLS = 2 ** 16
QUERY_ROWS_ON_PAGE = 256  # the page draws a query row itself (its mask row travels) up to this sequence length


def layout_mask(s: Settings, kind: str) -> AttentionMask:
    """`kind` over the layout, with its key padding, as the model applies it."""
    return AttentionMask(kind, s.seq_len, s.candidate_start_offset, s.layout.valid()[None])


def mask_dense(s: Settings, kind: str) -> np.ndarray:
    """[T, T] bool: the structure of `kind` and the layout's key padding, as the model applies it."""
    return layout_mask(s, kind).dense()[0, 0].numpy()


def mask_stats(mask: AttentionMask) -> dict:
    """Allowed pairs, and the work a mask-aware kernel skips: per element, and per (64 x 128) tile
    (the tile map FlashAttention-4's block-sparse tensors are built from)."""
    T = mask.seq_len
    allowed = int(mask.dense().sum())
    tiles = mask.tiles(BLOCK_Q, BLOCK_KV).counts()
    total_tiles = sum(tiles.values())
    return dict(allowed=allowed, total=T * T, skip_elements=1 - allowed / (T * T),
                tiles=total_tiles, skip_tiles=tiles["empty"] / total_tiles)


def row_note(s: Settings) -> str:
    """Titles say which batch row is shown once there is more than one."""
    return f" · batch row {s.row} of {s.batch_size}" if s.batch_size > 1 else ""


HISTORY_TAIL = 32          # history positions shown before the candidates by zoom=history tail


def zoom_region(s: Settings) -> tuple[list[int], list[int]]:
    """(query rows, key columns) of the heatmaps for `s.zoom`: everything, the candidate block
    against itself, the last history positions and the candidates, or one query's row."""
    return zoom_region_of(s.layout, s.zoom, s.query_position)


def zoom_region_of(layout, zoom: str, query: int) -> tuple[list[int], list[int]]:
    """zoom_region for a layout, a zoom and a query position: consecutive positions, each axis."""
    T, off = layout.seq_len, layout.candidate_start_offset
    if zoom == "candidates":
        rows = list(range(off, T))
        return rows, rows
    if zoom == "history tail":
        rows = list(range(max(layout.num_user, off - HISTORY_TAIL), T))
        return rows, rows
    if zoom == "query row":
        return [query], list(range(T))
    return list(range(T)), list(range(T))


def cells(s: Settings, full: int, panels: int = 1) -> int:
    """max_cells per axis: `full` for the whole sequence, zoomed regions at full resolution, as far as
    the figure's `panels` stay within MAX_FIGURE_CELLS (explorer.limits: the bytes a view sends are
    bounded before its work starts); pooled beyond that."""
    rows, cols = zoom_region(s)
    r, c = len(rows), len(cols)
    f = max(1, math.ceil(math.sqrt(r * c * max(1, panels) / MAX_FIGURE_CELLS)))   # keeps r*c*panels within the bound
    want = full if s.zoom == "all" else max(r, c)
    return max(8, min(want, math.ceil(max(r, c) / f)))


def _panel(s: Settings, z: np.ndarray | torch.Tensor, title: str, meta: dict | None = None,
           look: dict | None = None, masked: np.ndarray | None = None, tiles: TileGrid | None = None) -> Panel:
    """A [T, T] panel of the layout (an array, or a tensor left where the model put it), cut to the zoom;
    `masked` ([T, T] bool): the pairs the mask hides, cut alike (a view: the heads' panels share its memory,
    so heatmap_figure pools it once)."""
    rows, cols, row_labels, col_labels, row_segments, col_segments, row_spans, col_spans = _zoomed_axes(
        s.layout, s.zoom, s.query_position)
    # float32: the model's own precision, and half the bytes on the wire
    z = z.float() if isinstance(z, torch.Tensor) else np.asarray(z, dtype=np.float32)
    zoomed = (rows.stop - rows.start, cols.stop - cols.start)
    if zoomed != tuple(z.shape):
        z = z[rows, cols]
    if masked is not None and zoomed != masked.shape:
        masked = masked[rows, cols]
    return Panel(z, list(row_labels), list(col_labels), title, list(row_segments), list(col_segments),
                 row_spans=list(row_spans), meta=meta, look=look, col_spans=list(col_spans), masked=masked,
                 tiles=tiles)


@functools.lru_cache(maxsize=64)
def _zoomed_axes(layout, zoom: str, query: int) -> tuple:
    """(row slice, column slice, their labels, their segment letters, each row's and column's span) of
    zoom_region: the same for every panel of a view (a grid of 80 panels at T 1087 made them 80 times)."""
    rows, cols = zoom_region_of(layout, zoom, query)
    labels, seg = layout.token_labels(), layout.segments()
    return (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1), tuple(labels[i] for i in rows),
            tuple(labels[i] for i in cols), tuple(seg[i] for i in rows), tuple(seg[i] for i in cols),
            tuple((i, i + 1) for i in rows), tuple((i, i + 1) for i in cols))


def masked_over(values: str, hidden: np.ndarray) -> np.ndarray | None:
    """The pairs drawn as masked over a panel of `values`: the mask's `hidden` pairs over weights and masked
    logits; none over capped logits (the values before the mask, which it shows)."""
    return None if values == "capped logits" else hidden


def zoom_note(s: Settings, max_cells: int) -> str:
    if s.zoom == "all":
        return ""
    rows, cols = zoom_region(s)
    return f" · zoom: {s.zoom}" + (", full resolution" if max(len(rows), len(cols)) <= max_cells else "")


# --- 1. mask -------------------------------------------------------------------------------

def mask_view(s: Settings) -> tuple[go.Figure, str]:
    kinds = [s.mask_kind, s.compare]
    masks = [layout_mask(s, k) for k in kinds]
    stats = [mask_stats(m) for m in masks]
    panels = [_panel(s, m.dense()[0, 0].numpy().astype(float), f"{k}: {st['skip_elements']:.1%} of the pairs masked")
              for k, m, st in zip(kinds, masks, stats)]
    n = cells(s, SINGLE_MAX_CELLS, len(panels))
    fig = heatmap_figure(panels, cols=2, title=f"Who may attend to whom (T = {s.seq_len}){zoom_note(s, n)}",
                         value_name="", colorscale=MASK_SCALE, zmin=0, zmax=1,
                         discrete={1.0: "may attend", 0.0: "masked"}, max_cells=n,
                         outline_row=s.query_position)
    rows = ["| mask | allowed pairs | of T² | skipped by an element-wise kernel | "
            f"skipped {BLOCK_Q}×{BLOCK_KV} tiles |", "|---|---|---|---|---|"]
    for k, st in zip(kinds, stats):
        rows.append(f"| {k} | {st['allowed']:,} | {st['total']:,} | {st['skip_elements']:.1%} | "
                    f"{st['skip_tiles']:.1%} of {st['tiles']} |")
    return fig, "\n".join(rows)


# --- 1b. production's kernels: the work each one does over this layout ------------------------

LEAKED = 3      # a pair a kernel computes although the mask hides it
TILE_LEGEND = {0.0: "skipped (×) / masked", 1.0: "run with a mask", 2.0: "run in full / allowed",
               3.0: "computed, but masked"}


def kernel_grid(mask: AttentionMask, kernel: str) -> tuple[np.ndarray, dict, TileGrid]:
    """([T, T] what `kernel` does at each pair of batch row 0, its kernel_work counts, its tiles). A pair
    shows its tile's class (0 skipped, 1 run with a mask, 2 run in full), or 3 where the kernel computes a
    pair the mask hides. All from KERNEL_TILINGS, the definition the fa4 backend's block-sparse tensors read."""
    k = KERNEL_TILINGS[kernel]
    tiles = k.tiles(mask)
    T = mask.seq_len
    cls = tiles.classes[0].repeat_interleave(tiles.block_q, 0).repeat_interleave(tiles.block_kv, 1)[:T, :T]
    leaked = k.computed(mask, tiles)[0] & ~mask.dense()[0, 0]
    skipped = tuple((int(i), int(j)) for i, j in torch.nonzero(tiles.classes[0] == EMPTY).tolist())
    return (torch.where(leaked, LEAKED, cls.long()).numpy().astype(np.float32), kernel_work(k, mask, 0, tiles),
            TileGrid(tiles.block_q, tiles.block_kv, skipped))


@budget.ByteCache
def _kernel_grids(kind: str, layout) -> dict:
    mask = AttentionMask(kind, layout.seq_len, layout.candidate_start_offset, layout.valid()[None])
    return {name: kernel_grid(mask, name) for name in KERNEL_TILINGS}


# the panels beside the element mask: FA4 first (the lesson's kernel, beside the mask it reads), then H100's
KERNEL_ORDER = ("fa4", "h100-train", "h100-serve")
assert set(KERNEL_ORDER) == set(KERNEL_TILINGS)


def tile_counts(w: dict) -> str:
    """A kernel's tiles and the work it skips, in the words its panel title and the lesson use (two lines: a
    panel beside another is narrow)."""
    return f"{w['full']} full · {w['partial']} masked · {w['empty']} skipped<br>{w['skip_elements']:.1%} of the work skipped"


def kernel_view(s: Settings) -> tuple[go.Figure, str]:
    """The element mask beside the tiles production's kernels run over it (the tile grid drawn, each skipped
    tile crossed), and the share of work each skips, on the figure and in the table."""
    mask = layout_mask(s, s.mask_kind)
    dense = mask.dense()[0, 0].numpy()
    element = np.where(dense, float(FULL), float(EMPTY))
    masked_share = 1 - int(dense.sum()) / dense.size             # mask_stats' skip_elements, from this dense
    panels = [_panel(s, element, f"element mask: {s.mask_kind}<br>{masked_share:.1%} of the pairs masked")]
    rows = ["| kernel | tile | tiles run | skipped | work skipped (tiles · elements) | pairs computed that the "
            "mask hides |", "|---|---|---|---|---|---|"]
    grids = _kernel_grids(s.mask_kind, s.layout)
    for name in KERNEL_ORDER:
        (grid, w, tiles), k = grids[name], KERNEL_TILINGS[name]
        panels.append(_panel(s, grid, f"{k.title}<br>{tile_counts(w)}", tiles=tiles))
        rows.append(f"| {name} | {k.block_q}×{k.block_kv} | {w['run']} of {w['tiles']} ({w['full']} full, "
                    f"{w['partial']} masked) | {w['empty']} | {w['skip_tiles']:.1%} · {w['skip_elements']:.1%} | "
                    f"{w['leaked']:,} |")
    fig = heatmap_figure(panels, cols=2, title=f"Kernel work (T = {s.seq_len}){zoom_note(s, SINGLE_MAX_CELLS)}",
                         value_name="", colorscale=TILE_SCALE, zmin=0, zmax=LEAKED, discrete=TILE_LEGEND,
                         max_cells=SINGLE_MAX_CELLS)
    _, history_end, _, T = ranker_bounds(mask)
    notes = [f"Bound (0, P+L, P+L, T) = (0, {history_end}, {history_end}, {T}). " + "; ".join(
        f"**{name}** — {k.source}" for name, k in KERNEL_TILINGS.items()) + "."]
    if mask.prefix_causal:
        notes.append(f"This is grok.py's causal prefix (`{s.mask_kind}`). Production's kernels take only the "
                     "bound and so compute the bidirectional prefix: drawn here are their tilings over grok.py's "
                     "mask — what a block-sparse kernel with these tiles would skip for it.")
    if history_end % 128 or (T - history_end) % 128:
        notes.append(f"Production's FA4 kernel needs P+L and T−(P+L) to be multiples of 128 (here {history_end} "
                     f"and {T - history_end}), and serves T padded to a multiple of 128; the serving kernel is "
                     "exact only when P+L is (production's 1024 is).")
    if s.history_padding or s.candidate_padding:
        notes.append("Production's kernels mask no padded key (only the `fa4` backend here does): padded "
                     "history slots are computed like any other.")
    works = [w for _, w, _ in _kernel_grids(s.mask_kind, s.layout).values()]
    if all(w["empty"] == 0 for w in works):
        smallest = min(k.block_q for k in KERNEL_TILINGS.values())
        where = first_preset_that_skips(s.mask_kind)
        notes.insert(0, f"**No tile is skipped at this size**: the whole T = {s.seq_len} layout fits in "
                        f"{'one tile' if s.seq_len <= smallest else 'a few tiles'} of each kernel "
                        f"({smallest}×{smallest} and larger), so every tile holds some allowed pair. Tiles skip "
                        "work once the candidate block spans a tile: "
                        + (f"the smallest preset where they do is **{where[0]}** (T = {where[1]}; {where[2]})."
                           if where else "no preset here is that large."))
    elif s.zoom == "all" and s.seq_len > 256:
        notes.insert(0, "Each skipped tile is crossed (×) on the tile grid; set **zoom** to 'history tail' to see "
                        "the candidate tiles at full resolution.")
    return fig, "\n".join(rows) + "\n\n" + "\n\n".join(notes)


@functools.lru_cache(maxsize=8)
def first_preset_that_skips(mask_kind: str) -> tuple[str, int, str] | None:
    """(preset, T, what its kernels skip) for the shortest preset layout where some kernel skips a tile."""
    layouts = sorted((parse_settings({"preset": name}, need_model=False) for name in PRESETS),
                     key=lambda p: p.seq_len)
    for p in layouts:
        mask = AttentionMask(mask_kind, p.seq_len, p.candidate_start_offset, p.layout.valid()[None])
        counts = {name: k.tiles(mask).counts() for name, k in KERNEL_TILINGS.items()}     # tiles only: cheap
        if any(c["empty"] for c in counts.values()):
            return p.preset, p.seq_len, ", ".join(f"{name} skips {c['empty']} of {sum(c.values())} tiles"
                                                  for name, c in counts.items())
    return None


# --- 2. attention heatmaps ---------------------------------------------------------------------

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
                panels.append(_panel(s, vals[h], f"L{layer} · q head {h}", dict(layer=layer, head=h),
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
        panels = [_panel(s, values[v, layer][h], "", dict(layer=layer, head=h, values=v),
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
    holds the bars' probabilities."""
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
    fig = bar_figure(labels, probs, title=f"Where query {labels[q]} attends (layer {layer}, head {head})",
                     value_name="weight", segments=seg)
    top = np.argsort(-probs, kind="stable")[:3]          # ties in position order, as the page breaks them
    text = (f"Query **{labels[q]}** puts " + ", ".join(f"{probs[i]:.4f} on {labels[i]}" for i in top)
            + f"; weights over masked keys sum to {probs[~mask_dense(s, s.mask_kind)[q]].sum(dtype=np.float64):.3g}.")
    return fig, text


# --- 2b. anatomy of one attention row ------------------------------------------------------------

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


# --- 3. candidate isolation -------------------------------------------------------------------
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
    if s.perturbation == "replace":     # another item's hashes in candidate j's slot
        batch = runs.batch_for(s)
        post = batch.candidate_post_hashes.clone()
        post[:, s.candidate] = s.replace_with
        replacement = runs.score(s, replace(batch, candidate_post_hashes=post)).embeddings[s.row:s.row + 1, pos]
    return perturb(emb, pos, s.perturbation, s.delta, seed=s.seed + 7, replacement=replacement)


def isolation_reading(s: Settings, mask_kind: str | None = None) -> IsolationReading:
    """Run the model twice (as is, and with candidate j perturbed) under one mask kind."""
    kind = mask_kind or s.mask_kind
    probe = (s.row, s.candidate, s.perturbation, s.delta, s.replace_with)
    return _isolation_reading(runs.model_settings(s), probe, kind)


@budget.ByteCache
def _isolation_reading(s: Settings, probe: tuple, kind: str) -> IsolationReading:
    s = replace(s, row=probe[0], candidate=probe[1], perturbation=probe[2], delta=probe[3], replace_with=probe[4])
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
                         f"({s.perturbation}, {s.delta:g})" if s.perturbation != "replace" else
                         f"|change| in the residual stream after replacing {j} with item {s.replace_with}")
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


# --- 4. batch invariance and RoPE ---------------------------------------------------------------

def changed_batch(s: Settings, batch: RecsysBatch) -> tuple[RecsysBatch, list[tuple[int, int]]]:
    """Apply the operation to the real candidates -> (new batch, [(old index, new index)] kept)."""
    C = batch.candidate_post_hashes.shape[1]
    real = C - s.candidate_padding
    pads = list(range(real, C))
    if s.operation == "permute":
        order = list(reversed(range(real))) + pads
    elif s.operation == "drop":
        order = [c for c in range(real) if c != s.candidate] + pads
    else:
        order = list(range(C))
    new = batch.select_candidates(torch.tensor(order, dtype=torch.long))    # [] stays a long index
    pairs = sorted((old, new_i) for new_i, old in enumerate(order) if old < real)
    if s.operation == "add":
        # one new candidate per row before the padded slots: the first candidate of a batch drawn the
        # same way from another seed, so its hashes are in this model's vocabulary (the demo world's too)
        extra = runs.make_batch(s, s.seed + 1000)

        def insert(field):
            t, row = getattr(new, field), getattr(extra, field)[:, :1]
            return torch.cat([t[:, :real], row, t[:, real:]], dim=1)
        new = replace(new, **{f: insert(f) for f in ("candidate_post_hashes", "candidate_author_hashes",
                                                      "candidate_product_surface")})
        pairs = [(c, c) for c in range(real)]
    return new, pairs


def invariance(s: Settings) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Scores before and after the operation for the kept candidates: ([N, A], [N, A], pairs)."""
    return _invariance(runs.model_settings(s), s.operation, s.candidate, s.row)


@budget.ByteCache
def _invariance(s: Settings, operation: str, candidate: int, row: int):
    s = replace(s, operation=operation, candidate=candidate, row=row)
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
                             title=f"Batch invariance: |score change| per candidate after '{s.operation}' "
                                   f"(max over actions){row_note(s)}", value_name="max |Δ logit|")
    rounding_floor(fig, per_mode.values())
    head = ("| candidate | " + " | ".join(runs.action_names(s)[:4])
            + " (before → after) | max abs diff |")
    rows = [head, "|---|" + "---|" * 5]
    for (o, n), bb, aa in list(zip(pairs, b, a))[:16]:
        rows.append(f"| {labels[o]} → slot {n} | " + " | ".join(f"{x:.4f} → {y:.4f}" for x, y in zip(bb[:4], aa[:4]))
                    + f" | {np.abs(aa - bb).max():.3g} |")
    largest = {m: float(v.max()) if v.size else 0.0 for m, v in per_mode.items()}
    summary = (f"Largest score change under '{s.operation}' — " + ", ".join(
        f"{m}: {v:.3g}" + (" (within fp32 rounding: invariant)" if v < FP32_TOLERANCE else " (moves)")
        for m, v in largest.items()) + f"; current mode: **{s.rope_mode}**.\n\n"
        + WHAT_OPERATION_DOES[s.operation].format(candidate=labels[s.candidate]) + "\n\n"
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




# --- 7. variants and the bug zoo ------------------------------------------------------------------

@dataclass(frozen=True)
class VariantRun:
    """One recorded forward of a variant, with what its axes are."""
    out: object                    # TransformerOutput: layers[i].probs [1, H, Tq, Tk]
    queries: tuple                 # tick labels of the query rows ...
    keys: tuple                    # ... and of the key columns
    answer: tuple = ()             # key columns of the queried (key, value) pair; () for random inputs
    prediction: str = ""           # the trained model's answer, e.g. "v5" ...
    target: str = ""               # ... and the right one
    trained: bool = False


@budget.ByteCache                            # 10 variants x a few examples; each run is a few kB
def _variant_run(name: str, seed: int) -> VariantRun:
    """The variant trained on associative recall over held-out example `seed`; without the weights
    file, seeded random weights on random embeddings."""
    with torch.no_grad():
        model = load_trained_variant(name)
        if model is not None:
            tokens, target, _ = recall_example(seed, model.task)
            out = model.body(**model.body_inputs(tokens), record=True)
            queries, keys, answer = model.attention_axes(tokens)
            prediction = f"v{int(model(tokens).argmax(-1))}"                     # value tokens print as v<index>
            return VariantRun(out, tuple(queries), tuple(keys), tuple(answer), prediction, f"v{int(target)}",
                              trained=True)
        config = VariantConfig()
        inputs = variant_inputs(name, config, seed)
        out = build_variant(name, config, seed)(**inputs, record=True)
    T, (Tq, Tk) = inputs["embeddings"].shape[1], out.layers[0].probs.shape[-2:]
    rows = [f"t{i}" for i in range(T)]
    cols = [f"s{i}" for i in range(Tk)] if Tk != Tq else rows
    queries = [f"c{i}" for i in range(Tq)] if "candidates" in inputs else rows
    return VariantRun(out, tuple(queries), tuple(cols))


def variant_training_report() -> dict | None:
    """benchmarks/results/variants-training.json (python -m models.train_variants), or None."""
    path = RESULTS_DIR / "variants-training.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _distinct(labels) -> list[str]:
    """Category axes merge equal labels (two pairs may share value v2): repeats get zero-width spaces,
    invisible on the slide."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        out.append(label + "\u200b" * seen.get(label, 0))
        seen[label] = seen.get(label, 0) + 1
    return out


def variant_view(s: Settings) -> tuple[go.Figure, go.Figure, str]:
    """One attention variant from the course notebooks, drawn by the same heatmap builder: every
    layer x head of the variant trained on associative recall (ticks are the task's tokens), and
    every variant's training loss."""
    v = VARIANTS[s.variant]
    run = _variant_run(s.variant, s.seed)
    report = variant_training_report()
    queries, keys = _distinct(run.queries), _distinct(run.keys)
    panels = []
    for layer, trace in enumerate(run.out.layers):
        probs = trace.probs[0].float().numpy()                       # [H, Tq, Tk]
        masked = (probs == 0).all(0)             # exactly 0 in every head: the variant's mask hides the pair
        panels += [Panel(probs[h], queries, keys, f"L{layer} · head {h}", masked=masked)
                   for h in range(probs.shape[0])]
    heads = len(panels) // len(run.out.layers)
    what = "trained on associative recall" if run.trained else "seeded random weights"
    fig = heatmap_figure(panels, cols=heads, title=f"'{s.variant}' (notebook {v.notebook}), {what}: "
                         "every layer × head", value_name="weight", zmin=0,
                         max_cells=GRID_MAX_CELLS, height=None if len(queries) > 1 else 300 + 60 * len(run.out.layers))
    if run.answer:
        _outline_answer(fig, len(panels), len(queries) - 1, run.answer)
    return fig, variant_loss_figure(report, s.variant), f"**{s.variant}** — {v.teaches}.\n\n" + _recall_caption(
        s.variant, run, report)


def _outline_answer(fig: go.Figure, panels: int, row: int, columns: tuple) -> None:
    """A box around the cells the query row should look at, in every panel."""
    box = [dict(type="rect", xref=f"x{'' if k == 1 else k}", yref=f"y{'' if k == 1 else k}",
                x0=min(columns) - 0.5, x1=max(columns) + 0.5, y0=row - 0.5, y1=row + 0.5,
                line=dict(color="#D55E00", width=3)) for k in range(1, panels + 1)]
    fig.update_layout(shapes=list(fig.layout.shapes) + box)


def _recall_caption(name: str, run: VariantRun, report: dict | None) -> str:
    if not run.trained:
        return ("No trained weights (`models/demo/variants.safetensors` is missing; `python -m "
                "models.train_variants` writes it): these are seeded random weights on random inputs, so the "
                "maps have no structure to explain.")
    # the share of the query row's weight (head mean) on the queried pair, per layer; |.| because
    # talking heads mix the probabilities after the softmax, so its rows need not sum to one
    rows = [t.probs[0, :, -1].float().abs() for t in run.out.layers]                 # [H, Tk] each
    mass = [float((r[:, list(run.answer)].sum(-1) / r.sum(-1)).mean()) for r in rows]
    layer = int(np.argmax(mass))
    query, pair = run.queries[-1], " ".join(run.keys[c] for c in run.answer)
    example = f"Ticks: one held-out example, `{' '.join(run.keys)}` + `{query}`" if len(run.queries) == 1 else \
        f"Ticks: one held-out example, `{' '.join(run.queries)}`"
    verdict = "right" if run.prediction == run.target else f"wrong, the value is `{run.target}`"
    text = f"{example}; the model answers `{run.prediction}` ({verdict}). "
    r = (report or {}).get("variants", {}).get(name)
    if r is None:
        return text + f"The `{query}` row puts {mass[layer]:.0%} of its weight on `{pair}` (layer {layer}, outlined)."
    steps, acc, chance = report["steps"], r["held_out_accuracy"], r["chance_accuracy"]
    if acc >= 0.9:
        return text + (f"Trained {steps} steps: held-out accuracy {acc:.0%} (chance {chance:.0%}). Look at the "
                       f"last row, `{query}`: in layer {layer} the heads put {mass[layer]:.0%} of its weight on "
                       f"`{pair}`, the pair it asks for (outlined) — that lookup is how it answers."
                       + _previous_token_note(run))
    solved = [n for n, x in report["variants"].items() if x["held_out_accuracy"] >= 0.9]
    return text + (f"It did **not** learn the task in {steps} steps: held-out accuracy {acc:.0%} (chance "
                   f"{chance:.0%}), and the `{query}` row puts at most {mass[layer]:.0%} of its weight on "
                   f"`{pair}` (layer {layer}, outlined)" + (f" — compare `{solved[0]}`, which did." if solved else "."))


def _previous_token_note(run: VariantRun) -> str:
    """Self-attention over k v k v ...: a layer-0 head whose value rows look one back at their key
    copies the key into the value's position — what the query then finds (an induction head)."""
    if len(run.out.layers) < 2 or len(run.queries) == 1:
        return ""
    probs = run.out.layers[0].probs[0].float().abs()                                 # [H, T, T]
    values = torch.arange(1, probs.shape[-1] - 1, 2)                                 # v rows; their key is one back
    share = (probs[:, values, values - 1] / probs[:, values].sum(-1)).mean(-1)      # [H]
    head = int(share.argmax())
    if share[head] < 0.5:
        return ""
    return (f" Layer 0, head {head}: each `v` row looks one back at its own key ({float(share[head]):.0%} of its "
            "weight), copying the key into the value's position — which is what the query row then finds.")


def variant_loss_figure(report: dict | None, selected: str = "") -> go.Figure:
    """Every variant's training loss from variants-training.json, the selected one drawn thicker."""
    if report is None:
        return line_figure({}, title="No training curves yet: python -m models.train_variants writes "
                           "benchmarks/results/variants-training.json", x_title="step", y_title="loss")
    series = {f"{name} · {r['held_out_accuracy']:.0%}": ([step for step, _ in r["loss"]],
                                                          [loss for _, loss in r["loss"]])
              for name, r in report["variants"].items()}
    chance = next(iter(report["variants"].values()))["chance_accuracy"]
    fig = line_figure(series, title=f"Training loss, {report['task'].split(':')[0]} · {report['steps']} steps, "
                      f"batch {report['batch']} · {report['device']}, {report['date'][:10]}<br><sup>legend: "
                      f"variant · held-out accuracy (chance {chance:.0%})</sup>", x_title="step",
                      y_title="cross-entropy loss (log)", log_y=True, markers=False, height=480)
    for trace in fig.data:
        trace.line.width = 4 if trace.name.split(" · ")[0] == selected else 1.5
    fig.update_layout(legend=dict(orientation="v", y=1, yanchor="top", x=1.02, xanchor="left"),
                      margin=dict(r=210))
    return fig


def bug_zoo_view(s: Settings) -> tuple[go.Figure, str]:
    """The seed notebooks' bugs planted in the current trunk, each probe's verdict, and the chosen
    bug's layer-0 attention through the heatmap builder."""
    model = runs.build_model(s).transformer
    base, r = runs.forward(s), slice(s.row, s.row + 1)
    emb, valid, off = base.embeddings[r], base.valid[r], base.candidate_start_offset
    with torch.no_grad():
        rows = _bug_report(runs.model_settings(s), s.row)
        trace = with_bug(model, s.bug)(emb, valid, off, record=True).layers[0]
    probs = trace.probs[0, 0].float().cpu().numpy()
    # masked: what the model's mask hides and the bug left at exactly 0 (a pair it lets through shows its weight)
    masked = ~mask_dense(s, s.mask_kind) & (probs == 0)
    fig = heatmap_figure([_panel(s, probs, "", masked=masked)], title=f"Layer 0, head 0 with bug '{s.bug}'",
                         value_name="weight", zmin=0, max_cells=SINGLE_MAX_CELLS)
    probes = list(PROBES)
    lines = ["| bug | notebook | " + " | ".join(probes) + " | flagged |", "|---|---|" + "---|" * (len(probes) + 1)]
    for r in rows:
        lines.append(f"| {'**' + r['bug'] + '**' if r['bug'] == s.bug else r['bug']} | {r['notebook']} | "
                     + " | ".join(f"{r[p]:.3g}" for p in probes) + f" | {', '.join(r['flagged']) or '—'} |")
    symptom = BUGS[s.bug].symptom if s.bug in BUGS else "the faithful port: every probe passes" + (
        " but causality, which flags the bidirectional prefix by design" if s.mask_kind == "recsys-bidirectional"
        else "")
    return fig, f"**{s.bug}**: {symptom}.\n\n" + "\n".join(lines) + _capped_note(s, rows[0]["probe_positions"])


def _capped_note(s: Settings, positions: dict) -> str:
    """Say which probes looked at a shorter layout than the one shown, and why."""
    capped = {p: n for p, n in positions.items() if n < s.seq_len}
    if not capped:
        return ""
    by_length: dict[int, list] = {}
    for p, n in capped.items():
        by_length.setdefault(n, []).append(p)
    parts = [f"{' and '.join(ps)} on {n}" for n, ps in sorted(by_length.items(), reverse=True)]
    return (f"\n\nBounded work: each probe runs six models (the faithful trunk and five bugs), and the causality "
            f"probe perturbs every position in turn, so on this {s.seq_len}-position sequence they run on a "
            f"capped layout — the first prefix positions and the first candidates, same weights: "
            + ", ".join(parts) + " positions. Isolation, causality and parity are properties of the wiring, "
            "not of the length; the heatmap above is the full sequence.")


@budget.ByteCache
def _bug_report(s: Settings, row: int):
    base, r = runs.forward(s), slice(row, row + 1)
    capped = capped_layout(base.embeddings[r], base.valid[r], base.candidate_start_offset, BUG_ZOO_MAX_POSITIONS)
    return bug_report(runs.build_model(s).transformer, *capped)



# --- the registry: one record per tab -------------------------------------------------------------
# Everything that lists views reads VIEWS: the page's tabs and their outputs (app.py), the API's
# endpoints and the admission's cost estimates (server/), the exported figures (explorer/export.py), the
# lesson's and presentation mode's main figure (explorer/lesson.py), the README's view table
# (scripts/readme_tables.py). Adding a view: its function above and a record below.

def _same(s: Settings) -> Settings:
    return s


@dataclass(frozen=True)
class Export:
    """A figure the Export tab and the lecture pack draw from a Plot: its name; what it shows of the
    settings (`facts`, each in the words its title uses: 'layer 0', 'query head 1', 'query C2'; file
    names and captions are made of them); its caption, a sentence or two a slide can carry, from
    (the settings drawn, their facts, the settings chosen); and the settings it is drawn with (`adjust`:
    e.g. the bug zoo plants a bug when none is chosen)."""
    name: str
    caption: Callable[[Settings, dict, Settings], str]
    facts: Callable[[Settings], dict] = lambda s: {}
    adjust: Callable[[Settings], Settings] = _same
    title: str = ""             # what a lecturer calls it, where its Plot's label does not say (a zoom)


@dataclass(frozen=True)
class Plot:
    """A figure a view returns: its label on the page, its element id (the page's scripts and the lesson
    find it by this), and the exports drawn from it."""
    label: str
    elem_id: str | None = None
    exports: tuple[Export, ...] = ()
    show_label: bool = False    # the figure's own title names it: a label badge would sit over that title


@dataclass(frozen=True)
class Text:
    """A Markdown text a view returns; `lead`: shown above its part's figures."""
    elem_id: str | None = None
    lead: bool = False


@dataclass(frozen=True)
class Part:
    """One function of the view's settings and the outputs it returns, in order. `model`: it runs the
    sidebar's ranking model (so an export of it needs the model to fit this device)."""
    draw: Callable[[Settings], tuple]
    outputs: tuple
    model: bool = False


@dataclass(frozen=True)
class View:
    """A tab of the page. A drawn view (`cost` given) is also an API endpoint (/<name>) taking the
    configuration as a query string and returning every part's outputs in order; the app builds its tab
    from `controls` (Settings fields, in a row) and `outputs`. A tab without `cost` (timing, export) is
    built and wired by the app itself; its parts, if any, are what its exports draw."""
    name: str                   # the tab's id, the endpoint's api_name, the link's tab=
    title: str                  # the tab's title
    look_for: str               # the line under the title
    teaches: str                # the README's line: what it shows
    parts: tuple = ()
    cost: Optional[Callable[[Settings], Cost]] = None   # its estimated work and memory, figures excluded
    controls: tuple = ()        # the tab's own Settings fields
    needs_model: bool = True    # False: drawn for any layout, building no model (the mask)
    gpu: bool = False           # borrows a ZeroGPU device for each call

    @property
    def outputs(self) -> tuple:
        return tuple(o for p in self.parts for o in p.outputs)

    @property
    def drawn(self) -> bool:
        return self.cost is not None

    @property
    def main(self) -> Optional[str]:
        """The figure presentation mode and the lesson show first (its elem_id)."""
        return next((o.elem_id for o in self.outputs if isinstance(o, Plot)), None)

    def estimate(self, s: Settings) -> Cost:
        """What one request costs: the parts' work and memory, every figure on its way out, the model."""
        plots = sum(isinstance(o, Plot) for o in self.outputs)
        cost = self.cost(s).holding(plots * FIGURE_PEAK_BYTES)
        return cost.holding(model_bytes(s), on_device=True) if self.needs_model else cost

    def draw(self, s: Settings) -> tuple:
        """Every output, refused by name past this device's budget and run once its memory fits."""
        return self._within_budget(s, lambda: tuple(out for p in self.parts for out in p.draw(s)))

    def draw_part(self, index: int, s: Settings) -> tuple:
        """One part's outputs (an export), within the whole view's budget where the part is what that
        budget is for (the model's parts; every part of a view without a model)."""
        part = self.parts[index]
        if not (self.drawn and (part.model or not self.needs_model)):
            return part.draw(s)
        return self._within_budget(s, lambda: part.draw(s))

    def _within_budget(self, s: Settings, fn: Callable[[], tuple]) -> tuple:
        return budget.within_budget(check_budget(s, self.name, self.estimate), fn)


def _recorded(s: Settings) -> Cost:
    return forward_cost(s, s.batch_size, record=True)        # runs.forward: the one recorded forward


def _isolation_cost(s: Settings) -> Cost:
    """The recorded forward, the perturbed batch recorded, and both rows again under a causal mask."""
    B, kept = s.batch_size, recorded_bytes(s, s.batch_size)  # the first stays while the others run
    return (_recorded(s) + forward_cost(s, B, record=True).holding(kept, on_device=True)
            + forward_cost(s, 2, record=True).holding(kept, on_device=True)
            + (forward_cost(s, B) if s.perturbation == "replace" else Cost()))


def _invariance_cost(s: Settings) -> Cost:
    """Three RoPE modes x (before, after), unrecorded."""
    one = forward_cost(s, s.batch_size)
    return Cost(6 * s.batch_size, 6 * one.flops, one.peak_bytes, one.device_bytes)


def _bug_zoo_cost(s: Settings) -> Cost:
    """Six models probed on a capped layout, and the chosen bug's recorded trace beside the forward."""
    models = 1 + len(bug_names("grok"))
    T = min(s.seq_len, BUG_ZOO_MAX_POSITIONS)
    Tc = min(T, PROBES["causality"].max_positions)
    per_model = (forward_cost(s, 2, T)                       # isolation: before and after
                 + forward_cost(s, 2, T)                     # parity: the model and the correct trunk
                 + forward_cost(s, 2 * max(1, min(Tc - 1, 16)), Tc))   # causality: perturbed + unperturbed rows
    total = Cost(per_model.forwards * models, per_model.flops * models, per_model.peak_bytes,
                 per_model.device_bytes)
    layer0 = forward_cost(s, 1, record=True)                  # the chosen bug's recorded trace, full length
    return (total + layer0).holding(2 * model_bytes(s), on_device=True)     # a bugged copy beside the model


def _variants_cost(s: Settings) -> Cost:
    return _recorded(s) + _bug_zoo_cost(s).holding(recorded_bytes(s, s.batch_size), on_device=True)


def _mask_cost(s: Settings) -> Cost:
    """Two [T, T] masks, bool and float, and the kernels' tile maps; building them is ~500 operations a
    cell (T 2048: ~1 s)."""
    return Cost(flops=500.0 * s.seq_len ** 2, peak_bytes=2 * 9 * s.seq_len ** 2)


# --- what each exported figure shows, and its caption -----------------------------------------------

def _row(s: Settings) -> str:
    return f"query {s.layout.token_labels()[s.query_position]}"


def _attention_facts(s: Settings) -> dict:
    if s.head >= 0:
        return dict(layer=f"layer {s.layer}", head=f"query head {s.head}")
    heads = grid_heads(s.num_q_heads, s.num_kv_heads)
    return dict(layer="every layer", head="and head" if len(heads) == s.num_q_heads
                else f"query heads 0-{heads[-1]} of {s.num_q_heads}")


def _one_row_facts(s: Settings) -> dict:
    return dict(layer=f"layer {s.layer}", head=f"query head {max(s.head, 0)}", row=_row(s))


def _perturbed_facts(s: Settings) -> dict:
    return dict(candidate=f"perturbing {s.layout.token_labels()[s.candidate_start_offset + s.candidate]}")


def _lay(s: Settings) -> str:
    return (f"{s.num_user} user token(s), {s.num_history} history items and {s.num_candidates} candidates "
            f"(T = {s.seq_len})")


def _where(f: dict) -> str:
    return ", ".join(v for k, v in f.items() if k in ("layer", "head")).replace(", and head", " and head")


def _skipped_here(s: Settings) -> str:
    """Where the kernels' skipped tiles are in a caption, or that there are none at this size."""
    skipped = {name: w["empty"] for name, (_, w, _) in _kernel_grids(s.mask_kind, s.layout).items()}
    if not any(skipped.values()):
        return f"; at T = {s.seq_len} no kernel skips a tile (the layout fits in a few tiles)"
    return ", with each skipped tile crossed (" + ", ".join(f"{n} skips {k}" for n, k in skipped.items()) + ")"


def _recorded_caption(words: str):
    return lambda s, f, chosen: words + recorded_view(s)[3]


EXPORT_MASK = Export("mask", lambda s, f, chosen: (
    f"Who may attend to whom over {_lay(s)}: rows are queries, columns keys; blue cells may attend. Left the "
    f"model's own mask '{s.mask_kind}', right '{s.compare}' for comparison; dashed lines separate user, history "
    "and candidates."))
EXPORT_KERNELS = (
    Export("kernels", lambda s, f, chosen: (
        f"The work production's attention kernels do over this layout (T = {s.seq_len}): tiles run in full, run "
        "with a mask, skipped, and pairs computed that the mask hides.")),
    Export("kernels_candidates", lambda s, f, chosen: (
        f"The same kernel tiles, {f.get('zoom')}: the last history positions and the {s.num_candidates} "
        f"candidates at full resolution{_skipped_here(s)}."),
        facts=lambda s: dict(zoom="zoom: history tail"),                    # zoom_note's words
        adjust=lambda s: replace(s, zoom="history tail"), title="kernel tiles, history tail at full resolution"))
EXPORT_ATTENTION = Export("attention", lambda s, f, chosen: (
    f"Attention {s.values} of {_where(f)}, from the model's own forward pass ({s.weights} weights) over {_lay(s)}; "
    f"colour scale {s.color}."), facts=_attention_facts)
EXPORT_QUERY_ROW = Export("query_row", lambda s, f, chosen: (
    f"The attention weights of {f.get('row')} in {_where(f)}: one bar per key, coloured by segment (user, history, "
    "candidate)."), facts=lambda s: dict(layer=f"layer {s.layer}", head=f"head {max(s.head, 0)}", row=_row(s)))
EXPORT_ANATOMY = (
    Export("anatomy_qk", lambda s, f, chosen: (
        f"Step 1 for {f.get('row')} ({_where(f)}): the query vector and every key vector after the rotary "
        "position embedding, one row each, one column per dimension."), facts=_one_row_facts),
    Export("anatomy_steps", lambda s, f, chosen: (
        f"Steps 2–6 for {f.get('row')} ({_where(f)}): the dot product q·k per key, times the attention "
        f"{'scale √128/key size' if s.family == 'xrex' else 'multiplier'} {s.attn_scale:.4g}, after the "
        f"{s.cap_method} cap, with masked keys removed, and after the softmax: the attention weights."),
        facts=_one_row_facts),
    Export("anatomy_sum", lambda s, f, chosen: (
        f"Step 7 for {f.get('row')} ({_where(f)}): each key's value vector times its attention weight, and their "
        "sum (last row), the head's output."), facts=_one_row_facts))
EXPORT_ISOLATION = (
    Export("isolation", lambda s, f, chosen: (
        f"How far the residual stream moves, per layer and position, after {f.get('candidate')} ({s.perturbation}): "
        f"under the '{s.mask_kind}' mask only its own column changes; under a causal mask the change reaches later "
        "candidates."), facts=_perturbed_facts),
    Export("isolation_logits", lambda s, f, chosen: (
        f"The largest change in each candidate's action logits after {f.get('candidate')}, for the "
        f"'{s.mask_kind}' mask and the causal mask."), facts=_perturbed_facts))
EXPORT_INVARIANCE = Export("invariance", lambda s, f, chosen: (
    f"Each kept candidate's score change after '{s.operation}' on the candidate set, for each RoPE position mode: "
    "zero means the score does not depend on the other candidates or its slot."))
EXPORT_ROPE = (
    Export("rope_angles", lambda s, f, chosen: (
        f"The rotary embedding's angle (mod 2π) for each dimension pair and position (base {s.rope_base:g}, "
        f"offset {s.rope_offset}): low pairs turn fast, high pairs slowly.")),
    Export("rope_qk", lambda s, f, chosen: (
        "q·k for q = k = 1 after rotation, against the distance between the two positions: it depends only on "
        "the distance, not on the absolute positions.")))
EXPORT_VARIANT = (
    Export("variant", lambda s, f, chosen: (
        f"Attention weights of the {f.get('variant')} variant from the course notebooks, trained on associative "
        "recall; ticks are the tokens of one held-out example, the queried pair outlined."),
        facts=lambda s: dict(variant=f"'{s.variant}'")),
    Export("variant_loss", lambda s, f, chosen: (
        "Training loss of every attention variant on associative recall; the legend gives each one's held-out "
        "accuracy.")))
EXPORT_BUG_ZOO = Export("bug_zoo", lambda s, f, chosen: (
    f"Attention weights in layer 0, head 0 of the {'production' if s.family == 'xrex' else 'grok.py'} trunk "
    + (f"with the {f.get('bug')} planted." if s.bug != "none" else
       f"with {f.get('bug')}: the port as it is, no bug planted (the bug zoo's first row; plant one to see what it "
       "breaks).")),
    facts=lambda s: dict(layer="layer 0", head="head 0", bug=f"bug '{s.bug}'"))
EXPORT_GPU = (
    Export("gpu_kernels", lambda s, f, chosen: kernel_caption(gpu_run())),
    Export("gpu_forward", lambda s, f, chosen: trunk_caption(gpu_run())))
EXPORT_TIMING = (
    Export("timing", _recorded_caption("Time per attention call, median with min-max bars over the repeats. ")),
    Export("timing_memory", _recorded_caption("Peak memory of one attention call above its inputs. ")),
    Export("timing_speedup", _recorded_caption(
        "Speed-up of each backend over naive attention at the same T in the same run, beside the grey bound of "
        "what skipping the mask's empty tiles alone would give. ")))


VIEWS: dict[str, View] = {v.name: v for v in (
    View("mask", "1 · Mask",
         look_for="Look for: the candidate block's diagonal (each candidate sees the user, the history and only "
                  "itself) against the causal mask, where later candidates also see earlier ones.",
         teaches="Who may attend to whom: candidates see the user, the history and themselves, never each other. "
                 "Two mask kinds side by side, and counts of how much work a mask-aware kernel skips, per element "
                 "and per 64×128 tile. Beside the element mask, the tiles production's kernels run over the layout "
                 "(H100 training 64×64, H100 serving 64×128 with unmasked history blocks, FA4 block-sparse "
                 "128×128): full, masked or skipped, the share each skips and any pair computed that the mask "
                 "hides (`models.masks.KERNEL_TILINGS`, the same tiles the `fa4` backend's block-sparse tensors "
                 "are built from).",
         parts=(Part(mask_view, (Plot("mask", "mask-plot", exports=(EXPORT_MASK,)), Text())),
                Part(kernel_view, (Plot("production's kernels: tiles run and skipped", "kernel-plot",
                                        exports=EXPORT_KERNELS), Text()))),
         cost=_mask_cost, controls=("compare",), needs_model=False),
    View("attention", "2 · Attention",
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
         cost=_recorded, controls=("values", "color")),
    View("anatomy", "2b · Anatomy",
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
         cost=_recorded),
    View("isolation", "3 · Isolation",
         look_for="Look for: under the recsys mask, perturbing candidate j changes only its own column; under the "
                  "causal mask the change leaks into every later candidate.",
         teaches="Perturb one candidate (scale, noise, replace) and no other candidate changes by a single bit "
                 "under the recsys mask; under a causal mask later candidates move.",
         parts=(Part(isolation_view, (Plot("change per layer and position", "isolation-plot", exports=EXPORT_ISOLATION[:1]),
                                      Plot("change per candidate", "isolation-logits-plot", exports=EXPORT_ISOLATION[1:]),
                                      Text()),
                     model=True),),
         cost=_isolation_cost, controls=("candidate", "perturbation", "delta", "replace_with"), gpu=True),
    View("invariance", "4 · Invariance & RoPE",
         look_for="Look for: with sequential RoPE positions, reordering candidates moves their scores; with shared "
                  "or no positions they stay put (batch invariance).",
         teaches="Permute, drop or add candidates: with `sequential` RoPE a candidate's slot changes its score; "
                 "`shared` positions or no RoPE make scoring batch-invariant. The RoPE panel shows rotation angles "
                 "and that q·k depends only on distance.",
         parts=(Part(invariance_view, (Plot("score change", "invariance-plot", exports=(EXPORT_INVARIANCE,)), Text()),
                     model=True),
                Part(rope_view, (Plot("RoPE angles", exports=EXPORT_ROPE[:1]),
                                 Plot("q·k vs distance", exports=EXPORT_ROPE[1:]), Text()))),
         cost=_invariance_cost, controls=("operation",), gpu=True),
    View("variants", "5 · Variants",
         look_for="Look for: in the trained model's last row, the weight on the queried key/value pair (outlined).",
         teaches="MHA / MQA / GQA / MLA / talking heads / encoders / encoder–decoder / DIN through the same "
                 "heatmaps; each course-notebook bug planted in the trunk, and which probe catches it.",
         parts=(Part(variant_view, (Plot("variant attention", "variants-plot", exports=EXPORT_VARIANT[:1]),
                                    Plot("training loss of every variant", "variants-loss-plot",
                                         exports=EXPORT_VARIANT[1:]), Text())),
                Part(bug_zoo_view, (Plot("attention with the bug", exports=(EXPORT_BUG_ZOO,)),
                                    Text(lead=True)), model=True)),
         cost=_variants_cost, controls=("variant", "bug")),
    View("timing", "6 · Flash vs naive",
         look_for="Look for: how many times faster than naive the fused kernels run on a GPU (recorded, left) and "
                  "here (live, right: Run), and why the whole model gains far less than its attention does.",
         teaches="The committed GPU run, shown to every visitor before anything runs: production's attention per "
                 "backend as × naive, with its useful TFLOP/s as a share of the same run's matmul peak, the tanh "
                 "cap's cost, the tiles and the longest T; and the whole trunk's forward per backend with "
                 "attention's share, so the kernel's gain and the model's, far smaller, stand side by side. Beside "
                 "it, on its own axes, the backends timed live on this machine for the current shape (time, memory, "
                 "speed-up, error vs an fp32 reference; budget-capped and cancellable, at every preset: attention shapes need no "
                 "model; one colour per backend everywhere). The exact backends that win here are ticked by default "
                 "(flex on CPU), each with a line on why it is fast or slow here; a table puts the work the mask lets "
                 "a block-sparse kernel skip (tiles, FLOPs) beside the time saved, and the speed-up chart draws the "
                 "bound skipping alone would give. Points appear as each length is measured, with a T²-scaled ETA; "
                 "Stop keeps them and says how far the run got.",
         parts=(Part(evidence_view, (Plot("flash vs naive: recorded on a GPU, live here", "flash-plot",
                                          exports=EXPORT_GPU[:1], show_label=False),
                                     Plot("the whole forward, recorded on a GPU", "trunk-plot", exports=EXPORT_GPU[1:],
                                          show_label=False), Text("gpu-text"))),
                Part(recorded_view, (Plot("time", "time-plot", exports=EXPORT_TIMING[:1], show_label=False),
                                     Plot("memory", exports=EXPORT_TIMING[1:2], show_label=False),
                                     Plot("speed-up", exports=EXPORT_TIMING[2:], show_label=False), Text())),)),
    View("export", "7 · Export",
         look_for="Look for: figures redrawn in the lecture theme at 16:9, with captions describing each one.",
         teaches="Any figure, previewed as its slide, as PNG (3×) or SVG in a lecture theme (large fonts, tick "
                 "labels ≥ 16 px, colour-blind-safe palette, white background) at a slide shape (16:9 by default, "
                 "4:3, or the figure's own), or a lecture pack: every figure this device can draw at the settings as "
                 "PNG, SVG and the numbers drawn (`data/*.npz`), named for the preset, layer, head and row shown; "
                 "captions generated from each figure's own settings; what was left out and why (a production model "
                 "on a CPU); the configuration; and `lesson.html`, the lesson — both stories, each step's claim over "
                 "the figure that shows it — then every figure at the settings, interactive in one file that needs "
                 "no network (plotly.js inlined, ~6 MB at lecture)."),
)}


def drawn_views() -> list[View]:
    """The views with an endpoint of their own, in tab order."""
    return [v for v in VIEWS.values() if v.drawn]


def check_view(name, field: str = "view") -> View:
    """The record of tab `name`, or a refusal naming `field` (a link's or an event's `tab`, say)."""
    if not isinstance(name, str) or name not in VIEWS:          # a list from an API client is unhashable
        raise ValidationError(field, name, ", ".join(VIEWS))
    return VIEWS[name]
