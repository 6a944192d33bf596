"""Browser latency: what a lecturer waits for in Chromium, from an input to the new figure drawn.

    python -m benchmarks.browser_latency [--repeats 12] [--before 1b1412f]

Headless Debian chromium (playwright, never a downloaded browser) drives the app on localhost. For each
control it times the input (a click, a number typed and Enter, a dropdown pick, a preset switch) until
the plot on the page holds different data or outline — the whole path: the event, validation, the model's
recorded forward (cached or not), the figure's JSON, and plotly drawing it; or, for a display change the
page draws itself, only that. The clock is the page's own (performance.now): from the visitor's input
event (the pointerdown on a radio or a dropdown's option, the first keystroke in a number box) to the
animation frame that finds the new figure (the plot's data, shapes and title compared by reference, so the
check costs the page nothing it measures); the driver's own time (playwright's checks, opening a dropdown
included) is kept beside it as driver_*_ms. The first Attention paint of phoenix-2026-nano is timed from
the navigation's start (a link opened) to the frame with the heatmap.

Each record names its control kind: "display" (what is shown of the same forward: colour, values, head,
layer, query row), "model" (the model's inputs or weights: seed) or "preset" (a preset switch, a preset's
link opened). `--before REF` measures that commit's app too (`git archive` into a temporary folder), in
the same run, first: both versions' records are in the file, each with its version and commit. p50 /
p95 / min / max go to benchmarks/results/browser-latency-<date>.json with device, date, commit and the
machine's load average; scripts/readme_tables.py summarises the newest file in the README.
Targets (issue 18): display change at lecture p95 < 100 ms (must: 150), model change at lecture < 250 ms,
any control at phoenix-nano < 700 ms, preset switch < 1.5 s, first Attention paint at phoenix-2026-nano < 3 s.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from explorer.controls import LABELS  # noqa: E402  (the labels the page shows, as the app builds them)
from harness.localhost import launch_browser, running_app, wait_for_plot  # noqa: E402
from harness.reports import checkout, percentile  # noqa: E402
from models.runinfo import device_name, git_commit  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
TARGETS_MS = {("display", "lecture"): 100.0, ("model", "lecture"): 250.0, ("display", "phoenix-nano"): 700.0,
              ("model", "phoenix-nano"): 700.0, ("preset", "lecture <-> phoenix-nano"): 1500.0,
              ("preset", "phoenix-2026-nano"): 3000.0}
MUST_MS = {("display", "lecture"): 150.0}
# a plot's state as the references plotly keeps (the element, its data array, each trace's x / y / z and
# visibility, the shapes, the title): any redraw, the server's or the page's own, replaces one of them. No
# copy of the data: this runs in every animation frame while the change is timed, and serialising a
# phoenix-nano heatmap there (~1 MB) took the page's main thread from the very redraw it timed.
PLOT_STATE = """(id) => {
    const gd = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!gd || !gd.data || !gd.data.length) return null;
    return [gd, gd.data, gd.layout && gd.layout.shapes, gd.layout && gd.layout.title && gd.layout.title.text,
            ...gd.data.flatMap((t) => [t.x, t.y, t.z, t.visible])];
}"""


# the page's clock: the first input event after arming, and the first animation frame with a new state
ARM = """(id) => {
    window.__input = null; window.__drawn = null;
    const state = """ + PLOT_STATE + """;
    const before = state(id);
    const mark = () => { if (window.__input === null) window.__input = performance.now(); };
    for (const t of ['pointerdown', 'keydown', 'input']) document.addEventListener(t, mark, {capture: true, once: true});
    const poll = () => {
        const now = state(id);
        if (now && (!before || now.length !== before.length || now.some((v, i) => v !== before[i]))) {
            window.__drawn = performance.now();
        } else requestAnimationFrame(poll);
    };
    requestAnimationFrame(poll);
}"""


def time_change(page, plot_id: str, act, prepare=None, timeout_ms: float = 180_000) -> tuple[float, float]:
    """(ms on the page from the input event to the plot holding different data, ms the driver waited
    from starting `act()`). `prepare()` (opening a dropdown) runs before the clock starts."""
    if prepare:
        prepare()
    page.evaluate(ARM, plot_id)
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


def summary(control: str, kind: str, preset: str, samples: list[tuple[float, float]], version: dict) -> dict:
    key = (kind, preset)
    page_ms, driver_ms = [p for p, _ in samples], [d for _, d in samples]
    return dict(control=control, control_kind=kind, preset=preset, n=len(samples), p50_ms=percentile(page_ms, 50),
                p95_ms=percentile(page_ms, 95), min_ms=min(page_ms), max_ms=max(page_ms),
                mean_ms=statistics.fmean(page_ms), target_p95_ms=TARGETS_MS[key],
                **({"must_p95_ms": MUST_MS[key]} if key in MUST_MS else {}),
                driver_p50_ms=percentile(driver_ms, 50), driver_p95_ms=percentile(driver_ms, 95), **version)


def option(page, label: str, name: str):
    """(open the dropdown, pick `name`): the pick is the input timed."""
    return (lambda: (page.get_by_label(label, exact=True).click(),
                     page.get_by_role("option", name=name, exact=True).wait_for()),
            lambda: page.get_by_role("option", name=name, exact=True).click())


def controls(page, rows: tuple[int, int]) -> dict:
    """control -> (kind, step i -> (prepare, act)): every change alternates between two values."""
    return {
        "radio (colour)": ("display", lambda i: (None, lambda: page.get_by_label(("log", "linear")[i % 2], exact=True).check())),
        "radio (values)": ("display", lambda i: (None, lambda: page.get_by_label(("capped logits", "probabilities")[i % 2]).check())),
        "dropdown (head)": ("display", lambda i: option(page, LABELS["head"], f"head {1 + i % 2} (KV {(1 + i % 2) // 2})")),
        "number (layer)": ("display", lambda i: (None, lambda: number(page, LABELS["layer"], (i + 1) % 2))),
        "number (query row)": ("display", lambda i: (None, lambda: number(page, LABELS["query"], rows[i % 2]))),
        "number (seed)": ("model", lambda i: (None, lambda: number(page, LABELS["seed"], 100 + i))),
    }


def first_paint(page, url: str, preset: str, repeats: int) -> tuple[float, list[tuple[float, float]]]:
    """(the cold first load, then `repeats` loads) of `preset`'s link on the Attention tab: ms from the
    navigation's start to the frame that holds the heatmap."""
    samples = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        page.goto(f"{url}?preset={preset}&tab=attention")
        page.wait_for_function(f"""() => ({PLOT_STATE})('attention-plot') !== null
                                   && (window.__painted = window.__painted || performance.now())""",
                               timeout=120_000, polling="raf")
        samples.append((page.evaluate("() => window.__painted"), (time.perf_counter() - t0) * 1000))
    return samples[0][0], samples[1:]


def measure(url: str, repeats: int, version: dict) -> list[dict]:
    from playwright.sync_api import sync_playwright
    records = []

    def record(r):
        records.append(r)
        print(f"{version['version']:6s} {r['preset']:24s} {r['control']:30s} p50 {r['p50_ms']:6.0f} ms  "
              f"p95 {r['p95_ms']:6.0f} ms  (target {r['target_p95_ms']:g}; driver p95 {r['driver_p95_ms']:6.0f})",
              flush=True)

    with sync_playwright() as p:
        browser = launch_browser(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        # two query rows outlined apart from each other and from the first candidate (the default), also
        # where phoenix-nano's rows are pooled in blocks of three
        for preset, rows in (("lecture", (7, 8)), ("phoenix-nano", (1040, 1080))):
            for control, (kind, steps) in controls(page, rows).items():
                # each control from the preset's own view: an earlier series leaves its last value behind
                # (capped logits shown would send the next query-row change to the server)
                page.goto(f"{url}?preset={preset}&head=0&tab=attention")
                wait_for_plot(page, "attention-plot", timeout=120_000)
                page.wait_for_function(f"() => ({PLOT_STATE})('attention-plot') !== null", timeout=120_000)
                samples = []
                for i in range(repeats + 1):
                    prepare, act = steps(i)
                    ms = time_change(page, "attention-plot", act, prepare)
                    if i:                               # the first of each kind warms its caches
                        samples.append(ms)
                record(summary(control, kind, preset, samples, version))
        # preset switch on the Mask tab: lecture <-> phoenix-nano, the mask redrawn
        page.goto(f"{url}?preset=lecture")
        wait_for_plot(page, "mask-plot", timeout=120_000)
        samples = []
        for i in range(repeats + 1):
            prepare, pick = option(page, "preset", ("phoenix-nano", "lecture")[i % 2])
            ms = time_change(page, "mask-plot", pick, prepare)
            if i:
                samples.append(ms)
        record(summary("preset switch", "preset", "lecture <-> phoenix-nano", samples, version))
        cold, samples = first_paint(page, url, "phoenix-2026-nano", repeats)
        record({**summary("first Attention paint (link opened)", "preset", "phoenix-2026-nano", samples, version),
                "cold_ms": cold})
        browser.close()
    return records


def measure_version(name: str, root: Path, commit: str, repeats: int) -> tuple[list[dict], dict]:
    load_before = os.getloadavg()[0]
    with running_app(root=root) as url:
        time.sleep(10)                           # let the start-up warm-up (lecture, phoenix-nano) finish
        records = measure(url, repeats, dict(version=name, version_commit=commit))
    return records, dict(before=load_before, after=os.getloadavg()[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--before", default=None, help="a commit to measure first, in the same run (e.g. 1b1412f)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    records, load = [], {}
    if a.before:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.before], check=True,
                                capture_output=True, text=True).stdout.strip()
        with checkout(a.before) as root:
            got, load["before_version"] = measure_version("before", root, commit, a.repeats)
            records += got
    got, load["this_version"] = measure_version("after" if a.before else "this", ROOT, git_commit(), a.repeats)
    records += got
    date = dt.date.today().isoformat()
    out = Path(a.out or RESULTS_DIR / f"browser-latency-{date}.json")
    out.write_text(json.dumps(dict(device=device_name("cpu"), date=date, commit=git_commit(), cores=os.cpu_count(),
                                   browser="Debian chromium (headless, playwright)", repeats=a.repeats,
                                   what="input event -> the plot on the page holds the new figure's data (the page's clock; checked each frame "
                                        "by reference, no copy of the data); "
                                        "driver_*: from the driver's action, its own checks included",
                                   # other processes on the machine slow every number: say how busy it was
                                   load_average_1min=dict(before=min(v["before"] for v in load.values()),
                                                          after=max(v["after"] for v in load.values())),
                                   load_average_1min_per_version=load,
                                   records=records), indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
