"""Presentation mode and the lesson in a real browser (Debian chromium through playwright), at a
projector's 1280 x 720 and at 1920 x 1080: the figure fills the first screen with lecture fonts, keys step
the view, Esc leaves, a lesson step shows its claim and N goes on. One app launch for the module."""

import pytest

from explorer.lesson import LESSON

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# the presented figure: its box, the smallest rendered tick-label font, and overlaps between its title,
# legend and panel titles (pairs of boxes that intersect)
PRESENTED = """() => {
    const el = document.querySelector('.present-focus');
    const gd = el && el.querySelector('.js-plotly-plot');
    if (!gd || !gd.layout || gd.layout.height !== Math.floor(window.innerHeight - 64 - 8)) return null;
    const r = el.getBoundingClientRect();
    const ticks = [...el.querySelectorAll('.xtick text, .ytick text')].map((t) => parseFloat(getComputedStyle(t).fontSize));
    const boxes = [...el.querySelectorAll('.gtitle, .legend, .annotation-text')]
        .map((e) => [e.getAttribute('class'), e.textContent, e.getBoundingClientRect()])
        .filter(([, , b]) => b.width > 0);
    const overlaps = [];
    boxes.forEach(([c1, t1, a], i) => boxes.slice(i + 1).forEach(([c2, t2, b]) => {
        if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
            overlaps.push(t1 + ' / ' + t2);
    }));
    const shown = (id) => { const e = document.getElementById(id); return !!e && getComputedStyle(e).visibility !== 'hidden'; };
    return {id: el.id, box: [r.left, r.top, r.right, r.bottom], minTick: Math.min(...ticks), ticks: ticks.length,
            overlaps, header: shown('page-header'), link: shown('query'), sidebar: shown('sidebar'),
            presenting: document.body.classList.contains('presenting'),
            bar: (document.getElementById('present-bar') || {}).innerText || ''};
}"""


def open_page(browser, link, width=1280, height=720):
    b, url = browser
    page = b.new_page(viewport={"width": width, "height": height})
    page.goto(url + link)
    page.wait_for_function(f"({PRESENTED})() !== null", timeout=60_000)
    return page


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_presentation_fills_the_first_screen_with_lecture_fonts(browser, size):
    page = open_page(browser, "?preset=lecture&tab=attention&present=1", *size)
    try:
        page.wait_for_timeout(500)
        p = page.evaluate(PRESENTED)
        left, top, right, bottom = p["box"]
        assert p["id"] == "attention-plot" and p["presenting"]
        assert left >= 0 and top >= 0 and right <= size[0] and bottom <= size[1] - 64      # inside the first screen
        assert (right - left) >= 0.95 * size[0] and (bottom - top) >= 0.85 * (size[1] - 64)   # and fills it
        assert p["ticks"] > 10 and p["minTick"] >= 14, p
        assert p["overlaps"] == [], p["overlaps"]
        assert not (p["header"] or p["link"] or p["sidebar"])
        assert "Esc leave" in p["bar"] and "query row" in p["bar"]
    finally:
        page.close()


def test_keys_step_row_head_and_layer_and_esc_leaves(browser):
    page = open_page(browser, "?preset=lecture&tab=attention&present=1")
    try:
        for key, expect in (("ArrowRight", "query=7"), ("ArrowDown", "head=0"), ("PageDown", "layer=1")):
            page.keyboard.press(key)
            page.wait_for_function(f"() => window.location.search.includes('{expect}')", timeout=30_000)
        page.wait_for_function("() => (document.querySelector('.present-focus .gtitle') || {}).textContent"
                               "?.includes('layer 1, query head 0')", timeout=30_000)
        page.wait_for_function(f"({PRESENTED})() !== null", timeout=30_000)     # the redrawn figure presented
        assert page.evaluate(PRESENTED)["minTick"] >= 14
        assert "present=1" in page.url and "tab=attention" in page.url
        page.keyboard.press("Escape")
        page.wait_for_function("() => !document.body.classList.contains('presenting')", timeout=10_000)
        assert "present=1" not in page.url and "layer=1" in page.url
        assert page.locator("#sidebar").is_visible() and page.locator("#query").is_visible()
    finally:
        page.close()


def test_a_lesson_step_shows_its_claim_and_n_goes_to_the_next_step(browser):
    i = next(i for i, st in enumerate(LESSON) if st.figure == "kernel-plot")
    page = open_page(browser, LESSON[i].link(i) + "&present=1")
    try:
        p = page.evaluate(PRESENTED)
        assert p["id"] == "kernel-plot" and LESSON[i].claim[:60] in p["bar"]
        assert p["minTick"] >= 14 and p["overlaps"] == [], p
        page.keyboard.press("n")
        page.wait_for_url(f"**lesson={i + 2}**", timeout=30_000)
        page.wait_for_function(f"({PRESENTED})() !== null", timeout=60_000)
        assert LESSON[i + 1].claim[:60] in page.evaluate(PRESENTED)["bar"] and "present=1" in page.url
    finally:
        page.close()


def test_the_link_box_copy_icon_copies_the_full_address_with_the_tab(browser):
    b, url = browser
    context = b.new_context(viewport={"width": 1400, "height": 1000})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    try:
        page.goto(url + "?preset=lecture&head=1&tab=anatomy")
        page.wait_for_selector("#anatomy-plot .js-plotly-plot .main-svg", timeout=60_000, state="attached")
        page.wait_for_function("() => window.location.search.includes('tab=anatomy')", timeout=30_000)
        page.locator("#query button").first.click()
        page.wait_for_timeout(500)
        copied = page.evaluate("() => navigator.clipboard.readText()")
        assert copied == page.url and copied.startswith(url) and "tab=anatomy" in copied and "head=1" in copied
    finally:
        context.close()


# the presented figure's traces: [meta, x axis, text beside the bars]
PRESENTED_TRACES = """() => {
    const gd = document.querySelector('.present-focus .js-plotly-plot');
    return gd && gd.data ? gd.data.map((t) => [t.meta || '', t.xaxis || 'x', Array.from(t.text || [])]) : null;
}"""


@pytest.mark.parametrize("i", [i for i, st in enumerate(LESSON) if st.tab == "timing"])
def test_the_lesson_flash_steps_present_the_recorded_gpu_run_without_run(browser, i):
    """Issue 35 item 6: the lesson's timing step showed an empty chart until R, then a flat CPU one. Each flash
    step on the Timing tab now presents, at 1280 x 720 with nothing pressed, its figure drawn from the committed
    GPU run, the claim's numbers on it, in lecture fonts with nothing overlapping."""
    from explorer.lesson import numbers
    st = LESSON[i]
    page = open_page(browser, st.link(i) + "&present=1")
    try:
        page.wait_for_function(f"(({PRESENTED_TRACES})() || []).some((t) => t[0].startsWith('recorded on NVIDIA'))",
                               timeout=60_000)
        p = page.evaluate(PRESENTED)
        assert p["id"] == st.figure and st.claim[:60] in p["bar"] and "R run" in p["bar"]
        assert p["minTick"] >= 14 and p["overlaps"] == [], p
        left, top, right, bottom = p["box"]
        assert right <= 1280 and bottom <= 720 - 64 and (right - left) >= 0.95 * 1280
        drawn = page.evaluate("() => document.querySelector('.present-focus').textContent")
        assert set(numbers(st.claim)) <= set(numbers(drawn))              # the claim's numbers are on the figure
        assert not any(t[0].startswith("measured now") for t in page.evaluate(PRESENTED_TRACES))
    finally:
        page.close()


def test_r_runs_the_live_sweep_into_the_presented_figure_beside_the_gpu_run(browser):
    """R in presentation mode still measures live: the run's bars appear in the presented figure's own live panel
    (its own axes) while the recorded GPU panel stays."""
    i = next(i for i, st in enumerate(LESSON) if st.figure == "flash-plot")
    b, url = browser
    page = b.new_page(viewport={"width": 1280, "height": 720})
    try:
        page.goto(url + LESSON[i].link(i))
        page.wait_for_selector("#flash-plot .js-plotly-plot .main-svg", timeout=60_000, state="attached")
        page.get_by_label("sequence lengths T").fill("160")                  # one short length, no compile:
        page.get_by_label("flex").uncheck()                                   # naive beside structured
        page.get_by_label("structured").check()
        page.wait_for_function("() => /at T = 160 on naive, structured/.test(document.body.innerText)", timeout=30_000)
        page.evaluate("() => { document.activeElement.blur(); explorer.present.enter(); }")   # keys off the boxes
        page.wait_for_function(f"({PRESENTED})() !== null", timeout=30_000)
        page.keyboard.press("r")
        page.wait_for_function(f"(({PRESENTED_TRACES})() || []).some((t) => t[1] === 'x2' && "
                               "t[0].startsWith('measured now'))", timeout=120_000)
        traces = page.evaluate(PRESENTED_TRACES)
        assert {t[1] for t in traces if t[0].startswith("recorded on NVIDIA")} == {"x"}
        live = next(t for t in traces if t[1] == "x2")
        assert len(live[2]) == 2 and all("×" in text for text in live[2])
        p = page.evaluate(PRESENTED)
        assert p["id"] == "flash-plot" and p["overlaps"] == [], p
    finally:
        page.close()
