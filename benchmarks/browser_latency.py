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
link opened). `--before REF` measures that commit's app too (`git archive` into a temporary folder), in the
same run and interleaved: both apps run at once on their own ports, one Chromium holds a page of each, and
every control's repeat i is timed on one page then the other, the order alternating with i (A, B then B, A),
so machine drift between minutes of a run cannot pass for a difference between versions. Each page's first
change of each kind warms its caches and is not kept. Both versions' records are in the file, each with its
version and commit. p50 / p95 / min / max go to benchmarks/results/browser-latency-<date>.json with device,
date, commit, the machine's load average and `interleaved`; scripts/readme_tables.py summarises the newest
file in the README.

The driver stays within what one visitor may ask of an app (Pace: server.shares.WORK_SHARE, GFLOP of model
views per 10 minutes): past it the server refuses the view, the page draws nothing new and only says so under
its link box. A long run (--repeats 24: ~150 phoenix-nano views within minutes) waits off the clock until the
next view fits; a refusal on the page all the same (a smaller share, a field refused) fails the run at once
with the page's words (Refused), not after the 180 s timeout.

Targets (issue 18): display change at lecture p95 < 100 ms (must: 150), model change at lecture < 250 ms,
any control at phoenix-nano < 700 ms, preset switch < 1.5 s, first Attention paint at phoenix-2026-nano < 3 s.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from explorer.controls import LABELS  # noqa: E402  (the labels the page shows, as the app builds them)
from explorer.settings import parse_settings  # noqa: E402
from explorer.views import VIEWS  # noqa: E402
from harness.localhost import launch_browser, running_app  # noqa: E402
from harness.reports import checkout, percentile, short_commit  # noqa: E402
from models.runinfo import device_name, git_commit  # noqa: E402
from server.shares import WORK_SHARE  # noqa: E402

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


# what the page says when it refuses a request instead of drawing it (a work share spent, a field out of range):
# Gradio's validation message under the event's first input, a pop-up, a control marked invalid. textContent,
# not innerText: read every frame while a change is timed, it must not lay the page out.
REFUSAL = """() => [...document.querySelectorAll('.validation-error, .toast-body, .invalid')]
    .map((e) => e.textContent.trim().slice(0, 300)).filter(Boolean).join(' / ')"""


class Refused(RuntimeError):
    """The page answered a timed change or a load with a refusal, not a figure."""


# the page's clock: the first input event after arming, and the first animation frame with a new state
# (or, instead of one, a new refusal on the page: the change then fails at once with the page's words)
ARM = """(id) => {
    window.__input = null; window.__drawn = null; window.__refused = null;
    const state = """ + PLOT_STATE + """;
    const before = state(id);
    const mark = () => { if (window.__input === null) window.__input = performance.now(); };
    for (const t of ['pointerdown', 'keydown', 'input']) document.addEventListener(t, mark, {capture: true, once: true});
    const refusal = """ + REFUSAL + """, was = refusal();
    const poll = () => {
        const now = state(id), said = refusal();
        if (now && (!before || now.length !== before.length || now.some((v, i) => v !== before[i]))) {
            window.__drawn = performance.now();
        } else if (said && said !== was) window.__refused = said;
        else requestAnimationFrame(poll);
    };
    requestAnimationFrame(poll);
}"""


class Pace:
    """What one visitor may ask of one app: server.shares.WORK_SHARE, GFLOP of model views (each estimated
    before it runs, as the server estimates it) within any window; past it the server refuses the view and the
    page draws nothing new. Every timed change and load on the Attention tab counts as a view (those the page
    draws itself too: an over-count, never an under-count); `ask` waits, off the clock, until the next fits in
    9/10 of the share (the server counts from its admission, a little after the driver's ask)."""

    def __init__(self, share: dict = WORK_SHARE, clock=time.monotonic, sleep=time.sleep):
        self.limit, self.window_s = 0.9 * share["max_bytes"], share["window_s"]
        self.asked: collections.deque = collections.deque()       # (when, GFLOP)
        self.clock, self.sleep = clock, sleep

    def ask(self, gflop: float) -> float:
        """Wait until `gflop` more fits (a view under 1 GFLOP never counts, as on the server) -> seconds waited."""
        if gflop < 1:
            return 0.0
        waited = 0.0
        while True:
            now = self.clock()
            while self.asked and self.asked[0][0] <= now - self.window_s:
                self.asked.popleft()
            if sum(g for _, g in self.asked) + gflop <= self.limit or not self.asked:
                break
            wait = self.asked[0][0] + self.window_s - now + 0.5
            print(f"  waiting {wait:.0f} s: one visitor's share of model views ({self.limit:g} of "
                  f"{self.limit / 0.9:g} GFLOP per {self.window_s:g} s) is asked for", flush=True)
            self.sleep(wait)
            waited += wait
        self.asked.append((self.clock(), gflop))
        return waited


@functools.lru_cache(maxsize=None)
def view_gflop(tab: str, preset: str) -> float:
    """The server's estimate of drawing `tab` at `preset`, in GFLOP (this tree's; a version before it costs
    the same views the same, or the pace's over-count covers it)."""
    return VIEWS[tab].estimate(parse_settings({"preset": preset})).flops / 1e9


def time_change(page, plot_id: str, act, prepare=None, timeout_ms: float = 180_000) -> tuple[float, float]:
    """(ms on the page from the input event to the plot holding different data, ms the driver waited
    from starting `act()`). `prepare()` (opening a dropdown) runs before the clock starts."""
    if prepare:
        prepare()
    page.evaluate(ARM, plot_id)
    t0 = time.perf_counter()
    act()
    page.wait_for_function("() => (window.__drawn !== null && window.__input !== null) || window.__refused !== null",
                           timeout=timeout_ms, polling="raf")
    driver = (time.perf_counter() - t0) * 1000
    refused = page.evaluate("() => window.__refused")
    if refused is not None:
        raise Refused(f"{page.url}: the page refused the change instead of drawing it: {refused}")
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


def load(page, url: str, plot_id: str) -> float:
    """Open `url` and wait for `plot_id`'s figure (or a refusal: Refused, with the page's words) -> ms on the
    page from the navigation's start to the frame that holds it."""
    page.goto(url)
    page.wait_for_function(f"""() => {{
        if (({PLOT_STATE})('{plot_id}') !== null) return (window.__painted = window.__painted || performance.now());
        return (window.__refused = ({REFUSAL})() || null);
    }}""", timeout=120_000, polling="raf")
    painted, refused = page.evaluate("() => [window.__painted || null, window.__refused || null]")
    if painted is None:
        raise Refused(f"{url}: the page refused to draw {plot_id}: {refused}")
    return painted


def first_paint(page, url: str, preset: str) -> tuple[float, float]:
    """One load of `preset`'s link on the Attention tab: (ms on the page from the navigation's start to the
    frame that holds the heatmap, ms the driver waited)."""
    t0 = time.perf_counter()
    painted = load(page, f"{url}?preset={preset}&tab=attention", "attention-plot")
    return painted, (time.perf_counter() - t0) * 1000


def interleave(paces: list[Pace], repeats: int, time_one, gflop: float) -> list[list[tuple[float, float]]]:
    """`time_one(k, i)` for each repeat i (0 to `repeats`) and page k (one per pace), A then B on even repeats,
    B then A on odd ones, each asking `gflop` of its app first (every pace asked before either page is timed: a
    wait never splits a pair) -> each page's samples, its first (the warm-up of its caches) left out."""
    samples = [[] for _ in paces]
    for i in range(repeats + 1):
        for pace in paces:
            pace.ask(gflop)
        for k in (range(len(paces)) if i % 2 == 0 else reversed(range(len(paces)))):
            ms = time_one(k, i)
            if i:
                samples[k].append(ms)
    return samples


def measure(sides: list[tuple[str, dict]], repeats: int) -> list[dict]:
    """Every control timed on each version's app at once (`sides`: (url, version), one page each), interleaved:
    each repeat times the change on one page then the other, the order alternating with the repeat, so both
    versions see the machine in the same state. -> the records, the first version's first."""
    from playwright.sync_api import sync_playwright
    records: list[list[dict]] = [[] for _ in sides]

    def record(k, r):
        records[k].append(r)
        print(f"{r['version']:6s} {r['preset']:24s} {r['control']:30s} p50 {r['p50_ms']:6.0f} ms  "
              f"p95 {r['p95_ms']:6.0f} ms  (target {r['target_p95_ms']:g}; driver p95 {r['driver_p95_ms']:6.0f})",
              flush=True)

    paces = [Pace() for _ in sides]
    interleaved = functools.partial(interleave, paces, repeats)

    with sync_playwright() as p:
        browser = launch_browser(p)
        # a context each: both apps are on 127.0.0.1, whose cookies (the app's signed browser cookie) know no port
        pages = [browser.new_context(viewport={"width": 1400, "height": 1000}).new_page() for _ in sides]
        urls, versions = [u for u, _ in sides], [v for _, v in sides]

        def open_each(query: str, plot_id: str, gflop: float) -> None:
            for page, url, pace in zip(pages, urls, paces):
                pace.ask(gflop)
                load(page, f"{url}?{query}", plot_id)

        # two query rows outlined apart from each other and from the first candidate (the default), also
        # where phoenix-nano's rows are pooled in blocks of three
        for preset, rows in (("lecture", (7, 8)), ("phoenix-nano", (1040, 1080))):
            steps = [controls(page, rows) for page in pages]
            for control, (kind, _) in steps[0].items():
                # each control from the preset's own view: an earlier series leaves its last value behind
                # (capped logits shown would send the next query-row change to the server)
                open_each(f"preset={preset}&head=0&tab=attention", "attention-plot", view_gflop("attention", preset))

                def change(k, i):
                    prepare, act = steps[k][control][1](i)
                    return time_change(pages[k], "attention-plot", act, prepare)
                samples = interleaved(change, view_gflop("attention", preset))
                for k, got in enumerate(samples):
                    record(k, summary(control, kind, preset, got, versions[k]))
        # preset switch on the Mask tab: lecture <-> phoenix-nano, the mask redrawn
        open_each("preset=lecture", "mask-plot", view_gflop("mask", "lecture"))

        def switch(k, i):
            prepare, pick = option(pages[k], "preset", ("phoenix-nano", "lecture")[i % 2])
            return time_change(pages[k], "mask-plot", pick, prepare)
        for k, got in enumerate(interleaved(switch, view_gflop("mask", "phoenix-nano"))):
            record(k, summary("preset switch", "preset", "lecture <-> phoenix-nano", got, versions[k]))
        cold = [None] * len(sides)

        def paint(k, i):
            ms = first_paint(pages[k], urls[k], "phoenix-2026-nano")
            cold[k] = cold[k] if i else ms[0]          # the first load of each is its cold one
            return ms
        for k, got in enumerate(interleaved(paint, view_gflop("attention", "phoenix-2026-nano"))):
            record(k, {**summary("first Attention paint (link opened)", "preset", "phoenix-2026-nano", got,
                                 versions[k]), "cold_ms": cold[k]})
        browser.close()
    return [r for rs in records for r in rs]


def measure_versions(versions: list[tuple[dict, Path]], repeats: int) -> tuple[list[dict], dict]:
    """Each (version, root)'s app started at once, on its own port, and measured interleaved (measure)."""
    load_before = os.getloadavg()[0]
    with contextlib.ExitStack() as apps:
        urls = [apps.enter_context(running_app(root=root)) for _, root in versions]
        time.sleep(10)                           # let the start-up warm-up (lecture, phoenix-nano) finish
        records = measure([(url, version) for url, (version, _) in zip(urls, versions)], repeats)
    return records, dict(before=load_before, after=os.getloadavg()[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--before", default=None, help="a commit to measure beside this tree, interleaved, in the same run (e.g. 1b1412f)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        versions = []
        if a.before:
            commit = short_commit(a.before)
            versions.append((dict(version="before", version_commit=commit), stack.enter_context(checkout(a.before))))
        versions.append((dict(version="after" if a.before else "this", version_commit=git_commit()), ROOT))
        records, load = measure_versions(versions, a.repeats)
    date = dt.date.today().isoformat()
    out = Path(a.out or RESULTS_DIR / f"browser-latency-{date}.json")
    out.write_text(json.dumps(dict(device=device_name("cpu"), date=date, commit=git_commit(), cores=os.cpu_count(),
                                   browser="Debian chromium (headless, playwright)", repeats=a.repeats,
                                   what="input event -> the plot on the page holds the new figure's data (the page's clock; checked each frame "
                                        "by reference, no copy of the data); "
                                        "driver_*: from the driver's action, its own checks included",
                                   # other processes on the machine slow every number: say how busy it was
                                   load_average_1min=load,      # the versions are measured at once: one span
                                   interleaved=len(versions) > 1,
                                   records=records), indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
