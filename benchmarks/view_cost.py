"""Server cost of a redraw: a view's own work and the JSON of every figure it returns (what Gradio sends),
the forward pass cached, on this machine's CPU. What every visitor's display change costs the server.

    python -m benchmarks.view_cost [--repeats 5] [--before REF]
    python -m benchmarks.view_cost --production [--device cuda] [--presets phoenix-prod] [--repeats 5]
                                    [--before REF [--before-dir DIR]] [--budget-s 120] [--out-dir DIR]

Each repeat runs every case in a fresh process (`--inner` calls each, their median kept); with `--before REF`
that commit's code (`git archive` into a temporary folder) runs too, the two versions interleaved repeat by
repeat. min / median / max over the repeats go to benchmarks/results/view-cost-<date>.json with device,
date, commit and the machine's load average. Where there is no git history (a GPU machine's copy of the tree),
`--before-dir DIR` runs the files of REF unpacked there beforehand (`git archive REF | tar -x -C DIR`).

`--production`: every view function at phoenix-prod and phoenix-2026 (the GPU's limits, explorer.limits.limits_of,
so a CPU runs them too), one fresh process per preset and repeat, split into phases: the model's build (its
seeded weights), the recorded forward, then each view's first call and its warm calls (`--inner`, median),
each split again into the time spent in model forwards, in model builds, and the rest — the server's own
work (figures, pooling, JSON), which a GPU does not speed up. Wall time and the process's CPU time (one
torch thread, as the server runs) are both kept: on a shared machine the CPU time is what the work costs.
Every case's output is hashed (sha256 of its figures' JSON and its text), so a before/after run says
whether the two versions drew the same bytes. To view-cost-production-<device>-<date>.json, rewritten after
each repeat; `--budget-s` starts no repeat the longest so far says would end past it (benchmarks/gpu_session.sh).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.reports import checkout, short_commit  # noqa: E402
from models.runinfo import RESULTS_DIR, cpu_model, device_name, git_commit  # noqa: E402

# case -> (link, view function in explorer.views)
CASES = {"lecture attention, one head": ("preset=lecture&head=0", "attention_view"),
         "lecture attention, every head": ("preset=lecture", "attention_view"),
         "lecture mask": ("preset=lecture", "mask_view"),
         "lecture anatomy": ("preset=lecture&head=0", "anatomy_view"),
         "phoenix-nano attention, every head": ("preset=phoenix-nano", "attention_view"),
         "phoenix-nano attention, one head": ("preset=phoenix-nano&head=0", "attention_view"),
         "phoenix-nano mask": ("preset=phoenix-nano", "mask_view")}

# --production: every view function, in the order a visitor meets them (the default tab first), at each
# production preset; the attention view as the link opens it (every head) and with one head picked
PRODUCTION_PRESETS = ("phoenix-prod", "phoenix-2026")
PRODUCTION_VIEWS = (("attention, every head", "", "attention_view"),
                    ("attention, one head", "&head=0", "attention_view"), ("anatomy", "", "anatomy_view"), ("mask", "", "mask_view"), ("kernels", "", "kernel_view"),
                    ("isolation", "", "isolation_view"), ("invariance", "", "invariance_view"),
                    ("rope", "", "rope_view"), ("variant", "", "variant_view"), ("bug zoo", "", "bug_zoo_view"))

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
    times, cpu = [], []
    for _ in range(inner):
        t, c = time.perf_counter(), time.process_time()
        for o in fn(s):
            if hasattr(o, "to_json"):
                o.to_json()
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    out[name] = [statistics.median(times), statistics.median(cpu)]
print(json.dumps(out))
"""

# run in the version's own folder, one production preset: each phase's wall and CPU ms, forwards and
# builds inside each call timed apart (a CUDA call synchronised at each edge), and each case's sha256
ONE_PRODUCTION = """
import hashlib, json, statistics, sys, time
t_start = time.perf_counter()
import torch
torch.set_num_threads(1)                              # as the server (server.memory.configure_threads)
from explorer import limits, runs, views
try:
    from explorer.query_string import parse_query
except ImportError:                                   # a --before version older than explorer.query_string
    from explorer.links import parse_query
imported_ms = (time.perf_counter() - t_start) * 1000
preset, cases, inner = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
cuda = torch.cuda.is_available()

def sync():
    if cuda:
        torch.cuda.synchronize()

spent = {"forward": 0.0, "build": 0.0}
depth = {"forward": 0, "build": 0}

def timed(kind, fn):
    def wrapper(*args, **kwargs):
        if depth[kind]:
            return fn(*args, **kwargs)
        depth[kind] += 1
        sync()
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sync()
            spent[kind] += time.perf_counter() - t
            depth[kind] -= 1
    return wrapper

torch.nn.Module.__call__ = timed("forward", torch.nn.Module.__call__)     # every model forward, outermost
runs.build_model = timed("build", runs.build_model)                     # models and their weights

def measure(fn, drawn=True):
    spent.update(forward=0.0, build=0.0)
    sync()
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    texts = [o.to_json() if hasattr(o, "to_json") else str(o) for o in out] if drawn else []
    sync()
    wall, cpu = (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000
    return dict(wall_ms=wall, cpu_ms=cpu, forward_ms=spent["forward"] * 1000, build_ms=spent["build"] * 1000,
                rest_ms=wall - 1000 * (spent["forward"] + spent["build"])), texts

if hasattr(limits, "limits_of"):
    gpu_limits = limits.limits_of("cuda")
else:                                                 # a --before version without limits_of: the same limits
    import contextlib
    limits.max_params, limits.max_trace_bytes = lambda: limits.GPU_MAX_PARAMS, lambda: limits.GPU_MAX_TRACE_BYTES
    limits.max_request_flops = lambda: limits.GPU_MAX_REQUEST_FLOPS
    gpu_limits = contextlib.nullcontext()
out = {"import_ms": imported_ms, "cases": {}}
with gpu_limits:
    base = parse_query("preset=" + preset)
    out["build"], _ = measure(lambda: runs.build_model(base), drawn=False)
    out["forward"], _ = measure(lambda: runs.forward(base), drawn=False)
    for name, (link, view) in cases.items():
        s, fn = parse_query(link), getattr(views, view)
        first, texts = measure(lambda: fn(s))
        warm = [measure(lambda: fn(s))[0] for _ in range(inner)]
        out["cases"][name] = dict(first=first, warm={k: statistics.median(w[k] for w in warm) for k in first},
                                  sha256=hashlib.sha256("\\n".join(texts).encode()).hexdigest())
print(json.dumps(out))
"""


def version_env(root: Path) -> dict[str, str]:
    """The environment a version runs in: its own files first on the path, then whatever the path held (a GPU
    machine's parked packages)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}


def one_repeat(root: Path, inner: int) -> dict[str, float]:
    env = version_env(root)
    done = subprocess.run([sys.executable, "-c", ONE_REPEAT, json.dumps(CASES), str(inner)], cwd=root, env=env,
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def production_cases(preset: str) -> dict[str, tuple[str, str]]:
    return {f"{preset} {name}": (f"preset={preset}{extra}", view) for name, extra, view in PRODUCTION_VIEWS}


def one_production(root: Path, preset: str, inner: int, device: str) -> dict:
    env = version_env(root)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""              # the models on the CPU even where a GPU is
    done = subprocess.run([sys.executable, "-c", ONE_PRODUCTION, preset, json.dumps(production_cases(preset)),
                           str(inner)], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{preset} at {root}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict:
    return dict(min=min(values), median=statistics.median(values), max=max(values))


def production_records(name: str, commit: str, runs: list[dict], presets: tuple[str, ...]) -> list[dict]:
    """One record per phase and case of one version: min / median / max over the repeats of each measure;
    `cold_ms` (medians) is what the case's first call costs in a fresh process: the model's build and the
    recorded forward (for views of the model), then the call."""
    records = []
    for preset in presets:
        done = [r[preset] for r in runs]
        phases = {k: {m: spread([d[k][m] for d in done]) for m in done[0][k]} for k in ("build", "forward")}
        for phase, measures in phases.items():
            records.append(dict(version=name, version_commit=commit, case=f"{preset} {phase}", **measures))
        for case, (link, view) in production_cases(preset).items():
            got = [d["cases"][case] for d in done]
            first = {m: spread([g["first"][m] for g in got]) for m in got[0]["first"]}
            warm = {m: spread([g["warm"][m] for g in got]) for m in got[0]["warm"]}
            model_view = view not in ("mask_view", "kernel_view", "rope_view", "variant_view")
            cold = first["wall_ms"]["median"] + (phases["build"]["wall_ms"]["median"]
                                                 + phases["forward"]["wall_ms"]["median"] if model_view else 0.0)
            records.append(dict(version=name, version_commit=commit, case=case, link=link, view=view, n=len(got),
                                first=first, warm=warm, cold_ms=cold, sha256=sorted({g["sha256"] for g in got})))
    return records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--inner", type=int, default=None,
                    help="calls per case in each repeat (their median kept); default 20, --production 3")
    ap.add_argument("--before", default=None, help="a commit to measure too, interleaved (e.g. d86b89e)")
    ap.add_argument("--before-dir", default=None, help="where --before's files are already unpacked (no git here)")
    ap.add_argument("--production", action="store_true",
                    help="every view at phoenix-prod and phoenix-2026, cold and warm, forwards timed apart")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="where --production runs the models (default: cuda where there is one)")
    ap.add_argument("--presets", default=None,
                    help=f"--production's presets, comma-separated (default {','.join(PRODUCTION_PRESETS)})")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no repeat that the longest so far says would end past this many seconds (one runs)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--out-dir", default=None, help="where the results file goes under its own name (default "
                                                    "benchmarks/results)")
    a = ap.parse_args(argv)
    import torch
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    if a.before_dir and not a.before:
        ap.error("--before-dir: name its commit with --before")
    inner = a.inner or (3 if a.production else 20)
    presets = tuple(a.presets.split(",")) if a.presets else PRODUCTION_PRESETS
    versions = {"this" if not a.before else "after": (ROOT, git_commit())}
    load_before, start = os.getloadavg()[0], time.monotonic()
    runs: dict[str, list[dict]] = {v: [] for v in versions}
    unpacked = contextlib.nullcontext(Path(a.before_dir).resolve()) if a.before_dir else None
    with (unpacked or (checkout(a.before) if a.before else contextlib.nullcontext())) as before_root:
        if a.before:
            commit = a.before if a.before_dir else short_commit(a.before)
            versions = {"before": (before_root, commit), **versions}
            runs = {"before": [], **runs}
        longest = 0.0
        for i in range(a.repeats):
            elapsed = time.monotonic() - start
            if i and a.budget_s is not None and elapsed + longest > a.budget_s:
                print(f"budget: {i} of {a.repeats} repeats in {elapsed:.0f} s; another would pass {a.budget_s:.0f} s",
                      flush=True)
                break
            for name, (root, _) in versions.items():
                if a.production:
                    runs[name].append({p: one_production(root, p, inner, device) for p in presets})
                    shown = ", ".join(f"{c} {r['first']['wall_ms']:.0f}/{r['warm']['wall_ms']:.0f}"
                                      for p in presets for c, r in runs[name][-1][p]["cases"].items())
                else:
                    runs[name].append(one_repeat(root, inner))
                    shown = ", ".join(f"{k} {wall:.1f} (cpu {cpu:.1f})" for k, (wall, cpu) in runs[name][-1].items())
                print(f"repeat {i + 1}/{a.repeats} {name}: {shown}", flush=True)
            longest = max(longest, time.monotonic() - start - elapsed)
            out, records = write_results(a, versions, runs, presets, device, inner, load_before)   # as it goes
    for r in records:
        if "min_ms" in r:
            print(f"{r['version']:6s} {r['case']:36s} min {r['min_ms']:7.1f}  median {r['median_ms']:7.1f}  "
                  f"max {r['max_ms']:7.1f} ms  (cpu median {r['cpu_ms']['median']:7.1f})")
        elif "first" in r:
            print(f"{r['version']:6s} {r['case']:36s} first {r['first']['wall_ms']['median']:8.1f} "
                  f"(rest {r['first']['rest_ms']['median']:7.1f}, cpu {r['first']['cpu_ms']['median']:7.1f})  "
                  f"warm {r['warm']['wall_ms']['median']:7.1f} (rest {r['warm']['rest_ms']['median']:7.1f}, "
                  f"cpu {r['warm']['cpu_ms']['median']:7.1f})  cold {r['cold_ms']:8.1f} ms"
                  + ("" if r.get("same_output_as_other_version", True) else "  OUTPUT DIFFERS"))
        else:
            print(f"{r['version']:6s} {r['case']:36s} wall {r['wall_ms']['median']:8.1f}  "
                  f"cpu {r['cpu_ms']['median']:8.1f} ms")
    print(f"wrote {out}")


def write_results(a, versions: dict, runs: dict, presets: tuple, device: str, inner: int,
                  load_before: float) -> tuple[Path, list[dict]]:
    """The results file of the repeats run so far (written after each, so a run stopped early keeps them)."""
    date = dt.date.today().isoformat()
    if a.production:
        records = [r for name, (_, commit) in versions.items()
                   for r in production_records(name, commit, runs[name], presets)]
        if a.before:
            for r in records:
                if "sha256" in r:
                    twin = next(o for o in records if o["case"] == r["case"] and o["version"] != r["version"])
                    r["same_output_as_other_version"] = r["sha256"] == twin["sha256"]
        slug = re.sub(r"[^a-z0-9]+", "-", (device_name("cuda") if device == "cuda" else cpu_model()).lower()).strip("-")
        name = f"view-cost-production-{slug}-{date}.json"
        what = ("per production preset, one fresh process per repeat and version (versions interleaved): the model's "
                "build and the recorded forward, then each view function's first call and the median of `inner` "
                "warm calls, each with its figures' to_json(); wall and process CPU ms (1 torch thread), and inside "
                "each call the ms in model forwards and model builds (CUDA synchronised at each edge) and the rest; "
                "min / median / max over repeats; cold_ms = build + forward + first call (medians) for views of the "
                "model; sha256 of each case's output")
        device_label = device_name(device) if device == "cuda" else f"CPU {cpu_model()} (1 thread)"
    else:
        records = []
        for version, (_, commit) in versions.items():
            for case, (link, view) in CASES.items():
                ms, cpu = [r[case][0] for r in runs[version]], [r[case][1] for r in runs[version]]
                records.append(dict(version=version, version_commit=commit, case=case, link=link, view=view,
                                    n=len(ms), min_ms=min(ms), median_ms=statistics.median(ms), max_ms=max(ms),
                                    cpu_ms=spread(cpu)))
        name = f"view-cost-{date}.json"
        what = ("ms per redraw, the forward cached: the view function and to_json() of every figure it returns; per "
                "repeat the median of `inner` calls in a fresh process, versions interleaved repeat by repeat; min / "
                "median / max over repeats of the wall time (min_ms ...) and of the process's CPU time (cpu_ms)")
        device_label = device_name("cpu")
    out = Path(a.out or Path(a.out_dir or RESULTS_DIR) / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(device=device_label, date=date, commit=git_commit(), cores=os.cpu_count(),
                                   repeats=len(next(iter(runs.values()))), inner=inner, what=what,
                                   load_average_1min=dict(before=load_before, after=os.getloadavg()[0]),
                                   records=records), indent=1) + "\n")
    return out, records


if __name__ == "__main__":
    main()
