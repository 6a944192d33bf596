"""What a lecturer in front of a class meets, in a real browser (Debian chromium through playwright) at a
projector's 1280 x 720 and at 150 % browser zoom (853 x 480 CSS px): every lesson step presents the figure
that shows its claim, with its words and numbers on it, nothing cut or stacked; the first screen of every
tab shows a figure under a clear Present button and the lesson's steps; masked pairs look masked; a field's
message says what was typed and clears once the value is valid; Back undoes a change and Reset goes back to
the preset. One app launch for the module."""
import pytest

from explorer.figures import MASKED_NAME
from explorer.lesson import LESSON
from explorer.views import VIEWS
from harness.localhost import wait_for_plot
from test_browser import TRACK_REQUESTS, wait_settled

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SIZES = {"1280x720": dict(viewport={"width": 1280, "height": 720}),
         "150% zoom": dict(viewport={"width": 853, "height": 480}, device_scale_factor=1.5)}


@pytest.fixture
def open_page(browser):
    b, url = browser
    pages = []

    def opened(link: str, size: str = "1280x720"):
        page = b.new_page(**SIZES[size])
        page.add_init_script(TRACK_REQUESTS)
        page.goto(url + link)
        pages.append(page)
        return page
    yield opened
    for page in pages:
        page.close()


# The presented figure once laid out in lecture sizes: its id, every word it writes, and what a class must
# not meet — a title past the window, boxes of title / legend / panel titles overlapping, neighbouring tick
# labels of one axis overlapping, plotly's modebar on show.
PRESENTED = """(fig) => {
    const el = document.querySelector('.present-focus');
    const gd = el && el.querySelector('.js-plotly-plot');
    const bar = document.getElementById('present-bar');
    if (!gd || el.id !== fig || !gd.layout || gd.layout.autosize !== false || !bar) return null;
    if (gd.layout.height !== Math.floor(window.innerHeight - Math.max(64, bar.offsetHeight) - 8)) return null;
    const svgs = [...el.querySelectorAll('.main-svg')];            // the plot's, and the titles' and legend's
    const rect = (e) => e.getBoundingClientRect();
    const boxes = [...el.querySelectorAll('.gtitle, .legend, .annotation-text')].map((e) => [e.textContent, rect(e)])
        .filter(([, b]) => b.width > 0);
    const overlaps = [];
    boxes.forEach(([t1, a], i) => boxes.slice(i + 1).forEach(([t2, b]) => {
        if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) overlaps.push(t1 + ' / ' + t2);
    }));
    const stacked = [];
    el.querySelectorAll('.xaxislayer-above, .yaxislayer-above').forEach((layer) => {
        const ticks = [...layer.querySelectorAll('.xtick text, .ytick text')].map((t) => [t.textContent, rect(t)])
            .filter(([, b]) => b.width > 0);
        ticks.forEach(([t1, a], i) => ticks.slice(i + 1).forEach(([t2, b]) => {
            if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) stacked.push(t1 + ' / ' + t2);
        }));
    });
    const title = el.querySelector('.gtitle');
    const modebar = el.querySelector('.modebar-container');
    return {text: svgs.map((s) => s.textContent).join(' ').replace(/\\s+/g, ' '), overlaps, stacked,
            title: title ? [rect(title).left, rect(title).right] : null, width: window.innerWidth,
            modebar: !!modebar && getComputedStyle(modebar).display !== 'none',
            claim: (document.getElementById('lesson-claim') || {}).innerText || ''};
}"""


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("index", range(len(LESSON)), ids=[st.title for st in LESSON])
def test_every_lesson_step_presents_its_own_figure_with_its_numbers_on_it(open_page, index, size):
    """The walk of both stories in presentation mode: the step's own figure (never its tab's first one),
    every word and number the claim is about written on it (explorer.lesson.Step.shows), the claim under it
    in full, the title inside the window, no two labels on top of each other, no modebar."""
    st = LESSON[index]
    page = open_page(st.link(index) + "&present=1", size)
    page.wait_for_function(f"({PRESENTED})({st.figure!r}) !== null", timeout=120_000)
    wait_settled(page)
    p = page.evaluate(f"({PRESENTED})({st.figure!r})")
    assert p is not None and st.claim in " ".join(p["claim"].split()), p["claim"]
    missing = [phrase for phrase in st.shows if phrase not in p["text"]]
    assert not missing, (missing, p["text"][:1500])
    assert p["title"] is None or 0 <= p["title"][0] and p["title"][1] <= p["width"], p["title"]
    assert p["overlaps"] == [] and p["stacked"] == [], (p["overlaps"], p["stacked"])
    assert not p["modebar"]


def test_an_old_zero_based_step_link_opens_the_same_step_numbered_from_one(open_page):
    page = open_page("?preset=lecture&layer=1&head=3&query=7&tab=anatomy&step=2&present=1")
    page.wait_for_function(f"({PRESENTED})('anatomy-steps-plot') !== null", timeout=120_000)
    assert f"step 3 of {len(LESSON)} · Its anatomy" in page.locator("#lesson-claim").inner_text()
    page.wait_for_function("() => window.location.search.includes('lesson=3')", timeout=30_000)
    assert "step=" not in page.url


# where each tab's first figure starts on the page, and whether every tab's title is in view
FIRST_FIGURE = """() => {
    const panel = [...document.querySelectorAll('[role=tabpanel]')].find((p) => p.offsetParent !== null);
    const plot = panel && [...panel.querySelectorAll('.js-plotly-plot .main-svg')].find((p) => p.getBoundingClientRect().height > 0);
    return plot ? plot.getBoundingClientRect().top + window.scrollY : null;
}"""
TABS_IN_VIEW = """() => [...document.querySelectorAll('[role=tab]')]
    .filter((t) => t.offsetParent !== null && t.getBoundingClientRect().width > 0).map((t) => t.textContent.trim())"""


def luminance(rgb: str) -> float:
    r, g, b = (int(v) / 255 for v in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_the_first_screen_of_every_tab_shows_a_figure_a_clear_present_button_and_the_lesson(open_page):
    """At 1280 x 720: on every tab a figure starts within the first screen with room to be seen (200 px of
    it at least); every tab's title is in view, none behind a menu; Present is a button of at least 16 px
    text with contrast; the lesson's nine steps are links on the first screen."""
    page = open_page("?preset=lecture")
    wait_for_plot(page, "mask-plot")
    wait_settled(page)
    present = page.locator("#present-btn")
    box = present.bounding_box()
    style = page.evaluate("""() => { const s = getComputedStyle(document.getElementById('present-btn'));
        return {size: parseFloat(s.fontSize), fg: s.color, bg: s.backgroundColor}; }""")
    assert box["y"] + box["height"] <= 720 and box["height"] >= 36 and style["size"] >= 16
    lighter, darker = sorted((luminance(style["fg"]), luminance(style["bg"])), reverse=True)
    assert (lighter + 0.05) / (darker + 0.05) >= 2.5, style          # a filled button, not a grey bar
    steps = page.locator("#lesson-strip a")
    assert steps.count() == len(LESSON) + 1                           # each step, and the start
    assert all(steps.nth(i).bounding_box()["y"] < 720 for i in range(steps.count()))
    tops = {}
    for view in VIEWS.values():
        assert page.evaluate(TABS_IN_VIEW) == [v.title for v in VIEWS.values()]
        page.get_by_role("tab", name=view.title).click()
        page.wait_for_function(f"({FIRST_FIGURE})() !== null", timeout=120_000)
        wait_settled(page)
        tops[view.name] = page.evaluate(FIRST_FIGURE)
    assert all(top <= 720 - 200 for top in tops.values()), tops


def test_a_step_of_the_lesson_strip_opens_in_the_same_window(open_page):
    """Gradio opens a Markdown link in a new tab: the lesson's steps open where the class is looking."""
    page = open_page("?preset=lecture")
    wait_for_plot(page, "mask-plot")
    pages = len(page.context.pages)
    page.locator("#lesson-strip a", has_text="3 Its anatomy").click()
    page.wait_for_url("**lesson=3**", timeout=30_000)
    page.wait_for_function(f"() => (document.getElementById('lesson-claim') || {{}}).innerText?.includes("
                           f"'step 3 of {len(LESSON)}')", timeout=60_000)
    assert len(page.context.pages) == pages and "tab=anatomy" in page.url
    # the step's own figure (the anatomy's second) scrolled into view, under the claim's bar
    page.wait_for_function("""() => { const el = document.getElementById('anatomy-steps-plot');
        const r = el && el.querySelector('.main-svg') && el.getBoundingClientRect();
        return !!r && r.top >= -1 && r.top < window.innerHeight / 2; }""", timeout=60_000)


def test_at_150_percent_zoom_every_tab_stays_in_view(open_page):
    page = open_page("?preset=lecture", "150% zoom")
    wait_for_plot(page, "mask-plot")
    assert page.evaluate(TABS_IN_VIEW) == [v.title for v in VIEWS.values()]


def test_masked_pairs_look_masked_and_follow_the_values_shown(open_page):
    """One head at lecture: the grey masked pairs (× in each, named in the legend) over the weights; the
    values radio's capped logits (drawn by the page, no request) hide them with the values before the mask,
    probabilities bring them back."""
    page = open_page("?preset=lecture&head=3&layer=1&tab=attention")
    wait_for_plot(page, "attention-plot")
    wait_settled(page)
    masked = """() => { const gd = document.querySelector('#attention-plot .js-plotly-plot');
        const grey = gd._fullData.filter((t) => t.meta && t.meta.overlay && t.type === 'heatmap' && t.visible !== false);
        return {grey: grey.length, crosses: grey.length ? [].concat(...grey[0].text).filter((t) => t === '×').length : 0,
                legend: [...gd.querySelectorAll('.legendtext')].map((t) => t.textContent)}; }"""
    shown = page.evaluate(masked)
    assert shown["grey"] == 1 and shown["crosses"] > 0 and MASKED_NAME in shown["legend"]
    page.get_by_label("capped logits").check()
    page.wait_for_function("() => window.location.search.includes('values=capped')", timeout=20_000)
    assert page.evaluate(masked)["grey"] == 0
    page.get_by_label("probabilities").check()
    page.wait_for_function("() => !window.location.search.includes('values=')", timeout=20_000)
    assert page.evaluate(masked) == shown


def marks(page) -> list[str]:
    return [" ".join(t.split()) for t in page.locator(".invalid").all_inner_texts()]


def test_a_fields_message_says_what_was_typed_and_clears_once_the_value_is_valid(open_page):
    """History length -1 (marked: got -1), then 7 typed while the marking is still on its way: no mark
    stays; a value typed back to the last valid one never reads 'empty'; 1e9 in candidate j reads 'got
    1e9', not 'got 9'."""
    page = open_page("?preset=lecture&tab=isolation")
    wait_for_plot(page, "isolation-plot")
    wait_settled(page)
    box = page.get_by_label("history length")
    box.fill("")
    box.press_sequentially("-1", delay=30)
    page.wait_for_function("() => document.querySelector('.invalid') && "
                           "document.querySelector('.invalid').innerText.includes('got -1')", timeout=30_000)
    for key in ("Backspace", "Backspace"):              # each keystroke a change, answered while the next is typed
        box.press(key)
    box.press_sequentially("7")
    wait_settled(page)
    page.wait_for_function("() => window.location.search.includes('num_history=7')", timeout=30_000)
    assert marks(page) == [] and box.input_value() == "7"
    box.fill("")
    box.press_sequentially("5")                          # back to the preset's own value: a valid value
    wait_settled(page)
    page.wait_for_function("() => !window.location.search.includes('num_history')", timeout=30_000)
    assert marks(page) == []
    candidate = page.get_by_label("candidate j")
    candidate.fill("")
    candidate.press_sequentially("1e9", delay=200)
    wait_settled(page)
    assert candidate.input_value() == "1e9"
    assert any("candidate j: got 1e9; allowed: an integer in [0, 2]" in m for m in marks(page)), marks(page)
    candidate.fill("1")
    candidate.press("Enter")
    wait_settled(page)
    page.wait_for_function("() => !document.querySelector('.invalid')", timeout=30_000)


def test_back_undoes_a_change_within_the_app_and_reset_returns_to_the_preset(open_page):
    """Two changes (a head, then a tab), each an entry of the browser's history: Back returns to the view
    before each, controls, tab and figure with it, without leaving the app; Forward redoes; Reset sets every
    control to the preset's value."""
    page = open_page("?preset=lecture&tab=attention")
    wait_for_plot(page, "attention-plot")
    wait_settled(page)
    start = page.url
    page.get_by_label("head", exact=True).click()
    page.get_by_role("option", name="head 2 (KV 1)", exact=True).click()
    page.wait_for_function("() => window.location.search.includes('head=2')", timeout=30_000)
    wait_settled(page)
    page.get_by_role("tab", name="2b · Anatomy").click()
    page.wait_for_function("() => window.location.search.includes('tab=anatomy')", timeout=30_000)
    wait_settled(page)
    page.go_back()
    page.wait_for_function("() => window.location.search.includes('tab=attention') && "
                           "window.location.search.includes('head=2')", timeout=30_000)
    wait_settled(page)
    assert page.get_by_role("tab", name="2 · Attention").get_attribute("aria-selected") == "true"
    page.go_back()
    page.wait_for_function("() => !window.location.search.includes('head=')", timeout=30_000)
    wait_settled(page)
    assert page.url == start and page.get_by_label("head", exact=True).input_value() == "all heads (grid)"
    page.wait_for_function("() => (document.querySelector('#attention-plot .gtitle') || {}).textContent"
                           "?.includes('every layer and head')", timeout=30_000)
    page.go_forward()
    page.wait_for_function("() => window.location.search.includes('head=2')", timeout=30_000)
    wait_settled(page)
    assert page.get_by_label("head", exact=True).input_value().startswith("head 2")
    page.get_by_label("seed (weights and inputs)").fill("7")
    page.get_by_label("seed (weights and inputs)").press("Enter")
    page.wait_for_function("() => window.location.search.includes('seed=7')", timeout=30_000)
    wait_settled(page)
    page.locator("#reset-btn").click()
    page.wait_for_function("() => window.location.search === '?preset=lecture&tab=attention'", timeout=30_000)
    wait_settled(page)
    assert page.get_by_label("seed (weights and inputs)").input_value() == "0"
    assert page.get_by_label("head", exact=True).input_value() == "all heads (grid)"
