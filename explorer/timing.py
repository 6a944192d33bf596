"""Flash vs naive, live: time every usable backend on this machine for the current layout shape.

Each point is measured by the benchmark core, ``benchmarks.attention.measure_point``. A sweep stops at the device's time budget (CPU: a free Space
must stay responsive) and reports where it stopped. Committed result files under
``benchmarks/results/`` are read and labelled as recorded (device, date).
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from models.attention import BACKENDS, unavailable_reason

from .figures import line_figure
from .settings import Settings, ValidationError, device, max_seq_len, sweep_budget_s

RESULTS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def device_name() -> str:
    if device() == "cuda":
        return torch.cuda.get_device_name(0)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {cpu} ({torch.get_num_threads()} threads)"


def parse_lengths(text: str) -> list[int]:
    """'64, 128, 256' -> [64, 128, 256]: each a sequence length within the device cap."""
    if not isinstance(text, str) or len(text) > 200:
        raise ValidationError("lengths", text, "comma-separated sequence lengths such as '64, 128, 256'")
    out = []
    for part in text.replace(";", ",").split(","):
        if not part.strip():
            continue
        try:
            T = int(part.strip())
        except ValueError:
            raise ValidationError("lengths", part.strip(), "whole numbers separated by commas") from None
        if not 2 <= T <= max_seq_len():
            raise ValidationError("lengths", T, f"each in [2, {max_seq_len()}] on {device().upper()}")
        out.append(T)
    if not out or len(out) > 12:
        raise ValidationError("lengths", text, "between 1 and 12 sequence lengths")
    return sorted(set(out))


@dataclass
class Point:
    backend: str
    seq_len: int
    ms: float
    peak_mb: float
    max_abs_error: float


@dataclass
class Sweep:
    device: str
    points: list[Point] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)    # backend -> why it did not run
    stopped: str = ""                                        # why the sweep ended early, if it did


def usable_backends(s: Settings) -> dict[str, Optional[str]]:
    """Every registered backend -> None if it runs here exactly with these settings, else the reason."""
    return {name: unavailable_reason(name, device=device(), cap=s.logit_cap, cap_method=s.cap_method,
                                     mask_kind=s.mask_kind, head_dim=s.key_size)
            for name in BACKENDS}


def sweep(s: Settings, lengths: list[int], backends: list[str], *, budget_s: Optional[float] = None,
          progress: Optional[Callable[[float, str], None]] = None, min_time_s: float = 0.05,
          should_stop: Optional[Callable[[], bool]] = None) -> Sweep:
    """Time each backend at each length with the benchmark core's ``measure_point`` (the model's
    heads, key size, candidates, mask and cap); errors are max |out - naive| on the same inputs."""
    from benchmarks.attention import make_inputs, measure_point
    budget = min(budget_s or sweep_budget_s(), sweep_budget_s())
    result = Sweep(device_name())
    why = usable_backends(s)
    run = ["naive"] + [b for b in backends if b in BACKENDS and not why[b] and b != "naive"]
    result.skipped = {b: (why.get(b) or "unknown backend") for b in backends if b not in run}
    start, total, done = time.perf_counter(), len(lengths) * len(run), 0
    for T in lengths:
        C = min(s.num_candidates, T - 1)
        inputs = make_inputs(1, s.num_q_heads, s.num_kv_heads, s.key_size, T, "float32", device(), seed=s.seed)
        reference = None
        for b in run:
            if time.perf_counter() - start > budget:
                result.stopped = f"Stopped at T = {T}: the {budget:.0f} s budget on {device().upper()} is spent."
                return result
            if should_stop is not None and should_stop():
                result.stopped = f"Stopped at T = {T}: cancelled."
                return result
            if progress:
                progress(done / total, f"{b} at T = {T}")
            rec, out = measure_point(b, mask=s.mask_kind, Hq=s.num_q_heads, Hkv=s.num_kv_heads,
                                     head_dim=s.key_size, T=T, num_candidates=C, device=device(),
                                     cap=s.logit_cap, cap_method=s.cap_method, inputs=inputs,
                                     reference=reference, return_output=True, min_time_s=min_time_s)
            if b == "naive":
                reference = out
            done += 1
            if rec["status"] != "ok":
                result.skipped[b] = f"{rec['status']} at T = {T}"
                continue
            result.points.append(Point(b, T, rec["median_ms"], rec["peak_mem_bytes"] / 2**20,
                                       rec["max_abs_err"] if rec["max_abs_err"] is not None else float("nan")))
    return result


def sweep_figures(sw: Sweep):
    by: dict[str, list[Point]] = {}
    for p in sw.points:
        by.setdefault(p.backend, []).append(p)
    label = f"<br><sup>measured now on {sw.device}</sup>"
    time_fig = line_figure({b: ([p.seq_len for p in ps], [p.ms for p in ps]) for b, ps in by.items()},
                           title="Time per attention call" + label, x_title="T", y_title="ms",
                           log_x=True, log_y=True)
    mem_fig = line_figure({b: ([p.seq_len for p in ps], [p.peak_mb for p in ps]) for b, ps in by.items()},
                          title="Memory" + label, x_title="T", y_title="MiB", log_x=True, log_y=True)
    naive = {p.seq_len: p.ms for p in by.get("naive", [])}
    speed_fig = line_figure({b: ([p.seq_len for p in ps if p.seq_len in naive],
                                 [naive[p.seq_len] / p.ms for p in ps if p.seq_len in naive])
                             for b, ps in by.items()},
                            title="Speed-up over naive" + label, x_title="T", y_title="× naive", log_x=True)
    err_fig = line_figure({b: ([p.seq_len for p in ps], [p.max_abs_error for p in ps]) for b, ps in by.items()},
                          title="Max |error| vs naive" + label, x_title="T", y_title="max abs error", log_x=True)
    return time_fig, mem_fig, speed_fig, err_fig


def recorded_results() -> list[dict]:
    """Committed attention benchmark files: [{file, device, date, gpu, points}], shown as recorded."""
    from benchmarks.attention import load_results, on_gpu
    return [dict(file=name, device=str(data["device_name"]), date=str(data.get("date", "unknown date")),
                 gpu=on_gpu(data), points=sum(r.get("status") == "ok" for r in data["records"]))
            for name, data in load_results(RESULTS_DIR)]


def recorded_summary() -> str:
    files = recorded_results()
    if not files:
        return "No recorded attention benchmark files are committed under `benchmarks/results/` yet."
    lines = [f"- `{f['file']}` — recorded on **{f['device']}**, {f['date']} ({f['points']} points)" for f in files]
    if not any(f["gpu"] for f in files):
        lines.append("- None of the recorded files comes from a GPU.")
    return "Recorded results (not measured now; see `python -m benchmarks.attention`):\n" + "\n".join(lines)
