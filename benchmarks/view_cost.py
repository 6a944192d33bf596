"""Server cost of a redraw: a view's own work and the JSON of every figure it returns (what Gradio sends),
the forward pass cached, on this machine's CPU. What every visitor's display change costs the server.

    python -m benchmarks.view_cost [--repeats 5] [--before REF]

Each repeat runs every case in a fresh process (`--inner` calls each, their median kept); with `--before REF`
that commit's code (`git archive` into a temporary folder) runs too, the two versions interleaved repeat by
repeat. min / median / max over the repeats go to benchmarks/results/view-cost-<date>.json with device,
date, commit and the machine's load average.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.reports import checkout  # noqa: E402
from models.runinfo import RESULTS_DIR, device_name, git_commit  # noqa: E402

# case -> (link, view function in explorer.views)
CASES = {"lecture attention, one head": ("preset=lecture&head=0", "attention_view"),
         "lecture attention, every head": ("preset=lecture", "attention_view"),
         "lecture mask": ("preset=lecture", "mask_view"),
         "lecture anatomy": ("preset=lecture&head=0", "anatomy_view"),
         "phoenix-nano attention, every head": ("preset=phoenix-nano", "attention_view"),
         "phoenix-nano attention, one head": ("preset=phoenix-nano&head=0", "attention_view"),
         "phoenix-nano mask": ("preset=phoenix-nano", "mask_view")}

# run in the version's own folder: ms per redraw (median of `inner` calls) for each case
ONE_REPEAT = """
import json, statistics, sys, time
from explorer import views
try:
    from explorer.query_string import parse_query
except ImportError:                                   # a --before version older than explorer.query_string
    from explorer.settings import parse_query
cases, inner = json.loads(sys.argv[1]), int(sys.argv[2])
out = {}
for name, (link, view) in cases.items():
    s, fn = parse_query(link), getattr(views, view)
    for o in fn(s):                                   # the forward pass and first-call work, not timed
        getattr(o, "to_json", lambda: None)()
    times = []
    for _ in range(inner):
        t = time.perf_counter()
        for o in fn(s):
            if hasattr(o, "to_json"):
                o.to_json()
        times.append((time.perf_counter() - t) * 1000)
    out[name] = statistics.median(times)
print(json.dumps(out))
"""


def one_repeat(root: Path, inner: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", ONE_REPEAT, json.dumps(CASES), str(inner)], cwd=root, env=env,
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--inner", type=int, default=20, help="calls per case in each repeat (their median kept)")
    ap.add_argument("--before", default=None, help="a commit to measure too, interleaved (e.g. d86b89e)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    versions = {"this" if not a.before else "after": (ROOT, git_commit())}
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {v: [] for v in versions}
    with (checkout(a.before) if a.before else contextlib.nullcontext()) as before_root:
        if a.before:
            commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.before], check=True,
                                    capture_output=True, text=True).stdout.strip()
            versions = {"before": (before_root, commit), **versions}
            runs = {"before": [], **runs}
        for i in range(a.repeats):
            for name, (root, _) in versions.items():
                runs[name].append(one_repeat(root, a.inner))
                shown = ", ".join(f"{k} {v:.1f}" for k, v in runs[name][-1].items())
                print(f"repeat {i + 1}/{a.repeats} {name}: {shown}", flush=True)
    records = []
    for name, (_, commit) in versions.items():
        for case, (link, view) in CASES.items():
            ms = [r[case] for r in runs[name]]
            records.append(dict(version=name, version_commit=commit, case=case, link=link, view=view,
                                n=len(ms), min_ms=min(ms), median_ms=statistics.median(ms), max_ms=max(ms)))
    date = dt.date.today().isoformat()
    out = Path(a.out or RESULTS_DIR / f"view-cost-{date}.json")
    out.write_text(json.dumps(dict(device=device_name("cpu"), date=date, commit=git_commit(), cores=os.cpu_count(),
                                   repeats=a.repeats, inner=a.inner,
                                   what="ms per redraw, the forward cached: the view function and to_json() of every "
                                        "figure it returns; per repeat the median of `inner` calls in a fresh process, "
                                        "versions interleaved repeat by repeat; min / median / max over repeats",
                                   load_average_1min=dict(before=load_before, after=os.getloadavg()[0]),
                                   records=records), indent=1) + "\n")
    for r in records:
        print(f"{r['version']:6s} {r['case']:36s} min {r['min_ms']:7.1f}  median {r['median_ms']:7.1f}  "
              f"max {r['max_ms']:7.1f} ms")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
