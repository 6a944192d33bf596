"""What every heatmap view draws over the layout: the model's mask, the zoomed region of the sequence and
its panels (``layout_panel``: a [T, T] array cut to the zoom, labelled by token and segment), how many cells a
figure may hold per axis, and the notes titles carry (the batch row, the zoom).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from models.masks import AttentionMask

from ..figures import Panel, TileGrid
from ..limits import MAX_FIGURE_CELLS
from ..schema import Settings

GRID_MAX_CELLS = 128      # per axis, per panel, in the layer x head grid
SINGLE_MAX_CELLS = 512


def layout_mask(s: Settings, kind: str) -> AttentionMask:
    """`kind` over the layout, with its key padding, as the model applies it."""
    return AttentionMask(kind, s.seq_len, s.candidate_start_offset, s.layout.valid()[None])


def mask_dense(s: Settings, kind: str) -> np.ndarray:
    """[T, T] bool: the structure of `kind` and the layout's key padding, as the model applies it."""
    return layout_mask(s, kind).dense()[0, 0].numpy()


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


def layout_panel(s: Settings, z: np.ndarray | torch.Tensor, title: str, meta: dict | None = None,
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
