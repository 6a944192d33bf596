"""A real browser: Debian chromium through playwright opens the page, changes a control, and the
attention heatmap redraws with different data; the URL follows the control; a screenshot is saved."""
import shutil
from urllib.parse import urlparse

import pytest

from scripts.screenshots import launch_browser, wait_for_plot
from scripts.serve import running_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HEATMAP_Z = """() => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    if (!gd || !gd.data || !gd.data.length) return null;
    return JSON.stringify(gd.data[0].z);   // plotly keeps numpy's base64 typed array as sent
}"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.fail("Debian chromium is required for the browser test (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with running_app() as url, sync_playwright() as p:
        browser = launch_browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url + "?preset=lecture&head=0")
        yield page
        browser.close()


def test_control_change_redraws_heatmap_with_new_data(page, tmp_path):
    wait_for_plot(page, "mask-plot")
    page.get_by_role("tab", name="2 · Attention").click()
    wait_for_plot(page, "attention-plot")
    page.wait_for_function(f"({HEATMAP_Z})() !== null")
    before = page.evaluate(HEATMAP_Z)
    assert "head=0" in page.url

    page.get_by_label("capped logits").check()
    page.wait_for_function(f"(before) => ({HEATMAP_Z})() !== before", arg=before, timeout=30_000)
    after = page.evaluate(HEATMAP_Z)
    assert after != before
    page.wait_for_function("() => window.location.search.includes('values=capped')", timeout=10_000)
    title = page.locator("#attention-plot .gtitle").first.text_content()
    assert "capped logits" in title

    page.screenshot(path=str(tmp_path / "browser.png"), full_page=True)
    assert (tmp_path / "browser.png").stat().st_size > 10_000


def test_bad_value_shows_a_message_and_no_traceback(page):
    box = page.get_by_label("query heads")
    page.get_by_text("model", exact=True).click()
    box.fill("3")
    box.press("Enter")
    toast = page.locator(".toast-body, [data-testid='toast-body']").first
    toast.wait_for(timeout=20_000)
    text = toast.text_content()
    assert "num_q_heads" in text and "Traceback" not in text


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
        tab.goto(page.url.split("?")[0] + link)
        toast = tab.locator("[data-testid='toast-body']").first
        toast.wait_for(timeout=30_000)
        text = toast.text_content()
        assert "link ignored: seed: got" in text and HOSTILE_LINKS[link] in text, text
        assert toast.locator("a, img").count() == 0
        wait_for_plot(tab, "mask-plot")                      # the page serves the default view
        assert tab.evaluate(OUTSIDE_ELEMENTS) == []
        assert not [u for u in outside if "evil.example" in u or "host.example" in u], outside
    finally:
        context.close()
