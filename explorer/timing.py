"""Flash vs naive, live: time every usable backend on this machine for the current layout shape.

Uses ``benchmarks.attention.measure`` when that benchmark core is present, otherwise a small local
timer over ``models.attention.attend``. A sweep stops at the device's time budget (CPU: a free Space
must stay responsive) and reports where it stopped. Committed result files under
``benchmarks/results/`` are read and labelled as recorded (device, date).
"""
from __future__ import annotations

import importlib
import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from models.attention import BACKENDS, attend, unavailable_reason
from models.masks import AttentionMask

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
    """Every registered backend -> None if it runs here with these settings, else the reason."""
    return {name: unavailable_reason(name, device=device(), cap=s.logit_cap, cap_method=s.cap_method)
            for name in BACKENDS}


def _inputs(s: Settings, T: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(s.seed)
    C = min(s.num_candidates, T - 1)
    q = torch.randn(1, T, s.num_q_heads, s.key_size, generator=g, dtype=dtype)
    k = torch.randn(1, T, s.num_kv_heads, s.key_size, generator=g, dtype=dtype)
    v = torch.randn(1, T, s.num_kv_heads, s.key_size, generator=g, dtype=dtype)
    mask = AttentionMask("recsys" if s.prefix == "causal" else "recsys-bidirectional", T, T - C)
    return [t.to(device()) for t in (q, k, v)], mask


def _time_local(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[float, float, torch.Tensor]:
    out = fn()  # warm-up (and compilation for compiled backends)
    if device() == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        if device() == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device() == "cuda" else float("nan")
    return sorted(times)[len(times) // 2] * 1e3, peak, out


def sweep(s: Settings, lengths: list[int], backends: list[str], *, budget_s: Optional[float] = None,
          progress: Optional[Callable[[float, str], None]] = None, repeats: int = 3) -> Sweep:
    """Time each backend at each length; errors are max |out - naive| over all positions."""
    budget = min(budget_s or sweep_budget_s(), sweep_budget_s())
    result = Sweep(device_name())
    why = usable_backends(s)
    run = [b for b in backends if b in BACKENDS and not why[b]]
    result.skipped = {b: (why.get(b) or "unknown backend") for b in backends if b not in run}
    if "naive" not in run:
        run.insert(0, "naive")          # the reference every error is measured against
    start, total, done = time.perf_counter(), len(lengths) * len(run), 0
    for T in lengths:
        (q, k, v), mask = _inputs(s, T)
        ref = None
        for b in run:
            if time.perf_counter() - start > budget:
                result.stopped = f"stopped at T = {T}: the {budget:.0f} s budget on {device().upper()} is spent"
                return result
            if progress:
                progress(done / total, f"{b} at T = {T}")

            def call(b=b):
                return attend(q, k, v, mask, multiplier=s.multiplier, cap=s.logit_cap,
                              cap_method=s.cap_method, backend=b).out
            ms, peak, out = _time_local(call, repeats)
            if ref is None:
                ref = out.float()
            err = float((out.float() - ref).abs().max())
            if math.isnan(peak):
                # CPU: the memory the backend must hold for scores ([B, Hq, T, T] fp32 for naive)
                peak = (s.num_q_heads * T * T * 4 * 2 if b == "naive" else q.numel() * 4 * 4) / 2**20
            result.points.append(Point(b, T, ms, peak, err))
            done += 1
    return result


def sweep_figures(sw: Sweep, title_suffix: str = ""):
    by: dict[str, list[Point]] = {}
    for p in sw.points:
        by.setdefault(p.backend, []).append(p)
    label = f" — {sw.device}{title_suffix}"
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
    """Committed benchmark files: [{file, device, date, gpu, data}] — shown as recorded, not live."""
    out = []
    for path in sorted(RESULTS_DIR.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or path.name.startswith("app-latency"):
            continue
        dev = str(data.get("device", data.get("gpu", "unknown device")))
        out.append(dict(file=path.name, device=dev, date=str(data.get("date", "unknown date")),
                        gpu=any(w in dev.lower() for w in ("nvidia", "h100", "h200", "a100", "gpu", "cuda")),
                        data=data))
    return out


def recorded_summary() -> str:
    files = recorded_results()
    if not files:
        return "No recorded benchmark files are committed under benchmarks/results/ yet."
    lines = [f"- `{f['file']}` — recorded on **{f['device']}**, {f['date']}" for f in files]
    if not any(f["gpu"] for f in files):
        lines.append("- None of the recorded files comes from a GPU.")
    return "Recorded results (not measured now):\n" + "\n".join(lines)


def benchmark_core():
    """benchmarks.attention when it exists (the shared benchmark core), else None."""
    try:
        return importlib.import_module("benchmarks.attention")
    except ImportError:
        return None
