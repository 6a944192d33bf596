"""A bounded load test: many gradio_client sessions against app.py on localhost, mixing the views.

    python benchmarks/load_test.py                    # 24 sessions, 45 s, launches app.py itself
    python benchmarks/load_test.py --url http://127.0.0.1:7860/ --sessions 30 --duration 60

Each session is its own ``gradio_client.Client`` and sends one request at a time, like a visitor
clicking through the tabs with changing settings: the mask, the heatmaps, the candidate-isolation
probe, batch invariance (+ RoPE), the variants / bug-zoo view, and now and then a tiny timing sweep. Every request is timed
end to end (queue wait included); any exception counts as a failure. The results file records the
machine, the commit and the parameters next to per-view p50 / p95 / max latency and failures:

    benchmarks/results/load-<date>.json
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.serve import running_app  # noqa: E402  (the one localhost launcher)

# view -> (api name, weight in the mix); the timing sweep is tiny: two short lengths, naive only
MIX = {
    "mask": ("/mask", 3),
    "attention": ("/attention", 3),
    "isolation": ("/isolation", 2),
    "invariance": ("/invariance", 2),
    "variants": ("/variants", 1),
    "timing (tiny)": ("/timing", 0.5),
}


def visitor_query(rng: random.Random) -> str:
    """A configuration a visitor might reach from the lecture preset: a few controls changed."""
    weights = rng.choice(["demo", "random"])
    q = {"preset": "lecture", "weights": weights, "seed": rng.randint(0, 3)}
    if weights == "random" and rng.random() < 0.5:
        q.update(num_history=rng.choice([5, 12, 30]), num_candidates=rng.choice([3, 6, 8]))
    if rng.random() < 0.3:
        q["prefix"] = "bidirectional"
    if rng.random() < 0.3:
        q["rope_mode"] = rng.choice(["shared", "none"])
    q["head"] = rng.choice([-1, 0, 1, 2, 3])
    q["layer"] = rng.choice([0, 1])
    q["candidate"] = rng.randint(0, 2)
    if rng.random() < 0.3:
        q["variant"] = rng.choice(["mha", "mqa", "gqa", "mla", "din-target-attention"])
        q["bug"] = rng.choice(["none", "unmasked-decoder", "rope-interleaved"])
    return "&".join(f"{k}={v}" for k, v in q.items())


def request_args(view: str, rng: random.Random) -> tuple:
    query = visitor_query(rng)
    if view == "timing (tiny)":
        return query, "16, 32", ["naive"]
    return (query,)


def session(url: str, index: int, start: threading.Barrier, stop_at: list, seed: int, records: list,
            lock: threading.Lock) -> None:
    from gradio_client import Client
    rng = random.Random(seed * 1000 + index)
    client = Client(url, verbose=False)
    views, weights = zip(*((v, w) for v, (_, w) in MIX.items()))
    start.wait()
    while time.monotonic() < stop_at[0]:
        view = rng.choices(views, weights)[0]
        args = request_args(view, rng)
        t0 = time.perf_counter()
        try:
            out = client.predict(*args, api_name=MIX[view][0])
            error = None if out is not None and out[0] is not None else "empty answer"
        except Exception as e:                      # noqa: BLE001 — every failure counts, whatever its type
            error = f"{type(e).__name__}: {str(e)[:300]}"
        with lock:
            records.append(dict(view=view, session=index, latency_s=time.perf_counter() - t0, error=error,
                                query=args[0]))


def percentile(sorted_values: list, p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def summarise(records: list, wall_s: float) -> dict:
    views = {}
    for view in MIX:
        lat = sorted(r["latency_s"] for r in records if r["view"] == view)
        fails = sum(1 for r in records if r["view"] == view and r["error"])
        views[view] = dict(api=MIX[view][0], requests=len(lat), failures=fails,
                           p50_s=round(percentile(lat, 50), 4), p95_s=round(percentile(lat, 95), 4),
                           max_s=round(lat[-1], 4) if lat else None)
    lat = sorted(r["latency_s"] for r in records)
    failures = sum(1 for r in records if r["error"])
    return dict(views=views, total=dict(requests=len(records), failures=failures,
                                        requests_per_s=round(len(records) / wall_s, 2),
                                        p50_s=round(percentile(lat, 50), 4), p95_s=round(percentile(lat, 95), 4)))


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import torch
    return dict(cpu=cpu, cores=os.cpu_count(), gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available()
                else None, python=platform.python_version(), torch=torch.__version__,
                load_average_before=os.getloadavg()[0])


def git_commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "app.py", "explorer", "models")
    return commit + ("+dirty" if dirty else "")


def run(url: str, sessions: int, duration_s: float, seed: int) -> dict:
    from gradio_client import Client
    warm = Client(url, verbose=False)
    rng = random.Random(seed)
    for view, (api, _) in MIX.items():                 # first compile / import work, not timed
        warm.predict(*request_args(view, rng), api_name=api)
    records, lock = [], threading.Lock()
    start = threading.Barrier(sessions + 1)
    stop_at = [float("inf")]
    threads = [threading.Thread(target=session, args=(url, i, start, stop_at, seed, records, lock), daemon=True)
               for i in range(sessions)]
    for t in threads:
        t.start()
    start.wait()                                       # every client connected: the clock starts
    t0 = time.monotonic()
    stop_at[0] = t0 + duration_s
    for t in threads:
        t.join(timeout=duration_s + 120)
    wall = time.monotonic() - t0
    summary = summarise(records, wall)
    errors = sorted({r["error"] for r in records if r["error"]})
    return dict(**summary, wall_s=round(wall, 2), errors=errors[:20],
                sessions_still_running=sum(t.is_alive() for t in threads))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running app; default: launch app.py on a free localhost port")
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--duration", type=float, default=45.0, help="seconds of load (at most 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if not 1 <= a.sessions <= 200:
        ap.error(f"--sessions: got {a.sessions}; allowed: 1..200")
    if not 0 < a.duration <= 60:
        ap.error(f"--duration: got {a.duration}; allowed: (0, 60] seconds")
    when = dt.datetime.now(dt.timezone.utc)
    info = dict(date=when.isoformat(timespec="seconds"), git_commit=git_commit(), device=machine(),
                parameters=dict(sessions=a.sessions, duration_s=a.duration, seed=a.seed,
                                mix={v: dict(api=api, weight=w) for v, (api, w) in MIX.items()},
                                timing_sweep="lengths 16, 32; naive only",
                                latency="end to end per request, queue wait included; one warm-up call "
                                        "per view before the clock, not counted",
                                server="app.py as shipped (queue default_concurrency_limit, per-endpoint "
                                       "limits), same machine as the clients"))
    if a.url:
        result = run(a.url, a.sessions, a.duration, a.seed)
    else:
        with running_app() as url:
            result = run(url, a.sessions, a.duration, a.seed)
    report = {**info, **result}
    report["device"]["load_average_after"] = os.getloadavg()[0]
    out = a.out or ROOT / "benchmarks" / "results" / f"load-{when.date().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'view':<16}{'requests':>9}{'failed':>8}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    for view, r in report["views"].items():
        print(f"{view:<16}{r['requests']:>9}{r['failures']:>8}{r['p50_s']:>9.3f}{r['p95_s']:>9.3f}"
              f"{(r['max_s'] or float('nan')):>9.3f}")
    t = report["total"]
    print(f"total {t['requests']} requests, {t['failures']} failed, {t['requests_per_s']} req/s -> {out}")
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["total"]["failures"] else 0)
