"""Every figure of the explorer, from three builders: ``heatmap_figure`` (masks, attention, isolation),
``bar_figure`` and ``line_figure``. One theme (light, large fonts, Okabe-Ito colour-blind-safe colours)
so an exported figure goes straight onto a slide.

A heatmap panel is plain data (``Panel``): values [rows, cols] (an array, or a tensor where the model left it:
a GPU's is pooled there, and only the cells drawn cross to the host), token labels for both axes and the
sequence's segment letters (U / H / C / P). The builder draws segment boundaries, token ticks and a
hover naming the query and key tokens (their labels carry the segment: U, H3, C0, pad·C2) with the
exact value. Sequences longer than ``max_cells`` are shown pooled (max over blocks) and the hover says
so; a figure's cells also fit a byte budget on the wire (``max_bytes``), masks sent as uint8.
"""
from __future__ import annotations

import base64
import functools
import io
import itertools
import math
import pickle
import threading
from dataclasses import dataclass, replace
from typing import Optional, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import torch
from _plotly_utils.utils import plotlyjsShortTypes, to_typed_array_spec
from plotly.io.json import to_json_plotly

from .budget import nbytes
from .page_contract import FIGURE_TEXT, fill

# Okabe-Ito: distinguishable with every common colour-vision deficiency
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
SEGMENT_COLORS = {"U": "#CC79A7", "H": "#0072B2", "C": "#D55E00", "P": "#BBBBBB"}
SEQUENTIAL = "Viridis"
DIVERGING = "RdBu"
# a masked pair, on every heatmap: a neutral grey that neither Viridis (weights) nor RdBu (logits, white at 0)
# contains, so "masked" never reads as "a tiny weight"
MASKED_COLOUR = "#BDBDBD"
MASK_SCALE = [[0.0, MASKED_COLOUR], [0.5, MASKED_COLOUR], [0.5, "#0072B2"], [1.0, "#0072B2"]]
# a kernel's work over the grid, values 0..3: skipped, run with a mask, run in full, computed though masked;
# orange and reddish purple (not two oranges) for the two classes a projector must tell apart
TILE_SCALE = [[0.0, MASKED_COLOUR], [1 / 6, MASKED_COLOUR], [1 / 6, "#E69F00"], [0.5, "#E69F00"],
              [0.5, "#0072B2"], [5 / 6, "#0072B2"], [5 / 6, "#CC79A7"], [1.0, "#CC79A7"]]
MASKED_NAME = "masked: logit −∞, weight exactly 0"
MAX_MARKED_CELLS = 24       # per axis: up to this many, a masked cell also carries a ×

FONT = dict(family="DejaVu Sans, Arial, sans-serif", size=14, color="#222222")
LECTURE_FONT_SIZE = 20


HELD_PER_CONTENT_BYTE, HELD_PER_FIGURE = 2.5, 200_000      # Figure.held_bytes


class Figure(go.Figure):
    """The builders' figure: a plotly Figure built lazily, whose ``to_json`` (what Gradio sends on every
    redraw) writes what plotly's writes without plotly's copies.

    Built as the builders build it (``Figure(dict(data=..., layout=...), _validate=False)``), it keeps the
    plain dicts, arranged as plotly's ``_data`` / ``_layout`` would hold them (``_as_plotly_holds``), and
    builds plotly's state (a deep copy of everything, an object per trace, annotation and shape: ~18 % of
    the server's GIL time under the soak, issue 34) only when something reads or changes it (``fig.layout``,
    ``fig.data``, ``update_layout``, ``go.Figure(fig)``): ``__getattr__`` runs plotly's ``__init__`` on the
    first private attribute missing (``_build``). Serving needs none of it: Gradio's gr.Plot calls
    ``to_json`` and the cached views ``freeze`` / ``held_bytes``, which read the plain dicts. Once built,
    the JSON is written from plotly's state, as it would have been. A plain dict a figure keeps is shared
    with its builder: builders hand theirs over and never change them after."""

    def __init__(self, data=None, *args, **kwargs):
        held = _as_plotly_holds(data) if not args and kwargs == {"_validate": False} else None
        if held is None:
            super().__init__(data, *args, **kwargs)
        else:
            self._lazy = (data, *held)

    def __getattr__(self, name: str):
        # plotly keeps its state in private attributes only: a missing public or special name (copy's
        # __deepcopy__, a hasattr check) is as missing in a built figure, and builds nothing
        if name.startswith("_") and not name.startswith("__") and ("_lazy" in self.__dict__
                                                                    or "_packed" in self.__dict__):
            with _BUILDING:
                lazy = self._unpacked()
                if lazy is not None:
                    self._build(lazy[0])
        return object.__getattribute__(self, name)

    def _build(self, spec: dict) -> None:
        """Plotly's state, built aside and put in at once: a shared figure (explorer.views.records) read by
        two threads never shows one of them half of it. Plotly's objects point back at their figure: here."""
        built = go.Figure.__new__(Figure)
        go.Figure.__init__(built, spec, _validate=False)
        for obj in (*built._data_objs, built._layout_obj):
            obj._parent = self
        built._data_validator.set_uid = self._set_trace_uid
        self.__dict__.update(built.__dict__)
        del self.__dict__["_lazy"]

    def _held(self) -> tuple[list, dict]:
        """The traces and layout as plotly holds them: plotly's own once built, else the plain dicts."""
        if "_packed" in self.__dict__:
            with _BUILDING:
                self._unpacked()
        lazy = self.__dict__.get("_lazy")
        return (self._data, self._layout) if lazy is None else lazy[1:]

    def _unpacked(self) -> Optional[tuple]:
        """The plain dicts (``_lazy``), out of the bytes a figure that came pickled keeps them in (``_packed``,
        _thawed) where it has not read them yet. Under _BUILDING."""
        packed = self.__dict__.get("_packed")
        if packed is not None:
            self.__dict__["_lazy"] = _unpack(packed)
            del self.__dict__["_packed"]
        return self.__dict__.get("_lazy")

    def to_json(self, *args, **kwargs) -> str:
        if args or kwargs:
            return super().to_json(*args, **kwargs)
        frozen = self.__dict__.get("_frozen_json")
        if frozen is not None:
            return frozen
        traces, layout = self._held()
        data = [{k: v for k, v in trace.items() if k != "uid"} for trace in traces]     # as plotly: no uids
        return to_json_plotly({"data": _for_json(data), "layout": _for_json(layout)})

    def freeze(self) -> "Figure":
        """This figure as it is from now on, shared (explorer.views.records keeps drawn views for every
        visitor): its JSON written once and sent as it is each time. Change a copy (go.Figure(fig)), never
        it: a change after freeze would not reach its JSON. Its dicts are packed in bytes from now on, out of the
        garbage collector's reach (a full collection stops every thread, and walks each container it holds:
        hundreds a view), and unpacked only when something reads them (serving reads none)."""
        if self.__dict__.get("_frozen_json") is None:
            self._frozen_json = self.to_json()
            self.held_bytes()                               # counted from the dicts, before they are packed
            with _BUILDING:
                lazy = self.__dict__.get("_lazy")
                if lazy is not None:
                    self.__dict__["_packed"] = _pack(lazy)
                    del self.__dict__["_lazy"]
        return self

    def __reduce__(self):
        """A frozen figure pickles as what it holds: its JSON, its count (held_bytes) and its traces and layout
        packed in bytes of their own (a drawing process hands it to the server so: server.drawing). The server
        unpickles it in microseconds where plotly's builds its objects (5-18 ms a view) and leaves the JSON to
        be written again, and it keeps the dicts packed until something reads them (serving reads none): bytes
        are no work for the garbage collector, where a view's dicts and lists are hundreds of containers it
        scans at every full collection, which stops every thread. Any other figure pickles as plotly's."""
        frozen = self.__dict__.get("_frozen_json")
        if frozen is None:
            return super().__reduce__()
        packed = self.__dict__.get("_packed")
        if packed is None:
            traces, layout = self._held()
            packed = _pack(self.__dict__.get("_lazy") or ({"data": traces, "layout": layout}, traces, layout))
        return _thawed, (packed, frozen, self.held_bytes())

    def held_bytes(self) -> int:
        """What a frozen figure holds (explorer.budget's count of a cache): plotly's objects over its arrays,
        its JSON. Measured with tracemalloc over every drawn view at lecture, phoenix-nano and phoenix-2026-nano
        when every figure built plotly's objects: 1.7-6x its arrays and JSON, and 25-170 kB a figure beside
        them; counted here as 2.5x and 200 kB, at or above each (tests/test_view_registry.py). A figure that
        never built them holds less: the count stays an upper bound. A frozen figure's count is kept (the caches
        ask at each get and put)."""
        kept = self.__dict__.get("_held_bytes")
        if kept is not None:
            return kept
        frozen = self.__dict__.get("_frozen_json")
        content = nbytes(self._held()[0]) + len(frozen or "")
        held = int(HELD_PER_CONTENT_BYTE * content) + HELD_PER_FIGURE
        if frozen is not None:
            self._held_bytes = held
        return held


_BUILDING = threading.Lock()       # Figure._build: one thread builds a figure's plotly state


@functools.cache
def _plotly_props(cls) -> frozenset:
    """The properties a plotly class (a trace type, Layout, a subplot's axis) knows."""
    return frozenset(cls()._valid_props)


def _plotly_order(d: dict, cls) -> dict:
    """A trace's, layout's or subplot axis's top level as plotly's constructor leaves it: the properties
    its class knows in alphabetical order, None left out, a trace's type after them, then the rest as
    given (a layout's subplot axes, xaxis2 and on, last, each arranged as plotly's axis class arranges it).
    Below that plotly keeps what it is given as it is."""
    known, trace = _plotly_props(cls), cls in _TRACE_TYPES.values()
    out = {k: d[k] for k in sorted(known.intersection(d)) if d[k] is not None and not (trace and k == "type")}
    if cls is not go.Layout:
        out.update({"type": d["type"]} if trace else {})
        out.update((k, d[k]) for k in d if k not in known)
        return out
    rest = [k for k in d if k not in known]
    axes = [k for k in rest if _subplot(k)]
    out.update((k, d[k]) for k in rest if k not in axes)
    out.update((k, _plotly_order(d[k], _SUBPLOT_AXES[_subplot(k)])) for k in axes)
    return out


def _subplot(key: str) -> str:
    """'xaxis' for a layout's xaxis2, xaxis3, ... (what plotly's Layout builds an axis object for); else ''."""
    return key.rstrip("0123456789") if go.Layout._subplotid_prop_re.match(key) else ""


_SUBPLOT_AXES = {"xaxis": go.layout.XAxis, "yaxis": go.layout.YAxis}


@functools.cache
def _template_held() -> dict:
    """TEMPLATE as plotly holds it in a layout (rebuilt and rearranged by its Template class)."""
    return go.Figure(dict(layout=dict(template=TEMPLATE)), _validate=False)._layout["template"]


def _thawed(packed: bytes, frozen_json: str, held_bytes: int) -> Figure:
    """A frozen Figure as it was pickled (Figure.__reduce__): nothing built, nothing written again, its dicts
    left packed."""
    figure = Figure.__new__(Figure)
    figure.__dict__.update(_packed=packed, _frozen_json=frozen_json, _held_bytes=held_bytes)
    return figure


class _Pickler(pickle.Pickler):
    """A figure's dicts, the template they share (TEMPLATE, and as plotly holds it) written as a name: it is
    the same object in every figure, and unpacked as that object again."""

    def persistent_id(self, obj):
        if obj is TEMPLATE:
            return "template"
        if obj is _template_held():
            return "template held"
        return None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        if pid == "template":
            return TEMPLATE
        if pid == "template held":
            return _template_held()
        raise pickle.UnpicklingError(f"unknown shared object {pid!r}")


def _pack(lazy: tuple) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(lazy)
    return out.getvalue()


def _unpack(packed: bytes) -> tuple:
    return _Unpickler(io.BytesIO(packed)).load()


def _as_plotly_holds(spec) -> Optional[tuple[list, dict]]:
    """The traces and layout that ``go.Figure(spec, _validate=False)`` keeps as ``_data`` / ``_layout``
    (less its copies and the uids, which no JSON carries), for the specs the builders write: a dict of
    ``data`` (dicts, each with its type) and ``layout`` (with template TEMPLATE). None for any other spec
    (plotly builds that one at once). scripts/same_figures.py checks the JSON is plotly's, byte for byte."""
    if not isinstance(spec, dict) or set(spec) != {"data", "layout"}:
        return None
    data, layout = spec["data"], spec["layout"]
    if not (isinstance(data, list) and isinstance(layout, dict) and layout.get("template") is TEMPLATE
            and all(isinstance(t, dict) and t.get("type") in _TRACE_TYPES for t in data)
            and all(_subplot(k) in _SUBPLOT_AXES and isinstance(v, dict) and not k.endswith("axis1")
                    for k, v in layout.items() if _subplot(k))):       # (plotly renames an xaxis1)
        return None
    layout = _plotly_order({**layout, "template": _template_held()}, go.Layout)
    return [_plotly_order(t, _TRACE_TYPES[t["type"]]) for t in data], layout


_TRACE_TYPES = {"heatmap": go.Heatmap, "scatter": go.Scatter, "bar": go.Bar}     # what the builders draw


_KEPT = {"geojson", "layer", "layers", "range"}      # keys plotly's to_dict never converts (is_skipped_key)


def _typed_array(v: np.ndarray):
    """plotly's to_typed_array_spec for the arrays the builders send (float32/64, small ints, uint8), without
    its dataframe checks (~0.1 ms an array); any other array through plotly's own."""
    short = plotlyjsShortTypes.get(str(v.dtype))
    if short is None or v.size == 0:
        return to_typed_array_spec(v)
    spec = {"dtype": short, "bdata": base64.b64encode(np.ascontiguousarray(v)).decode("ascii")}
    if v.ndim > 1:
        spec["shape"] = str(v.shape)[1:-1]
    return spec


def _for_json(obj):
    """`obj` as Figure.to_dict writes it for JSON: containers copied, leaves shared, a numpy array that is a
    dict's value as plotly.js's typed array (base64), the keys plotly leaves as they are left. (The builders
    put no other array types in a figure.)"""
    if isinstance(obj, dict):
        return {k: v if k in _KEPT else _typed_array(v) if isinstance(v, np.ndarray) else _for_json(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if all(type(v) in _SCALARS for v in obj):      # labels, tick values, domains: written as they are
            return obj
        return [_for_json(v) for v in obj]
    return obj


_SCALARS = {str, int, float, bool, type(None)}


# plotly's default template for what the builders draw (2-D axes; heatmap, scatter and bar traces): the
# rest of it (3-D scenes, maps, polar axes, twenty other trace types) is ~2,000 values serialised with
# every figure and drawn by none
_PLOTLY = pio.templates["plotly"].to_plotly_json()
TEMPLATE = {"data": {t: _PLOTLY["data"][t] for t in ("heatmap", "scatter", "bar")},
            "layout": {k: v for k, v in _PLOTLY["layout"].items()
                       if k not in ("polar", "ternary", "scene", "geo", "mapbox", "map")}}


def lecture_theme(fig: go.Figure) -> go.Figure:
    """Export look: larger fonts everywhere (titles scale with it)."""
    fig = go.Figure(fig)
    fig.update_layout(font=dict(size=LECTURE_FONT_SIZE),
                      title=dict(font=dict(size=LECTURE_FONT_SIZE + 4)))
    fig.update_annotations(font_size=LECTURE_FONT_SIZE - 2)
    return fig


# --- heatmaps ----------------------------------------------------------------------------

@dataclass
class Panel:
    """One heatmap: z [rows, cols] over query tokens (rows) and key tokens (cols): a numpy array, or a torch
    tensor on any device (heatmap_figure pools it where it is: see pool)."""
    z: np.ndarray | torch.Tensor
    row_labels: list[str]
    col_labels: list[str]
    title: str = ""
    row_segments: Optional[list[str]] = None     # one of U/H/C/P per row, for boundary lines
    col_segments: Optional[list[str]] = None
    pooled: int = 1                              # block size when pooled for display
    # per row, the [start, stop) sequence positions it holds (one position, or a pooled block): what a
    # click on the row picks and where the chosen query row is outlined; None for rows that are no query
    row_spans: Optional[list[tuple[int, int]]] = None
    meta: Optional[dict] = None                  # extra trace meta, e.g. {"layer": 1, "head": 3}: what a click picks
    # an alternative of heatmap_figure(shown_panel=...) drawn in its own look when shown: the figure's title,
    # value_name, colorscale and zmin (the figure's own where left out)
    look: Optional[dict] = None
    col_spans: Optional[list[tuple[int, int]]] = None    # per column, the positions it holds (as row_spans)
    # [rows, cols] bool: the pairs the mask hides, drawn over the values in the masked colour
    masked: Optional[np.ndarray] = None
    tiles: Optional["TileGrid"] = None           # a kernel's tiles, outlined over the panel


@dataclass(frozen=True)
class TileGrid:
    """A kernel's tiling of a panel whose rows and columns are sequence positions: the tile edges every
    `block_q` rows and `block_kv` columns, and the (tile row, tile column) of each tile it skips, crossed."""
    block_q: int
    block_kv: int
    skipped: tuple[tuple[int, int], ...] = ()


def row_of(panel: Panel, position: int) -> Optional[int]:
    """The index of the panel row that holds sequence position `position`, or None."""
    for i, (a, b) in enumerate(panel.row_spans or ()):
        if a <= position < b:
            return i
    return None


def boundaries(segments: Sequence[str]) -> list[int]:
    """Positions where the user / history / candidate block changes (padding stays in its block)."""
    block = []
    for i, s in enumerate(segments):
        b = s if s != "P" else (block[-1] if block else "U")
        block.append(b)
    return [i for i in range(1, len(block)) if block[i] != block[i - 1]]


def segment_bins(segments: Optional[Sequence[str]], n: int, f: int) -> list[tuple[int, int]]:
    """[start, stop) bins of at most `f` positions that never straddle a change of segment (user /
    history / candidates / padding): each run of equal letters is cut on its own."""
    return list(_segment_bins(None if segments is None else tuple(segments), n, f))


@functools.lru_cache(maxsize=64)
def _segment_bins(segments: Optional[tuple[str, ...]], n: int, f: int) -> tuple[tuple[int, int], ...]:
    """segment_bins, once per axis of a figure's panels (a grid's 80 share two)."""
    runs, start = [], 0
    for i in range(1, n + 1):
        if i == n or (segments is not None and segments[i] != segments[start]):
            runs.append((start, i))
            start = i
    return tuple((a, min(a + f, b)) for a, b in runs for a in range(a, b, f))


def pool(panel: Panel, max_cells: int, factor: int = 1, masks: Optional[dict] = None) -> Panel:
    """Max over blocks so a T x T panel fits in about max_cells per axis (blocks of at least `factor`).
    Blocks are cut inside each segment, so no block mixes history with candidates or real slots with
    padding; labels name the range. The pooled panel's z is a numpy array; a tensor on a GPU is pooled
    there (_pooled_on_device), bit for bit what pooling on the host gives. `masks`: pooled masked pairs by
    the memory their array reads (_memory), for panels that share one (every head of a layout, zoomed or not:
    pooled once)."""
    rows, cols = panel.z.shape
    f = max(1, factor, math.ceil(max(rows, cols) / max_cells))
    if f == 1:
        return replace(panel, z=_on_host(panel.z)) if isinstance(panel.z, torch.Tensor) else panel
    row_bins, col_bins = (_segment_bins(None if seg is None else tuple(seg), n, f)
                          for seg, n in ((panel.row_segments, rows), (panel.col_segments, cols)))
    pooled = _pooled_on_device(panel.z, row_bins, col_bins)
    if pooled is None:
        z = _on_host(panel.z)
        pooled = _block_max(_block_max(z, row_bins, 0), col_bins, 1)

    def span(labels, bins):
        return [labels[a] if b - a == 1 else f"{labels[a]}–{labels[b - 1]}" for a, b in bins]

    def segs(segments, bins):
        return None if segments is None else [segments[a] for a, _ in bins]

    def spans(given, bins):
        return given and [(given[a][0], given[b - 1][1]) for a, b in bins]

    # a pooled block is masked where every pair in it is
    masks = {} if masks is None else masks
    masked = None if panel.masked is None else masks.get(_memory(panel.masked))
    if panel.masked is not None and masked is None:
        masked = masks[_memory(panel.masked)] = _block_max(_block_max(
            (~panel.masked).astype(np.float32), row_bins, 0), col_bins, 1) == 0
    return replace(panel, z=pooled, row_labels=span(panel.row_labels, row_bins),
                   col_labels=span(panel.col_labels, col_bins), row_segments=segs(panel.row_segments, row_bins),
                   col_segments=segs(panel.col_segments, col_bins), pooled=f,
                   row_spans=spans(panel.row_spans, row_bins), col_spans=spans(panel.col_spans, col_bins),
                   masked=masked)


@functools.lru_cache(maxsize=64)
def _equal_runs(bins: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int, int], ...]:
    """Consecutive bins of one size as (start, count, size): each run is one reshape and one reduce."""
    runs: list[tuple[int, int, int]] = []
    for a, b in bins:
        if runs and runs[-1][2] == b - a:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1, b - a)
        else:
            runs.append((a, 1, b - a))
    return tuple(runs)


def _block_max(z: np.ndarray, bins: list[tuple[int, int]], axis: int) -> np.ndarray:
    """The max over each bin (consecutive [start, stop) covering the axis) of `axis`, ignoring NaN (masked
    cells) unless a whole bin is NaN (np.fmax). Each run of equal-sized bins is one reshape and one reduce
    over whole rows: ~7x faster than np.fmax.reduceat on a 1087 x 1087 panel."""
    z = np.moveaxis(z, axis, 0)
    parts = [np.fmax.reduce(z[a:a + n * size].reshape(n, size, *z.shape[1:]), axis=1)
             for a, n, size in _equal_runs(bins)]
    return np.moveaxis(np.concatenate(parts, axis=0), 0, axis)


def _memory(a: np.ndarray) -> tuple:
    """What an array reads: its first element's address, shape, strides and dtype. Two arrays alive at once
    (views of one mask cut alike by the panels of a grid) with one key hold the same values."""
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str


def _on_host(z) -> np.ndarray:
    return z.cpu().numpy() if isinstance(z, torch.Tensor) else z


_QUIET_NAN = 0x7FC00000        # float32 NaN as numpy's np.nan and torch's float("nan") write it
_NEGATIVE_ZERO = -2 ** 31      # float32 -0.0 read as an int32


def _pooled_on_device(z, row_bins, col_bins) -> Optional[np.ndarray]:
    """_block_max over rows then columns, run where a float32 tensor on a GPU lives, so the host gets the
    pooled cells only (a phoenix-prod grid: 8 layers x 10 heads x 1087^2 cells, ~380 MB, pools to ~1 MB).
    Bit for bit the host's result: the max of a block is unique once no cell is -0.0 (the host's max of
    +0 and -0 depends on the order it meets them) and every NaN is the quiet NaN (the host keeps the one
    it met); None where a panel breaks either, or is on the host already, and the host pools it."""
    if not isinstance(z, torch.Tensor) or z.device.type == "cpu" or z.dtype != torch.float32:
        return None
    return _pooled_exactly(z, row_bins, col_bins)


def _pooled_exactly(z: torch.Tensor, row_bins, col_bins) -> Optional[np.ndarray]:
    """_pooled_on_device's reduction on any device (tests run it on the CPU)."""
    bits, nan = z.view(torch.int32), torch.isnan(z)
    if bool(((bits == _NEGATIVE_ZERO) | (nan & (bits != _QUIET_NAN))).any()):
        return None
    value, empty = z.masked_fill(nan, -math.inf), nan
    for axis, bins in ((0, row_bins), (1, col_bins)):
        value, empty = value.movedim(axis, 0), empty.movedim(axis, 0)
        runs = _equal_runs(bins)
        value = torch.cat([value[a:a + n * k].unflatten(0, (n, k)).amax(1) for a, n, k in runs]).movedim(0, axis)
        empty = torch.cat([empty[a:a + n * k].unflatten(0, (n, k)).all(1) for a, n, k in runs]).movedim(0, axis)
    return value.masked_fill(empty, math.nan).cpu().numpy()


# what one figure's cells may weigh in JSON (base64 typed arrays): phoenix-nano's every-head grid stays
# under 1.5 MB and a mask view under 0.5 MB with the labels and layout added
MAX_BYTES = 1_200_000
MAX_BYTES_DISCRETE = 400_000


def pool_factor(shapes: list[tuple[int, int]], max_cells: int, max_bytes: int, bytes_per_cell: int) -> int:
    """The smallest block size that fits panels of these shapes, `bytes_per_cell` each, into `max_bytes`
    of base64 (4 characters per 3 bytes); blocks cut at segment changes add about a block per segment."""
    def size(f):
        return sum((math.ceil(r / f) + 4) * (math.ceil(c / f) + 4) for r, c in shapes) * bytes_per_cell * 4 / 3
    f = max([1] + [math.ceil(max(r, c) / max_cells) for r, c in shapes])
    while f < max([1] + [max(s) for s in shapes]) and size(f) > max_bytes:
        f += 1
    return f


def heatmap_figure(panels: Sequence[Panel | None], *, title: str, cols: int = 1, value_name: str = "value",
                   colorscale=SEQUENTIAL, zmin: Optional[float] = None, zmax: Optional[float] = None,
                   color: str = "linear", max_cells: int = 512, colorbar_title: str = "",
                   discrete: Optional[dict] = None, column_groups: Optional[list[str]] = None,
                   height: Optional[int] = None, row_title: str = "query", col_title: str = "key",
                   outline_row: Optional[int] = None, max_bytes: Optional[int] = None,
                   page_meta: Optional[dict] = None, shown_panel: Optional[int] = None,
                   cell_text: bool = False) -> go.Figure:
    """The one heatmap builder. `panels` fill a grid row by row (None leaves a narrow spacer column);
    `discrete` maps values to legend names (masks); `color` is one of COLOR_SCALES (log and
    quantile hover the raw value, and the colour bar says which scale it is);
    `column_groups` writes a group name over each run of equal names (GQA: the KV head);
    `outline_row` (a sequence position) is outlined in every panel whose rows hold it, around the row
    or pooled block that holds it. Panels with `row_spans` carry each row's first position in the
    trace's `meta.rows` and their own `meta` (layer, head) beside it, so a click on a cell picks the row,
    layer and head (static/page.js); `page_meta` joins the layout's meta for the page's own redraws
    (every meta key the page reads: explorer.page_contract). `shown_panel`: the panels are alternatives drawn in one place (a model's heads, layers and value
    kinds), that one shown and its colour scale fitted; the others travel hidden with their raw values and
    each its own look (`Panel.look`, as `meta.colour`), for the page to show one instead (static/page.js
    drawPanel). `cell_text`: each cell's value printed in it (weights to two places, logits to one) while a
    panel has at most MAX_TEXT_CELLS rows and columns and the colour is linear (a lecture's one head: its
    numbers on the slide).
    No per-cell strings in the hover: it reads the axis labels. Cells are
    pooled further when the figure would pass `max_bytes` (default MAX_BYTES; masks MAX_BYTES_DISCRETE,
    sent as uint8); log and quantile colours send each cell twice (colour and raw value), so they pool more.

    The figure is assembled as plain dicts and wrapped without plotly's per-property validation:
    on a 2-core machine that is the difference between ~20 ms and ~200 ms per redraw."""
    rows = math.ceil(len(panels) / cols)
    bytes_per_cell = 1 if discrete else 4 * (1 if color == "linear" else 2)
    bytes_per_cell += any(p is not None and p.masked is not None for p in panels)     # the masked pairs: a byte
    f = pool_factor([p.z.shape for p in panels if p is not None], max_cells,
                    max_bytes or (MAX_BYTES_DISCRETE if discrete else MAX_BYTES), bytes_per_cell)
    masks: dict = {}                # the panels' masked pairs, pooled once per distinct mask
    shown = [pool(p, max_cells, f, masks) if p is not None else None for p in panels]
    alternatives = shown_panel is not None
    if alternatives:
        rows = cols = 1
    scale = ColourScale.fit([shown[shown_panel]] if alternatives else shown, color, zmin, zmax)
    # panel titles of more than one line (a kernel's counts under its name) take a line's room each, above
    # every row: the figure grows by it and rows keep it between them
    extra = 20 * max([p.title.count("<br>") for p in panels if p is not None and p.title] or [0])
    fig_height = height or max(420, min(1100, 330 * rows + 120)) + extra * rows
    xdom, ydom = _grid_domains([panels[shown_panel]] if alternatives else panels, rows, cols,
                               extra / max(fig_height - 180, 100))
    data, annotations, shapes, layout = [], [], [], {}
    k, masked_drawn = 0, False
    drawn_panels = 1 if alternatives else sum(p is not None for p in shown)
    row_start = {}            # grid row -> the row labels of its first panel
    for i, p in enumerate(shown):
        if p is None:
            continue
        hidden = alternatives and i != shown_panel
        k += not hidden
        own = {**dict(title=title, value_name=value_name, colorscale=colorscale, zmin=zmin), **(p.look or {})}
        r, c = (0, 0) if alternatives else divmod(i, cols)
        # panels to the right repeat the first panel's row labels: ticking them again would print
        # them over the neighbouring panel's right edge
        repeat = row_start.setdefault(r, p.row_labels) == p.row_labels and c > 0
        ax = "" if alternatives or k == 1 else str(k)
        raw = p.z.astype(np.uint8) if discrete else p.z       # a mask's 0/1 (a tile map's 0..3): a byte each
        z = raw if hidden else scale.transform(raw)
        shown_value = FIGURE_TEXT["hover_customdata"] if z is not raw else FIGURE_TEXT["hover_raw"]
        if discrete:
            shown_value = "%{z} (" + ", ".join(f"{v:g} = {n}" for v, n in discrete.items()) + ")"
        hover = (f"{row_title} %{{y}}<br>{col_title} %{{x}}<br>{own['value_name']} {shown_value}"
                 + ("<br>(max over the block)" if p.pooled > 1 else "") + "<extra></extra>")
        meta = {"rows": [a for a, _ in p.row_spans], **(p.meta or {})} if p.row_spans else None
        if meta is not None and p.masked is not None:      # the page shows the masked pairs with this panel
            meta["masked"] = True
        if alternatives and meta is not None:           # what the page needs to show it (as layout meta.colour)
            meta["colour"] = dict(title=own["title"], bar=colorbar_title or own["value_name"], zmin=own["zmin"],
                                  zmax=zmax)
        # each value printed in its cell while the colour is the value itself (plotly prints z, not customdata:
        # under a log or quantile colour none); meta.text keeps the format for the page's own recolouring
        printed = cell_text and max(raw.shape) <= MAX_TEXT_CELLS
        fmt = ".2f" if own["value_name"] == "weight" else ".1f"
        meta_text = dict(texttemplate=fill(FIGURE_TEXT["cell_text"], format=fmt) if z is raw else "") if printed else {}
        if printed and meta is not None:
            meta["text"] = fmt
        data.append(dict(type="heatmap", z=z, x=p.col_labels, y=p.row_labels, meta=meta, **meta_text,
                         customdata=raw if z is not raw else None,
                         colorscale=own["colorscale"], zmin=scale.lo, zmax=scale.hi, hovertemplate=hover,
                         hoverongaps=False, showscale=(k == 1 or alternatives) and not discrete, xaxis=f"x{ax}",
                         yaxis=f"y{ax}", colorbar=scale.colorbar(colorbar_title or own["value_name"]),
                         **({"visible": False} if hidden else {})))
        if not hidden:
            overlay = _masked_overlay(shown, i, alternatives, f"x{ax}", f"y{ax}", crosses=drawn_panels <= 2,
                                      bytes_of=masks)
            data += overlay
            masked_drawn = masked_drawn or any(t.get("visible", True) for t in overlay)
        if hidden:                          # axes, titles, lines and the outline: the shown panel's
            continue
        layout[f"xaxis{ax}"] = dict(domain=xdom[c], anchor=f"y{ax}", type="category", tickangle=-60,
                                    tickfont=dict(size=11), showgrid=False,
                                    title=dict(text=col_title) if r == rows - 1 else None,
                                    **_sparse_ticks(p.col_labels, p.col_segments, cols))
        layout[f"yaxis{ax}"] = dict(domain=ydom[r], anchor=f"x{ax}", type="category", autorange="reversed",
                                    tickfont=dict(size=11), showgrid=False, showticklabels=not repeat,
                                    automargin=True,            # long row labels ("layer 0") stay inside
                                    title=dict(text=row_title) if c == 0 else None,
                                    **_sparse_ticks(p.row_labels, p.row_segments, cols))
        if p.title:
            annotations.append(dict(text=p.title, x=sum(xdom[c]) / 2, y=ydom[r][1], xref="paper", yref="paper",
                                    xanchor="center", yanchor="bottom", showarrow=False,
                                    font=dict(size=15 if cols <= 8 else 10)))    # narrow panels: small titles
        shapes += _segment_lines(p, f"x{ax}", f"y{ax}", "#222222" if discrete else "#FFFFFF")
        if outline_row is not None:
            shapes += _row_outline(p, outline_row, f"x{ax}", f"y{ax}")
        if p.tiles is not None:
            shapes += _tile_shapes(p, f"x{ax}", f"y{ax}")
    plot_px = fig_height - 180       # minus top + bottom margin
    # above the panel titles (~24 px a line) and any column-group labels, beside the left-aligned figure title
    legend = dict(orientation="h", y=1.0 + ((62 if column_groups else 30) + extra) / plot_px, yanchor="bottom", x=1,
                  xanchor="right")
    if masked_drawn or any(t.get("meta") and t["meta"].get("overlay") for t in data):
        data.append(dict(type="scatter", x=[None], y=[None], mode="markers", name=MASKED_NAME, showlegend=True,
                         meta=dict(overlay="masked"), legendgroup="masked", visible=masked_drawn, hoverinfo="skip",
                         marker=dict(size=14, symbol="square", color=MASKED_COLOUR, line=dict(color="#888", width=1))))
        layout["legend"] = legend
    if discrete:
        for value, name in discrete.items():
            colour = _step_colour(colorscale, (value - scale.lo) / ((scale.hi - scale.lo) or 1))
            data.append(dict(type="scatter", x=[None], y=[None], mode="markers", name=name, showlegend=True,
                             marker=dict(size=14, symbol="square", color=colour, line=dict(color="#888", width=1))))
        layout["legend"] = legend
    if column_groups:
        _group_labels(annotations, shapes, column_groups, xdom)
    if not discrete:        # what the page needs to recolour the figure itself (static/page.js recolour)
        layout["meta"] = dict(colour=dict(title=title, bar=colorbar_title or value_name, zmin=zmin, zmax=zmax),
                              **(page_meta or {}))
    if scale.note() and not discrete:
        title += f"<br><sup>{scale.note()}</sup>"
    layout.update(annotations=annotations, shapes=shapes, showlegend="legend" in layout, hovermode="closest",
                  **_theme_layout(title, fig_height))
    if "legend" in layout and (column_groups or extra):     # a legend raised over the group labels or the panel
        layout["margin"] = {**layout["margin"], "t": layout["margin"]["t"] + 24 * bool(column_groups) + extra}
    return Figure(dict(data=data, layout=layout), _validate=False)


MAX_TEXT_CELLS = 16         # per axis: up to this many, heatmap_figure(cell_text=True) prints each value
def _masked_overlay(shown: list, i: int, alternatives: bool, xref: str, yref: str, crosses: bool,
                    bytes_of: dict) -> list[dict]:
    """The pairs the mask hides, in the masked colour over panel `i` (`crosses`: a × in each while the panel
    is small): [] where no panel says. Among alternatives one overlay serves them all (they share the mask),
    shown with the panels that carry the mask (static/page.js drawPanel shows and hides it with them).
    `bytes_of`: each mask's bytes, made once however many panels share it."""
    p = shown[i]
    source = p if p.masked is not None else next(
        (q for q in shown if alternatives and q is not None and q.masked is not None), None)
    if source is None:
        return []
    key = ("bytes", _memory(source.masked))
    if key not in bytes_of:
        bytes_of[key] = source.masked.astype(np.uint8) if source.masked.any() else None
    m = bytes_of[key]
    if m is None:
        return []
    clear = "rgba(0,0,0,0)"
    small = crosses and max(m.shape) <= MAX_MARKED_CELLS
    return [dict(type="heatmap", z=m, x=source.col_labels, y=source.row_labels, xaxis=xref, yaxis=yref,
                 colorscale=[[0, clear], [0.5, clear], [0.5, MASKED_COLOUR], [1, MASKED_COLOUR]], zmin=0, zmax=1,
                 showscale=False, hoverinfo="skip", meta=dict(overlay="masked"), legendgroup="masked",
                 **(dict(text=np.where(source.masked, "×", "").tolist(), texttemplate="%{text}",
                         textfont=dict(color="#555555", size=14)) if small else {}),
                 **({} if p.masked is not None else {"visible": False}))]


def _edge(spans: list[tuple[int, int]], position: int) -> Optional[float]:
    """The category-axis coordinate of the edge before sequence position `position` among cells holding
    `spans` (a pooled cell: its share of the way through), or None outside them."""
    for i, (a, b) in enumerate(spans):
        if a <= position < b:
            return i - 0.5 + (position - a) / (b - a)
    return len(spans) - 0.5 if spans and position == spans[-1][1] else None


MAX_TILE_EDGES = 64         # per axis: more tile edges than this would hide the cells under them


def _tile_shapes(p: Panel, xref: str, yref: str) -> list[dict]:
    """The panel's tile grid (a line at every tile edge inside it) and a cross over each skipped tile, as
    two paths (one shape each, whatever the number of tiles)."""
    g, rows, cols = p.tiles, p.row_spans, p.col_spans
    if not rows or not cols:
        return []
    (r0, r1), (c0, c1) = (rows[0][0], rows[-1][1]), (cols[0][0], cols[-1][1])
    x_lo, x_hi, y_lo, y_hi = -0.5, len(cols) - 0.5, -0.5, len(rows) - 0.5
    row_edges = range((r0 // g.block_q + 1) * g.block_q, r1, g.block_q)
    col_edges = range((c0 // g.block_kv + 1) * g.block_kv, c1, g.block_kv)
    shapes = []
    if len(row_edges) <= MAX_TILE_EDGES and len(col_edges) <= MAX_TILE_EDGES:
        grid = [f"M{x_lo},{y:.3f}L{x_hi},{y:.3f}" for y in (_edge(rows, e) for e in row_edges)] + \
               [f"M{x:.3f},{y_lo}L{x:.3f},{y_hi}" for x in (_edge(cols, e) for e in col_edges)]
        if grid:
            shapes.append(dict(type="path", path="".join(grid), xref=xref, yref=yref, layer="above",
                               line=dict(color="#333333", width=1)))
    crosses = []
    for ti, tj in g.skipped:
        a, b = max(ti * g.block_q, r0), min((ti + 1) * g.block_q, r1)
        c, d = max(tj * g.block_kv, c0), min((tj + 1) * g.block_kv, c1)
        if a >= b or c >= d:
            continue
        y0, y1, x0, x1 = _edge(rows, a), _edge(rows, b), _edge(cols, c), _edge(cols, d)
        crosses.append(f"M{x0:.3f},{y0:.3f}L{x1:.3f},{y1:.3f}M{x0:.3f},{y1:.3f}L{x1:.3f},{y0:.3f}")
    if crosses:
        shapes.append(dict(type="path", path="".join(crosses), xref=xref, yref=yref, layer="above",
                           line=dict(color="#333333", width=1.5)))
    return shapes


def _step_colour(colorscale, frac: float) -> str:
    """The colour a stepped scale ([[position, colour], ...]) gives a value at `frac` of its range."""
    return [c for pos, c in colorscale if pos <= frac + 1e-9][-1]


def _sparse_ticks(labels: list[str], segments: Optional[list[str]], cols: int) -> dict:
    """Short axes (up to 24 tokens, or 48 in one panel): every token, even in a grid of many panels
    (plotly's automatic ticks would skip some). Long axes: tick where each segment starts (U, H0, C0,
    ...) and every `step` positions inside long segments, never two ticks close enough to print over
    each other."""
    n = len(labels)
    if n <= max(24, 48 // cols):
        return dict(tickmode="array", tickvals=list(labels), ticktext=[t.split("–")[0] for t in labels])
    target = max(2, 10 // cols)                                  # ticks per axis that stay legible
    step = next(m * 10 ** e for e in range(7) for m in (1, 2, 5) if m * 10 ** e * target >= n)
    chosen: list[int] = []
    for i in [0] + (boundaries(segments) if segments else []) + list(range(0, n, step)):
        if all(abs(i - j) >= step / 2 for j in chosen):
            chosen.append(i)
    chosen.sort()
    return dict(tickmode="array", tickvals=[labels[i] for i in chosen],
                ticktext=[labels[i].split("–")[0] for i in chosen])


SEGMENT_NAMES = {"U": "user", "H": "history", "C": "candidate", "P": "padding"}


@dataclass
class ColourScale:
    """How values become colours, and a colour bar that says so.

    linear: as is. log: log10 of positive values; with negative values a symmetric log,
    sign(x) · log10(1 + |x| / c), linear within ±c, so a negative logit keeps its side of a diverging
    scale. quantile: the value's rank among the finite values (0..1), so a few large weights cannot
    leave every other cell at the bottom colour; the bar's ticks give the values at those quantiles."""
    kind: str
    lo: float
    hi: float
    threshold: float = 0.0                       # symmetric log: linear within ±threshold
    sorted_values: Optional[np.ndarray] = None   # quantile: every finite value, sorted

    @classmethod
    def fit(cls, shown, kind: str, zmin=None, zmax=None) -> "ColourScale":
        finite = [p.z[np.isfinite(p.z)].ravel() for p in shown if p is not None]
        finite = np.concatenate(finite).astype(np.float64) if finite else np.zeros(0)
        if not finite.size:
            finite = np.zeros(1)
        if kind == "quantile":
            return cls(kind, 0.0, 1.0, sorted_values=np.sort(finite))
        if kind == "log" and finite.min() < 0:
            big = float(np.abs(finite).max()) or 1.0
            nonzero = np.abs(finite[finite != 0])
            c = max(float(np.quantile(nonzero, 0.05)) if nonzero.size else big, big * 1e-6)
            top = math.log10(1 + big / c)
            return cls("symlog", -top, top, threshold=c)
        if kind == "log":
            positive = finite[finite > 0]
            floor = max(float(positive.min()) if positive.size else 1e-12, 1e-12)
            return cls(kind, math.log10(floor), math.log10(max(float(finite.max()), floor * 10)))
        lo = float(zmin) if zmin is not None else float(finite.min())
        hi = float(zmax) if zmax is not None else float(finite.max())
        return cls("linear", lo, hi if hi > lo else lo + 1.0)

    def transform(self, raw: np.ndarray) -> np.ndarray:
        """Values -> colour coordinates; `raw` itself when linear (NaN stays NaN: a gap)."""
        if self.kind == "linear":
            return raw
        with np.errstate(invalid="ignore"):
            if self.kind == "log":
                return np.log10(np.clip(raw, 10 ** self.lo, None))
            if self.kind == "symlog":
                return np.sign(raw) * np.log10(1 + np.abs(raw) / self.threshold)
            v = self.sorted_values         # the share of cells below: the smallest value (0) stays at the bottom
            rank = np.searchsorted(v, raw, "left") / max(len(v) - 1, 1)
            return np.where(np.isfinite(raw), rank, np.nan).clip(0, 1).astype(np.float32)   # 4 bytes a cell

    def colorbar(self, title: str) -> dict:
        bar = dict(title=dict(text=title, side="right"), thickness=16)
        if self.kind == "log":
            ticks = list(range(math.floor(self.lo), math.ceil(self.hi) + 1))
            bar.update(tickvals=ticks, ticktext=[f"1e{t}" for t in ticks])
            bar["title"]["text"] = f"{title} (log)"
        elif self.kind == "symlog":
            c, top = self.threshold, 10 ** self.hi
            mags = [10.0 ** e for e in range(math.ceil(math.log10(c)), math.floor(math.log10(top * (1 - 1e-9))) + 1)]
            mags = mags[-4:]                        # the largest decades stay legible
            values = [-m for m in reversed(mags)] + [0.0] + mags
            bar.update(tickvals=[float(np.sign(v) * math.log10(1 + abs(v) / c)) for v in values],
                       ticktext=[f"{v:g}" for v in values])
            bar["title"]["text"] = f"{title} (symmetric log)"
        elif self.kind == "quantile":
            values = sorted({float(f"{np.quantile(self.sorted_values, q):.3g}")
                             for q in (0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)})
            ticks: list[tuple[float, float]] = []            # (position, value), never printed over each other
            for v in [values[0], values[-1], *values[1:-1]]:
                pos = float(self.transform(np.array([v]))[0])
                if all(abs(pos - p) >= 0.07 for p, _ in ticks):
                    ticks.append((pos, v))
            bar.update(tickvals=[p for p, _ in ticks], ticktext=[f"{v:.3g}" for _, v in ticks])
            bar["title"]["text"] = f"{title} (quantile)"
        return bar

    def note(self) -> str:
        """One line under the figure title saying how to read the colours."""
        return {"log": "colour: log10 of the value",
                "symlog": f"colour: symmetric log, sign(x)·log10(1 + |x|/{self.threshold:.2g}) — negative values "
                          f"keep their side, linear within ±{self.threshold:.2g}",
                "quantile": "colour: quantile — the share of cells with a smaller value (shows structure when "
                            "a few cells hold most weight); the bar's ticks give the values"}.get(self.kind, "")


def _grid_domains(panels, rows: int, cols: int, title_room: float = 0.0):
    """Paper-coordinate domains per column and row; all-None columns are narrow spacers. `title_room`: the
    extra gap between rows (a share of the plot's height) for panel titles of more than one line."""
    spacer = [all(panels[r * cols + c] is None for r in range(rows) if r * cols + c < len(panels))
              for c in range(cols)]
    widths = [0.15 if s else 1.0 for s in spacer]
    # gaps shrink with the count so they never take more than a quarter of the width (a fifth of the
    # height): fixed gaps would push the domains of a 60-panel grid below zero
    hgap = min(0.04, 0.92 * 0.25 / (cols - 1)) if cols > 1 else 0.0
    avail = 0.92 - hgap * (cols - 1)          # the right 8% holds the colour bar
    xdom, x = [], 0.0
    for w in widths:
        span = avail * w / sum(widths)
        xdom.append([x, x + span])
        x += span + hgap
    vgap = min(0.16, 0.2 / (rows - 1)) + title_room if rows > 1 else 0.0     # + room for taller panel titles
    h = (1.0 - vgap * (rows - 1)) / rows
    # clipped: rounding left the bottom row at -5e-17 for three rows, which plotly refuses
    ydom = [[max(0.0, 1.0 - (r + 1) * h - r * vgap), 1.0 - r * (h + vgap)] for r in range(rows)]
    xdom = [[x0, min(0.92, x1)] for x0, x1 in xdom]
    return xdom, ydom


def _theme_layout(title: str, height: int) -> dict:
    # the title near the top of the figure (no label badge over it: the page shows none): legends and column
    # labels sit just above the plot, under it
    return dict(template=TEMPLATE,
                title=dict(text=title, x=0.01, xanchor="left", yref="container", y=1, yanchor="top", pad=dict(t=16),
                           font=dict(size=FONT["size"] + 4)), font=FONT,
                height=height, paper_bgcolor="white", plot_bgcolor="white", colorway=OKABE_ITO,
                margin=dict(l=70, r=30, t=110, b=70))


def _segment_lines(p: Panel, xref: str, yref: str, colour: str) -> list[dict]:
    """Dashed lines between user | history | candidates, in category-index coordinates.
    Returned as plain dicts and set once: plotly's add_shape re-validates every shape per call."""
    style = dict(color=colour, width=1.5, dash="dash")
    shapes = []
    if p.col_segments:
        shapes += [dict(type="line", x0=b - 0.5, x1=b - 0.5, y0=-0.5, y1=len(p.row_labels) - 0.5,
                        xref=xref, yref=yref, line=style) for b in boundaries(p.col_segments)]
    if p.row_segments:
        shapes += [dict(type="line", y0=b - 0.5, y1=b - 0.5, x0=-0.5, x1=len(p.col_labels) - 0.5,
                        xref=xref, yref=yref, line=style) for b in boundaries(p.row_segments)]
    return shapes


def _row_outline(p: Panel, position: int, xref: str, yref: str) -> list[dict]:
    """A rectangle around the row (or pooled block) holding `position`: white under black, so it shows
    on the dark and the light end of every colour scale. [] when no row of the panel holds it."""
    i = row_of(p, position)
    if i is None:
        return []
    box = dict(type="rect", x0=-0.5, x1=len(p.col_labels) - 0.5, y0=i - 0.5, y1=i + 0.5, xref=xref, yref=yref,
               fillcolor="rgba(0,0,0,0)", layer="above", name="query-outline")     # static/page.js moves it
    return [{**box, "line": dict(color="#FFFFFF", width=5)}, {**box, "line": dict(color="#000000", width=2)}]


def _group_labels(annotations: list, shapes: list, groups: list[str], xdom: list) -> None:
    """One label and a rule over each run of columns with the same group name (e.g. 'KV head 0')."""
    start = 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or groups[i] != groups[start]:
            if groups[start]:
                x0, x1 = xdom[start][0], xdom[i - 1][1]
                annotations.append(dict(x=(x0 + x1) / 2, y=1.0, yshift=30, xref="paper", yref="paper",
                                        text=f"<b>{groups[start]}</b>", showarrow=False, yanchor="bottom",
                                        font=dict(size=15)))
                shapes.append(dict(type="line", x0=x0, x1=x1, y0=26, y1=26, xref="paper", yref="paper",
                                   ysizemode="pixel", yanchor=1.0, line=dict(color="#444", width=2)))
            start = i


# --- bars and lines ----------------------------------------------------------------------

def _figure(data: list[dict], title: str, height: int, **layout) -> go.Figure:
    """Plain dicts in, a plotly Figure out, without per-property validation (see heatmap_figure)."""
    axis = dict(gridcolor="#E5E5E5", zerolinecolor="#BBBBBB", linecolor="#444", automargin=True)
    layout["xaxis"] = {**axis, **layout.get("xaxis", {})}
    layout["yaxis"] = {**axis, **layout.get("yaxis", {})}
    layout.setdefault("legend", dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"))
    return Figure(dict(data=data, layout={**_theme_layout(title, height), **layout}), _validate=False)


def bar_figure(labels: Sequence[str], values: Sequence[float], *, title: str, value_name: str = "value",
               segments: Optional[Sequence[str]] = None, log: bool = False, height: int = 380,
               text: bool = True) -> go.Figure:
    """Bars coloured by segment (user / history / candidate / pad) with the exact value on hover."""
    values = [float(v) for v in values]
    colours = [SEGMENT_COLORS.get(s, OKABE_ITO[0]) for s in segments] if segments else OKABE_ITO[0]
    data = [dict(type="bar", x=list(labels), y=values, marker=dict(color=colours), showlegend=False,
                 text=[f"{v:.3g}" for v in values] if text and len(values) <= 40 else None,
                 textposition="outside", cliponaxis=False,
                 hovertemplate="%{x}<br>" + value_name + " %{y:.8g}<extra></extra>")]
    data += segment_legend(segments)
    return _figure(data, title, height, barmode="overlay", showlegend=bool(segments),
                   xaxis=dict(type="category", tickangle=-60,
                              **_sparse_ticks(list(labels), list(segments) if segments else None, 1)),
                   yaxis=dict(title=dict(text=value_name), type="log" if log else "linear"))


def segment_legend(segments: Optional[Sequence[str]], **trace) -> list[dict]:
    """Legend entries (empty bar traces) for the segment colours that occur in `segments`."""
    return [dict(type="bar", x=[None], y=[None], marker=dict(color=SEGMENT_COLORS[seg]), name=name, **trace)
            for seg, name in (("U", "user"), ("H", "history"), ("C", "candidate"), ("P", "pad"))
            if segments and seg in segments]


def stacked_bars_figure(labels: Sequence[str], steps: Sequence[tuple[str, Sequence[float]]], *, title: str,
                        segments: Optional[Sequence[str]] = None, height_per_step: int = 150,
                        gap_text: str = "") -> go.Figure:
    """Several bar panels over the same keys (one per step of a computation), each titled, the keys labelled
    under the last, exact values on hover and, for short axes, printed on the bars; the segment colours in
    a legend. NaN draws no bar (a masked key), and `gap_text` (e.g. −∞) where it would stand."""
    n = len(steps)
    colours = [SEGMENT_COLORS.get(seg, OKABE_ITO[0]) for seg in segments] if segments else OKABE_ITO[0]
    gap = 0.2 / n                                 # room for the next panel's title
    h = (1.0 - gap * (n - 1)) / n
    data, layout, annotations = [], {}, []
    for k, (name, values) in enumerate(steps):
        ax = "" if k == 0 else str(k + 1)
        values = [float(v) for v in values]
        data.append(dict(type="bar", x=list(labels), y=values, marker=dict(color=colours), showlegend=False,
                         xaxis=f"x{ax}", yaxis=f"y{ax}", cliponaxis=False, textposition="outside",
                         text=[("" if math.isnan(v) else f"{v:.3g}") for v in values] if len(values) <= 24 else None,
                         hovertemplate="key %{x}<br>" + name.split("<")[0] + " %{y:.8g}<extra></extra>"))
        top = 1.0 - k * (h + gap)
        finite = [v for v in values if math.isfinite(v)] or [0.0]
        lo, hi = min(0.0, *finite), max(0.0, *finite)
        pad = 0.3 * ((hi - lo) or 1.0)            # room for the printed values inside the panel
        layout[f"yaxis{ax}"] = dict(domain=[top - h, top], anchor=f"x{ax}", gridcolor="#E5E5E5",
                                    zerolinecolor="#888", automargin=True,
                                    range=[lo - (pad if lo < 0 else 0), hi + pad])
        layout[f"xaxis{ax}"] = dict(anchor=f"y{ax}", type="category", tickangle=-60, showticklabels=k == n - 1,
                                    **({"matches": "x"} if k else {}), tickfont=dict(size=11),
                                    **_sparse_ticks(list(labels), list(segments) if segments else None, 1))
        annotations.append(dict(text=name, x=0, y=top, xref="paper", yref="paper", xanchor="left",
                                yanchor="bottom", showarrow=False, font=dict(size=14)))
        if gap_text and len(values) <= 24:
            annotations += [dict(text=gap_text, x=label, y=0, xref=f"x{ax}", yref=f"y{ax}", yanchor="bottom",
                                 showarrow=False, font=dict(size=14, color="#B34700"))
                            for label, v in zip(labels, values) if math.isnan(v)]
    data += segment_legend(segments, xaxis="x", yaxis="y")
    return _figure(data, title, 140 + height_per_step * n, annotations=annotations, showlegend=bool(segments),
                   barmode="overlay", **layout)


def grouped_bar_figure(categories: Sequence[str], series: dict[str, Sequence[float]], *, title: str,
                       value_name: str, height: int = 420, text: bool = False) -> go.Figure:
    """Bars of each series side by side per category; `text`: each bar's value printed over it (a 0 too)."""
    data = [dict(type="bar", x=list(categories), y=[float(v) for v in values], name=name,
                 marker=dict(color=OKABE_ITO[i % len(OKABE_ITO)]),
                 **(dict(text=[f"{float(v):.3g}" for v in values], textposition="outside", cliponaxis=False)
                    if text else {}),
                 hovertemplate="%{x}<br>" + name + " %{y:.8g}<extra></extra>")
            for i, (name, values) in enumerate(series.items())]
    return _figure(data, title, height, barmode="group", xaxis=dict(type="category"),
                   yaxis=dict(title=dict(text=value_name)))


# one look per series, no two alike: a colour (Okabe-Ito without its yellow, faint on white), a dash and a
# marker symbol; hues that a projector shows alike (orange and vermillion, blue and sky blue) never share a dash
LINE_LOOKS = (("#0072B2", "solid", "circle"), ("#E69F00", "solid", "square"), ("#009E73", "solid", "diamond"),
              ("#CC79A7", "solid", "triangle-up"), ("#000000", "solid", "x"), ("#56B4E9", "dash", "circle-open"),
              ("#D55E00", "dash", "square-open"), ("#0072B2", "dot", "diamond-open"),
              ("#009E73", "dash", "triangle-down"), ("#000000", "dot", "cross"), ("#CC79A7", "dash", "star"),
              ("#E69F00", "dot", "hexagon-open"))
SPARSE_MARKERS = 12         # markers per series where there are not one per point: enough to tell them apart


def line_figure(series: dict[str, tuple[Sequence[float], Sequence[float]]], *, title: str, x_title: str,
                y_title: str, log_x: bool = False, log_y: bool = False, height: int = 420,
                markers: bool = True) -> go.Figure:
    """A line per series, each its own look (LINE_LOOKS): a marker at every point (`markers`), else, among
    several series, a few markers along each line."""
    sparse = not markers and len(series) > 1
    data = [dict(type="scatter", x=[float(v) for v in x], y=[float(v) for v in y], name=name,
                 mode="lines+markers" if markers or sparse else "lines",
                 line=dict(color=colour, dash=dash),
                 marker=dict(symbol=symbol, size=9, color=colour, **({"maxdisplayed": SPARSE_MARKERS} if sparse else {})),
                 hovertemplate=f"{name}<br>{x_title} %{{x}}<br>{y_title} %{{y:.6g}}<extra></extra>")
            for (name, (x, y)), (colour, dash, symbol) in zip(series.items(), itertools.cycle(LINE_LOOKS))]
    xs = [float(v) for _, (x, _) in series.items() for v in x]
    ys = [float(v) for _, (_, y) in series.items() for v in y]
    return _figure(data, title, height,
                   xaxis=dict(title=dict(text=x_title), **(_log_ticks(xs, measured=True) if log_x else {})),
                   yaxis=dict(title=dict(text=y_title), **(_log_ticks(ys) if log_y else {})))


def _log_ticks(values: list[float], measured: bool = False) -> dict:
    """A log axis labelled in plain numbers: plotly's default writes '2' and '5' for 20 and 0.5 alike.
    `measured`: tick exactly the values measured (a few sequence lengths); else 1-2-5 steps."""
    finite = sorted({v for v in values if math.isfinite(v) and v > 0})
    if not finite:
        return dict(type="log")
    if measured and len(finite) <= 12:
        ticks = finite
    else:
        lo, hi = math.floor(math.log10(finite[0])), math.ceil(math.log10(finite[-1]))
        steps = [(1, 2, 5), (1,)][hi - lo > 4]         # wide ranges: powers of ten only
        ticks = [m * 10.0 ** e for e in range(lo, hi + 1) for m in steps
                 if finite[0] / 1.5 <= m * 10.0 ** e <= finite[-1] * 1.5]
    return dict(type="log", tickmode="array", tickvals=ticks, ticktext=[f"{v:g}" for v in ticks])
