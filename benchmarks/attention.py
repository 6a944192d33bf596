"""Attention benchmark: every available backend on grok.py's attention, swept over sequence length.

    python -m benchmarks.attention --preset lecture|phoenix-prod|long [--device cpu|cuda] [--budget-s N]

Per point: median time after warm-up (CUDA events on GPU; on CPU, where every op is synchronous,
perf_counter), peak memory above the inputs (torch.cuda.max_memory_allocated / sampled RSS on CPU),
TFLOP/s counting only unmasked (useful) FLOPs, max |error| vs naive on the same inputs, and a status:
ok / oom / skipped: why / error: what. The same run measures dense matmul throughput as the yardstick.
Writes benchmarks/results/<device-slug>-<date>.json (+ .html and .png plots).

Importable core for the app: ``measure_point(...) -> record`` and ``sweep(...)``, a generator of
records that stops at its time budget or when ``should_stop()`` turns true (or the caller closes it).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from models.attention import BACKENDS, attend, unavailable_reason
from models.masks import AttentionMask

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# backends that hold [B, H, T, T] scores in memory (on CPU, a point that cannot fit is skipped, not tried:
# running out of RAM kills the process rather than raising)
MATERIALISING = {"naive": 16, "structured": 16, "sdpa": 12}    # bytes per score element, roughly
CPU_SCORES_LIMIT = 3 << 30    # the CPU machines here are shared: no point may hold more than 3 GiB of scores


@dataclass(frozen=True)
class Preset:
    description: str
    B: int
    Hq: int
    Hkv: int
    head_dim: int
    dtype: str
    seq_lens: tuple
    num_candidates: int
    masks: tuple = ("recsys",)
    cap_methods: tuple = ("tanh", "none")     # grok.py's tanh cap, and off (where SDPA can run)
    cap: float = 30.0


PRESETS: dict[str, Preset] = {
    "lecture": Preset("lecture geometry (4 q / 2 kv heads, head dim 16), growing history",
                      B=8, Hq=4, Hkv=2, head_dim=16, dtype="float32", seq_lens=(9, 64, 256, 1024),
                      num_candidates=3, masks=("recsys", "recsys-bidirectional")),
    "phoenix-prod": Preset("phoenix ranking prod: B 32, 20 q / 4 kv heads, head dim 128, "
                           "1 user + 1023 history + 64 candidates",
                           B=32, Hq=20, Hkv=4, head_dim=128, dtype="bfloat16", seq_lens=(1088,),
                           num_candidates=64, masks=("recsys", "recsys-bidirectional")),
    "long": Preset("long histories: prod heads, 64 candidates, T = 512 ... 32768",
                   B=1, Hq=20, Hkv=4, head_dim=128, dtype="bfloat16",
                   seq_lens=(512, 1024, 2048, 4096, 8192, 16384, 32768), num_candidates=64),
}

# On CPU the GPU presets would take hours on two cores: same geometry, smaller batch and T, fp32
# (CPU bf16 matmuls are emulated). Records carry the sizes actually run.
# Each new (T, mask, cap) is a fresh FlexAttention compile (~10-30 s on CPU), so CPU runs keep one mask.
CPU_REDUCTIONS = {
    "lecture": dict(masks=("recsys",)),
    "phoenix-prod": dict(B=1, dtype="float32", masks=("recsys",)),
    "long": dict(dtype="float32", seq_lens=(512, 1024, 2048, 4096)),   # naive stops at 2048 (scores limit)
}


def preset_for(name: str, device: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"preset: got {name!r}; allowed: {', '.join(PRESETS)}")
    p = PRESETS[name]
    return replace(p, **CPU_REDUCTIONS[name]) if device == "cpu" else p


# --- counting ---------------------------------------------------------------------------

def useful_pairs(kind: str, T: int, candidate_start_offset: int) -> int:
    """(query, key) pairs the mask allows, per batch row and head (no padding): the mask's own count."""
    return AttentionMask(kind, T, candidate_start_offset).useful_pairs()


def useful_flops(kind, B, Hq, head_dim, T, num_candidates) -> int:
    """QK^T and PV: 2 multiply-adds of head_dim per allowed pair -> 4 * head_dim FLOPs."""
    return 4 * B * Hq * head_dim * useful_pairs(kind, T, T - num_candidates)


# --- timing and memory ------------------------------------------------------------------

def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_median_ms(fn: Callable[[], object], device: str, min_time_s: float = 0.3, max_reps: int = 50,
                   warmup: Optional[int] = None) -> float:
    """Median of individually timed calls after `warmup` calls (compilation happens there)."""
    for _ in range(warmup if warmup is not None else (2 if device == "cuda" else 1)):
        fn()
    _sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 3 or time.perf_counter() - start < min_time_s):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _release_free_heap():
    """Hand freed heap pages back to the OS so the next RSS delta sees fresh allocations (glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _RssPeak:
    """Peak resident memory above the level at entry, sampled every millisecond in a thread."""

    def __enter__(self):
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        self.bytes = self.peak - self.base


def peak_memory_bytes(fn: Callable[[], object], device: str) -> int:
    """Memory one call needs beyond what was allocated before it."""
    if device == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        _sync(device)
        return torch.cuda.max_memory_allocated() - base
    _release_free_heap()
    with _RssPeak() as rss:
        fn()
    return rss.bytes


def _available_ram_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def _ram_shortfall(backend, device, B, Hq, T) -> Optional[str]:
    """On CPU, why a materialising backend is not tried at this size (None when it fits)."""
    need = MATERIALISING.get(backend, 0) * B * Hq * T * T
    if device == "cpu" and need > min(CPU_SCORES_LIMIT, 0.4 * _available_ram_bytes()):
        return f"would need ~{need / 2**30:.1f} GiB of RAM for the [B, H, T, T] scores"
    return None


def matmul_tflops(device: str, dtype: Optional[str] = None, n: Optional[int] = None) -> float:
    """Dense matmul throughput, the yardstick: bf16 8192^3 on GPU, fp32 2048^3 on CPU."""
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    n = n or (8192 if device == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    b = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    ms = time_median_ms(lambda: a @ b, device, min_time_s=0.5 if device == "cuda" else 1.0)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


# --- one point ----------------------------------------------------------------------------

def make_inputs(B, Hq, Hkv, head_dim, T, dtype, device, seed=0):
    """q [B, T, Hq, K], k/v [B, T, Hkv, K], unit normal (generated on CPU: same numbers on any device)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, T, Hq, head_dim), (B, T, Hkv, head_dim), (B, T, Hkv, head_dim)]
    return [torch.randn(s, generator=g).to(device=device, dtype=DTYPES[dtype]) for s in shapes]


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def _free(device):
    if device == "cuda":
        torch.cuda.empty_cache()


def measure_point(backend: str, *, mask: str = "recsys", B: int = 1, Hq: int = 4, Hkv: int = 2,
                  head_dim: int = 16, T: int = 64, num_candidates: int = 3, dtype: str = "float32",
                  device: str = "cpu", cap: float = 30.0, cap_method: str = "tanh", preset: str = "custom",
                  reference: Optional[torch.Tensor] = None, inputs=None, min_time_s: float = 0.3,
                  return_output: bool = False):
    """Time one backend at one point -> a record dict (the results file's schema).

    reference: naive's output on the same inputs for max_abs_err (computed here when None and naive
    can run). return_output=True returns (record, output) so a sweep can reuse naive's output."""
    record = dict(preset=preset, backend=backend, mask=mask, dtype=dtype, B=B, Hq=Hq, Hkv=Hkv,
                  head_dim=head_dim, T=T, num_candidates=num_candidates, cap_method=cap_method,
                  median_ms=None, peak_mem_bytes=None, tflops=None, max_abs_err=None, status="ok")
    done = (lambda r, out=None: (r, out)) if return_output else (lambda r, out=None: r)
    offset = T - num_candidates
    why = unavailable_reason(backend, device=device, dtype=dtype, cap=cap, cap_method=cap_method,
                             mask_kind=mask, head_dim=head_dim) or _ram_shortfall(backend, device, B, Hq, T)
    if why:
        return done({**record, "status": f"skipped: {why}"})
    out = None
    try:
        q, k, v = inputs if inputs is not None else make_inputs(B, Hq, Hkv, head_dim, T, dtype, device)
        attn_mask = AttentionMask(mask, T, offset)
        kw = dict(multiplier=head_dim ** -0.5, cap=cap, cap_method=cap_method)

        def call():
            return attend(q, k, v, attn_mask, backend=backend, **kw).out

        with torch.no_grad():
            ms = time_median_ms(call, device, min_time_s=min_time_s)
            peak = peak_memory_bytes(call, device)
            out = call()
            if reference is None and backend != "naive" and not _ram_shortfall("naive", device, B, Hq, T):
                reference = attend(q, k, v, attn_mask, backend="naive", **kw).out
        ref = out if backend == "naive" else reference
        record.update(median_ms=ms, peak_mem_bytes=int(peak),
                      tflops=useful_flops(mask, B, Hq, head_dim, T, num_candidates) / (ms * 1e-3) / 1e12,
                      max_abs_err=None if ref is None else float((out.float() - ref.float()).abs().max()))
    except Exception as e:  # noqa: BLE001 — every failure becomes a recorded status, never a crash
        out = None
        record["status"] = "oom" if _is_oom(e) else f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    finally:
        _free(device)
    return done(record, out)


# --- a sweep ------------------------------------------------------------------------------

def sweep(preset: "str | Preset" = "lecture", device: str = "cpu", *, budget_s: Optional[float] = None,
          backends: Optional[list[str]] = None, should_stop: Optional[Callable[[], bool]] = None,
          seq_lens: Optional[list[int]] = None, min_time_s: float = 0.3) -> Iterator[dict]:
    """Yield one record per (T, mask, cap, backend), naive first at each shape (the error reference).

    Past budget_s, or once should_stop() is true, the remaining points are yielded (cheaply) as
    'skipped: time budget spent' / 'skipped: cancelled', so every result file lists the whole grid."""
    # a name from PRESETS (reduced on CPU), or the app's own Preset(...) geometry, run as given
    p, preset = (preset, "custom") if isinstance(preset, Preset) else (preset_for(preset, device), preset)
    names = [b for b in (backends or list(BACKENDS)) if b in BACKENDS]
    names = ["naive"] + [b for b in names if b != "naive"]
    start = time.perf_counter()
    oom_at: dict[str, int] = {}

    def stopped() -> Optional[str]:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            return "time budget spent"
        if should_stop is not None and should_stop():
            return "cancelled"
        return None
    for T in sorted(seq_lens or p.seq_lens):
        for mask in p.masks:
            for cap_method in p.cap_methods:
                common = dict(mask=mask, B=p.B, Hq=p.Hq, Hkv=p.Hkv, head_dim=p.head_dim, T=T,
                              num_candidates=p.num_candidates, dtype=p.dtype, device=device, cap=p.cap,
                              cap_method=cap_method, preset=preset, min_time_s=min_time_s)
                inputs = None if stopped() else make_inputs(p.B, p.Hq, p.Hkv, p.head_dim, T, p.dtype, device)
                reference = None
                for b in names:
                    why = stopped()
                    if why:
                        yield _skipped(b, common, why)
                        continue
                    if b in oom_at:
                        yield _skipped(b, common, f"ran out of memory at T = {oom_at[b]}")
                        continue
                    rec, out = measure_point(b, **common, inputs=inputs, reference=reference, return_output=True)
                    if b == "naive":
                        reference = out
                    if rec["status"] == "oom":
                        oom_at[b] = T
                    yield rec
                del inputs, reference
                _free(device)


def _skipped(backend, common, why) -> dict:
    keys = ("preset", "mask", "dtype", "B", "Hq", "Hkv", "head_dim", "T", "num_candidates", "cap_method")
    return dict(backend=backend, **{k: common[k] for k in keys}, median_ms=None, peak_mem_bytes=None,
                tflops=None, max_abs_err=None, status=f"skipped: {why}")


# --- the results file -------------------------------------------------------------------------

def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"CPU {model} ({torch.get_num_threads()} threads)"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48]


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_results(results_dir: Path = RESULTS_DIR) -> list[tuple[str, dict]]:
    """(file name, data) for every attention results file there; other JSON files (training, app latency,
    load test) are skipped. The README tables and the app's "recorded" list both read through this."""
    out = []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("records"), list) and "device_name" in data:
            out.append((path.name, data))
    return out


def on_gpu(data: dict) -> bool:
    return data.get("cuda") is not None and not str(data["device_name"]).startswith("CPU")


def results_path(device: str, date: str, out_dir: Path = RESULTS_DIR) -> Path:
    return out_dir / f"{slug(device_name(device))}-{date}.json"


NOT_REACHED = ("skipped: time budget spent", "skipped: cancelled")


def point_key(r: dict) -> tuple:
    return tuple(r.get(k) for k in ("preset", "backend", "mask", "cap_method", "dtype", "B", "Hq", "Hkv",
                                    "head_dim", "T", "num_candidates"))


def write_results(records: list[dict], device: str, matmul: float, out_dir: Path = RESULTS_DIR) -> Path:
    """Merge into today's file for this device, point by point: a new record replaces the old one at the
    same point unless it was merely not reached (time budget / cancel). So a later run of one backend
    (say flash_attn once built) or of a few lengths adds to an earlier run."""
    date = dt.date.today().isoformat()
    path = results_path(device, date, out_dir)
    old = json.loads(path.read_text()).get("records", []) if path.exists() else []
    merged = {point_key(r): r for r in old}
    for r in records:
        if r["status"] not in NOT_REACHED or point_key(r) not in merged:
            merged[point_key(r)] = r
    data = dict(device_name=device_name(device), torch=torch.__version__, cuda=torch.version.cuda,
                commit=git_commit(), date=date, matmul_tflops=matmul,
                matmul_dtype="bfloat16" if device == "cuda" else "float32",
                records=list(merged.values()))
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def figure(data: dict):
    """One row per preset: time and memory against T (log-log). Colour = backend, dash = cap, one line per
    backend x mask x cap."""
    import plotly.express as px
    from plotly.subplots import make_subplots
    ok = [r for r in data["records"] if r["status"] == "ok"]
    presets = [p for p in PRESETS if any(r["preset"] == p for r in ok)] or ["(none)"]
    fig = make_subplots(rows=len(presets), cols=2, vertical_spacing=0.12 / max(1, len(presets) - 1) + 0.05,
                        subplot_titles=[f"{p}: {what}" for p in presets
                                        for what in ("median time per call (ms)", "peak memory (MiB)")])
    colour = dict(zip(BACKENDS, px.colors.qualitative.D3))
    lines: dict[tuple, list[dict]] = {}
    for r in ok:
        lines.setdefault((r["preset"], r["backend"], r["mask"], r["cap_method"]), []).append(r)
    shown = set()
    for (preset, backend, mask, cap), rs in sorted(lines.items()):
        rs.sort(key=lambda r: r["T"])
        row = presets.index(preset) + 1
        name = f"{backend} · cap {cap}" + ("" if mask == "recsys" else f" · {mask}")
        style = dict(color=colour.get(backend), dash="solid" if cap != "none" else "dot")
        T = [r["T"] for r in rs]
        for col, y in ((1, [r["median_ms"] for r in rs]), (2, [r["peak_mem_bytes"] / 2**20 for r in rs])):
            fig.add_scatter(x=T, y=y, name=name, legendgroup=name, line=style, mode="lines+markers",
                            showlegend=name not in shown, row=row, col=col)
            shown.add(name)
    fig.update_xaxes(type="log", title_text="sequence length T")
    fig.update_yaxes(type="log")
    fig.update_layout(title=f"Attention backends on {data['device_name']} — torch {data['torch']}, "
                            f"{data['date']}, commit {data['commit']} (solid: tanh cap, dotted: no cap)",
                      height=330 * len(presets) + 120, width=1300)
    return fig


def write_plots(path: Path, data: dict) -> list[Path]:
    try:
        fig = figure(data)
    except ImportError as e:                          # e.g. a GPU machine without plotly: JSON only
        print(f"plots not written ({e})")
        return []
    html, png = path.with_suffix(".html"), path.with_suffix(".png")
    fig.write_html(html, include_plotlyjs="cdn")     # small file; plotly.js loads from its CDN
    written = [html]
    try:
        fig.write_image(png)
        written.append(png)
    except Exception as e:  # noqa: BLE001 — kaleido needs a browser; the JSON and HTML still stand
        print(f"PNG not written ({type(e).__name__}: {e})")
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", choices=list(PRESETS),
                    help="repeat for several; default lecture")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget-s", type=float, default=None, help="stop measuring after this many seconds")
    ap.add_argument("--backends", default=None, help="comma-separated subset (naive always runs)")
    ap.add_argument("--seq-lens", default=None, help="comma-separated T values overriding the preset's")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--replot", type=Path, default=None, help="only redraw the plots of this results file")
    a = ap.parse_args(argv)
    if a.replot:
        for p in write_plots(a.replot, json.loads(a.replot.read_text())):
            print(f"wrote {p}")
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    backends = a.backends.split(",") if a.backends else None
    seq_lens = [int(t) for t in a.seq_lens.split(",")] if a.seq_lens else None
    start = time.perf_counter()
    matmul = matmul_tflops(a.device)
    print(f"{device_name(a.device)}: dense matmul {matmul:.2f} TFLOP/s")
    records = []
    for preset in a.preset or ["lecture"]:
        left = None if a.budget_s is None else max(0.0, a.budget_s - (time.perf_counter() - start))
        for r in sweep(preset, a.device, budget_s=left, backends=backends, seq_lens=seq_lens):
            records.append(r)
            if r["status"] == "ok":
                print(f"{r['preset']:>12} {r['backend']:>14} {r['mask']:>20} cap {r['cap_method']:>4} "
                      f"B {r['B']:>2} T {r['T']:>6}: {r['median_ms']:9.3f} ms  "
                      f"{r['peak_mem_bytes'] / 2**20:9.1f} MiB  {r['tflops']:7.3f} TFLOP/s  "
                      f"err {r['max_abs_err'] if r['max_abs_err'] is not None else float('nan'):.1e}", flush=True)
            elif r["status"] != "skipped: time budget spent":
                print(f"{r['preset']:>12} {r['backend']:>14} {r['mask']:>20} cap {r['cap_method']:>4} "
                      f"T {r['T']:>6}: {r['status']}", flush=True)
    path = write_results(records, a.device, matmul, a.out_dir)
    print(f"wrote {path}")
    if not a.no_plot:
        for p in write_plots(path, json.loads(path.read_text())):
            print(f"wrote {p}")


if __name__ == "__main__":
    main()
