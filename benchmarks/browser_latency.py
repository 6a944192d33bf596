"""Browser latency: what a lecturer waits for in Chromium, from an input to the new figure drawn.

    python -m benchmarks.browser_latency [--repeats 12]

Headless Debian chromium (playwright, never a downloaded browser) drives the app on localhost. For each
kind of control it times the input (a click, a number typed and Enter, a dropdown pick, a preset
switch) until the plot on the page holds different data — the whole path: the event, validation,
the model's recorded forward (cached or not), the figure's JSON, and plotly drawing it. p50 / p95 / min /
max per control kind go to benchmarks/results/browser-latency-<date>.json with device, date and commit;
scripts/readme_tables.py summarises the newest file in the README.
Targets (issue 11): lecture control change p95 < 300 ms, phoenix-nano < 1.5 s, preset switch < 2 s.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.runinfo import device_name, git_commit, percentile  # noqa: E402
from scripts.screenshots import launch_browser, wait_for_plot  # noqa: E402
from scripts.serve import running_app  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
TARGETS_MS = {"lecture": 300.0, "phoenix-nano": 1500.0, "preset switch": 2000.0}
# the data of the first trace of a plot, as sent (changes whenever the figure does)
PLOT_DATA = """(id) => {
    const gd = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!gd || !gd.data || !gd.data.length) return null;
    return JSON.stringify([gd.layout && gd.layout.title && gd.layout.title.text, gd.data[0].z, gd.data[0].x]);
}"""


def time_change(page, plot_id: str, act, timeout_ms: float = 60_000) -> float:
    """ms from `act()` to the plot holding different data."""
    before = page.evaluate(PLOT_DATA, plot_id)
    t0 = time.perf_counter()
    act()
    page.wait_for_function(f"([id, before]) => ({PLOT_DATA})(id) !== before", arg=[plot_id, before],
                           timeout=timeout_ms, polling="raf")
    return (time.perf_counter() - t0) * 1000


def number(page, label: str, value) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Enter")


def summary(kind: str, preset: str, samples: list[float]) -> dict:
    target = TARGETS_MS["preset switch" if kind == "preset switch" else preset]
    return dict(control=kind, preset=preset, n=len(samples), p50_ms=percentile(samples, 50),
                p95_ms=percentile(samples, 95), min_ms=min(samples), max_ms=max(samples),
                mean_ms=statistics.fmean(samples), target_p95_ms=target)


def measure(url: str, repeats: int) -> list[dict]:
    from playwright.sync_api import sync_playwright
    records = []
    with sync_playwright() as p:
        browser = launch_browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for preset in ("lecture", "phoenix-nano"):
            page.goto(f"{url}?preset={preset}&head=0&tab=attention")
            wait_for_plot(page, "attention-plot", timeout=120_000)
            page.wait_for_function(f"() => ({PLOT_DATA})('attention-plot') !== null", timeout=120_000)
            page.get_by_text("model", exact=True).click()
            kinds = {
                "radio (values)": lambda i: page.get_by_label(("capped logits", "probabilities")[i % 2]).check(),
                "radio (colour)": lambda i: page.get_by_label(("log", "linear")[i % 2], exact=True).check(),
                "dropdown (head)": lambda i: (page.get_by_label("head", exact=True).click(),
                                              page.get_by_role("option", name=f"head {1 + i % 2} (KV {(1 + i % 2) // 2})",
                                                               exact=True).click()),
                "number (layer)": lambda i: number(page, "layer", (i + 1) % 2),
            }
            for kind, act in kinds.items():
                samples = []
                for i in range(repeats + 1):
                    ms = time_change(page, "attention-plot", lambda: act(i))
                    if i:                               # the first of each kind warms its caches
                        samples.append(ms)
                records.append(summary(kind, preset, samples))
                print(f"{preset:13s} {kind:16s} p50 {records[-1]['p50_ms']:7.0f} ms  p95 {records[-1]['p95_ms']:7.0f} ms")
        # preset switch on the Mask tab: lecture <-> phoenix-nano, the mask redrawn
        page.goto(f"{url}?preset=lecture")
        wait_for_plot(page, "mask-plot", timeout=120_000)
        samples = []
        for i in range(repeats + 1):
            target = ("phoenix-nano", "lecture")[i % 2]

            def pick():
                page.get_by_label("preset", exact=True).click()
                page.get_by_role("option", name=target, exact=True).click()
            ms = time_change(page, "mask-plot", pick)
            if i:
                samples.append(ms)
        records.append(summary("preset switch", "lecture <-> phoenix-nano", samples))
        print(f"preset switch p50 {records[-1]['p50_ms']:.0f} ms  p95 {records[-1]['p95_ms']:.0f} ms")
        browser.close()
    return records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    load_before = os.getloadavg()
    with running_app() as url:
        time.sleep(10)                           # let the start-up warm-up (lecture, phoenix-nano) finish
        records = measure(url, a.repeats)
    load_after = os.getloadavg()
    date = dt.date.today().isoformat()
    out = Path(a.out or RESULTS_DIR / f"browser-latency-{date}.json")
    out.write_text(json.dumps(dict(device=device_name("cpu"), date=date, commit=git_commit(), cores=os.cpu_count(),
                                   browser="Debian chromium (headless, playwright)", repeats=a.repeats,
                                   what="input -> the plot on the page holds the new figure's data",
                                   # other processes on the machine slow every number: say how busy it was
                                   load_average_1min=dict(before=load_before[0], after=load_after[0]),
                                   records=records), indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
