"""Fixtures shared by the test modules."""
import shutil

import pytest

from explorer.localhost import launch_browser, running_app


@pytest.fixture(scope="module")
def browser():
    """(Debian chromium through playwright, the app's url): one app launch per test module."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.fail("Debian chromium is required for the browser test (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with running_app() as url, sync_playwright() as p:
        b = launch_browser(p)
        yield b, url
        b.close()
