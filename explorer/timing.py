"""Flash vs naive, live: time the backends this device runs, beside the committed benchmark curves.

Every number comes from the benchmark's own measurement module (``benchmarks.attention``: warm-up,
interleaved repeats, min / median / max, peak memory, error vs naive), so the tab and
``python -m benchmarks.attention`` measure alike. A live run has its own ``Run`` (stop flag and
deadline, checked before every timed block): Stop or the device's time budget ends it within one
block and keeps what was measured. Committed result files under ``benchmarks/results/`` are plotted
beside the live points, labelled "recorded on <device>, <date>".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

import plotly.graph_objects as go

from benchmarks.runinfo import RESULTS_DIR, device_name
from models.attention import BACKENDS, unavailable_reason

from .figures import line_figure
from .measure import (PRESETS, Preset, Run, load_results, matmul_tflops, on_gpu, preset_for,
                      sweep as benchmark_sweep)
from .settings import Settings, ValidationError, device, sweep_budget_s, timing_max_len

SETTINGS_GEOMETRY = "model settings"
# benchmark geometries the tab offers, per device: phoenix-prod is what the GPU is for (B=256, the
# production batch, one click away); on CPU it runs reduced (benchmarks.attention.CPU_REDUCTIONS)
GEOMETRIES = {"cuda": ("phoenix-prod", "phoenix-prod-b256", "long", SETTINGS_GEOMETRY),
              "cpu": (SETTINGS_GEOMETRY, "lecture", "phoenix-prod")}
# CPU bf16 matmuls are emulated: float32 is what a CPU is timed in; bf16 is what a GPU is for
TIMING_DTYPES = {"cuda": ("bfloat16", "float16", "float32"), "cpu": ("float32", "bfloat16")}
MAX_LENGTHS = 12


def geometries() -> tuple[str, ...]:
    return GEOMETRIES[device()]


def dtypes() -> tuple[str, ...]:
    return TIMING_DTYPES[device()]


def check_choice(name: str, value, allowed: tuple) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValidationError(name, value, ", ".join(allowed) + f" (on {device().upper()})")
    return value


def geometry(s: Settings, name: str, dtype: str) -> Preset:
    """The shapes one run times: the sidebar's model (heads, key size, candidates; batch 1) or a
    benchmark preset's (batch, heads, head dim, candidates). Mask (prefix) and logit cap always come
    from the sidebar, so the live curve and the views agree on what attention computes."""
    check_choice("timing geometry", name, geometries())
    check_choice("dtype", dtype, dtypes())
    if name == SETTINGS_GEOMETRY:
        base = Preset("the sidebar's model", B=1, Hq=s.num_q_heads, Hkv=s.num_kv_heads, head_dim=s.key_size,
                      dtype=dtype, seq_lens=(), num_candidates=s.num_candidates)
    else:
        base = preset_for(name, device())
    return replace(base, dtype=dtype, masks=(s.mask_kind,), cap_methods=(s.cap_method,), cap=s.logit_cap)


def default_lengths(name: str) -> str:
    if name == SETTINGS_GEOMETRY:
        return "64, 128, 256, 512"
    return ", ".join(str(T) for T in preset_for(name, device()).seq_lens if T <= timing_max_len())


def backend_options(s: Settings, name: str, dtype: str) -> dict[str, Optional[str]]:
    """Every registered backend -> None if it runs exactly here with this geometry and dtype, else why."""
    g = geometry(s, name, dtype)
    return {b: unavailable_reason(b, device=device(), dtype=dtype, cap=g.cap, cap_method=g.cap_methods[0],
                                  mask_kind=g.masks[0], head_dim=g.head_dim)
            for b in BACKENDS}


def parse_lengths(text: str, num_candidates: int = 1) -> list[int]:
    """'64, 128, 256' -> [64, 128, 256]: each a sequence length within the device's timing cap, and
    longer than the candidates it holds."""
    if not isinstance(text, str) or len(text) > 200:
        raise ValidationError("lengths", text, "comma-separated sequence lengths such as '64, 128, 256'")
    lo, hi = num_candidates + 1, timing_max_len()
    out = []
    for part in text.replace(";", ",").split(","):
        if not part.strip():
            continue
        try:
            T = int(part.strip())
        except ValueError:
            raise ValidationError("lengths", part.strip(), "whole numbers separated by commas") from None
        if not lo <= T <= hi:
            raise ValidationError("lengths", T, f"each in [{lo}, {hi}] on {device().upper()} "
                                                f"(more than the {num_candidates} candidates)")
        out.append(T)
    if not out or len(out) > MAX_LENGTHS:
        raise ValidationError("lengths", text, f"between 1 and {MAX_LENGTHS} sequence lengths")
    return sorted(set(out))


@dataclass(frozen=True)
class Request:
    """One validated Run: what to time, how, on which backends."""
    geometry: Preset
    geometry_name: str
    lengths: tuple[int, ...]
    backends: tuple[str, ...]


def check_request(s: Settings, geometry_name: str, dtype: str, lengths: str, backends) -> Request:
    """Every timing control checked before Run is allowed: a bad one is named with what is allowed."""
    g = geometry(s, geometry_name, dtype)
    Ts = parse_lengths(lengths, g.num_candidates)
    why = backend_options(s, geometry_name, dtype)
    usable = [b for b, reason in why.items() if reason is None]
    if not isinstance(backends, (list, tuple)) or not all(isinstance(b, str) for b in backends):
        raise ValidationError("backends", backends, "a list of backend names: " + ", ".join(usable))
    for b in backends:
        if b not in usable:
            reason = why.get(b) or "not a backend"
            raise ValidationError("backends", b, f"{', '.join(usable)} (here, in {dtype}; {b}: {reason})")
    return Request(g, geometry_name, tuple(Ts), tuple(dict.fromkeys(["naive", *backends])))


@dataclass
class Sweep:
    """What one live run measured so far: records of the benchmark's schema, one per (backend, T)."""
    device: str
    records: list[dict] = field(default_factory=list)
    stopped: str = ""                               # why the run ended early, if it did
    matmul_tflops: Optional[float] = None           # the same device's dense matmul, the TFLOP/s yardstick

    @property
    def points(self) -> list[dict]:
        return [r for r in self.records if r["status"] == "ok"]

    @property
    def skipped(self) -> dict[str, str]:
        """backend -> why it did not run (its first refusal, out of memory or error)."""
        out: dict[str, str] = {}
        for r in self.records:
            if r["status"] != "ok" and not r["status"].startswith("skipped: cancelled") \
                    and "time budget" not in r["status"]:
                out.setdefault(r["backend"], f"{r['status']} at T = {r['T']}")
        return out


@functools.lru_cache(maxsize=4)
def device_matmul_tflops(dtype: str) -> float:
    """This GPU's measured dense matmul throughput in `dtype` (once per process)."""
    return matmul_tflops(device(), dtype)


def sweep(s: Settings, req: Request, run: Optional[Run] = None) -> Iterator[Sweep]:
    """Time the request; yield the growing Sweep after each sequence length (so a page can draw as it
    goes, and Stop keeps what was measured). Ends at the budget or when `run` is cancelled."""
    run = run or Run(sweep_budget_s())
    g = req.geometry
    result = Sweep(device_name(device()),
                   matmul_tflops=device_matmul_tflops(g.dtype) if device() == "cuda" else None)
    per_T = len(req.backends) * len(g.masks) * len(g.cap_methods)
    batch: list[dict] = []
    for r in benchmark_sweep(g, device(), backends=list(req.backends), run=run, seq_lens=list(req.lengths),
                             repeats=5):
        batch.append(r)
        if len(batch) < per_T:
            continue
        if run.stopped() and all(x["repeats"] == 0 for x in batch):
            break
        result.records += batch
        batch = []
        yield result
    why = run.stopped()
    if why:
        measured = ", ".join(str(T) for T in sorted({r["T"] for r in result.points})) or "none yet"
        reason = f"the time budget on {device().upper()} is spent" if why == "time budget spent" else "cancelled"
        result.stopped = f"Stopped: {reason}. Kept what was measured (T = {measured})."
    yield result


def measure(s: Settings, req: Request, run: Optional[Run] = None) -> Sweep:
    """The whole run at once (its last state)."""
    out = None
    for out in sweep(s, req, run):
        pass
    return out


# --- figures -----------------------------------------------------------------------------------

def recorded_records(g: Preset) -> list[tuple[str, list[dict]]]:
    """Committed benchmark points of the same attention shape (heads, head dim, mask, cap, dtype):
    [(label "recorded on <device>, <date>, B=<n>", records)], one entry per file and batch size."""
    out = []
    for name, data in load_results(RESULTS_DIR):
        same = [r for r in data["records"] if r["status"] == "ok" and r.get("median_ms")
                and (r["Hq"], r["Hkv"], r["head_dim"], r["mask"], r.get("cap_method"), r["dtype"])
                == (g.Hq, g.Hkv, g.head_dim, g.masks[0], g.cap_methods[0], g.dtype)]
        for B in sorted({r["B"] for r in same}):
            label = f"recorded on {data['device_name']}, {data.get('date', 'unknown date')}, B={B}"
            out.append((label, [r for r in same if r["B"] == B]))
    return out


def _bars(records: list[dict]) -> Optional[dict]:
    if not records or not all(r.get("min_ms") is not None for r in records):
        return None
    return dict(type="data", symmetric=False, array=[r["max_ms"] - r["median_ms"] for r in records],
                arrayminus=[r["median_ms"] - r["min_ms"] for r in records], thickness=1.2, width=4)


def sweep_figures(sw: Sweep, recorded: Optional[list[tuple[str, list[dict]]]] = None, batch: int = 1):
    """Time (median, bars min..max over the repeats), memory, speed-up over naive and error, live
    points solid ("measured now") and committed curves dotted ("recorded on ...")."""
    recorded = recorded or []
    live, ooms = sw.points, [r for r in sw.records if r["status"] == "oom"]
    now = f"measured now on {sw.device}, B={batch}"
    all_rows = [(f"{b} · {now}", rs) for b, rs in _grouped(live).items()]
    all_rows += [(f"{b} · {label}", rs) for label, recs in recorded for b, rs in _grouped(recs).items()]

    def fig(key, title, y_title, log_y=True, rows=all_rows):
        f = line_figure({name: ([r["T"] for r in rs], [key(r) for r in rs]) for name, rs in rows},
                        title=title, x_title="sequence length T", y_title=y_title, log_x=True, log_y=log_y,
                        height=460)
        for trace, (name, rs) in zip(f.data, rows):
            if "recorded on" in name:
                trace.line.dash = "dot"
                trace.opacity = 0.75
        return f

    time_fig = fig(lambda r: r["median_ms"], "Time per attention call (median; bars: min-max of the repeats)", "ms")
    for trace, (name, rs) in zip(time_fig.data, all_rows):
        trace.error_y = _bars(rs)
    if ooms:                        # out of memory is a result too: drawn where the curve would go on
        top = max([r["max_ms"] or r["median_ms"] for r in live] or [1.0])
        time_fig.add_trace(go.Scatter(x=[r["T"] for r in ooms], y=[top] * len(ooms), mode="markers+text",
                                      marker=dict(symbol="x", size=14, color="#D55E00"),
                                      text=[f"{r['backend']}: out of memory" for r in ooms],
                                      textposition="top center", name="out of memory (measured now)"))
    mem_fig = fig(lambda r: max(r["peak_mem_bytes"], 1) / 2**20, "Peak memory of one call (above its inputs)", "MiB")
    naive = {(lab, r["T"]): r["median_ms"] for lab, rs in [("now", live)] + recorded for r in rs
             if r["backend"] == "naive"}
    speed_rows = []
    for name, rs in all_rows:
        lab = next((label for label, _ in recorded if name.endswith(label)), "now")
        kept = [r for r in rs if (lab, r["T"]) in naive]
        if kept:
            speed_rows.append((name, [dict(r, speedup=naive[(lab, r["T"])] / r["median_ms"]) for r in kept]))
    speed_fig = fig(lambda r: r["speedup"], "Speed-up over naive (same run, same T)", "x naive", log_y=False,
                    rows=speed_rows)
    err_rows = [(n, [r for r in rs if r.get("max_abs_err") is not None]) for n, rs in all_rows if "measured now" in n]
    err_fig = fig(lambda r: r["max_abs_err"], "Max |error| vs naive on the same inputs", "max abs error",
                  log_y=False, rows=[(n, rs) for n, rs in err_rows if rs])
    return time_fig, mem_fig, speed_fig, err_fig


def _grouped(records: list[dict]) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["T"]):
        by.setdefault(r["backend"], []).append(r)
    return by


def throughput_note(sw: Sweep) -> str:
    """Per length, the fastest exact backend's useful-FLOP TFLOP/s and (on GPU) its share of this
    device's dense matmul throughput measured in the same process."""
    lines = []
    for T in sorted({r["T"] for r in sw.points}):
        best = min((r for r in sw.points if r["T"] == T), key=lambda r: r["median_ms"])
        share = (f" = {100 * best['tflops'] / sw.matmul_tflops:.0f}% of this GPU's measured {best['dtype']} "
                 f"matmul ({sw.matmul_tflops:.0f} TFLOP/s)" if sw.matmul_tflops else "")
        lines.append(f"T = {T}: fastest **{best['backend']}**, {best['median_ms']:.3g} ms "
                     f"({best['min_ms']:.3g}-{best['max_ms']:.3g}, {best['repeats']} repeats), "
                     f"{best['tflops']:.3g} TFLOP/s on useful FLOPs{share}")
    return "\n".join(f"- {line}" for line in lines)


def recorded_summary() -> str:
    files = load_results(RESULTS_DIR)
    if not files:
        return "No recorded attention benchmark files are committed under `benchmarks/results/` yet."
    lines = [f"- `{name}`: recorded on **{d['device_name']}**, {d.get('date', 'unknown date')} "
             f"({sum(r.get('status') == 'ok' for r in d['records'])} points)" for name, d in files]
    if not any(on_gpu(d) for _, d in files):
        lines.append("- None of the recorded files comes from a GPU.")
    return ("Recorded benchmark files (dotted curves where one matches the geometry; "
            "`python -m benchmarks.attention`):\n" + "\n".join(lines))


def recorded_view(s: Settings) -> tuple[go.Figure, go.Figure, go.Figure, str]:
    """For exports (the Export tab, the lecture pack), which never run a sweep: the committed curves of
    the first geometry and dtype this device offers that has any, as (time, memory, speed-up, what
    they show). The error figure is left out: it holds live points only."""
    choices = [(g, dt) for g in geometries() for dt in dtypes()]
    found = next(((g, dt, geometry(s, g, dt)) for g, dt in choices if recorded_records(geometry(s, g, dt))), None)
    name, dt, g = found or (*choices[0], geometry(s, *choices[0]))
    recorded = recorded_records(g)
    time_fig, mem_fig, speed_fig, _ = sweep_figures(Sweep(device_name(device())), recorded, batch=g.B)
    shapes = (f"the '{name}' geometry ({g.Hq} query heads sharing {g.Hkv} KV heads, head dim {g.head_dim}, "
              f"mask '{g.masks[0]}', cap '{g.cap_methods[0]}', {dt})")
    if not recorded:
        return time_fig, mem_fig, speed_fig, (f"No committed benchmark file matches {shapes} or any other "
                                              "geometry offered here, so the figure is empty; nothing was "
                                              "measured for this export.")
    return time_fig, mem_fig, speed_fig, (f"Committed benchmark curves (not measured for this export) for "
                                          f"{shapes}: {'; '.join(label for label, _ in recorded)}. "
                                          "One curve per backend over sequence length T.")


def timing_view(s: Settings, geometry_name: Optional[str] = None, dtype: Optional[str] = None):
    """The tab's figures before any live run (and in exports): the committed curves for this geometry."""
    name, dt = geometry_name or geometries()[0], dtype or dtypes()[0]
    g = geometry(s, name, dt)
    return sweep_figures(Sweep(device_name(device())), recorded_records(g), batch=g.B)

