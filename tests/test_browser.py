"""A real browser: Debian chromium through playwright drives the page as a lecturer would. A control
change redraws the heatmap with new data and the URL follows; an invalid value is marked at its control
while the other controls keep working; the colour bar keeps its gradient after the URL changes; a link
reopens the same tab and controls. One app launch for the module."""
from urllib.parse import urlparse

import pytest

from harness.localhost import LOGS, wait_for_plot, why_no_plot
from explorer.timing import BACKEND_COLORS
from served import figure
from tolerances import assert_bit_exact

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HEATMAP_Z = """() => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    if (!gd || !gd.data || !gd.data.length) return null;
    const shown = gd.data.find((t) => t.visible !== false);     // a one-head view holds other panels hidden
    return shown ? JSON.stringify(shown.z) : null;   // plotly keeps numpy's base64 typed array as sent
}"""
# every url(...) reference in the attention plot: [address before '#', whether the id exists]
URL_REFERENCES = """() => {
    const out = [];
    document.querySelectorAll('#attention-plot *').forEach((el) => {
        for (const v of [el.style.fill, el.getAttribute('clip-path'), el.getAttribute('fill')]) {
            const m = v && v.match(/url\\(['"]?([^'"#)]*)#([^'")]+)/);
            if (m) out.push([m[1], !!document.getElementById(m[2])]);
        }
    });
    return out;
}"""


@pytest.fixture
def page(browser):
    b, url = browser
    page = b.new_page(viewport={"width": 1400, "height": 1000})
    page.base_url = url
    page.add_init_script(TRACK_REQUESTS)
    yield page
    page.close()


def served_attention(client, link: str):
    """(figure, bars, sentence) of the attention view the server draws for `link`: the forward the page holds
    numbers of, in the server's own process — the same computation, so the page's numbers equal these bit for
    bit, whatever CPU kernels and thread count the server and this process run."""
    fig, bars, text = client.predict(link, api_name="/attention")
    return figure(fig), figure(bars), text


# What the page still waits for from the server, counted in the page (the heartbeat excluded): every request
# until its answer arrives, every queued event (its id from /queue/join) until the queue stream says it has
# completed. The stream itself is not counted: when an event completes before its join's answer reaches the
# page, Gradio's client opens a stream for it that stays open, idle, until the page goes.
TRACK_REQUESTS = """(() => {
    const net = window.__explorerNet = {open: 0, joined: new Set(), done: new Set(), last: performance.now()};
    const moved = (by) => { net.open += by; net.last = performance.now(); };
    net.waiting = () => net.open + [...net.joined].filter((id) => !net.done.has(id)).length;
    const completed = async (answer) => {
        const reader = answer.body.getReader(), text = new TextDecoder();
        let kept = '';
        for (;;) {
            const {done, value} = await reader.read();
            if (done) return;
            const parts = (kept + text.decode(value, {stream: true})).split('\\n\\n');
            kept = parts.pop();
            for (const part of parts) {
                const line = part.split('\\n').find((l) => l.startsWith('data:'));
                let m = null;
                try { m = line && JSON.parse(line.slice(5)); } catch (e) { /* not JSON: not an event's */ }
                if (m && m.msg === 'process_completed' && m.event_id) { net.done.add(m.event_id); moved(0); }
            }
        }
    };
    const fetch0 = window.fetch;
    window.fetch = async function (...args) {
        const url = String((args[0] && args[0].url) || args[0]);
        if (!url.includes('/gradio_api/') || url.includes('heartbeat')) return fetch0.apply(this, args);
        if (url.includes('/queue/data')) {
            const answer = await fetch0.apply(this, args);
            if (answer.body) completed(answer.clone()).catch(() => {});
            return answer;
        }
        moved(1);
        try {
            const answer = await fetch0.apply(this, args);
            if (url.includes('/queue/join')) {
                const id = await answer.clone().json().then((j) => j && j.event_id, () => null);
                if (id) net.joined.add(id);
            }
            return answer;
        } finally { moved(-1); }
    };
})();"""


def wait_settled(page, quiet_ms: int = 400, timeout_ms: int = 60_000):
    """Until every request the page has sent has been answered, its queued events have all completed and
    nothing followed for `quiet_ms` (the events a step chains — a tab's select, its link write, its redraw —
    have all run)."""
    page.wait_for_function(f"() => window.__explorerNet.waiting() === 0 && "
                           f"performance.now() - window.__explorerNet.last >= {quiet_ms}", timeout=timeout_ms)


def open_attention(page, query="preset=lecture&head=0", presenting=False):
    """The Attention tab of `query`'s link drawn; `presenting`: the link opens presentation mode on it (its
    figure covers the tabs and the controls)."""
    page.goto(page.base_url + "?" + query)
    if presenting:
        wait_for_plot(page, "attention-plot")
        page.wait_for_function("() => document.body.classList.contains('presenting')", timeout=30_000)
        wait_settled(page)
        return
    wait_for_plot(page, "mask-plot")
    page.get_by_role("tab", name="2 · Attention").click()
    wait_for_plot(page, "attention-plot")
    page.wait_for_function(f"({HEATMAP_Z})() !== null")
    wait_settled(page)        # a page load's redraw can draw this tab before the tab's own redraw is sent


def test_a_plot_that_never_comes_is_reported_with_the_pages_state_and_the_servers_log(page):
    """A browser test that times out waiting for a plot says what the page showed (its tab, notices, the
    element's text, what it still waited for) and quotes the server log's refusals and errors."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    page.goto(page.base_url + "?preset=lecture&seed=-1")
    wait_for_plot(page, "mask-plot")
    with pytest.raises(PlaywrightTimeout) as raised:
        wait_for_plot(page, "attention-plot", timeout=300)
    said = str(raised.value)
    assert "'tab': ['" in said and "Mask" in said.split("'tab': ['")[1].split("'")[0], said
    assert "'waiting': " in said and "'element': " in said and "link: seed: got '-1'" in said, said
    assert f"server log ({LOGS[page.base_url]})" in said, said


def test_a_missing_plots_report_quotes_only_the_logs_refusals_and_errors(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("INFO: started\nINFO refused at admission (forward): queue: got 7 model views\n"
                   "Traceback (most recent call last):\n  File app.py\nValueError: a bad thing\nINFO: answered\n")

    class ClosedPage:
        url = "http://127.0.0.1:1/?preset=lecture"

        def evaluate(self, *args):
            raise RuntimeError("Target page has been closed")

    LOGS["http://127.0.0.1:1/"] = log
    try:
        said = why_no_plot(ClosedPage(), "attention-plot")
    finally:
        LOGS.pop("http://127.0.0.1:1/")
    assert "(page state unreadable: Target page has been closed)" in said, said
    quoted = said.split("last refusals and errors:\n")[1].splitlines()
    assert quoted == ["INFO refused at admission (forward): queue: got 7 model views",
                      "Traceback (most recent call last):", "ValueError: a bad thing"], said


def test_control_change_redraws_heatmap_with_new_data(page, tmp_path):
    open_attention(page)
    before = page.evaluate(HEATMAP_Z)
    assert "head=0" in page.url

    page.get_by_label("capped logits").check()
    page.wait_for_function(f"(before) => ({HEATMAP_Z})() !== before", arg=before, timeout=30_000)
    assert page.evaluate(HEATMAP_Z) != before
    page.wait_for_function("() => window.location.search.includes('values=capped')", timeout=10_000)
    title = page.locator("#attention-plot .gtitle").first.text_content()
    assert "capped logits" in title

    page.screenshot(path=str(tmp_path / "browser.png"), full_page=True)
    assert (tmp_path / "browser.png").stat().st_size > 10_000


def test_an_invalid_value_is_marked_at_its_control_and_the_rest_keeps_working(page):
    """lecture -> query heads 8 (the demo weights have 4) -> RoPE offset 100 -> heads fixed."""
    from playwright.sync_api import expect
    open_attention(page)
    page.get_by_text("model", exact=True).click()
    heads = page.get_by_label("query heads")
    heads.fill("8")
    heads.press("Enter")
    marked = page.locator(".invalid")
    marked.first.wait_for(timeout=20_000)
    assert marked.count() == 2                      # the heads and the demo weights that lock them
    text = " ".join(marked.all_inner_texts())
    assert "query heads: got 8" in text and "num_q_heads" not in text and "Traceback" not in text
    expect(page.locator("#limit-note")).to_contain_text("last valid settings", timeout=20_000)
    assert page.locator(".toast-body, [data-testid='toast-body']").count() == 0       # no toast-only error
    assert page.evaluate(HEATMAP_Z) is not None                                          # the last view stays

    page.get_by_text("RoPE", exact=True).click()
    offset = page.get_by_label("RoPE offset")
    offset.fill("100")
    offset.press("Enter")
    page.wait_for_function("() => window.location.search.includes('rope_offset=100')", timeout=20_000)
    assert "num_q_heads" not in page.url and marked.count() == 2

    heads.fill("4")
    heads.press("Enter")
    page.wait_for_function("() => !document.querySelector('.invalid')", timeout=20_000)
    page.get_by_label("linear").first.check()        # and later changes still redraw
    before = page.evaluate(HEATMAP_Z)
    page.get_by_label("capped logits").check()
    page.wait_for_function(f"(before) => ({HEATMAP_Z})() !== before", arg=before, timeout=30_000)


def test_the_colour_bar_keeps_its_gradient_after_the_url_changes(page):
    open_attention(page)
    for label in ("log", "quantile"):
        page.get_by_label(label, exact=True).check()
        page.wait_for_function(f"() => window.location.search.includes('color={label}')", timeout=20_000)
        page.wait_for_timeout(300)
        here = page.evaluate("() => window.location.href.split('#')[0]")
        refs = page.evaluate(URL_REFERENCES)
        assert refs, "no url(#...) references found"
        gradient = page.locator("#attention-plot .colorbar rect.cbfill, #attention-plot .cbfill").first
        assert "url(" in (gradient.get_attribute("style") or "")
        for address, exists in refs:
            assert address in ("", here) and exists, (address, here)


def test_a_link_reopens_the_same_tab_and_controls(page, browser):
    open_attention(page)
    page.get_by_label("capped logits").check()
    page.wait_for_function("() => window.location.search.includes('values=capped')", timeout=20_000)
    link = page.url
    assert "tab=attention" in link
    other = browser[0].new_page(viewport={"width": 1400, "height": 1000})
    try:
        other.goto(link)
        wait_for_plot(other, "attention-plot")
        assert other.get_by_role("tab", name="2 · Attention").get_attribute("aria-selected") == "true"
        other.wait_for_function("() => document.querySelector('#attention-plot .gtitle')")
        assert "capped logits" in other.locator("#attention-plot .gtitle").first.text_content()
        assert other.get_by_label("capped logits").is_checked()
        assert other.url.split("?")[1] == link.split("?")[1]
    finally:
        other.close()


# the page's address writes and the events it sends, in order: ["address", url] and ["event", fn_index, queued]
PAGE_STEPS = """(() => {
    const steps = window.__steps = [];
    for (const k of ['replaceState', 'pushState']) {
        const write = history[k].bind(history);
        history[k] = (state, title, url) => { steps.push(['address', String(url)]); return write(state, title, url); };
    }
    const fetch0 = window.fetch;
    window.fetch = function (...args) {
        const url = String((args[0] && args[0].url) || args[0]);
        if (url.includes('/queue/join') || url.includes('/run/predict')) {
            let fn = null;
            try { fn = JSON.parse(args[1].body).fn_index; } catch (e) { /* not an event */ }
            steps.push(['event', fn, url.includes('/queue/join')]);
        }
        return fetch0.apply(this, args);
    };
})();"""


def test_a_page_load_reads_its_link_before_anything_writes_the_address(page, client):
    """Gradio 6 selects the first tab as the page mounts, sometimes before the page load's own request (which
    reads the link from the address: seen on CI, the load then read `?preset=lecture` and the page lost its
    link). That select changes nothing: it neither writes the address nor queues a redraw; the load's
    request is the first to carry the address, which is written only after it, and one redraw is queued."""
    names = {d["id"]: d.get("api_name") for d in client.config["dependencies"]}
    link = "preset=lecture&layer=1&head=1&values=capped+logits&color=log"
    page.add_init_script(PAGE_STEPS)
    page.goto(page.base_url + "?" + link)
    wait_for_plot(page, "mask-plot")
    wait_settled(page)
    steps = [s if s[0] == "address" else ["event", names.get(s[1]), s[2]] for s in page.evaluate("window.__steps")]
    load = steps.index(["event", "load", True])
    assert all(s[0] == "event" for s in steps[:load]), steps
    assert [s[1] for s in steps if s[0] == "event" and s[2]] == ["load", "render_after_load"], steps
    assert page.url.split("?")[1] == link


HOSTILE_LINKS = {"?seed=<a href=//evil.example/login>Sign in again</a>": "<a href=//evil.example/login>Sign in again</a>",
                 "?seed=<img src=//host.example/p.png>": "<img src=//host.example/p.png>"}
# any element that points outside, wherever it is on the page
OUTSIDE_ELEMENTS = """() => [...document.querySelectorAll('[href], [src], [srcset], [action], [data]')]
    .map(e => e.outerHTML.slice(0, 200)).filter(h => /evil\\.example|host\\.example/.test(h))"""


@pytest.mark.parametrize("link", HOSTILE_LINKS)
def test_a_hostile_link_shows_as_text_and_makes_no_element(page, link):
    """A shared link's value is echoed in the visitor's "link ignored" toast: as the text it is, with
    no link to click and no image fetched from an outside host."""
    outside = []

    def only_local(route):
        if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()
    context = page.context.browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    try:
        tab.route("**/*", only_local)
        tab.goto(page.base_url + link)
        toast = tab.locator("[data-testid='toast-body']").first
        toast.wait_for(timeout=30_000)
        text = toast.text_content()
        assert "link: seed: got" in text and HOSTILE_LINKS[link] in text, text
        assert toast.locator("a, img").count() == 0
        wait_for_plot(tab, "mask-plot")                      # the page serves the default view
        tab.locator(".invalid").first.wait_for(timeout=20_000)     # the seed box marked, its value as text
        assert HOSTILE_LINKS[link] in tab.locator(".invalid").first.inner_text()
        assert tab.evaluate(OUTSIDE_ELEMENTS) == []
        assert not [u for u in outside if "evil.example" in u or "host.example" in u], outside
    finally:
        context.close()


# the attention heatmap's cell grid on screen, and its row outlines (y0 in row-index coordinates)
HEATMAP_GRID = """() => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
    return {left: box.left, top: box.top, width: box.width, height: box.height, rows: gd.data[0].y.length,
            outlines: (gd.layout.shapes || []).filter((s) => s.type === 'rect' && s.yref === 'y').map((s) => s.y0)};
}"""


def test_a_click_on_a_heatmap_row_picks_that_query_row_outlines_it_and_the_link_follows(page):
    open_attention(page)
    grid = page.evaluate(HEATMAP_GRID)
    row = 2                                   # lecture is drawn cell by cell: row 2 is position 2
    assert grid["rows"] > row and 2 - 0.5 not in grid["outlines"]
    before = page.evaluate(HEATMAP_Z)
    page.mouse.click(grid["left"] + grid["width"] / 2, grid["top"] + (row + 0.5) * grid["height"] / grid["rows"])
    page.wait_for_function("() => window.location.search.includes('query=2')", timeout=30_000)
    assert page.locator("#query-row input").input_value() == "2"
    assert "query=2" in page.locator("#query textarea, #query input").first.input_value()
    page.wait_for_function(f"() => ({HEATMAP_GRID})().outlines.includes({row - 0.5})", timeout=30_000)
    assert set(page.evaluate(HEATMAP_GRID)["outlines"]) == {row - 0.5}     # only the picked row
    assert page.evaluate(HEATMAP_Z) == before                              # same weights, new outline


def test_a_link_with_one_bad_value_keeps_the_rest_and_marks_the_bad_control(page):
    """?preset=phoenix-2026-nano&family=grok must not land on lecture: the preset stays, the family box is
    marked with the message in its on-screen label."""
    page.goto(page.base_url + "?preset=phoenix-2026-nano&family=grok&seed=3&tab=attention")
    wait_for_plot(page, "attention-plot")           # the tab the link opens (the hidden mask tab is not drawn)
    marked = page.locator(".invalid")
    marked.first.wait_for(timeout=30_000)
    assert marked.count() == 1 and "model family: got 'grok'" in marked.first.inner_text()
    page.wait_for_function("() => window.location.search.startsWith('?preset=phoenix-2026-nano')", timeout=20_000)
    assert "seed=3" in page.url and "family=grok" not in page.url
    assert page.get_by_role("tab", name="2 · Attention").get_attribute("aria-selected") == "true"


# the drag area of the panel drawn for (layer, head), scrolled into view: its trace's meta says which it is
PANEL_BOX = """([layer, head]) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const i = gd.data.findIndex((t) => t.meta && t.meta.layer === layer && t.meta.head === head);
    if (i < 0) return null;
    const t = gd.data[i], subplot = (t.xaxis || 'x') + (t.yaxis || 'y');
    const drag = gd.querySelector(`.nsewdrag[data-subplot="${subplot}"]`);
    drag.scrollIntoView({block: 'center'});              // a click lands only inside the viewport
    const box = drag.getBoundingClientRect();
    return {left: box.left, top: box.top, width: box.width, height: box.height, labels: t.y};
}"""


def test_a_click_in_a_panel_sets_its_layer_head_and_row_and_everything_follows(page):
    """Every-head grid of lecture, a click on row C2 of the panel 'L1 · q head 3': layer 1, head 3 and
    query C2 together in the controls and the link; the bars and the Anatomy tab read the same."""
    open_attention(page, "preset=lecture&head=-1")
    box = page.evaluate(PANEL_BOX, [1, 3])
    assert box is not None, "no panel for layer 1, head 3 in the grid"
    row = box["labels"].index("C2")
    page.mouse.click(box["left"] + box["width"] / 2, box["top"] + (row + 0.5) * box["height"] / len(box["labels"]))
    page.wait_for_function(f"""() => {{ const q = new URLSearchParams(window.location.search);
        return q.get('layer') === '1' && q.get('head') === '3' && q.get('query') === '{row}'; }}""", timeout=30_000)
    assert page.get_by_label("layer", exact=True).input_value() == "1"
    assert page.get_by_label("head", exact=True).input_value().startswith("head 3")
    assert page.locator("#query-row input").input_value() == str(row)
    link = page.locator("#query textarea, #query input").first.input_value()
    assert "layer=1" in link and "head=3" in link and f"query={row}" in link
    page.get_by_text("Where query C2 attends (layer 1, head 3)").first.wait_for(timeout=30_000)
    page.get_by_role("tab", name="2b · Anatomy").click()
    page.wait_for_function("""() => { const t = document.querySelector('#anatomy-plot .gtitle');
        return t && t.textContent.includes('layer 1, query head 3') && t.textContent.includes('query C2'); }""",
                           timeout=60_000)


# the attention figure as drawn: each heatmap shown (a one-head view holds its layer's other heads hidden)
# with its colour coordinates (plotly's decoded arrays), the colour bar, the title, the hover
DRAWN = """() => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const values = (t) => t.type === 'heatmap' && t.visible !== false && !(t.meta && t.meta.overlay);
    const maps = gd._fullData.filter(values);
    return {z: maps.map((t) => Array.from(t._z || t.z, (row) => Array.from(row, (v) => (isFinite(v) ? v : null)))),
            ticktext: maps[0].colorbar.ticktext ? Array.from(maps[0].colorbar.ticktext) : null,
            bar: maps[0].colorbar.title.text, title: gd.layout.title.text,
            zmin: maps[0].zmin, zmax: maps[0].zmax, hover: maps[0].hovertemplate,
            scale: gd.data.filter(values)[0].colorscale,
            masked: gd._fullData.filter((t) => t.meta && t.meta.overlay && t.visible !== false).length,
            printed: maps[0].texttemplate || ''};
}"""


def server_requests(page) -> list:
    """The page's requests to the server from now on (the heartbeat stream excluded)."""
    seen = []
    page.on("request", lambda r: seen.append(r.url) if "/gradio_api/" in r.url and "heartbeat" not in r.url else None)
    return seen


@pytest.mark.served_numbers
@pytest.mark.parametrize("query,kind", [("preset=lecture&head=-1&values=capped+logits", "log"),
                                        ("preset=lecture&head=-1", "quantile"), ("preset=lecture&head=2", "log"),
                                        ("preset=lecture&head=2&color=quantile", "linear")])
def test_a_colour_change_is_drawn_in_the_browser_as_the_server_draws_it(page, client, query, kind):
    """No request reaches the server, and the figure equals the one the server draws for the new link
    (colour coordinates to float32 precision, the colour bar's ticks, the title's note)."""
    open_attention(page, query)
    requests = server_requests(page)
    page.get_by_label(kind, exact=True).check()
    page.wait_for_function(f"() => new URLSearchParams(window.location.search).get('color') "
                           f"{'=== null' if kind == 'linear' else '=== ' + repr(kind)}", timeout=10_000)
    page.wait_for_timeout(500)                     # anything the change would send has been sent
    assert requests == [], requests
    link = urlparse(page.url).query
    assert page.locator("#query textarea, #query input").first.input_value() == link.split("&tab=")[0]
    drawn = page.evaluate(DRAWN)
    fig, _, _ = served_attention(client, link.split("&tab=")[0])
    assert_drawn_as(drawn, fig)


def assert_drawn_as(drawn: dict, fig) -> None:
    """The attention figure drawn on the page (DRAWN) is what the server draws (`fig`): the heatmaps shown,
    colour coordinates to float32 precision, the colour bar's title and ticks, the title, the hover, the
    masked pairs shown or not."""
    import numpy as np
    maps = [t for t in fig.data if t.type == "heatmap" and t.visible is not False and not (t.meta or {}).get("overlay")]
    assert len(drawn["z"]) == len(maps)
    # the masked pairs (and their legend entry) shown as the server shows them: not over capped logits
    assert drawn["masked"] == sum(1 for t in fig.data if (t.meta or {}).get("overlay") and t.visible is not False)
    assert drawn["printed"] == (maps[0].texttemplate or "")            # a small head's values, printed or not
    for got, want in zip(drawn["z"], maps):
        want = np.asarray(want.z, dtype=np.float64)
        got = np.array([[np.nan if v is None else v for v in row] for row in got])
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(np.float32).eps, atol=1e-7, equal_nan=True)
    bar = maps[0].colorbar
    assert drawn["bar"] == bar.title.text and drawn["title"] == fig.layout.title.text
    assert drawn["ticktext"] == (list(bar.ticktext) if bar.ticktext is not None else drawn["ticktext"])
    assert drawn["hover"] == maps[0].hovertemplate and drawn["scale"] == maps[0].colorscale


def test_an_emptied_or_non_numeric_number_box_is_marked_not_silently_reset(page):
    from playwright.sync_api import expect
    open_attention(page)
    seed = page.get_by_label("seed (weights and inputs)")
    for typed in ("", "1e"):             # "1e": what a number box holds mid-typing; its value is not a number
        seed.fill("")
        seed.press_sequentially(typed)
        seed.press("Enter")
        marked = page.locator(".invalid")
        # the mark can be redrawn while a redraw of the previous keystroke lands: wait for it to settle
        expect(marked).to_have_count(1, timeout=20_000)
        expect(marked.first).to_contain_text("seed: empty, or not a number yet", timeout=20_000)
        # the note is another output of the same event; Gradio's Markdown draws its text a frame or more later
        expect(page.locator("#limit-note")).to_contain_text("last valid settings", timeout=20_000)
    seed.fill("3")
    seed.press("Enter")
    page.wait_for_function("() => !document.querySelector('.invalid') && window.location.search.includes('seed=3')",
                           timeout=20_000)


TIME_TRACES = """() => {
    const gd = document.querySelector('#time-plot .js-plotly-plot');
    return gd && gd.data ? gd.data.filter(t => t.meta).map(t => [t.meta, t.line.color, t.line.dash, t.x.length]) : null;
}"""
# the GPU run beside the live one: [meta, x axis, y (backends), text beside the bars] per trace
FLASH_TRACES = """() => {
    const gd = document.querySelector('#flash-plot .js-plotly-plot');
    return gd && gd.data ? gd.data.map(t => [t.meta || '', t.xaxis || 'x', Array.from(t.y || []),
                                             Array.from(t.text || [])]) : null;
}"""


def open_timing(page, link="?preset=lecture&tab=timing", width=1280, height=720):
    """The timing tab of `link` at a projector's size, settled."""
    page.set_viewport_size({"width": width, "height": height})
    page.goto(page.base_url + link)
    wait_for_plot(page, "flash-plot", timeout=60_000)
    wait_settled(page)


def test_the_timing_tab_shows_the_gpu_evidence_without_run_at_1280x720(page):
    """Issue 33 / 35 item 6: on a CPU, before anything runs, the tab shows the committed GPU run — device, date,
    commit, × naive with the share of the matmul peak, the cap's cost, the whole forward with attention's share
    and the table — and its first figure starts on the first screen; the live panel beside it says nothing was
    measured; no error pop-up."""
    from explorer import gpu_results
    run = gpu_results.gpu_run()                     # the newest committed GPU file: what the server draws from
    served = gpu_results.flash_figure(run)
    open_timing(page)
    traces = page.evaluate(FLASH_TRACES)
    recorded = [t for t in traces if t[0].startswith(f"recorded on {run.label()}")]
    assert recorded and all(axis == "x" for _, axis, _, _ in recorded)
    assert sorted(text for t in recorded for text in t[3]) == sorted(
        text for t in served.data if (t.meta or "").startswith("recorded on") for text in t.text)
    none, tanh = (gpu_results.kernel_points(run)[cap] for cap in ("none", "tanh"))
    fa4_cap = next(r["median_ms"] for r in tanh if r["backend"] == "fa4") / next(
        r["median_ms"] for r in none if r["backend"] == "fa4")
    assert not any(axis == "x2" for _, axis, _, _ in traces)                  # nothing measured here yet
    headings = page.evaluate("() => [...document.querySelectorAll('#flash-plot .annotation-text')]"
                             ".map((e) => e.textContent)")
    assert any("Nothing measured here yet" in h for h in headings) and any(f"fa4 {fa4_cap:.2g}×" in h
                                                                             for h in headings)
    top = page.evaluate("() => document.querySelector('#flash-plot').getBoundingClientRect().top")
    assert top < 720                                                           # on the first screen
    forward = page.locator("#trunk-plot .js-plotly-plot")
    forward.scroll_into_view_if_needed()
    bars = [text for t in gpu_results.trunk_figure(run).data for text in (t.text or ()) if "attention" in text]
    assert bars and all(text in forward.text_content() for text in bars)
    assert f"Recorded on {run.device}" in page.locator("#gpu-text").inner_text()
    assert page.locator(".toast-body").count() == 0


def test_a_timing_run_streams_beside_the_recorded_gpu_run_and_stop_keeps_its_points(page):
    """The live run stays as it was (budget-capped, cancellable): measured points appear solid in the backend's
    own colour on the live charts — no committed curve on their axes — and in the GPU figure's own live panel,
    while the recorded panel stays; Stop says how far the run got and the points measured so far stay drawn."""
    open_timing(page)
    recorded = [t[0] for t in page.evaluate(FLASH_TRACES)]
    page.get_by_label("sequence lengths T").fill("16, 24, 32, 2048")
    page.get_by_label("sequence lengths T").press("Tab")
    page.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function(f"(({TIME_TRACES})() || []).some(t => t[0].includes('measured now') && t[3] >= 2)",
                           timeout=120_000)
    page.wait_for_function(f"(({FLASH_TRACES})() || []).some(t => t[1] === 'x2')", timeout=30_000)
    before_stop = {meta: n for meta, _, _, n in page.evaluate(TIME_TRACES)}
    page.get_by_role("button", name="Stop", exact=True).click()
    page.wait_for_function("() => /Stopped after \\d of 4 lengths/.test(document.body.innerText)", timeout=30_000)
    drawn = page.evaluate(TIME_TRACES)
    assert drawn and all("measured now" in meta and dash == "solid" for meta, _, dash, _ in drawn)
    # every point measured before Stop is still drawn (a backend behind the others may have fewer than two)
    kept = {meta: n for meta, _, _, n in drawn}
    assert all(kept.get(meta, 0) >= n for meta, n in before_stop.items()) and max(kept.values()) >= 2
    assert all(c == BACKEND_COLORS[meta.split(" · ")[0]] for meta, c, _, _ in drawn)
    flash = page.evaluate(FLASH_TRACES)
    assert [t[0] for t in flash if t[1] == "x"] == recorded                   # the recorded panel stayed
    live = [t for t in flash if t[1] == "x2"]
    assert live and all(t[0].startswith("measured now on CPU") and "naive" in t[2] for t in live)


def test_an_emptied_or_bad_lengths_box_gets_one_message_and_no_popups(page):
    """Issue 35 item 7: deleting the lengths (Gradio sends no input event for a deletion) left the last message
    and Run enabled, and each Run then stacked an error pop-up. Now the box's every change is checked: one message
    names the field, Run stays disabled, no pop-up; a valid value says what Run measures."""
    from playwright.sync_api import expect
    open_timing(page)
    box = page.get_by_label("sequence lengths T")
    message = page.locator("#timing-check")
    run = page.get_by_role("button", name="Run", exact=True)
    expect(message).to_contain_text("Run measures the sidebar's model", timeout=20_000)
    box.click()
    box.press("End")
    for _ in range(len(box.input_value())):
        box.press("Backspace")
    expect(message).to_contain_text("lengths: got ''", timeout=20_000)
    expect(message).to_contain_text("the box is empty")
    expect(run).to_be_disabled()
    run.click(force=True)
    page.keyboard.press("Enter")
    box.press_sequentially("7x")
    expect(message).to_contain_text("whole numbers separated by commas", timeout=20_000)
    wait_settled(page)
    assert page.locator(".toast-body").count() == 0 and message.inner_text().count("Cannot run") == 1
    box.fill("64")
    expect(message).to_contain_text("at T = 64 on naive", timeout=20_000)
    page.get_by_label("bfloat16").check()
    expect(message).to_contain_text("bfloat16", timeout=20_000)
    expect(run).to_be_enabled()
    candidates = page.get_by_label("candidates (slots, padded ones included)")     # the sidebar's, with the tab open
    candidates.fill("2")
    candidates.press("Enter")
    expect(message).to_contain_text("2 candidates, bfloat16", timeout=20_000)


# the query row as drawn: the attention figure's row outlines, the bar chart and its sentence
QUERY_DRAWN = """() => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const bars = document.querySelector('#query-bars-plot .js-plotly-plot');
    return {outlines: (gd.layout.shapes || []).filter((s) => s.name === 'query-outline')
                .map((s) => [s.xref, s.yref, s.x0, s.x1, s.y0, s.y1, s.line.width]),
            y: Array.from(bars.data[0].y), text: bars.data[0].text ? Array.from(bars.data[0].text) : null,
            title: bars.layout.title.text, sentence: document.querySelector('#query-text').innerText.trim()};
}"""


def assert_bars_as(drawn: dict, bars, text: str) -> None:
    """The query row's bars drawn on the page (QUERY_DRAWN) are what the server draws: the weights (float32,
    exactly), their labels, the title and the sentence."""
    import numpy as np
    assert_bit_exact(np.float32(drawn["y"]), np.float32(bars.data[0].y), "same computation")
    assert drawn["text"] == (list(bars.data[0].text) if bars.data[0].text is not None else None)
    assert drawn["title"] == bars.layout.title.text and drawn["sentence"] == text.replace("**", "")


@pytest.mark.served_numbers
@pytest.mark.parametrize("query,how", [("preset=lecture&head=0", "typed"), ("preset=lecture&head=-1&layer=1", "typed"),
                                       ("preset=lecture&head=2&color=log", "click"),
                                       ("preset=lecture&head=1&tab=attention&present=1", "key"),
                                       ("preset=lecture&head=-1&query=3", "layer typed"),
                                       ("preset=lecture&head=-1&tab=attention&present=1", "layer key")])
def test_a_query_row_change_is_drawn_in_the_browser_as_the_server_draws_it(page, client, query, how):
    """At lecture (rows drawn one by one) a query row typed, clicked or stepped with →, or in the every-head
    grid a layer typed or stepped with PgDn, sends no request; the outlines, the bars (float32 weights,
    exactly), their labels, the title, the sentence and the link equal what the server draws and writes for
    the new link. A later server redraw (values) keeps the new row and layer."""
    from explorer.query_string import parse_query, to_query

    open_attention(page, query, presenting=how.endswith("key"))
    before = page.evaluate(QUERY_DRAWN)
    requests = server_requests(page)
    if how == "typed":
        page.locator("#query-row input").fill("2")
    elif how == "click":
        grid = page.evaluate(HEATMAP_GRID)
        page.mouse.click(grid["left"] + grid["width"] / 2, grid["top"] + 2.5 * grid["height"] / grid["rows"])
    elif how == "key":
        page.keyboard.press("ArrowRight")
    elif how == "layer typed":
        page.get_by_label("layer", exact=True).fill("1")
    else:
        page.keyboard.press("PageDown")
    field = "layer" if how.startswith("layer") else "query"
    page.wait_for_function(f"() => new URLSearchParams(window.location.search).get('{field}') !== null", timeout=10_000)
    page.wait_for_timeout(500)                     # anything the change would send has been sent
    assert requests == [], requests
    link = urlparse(page.url).query.split("&tab=")[0]
    assert page.locator("#query textarea, #query input").first.input_value() == link
    s = parse_query(link)
    assert to_query(s) == link                         # as the server writes it
    assert page.locator("#query-row input").input_value() == str(s.query)
    assert page.get_by_label("layer", exact=True).input_value() == str(s.layer)
    drawn = page.evaluate(QUERY_DRAWN)
    fig, bars, text = served_attention(client, link)
    want = sorted([s.xref, s.yref, s.x0, s.x1, s.y0, s.y1, s.line.width] for s in fig.layout.shapes
                  if s.name == "query-outline")
    assert sorted(drawn["outlines"]) == want and (field == "layer" or drawn["outlines"] != before["outlines"])
    assert_bars_as(drawn, bars, text)
    assert drawn["y"] != before["y"]

    if how.endswith("key"):
        page.keyboard.press("Escape")                   # the controls in view again
        page.wait_for_function("() => !document.body.classList.contains('presenting')", timeout=10_000)
    assert_a_server_redraw_keeps(page, s, bars)


def assert_a_server_redraw_keeps(page, s, bars) -> None:
    """A later server redraw (a zoom) draws the layer, head and query row the page drew (`s`)."""
    page.get_by_role("radio", name="history tail").check()
    head = f"query head {s.head} " if s.head >= 0 else "every layer and head"
    page.wait_for_function(f"""() => {{
        const t = (document.querySelector('#attention-plot .gtitle') || {{}}).textContent || '';
        return t.includes('zoom: history tail') && t.includes({head!r})
            && ({s.head} < 0 || t.includes('layer {s.layer},'));
    }}""", timeout=30_000)
    page.wait_for_function(f"(t) => ({QUERY_DRAWN})().title === t", arg=bars.layout.title.text, timeout=30_000)


@pytest.mark.served_numbers
@pytest.mark.parametrize("query,head", [("preset=lecture&head=0", 1), ("preset=lecture&head=2&color=log&query=7", 3),
                                        ("preset=lecture&head=3&layer=1&color=quantile&query=4", 0)])
def test_a_head_pick_is_drawn_in_the_browser_as_the_server_draws_it(page, client, query, head):
    """Another head of a one-head view at lecture (the figure holds the layer's heads) sends no request: the
    heatmap (colour coordinates, colour bar, title, hover), the bars (float32 weights, exactly), their title,
    the sentence and the link equal what the server draws and writes for the new link; the row outline
    stays. A later server redraw (values) draws the new head."""
    from explorer.query_string import parse_query, to_query

    open_attention(page, query)
    before = page.evaluate(QUERY_DRAWN)
    requests = server_requests(page)
    s0 = parse_query(query)
    page.get_by_label("head", exact=True).click()
    page.get_by_role("option", name=f"head {head} (KV {head // (s0.num_q_heads // s0.num_kv_heads)})",
                     exact=True).click()
    page.wait_for_function(f"() => new URLSearchParams(window.location.search).get('head') === '{head}'",
                           timeout=10_000)
    page.wait_for_timeout(500)                     # anything the change would send has been sent
    assert requests == [], requests
    link = urlparse(page.url).query.split("&tab=")[0]
    s = parse_query(link)
    assert to_query(s) == link and page.locator("#query textarea, #query input").first.input_value() == link
    fig, bars, text = served_attention(client, link)
    assert_drawn_as(page.evaluate(DRAWN), fig)
    drawn = page.evaluate(QUERY_DRAWN)
    assert drawn["outlines"] == before["outlines"] != []
    assert_bars_as(drawn, bars, text)
    assert drawn["y"] != before["y"]

    assert_a_server_redraw_keeps(page, s, bars)


@pytest.mark.served_numbers
@pytest.mark.parametrize("query,field,value", [
    ("preset=lecture&head=0", "values", "capped logits"),
    ("preset=lecture&head=2&color=log&query=7", "values", "masked logits"),
    ("preset=lecture&head=1&values=masked+logits&color=quantile&history_padding=2", "values", "probabilities"),
    ("preset=lecture&head=3&query=4", "layer", "1"),
    ("preset=lecture&head=1&values=capped+logits&layer=1&color=log", "layer", "0"),
    ("preset=lecture&head=2&tab=attention&present=1", "layer", "PageDown")])
def test_a_values_or_layer_pick_in_a_one_head_view_is_drawn_in_the_browser_as_the_server_draws_it(page, client,
                                                                                                  query, field, value):
    """At lecture a one-head view holds every value kind and layer: a values pick, a layer typed or stepped
    with PgDn sends no request; the heatmap (colour coordinates, colour scale and bar, title, hover), the bars,
    the sentence and the link equal what the server draws and writes for the new link. A later server
    redraw keeps the pick."""
    from explorer.query_string import parse_query, to_query

    open_attention(page, query, presenting=value == "PageDown")
    before = page.evaluate(DRAWN)
    requests = server_requests(page)
    if value == "PageDown":
        page.keyboard.press("PageDown")
    elif field == "values":
        page.get_by_label(value, exact=True).check()
    else:
        page.get_by_label("layer", exact=True).fill(value)
    want = "1" if value == "PageDown" else value
    page.wait_for_function(f"() => (new URLSearchParams(window.location.search).get('{field}') || "
                           f"{{values: 'probabilities', layer: '0'}}['{field}']) === {want!r}", timeout=10_000)
    page.wait_for_timeout(500)                     # anything the change would send has been sent
    assert requests == [], requests
    link = urlparse(page.url).query.split("&tab=")[0]
    s = parse_query(link)
    assert to_query(s) == link and page.locator("#query textarea, #query input").first.input_value() == link
    assert str(getattr(s, field)) == want
    fig, bars, text = served_attention(client, link)
    drawn = page.evaluate(DRAWN)
    assert drawn["title"] != before["title"]
    assert_drawn_as(drawn, fig)
    assert_bars_as(page.evaluate(QUERY_DRAWN), bars, text)

    if value == "PageDown":
        page.keyboard.press("Escape")                   # the controls in view again
        page.wait_for_function("() => !document.body.classList.contains('presenting')", timeout=10_000)
    assert_a_server_redraw_keeps(page, s, bars)


@pytest.mark.served_numbers
def test_a_head_key_in_presentation_is_drawn_by_the_page_and_the_dropdown_follows(page, client):
    """↓ in presentation mode at lecture: the next head is drawn in the keydown's own task (no server answer
    can have come), equal to what the server draws for the new link; then the link, the address and the head
    dropdown follow, and a later server redraw keeps the head."""
    from playwright.sync_api import expect

    from explorer.query_string import parse_query, to_query

    open_attention(page, "preset=lecture&head=1&query=4&tab=attention&present=1", presenting=True)
    title = page.evaluate("""() => {
        document.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowDown', bubbles: true}));
        return document.querySelector('#attention-plot .js-plotly-plot').layout.title.text;
    }""")
    assert title.startswith("Attention probabilities: layer 0, query head 2 (KV head 1)"), title
    page.wait_for_function("() => new URLSearchParams(window.location.search).get('head') === '2'", timeout=10_000)
    link = urlparse(page.url).query.split("&tab=")[0]
    s = parse_query(link)
    assert to_query(s) == link and s.head == 2 and s.query == 4
    fig, bars, text = served_attention(client, link)
    assert_drawn_as(page.evaluate(DRAWN), fig)
    assert_bars_as(page.evaluate(QUERY_DRAWN), bars, text)
    page.keyboard.press("Escape")
    page.wait_for_function("() => !document.body.classList.contains('presenting')", timeout=10_000)
    expect(page.get_by_label("head", exact=True)).to_have_value("head 2 (KV 1)", timeout=10_000)
    assert_a_server_redraw_keeps(page, s, bars)


@pytest.mark.parametrize("query,head", [("preset=lecture&head=-1", 1), ("preset=lecture&head=1", -1),
                                        ("preset=lecture&head=0&values=capped+logits&num_history=66", 1)])
def test_a_head_the_page_does_not_hold_is_drawn_by_the_server(page, query, head):
    """To or from the every-head grid, or where the model's panels do not all fit with logits shown: the server
    draws the pick."""
    open_attention(page, query)
    requests = server_requests(page)
    page.get_by_label("head", exact=True).click()
    name = "all heads (grid)" if head < 0 else f"head {head} (KV {head // 2})"
    page.get_by_role("option", name=name, exact=True).click()
    title = "every layer and head" if head < 0 else f"query head {head} "
    page.wait_for_function(f"() => (document.querySelector('#attention-plot .gtitle') || {{}}).textContent"
                           f"?.includes({title!r})", timeout=30_000)
    assert requests


@pytest.mark.parametrize("query,field", [("preset=lecture&head=0&values=capped+logits&num_history=66", "query"),
                                         ("preset=lecture&head=0&num_history=66", "layer")])
def test_a_query_row_or_layer_the_page_does_not_hold_is_drawn_by_the_server(page, query, field):
    """Where a one-head view holds only its layer's heads: logits shown (the bars are probabilities the page
    does not hold), or another layer: the server redraws the row."""
    open_attention(page, query)
    requests = server_requests(page)
    if field == "query":
        page.locator("#query-row input").fill("2")
        expect = "'Where query ' + document.querySelector('#query-bars-plot .js-plotly-plot').data[0].x[2] + ' '"
    else:
        page.get_by_label("layer", exact=True).fill("1")
        expect = "'Attention probabilities: layer 1,'"
        page.wait_for_function(f"() => (document.querySelector('#attention-plot .gtitle') || {{}}).textContent"
                               f"?.startsWith({expect})", timeout=30_000)
        expect = "'Where query C0 attends (layer 1'"
    page.wait_for_function(f"() => ({QUERY_DRAWN})().title.startsWith({expect})", timeout=30_000)
    assert requests and f"{field}=" in page.url


# every word of the page's title whose letters lie on more than one line: [word, lines]
BROKEN_TITLE_WORDS = """() => {
    const h1 = document.querySelector('#page-title h1');
    const text = h1.firstChild;
    const out = [];
    for (const m of text.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(text, m.index);
        range.setEnd(text, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        if (tops.size > 1) out.push([m[0], tops.size]);
    }
    return out;
}"""


@pytest.mark.parametrize("width", [390, 1280])
def test_the_title_breaks_between_words_never_inside_one(page, width):
    """On a phone (390 px) the title took one share of the header's row beside Present and broke inside its
    words ('recommen / dation', 'transforme / rs'); at every width it breaks only between words, and the first
    screen still holds Present."""
    page.set_viewport_size({"width": width, "height": 844})
    page.goto(page.base_url + "?preset=lecture")
    wait_for_plot(page, "mask-plot")
    assert page.evaluate(BROKEN_TITLE_WORDS) == []
    present = page.evaluate("() => document.querySelector('#present-btn').getBoundingClientRect().bottom")
    assert present < 844


# the bounding boxes of a plot's annotation texts holding `part`: [left, right, top, bottom]
ANNOTATION_BOXES = """([id, part]) => [...document.querySelectorAll(`#${id} .annotation-text`)]
    .filter((e) => e.textContent.includes(part))
    .map((e) => { const r = e.getBoundingClientRect(); return [r.left, r.right, r.top, r.bottom]; })"""


def test_at_150_percent_zoom_a_figure_keeps_its_width_and_its_titles_apart(page):
    """A 1280 x 720 screen at 150 % zoom (853 x 480 CSS px): the tab's column is 386 px, and Plotly laid the mask
    pair's panel titles over each other (and the Flash tab's two headings, the Variants grid's titles). A figure
    of the column's width is drawn at least 860 px wide (its block scrolls sideways) and the two titles keep
    apart."""
    page.set_viewport_size({"width": 853, "height": 480})
    page.goto(page.base_url + "?preset=lecture&tab=mask")
    wait_for_plot(page, "mask-plot")
    assert page.evaluate("() => document.querySelector('#mask-plot .js-plotly-plot').clientWidth") >= 860
    (l1, r1, t1, b1), (l2, r2, t2, b2) = sorted(page.evaluate(ANNOTATION_BOXES, ["mask-plot", "of the pairs masked"]))
    assert r1 <= l2 or b1 <= t2 or b2 <= t1
