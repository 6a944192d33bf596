"""A real browser: Debian chromium through playwright opens the page, changes a control, and the
attention heatmap redraws with different data; the URL follows the control; a screenshot is saved."""
import shutil

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
