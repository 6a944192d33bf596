"""A bounded load test: many gradio_client sessions against app.py on localhost, mixing the views.

    python benchmarks/load_test.py                    # 24 sessions, 45 s, launches app.py itself
    python benchmarks/load_test.py --url http://127.0.0.1:7860/ --sessions 30 --duration 60
    python -m benchmarks.load_test --abuse            # the hostile-visitor mix below, 55 s

Each session is its own ``gradio_client.Client`` and sends one request at a time, like a visitor
clicking through the tabs with changing settings: the mask, the heatmaps, the candidate-isolation
probe, batch invariance (+ RoPE), the variants / bug-zoo view, and now and then a tiny timing sweep. Every request is timed
end to end (queue wait included); any exception counts as a failure. The results file records the
machine, the commit and the parameters next to per-view p50 / p95 / max latency and failures:

    benchmarks/results/load-<date>.json

``--abuse`` runs what a hostile visitor of a public Space would (issue 14) instead: /timing submitted
and cancelled at once in a loop (cancel storms), /isolation and /attention at the recorded-attention
cap (56 query heads, T 1087), the Variants tab / bug zoo on phoenix-nano, weight uploads from several
sessions — while light clients keep asking for the lecture /mask. It samples the server's resident
memory throughout and records peak RSS, RSS after the load and the lecture /mask p95 next to failures
(a refusal that names its field is an answer, not a failure) in
``benchmarks/results/load-abuse-<date>.json``. Targets: 0 failures, peak RSS < 6 GB, /mask p95 < 1 s,
RSS back near its start.

``--suite`` (issues 19, 28, 34) is the soak of record: a fresh app in Space mode per run, 30 honest visitors
(spread over ``--client-processes`` processes), a probe (the lecture /mask one at a time, split into join /
wait / run / rest) and an uploader beside the modes of ``Attack`` — the honest visitors alone once, each mode
alone once (``--mode-duration`` s), then ``--runs`` runs with every mode (``--duration`` s); every side is its
own client machine, so no client's GIL slows another's timing. The file keeps every run, min / median / max of
the figures over the full runs and the worst run, which the README quotes:
``benchmarks/results/load-soak-<date>.json``. ``--soak`` runs once (a quick look, not the record;
``--records`` keeps every request); ``--soak --before REF`` soaks commit REF and this tree, run by run alternated
(``--pairs``), into ``benchmarks/results/load-soak-ab-<date>.json``.

    python -m benchmarks.load_test --suite --duration 90 --mode-duration 30     # about 40 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import enum
import json
import os
import platform
import random
import sys
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.localhost import running_app  # noqa: E402
from harness.reports import percentile  # noqa: E402
from models.runinfo import RESULTS_DIR, cpu_model, git_commit  # noqa: E402

# view -> (api name, weight in the mix); the timing sweep is tiny: two short lengths, naive only
MIX = {
    "mask": ("/mask", 3),
    "attention": ("/attention", 3),
    "isolation": ("/isolation", 2),
    "invariance": ("/invariance", 2),
    "variants": ("/variants", 1),
    "timing (tiny)": ("/timing", 0.5),
}


MODEL_VIEWS = ("attention", "isolation", "invariance", "variants")       # of MIX: the views that run the model


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
    import torch
    return dict(cpu=cpu_model(), cores=os.cpu_count(), gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available()
                else None, python=platform.python_version(), torch=torch.__version__,
                load_average_before=os.getloadavg()[0])


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


# --- the abuse mix (issue 14) ------------------------------------------------------------------

CAP_SIZED = "preset=phoenix-nano&num_q_heads=56&num_kv_heads=8&num_layers=1"
TIMING_STORM = ("preset=lecture&weights=random&num_q_heads=16&num_kv_heads=16&key_size=128", "512, 1024",
                ["naive", "structured"])
# kind -> (clients, what each does in a loop)
ABUSE = {
    "lecture /mask": 2,                  # the light request whose latency must stay low throughout
    "timing cancel storm": 3,
    "cap-sized isolation / attention": 3,
    "variants on phoenix-nano": 2,
    "uploads": 2,
}
TARGETS = dict(failures=0, peak_rss_gb=6.0, mask_p95_s=1.0, rss_after_over_start=1.5)


def server_pid(url: str) -> Optional[int]:
    """The app.py process serving `url` (running_app starts it with GRADIO_SERVER_PORT in its environment)."""
    port = url.rstrip("/").rsplit(":", 1)[-1]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if b"app.py" in (proc / "cmdline").read_bytes() and \
                    f"GRADIO_SERVER_PORT={port}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
    return None


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def family_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and every process below it (the export browser counts: it is the server's)."""
    return sum(family_rss_by_role(pid).values())


def family_roles(pid: int) -> dict[int, str]:
    """`pid` and every process below it now, each with what it is: the server itself, its drawing process
    (server.drawing, by its command line) or the export browser (every other one)."""
    roles = {pid: "server"}
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            roles[p] = "drawing" if b"server.drawing_process" in Path(f"/proc/{p}/cmdline").read_bytes() else "browser"
    return roles


def family_rss_by_role(pid: int, family: Optional[dict] = None) -> dict:
    """family_rss_bytes split by what holds it (family_roles; `family`: as it read a moment ago)."""
    totals = dict(server=0, drawing=0, browser=0)
    for p, role in (family or family_roles(pid)).items():
        with contextlib.suppress(OSError):
            totals[role] += rss_bytes(p)
    return totals


def _stat(path: Path) -> tuple[float, int]:
    """A process's or thread's /proc stat -> (user + system CPU seconds so far, nice)."""
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[16])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (all its threads)."""
    return _stat(Path(f"/proc/{pid}/stat"))[0]


def low_priority_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds so far of each thread of `pid` running at a lower priority than normal (nice > 0: the
    server's large-request threads, explorer.budget.LOW_PRIORITY) -> {thread id: seconds}."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            seconds, nice = _stat(task / "stat")
            if nice > 0:
                out[int(task.name)] = seconds
    return out


def descendants(pid: int) -> list[int]:
    """The processes below `pid` now (the export browser and its renderers, for the server)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(
                    int(proc.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


class RssSampler:
    """The server's resident memory every 0.2 s on a thread, from start() to stop(), with the processes it
    started (the export browser: kaleido's Chromium and its renderers): samples is a list of (monotonic time,
    bytes); `cpu` the CPU seconds used meanwhile by the server and by those processes, each read once a
    second."""

    def __init__(self, pid: int):
        self.pid, self.samples, self.roles, self.done = pid, [], [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.role: dict[int, str] = {}
        self.low_first: dict[int, float] = {}
        self.low_last: dict[int, float] = {}

    def _read_cpu(self, family: dict) -> None:
        at_start = not self.first           # processes there at the start count from then, later ones from 0
        for pid, role in family.items():
            with contextlib.suppress(OSError):
                self.last[pid] = cpu_seconds(pid)
                self.first.setdefault(pid, self.last[pid] if at_start else 0.0)
                self.role[pid] = role
        with contextlib.suppress(OSError):      # the same for the server's low-priority threads
            for tid, seconds in low_priority_cpu_seconds(self.pid).items():
                self.low_last[tid] = seconds
                self.low_first.setdefault(tid, seconds if at_start else 0.0)

    @property
    def cpu(self) -> dict:
        """CPU seconds by role (family_roles): the server's own process (and, of it, its threads at a lower
        priority: what yields to the rest), its drawing process (every one it started: one ends when idle) and
        the export browser with its renderers."""
        used = collections.Counter()
        for pid in self.last:
            used[self.role.get(pid, "browser")] += self.last[pid] - self.first[pid]
        low = sum(self.low_last[tid] - self.low_first[tid] for tid in self.low_last)
        return dict(server_s=round(used["server"], 1), server_low_priority_s=round(low, 1),
                    drawing_process_s=round(used["drawing"], 1), export_browser_s=round(used["browser"], 1))

    def _run(self) -> None:
        n, family = 0, {self.pid: "server"}
        while not self.done.is_set():
            if n % 5 == 0:
                family = family_roles(self.pid)
                self._read_cpu(family)
            roles = family_rss_by_role(self.pid, family)
            self.samples.append((time.monotonic(), sum(roles.values())))
            self.roles.append(roles)
            n += 1
            time.sleep(0.2)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _weights_file(tmp: Path, seed: int) -> Path:
    """A valid upload for the lecture geometry (random weights of another seed)."""
    from explorer.query_string import parse_query
    from models.recsys import RecsysModel, init_recsys
    from models.weights import save_weights
    s = parse_query("preset=lecture&weights=random")
    path = tmp / f"upload-{seed}.safetensors"
    save_weights(init_recsys(RecsysModel(s.recsys_config()), "random", seed), path)
    return path


def abuse_client(kind: str, url: str, index: int, start: threading.Barrier, stop_at: list, records: list,
                 lock: threading.Lock, tmp: Path) -> None:
    from gradio_client import Client, handle_file
    client = Client(url, verbose=False)
    rng = random.Random(index)
    upload = _weights_file(tmp, index) if kind == "uploads" else None
    start.wait()
    while time.monotonic() < stop_at[0]:
        t0 = time.perf_counter()
        error = refused = None
        what = kind
        try:
            if kind == "lecture /mask":
                client.predict(f"preset=lecture&seed={rng.randint(0, 3)}", api_name="/mask")
            elif kind == "timing cancel storm":
                job = client.submit(*TIMING_STORM, api_name="/timing")
                time.sleep(rng.uniform(0.05, 0.5))
                job.cancel()
            elif kind == "cap-sized isolation / attention":
                what = rng.choice(["/isolation", "/attention"])
                client.predict(CAP_SIZED + f"&seed={rng.randint(0, 1)}", api_name=what)
            elif kind == "variants on phoenix-nano":
                client.predict(f"preset=phoenix-nano&bug={rng.choice(['none', 'unmasked-decoder', 'exact-gelu'])}",
                               api_name="/variants")
            else:
                query, _ = client.predict("preset=lecture&weights=random", handle_file(str(upload)),
                                          api_name="/upload_weights")
                client.predict(query, api_name="/attention")
        except Exception as e:                      # noqa: BLE001 — every failure counts, whatever its type
            text = str(e)
            if ": got " in text and "; allowed: " in text and "internal error" not in text:
                refused = text[:200]                # a refusal that names its field: an answer
            else:
                error = f"{type(e).__name__}: {text[:300]}"
        with lock:
            records.append(dict(kind=kind, what=what, latency_s=time.perf_counter() - t0, error=error,
                                refused=refused, t=time.monotonic()))


def run_abuse(url: str, duration_s: float) -> dict:
    import tempfile
    from gradio_client import Client
    pid = server_pid(url)
    if pid is None:
        raise RuntimeError(f"no app.py process found serving {url} (--abuse reads the server's memory from /proc)")
    warm = Client(url, verbose=False)
    warm.predict("preset=lecture", api_name="/mask")
    time.sleep(2.0)
    rss_start = rss_bytes(pid)
    sampler = RssSampler(pid)
    records, lock = [], threading.Lock()
    clients = [(kind, i) for kind, n in ABUSE.items() for i in range(n)]
    start = threading.Barrier(len(clients) + 1)
    stop_at = [float("inf")]
    with tempfile.TemporaryDirectory(prefix="load-abuse-") as tmp:
        threads = [threading.Thread(target=abuse_client, args=(kind, url, i, start, stop_at, records, lock, Path(tmp)),
                                    daemon=True) for i, (kind, _) in enumerate(clients)]
        for t in threads:
            t.start()
        start.wait()
        sampler.start()
        t0 = time.monotonic()
        stop_at[0] = t0 + duration_s
        for t in threads:
            t.join(timeout=duration_s + 180)
        load_end = time.monotonic()
        time.sleep(15.0)                                 # the queue drains, cancelled work stops
        sampler.stop()
    rss_after = rss_bytes(pid)
    samples = sampler.samples
    during = [r for _, r in samples]
    kinds = {}
    for kind in ABUSE:
        rs = [r for r in records if r["kind"] == kind]
        lat = sorted(r["latency_s"] for r in rs)
        kinds[kind] = dict(clients=ABUSE[kind], requests=len(rs), failures=sum(bool(r["error"]) for r in rs),
                           refused_by_name=sum(bool(r["refused"]) for r in rs),
                           p50_s=round(percentile(lat, 50), 3), p95_s=round(percentile(lat, 95), 3),
                           max_s=round(lat[-1], 3) if lat else None)
    mask = kinds["lecture /mask"]
    result = dict(
        wall_s=round(load_end - t0, 2), sessions_still_running=sum(t.is_alive() for t in threads),
        kinds=kinds, total=dict(requests=len(records), failures=sum(bool(r["error"]) for r in records),
                                refused_by_name=sum(bool(r["refused"]) for r in records)),
        memory=dict(rss_start_gb=round(rss_start / 1e9, 3), peak_rss_gb=round(max(during, default=0) / 1e9, 3),
                    rss_after_gb=round(rss_after / 1e9, 3), after_s=15.0,
                    timeline_gb=[(round(t - t0, 1), round(r / 1e9, 3)) for t, r in samples[::5]]),
        lecture_mask_p95_s=mask["p95_s"],
        errors=sorted({r["error"] for r in records if r["error"]})[:20],
        refusals=sorted({r["refused"] for r in records if r["refused"]})[:10])
    m = result["memory"]
    result["targets"] = dict(TARGETS, met=dict(
        failures=result["total"]["failures"] <= TARGETS["failures"],
        peak_rss_gb=m["peak_rss_gb"] < TARGETS["peak_rss_gb"],
        mask_p95_s=mask["p95_s"] < TARGETS["mask_p95_s"],
        rss_after_over_start=m["rss_after_gb"] <= TARGETS["rss_after_over_start"] * m["rss_start_gb"]))
    return result


def run_and_write(a, run_fn, info: dict, stem: str, when) -> tuple[dict, Path]:
    """Run `run_fn(url)` against --url or an app launched here, add the run's facts and write
    benchmarks/results/<stem>-<date>.json (or --out): (report, path)."""
    if a.url:
        result = run_fn(a.url)
    else:
        with running_app() as url:
            result = run_fn(url)
    report = {**info, **result}
    report["device"]["load_average_after"] = os.getloadavg()[0]
    out = a.out or RESULTS_DIR / f"{stem}-{when.date().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report, out


def main_abuse(a) -> dict:
    from explorer.limits import DEFAULT_MEMORY_CEILING, MEMORY_CEILING_ENV
    when = dt.datetime.now(dt.timezone.utc)
    info = dict(kind="abuse", date=when.isoformat(timespec="seconds"), git_commit=git_commit(), device=machine(),
                parameters=dict(duration_s=a.duration, clients=ABUSE, cap_sized=CAP_SIZED,
                                timing_storm=dict(query=TIMING_STORM[0], lengths=TIMING_STORM[1],
                                                  backends=TIMING_STORM[2], cancel_after_s="0.05-0.5"),
                                memory_ceiling_bytes=int(os.environ.get(MEMORY_CEILING_ENV, DEFAULT_MEMORY_CEILING)),
                                latency="end to end per request, queue wait included",
                                rss="server process VmRSS sampled every 0.2 s; 'after' 15 s after the load stops",
                                conditions=a.conditions))
    report, out = run_and_write(a, lambda url: run_abuse(url, a.duration), info, "load-abuse", when)
    print(f"{'kind':<34}{'requests':>9}{'failed':>8}{'refused':>8}{'p50 s':>9}{'p95 s':>9}")
    for kind, r in report["kinds"].items():
        print(f"{kind:<34}{r['requests']:>9}{r['failures']:>8}{r['refused_by_name']:>8}{r['p50_s']:>9.3f}{r['p95_s']:>9.3f}")
    m = report["memory"]
    print(f"RSS start {m['rss_start_gb']} GB, peak {m['peak_rss_gb']} GB, after {m['rss_after_gb']} GB; "
          f"targets met: {report['targets']['met']} -> {out}")
    return report


# --- the soak (issues 19, 28, 34): honest visitors beside every mode of attack, over several runs ----------

SOAK_TARGETS = dict(peak_rss_gb=6.0, rss_after_gb=1.5, after_s=30.0, honest_mask_p95_s=1.0, honest_failures=0,
                    honest_model_views_p95_s=3.0, classroom_views_p95_s=3.0)
SETTLED_AFTER_S = 5.0                   # the start burst, reported apart (the target counts every request)
ATTACKER = "198.51.100.66"              # the address the (simulated) proxy forwards for the attacker
HEAVY_MASK = "preset=lecture&num_history=1535&num_candidates=512&zoom=candidates"
FULL_MASK = "preset=lecture&num_history=1535&num_candidates=512&zoom=history tail"
ZOOMED_GRID = ("preset=lecture&weights=random&num_layers=16&num_q_heads=8&num_kv_heads=8&num_history=80&"
               "num_candidates=512&zoom=candidates&head=-1")
HEAVY_INVARIANCE = "preset=phoenix-nano&emb_size=1024&num_history=1500&weights=random"   # ~550 GFLOP, admitted
PACK_PRESET = "preset=phoenix-2026-nano"
LONG_SWEEP = ("preset=lecture&weights=random&num_q_heads=16&num_kv_heads=16&key_size=128", "256, 512, 1024, 2048",
              ["naive", "structured"])
LECTURE_Q = "preset=lecture&weights=random"
RAW_UPLOADS: list = []                          # files the attacker left in Gradio's cache, removed afterwards


class Attack(enum.Enum):
    """A mode of the soak, beside the honest visitors: (label, what it does, threads, side). Issue 19's
    findings 1-6 and issue 28's modes from one attacker address (1-11), then issue 34's findings 2-9 (12-19):
    the attacker's modes and two honest ones (`side` "honest": a class behind one address, and page visitors
    beside API clients), which the targets count as honest."""
    FRESH_SESSIONS = ("1 fresh session per heavy result", "/mask (T 2048) and a zoomed 16 x 8 attention grid, "
                      "a new session hash each", 1)
    ONE_SESSION_FLOOD = ("2 one session floods /isolation", "12 joins at once from one session, again every 2 s", 1)
    MINTED_SESSIONS = ("3 minted sessions take a lane", "8 /attention and 4 /export_figure joins, a new session "
                       "hash each", 1)
    UPLOAD_STORE = ("4 uploads fill the store", "phoenix-nano weights (45 MB), a new session each", 1)
    HUGE_RESULTS = ("5 huge results", "/mask at T 2048 with the history tail at full resolution, in a loop", 1)
    RAW_UPLOAD_ROUTE = ("6 raw upload route", "50 MB bodies to /gradio_api/upload in a loop", 1)
    PAGE_STEP_FLOOD = ("7 page steps fill the queue", "20 connections joining the committed timing curves, the "
                       "page load and the unload in a loop (events that skipped admission)", 20)
    GET_FLOOD = ("8 GET flood", "10 connections getting / and /config in a loop", 10)
    HEAVY_WORK = ("9 heavy admitted work", f"/invariance at {HEAVY_INVARIANCE} (~550 GFLOP) in a loop, a new seed "
                  "each time", 2)
    PACK_LOOP = ("10 pack loop", f"lecture packs at {PACK_PRESET} in a loop, a new seed each", 1)
    EXPORT_LOOP = ("11 export loop", "one-figure exports (the lecture mask, PNG, a new history length each) in a loop "
                                     "beside the packs", 1)
    INVALID_CONTROL = ("12 invalid control, heavy draw", "6 sessions of one address: the page's control change and "
                       "heatmap click with the controls of a ~550 GFLOP view, the seed invalid, the last link "
                       "the lecture preset", 6)
    MINTED_STOPS = ("13 Stop events mint sessions", "Stop joins (no lane: they cancel) with a fresh session hash "
                    "each, 110 at once then 19 a second, streams never opened; now and then a 1 MB hash", 1)
    PAGE_VS_API = ("14 page redraws beside API calls", "4 page visitors (the control change, a model view each "
                   "time) and 4 API clients (/attention), each its own address, asking with no pause", 8, "honest")
    CLASSROOM = ("15 classroom", "30 students behind one address, each a browser (the page, its cookie, its load "
                 "event), changing a lecture-preset view 1-3 s apart; the lecturer switches presets twice in quick "
                 "succession every 5 s", 31, "honest")
    PAGE_COPIES = ("16 uncached page copies", "10 connections: /config/, /gradio_api/runs, /?v=<n>, HEAD /, "
                   "/gradio_api/info/?x=<n>", 10)
    BOTNET = ("17 botnet", "24 sessions on 12 addresses of one IPv6 /64 asking lecture views every 0.5 s; 17 "
              "addresses of one /24 each holding a timing sweep; heavy views, packs and exports from a fresh "
              "address each of two more /24s", 32)
    DISK = ("18 disk and the upload store", "33 MiB bodies to the raw upload route from a new address every 12 "
            "files; three addresses uploading phoenix-nano weights (4 each) in a loop", 4)
    SMALLER = ("19 echoes, recordings, a classmate's grace", "900 KB bodies to /gradio_api/run/settings; "
               "/gradio_api/process_recording; two browsers of one address: one uploads and closes its page, the "
               "other uploads, the first's weights still drawn", 1)

    def __init__(self, label: str, does: str, threads: int, side: str = "attacker"):
        self.label, self.does, self.threads, self.side = label, does, threads, side


ATTACKS = list(Attack)
# the attacks answered within their bounds (pooled figures, plain GETs of a cached page, the smaller findings'
# checks) rather than refused, and the disk's, whose bounds a run may not reach on a busy machine: the stores'
# check holds them
ANSWERED_ATTACKS = {Attack.FRESH_SESSIONS, Attack.HUGE_RESULTS, Attack.PAGE_COPIES, Attack.SMALLER, Attack.DISK}
HONEST_SIDES = ("honest", "classroom", "fairness", "probe")
CHECK_FAILED = "check failed: "                 # a mode's record whose expectation of the server did not hold


def answered_within_bound(attack: Attack, duration_s: float) -> Optional[int]:
    """How many requests of `attack` its tightest bound answers in a run of `duration_s`, for the attacks whose
    requests a saturated server answers too slowly to pass it (a 50 MB body, a pack, a 45 MB upload, a 550 GFLOP
    view take seconds each): a run that sent no more was never past it, and is not asked to be refused. None:
    the others, refused within their first requests (a lane's share per visitor)."""
    from explorer import export, limits
    from explorer.query_string import parse_query
    from server import front_door, shares, uploads
    if attack is Attack.GET_FLOOD:
        return int(front_door.PAGE_RATE["burst"] + front_door.PAGE_RATE["per_s"] * duration_s)
    if attack is Attack.RAW_UPLOAD_ROUTE:       # 50 MiB bodies
        share = front_door.UPLOAD_ROUTE_SHARE
        return min(share["max_calls"], share["max_bytes"] // (50 * 2**20))
    if attack is Attack.UPLOAD_STORE:           # phoenix-nano's weights, held in the store
        return uploads.UPLOAD_SHARE_BYTES // limits.model_bytes(parse_query("preset=phoenix-nano&weights=random"))
    if attack is Attack.HEAVY_WORK:             # two threads, one view each at a time: the work share's views
        from server.lanes import view_work
        return int(shares.WORK_SHARE["max_bytes"] * 1e9 // view_work(parse_query(HEAVY_INVARIANCE), "invariance"))
    if attack is Attack.PACK_LOOP:
        return shares.EXPORT_SHARE["max_calls"] // (len(export.FIGURES) * len(export.FORMATS))
    if attack is Attack.EXPORT_LOOP:
        return shares.EXPORT_SHARE["max_calls"]
    return None


def refused_past_bound(attack: Attack, answer: dict, duration_s: float) -> bool:
    """Whether the attacker's `attack` (its figures `answer`) was refused by name, or never sent more than its
    bound answers (answered_within_bound)."""
    bound = answered_within_bound(attack, duration_s)
    return answer["refused_by_name"] > 0 or bound is not None and answer["requests"] <= bound


def _refusal(text: str) -> bool:
    return ": got " in text and "; allowed: " in text and "internal error" not in text


def api_functions(url: str, address: str = "10.0.0.1") -> dict:
    """api name -> (Gradio function index, its inputs' values on a fresh page), read once per client machine
    from the app's config (asked for from `address`): a call with fewer inputs is completed with those, as
    gradio_client does."""
    import urllib.request
    request = urllib.request.Request(f"{url}config", headers={"X-Forwarded-For": address})
    config = json.load(urllib.request.urlopen(request, timeout=60))
    value = {c["id"]: c.get("props", {}).get("value") for c in config["components"]}
    return {d["api_name"]: (d["id"], [value.get(i) for i in d["inputs"]])
            for d in config["dependencies"] if d.get("api_name")}


class RawClient:
    """Joins and reads Gradio's queue over plain HTTP with any session hash, as the page's own client does
    (one POST, then the event stream) and as a hostile client can, from `address` (as the Space's proxy
    forwards it). It keeps the cookies the server sets, as a browser does. It parses what a browser parses
    and nothing more, so a client process beside the server takes little of the CPU it measures. As a browser
    does (`browser`), it reads each event stream to its end (Gradio's close_stream follows the last answer at
    once), so its connections are kept alive and reused; `browser=False` drops the connection as soon as the
    answer is read (the attacker's client: a new connection, accepted by the server's event loop, per event)."""

    def __init__(self, url: str, address: str, fn: Optional[dict] = None, browser: bool = True):
        import httpx
        self.url, self.address, self.browser = url, address, browser
        self.fn = fn if fn is not None else api_functions(url, address)
        self.answered_at, self.connects = time.monotonic(), 0
        self.http = httpx.Client(timeout=120, event_hooks={"request": [self.traced]})

    @contextlib.contextmanager
    def asking(self):
        """Around a request: a connection error names whether the request went on a new connection or on one
        kept from an earlier answer, and how long after this client's last answer it was sent (the kept
        connection's idle time as this client saw it; the server's may be longer by the client's own delays)."""
        import httpx
        connects, sent = self.connects, time.monotonic()
        try:
            yield
        except httpx.TransportError as e:
            kept = "a new connection" if self.connects > connects else "a kept connection"
            raise type(e)(f"{e} (on {kept}, sent {sent - self.answered_at:.2f} s after this client's last "
                          "answer)") from e
        finally:
            self.answered_at = time.monotonic()

    def traced(self, request) -> None:
        """Every request (httpx's request hook): each new TCP connection it tries counted in `connects`."""
        def trace(event: str, info) -> None:
            if event == "connection.connect_tcp.started":
                self.connects += 1
        request.extensions["trace"] = trace

    def headers(self) -> dict:
        import uuid
        return {"X-Forwarded-For": f"10.{uuid.uuid4().int % 250}.0.1, {self.address}"}   # the left part is made up

    def get(self, path: str, method: str = "GET"):
        """GET (or HEAD) a path of the app -> the response (a page load keeps its cookie)."""
        with self.asking():
            return self.http.request(method, f"{self.url}{path}", headers=self.headers())

    def join(self, api: str, data: list, session: str) -> tuple[int, str]:
        fn, defaults = self.fn[api]
        with self.asking():
            r = self.http.post(f"{self.url}gradio_api/queue/join", headers=self.headers(),
                               json={"data": [*data, *defaults[len(data):]], "fn_index": fn, "session_hash": session,
                                     "event_data": None, "trigger_id": None})
        return r.status_code, r.text[:300]

    def call(self, api: str, data: list, session: str, timed: bool = False, answer: Optional[list] = None):
        """Join and wait for the answer -> None, or the error / refusal text (its output data appended to
        `answer`). With `timed`, a dict: `error` (that answer) and the phases in seconds: join, wait (until
        Gradio starts the event), run (the function, as Gradio times it) and rest (until the answer is read)."""
        t0 = time.perf_counter()
        code, text = self.join(api, data, session)
        t_join = t_start = time.perf_counter()
        t_end = None
        error, run = "stream ended", None
        if code != 200:
            error = f"HTTP {code}: {text}"
        else:
            with self.asking(), self.http.stream("GET", f"{self.url}gradio_api/queue/data", headers=self.headers(),
                                                 params={"session_hash": session}) as stream:
                for line in stream.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_starts":
                        t_start = time.perf_counter()
                    elif msg.get("msg") == "process_completed":
                        out = msg.get("output") or {}
                        error = None if msg.get("success") else str(out.get("error") or out)[:300]
                        if error is None and not (out.get("data") or [None])[0]:
                            error = "empty answer"
                        if answer is not None:
                            answer.append(out.get("data"))
                        run = out.get("duration")
                        t_end = time.perf_counter()
                        if not self.browser:
                            break
        if not timed:
            return error
        t_end = t_end or time.perf_counter()            # the answer's arrival, or the stream's end without one
        return dict(error=error, join_s=t_join - t0, wait_s=t_start - t_join, run_s=run,
                    rest_s=t_end - t_start - (run or 0.0))

    def call_many(self, calls: list, session: str, gap_s: float = 0.0) -> list:
        """Several events of one page in flight at once ((api, data) each, joined `gap_s` apart), their answers
        read on one stream of the session, as the page reads them -> each answer as `call` gives it."""
        answers = {}
        for n, (api, data) in enumerate(calls):
            code, text = self.join(api, data, session)
            answers[json.loads(text)["event_id"] if code == 200 else n] = (
                "stream ended" if code == 200 else f"HTTP {code}: {text}")
            time.sleep(gap_s)
        waiting = {e for e, a in answers.items() if a == "stream ended"}
        if waiting:
            with self.asking(), self.http.stream("GET", f"{self.url}gradio_api/queue/data", headers=self.headers(),
                                                 params={"session_hash": session}) as stream:
                for line in stream.iter_lines():
                    msg = json.loads(line[5:]) if line.startswith("data:") else {}
                    if msg.get("msg") == "process_completed" and msg.get("event_id") in waiting:
                        out = msg.get("output") or {}
                        answers[msg["event_id"]] = (None if msg.get("success") and (out.get("data") or [None])[0]
                                                    else str(out.get("error") or "empty answer")[:300])
                        waiting.discard(msg["event_id"])
                        if not waiting and not self.browser:
                            break
        return list(answers.values())

    def upload(self, path: Path, name: str) -> tuple[int, str]:
        """A file to the raw upload route -> (status, its path on the server or the answer's text)."""
        with self.asking():
            r = self.http.post(f"{self.url}gradio_api/upload", headers=self.headers(),
                               files={"files": (name, path.read_bytes())})
        if r.status_code != 200:
            return r.status_code, r.text[:200]
        RAW_UPLOADS.extend(json.loads(r.text))
        return 200, json.loads(r.text)[0]

    def upload_weights(self, path: Path, query: str, session: str) -> tuple[Optional[str], Optional[str]]:
        """A weights file through the page's two steps (the raw route, then the upload event) -> (the query
        naming the upload, None) or (None, the refusal or error)."""
        code, where = self.upload(path, path.name)
        if code != 200:
            return None, f"HTTP {code}: {where}"
        answer = []
        error = self.call("upload_weights", [query, {"path": where, "orig_name": path.name,
                                                     "meta": {"_type": "gradio.FileData"}}], session, answer=answer)
        return (answer[0][0], None) if error is None and answer and answer[0] else (None, error or "no query")


def change_data(fn: dict, query: str, tab: str, last: str, pick: Optional[str] = None, **raw) -> list:
    """The inputs of the page's control change (render_on_change; with `pick`, render_after_pick): every
    control as `query` sets it (raw values overriding, an invalid one say), the visible tab, the last link."""
    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import parse_query
    from explorer.settings import control_value
    s = parse_query(query, need_model=False)
    values = [raw.get(f, control_value(s, f)) for f in CONTROL_FIELDS] + [tab, last]
    return [pick, *values] if pick is not None else values


def _weights_of(tmp: Path, query: str, seed: int) -> Path:
    """A valid upload for `query`'s geometry (random weights of `seed`), made once per process."""
    from explorer.query_string import parse_query
    from models.recsys import RecsysModel, init_recsys
    from models.weights import save_weights
    path = tmp / f"w-{abs(hash(query)) % 10**8}-{seed}-{os.getpid()}.safetensors"
    if not path.exists():
        save_weights(init_recsys(RecsysModel(parse_query(query + "&weights=random").recsys_config()), "random", seed),
                     path)
    return path


def attacker(attack: Attack, k: int, url: str, stop_at: list, records: list, lock: threading.Lock, tmp: Path,
             start: threading.Barrier, fn: dict) -> None:
    """Thread `k` of a mode, in a loop until `stop_at`; every answer recorded (a refusal naming its field
    apart from an error)."""
    import uuid
    raw = RawClient(url, ATTACKER, fn, browser=attack.side == "honest")
    fresh = lambda: uuid.uuid4().hex[:11]       # noqa: E731
    side = {"honest": "fairness" if attack is Attack.PAGE_VS_API else "classroom"}.get(attack.side, "attacker")
    if attack is Attack.UPLOAD_STORE:
        upload_file = _weights_of(tmp, "preset=phoenix-nano", 7)
    elif attack is Attack.DISK and k > 0:
        upload_file = _weights_of(tmp, "preset=phoenix-nano", 10 + k)
    elif attack is Attack.SMALLER:
        upload_files = [_weights_of(tmp, "preset=lecture", 20 + j) for j in range(2)]
    elif attack is Attack.INVALID_CONTROL:
        heavy = [change_data(raw.fn, HEAVY_INVARIANCE, "invariance", "preset=lecture", seed=-1),
                 change_data(raw.fn, HEAVY_INVARIANCE, "invariance", "preset=lecture", pick="head=1", seed=-1)]
    rng = random.Random(k)
    start.wait()
    i = 0

    def note(what, answer, t0, kind=attack.label):
        refused = answer is not None and _refusal(answer)
        with lock:
            records.append(dict(side=side, kind=kind, what=what, latency_s=time.perf_counter() - t0,
                                refused=answer[:200] if refused else None,
                                error=answer[:200] if answer and not refused else None, t=time.monotonic()))

    def joined(what, code, text, t0):
        note(what, None if code == 200 else f"HTTP {code}: {text}", t0)

    def got(what, r, t0, ok=(200,)):
        text = r.text[:200] or ("requests: got 'a HEAD past the rate'; allowed: the page-load rate (a HEAD answer "
                                "has no body)" if r.status_code == 429 else "")
        note(what, None if r.status_code in ok else f"HTTP {r.status_code}: {text}", t0)
    while time.monotonic() < stop_at[0]:
        i += 1
        t0 = time.perf_counter()
        try:
            if attack is Attack.FRESH_SESSIONS:
                api, query = ("/mask", HEAVY_MASK) if i % 2 else ("/attention", ZOOMED_GRID)
                note(api, raw.call(api.lstrip("/"), [query], fresh()), t0)
            elif attack is Attack.ONE_SESSION_FLOOD:
                session = fresh()
                for code, text in [raw.join("isolation", ["preset=phoenix-nano&seed=1"], session) for _ in range(12)]:
                    joined("/isolation join", code, text, t0)
                time.sleep(2.0)
            elif attack is Attack.MINTED_SESSIONS:
                for _ in range(8):
                    joined("/attention join", *raw.join("attention", ["preset=phoenix-nano&head=-1"], fresh()), t0)
                for _ in range(4):
                    joined("/export_figure join", *raw.join("export_figure", [LECTURE_Q, "attention", "png", "16:9"],
                                                            fresh()), t0)
                time.sleep(1.0)
            elif attack is Attack.UPLOAD_STORE:      # the file through the raw route, then the upload event
                note("upload", raw.upload_weights(upload_file, "preset=phoenix-nano&weights=random", fresh())[1], t0)
            elif attack is Attack.HUGE_RESULTS:
                note("/mask", raw.call("mask", [FULL_MASK], fresh()), t0)
            elif attack is Attack.RAW_UPLOAD_ROUTE:
                r = raw.http.post(f"{url}gradio_api/upload", headers=raw.headers(),
                                  files={"files": ("big.npz", b"\0" * (50 * 2**20))})
                if r.status_code == 200:
                    RAW_UPLOADS.extend(json.loads(r.text))
                got("raw upload", r, t0)
            elif attack is Attack.PAGE_STEP_FLOOD:   # a session of its own per connection, joins without waiting
                api = ("timing_recorded", "load", "page_gone")[i % 3]
                data = [LECTURE_Q, "lecture", "float32", None] if api == "timing_recorded" else []
                joined(f"{api} join", *raw.join(api, data, f"steps{k:02d}"), t0)
            elif attack is Attack.GET_FLOOD:
                got("GET " + ("/" if i % 2 else "/config"), raw.get("" if i % 2 else "config"), t0)
            elif attack is Attack.HEAVY_WORK:      # a new seed each time: a kept view would cost nothing to ask again
                note("/invariance", raw.call("invariance", [f"{HEAVY_INVARIANCE}&seed={i}"], fresh()), t0)
            elif attack is Attack.PACK_LOOP:       # a new seed each time: a kept pack would cost nothing to ask again
                note("/lecture_pack", raw.call("lecture_pack", [f"{PACK_PRESET}&seed={i}", "16:9"], fresh()), t0)
            elif attack is Attack.EXPORT_LOOP:     # likewise: each a new export, taking the render share
                note("/export_figure", raw.call("export_figure", [f"{LECTURE_Q}&num_history={4 + i % 60}", "mask", "png",
                                                                  "16:9"], fresh()), t0)
            elif attack is Attack.INVALID_CONTROL:
                raw.address = "198.51.100.12"
                api = ("render_on_change", "render_after_pick")[i % 2]
                note(api, raw.call(api, heavy[i % 2], f"invalid{k}x{i % 3}"), t0)
            elif attack is Attack.MINTED_STOPS:
                raw.address = "198.51.100.13"
                for j in range(110 if i == 1 else 19):
                    hash_ = "h" * (10**6) if j == 0 and i % 10 == 1 else fresh()
                    sent = time.perf_counter()
                    joined("stop_timing join" + (" (1 MB hash)" if len(hash_) > 64 else ""),
                           *raw.join("stop_timing", [], hash_), sent)
                time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))
            elif attack is Attack.PAGE_VS_API:
                raw.address = f"10.14.{k}.1"
                if k < 4:
                    note("render_on_change", raw.call("render_on_change", change_data(
                        raw.fn, LECTURE_Q + f"&seed={rng.randint(1, 9)}&head={rng.randint(-1, 3)}", "attention",
                        LECTURE_Q), f"pagevisitor{k}"), t0, "page redraw (/attention)")
                else:
                    note("/attention", raw.call("attention", [LECTURE_Q + f"&seed={rng.randint(1, 9)}&head="
                                                              f"{rng.randint(-1, 3)}"], f"apivisitor{k}"), t0,
                         "API call (/attention)")
            elif attack is Attack.CLASSROOM:
                classroom(raw, k, i, rng, note, t0)
            elif attack is Attack.PAGE_COPIES:
                raw.address = "198.51.100.16"
                path, method = [("config/", "GET"), ("gradio_api/runs", "GET"), (f"?v={i}", "GET"), ("", "HEAD"),
                                (f"gradio_api/info/?x={i}", "GET"), (f"config?deep_link={i}", "GET")][i % 6]
                got(f"{method} /{path.split('?')[0]}", raw.get(path, method), t0, ok=(200, 404))
            elif attack is Attack.BOTNET:
                botnet(raw, k, i, note, t0, fresh)
            elif attack is Attack.DISK:
                if k == 0:                           # a new address every 12 files
                    raw.address = f"198.19.{i // 12 // 250}.{i // 12 % 250 + 1}"
                    r = raw.http.post(f"{url}gradio_api/upload", headers=raw.headers(),
                                      files={"files": ("big.npz", b"\0" * (33 * 2**20))})
                    if r.status_code == 200:
                        RAW_UPLOADS.extend(json.loads(r.text))
                    got("raw upload (33 MiB)", r, t0)
                else:
                    raw.address = f"198.20.0.{k}"
                    note("phoenix-nano upload", raw.upload_weights(
                        upload_file, "preset=phoenix-nano&weights=random", f"store{k}x{i % 4}")[1], t0)
            else:
                smaller(raw, url, i, upload_files, note, t0)
        except Exception as e:                  # noqa: BLE001 — the attacker's own failures are data too
            note(attack.label, f"{type(e).__name__}: {str(e)[:200]}", t0)


def classroom(raw: RawClient, k: int, i: int, rng: random.Random, note, t0: float) -> None:
    """Student `k` of 30 behind one address (the lecturer is the 31st): its browser loads the page (the cookie
    the server signs), runs the page's load event, then changes a lecture-preset view every 1-3 s; the
    lecturer switches presets twice in quick succession (both redraws in flight) every 5 s."""
    raw.address = CLASSROOM_ADDRESS
    session = f"class{k:02d}page"
    if i == 1:
        raw.get("")
        note("page load", raw.call("load", [], session), t0, "class page load")
        return
    if k == 30:
        for answer in raw.call_many([("render_after_preset", ["phoenix-nano", "attention"]),
                                     ("render_after_preset", ["lecture", "attention"])], session, gap_s=0.3):
            note("render_after_preset", answer, t0, "lecturer's preset switch")
        time.sleep(5.0)
        return
    time.sleep(rng.uniform(1.0, 3.0))
    t0 = time.perf_counter()
    tab = rng.choice(("attention", "attention", "isolation", "invariance", "mask"))
    query = LECTURE_Q + f"&seed={rng.randint(1, 9)}&head={rng.randint(-1, 3)}&layer={rng.randint(0, 1)}"
    note("render_on_change", raw.call("render_on_change", change_data(raw.fn, query, tab, LECTURE_Q), session), t0,
         "class view")


CLASSROOM_ADDRESS = "10.15.0.1"


def botnet(raw: RawClient, k: int, i: int, note, t0: float, fresh) -> None:
    """Thread `k` of the botnet: 0-11 an address of one IPv6 /64 with two sessions asking lecture views every
    0.5 s; 12-28 an address of one /24 holding a timing sweep; 29-31 heavy views, packs, exports, each from a
    fresh address of two more /24s."""
    if k < 12:
        raw.address = f"2001:db8:34:17::{k + 1:x}"
        view = ("attention", "isolation", "invariance")[i % 3]
        note(f"/{view}", raw.call(view, [LECTURE_Q + f"&seed={i % 7}"], f"bot6x{k}x{i % 2}"), t0)
        time.sleep(0.5)
    elif k < 29:
        raw.address = f"198.18.17.{k}"
        note("/timing", raw.call("timing", list(LONG_SWEEP), f"botsweep{k}"), t0)
    else:
        raw.address = f"198.18.{18 + (k == 31)}.{(i * 3 + k) % 250 + 1}"
        api, data = {29: ("invariance", [HEAVY_INVARIANCE]), 30: ("lecture_pack", [PACK_PRESET, "16:9"]),
                     31: ("export_figure", [LECTURE_Q, "attention", "png", "16:9"])}[k]
        note(f"/{api}", raw.call(api, data, fresh()), t0)


def smaller(raw: RawClient, url: str, i: int, files: list, note, t0: float) -> None:
    """Finding 9's checks, one per loop: an error answer of /gradio_api/run/ echoes little, screen recordings
    are closed, and one browser's closed page keeps its weights when a classmate behind the address uploads."""
    raw.address = "10.19.0.1"
    if i % 3 == 1:
        r = raw.http.post(f"{url}gradio_api/run/settings", headers=raw.headers(), json={"data": ["x" * 900_000]})
        echoed = len(r.content)
        note("900 KB to /run/settings", None if r.status_code >= 400 and echoed < 8192 else
             f"{CHECK_FAILED}HTTP {r.status_code}, {echoed:,} bytes echoed", t0)
    elif i % 3 == 2:
        r = raw.http.post(f"{url}gradio_api/process_recording", headers=raw.headers(), json={})
        note("process_recording", None if r.status_code == 404 else f"{CHECK_FAILED}HTTP {r.status_code}", t0)
    else:
        import httpx
        first, second = f"gracepageA{i}", f"gracepageB{i}"
        mine, theirs = RawClient(url, raw.address, raw.fn), RawClient(url, raw.address, raw.fn)   # two browsers
        mine.get("")
        theirs.get("")                          # two browsers: two cookies
        query, error = mine.upload_weights(files[0], LECTURE_Q, first)
        if error:
            return note("grace", f"{CHECK_FAILED}upload refused: {error}", t0)
        mine.call("page_gone", [], first)       # its page closed (a dropped connection); it answers nothing
        theirs.upload_weights(files[1], LECTURE_Q, second)
        answer = mine.call("attention", [query], first)
        note("grace", None if answer is None else f"{CHECK_FAILED}{answer}", t0)
        for client in (mine, theirs):
            with contextlib.suppress(httpx.HTTPError):
                client.http.close()
    time.sleep(2.0)


def honest(url: str, index: int, start: threading.Barrier, stop_at: list, records: list, lock: threading.Lock,
           seed: int, fn: dict) -> None:
    """One honest visitor (its own address and session), one request at a time with no pause between:
    the page's protocol over plain HTTP (RawClient), so its process spends its CPU as a browser would
    (parsing the answers), not on gradio_client's job machinery (5x the CPU per request, measured)."""
    rng = random.Random(seed * 1000 + index)
    raw = RawClient(url, f"10.{1 + index // 250}.{index % 250}.1", fn)     # each its own network, as homes are
    views, weights = zip(*((v, w) for v, (_, w) in MIX.items()))
    start.wait()
    while time.monotonic() < stop_at[0]:
        view = rng.choices(views, weights)[0]
        args = request_args(view, rng)
        t0 = time.perf_counter()
        error = refused = None
        try:
            answer = raw.call(MIX[view][0].lstrip("/"), list(args), f"honest{index:04d}")
        except Exception as e:                      # noqa: BLE001 — every failure counts, whatever its type
            answer = f"{type(e).__name__}: {str(e)[:300]}"
        if answer is not None:
            refused, error = (answer, None) if _refusal(answer) else (None, answer)
        with lock:
            records.append(dict(side="honest", kind=view, what=MIX[view][0], latency_s=time.perf_counter() - t0,
                                error=error, refused=refused, visitor=index, query=args[0], t=time.monotonic()))


def probe(url: str, start: threading.Barrier, stop_at: list, records: list, lock: threading.Lock, fn: dict) -> None:
    """One more honest visitor of its own address (one page: one session) asking for the lecture /mask one at
    a time (0.3 s apart), over plain HTTP so each answer splits into phases: join (the POST, admission
    included), wait (queued until Gradio starts it), run (the view function, as Gradio times it) and rest
    (pre/postprocessing and the answer's way back)."""
    raw = RawClient(url, PROBE_ADDRESS, fn)
    start.wait()
    i = 0
    while time.monotonic() < stop_at[0]:
        i += 1
        t0 = time.perf_counter()
        phases = raw.call("mask", [f"preset=lecture&seed={i % 4}&head={i % 4}"], "probe0000001", timed=True)
        with lock:
            records.append(dict(side="probe", kind="lecture /mask", latency_s=time.perf_counter() - t0,
                                t=time.monotonic(), refused=None, **phases))
        time.sleep(0.3)


def uploader(url: str, tmp: Path, start: threading.Barrier, stop_at: list, records: list, lock: threading.Lock,
             fn: dict) -> None:
    """An honest visitor uploading weights (a lecture-geometry file) every 10 s and drawing /attention with
    them: every upload must be taken, whatever fills the disk or the store."""
    raw = RawClient(url, UPLOADER_ADDRESS, fn)
    path = _weights_of(tmp, "preset=lecture", 5)
    start.wait()
    while time.monotonic() < stop_at[0]:
        t0 = time.perf_counter()
        query, error = raw.upload_weights(path, LECTURE_Q, "uploader0001")
        if query is not None:
            error = raw.call("attention", [query], "uploader0001")
        refused = error if error and _refusal(error) else None
        with lock:
            records.append(dict(side="honest", kind="upload (honest)", what="upload + /attention",
                                latency_s=time.perf_counter() - t0, error=None if refused else error,
                                refused=refused, t=time.monotonic()))
        time.sleep(max(0.0, 10.0 - (time.perf_counter() - t0)))


PROBE_ADDRESS, UPLOADER_ADDRESS = "10.2.0.1", "10.6.0.1"


def _client_machine(role: str, args: list, url: str, seed: int, tmp: str, ready, go, stop_value, out) -> None:
    """A client machine of the soak, in a process of its own (so no client's GIL slows another's
    timing): the honest visitors `args` (indices), the modes' loops (names) or the probe and the uploader. Its
    threads set up, wait for every machine (`ready`), start together (`go`), run to `stop_value` and put
    (records, the files left in Gradio's cache) on `out`."""
    records, lock, stop_at = [], threading.Lock(), [float("inf")]
    if role == "honest":
        n = len(args)
    elif role == "probe":
        n = 2
    else:
        n = sum(Attack[name].threads for name in args)
    start = threading.Barrier(n + 1, timeout=300)       # every thread, and this one (a thread that failed to
    fn = api_functions(url, f"10.3.0.{os.getpid() % 250 + 1}")     # set up breaks it instead of hanging)
    if role == "honest":
        threads = [threading.Thread(target=honest, args=(url, i, start, stop_at, records, lock, seed, fn),
                                    daemon=True) for i in args]
    elif role == "probe":
        threads = [threading.Thread(target=probe, args=(url, start, stop_at, records, lock, fn), daemon=True),
                   threading.Thread(target=uploader, args=(url, Path(tmp), start, stop_at, records, lock, fn),
                                    daemon=True)]
    else:
        threads = [threading.Thread(target=attacker, args=(Attack[name], k, url, stop_at, records, lock, Path(tmp),
                                                           start, fn), daemon=True)
                   for name in args for k in range(Attack[name].threads)]
    assert len(threads) == n
    for t in threads:
        t.start()
    ready.wait()
    go.wait()
    stop_at[0] = stop_value.value
    start.wait()
    for t in threads:                       # a request still waiting END_GRACE_S after the end is left behind
        t.join(timeout=max(1.0, stop_at[0] + END_GRACE_S - time.monotonic()))
    with lock:
        out.put((role, list(records), list(RAW_UPLOADS), sum(t.is_alive() for t in threads), time.process_time()))


END_GRACE_S = 30.0


class HealthSampler:
    """The server's /healthz every second on a thread: the most its stores held (the upload store, the raw
    uploads, Gradio's temp dir) and every answer that was not 200 (a stopped queue)."""

    def __init__(self, url: str):
        self.url, self.done, self.most, self.down, self.last = url, threading.Event(), {}, 0, None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> Optional[dict]:
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"{self.url}healthz", timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            self.down += 1
            return json.loads(e.read() or b"{}")
        except (OSError, ValueError):
            self.down += 1
            return None

    def _run(self) -> None:
        while not self.done.wait(1.0):
            health = self.read()
            if health:
                self.last = health
                for k, v in health.items():
                    if isinstance(v, (int, float)):
                        self.most[k] = max(self.most.get(k, 0), v)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def bounds() -> dict:
    """The bounds the server holds its stores to (what the soak's checks compare with), from its modules."""
    from server import disk, uploads
    return dict(upload_store_bytes=uploads.MAX_UPLOAD_STORE_BYTES, raw_upload_bytes=disk.RAW_UPLOAD_BYTES,
                temp_dir_bytes=disk.TEMP_DIR_BYTES)


def _stats(lat: list) -> dict:
    lat = sorted(lat)
    if not lat:
        return dict(requests=0, p50_s=None, p95_s=None, max_s=None)
    return dict(requests=len(lat), p50_s=round(percentile(lat, 50), 3), p95_s=round(percentile(lat, 95), 3),
                max_s=round(lat[-1], 3))


def _below(value: Optional[float], target: float) -> bool:
    return value is not None and value < target


def server_side_of(key: str) -> str:
    """Which of the soak's visitors a server-side visitor key is (by the addresses the clients send)."""
    if key == f"addr:{CLASSROOM_ADDRESS}":
        return "classroom"
    if key == f"addr:{PROBE_ADDRESS}":
        return "probe"
    if key.startswith("addr:10.1."):            # honest(): 10.{1 + index // 250}.{index % 250}.1
        return "honest"
    if key.startswith("addr:10.14."):           # the page visitors beside API clients (PAGE_VS_API)
        return "page visitors"
    return "others"


def _logged(event_log: Path) -> list:
    """The server's event log (server.gradio_patches.EVENT_LOG_ENV), line by line as written (a line cut short by
    the server's end left out; no file: nothing)."""
    out = []
    with contextlib.suppress(OSError):
        for line in event_log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def _time_weighted(lags: list, tick_s: float, q: float) -> Optional[float]:
    """The lag that a share `q` of the watched time passed in ticks at most that late (each tick lasts `tick_s`
    plus its lag): a tick count would weigh a second of idle loop's hundred ticks over a busy second's ten."""
    lags, total, seen = sorted(lags), sum(tick_s + x for x in lags), 0.0
    for x in lags:
        seen += tick_s + x
        if seen >= q * total:
            return round(x, 3)
    return None


def event_loop(event_log: Path, start: float, end: float) -> dict:
    """The server's event loop over [start, end], from its event log (server.gradio_patches.watch_the_loop): how
    late it came back to a 10 ms sleep (each step of every request waits that long for its turn), as shares of
    the time watched (lag_p50_s: half the time passed in ticks at most that late), and the share of the time its
    thread was on a CPU, runnable but waiting for one, or asleep (idle, or waiting for the GIL)."""
    from server.gradio_patches import LOOP_TICK_S
    lags, window, on_cpu, cpu_wait, known = [], 0.0, 0.0, 0.0, True
    for w in _logged(event_log):
        with contextlib.suppress(KeyError, TypeError):
            if "loop" not in w or w["since"] < start or w["loop"] > end:
                continue
            lags += w["lags_s"]
            window += w["window_s"]
            if w["on_cpu_s"] is None or w["cpu_wait_s"] is None:
                known = False
            else:
                on_cpu, cpu_wait = on_cpu + w["on_cpu_s"], cpu_wait + w["cpu_wait_s"]
    shares = dict(on_cpu_share=round(on_cpu / window, 3), waiting_for_cpu_share=round(cpu_wait / window, 3),
                  asleep_share=round(1 - (on_cpu + cpu_wait) / window, 3)) if window and known else {}
    return dict(ticks=len(lags), lag_p50_s=_time_weighted(lags, LOOP_TICK_S, 0.5),
                lag_p95_s=_time_weighted(lags, LOOP_TICK_S, 0.95), lag_max_s=round(max(lags), 3) if lags else None,
                watched_s=round(window, 1), **shares)


def server_side(event_log: Path, start: float, end: float) -> dict:
    """Where the requests' time went on the server, from its event log (server.gradio_patches.EVENT_LOG_ENV):
    per visitor side and lane, the events that started in [start, end] (monotonic seconds, the machine's
    clock), their wait in the lane (queued to started) and their processing (started to ended: the handler,
    Gradio's pre- and postprocessing and its messages, on a shared event loop) -> {side: {lane: figures}}."""
    events = collections.defaultdict(list)
    for e in _logged(event_log):
        with contextlib.suppress(KeyError, TypeError):          # the loop's windows are not events
            if start <= e["started"] <= end:
                events[(server_side_of(e["key"]), e["lane"])].append(e)
    out = collections.defaultdict(dict)
    for (side, lane), es in sorted(events.items()):
        wait = _stats([e["started"] - e["queued"] for e in es if e["queued"] is not None])
        process = _stats([e["ended"] - e["started"] for e in es])
        out[side][lane] = dict(events=len(es), wait_p50_s=wait["p50_s"], wait_p95_s=wait["p95_s"],
                               process_p50_s=process["p50_s"], process_p95_s=process["p95_s"])
    return dict(out)


def run_soak(url: str, honest_n: int, duration_s: float, seed: int, processes: int = 6,
             records_out: Optional[Path] = None, attacks: Optional[list] = None,
             after_s: float = SOAK_TARGETS["after_s"], event_log: Optional[Path] = None) -> dict:
    """One soak run against the app at `url`: `honest_n` honest visitors, the probe and the uploader beside
    the modes `attacks` for `duration_s` -> the run's figures, its checks and its targets (RSS `after_s`
    after the load; its target only where that is the target's wait); with the server's `event_log`, where
    the time went server side (server_side)."""
    import multiprocessing
    import queue as queue_module
    import tempfile
    from gradio_client import Client
    pid = server_pid(url)
    if pid is None:
        raise RuntimeError(f"no app.py process found serving {url} (the soak reads the server's memory from /proc)")
    warm = Client(url, verbose=False)
    rng = random.Random(seed)
    for view, (api, _) in MIX.items():
        warm.predict(*request_args(view, rng), api_name=api)
    time.sleep(2.0)
    rss_start = family_rss_bytes(pid)
    sampler, health = RssSampler(pid), HealthSampler(url)
    ctx = multiprocessing.get_context("spawn")
    visitors = [list(range(honest_n))[k::processes] for k in range(min(processes, honest_n))]
    attacks = ATTACKS if attacks is None else attacks
    attack_side = [a.name for a in attacks if a.side == "attacker"]
    honest_side = [a.name for a in attacks if a.side == "honest"]
    machines = ([("honest", v) for v in visitors] + [("attacker", attack_side)] * bool(attack_side)
                + [("modes", honest_side)] * bool(honest_side) + [("probe", [0])])
    ready, go, stop_value, out = ctx.Barrier(len(machines) + 1), ctx.Barrier(len(machines) + 1), ctx.Value("d", 0.0), \
        ctx.Queue()
    records, still_running, client_cpu = [], 0, {}
    with tempfile.TemporaryDirectory(prefix="load-soak-") as tmp:
        procs = [ctx.Process(target=_client_machine, args=(role, args, url, seed, tmp, ready, go, stop_value, out),
                             daemon=True) for role, args in machines]
        for p in procs:
            p.start()
        ready.wait(timeout=300)
        t0 = time.monotonic()
        stop_value.value = t0 + duration_s
        sampler.start()
        health.start()
        go.wait()
        for _ in procs:
            try:
                role, recs, uploads, alive, cpu = out.get(timeout=max(1.0, t0 + duration_s + END_GRACE_S + 60
                                                                      - time.monotonic()))
            except queue_module.Empty:
                still_running += 1
                continue
            client_cpu[role] = client_cpu.get(role, 0.0) + cpu
            records += recs
            RAW_UPLOADS.extend(uploads)
            still_running += alive
        load_end = time.monotonic()
        server_cpu = sampler.cpu
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():                # requests left behind: they stop with their process
                p.terminate()
        time.sleep(after_s)
        after_by_role = family_rss_by_role(pid)
        rss_after = sum(after_by_role.values())
        sampler.stop()
        health.stop()
        final = health.read()
    samples = sampler.samples
    for path in RAW_UPLOADS:                        # the files left in Gradio's cache (same machine)
        with contextlib.suppress(OSError):
            os.remove(path)
    RAW_UPLOADS.clear()
    during = [r for t, r in samples if t <= load_end]
    sides = {}
    for side, kinds in (("honest", [*MIX, "upload (honest)"]), ("classroom", None), ("fairness", None),
                        ("attacker", [a.label for a in attacks if a.side == "attacker"])):
        kinds = kinds or sorted({r["kind"] for r in records if r["side"] == side})
        sides[side] = {}
        for kind in kinds:
            rs = [r for r in records if r["side"] == side and r["kind"] == kind]
            sides[side][kind] = dict(_stats([r["latency_s"] for r in rs]), failures=sum(bool(r["error"]) for r in rs),
                                     refused_by_name=sum(bool(r["refused"]) for r in rs))
    if records_out:
        records_out.write_text(json.dumps(records))
    served = [r for r in records if r["side"] in HONEST_SIDES]
    probed = [r for r in records if r["side"] == "probe"]
    phases = {name: {k: v for k, v in _stats([r[name] for r in probed if r.get(name) is not None
                                              and not r["error"]]).items() if k in ("p50_s", "p95_s")}
              for name in ("latency_s", "join_s", "wait_s", "run_s", "rest_s")}
    checks_failed = sorted({r["error"][len(CHECK_FAILED):] for r in records if (r.get("error") or "").startswith(CHECK_FAILED)})
    limits = bounds()
    result = dict(
        modes=[a.label for a in attacks], wall_s=round(load_end - t0, 2), clients_still_running=still_running,
        **sides,
        honest_total=dict(requests=len(served), failures=sum(bool(r["error"]) for r in served),
                          refused_by_name=sum(bool(r["refused"]) for r in served),
                          sides=list(HONEST_SIDES)),
        attacker_refusals=sorted({r["refused"] for r in records if r["side"] == "attacker" and r["refused"]})[:12],
        attacker_errors=sorted({r["error"] for r in records if r["side"] == "attacker" and r["error"]})[:12],
        honest_errors=sorted({r["error"] or r["refused"] for r in served if r["error"] or r["refused"]})[:12],
        probe=dict(requests=len(probed), failures=sum(bool(r["error"]) for r in probed), phases=phases),
        cpu_seconds=dict(server_cpu, **{f"{role}_clients_s": round(v, 1) for role, v in client_cpu.items()},
                         cores=os.cpu_count(), why="the clients run on the server's machine: what they use, "
                                                   "the server cannot"),
        memory=dict(rss_start_gb=round(rss_start / 1e9, 3), peak_rss_gb=round(max(during, default=0) / 1e9, 3),
                    rss_after_gb=round(rss_after / 1e9, 3), after_s=after_s,
                    rss_after_by_process_gb={k: round(v / 1e9, 3) for k, v in after_by_role.items()},
                    timeline_gb=[(round(t - t0, 1), round(r / 1e9, 3)) for t, r in samples[::25]],
                    timeline_by_process_gb=[(round(t - t0, 1), *(round(v / 1e9, 3) for v in roles.values()))
                                            for (t, _), roles in list(zip(samples, sampler.roles))[::25]],
                    timeline_by_process_columns=["t_s", "server", "drawing", "browser"]),
        stores=dict(most={k: health.most.get(k, 0) for k in limits}, bounds=limits,
                    queue_restarts=(final or {}).get("restarts"), health_not_ok=health.down),
        queue_alive_at_end=bool(final) and final.get("queue") == "running",
        checks_failed=checks_failed)
    if event_log is not None:
        result["server_side"] = server_side(event_log, t0, load_end)
        result["event_loop"] = event_loop(event_log, t0, t0 + duration_s)     # the load, not its drain
    m = result["memory"]
    h = result["honest_total"]
    result["honest_mask_p95_s"] = sides["honest"]["mask"]["p95_s"]
    result["honest_model_views_p95_s"] = _stats([r["latency_s"] for r in records
                                                 if r["side"] == "honest" and r["kind"] in MODEL_VIEWS])["p95_s"]
    result["classroom_views_p95_s"] = _stats([r["latency_s"] for r in records
                                              if r["side"] == "classroom" and r["kind"] == "class view"])["p95_s"]
    uploads = sides["honest"]["upload (honest)"]
    result["honest_uploads"] = dict(requests=uploads["requests"], taken=uploads["requests"] - uploads["failures"]
                                    - uploads["refused_by_name"])
    first = min((r["t"] - r["latency_s"] for r in records if "t" in r), default=0.0)
    settled = [r["latency_s"] for r in records if r["side"] == "honest" and r["kind"] == "mask"
               and r["t"] - r["latency_s"] - first >= SETTLED_AFTER_S]
    result["honest_mask_after_the_first_seconds"] = dict(
        from_s=SETTLED_AFTER_S, **{k: v for k, v in _stats(settled).items() if k != "max_s"},
        why="every visitor's first request and the attacks' first bursts arrive in the same instant")
    stores = result["stores"]
    met = dict(
        peak_rss_gb=m["peak_rss_gb"] < SOAK_TARGETS["peak_rss_gb"],
        honest_mask_p95_s=_below(result["honest_mask_p95_s"], SOAK_TARGETS["honest_mask_p95_s"]),
        honest_failures=h["failures"] + h["refused_by_name"] <= SOAK_TARGETS["honest_failures"],
        honest_model_views_p95_s=_below(result["honest_model_views_p95_s"], SOAK_TARGETS["honest_model_views_p95_s"]),
        stores_within_bounds=all(stores["most"][k] <= stores["bounds"][k] for k in stores["bounds"]),
        honest_uploads_taken=uploads["requests"] > 0 and result["honest_uploads"]["taken"] == uploads["requests"],
        queue_alive_at_end=result["queue_alive_at_end"],
        mode_checks=not checks_failed,
        # the attacks answered within their bounds are not refused; every other attack of the attacker is, once
        # past its bound
        attacker_refused_by_name=all(refused_past_bound(a, sides["attacker"][a.label], duration_s) for a in attacks
                                     if a.side == "attacker" and a not in ANSWERED_ATTACKS))
    if after_s >= SOAK_TARGETS["after_s"]:
        met["rss_after_gb"] = m["rss_after_gb"] < SOAK_TARGETS["rss_after_gb"]
    if result["classroom_views_p95_s"] is not None:
        met["classroom_views_p95_s"] = _below(result["classroom_views_p95_s"], SOAK_TARGETS["classroom_views_p95_s"])
    result["targets"] = dict(SOAK_TARGETS, met=met)
    return result


def soak_once(a, attacks: list, duration_s: float, after_s: float = SOAK_TARGETS["after_s"],
              root: Optional[Path] = None, own_session: bool = True) -> dict:
    """A fresh app (Space mode: one trusted proxy; its own temp dir; of checkout `root`, by default this one;
    in a session of its own unless `own_session` is False: harness.localhost.running_app) soaked once with
    `attacks`."""
    import tempfile
    from server.visitors import TRUSTED_PROXIES_ENV
    from server.gradio_patches import EVENT_LOG_ENV
    with tempfile.TemporaryDirectory(prefix="soak-gradio-") as temp, \
            tempfile.TemporaryDirectory(prefix="soak-events-") as logs:
        event_log = Path(logs) / "events.jsonl"
        # a Space's defaults: the last forwarding address trusted, model views drawn beside the server
        # (server.drawing; a commit before it ignores the variable)
        with running_app(root=root, env={TRUSTED_PROXIES_ENV: "1", "EXPLORER_DRAW_PROCESSES": "1",
                                         "GRADIO_TEMP_DIR": temp, EVENT_LOG_ENV: str(event_log)},
                         own_session=own_session) as url:
            return run_soak(url, a.sessions, duration_s, a.seed, a.client_processes, a.records, attacks, after_s,
                            event_log)


# What each figure of a run is and which way is worse: the suite quotes min / median / max over its full runs
# and claims the worst.
SUITE_FIGURES = {"honest_mask_p95_s": max, "honest_model_views_p95_s": max, "classroom_views_p95_s": max,
                 "honest failures": max, "peak_rss_gb": max, "rss_after_gb": max}


def figures_of(run: dict) -> dict:
    h = run["honest_total"]
    return {"honest_mask_p95_s": run["honest_mask_p95_s"], "honest_model_views_p95_s": run["honest_model_views_p95_s"],
            "classroom_views_p95_s": run["classroom_views_p95_s"], "honest failures": h["failures"] + h["refused_by_name"],
            "peak_rss_gb": run["memory"]["peak_rss_gb"], "rss_after_gb": run["memory"]["rss_after_gb"]}


def worst_run(runs: list) -> int:
    """The index of the worst full run: most targets missed, then the largest share of its target reached by
    any figure with one (a p95 of 0.9 s against 1 s is 0.9)."""
    def badness(run):
        figures, targets = figures_of(run), run["targets"]
        shares = [figures[k] / targets[k] for k in ("honest_mask_p95_s", "honest_model_views_p95_s",
                                                    "classroom_views_p95_s", "peak_rss_gb", "rss_after_gb")
                  if figures.get(k) is not None and targets.get(k)]
        return sum(not v for v in targets["met"].values()), max(shares, default=0.0)
    return max(range(len(runs)), key=lambda i: badness(runs[i]))


def spread_of(figures: list) -> dict:
    """Min / median / max of every figure (SUITE_FIGURES) over runs' figures (figures_of), where a run has it."""
    import statistics
    return {name: dict(min=min(v), median=statistics.median(v), max=max(v)) for name in SUITE_FIGURES
            if (v := [f[name] for f in figures if f.get(name) is not None])}


def ab_order(pairs: int) -> list[str]:
    """The versions' order over `pairs` pairs: before, after; after, before; ... (a slow spell of the machine
    falls on both)."""
    return [v for p in range(pairs) for v in (("before", "after") if p % 2 == 0 else ("after", "before"))]


BEFORE_SESSION = {False: "its own (harness.localhost.running_app)",
                  True: "the soak's, beside its clients (--before-shared-session)"}


def main_soak_ab(a) -> dict:
    """--soak --before REF: soak runs of commit REF and of this tree alternated (ab_order), a fresh app each. One
    all-modes run spreads too far for one pair to say anything: the file keeps every run and each version's
    min / median / max."""
    from harness.reports import checkout, short_commit
    when = dt.datetime.now(dt.timezone.utc)
    before = short_commit(a.before)
    out = a.out or RESULTS_DIR / f"load-soak-ab-{when.date().isoformat()}.json"
    report = dict(kind="soak-ab", date=when.isoformat(timespec="seconds"), device=machine(),
                  before=dict(commit=before, app_session=BEFORE_SESSION[a.before_shared_session]),
                  after=dict(commit=git_commit(), tree="this checkout, as it is", app_session=BEFORE_SESSION[False]),
                  parameters=dict(duration_s=a.duration, honest_visitors=a.sessions, pairs=a.pairs,
                                  modes=[m.label for m in a.attacks], order=ab_order(a.pairs), conditions=a.conditions),
                  runs=[])
    with checkout(a.before) as before_root:
        for version in ab_order(a.pairs):
            load = os.getloadavg()[0]
            before_side = version == "before"
            r = soak_once(a, a.attacks, a.duration, root=before_root if before_side else None,
                          own_session=not (before_side and a.before_shared_session))
            report["runs"].append(dict(version=version, load_average_before=round(load, 2),
                                       honest_requests=r["honest_total"]["requests"], cpu_seconds=r["cpu_seconds"],
                                       **figures_of(r)))
            report["summary"] = {v: spread_of([x for x in report["runs"] if x["version"] == v])
                                 for v in ("before", "after")}
            out.write_text(json.dumps(report, indent=1) + "\n")
            print(f"  {version}: model views p95 {r['honest_model_views_p95_s']}, classroom "
                  f"{r['classroom_views_p95_s']}, mask {r['honest_mask_p95_s']}, honest requests "
                  f"{r['honest_total']['requests']}", flush=True)
    print(f"-> {out}")
    return report


def summarise_suite(baseline: dict, alone: dict, runs: list) -> dict:
    """Min / median / max of every figure over the full runs, the worst run and its targets, and what each
    mode alone cost the honest visitors against the baseline."""
    spread = spread_of([figures_of(r) for r in runs])
    worst = worst_run(runs)
    cost = {label: {**figures_of(run), "attacker_refused_by_name": sum(
        v["refused_by_name"] for v in run["attacker"].values()), "targets_missed": sorted(
        k for k, v in run["targets"]["met"].items() if not v)} for label, run in alone.items()}
    return dict(spread=spread, worst_run=worst, worst_targets_met=runs[worst]["targets"]["met"],
                baseline=figures_of(baseline), mode_alone=cost)


def main_suite(a) -> dict:
    """The soak of record (issue 34): honest visitors alone once, each mode alone once, then --runs runs with
    every mode; the file keeps every run and quotes the worst."""
    from server.memory import memory_budget
    os.environ["EXPLORER_DRAW_PROCESSES"] = "1"         # memory_budget() as the soaked app's (soak_once's env)
    when = dt.datetime.now(dt.timezone.utc)
    after = SOAK_TARGETS["after_s"]
    plan = [("baseline", [], a.mode_duration, after)] + [(m.label, [m], a.mode_duration, ALONE_AFTER_S)
                                                         for m in a.attacks] + \
        [(f"full run {i + 1}", a.attacks, a.duration, after) for i in range(a.runs)]
    print(f"soak suite: {len(plan)} runs, {sum(p[2] for p in plan) / 60:.0f} min of load, about "
          f"{sum(p[2] + p[3] + SUITE_OVERHEAD_S for p in plan) / 60:.0f} min in all", flush=True)
    results = {}
    for name, modes, duration, after_s in plan:
        t = time.monotonic()
        results[name] = soak_once(a, modes, duration, after_s)
        r = results[name]
        print(f"  {name}: {time.monotonic() - t:.0f} s; honest mask p95 {r['honest_mask_p95_s']:.2f} s, model views "
              f"p95 {r['honest_model_views_p95_s']:.2f} s, classroom p95 {r['classroom_views_p95_s']}, honest failed "
              f"{r['honest_total']['failures']} refused {r['honest_total']['refused_by_name']}, peak "
              f"{r['memory']['peak_rss_gb']} GB; missed: "
              f"{sorted(k for k, v in r['targets']['met'].items() if not v)}", flush=True)
    runs = [results[f"full run {i + 1}"] for i in range(a.runs)]
    alone = {m.label: results[m.label] for m in a.attacks}
    report = dict(kind="soak-suite", date=when.isoformat(timespec="seconds"), git_commit=git_commit(),
                  device=machine(),
                  parameters=dict(duration_s=a.duration, mode_duration_s=a.mode_duration, runs=a.runs,
                                  honest_visitors=a.sessions, targets=SOAK_TARGETS,
                                  modes={m.label: dict(does=m.does, connections=m.threads, side=m.side)
                                         for m in a.attacks},
                                  honest_mix={v: dict(api=api, weight=w) for v, (api, w) in MIX.items()},
                                  honest_others="a probe (one lecture /mask at a time, its own address, split into "
                                                "phases) and an uploader (lecture weights every 10 s, then /attention "
                                                "with them), each its own address",
                                  memory_budget_bytes=memory_budget(), bounds=bounds(),
                                  latency="end to end per request, queue wait included",
                                  clients=f"{a.client_processes} processes of honest visitors, one of the attacker's "
                                          "modes, one of the honest modes (classroom, page visitors), one of the "
                                          "probe and the uploader, each with its own GIL, on the server's machine; "
                                          "every client speaks the page's protocol over plain HTTP; the honest ones "
                                          "keep their connections alive as a browser does, the attacker's drop "
                                          "theirs at each answer; the app in a session of its own, the clients "
                                          "in the soak's (harness.localhost.running_app)",
                                  rss="VmRSS of the server process and the processes it started (the export "
                                      "browser), sampled every 0.2 s; 'after' 30 s after the load stops",
                                  addresses="every client sends X-Forwarded-For; the server trusts one proxy hop "
                                            "(Space mode), a fresh app and temp dir for every run",
                                  conditions=a.conditions),
                  summary=summarise_suite(results["baseline"], alone, runs),
                  baseline=results["baseline"], mode_alone=alone, runs=runs)
    report["device"]["load_average_after"] = os.getloadavg()[0]
    out = a.out or RESULTS_DIR / f"load-soak-{when.date().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    s = report["summary"]
    print(f"worst of {a.runs} full runs: run {s['worst_run'] + 1}; targets met: {s['worst_targets_met']} -> {out}")
    return report


SUITE_OVERHEAD_S = 55       # per run: the app's start and warm-up, the client processes, the end's stragglers
ALONE_AFTER_S = 5.0         # a mode alone shows its cost during the load; the 30 s after is the full runs' target


def main_soak(a) -> dict:
    """One soak run with the chosen modes (a quick look; the record is --suite)."""
    from server.memory import memory_budget
    os.environ["EXPLORER_DRAW_PROCESSES"] = "1"         # memory_budget() as the soaked app's (soak_once's env)
    when = dt.datetime.now(dt.timezone.utc)
    report = dict(kind="soak", date=when.isoformat(timespec="seconds"), git_commit=git_commit(), device=machine(),
                  parameters=dict(duration_s=a.duration, honest_visitors=a.sessions,
                                  modes={x.label: dict(does=x.does, connections=x.threads) for x in a.attacks},
                                  app_session=BEFORE_SESSION[False],
                                  memory_budget_bytes=memory_budget(), conditions=a.conditions),
                  **soak_once(a, a.attacks, a.duration))
    report["device"]["load_average_after"] = os.getloadavg()[0]
    out = a.out or RESULTS_DIR / f"load-soak-quick-{when.date().isoformat()}.json"      # not the record: --suite
    out.write_text(json.dumps(report, indent=1) + "\n")
    for side in ("honest", "classroom", "fairness", "attacker"):
        print(f"{side:<44}{'requests':>9}{'failed':>8}{'refused':>8}{'p50 s':>9}{'p95 s':>9}")
        for kind, r in report[side].items():
            print(f"  {kind:<42}{r['requests']:>9}{r['failures']:>8}{r['refused_by_name']:>8}"
                  + "".join(f"{r[k]:>9.3f}" if r[k] is not None else f"{'-':>9}" for k in ("p50_s", "p95_s")))
    print(f"{'server side: lane':<44}{'events':>9}{'wait p50':>9}{'p95':>8}{'process':>9}{'p95':>8}")
    for side in ("honest", "classroom", "probe"):
        for lane, r in report.get("server_side", {}).get(side, {}).items():
            print(f"  {side + ' / ' + lane:<42}{r['events']:>9}" + "".join(
                f"{r[k]:>{w}.3f}" for k, w in (("wait_p50_s", 9), ("wait_p95_s", 8), ("process_p50_s", 9),
                                             ("process_p95_s", 8))))
    if "event_loop" in report:
        print(f"event loop: {report['event_loop']}")
    m = report["memory"]
    print(f"RSS start {m['rss_start_gb']} GB, peak {m['peak_rss_gb']} GB, {m['after_s']:g} s after {m['rss_after_gb']} GB;"
          f" stores {report['stores']}; queue alive {report['queue_alive_at_end']}; checks failed "
          f"{report['checks_failed']}; targets met: {report['targets']['met']} -> {out}")
    return report


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running app; default: launch app.py on a free localhost port")
    ap.add_argument("--sessions", type=int, default=None, help="clients (default 24; --soak and --suite: 30 honest "
                    "visitors)")
    ap.add_argument("--duration", type=float, default=45.0, help="seconds of load (at most 60; --soak, --suite: "
                    "each full run, at most 120)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--abuse", action="store_true", help="the hostile-visitor mix instead (issue 14)")
    ap.add_argument("--soak", action="store_true", help="one soak run: --sessions honest visitors beside the "
                    "modes of --attacks")
    ap.add_argument("--suite", action="store_true", help="the soak of record: honest visitors alone, each mode "
                    "alone (--mode-duration s), then --runs runs with every mode (--duration s)")
    ap.add_argument("--runs", type=int, default=3, help="--suite: full runs (at least 3)")
    ap.add_argument("--mode-duration", type=float, default=30.0, help="--suite: seconds of each run with one mode")
    ap.add_argument("--client-processes", type=int, default=6, help="--soak: processes the honest visitors "
                    "are spread over (clients that share one process share its GIL and slow each other's timing)")
    ap.add_argument("--records", type=Path, default=None, help="--soak: also write every request's record "
                    "(side, kind, latency, start time, the probe's phases) to this JSON file")
    ap.add_argument("--conditions", default="", help="--abuse, --soak, --suite: a note on the machine's state, kept "
                    "in the file")
    ap.add_argument("--attacks", default="", help="--soak, --suite: the modes to run, by number (e.g. 7,15; none: "
                    "honest visitors alone; default all)")
    ap.add_argument("--before", default=None, help="--soak: a commit to soak beside this tree, run by run alternated "
                    "(--pairs pairs), into load-soak-ab-<date>.json")
    ap.add_argument("--pairs", type=int, default=5, help="--soak --before: pairs of runs (at least 5 for a claim)")
    ap.add_argument("--before-shared-session", action="store_true", help="--soak --before: the before side's app "
                    "runs in the soak's session, beside its clients, as the soaks before 2026-12-03 ran it (with "
                    "--before HEAD: what the app's own session changes)")
    a = ap.parse_args(argv)
    numbers = {a_.label.split()[0]: a_ for a_ in ATTACKS}
    chosen = [n.strip() for n in a.attacks.split(",") if n.strip() and n.strip() != "none"]
    if set(chosen) - set(numbers):
        ap.error(f"--attacks: got {a.attacks!r}; allowed: numbers among {', '.join(numbers)}, or none")
    a.attacks = [numbers[n] for n in chosen] if chosen or a.attacks.strip() == "none" else ATTACKS
    a.sessions = a.sessions or (30 if a.soak or a.suite else 24)
    if not 1 <= a.sessions <= 200:
        ap.error(f"--sessions: got {a.sessions}; allowed: 1..200")
    longest = 120 if a.soak or a.suite else 60
    if not 0 < a.duration <= longest:
        ap.error(f"--duration: got {a.duration}; allowed: (0, {longest}] seconds")
    if a.suite and (a.runs < 1 or not 0 < a.mode_duration <= 120):
        ap.error(f"--runs / --mode-duration: got {a.runs} / {a.mode_duration}; allowed: >= 1 (3 for the record) / "
                 "(0, 120] seconds")
    if a.before_shared_session and a.before is None:
        ap.error("--before-shared-session: allowed only with --soak --before REF")
    if a.before is not None and (not a.soak or not 1 <= a.pairs <= 20):
        ap.error(f"--before: got {a.before!r} with --pairs {a.pairs}; allowed: with --soak, 1..20 pairs")
    if a.suite:
        return main_suite(a)
    if a.soak and a.before is not None:
        return main_soak_ab(a)
    if a.soak:
        return main_soak(a)
    if a.abuse:
        return main_abuse(a)
    when = dt.datetime.now(dt.timezone.utc)
    info = dict(date=when.isoformat(timespec="seconds"), git_commit=git_commit(), device=machine(),
                parameters=dict(sessions=a.sessions, duration_s=a.duration, seed=a.seed,
                                mix={v: dict(api=api, weight=w) for v, (api, w) in MIX.items()},
                                timing_sweep="lengths 16, 32; naive only",
                                latency="end to end per request, queue wait included; one warm-up call "
                                        "per view before the clock, not counted",
                                server="app.py as shipped (queue default_concurrency_limit, per-endpoint "
                                       "limits), same machine as the clients"))
    report, out = run_and_write(a, lambda url: run(url, a.sessions, a.duration, a.seed), info, "load", when)
    print(f"{'view':<16}{'requests':>9}{'failed':>8}{'p50 s':>9}{'p95 s':>9}{'max s':>9}")
    for view, r in report["views"].items():
        print(f"{view:<16}{r['requests']:>9}{r['failures']:>8}{r['p50_s']:>9.3f}{r['p95_s']:>9.3f}"
              f"{(r['max_s'] or float('nan')):>9.3f}")
    t = report["total"]
    print(f"total {t['requests']} requests, {t['failures']} failed, {t['requests_per_s']} req/s -> {out}")
    return report


if __name__ == "__main__":
    report = main()
    if report.get("kind") == "soak-ab":
        sys.exit(1 if any(r["honest failures"] for r in report["runs"]) else 0)
    failed = report["summary"]["worst_targets_met"] if report.get("kind") == "soak-suite" else None
    sys.exit(1 if (failed is not None and not all(failed.values())) or
             (failed is None and (report.get("total") or report["honest_total"])["failures"]) else 0)
