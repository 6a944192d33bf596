"""Exports are real images of the figure: PNG at 3x scale with the figure's size, SVG with its title,
named for what they show; the lecture pack holds every figure drawable here (with the numbers drawn),
captions made from each figure's settings, what was left out and why, and an offline lesson.html."""
import io
import json
import os
import shutil
import struct
import zipfile

import numpy as np
import pytest

from explorer import export, views
from explorer.lesson import LESSON, STORIES
from explorer.query_string import parse_query
from models.presets import PRESETS
from tolerances import assert_bit_exact

pytestmark = pytest.mark.slow     # kaleido starts chromium


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def s():
    return parse_query("preset=lecture&weights=random&head=1")


@pytest.fixture(scope="module")
def pack(s, tmp_path_factory):
    return export.lecture_pack(s, str(tmp_path_factory.mktemp("pack")))


def test_png_is_three_times_the_slide_size(s, tmp_path):
    path = export.export_figure(s, "mask", "png", str(tmp_path))
    assert os.path.basename(path) == "mask-lecture.png"
    assert png_size(open(path, "rb").read()) == (3 * 1600, 3 * 900)            # 16:9 by default
    fig = export.figure(s, "mask")
    path = export.export_figure(s, "mask", "png", str(tmp_path), aspect="figure")
    assert png_size(open(path, "rb").read()) == (3 * 1400, 3 * fig.layout.height)


def test_every_figure_fits_a_slide_with_legible_ticks(s):
    """16:9 (or 4:3) at export, every axis' and colour bar's tick labels at least 16 px."""
    for name, (fig, caption) in export.all_figures(s)[0].items():
        for aspect, (w, h) in (("16:9", (1600, 900)), ("4:3", (1440, 1080))):
            slide = export.slide_figure(fig, aspect)
            assert (slide.layout.width, slide.layout.height) == (w, h)
            layout = slide.layout.to_plotly_json()
            axes = [k for k in layout if k.startswith(("xaxis", "yaxis"))]
            assert axes, name
            assert all(layout[k]["tickfont"]["size"] >= 16 for k in axes), name
            for t in slide.data:
                if t.type == "heatmap" and t.showscale:
                    assert t.colorbar.tickfont.size >= 16, name
    with pytest.raises(ValueError, match="aspect: got '3:2'; allowed: 16:9, 4:3, figure"):
        export.slide_figure(fig, "3:2")


def test_captions_describe_every_figure_of_every_tab(s):
    figures, left_out = export.all_figures(s)
    assert not left_out
    assert {"mask", "attention", "query_row", "anatomy_qk", "anatomy_steps", "anatomy_sum", "isolation",
            "isolation_logits", "invariance", "rope_angles", "rope_qk", "variant", "variant_loss",
            "bug_zoo"} <= set(figures)
    captions = [c for _, c in figures.values()]
    assert len(set(captions)) == len(captions)                      # one description per figure
    assert not any("largest change on any other candidate" in c for c in captions)     # not a verdict
    assert all(len(c) > 60 for c in captions)


def test_svg_shows_the_title(s, tmp_path):
    path = export.export_figure(s, "attention", "svg", str(tmp_path))
    svg = open(path, encoding="utf-8").read()
    assert svg.lstrip().startswith("<svg") and "Attention probabilities: layer 0, query head 1" in svg
    assert 'width="1600"' in svg


def test_unknown_figure_is_refused(s):
    with pytest.raises(ValueError, match="figure: got 'nope'; allowed: mask"):
        export.export_figure(s, "nope", "png")


def test_lecture_pack_has_every_figure_config_and_captions(s, pack):
    figures, _ = export.all_figures(s)
    with zipfile.ZipFile(pack) as z:
        names = set(z.namelist())
        for fig in figures:
            stem = export.file_stem(s, fig)
            assert {f"figures/{stem}.png", f"figures/{stem}.svg", f"data/{stem}.npz"} <= names
        config = json.loads(z.read("config.json"))
        assert parse_query(config["query"]) == s and config["settings"]["head"] == 1
        captions = z.read("captions.md").decode()
        assert all(f"**{export.FIGURES[fig].title}**" in captions for fig in figures) and "Left out" not in captions
        png_size(z.read("figures/isolation-lecture-C0.png"))
        assert "lesson.html" in names


@pytest.mark.parametrize("query", ["preset=lecture&weights=random&head=1&layer=1&query=7",
                                   "preset=lecture&weights=random&head=-1"])
def test_captions_and_file_names_carry_the_settings_each_figure_shows(query):
    """The defect: 'layer 0, every head' under a grid of L0 and L1, 'every head' under query head 0, the bug
    zoo exported with a bug the page did not show, and kernels_candidates' caption speaking of skipped tiles
    at T = 9 where none are. Each fact a caption states is in its figure's own title."""
    s = parse_query(query)
    figures, _ = export.all_figures(s)
    for name, (fig, caption) in figures.items():
        title = fig.layout.title.text.lower()
        for fact in export.shown(s, name).values():
            assert fact.lower() in title, (name, fact, title)
            assert fact in caption or fact.replace("every layer", "every layer and head") in caption, (name, fact)
    if s.head >= 0:
        assert export.file_stem(s, "anatomy_qk") == "anatomy_qk-lecture-L1-h1-C1"
        assert "query C1" in figures["query_row"][1] and "layer 1, head 1" in figures["query_row"][1]
    else:
        assert export.file_stem(s, "attention") == "attention-lecture-Lall-hall"
        assert "every layer and head" in figures["attention"][0].layout.title.text
    bug = figures["bug_zoo"][0].layout.title.text                 # what the page shows: no bug planted
    assert bug == views.bug_zoo_view(s)[0].layout.title.text and "'none'" in bug
    assert "no bug planted" in figures["bug_zoo"][1] and "unmasked" not in figures["bug_zoo"][1]
    assert "no kernel skips a tile" in figures["kernels_candidates"][1] and "where the skipped" not in \
        figures["kernels_candidates"][1]
    nano, _ = export.all_figures(parse_query("preset=phoenix-2026-nano", need_model=False))
    assert "fa4 skips 8" in nano["kernels_candidates"][1]


def _decoded(value):
    """The test's own reading of a plotly array (typed base64 or a list)."""
    import base64
    if isinstance(value, dict):
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return a.reshape(eval(f"({value['shape']},)")) if "shape" in value else a
    return np.asarray(value)


def test_a_data_file_per_figure_holds_exactly_the_numbers_drawn(s, pack):
    figures, _ = export.all_figures(s)
    # what the page holds hidden (a one-head view's other heads) is no part of a file
    assert all(t.visible is not False for fig, _ in figures.values() for t in fig.data)
    with zipfile.ZipFile(pack) as z:
        for name, (fig, _) in figures.items():
            data = np.load(io.BytesIO(z.read(f"data/{export.file_stem(s, name)}.npz")))
            drawn = fig.to_plotly_json()["data"]
            for i, trace in enumerate(drawn):
                for key in ("x", "y", "z"):
                    if trace.get(key) is None:
                        continue
                    want = _decoded(trace[key])
                    got = data[f"trace{i}.{key}"]
                    if want.dtype.kind in "OUS":
                        assert [str(v) for v in want.ravel()] == [str(v) for v in got.ravel()] or \
                            np.allclose(got.astype(float), want.astype(float), equal_nan=True), (name, i, key)
                    else:
                        assert_bit_exact(got, want.astype(got.dtype), "no rounding", f"{name} {i} {key}")
        # and they are the model's own numbers: the single head's weights at layer 0, head 1
        attn = np.load(io.BytesIO(z.read(f"data/{export.file_stem(s, 'attention')}.npz")))
        assert_bit_exact(attn["trace0.z"], views.attention_values(s, 0)[1], "same computation")


@pytest.mark.parametrize("preset", list(PRESETS))
def test_mask_and_kernel_figures_export_at_every_preset(preset, tmp_path):
    """They need no model: at production presets on a CPU they export too (the model figures are
    refused by name)."""
    s = parse_query(f"preset={preset}", need_model=False)
    for name in ("mask", "kernels", "kernels_candidates"):
        path = export.export_figure(s, name, "svg", str(tmp_path))
        assert os.path.basename(path).startswith(f"{name}-{preset}") and open(path).read(4) == "<svg"


def test_the_pack_at_a_production_preset_lists_what_it_left_out_and_why(tmp_path, monkeypatch):
    from explorer import limits
    monkeypatch.setattr(limits, "max_params", lambda: 1)      # as a CPU meets phoenix-2026
    s = parse_query("preset=lecture&weights=random", need_model=False)
    monkeypatch.setattr(export, "FORMATS", ("svg",))
    export.PACKS.cache_clear()                        # a pack kept from before the limits changed
    with zipfile.ZipFile(export.lecture_pack(s, str(tmp_path))) as z:
        captions = z.read("captions.md").decode()
        left = json.loads(z.read("config.json"))["left_out"]
        names = z.namelist()
    assert set(left) == {n for n, spec in export.FIGURES.items() if spec.model}
    assert all("emb_size: got" in why for why in left.values())
    assert "## Left out at this preset" in captions and "- **attention**: runs the sidebar's model" in captions
    assert "figures/mask-lecture.svg" in names and "figures/timing-lecture.svg" in names
    assert "figures/gpu_kernels-lecture.svg" in names and "figures/gpu_forward-lecture.svg" in names
    assert "** (`figures/gpu_kernels-lecture.png`" in captions
    with pytest.raises(ValueError, match="^emb_size: got"):
        export.figure(s, "attention")


def test_lesson_html_is_offline_interactive_and_small(s, pack, tmp_path):
    """lesson.html opens in Chromium with every request blocked: none is attempted besides the file
    itself, and every figure of the pack is drawn by the inlined plotly.js."""
    from playwright.sync_api import sync_playwright

    from scripts.screenshots import launch_browser
    figures, _ = export.all_figures(s)
    with zipfile.ZipFile(pack) as z:
        lesson = z.read("lesson.html")
    assert len(lesson) < export.LESSON_MAX_BYTES
    path = tmp_path / "lesson.html"
    path.write_bytes(lesson)
    if not shutil.which("chromium"):
        pytest.fail("Debian chromium is required (apt-get install chromium)")
    attempted = []
    with sync_playwright() as p:
        browser = launch_browser(p)
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        def block(route):               # the file itself loads; anything else is recorded and refused
            if route.request.url == path.as_uri():
                return route.continue_()
            attempted.append(route.request.url)
            return route.abort()
        page.route("**/*", block)
        page.on("request", lambda r: attempted.append(r.url))
        page.goto(path.as_uri())
        page.wait_for_function(f"document.querySelectorAll('.figure .main-svg').length >= {len(figures) + len(LESSON)}",
                               timeout=60_000)
        drawn = page.eval_on_selector_all(".figure.js-plotly-plot", "els => els.length")
        texts = lambda sel: page.eval_on_selector_all(sel, "els => els.map(e => e.textContent)")   # noqa: E731
        stories, steps, claims, every = (texts("h2.story"), texts("section.step h3"), texts("section.step .claim"),
                                         texts("section.every h3"))
        browser.close()
    assert drawn == len(figures) + len(LESSON)
    # the lesson first, both stories in order, each step's claim over its figure; then every figure, named
    assert stories == [*STORIES.values(), "Every figure at these settings"]
    assert steps == [f"Step {i + 1} · {st.title}" for i, st in enumerate(LESSON)]
    assert claims == [st.claim for st in LESSON]
    assert every == [export.FIGURES[name].title for name in figures]
    assert {u for u in attempted if not u.startswith(("data:", "blob:"))} <= {path.as_uri()}, attempted


def test_export_without_a_browser_says_what_to_install(monkeypatch):
    # kaleido's server thread dies without chromium and the export would hang: refuse up front instead
    import plotly.graph_objects as go
    from explorer import export
    monkeypatch.setattr(export, "_browser_found", lambda: False)
    with pytest.raises(ValueError, match=r"^export: .*chromium"):
        export.figure_bytes(go.Figure(), "png")


def test_exports_without_a_folder_keep_only_the_newest_few(s, tmp_path, monkeypatch):
    """Exports without a folder of their own: the disk holds the newest KEEP_EXPORTS of them."""
    monkeypatch.setattr(export.tempfile, "tempdir", str(tmp_path))
    paths = [export.export_figure(s, "mask", "svg") for _ in range(export.KEEP_EXPORTS + 3)]
    left = [p for p in paths if os.path.exists(p)]
    assert left == paths[-export.KEEP_EXPORTS:]
    assert len(list(tmp_path.rglob("*.svg"))) == export.KEEP_EXPORTS


def _descendants(pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = kids
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process priorities from /proc (Linux)")
def test_the_export_browser_runs_below_the_views_priority(s):
    """A render keeps Chromium busy for about a core: the browser kaleido keeps for exports runs at
    budget.LOW_PRIORITY_NICE, its scheduler group too where the kernel groups by session, so a class's views are not
    slowed by someone's exports."""
    from explorer import budget
    export.stop_browser()
    export.RENDERED.cache_clear()                      # a render, not a file kept from an earlier test
    try:
        export.figure_bytes(views.mask_view(s)[0], "svg")
        nice = {}
        for pid in _descendants(os.getpid()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if "chrom" in stat.split(")", 1)[0]:
                nice[pid] = int(stat.rsplit(")", 1)[1].split()[16])
        assert nice, "no browser process found under this one"
        assert min(nice.values()) >= budget.LOW_PRIORITY_NICE, nice
        groups = {}                 # where the scheduler groups by session, the browser's group yields as well
        for pid in nice:
            try:
                with open(f"/proc/{pid}/autogroup") as f:
                    if os.getsid(pid) != os.getsid(0):
                        groups[pid] = int(f.read().split()[-1])
            except OSError:         # no autogroups on this kernel: the threads' nice is what weighs
                continue
        assert all(g >= budget.LOW_PRIORITY_NICE for g in groups.values()), groups
    finally:
        export.stop_browser()


# --- round three: a pack's work bounded, lesson.html under its limit, the browser counted and stopped -----

def test_a_pack_past_its_work_budget_leaves_the_largest_views_out_by_name(s, monkeypatch):
    """Model views are drawn in lesson order while their estimated work fits pack_max_flops; the rest are
    listed as left out, naming the budget and how to get them (one at a time), and the cheap figures stay."""
    from explorer.views import VIEWS
    attention = VIEWS["attention"].estimate(s).flops
    monkeypatch.setattr(export, "pack_max_flops", lambda: attention * 1.5)
    drawn, left_out = export.all_figures(s)
    assert {"mask", "kernels", "attention", "query_row", "rope_angles", "timing"} <= set(drawn)
    assert "anatomy_qk" in left_out and "isolation" in left_out
    assert left_out["anatomy_qk"].startswith("lecture pack: got ") and "export anatomy_qk alone" in left_out["anatomy_qk"]


def test_lesson_html_stays_under_its_limit_and_says_what_it_left_out(s, monkeypatch):
    from plotly.offline import get_plotlyjs
    figs, _ = export.all_figures(s)
    limit = len(get_plotlyjs()) + export.LESSON_PAGE_BYTES + 20_000
    monkeypatch.setattr(export, "LESSON_MAX_BYTES", limit)
    page = export.lesson_html(s, figs, {})
    assert len(page.encode()) <= limit
    assert "left out of lesson.html" in page and page.count('class="figure"') < len(figs)


def test_the_export_browser_is_counted_while_it_runs_and_stopped_when_idle(s, monkeypatch, tmp_path):
    """kaleido's Chromium (~1 GB) is held in the memory ceiling while it runs and stopped BROWSER_IDLE_S after
    the last render, its hold released."""
    import time

    from explorer import budget
    monkeypatch.setattr(export, "BROWSER_IDLE_S", 0.5)
    export.RENDERED.cache_clear()                      # renders, not files kept from an earlier test
    export.export_figure(s, "mask", "svg", str(tmp_path))
    assert budget.MEMORY.outside.get("export browser") == export.BROWSER_BYTES
    deadline = time.monotonic() + 30
    while "export browser" in budget.MEMORY.outside and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "export browser" not in budget.MEMORY.outside and not export._browser["up"]
    export.RENDERED.cache_clear()
    export.export_figure(s, "mask", "svg", str(tmp_path))                 # and starts again when asked
    assert budget.MEMORY.outside.get("export browser") == export.BROWSER_BYTES


def test_renders_are_served_in_the_order_they_asked():
    """One render at a time, first come first served: a pack rendering figure after figure cannot take the
    browser back before a one-figure export that waits."""
    import threading
    import time
    lock, order = export._FairLock(), []
    lock.__enter__()
    waiting = []
    for i in range(4):
        t = threading.Thread(target=lambda i=i: (lock.__enter__(), order.append(i), lock.__exit__()))
        t.start()
        waiting.append(t)
        time.sleep(0.05)                               # each asks after the one before
    lock.__exit__()
    for t in waiting:
        t.join(5)
    assert order == [0, 1, 2, 3]


def test_the_recorded_gpu_figures_export_with_captions_from_their_files(tmp_path):
    """The GPU evidence exports like any figure, at any preset (it draws no model): its caption names the
    device, date and commit of the committed files it is drawn from, and what was derived."""
    from explorer import gpu_results
    s = parse_query("preset=phoenix-2026-nano", need_model=False)
    for name, words in (("gpu_kernels", "× naive"), ("gpu_forward", "whole forward")):
        path = export.export_figure(s, name, "svg", str(tmp_path))
        assert os.path.basename(path) == f"{name}-phoenix-2026-nano.svg" and words in open(path).read()
        caption = export.caption(s, name)
        run = gpu_results.gpu_run()
        assert (f"{run.device} ({run.data['date']}, commit {run.data['commit']}" in caption
                and "nothing was measured" in caption)
    assert f"benchmarks/results/{run.trunk.source}" in export.caption(s, "gpu_forward")


def test_a_figure_rendered_again_is_the_file_rendered_once(s, monkeypatch):
    """A class exporting the lecture's figure, or downloading one preset's pack, renders each file once: the same
    figure, format, scale and slide is the same file (export.RENDERED, counted in the memory budget); another
    format, slide or figure renders anew, and a cache emptied (memory pressure) renders again."""
    import plotly.graph_objects as go

    from explorer import budget
    export.RENDERED.cache_clear()
    rendered = []
    real = go.Figure.to_image
    monkeypatch.setattr(go.Figure, "to_image", lambda fig, **k: rendered.append(k) or real(fig, **k))
    mask, kernels = views.mask_view(s)[0], views.kernel_view(s)[0]
    first = export.figure_bytes(mask, "png")
    assert export.figure_bytes(mask, "png") == first and len(rendered) == 1
    assert export.figure_bytes(views.mask_view(s)[0], "png") == first and len(rendered) == 1   # drawn again, same
    assert budget.footprint(export.RENDERED.entries) == (len(first), 0)
    export.figure_bytes(mask, "svg"), export.figure_bytes(mask, "png", aspect="4:3"), export.figure_bytes(kernels, "png")
    assert len(rendered) == 4
    export.RENDERED.cache_clear()
    assert png_size(export.figure_bytes(mask, "png")) == png_size(first) and len(rendered) == 5



def test_a_pack_made_again_is_the_pack_made_once_and_takes_no_render_share(s, tmp_path, monkeypatch):
    """Thirty students downloading the lecture's pack: the first draws and renders it, the rest get the same zip
    (export.PACKS) and take none of their network's render share (server.lanes.renders_of_pack: 0), so a class
    behind one address is not refused after its first four packs. Another slide is another pack; a pack with a
    figure that failed is made again, not kept."""
    from explorer.query_string import to_query
    from server import lanes
    export.PACKS.cache_clear()
    made = []
    real = export.all_figures
    monkeypatch.setattr(export, "all_figures", lambda t: made.append(t) or real(t))
    q, full = to_query(s), len(export.FIGURES) * len(export.FORMATS)
    assert lanes.renders_of_pack(q) == full and not export.pack_is_kept(s)
    for d in "ab":
        (tmp_path / d).mkdir()
    first, again = (export.lecture_pack(s, str(tmp_path / d)) for d in "ab")
    assert len(made) == 1 and first != again and open(first, "rb").read() == open(again, "rb").read()
    assert lanes.renders_of_pack(q) == 0 and lanes.renders_of_pack(q, "4:3") == full
    export.PACKS.cache_clear()
    monkeypatch.setattr(export, "all_figures", lambda t: ({}, {"mask": f"{export.FAILED} (RuntimeError)"}))
    export.lecture_pack(s, str(tmp_path / "a"))
    assert not export.pack_is_kept(s) and lanes.renders_of_pack(q) == full
    steps = export.lesson_steps()                       # a lesson step that failed: not kept either
    monkeypatch.setattr(export, "all_figures", lambda t: ({}, {}))
    monkeypatch.setattr(export, "lesson_steps", lambda: [(*steps[0][:2], None, f"{export.FAILED} (RuntimeError)")])
    export.lecture_pack(s, str(tmp_path / "a"))
    assert not export.pack_is_kept(s)
    monkeypatch.setattr(export, "lesson_steps", lambda: steps[:1])
    export.lecture_pack(s, str(tmp_path / "a"))
    assert export.pack_is_kept(s)


def test_a_pack_stops_between_its_steps_once_its_requester_has_gone(s, tmp_path, monkeypatch):
    """A lecture pack asks between figures and between renders whether its requester still waits
    (budget.check_wanted): gone before the first figure, nothing is drawn; gone once the figures are drawn,
    nothing is rendered; either way budget.Abandoned, no file, and no pack kept."""
    from explorer import budget
    export.PACKS.cache_clear()
    drawn, rendered = [], []
    real_all, real_rendered = export.all_figures, export._rendered
    monkeypatch.setattr(export, "all_figures", lambda t: drawn.append(t) or real_all(t))
    monkeypatch.setattr(export, "_rendered", lambda *a, **k: rendered.append(a) or real_rendered(*a, **k))
    monkeypatch.setattr(budget, "_still_wanted", lambda: False)
    with pytest.raises(budget.Abandoned):
        export.lecture_pack(s, str(tmp_path))
    assert len(drawn) == 1 and not rendered and not export.pack_is_kept(s) and not list(tmp_path.iterdir())
    asked = []                                  # wanted while its figures are drawn, gone at the first render
    monkeypatch.setattr(budget, "_still_wanted", lambda: asked.append(1) or len(asked) <= len(export.FIGURES))
    with pytest.raises(budget.Abandoned):
        export.lecture_pack(s, str(tmp_path))
    assert len(asked) == len(export.FIGURES) + 1 and not rendered and not export.pack_is_kept(s)


def test_an_export_made_again_takes_no_render_share(s, tmp_path):
    """renders_of_export: 1 for a figure not rendered yet, 0 once the same settings, figure, format and slide
    were exported and the file is kept; 1 again when memory pressure dropped it."""
    from explorer.query_string import to_query
    from server import lanes
    export.RENDERED.cache_clear()
    q = to_query(s)
    assert lanes.renders_of_export(q, "mask", "svg") == 1
    export.export_figure(s, "mask", "svg", str(tmp_path))
    assert lanes.renders_of_export(q, "mask", "svg") == 0 and export.is_kept(s, "mask", "svg")
    assert lanes.renders_of_export(q, "mask", "png") == 1 and lanes.renders_of_export(q, "mask", "svg", "4:3") == 1
    export.RENDERED.cache_clear()
    assert lanes.renders_of_export(q, "mask", "svg") == 1
