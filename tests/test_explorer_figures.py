"""Heatmaps readable at any size: colour scales that keep the sign and show structure, pooling that
never mixes segments, zoomed regions at full resolution, every token ticked on short axes."""
import numpy as np
import pytest

from explorer import runs, views
from explorer.figures import Panel, heatmap_figure, pool, segment_bins
from explorer.limits import max_seq_len
from explorer.query_string import parse_query
from tolerances import assert_bit_exact, relative_error, rounding_bound

NANO = "preset=phoenix-nano"          # T = 1 + 1022 + 64 = 1087: pooled on screen
SEGMENT_OF = {"U": "U", "H": "H", "C": "C", "p": "P"}      # a label's first letter ("pad·H3" -> P)


def heatmaps(fig):
    """The value heatmaps shown (a one-head view carries others hidden, for the page; the masked pairs are
    drawn over them)."""
    return [t for t in fig.data if t.type == "heatmap" and t.visible is not False
            and not (t.meta and t.meta.get("overlay"))]


def segment(label: str) -> str:
    return SEGMENT_OF[label[0]]


def test_log_colour_keeps_the_sign_of_logits():
    s = parse_query("preset=lecture&head=2&values=capped+logits&color=log")
    fig, _, _ = views.attention_view(s)
    (hm,) = heatmaps(fig)
    raw, z = np.asarray(hm.customdata, dtype=float), np.asarray(hm.z, dtype=float)
    assert_bit_exact(raw, runs.forward(s).trunk.layers[0].logits[0, 2].numpy(), "same computation")
    assert (raw < 0).any() and (raw > 0).any()
    assert_bit_exact(np.sign(z), np.sign(raw), "no rounding")       # negative logits stay negative
    order = np.argsort(raw.ravel())
    assert np.all(np.diff(z.ravel()[order]) >= 0)                      # and the order is kept
    assert hm.zmin == -hm.zmax                                         # 0 sits at the scale's centre
    assert "symmetric log" in hm.colorbar.title.text and "symmetric log" in fig.layout.title.text


def test_quantile_colour_spreads_a_skewed_map_and_says_so():
    rng = np.random.default_rng(0)
    z = rng.random((40, 40)) ** 8                      # most cells near 0, a few near 1
    fig = heatmap_figure([Panel(z, [f"t{i}" for i in range(40)], [f"t{i}" for i in range(40)])],
                         title="t", color="quantile")
    (hm,) = heatmaps(fig)
    shown = np.asarray(hm.z, dtype=float)
    assert np.median(z) < 0.01 and 0.45 < np.median(shown) < 0.55      # linear would be at the bottom
    assert_bit_exact(np.asarray(hm.customdata), z, "no rounding")       # hover: the raw value
    assert "quantile" in hm.colorbar.title.text
    assert f"{np.quantile(z, 0.5):.3g}" in list(hm.colorbar.ticktext) and "quantile" in fig.layout.title.text


def test_pooled_bins_never_straddle_a_segment_boundary():
    s = parse_query(NANO + "&history_padding=6&candidate_padding=4")
    fig, _ = views.mask_view(s)
    hm = heatmaps(fig)[0]
    labels = list(hm.x)
    assert len(labels) < s.seq_len                      # pooled
    for label in labels:
        first, _, last = label.partition("–")
        assert segment(first) == segment(last or first), label
    # the boundary is named by the bin that starts it
    assert "C0" in [t for t in fig.layout.xaxis.ticktext]
    starts = [label.partition("–")[0] for label in labels]
    assert "C0" in starts and "pad·H1016" in starts and "pad·C60" in starts


def test_segment_bins_cut_each_run_on_its_own():
    assert segment_bins(list("UHHHHHCC"), 8, 3) == [(0, 1), (1, 4), (4, 6), (6, 8)]
    p = pool(Panel(np.arange(64.0).reshape(8, 8), list("abcdefgh"), list("abcdefgh"), "",
                   list("UHHHHHCC"), list("UHHHHHCC")), 3)
    assert p.col_labels == ["a", "b–d", "e–f", "g–h"] and p.z[1, 1] == 8 * 3 + 3


@pytest.mark.parametrize("zoom, rows, cols", [("candidates", (1023, 1087), (1023, 1087)),
                                              ("history tail", (1023 - 32, 1087), (1023 - 32, 1087)),
                                              ("query row", (1023, 1024), (0, 1087))])
def test_zoom_shows_a_region_at_full_resolution(zoom, rows, cols):
    s = parse_query(NANO + "&zoom=" + zoom.replace(" ", "+"))
    fig, _ = views.mask_view(s)
    hm = heatmaps(fig)[0]
    full = views.mask_dense(s, s.mask_kind)
    assert_bit_exact(np.asarray(hm.z, dtype=float), full[rows[0]:rows[1], cols[0]:cols[1]], "no rounding")
    labels = s.layout.token_labels()
    assert list(hm.y) == labels[rows[0]:rows[1]] and list(hm.x) == labels[cols[0]:cols[1]]
    assert "zoom: " + zoom in fig.layout.title.text


def test_short_axes_tick_every_token_even_in_a_grid():
    s = parse_query("preset=lecture&weights=random&num_history=14")          # T = 18
    assert s.seq_len == 18
    fig, _, _ = views.attention_view(s)                                        # 5 panel columns
    for axis in ("xaxis", "xaxis3", "yaxis"):
        assert list(fig.layout[axis].tickvals) == s.layout.token_labels()


def test_hover_names_query_key_and_value_from_the_axes_without_a_string_per_cell():
    s = parse_query("preset=lecture&head=0")
    fig, _, _ = views.attention_view(s)
    hm = next(t for t in heatmaps(fig) if t.visible is not False)      # the head shown
    assert "query %{y}" in hm.hovertemplate and "key %{x}" in hm.hovertemplate and "weight" in hm.hovertemplate
    assert "%{text}" not in hm.hovertemplate
    # the labels the hover reads carry the segment
    assert [segment(t) for t in hm.x] == s.layout.segments()
    grid, _, _ = views.attention_view(parse_query("preset=lecture&head=-1"))
    assert all(t.text is None for t in grid.data if t.type == "heatmap")     # no string per cell of a grid


def test_a_small_heads_values_are_printed_in_its_cells_while_the_colour_is_the_value():
    """One head of the lecture layout (9 x 9): each cell prints its value (weights to two places, logits to
    one) under a linear colour; under a log colour none (plotly prints the colour coordinate, not the value);
    the format travels in the trace's meta for the page's own recolouring (static/page.js colourUpdate)."""
    for query, template, fmt in (("preset=lecture&head=3&layer=1", "%{z:.2f}", ".2f"),
                                 ("preset=lecture&head=3&layer=1&color=log", "", ".2f"),
                                 ("preset=lecture&head=3&values=capped+logits", "%{z:.1f}", ".1f")):
        fig, _, _ = views.attention_view(parse_query(query))
        shown = heatmaps(fig)[0]
        assert (shown.texttemplate, shown.meta["text"]) == (template, fmt), query
    grid, _, _ = views.attention_view(parse_query("preset=lecture&head=-1"))
    assert all(t.texttemplate is None for t in heatmaps(grid))                 # a grid's cells are too small


# --- what a redraw weighs on the wire ----------------------------------------------------------------

MB = 1_000_000


def json_bytes(fig) -> int:
    return len(fig.to_json())          # what gr.Plot sends (Plot.postprocess: fig.to_json())


@pytest.mark.parametrize("preset", ["phoenix-nano", "phoenix-2026-nano"])
@pytest.mark.parametrize("color", ["linear", "quantile"])
def test_the_every_head_grid_stays_within_its_payload_budget(preset, color):
    fig, _, _ = views.attention_view(parse_query(f"preset={preset}&head=-1&color={color}"))
    assert len(heatmaps(fig)) == 16
    assert json_bytes(fig) <= 1.5 * MB
    assert all(hm.text is None for hm in heatmaps(fig))


@pytest.mark.parametrize("preset,longest", [("phoenix-nano", False), ("phoenix-2026-nano", False),
                                            ("phoenix-2026-nano", True)])
def test_every_mask_view_stays_within_half_a_megabyte_as_bytes(preset, longest):
    s = parse_query(f"preset={preset}", need_model=False)
    if longest:            # the longest sequence this device allows
        s = parse_query(f"preset={preset}&num_history={s.num_history + max_seq_len() - s.seq_len}", need_model=False)
        assert s.seq_len == max_seq_len()
    for fig in (views.mask_view(s)[0], views.kernel_view(s)[0]):
        assert json_bytes(fig) <= 0.5 * MB, (s.seq_len, json_bytes(fig))
        for hm in heatmaps(fig):
            assert hm.z.dtype == np.uint8
        assert '"dtype":"u1"' in fig.to_json()            # plotly's base64 typed array, a byte a cell


@pytest.mark.parametrize("seed", range(6))
def test_pooling_is_the_max_of_each_block_ignoring_masked_cells(seed):
    """Every pooled cell is the maximum of its block's non-NaN cells (NaN only where the whole block is
    masked), blocks cut at segment changes: checked cell by cell against a loop over the blocks."""
    rng = np.random.default_rng(seed)
    rows, cols, f = rng.integers(20, 90), rng.integers(20, 90), int(rng.integers(2, 9))
    z = rng.standard_normal((rows, cols)).astype(np.float32)
    z[rng.random((rows, cols)) < 0.3] = np.nan
    z[:, : int(rng.integers(0, 6))] = np.nan                        # whole blocks masked
    row_seg, col_seg = (sorted(rng.choice(list("UHCP"), n)) for n in (rows, cols))    # runs of random lengths
    p = pool(Panel(z, [str(i) for i in range(rows)], [str(i) for i in range(cols)], row_segments=row_seg,
                   col_segments=col_seg), max_cells=10_000, factor=f)
    row_bins, col_bins = segment_bins(row_seg, rows, f), segment_bins(col_seg, cols, f)
    assert p.z.shape == (len(row_bins), len(col_bins)) and p.pooled == f
    for i, (a, b) in enumerate(row_bins):
        for j, (c, d) in enumerate(col_bins):
            block = z[a:b, c:d]
            want = np.nan if np.isnan(block).all() else np.nanmax(block)
            assert_bit_exact(p.z[i, j], want, "no rounding")             # a max picks, it does not round


@pytest.mark.parametrize("seed", range(6))
def test_pooling_where_a_gpu_tensor_lives_gives_the_hosts_bits(seed):
    """A GPU's panel is pooled on the GPU (explorer.figures._pooled_exactly, the same reduction run here on the
    CPU): every cell the host's pooling gives, bit for bit, NaN-only blocks, zeros and infinities included; and
    where a max could come out otherwise, a -0.0 (the host's max of +0 and -0 depends on the order it meets
    them) or a NaN other than numpy's (the host keeps the one it met), it declines and the host pools."""
    import torch

    from explorer import figures
    rng = np.random.default_rng(seed)
    rows, cols, f = rng.integers(20, 90), rng.integers(20, 90), int(rng.integers(2, 9))
    z = rng.standard_normal((rows, cols)).astype(np.float32)
    z[rng.random((rows, cols)) < 0.3] = np.nan
    z[:, : int(rng.integers(0, 6))] = np.nan                        # whole blocks masked
    z[rng.random((rows, cols)) < 0.05] = 0.0                         # probabilities of masked keys
    z[rng.random((rows, cols)) < 0.02] = -np.inf
    z[-f:, -f:] = 0.0                                                # a block whose max is zero
    row_seg, col_seg = (sorted(rng.choice(list("UHCP"), n)) for n in (rows, cols))
    labels = [str(i) for i in range(rows)], [str(i) for i in range(cols)]
    host = pool(Panel(z, *labels, row_segments=row_seg, col_segments=col_seg), max_cells=10_000, factor=f).z
    bins = tuple(segment_bins(row_seg, rows, f)), tuple(segment_bins(col_seg, cols, f))
    got = figures._pooled_exactly(torch.from_numpy(z.copy()), *bins)
    assert got.dtype == host.dtype and got.tobytes() == host.tobytes()
    from_tensor = pool(Panel(torch.from_numpy(z.copy()), *labels, row_segments=row_seg, col_segments=col_seg),
                       max_cells=10_000, factor=f)
    assert isinstance(from_tensor.z, np.ndarray) and from_tensor.z.tobytes() == host.tobytes()
    negative_zero, other_nan = z.copy(), z.copy()
    negative_zero[0, 0] = -0.0
    other_nan.view(np.int32)[0, 0] = 0x7FC00001
    assert figures._pooled_exactly(torch.from_numpy(negative_zero), *bins) is None
    assert figures._pooled_exactly(torch.from_numpy(other_nan), *bins) is None


@pytest.mark.parametrize("query", ["preset=phoenix-nano", "preset=phoenix-nano&values=masked+logits&head=3",
                                   "preset=phoenix-2026-nano&head=2&values=capped+logits&color=log",
                                   "preset=phoenix-2026-nano&color=quantile&batch_size=2&row=1"])
def test_a_figure_pooled_where_a_gpu_tensor_lives_is_the_hosts_masked_pairs_and_all(query, monkeypatch):
    """The views' heatmaps pooled by the device's reduction (explorer.figures._pooled_exactly, here on CPU
    tensors as it runs on a GPU's) and by the host's: the same JSON, byte for byte, the masked pairs' overlay
    (pooled on the host, "masked where every pair in the block is") included."""
    import torch

    from explorer import figures
    host = [f.to_json() for f in views.attention_view(parse_query(query))[:1]]
    pooled = []

    def on_device(z, row_bins, col_bins):
        if isinstance(z, torch.Tensor) and z.dtype == torch.float32:
            pooled.append(figures._pooled_exactly(z, row_bins, col_bins))
            return pooled[-1]
    monkeypatch.setattr(figures, "_pooled_on_device", on_device)
    drawn = views.attention_view(parse_query(query))[0]
    assert pooled and all(p is not None for p in pooled), "every panel pooled by the device's reduction"
    assert any(t.meta and t.meta.get("overlay") == "masked" for t in drawn.data) == ("capped" not in query)
    assert [drawn.to_json()] == host


def test_pooling_for_the_byte_budget_keeps_the_block_maximum():
    rng = np.random.default_rng(0)
    z = rng.random((300, 300)).astype(np.float32)
    p = Panel(z, [str(i) for i in range(300)], [str(i) for i in range(300)], row_spans=[(i, i + 1) for i in range(300)])
    fig = heatmap_figure([p] * 4, cols=2, title="", max_cells=512, max_bytes=200_000)
    for hm in heatmaps(fig):
        shown = np.asarray(hm.z)
        assert shown.size * 4 * 4 <= 200_000 * 3          # four panels, float32, base64
        assert shown.max() == z.max() and len(hm.meta["rows"]) == shown.shape[0]


# --- the anatomy of one attention row ------------------------------------------------------------

def test_recording_q_k_v_changes_no_output():
    import torch
    s = parse_query("preset=lecture&weights=random")
    model = runs.build_model(s).transformer
    base = runs.forward(s)
    with torch.no_grad():
        plain = model(base.embeddings, base.valid, base.candidate_start_offset)
    assert_bit_exact(plain.embeddings, base.trunk.embeddings, "same computation")
    t = base.trunk.layers[0]
    assert t.q.shape == (1, s.seq_len, s.num_q_heads, s.key_size) and t.k.shape[2] == s.num_kv_heads
    assert t.heads_out.shape == t.q.shape


@pytest.mark.parametrize("query", ["preset=lecture&head=1&layer=1",
                                   "preset=lecture&weights=random&head=3&query=2&cap_method=soft_sign&logit_cap=2",
                                   "preset=lecture&weights=random&head=-1&history_padding=2&prefix=bidirectional"])
def test_anatomy_steps_rebuild_the_models_own_row(query):
    """cap(multiplier · q·k) from the recorded q and k equals the recorded logits; the softmax of the
    masked logits equals the recorded weights; Σ weight · v equals the recorded head output."""
    import torch
    from models.attention import apply_cap
    s = parse_query(query)
    a = views.row_anatomy(s)
    # the model's fp32 steps against float64 recomputations from its own recorded inputs: exact in real
    # arithmetic, so each within fp32's rounding bound for that step
    K, T, u = a.k.shape[-1], len(a.probs), torch.finfo(torch.float32).eps / 2
    assert relative_error(a.raw, a.k.astype(np.float64) @ a.q.astype(np.float64)) <= rounding_bound(torch.float32, K)
    recomputed = apply_cap(torch.tensor(a.raw * s.multiplier), s.logit_cap, s.cap_method).numpy()
    assert relative_error(a.capped, recomputed) <= rounding_bound(torch.float32, K, depth=2)       # and the cap
    masked = np.where(a.allowed, a.capped.astype(np.float64), -np.inf)
    spread = masked.max() - masked[a.allowed].min()             # exp turns x - max's rounding into a relative one
    softmax = np.exp(masked - masked.max()) / np.exp(masked - masked.max()).sum()
    assert relative_error(a.probs, softmax) <= rounding_bound(torch.float32, T, depth=2) + 2 * u * spread
    assert relative_error(a.out, a.probs @ a.v) <= rounding_bound(torch.float32, T)
    scale = np.abs(a.capped).max()
    assert a.logit_error <= rounding_bound(torch.float32, K, depth=2) * scale
    assert a.out_error <= rounding_bound(torch.float32, T) * np.abs(a.out).max()
    qk, steps, out, text = views.anatomy_view(s)
    bars = [t for t in steps.data if t.type == "bar" and not t.name]          # (named: the segment legend)
    assert len(bars) == 5
    assert_bit_exact(np.asarray(bars[4].y, dtype=np.float32), a.probs, "same computation")
    assert np.isnan(np.asarray(bars[3].y, dtype=float)[~a.allowed]).all()          # masked keys: no bar
    assert_bit_exact(np.asarray(heatmaps(out)[0].z, dtype=np.float32)[-1], a.out, "same computation")
    assert "| key | segment | q·k |" in text


def outlines(fig, axis=""):
    """The row outlines of the panel on x{axis}/y{axis}: rectangles, as (y0, y1, x0, x1)."""
    return {(sh.y0, sh.y1, sh.x0, sh.x1) for sh in fig.layout.shapes
            if sh.type == "rect" and sh.yref == f"y{axis}"}


@pytest.mark.parametrize("query", [500, 1023, 1086])
def test_the_chosen_query_row_is_outlined_on_the_block_that_holds_it(query):
    """phoenix-nano is pooled on screen: the outline sits on the one block holding the query, across
    every key, and a click on that block (its meta.rows entry) picks a position inside it."""
    s = parse_query(NANO + f"&head=0&query={query}")
    fig, _, _ = views.attention_view(s)
    (hm,) = heatmaps(fig)
    assert len(hm.y) < s.seq_len                                        # pooled
    ((y0, y1, x0, x1),) = outlines(fig)
    i = int(y0 + 0.5)
    assert (y1 - y0, x0, x1) == (1, -0.5, len(hm.x) - 0.5)
    labels = s.layout.token_labels()
    first, _, last = hm.y[i].partition("–")
    assert labels.index(first) <= query <= labels.index(last or first)   # the block's own label holds it
    starts = list(hm.meta["rows"])
    assert len(starts) == len(hm.y) and starts[i] == labels.index(first)
    assert starts[i] <= query < (starts[i + 1] if i + 1 < len(starts) else s.seq_len)


def test_every_panel_of_the_grid_and_both_masks_outline_the_query_and_a_zoom_without_it_none():
    s = parse_query("preset=lecture&head=-1&query=3")
    fig, _, _ = views.attention_view(s)
    n = len(heatmaps(fig))
    assert n == s.num_layers * s.num_q_heads
    for k in range(1, n + 1):
        ((y0, _, _, _),) = outlines(fig, "" if k == 1 else str(k))
        assert y0 == 3 - 0.5                                            # unpooled: row 3 is position 3
    mask, _ = views.mask_view(s)
    assert len(outlines(mask)) == len(outlines(mask, "2")) == 1
    zoomed, _, _ = views.attention_view(parse_query(NANO + "&head=0&query=5&zoom=candidates"))
    assert not outlines(zoomed)                                         # position 5 is not in the view


@pytest.mark.parametrize("query", ["preset=lecture&head=1&values=masked+logits&color=log",
                                   "preset=lecture&bug=rope-interleaved", NANO + "&head=-1"])
def test_every_figure_is_sent_as_plotly_writes_it(query):
    """What Gradio sends of each figure (explorer.figures.Figure.to_json, without plotly's deep copies) is
    byte for byte plotly's own JSON of it, numpy arrays as base64 typed arrays included; its template keeps
    plotly's defaults for every trace type the figure draws."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from explorer.export import FIGURES
    from explorer.figures import Figure
    s = parse_query(query)
    for name, spec in FIGURES.items():
        fig = spec.draw(spec.adjust(s))[spec.index]
        assert isinstance(fig, Figure), name
        assert fig.to_json() == go.Figure.to_json(fig), name
        for trace in fig.data:
            assert fig.layout.template.data[trace.type] == pio.templates["plotly"].data[trace.type], (name, trace.type)


def _built_plotly_objects(monkeypatch) -> list:
    """Patch plotly's figure and object constructors (traces, layout, annotations, shapes) to count calls."""
    from plotly import basedatatypes
    built = []
    for cls in (basedatatypes.BaseFigure, basedatatypes.BasePlotlyType):
        init = cls.__init__

        def counted(self, *args, _init=init, **kwargs):
            built.append(type(self).__name__)
            _init(self, *args, **kwargs)
        monkeypatch.setattr(cls, "__init__", counted)
    return built


def test_drawing_and_sending_a_figure_builds_no_plotly_object(monkeypatch):
    """A served figure is drawn, sent (to_json), kept (freeze, held_bytes) without plotly's objects: building
    them was ~18 % of the server's GIL time under the soak (issue 34). Reading the figure builds them."""
    from explorer.figures import bar_figure, line_figure
    s = parse_query("preset=lecture&head=-1")
    views.attention_view(s)                                 # the model's run and the lazy caches, uncounted
    built = _built_plotly_objects(monkeypatch)
    figs = [*(o for o in views.attention_view(s) if hasattr(o, "to_json")),
            bar_figure(["a", "b"], [1.0, 2.0], title="bars", segments=["U", "H"]),
            line_figure({"one": ([1, 2], [3.0, 4.0])}, title="lines", x_title="x", y_title="y")]
    for fig in figs:
        assert fig.to_json() and fig.freeze().held_bytes() > 0 and fig.freeze().to_json() == fig.to_json()
    assert built == []
    assert figs[0].layout.title.text and built                  # the patch counts what reading builds


@pytest.mark.parametrize("query", ["preset=lecture&head=-1", NANO + "&head=0&query=5"])
def test_a_lazily_built_figure_reads_and_changes_as_a_plotly_built_one(query):
    """A figure whose plotly objects are built when first read or changed gives what one built at once does:
    the same properties, the same JSON after the same changes, and that JSON is plotly's own writing of it."""
    import plotly.graph_objects as go

    from explorer.figures import lecture_theme
    s = parse_query(query)
    lazy, eager = (views.attention_view(s)[0] for _ in range(2))
    assert isinstance(lazy, go.Figure) and "_lazy" in vars(lazy)
    eager._data                                                 # builds plotly's state now
    assert "_lazy" not in vars(eager)
    assert lazy.to_json() == eager.to_json() == go.Figure.to_json(eager)
    assert lazy.layout.title.text == eager.layout.title.text and len(lazy.data) == len(eager.data)
    assert lecture_theme(lazy).to_json() == lecture_theme(eager).to_json()
    for fig in (lazy, eager):
        fig.update_layout(title_text="changed").update_traces(zmin=-1, selector=dict(type="heatmap"))
        fig.data[0].name = "first"                              # through the trace object: reaches its figure
        fig.add_trace(go.Scatter(x=[0], y=[0]))
    assert lazy.to_json() == eager.to_json() == go.Figure.to_json(lazy)
    assert '"text":"changed"' in lazy.to_json() and '"name":"first"' in lazy.to_json()


def test_a_shared_figure_built_by_threads_at_once_is_built_once():
    """Two threads reading a frozen figure (explorer.views.records shares it) build its plotly state once,
    and neither reads it half built."""
    import threading

    from explorer.figures import bar_figure
    for _ in range(20):
        fig = bar_figure([str(i) for i in range(50)], list(range(50)), title="bars").freeze()
        start, seen = threading.Barrier(4), []

        def read():
            start.wait()
            seen.append((len(fig.data), fig.layout.title.text, id(fig.layout)))
        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 1 and seen[0][:2] == (1, "bars")
