"""The app on localhost, for the app and browser tests, the screenshots and the benchmarks: app.py in a
subprocess on a free 127.0.0.1 port, and Debian chromium to drive it.

    with running_app() as url:       # http://127.0.0.1:<free port>/
        Client(url).predict("preset=lecture", api_name="/mask")

The server's stdout and stderr go to a log file, never to a pipe nobody reads: a pipe fills after
~64 KB of log lines and then blocks the server mid-request. The log's tail is in the error when the
app does not start; the file is removed afterwards unless `log` names one to keep.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
LOGS: dict[str, Path] = {}      # url of a running app: its log (wait_for_plot quotes it when a plot never comes)


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(startup_timeout_s: float = 120.0, log: Optional[Path] = None,
                root: Optional[Path] = None, env: Optional[dict] = None, own_session: bool = True) -> Iterator[str]:
    """Start app.py (of `root`, another checkout, when given; with `env` over this process's environment),
    wait until it answers, yield its URL; stop it (by its own pid) afterwards.

    The app runs in a session of its own (`own_session`), as a served app does (a Space's container, a
    service, its own terminal). Where Linux shares the CPU by session (autogroup,
    /proc/sys/kernel/sched_autogroup_enabled), the clients this process starts on the same machine are then
    another group beside the server's, not threads of its group: in the soak (benchmarks/load_test.py) the
    event loop otherwise queued for a core behind every client thread, a contention no served Space has (its
    visitors' browsers are other machines). own_session=False keeps the app in this process's session (the
    soaks before 2026-12-03; `--before-shared-session` measures one against the other)."""
    root = Path(root) if root else ROOT
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1",
           # no background flex compiles (minutes of CPU on a fresh machine) beside what is measured
           "EXPLORER_PREWARM_FLEX": os.environ.get("EXPLORER_PREWARM_FLEX", "0"), **(env or {})}
    keep = log is not None
    log_path = Path(log) if keep else Path(tempfile.mkstemp(prefix="explorer-app-", suffix=".log")[1])
    url = f"http://127.0.0.1:{port}/"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(root / "app.py")], cwd=root, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=own_session)
    LOGS[url] = log_path
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_bytes()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"app.py did not start on {url} (exit code {proc.poll()}):\n{tail}") from None
                time.sleep(0.1)
        yield url
    finally:
        LOGS.pop(url, None)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not keep:
            log_path.unlink(missing_ok=True)


def launch_browser(playwright):
    """Headless Debian chromium through playwright (never a downloaded browser)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise RuntimeError("Debian chromium not found (apt-get install chromium)")
    return playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)


def wait_for_plot(page, elem_id: str, timeout: float = 90_000):
    """Wait until the plot in the element `elem_id` has drawn. A page's first plot on a fresh 2-core machine waits
    for the model's build and first forward behind the start-up warm-up (a fresh clone's run failed at 30 s)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:
        page.wait_for_selector(f"#{elem_id} .js-plotly-plot .main-svg", timeout=timeout, state="attached")
    except PlaywrightTimeout as e:
        raise PlaywrightTimeout(f"{e}\n{why_no_plot(page, elem_id)}") from None


# What a page shows that can say why a plot never came: the tab it is on, its notices and the element's text
PAGE_STATE = """(id) => {
    const shown = (sel) => [...document.querySelectorAll(sel)].map((el) => el.innerText.trim()).filter(Boolean);
    const net = window.__explorerNet;
    return {tab: shown('[role=tab][aria-selected=true]'), notices: shown('.toast-body, .validation-error, .error'),
            element: (document.getElementById(id) || {innerText: '(no such element)'}).innerText.slice(0, 400),
            waiting: net ? net.waiting() : null};
}"""


def why_no_plot(page, elem_id: str, lines: int = 25) -> str:
    """The page's state (PAGE_STATE) and the server log's last refusals, errors and tracebacks."""
    try:
        state = page.evaluate(PAGE_STATE, elem_id)
    except Exception as e:                          # a closed or crashed page says so instead
        state = f"(page state unreadable: {e})"
    log = next((path for url, path in LOGS.items() if page.url.startswith(url)), None)
    words = ("refused", "pushed out", "error", "traceback", "exception")
    tail = [line for line in (log.read_text(errors="replace").splitlines() if log and log.exists() else [])
            if any(w in line.lower() for w in words)][-lines:]
    return f"page {page.url}: {state}\nserver log ({log}), last refusals and errors:\n" + "\n".join(tail)
