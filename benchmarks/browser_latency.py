"""Browser latency: what a lecturer waits for in Chromium, from an input to the new figure drawn.

    python -m benchmarks.browser_latency [--repeats 12]

Headless Debian chromium (playwright, never a downloaded browser) drives the app on localhost. For each
kind of control it times the input (a click, a number typed and Enter, a dropdown pick, a preset
switch) until the plot on the page holds different data — the whole path: the event, validation,
the model's recorded forward (cached or not), the figure's JSON, and plotly drawing it. The clock is
the page's own (performance.now): from the visitor's input event (the pointerdown on a radio or a
dropdown's option, the first keystroke in a number box) to the animation frame that finds the new
figure; the driver's own time (playwright's actionability checks, ~50-300 ms per action, opening a
dropdown included) is kept beside it as driver_*_ms. p50 / p95 / min /
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

from explorer.localhost import launch_browser, running_app, wait_for_plot  # noqa: E402
from models.runinfo import device_name, git_commit, percentile  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
TARGETS_MS = {"lecture": 300.0, "phoenix-nano": 1500.0, "preset switch": 2000.0}
# the data of the first trace of a plot, as sent (changes whenever the figure does)
PLOT_DATA = """(id) => {
    const gd = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!gd || !gd.data || !gd.data.length) return null;
    return JSON.stringify([gd.layout && gd.layout.title && gd.layout.title.text, gd.data[0].z, gd.data[0].x]);
}"""


# the page's clock: the first input event after arming, and the first animation frame with new data
ARM = """([id, before]) => {
    window.__input = null; window.__drawn = null;
    const mark = () => { if (window.__input === null) window.__input = performance.now(); };
    for (const t of ['pointerdown', 'keydown', 'input']) document.addEventListener(t, mark, {capture: true, once: true});
    const poll = () => { if ((""" + PLOT_DATA + """)(id) !== before) window.__drawn = performance.now();
                         else requestAnimationFrame(poll); };
    requestAnimationFrame(poll);
}"""


def time_change(page, plot_id: str, act, prepare=None, timeout_ms: float = 60_000) -> tuple[float, float]:
    """(ms on the page from the input event to the plot holding different data, ms the driver waited
    from starting `act()`). `prepare()` (opening a dropdown) runs before the clock starts."""
    before = page.evaluate(PLOT_DATA, plot_id)
    if prepare:
        prepare()
    page.evaluate(ARM, [plot_id, before])
    t0 = time.perf_counter()
    act()
    page.wait_for_function("() => window.__drawn !== null && window.__input !== null", timeout=timeout_ms,
                           polling="raf")
    driver = (time.perf_counter() - t0) * 1000
    return page.evaluate("() => window.__drawn - window.__input"), driver


def number(page, label: str, value) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Enter")


def summary(kind: str, preset: str, samples: list[tuple[float, float]]) -> dict:
    target = TARGETS_MS["preset switch" if kind == "preset switch" else preset]
    page_ms, driver_ms = [p for p, _ in samples], [d for _, d in samples]
    return dict(control=kind, preset=preset, n=len(samples), p50_ms=percentile(page_ms, 50),
                p95_ms=percentile(page_ms, 95), min_ms=min(page_ms), max_ms=max(page_ms),
                mean_ms=statistics.fmean(page_ms), target_p95_ms=target,
                driver_p50_ms=percentile(driver_ms, 50), driver_p95_ms=percentile(driver_ms, 95))


def option(page, label: str, name: str):
    """(open the dropdown, pick `name`): the pick is the input timed."""
    return (lambda: (page.get_by_label(label, exact=True).click(),
                     page.get_by_role("option", name=name, exact=True).wait_for()),
            lambda: page.get_by_role("option", name=name, exact=True).click())


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
                "radio (values)": lambda i: (None, lambda: page.get_by_label(("capped logits", "probabilities")[i % 2]).check()),
                "radio (colour)": lambda i: (None, lambda: page.get_by_label(("log", "linear")[i % 2], exact=True).check()),
                "dropdown (head)": lambda i: option(page, "head", f"head {1 + i % 2} (KV {(1 + i % 2) // 2})"),
                "number (layer)": lambda i: (None, lambda: number(page, "layer", (i + 1) % 2)),
            }
            for kind, steps in kinds.items():
                samples = []
                for i in range(repeats + 1):
                    prepare, act = steps(i)
                    ms = time_change(page, "attention-plot", act, prepare)
                    if i:                               # the first of each kind warms its caches
                        samples.append(ms)
                records.append(summary(kind, preset, samples))
                r = records[-1]
                print(f"{preset:13s} {kind:16s} p50 {r['p50_ms']:6.0f} ms  p95 {r['p95_ms']:6.0f} ms  "
                      f"(driver p50 {r['driver_p50_ms']:6.0f}  p95 {r['driver_p95_ms']:6.0f})")
        # preset switch on the Mask tab: lecture <-> phoenix-nano, the mask redrawn
        page.goto(f"{url}?preset=lecture")
        wait_for_plot(page, "mask-plot", timeout=120_000)
        samples = []
        for i in range(repeats + 1):
            prepare, pick = option(page, "preset", ("phoenix-nano", "lecture")[i % 2])
            ms = time_change(page, "mask-plot", pick, prepare)
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
                                   what="input event -> the plot on the page holds the new figure's data (the page's clock); "
                                        "driver_*: from the driver's action, its own checks included",
                                   # other processes on the machine slow every number: say how busy it was
                                   load_average_1min=dict(before=load_before[0], after=load_after[0]),
                                   records=records), indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
