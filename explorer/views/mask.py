"""The Mask tab: who may attend to whom over the layout (the model's own mask beside another kind, and
the pairs and tiles a mask-aware kernel skips), and the tiles production's attention kernels run over it
(models.masks.KERNEL_TILINGS: full, masked or skipped, and any pair computed that the mask hides). Its
functions, its cost, its exports' captions and its record. Needs no model.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import torch

from models.masks import EMPTY, FULL, KERNEL_TILINGS, MASK_KINDS, AttentionMask, kernel_work, ranker_bounds
from models.presets import PRESETS

from .. import budget
from ..figures import MASK_SCALE, TILE_SCALE, TileGrid, heatmap_figure
from ..limits import Cost
from ..schema import Control, Settings
from ..families import preset_settings
from .panels import SINGLE_MAX_CELLS, cells, layout_mask, layout_panel, zoom_note
from .records import Export, Part, Plot, Text, View, caption_layout

# the tab's own control: the mask kind drawn beside the model's own
COMPARE = Control("compare", "causal", "compare with", choices=tuple(MASK_KINDS), menu=True)

# the mask table's tile column: production's H100 serving tiles (64 query rows x 128 keys)
BLOCK_Q, BLOCK_KV = KERNEL_TILINGS["h100-serve"].block_q, KERNEL_TILINGS["h100-serve"].block_kv


def mask_stats(mask: AttentionMask) -> dict:
    """Allowed pairs, and the work a mask-aware kernel skips: per element, and per (64 x 128) tile
    (the tile map FlashAttention-4's block-sparse tensors are built from)."""
    T = mask.seq_len
    allowed = int(mask.dense().sum())
    tiles = mask.tiles(BLOCK_Q, BLOCK_KV).counts()
    total_tiles = sum(tiles.values())
    return dict(allowed=allowed, total=T * T, skip_elements=1 - allowed / (T * T),
                tiles=total_tiles, skip_tiles=tiles["empty"] / total_tiles)


# --- 1. mask -------------------------------------------------------------------------------

def mask_view(s: Settings) -> tuple[go.Figure, str]:
    kinds = [s.mask_kind, COMPARE.of(s)]
    masks = [layout_mask(s, k) for k in kinds]
    stats = [mask_stats(m) for m in masks]
    panels = [layout_panel(s, m.dense()[0, 0].numpy().astype(float),
                           f"{k}: {st['skip_elements']:.1%} of the pairs masked")
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
    panels = [layout_panel(s, element, f"element mask: {s.mask_kind}<br>{masked_share:.1%} of the pairs masked")]
    rows = ["| kernel | tile | tiles run | skipped | work skipped (tiles · elements) | pairs computed that the "
            "mask hides |", "|---|---|---|---|---|---|"]
    grids = _kernel_grids(s.mask_kind, s.layout)
    for name in KERNEL_ORDER:
        (grid, w, tiles), k = grids[name], KERNEL_TILINGS[name]
        panels.append(layout_panel(s, grid, f"{k.title}<br>{tile_counts(w)}", tiles=tiles))
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
    layouts = sorted((preset_settings(name) for name in PRESETS),
                     key=lambda p: p.seq_len)
    for p in layouts:
        mask = AttentionMask(mask_kind, p.seq_len, p.candidate_start_offset, p.layout.valid()[None])
        counts = {name: k.tiles(mask).counts() for name, k in KERNEL_TILINGS.items()}     # tiles only: cheap
        if any(c["empty"] for c in counts.values()):
            return p.preset, p.seq_len, ", ".join(f"{name} skips {c['empty']} of {sum(c.values())} tiles"
                                                  for name, c in counts.items())
    return None


def _mask_cost(s: Settings) -> Cost:
    """Two [T, T] masks, bool and float, and the kernels' tile maps; building them is ~500 operations a
    cell (T 2048: ~1 s)."""
    return Cost(flops=500.0 * s.seq_len ** 2, peak_bytes=2 * 9 * s.seq_len ** 2)


def _skipped_here(s: Settings) -> str:
    """Where the kernels' skipped tiles are in a caption, or that there are none at this size."""
    skipped = {name: w["empty"] for name, (_, w, _) in _kernel_grids(s.mask_kind, s.layout).items()}
    if not any(skipped.values()):
        return f"; at T = {s.seq_len} no kernel skips a tile (the layout fits in a few tiles)"
    return ", with each skipped tile crossed (" + ", ".join(f"{n} skips {k}" for n, k in skipped.items()) + ")"


EXPORT_MASK = Export("mask", lambda s, f, chosen: (
    f"Who may attend to whom over {caption_layout(s)}: rows are queries, columns keys; blue cells may attend. "
    f"Left the model's own mask '{s.mask_kind}', right '{COMPARE.of(s)}' for comparison; dashed lines separate user, "
    "history and candidates."))
EXPORT_KERNELS = (
    Export("kernels", lambda s, f, chosen: (
        f"The work production's attention kernels do over this layout (T = {s.seq_len}): tiles run in full, run "
        "with a mask, skipped, and pairs computed that the mask hides.")),
    Export("kernels_candidates", lambda s, f, chosen: (
        f"The same kernel tiles, {f.get('zoom')}: the last history positions and the {s.num_candidates} "
        f"candidates at full resolution{_skipped_here(s)}."),
        facts=lambda s: dict(zoom="zoom: history tail"),                    # zoom_note's words
        adjust=lambda s: replace(s, zoom="history tail"), title="kernel tiles, history tail at full resolution"))


VIEW = View(
    "mask", "1 · Mask",
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
    cost=_mask_cost, controls=(COMPARE,), needs_model=False)
