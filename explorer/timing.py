"""Flash vs naive, live: time the backends this device runs, beside the work the mask lets a block-sparse
kernel skip. The committed benchmark curves are drawn on their own figures (exports), the committed GPU run
beside the live one (explorer.gpu_results) — never on a live run's axes.

Every number comes from the benchmark's own measurement module (warm-up, interleaved repeats, min /
median / max, peak memory, error against grok.py's function in fp32), so the tab and ``python -m benchmarks.attention`` measure
alike. A live run (``LiveRun``: its own stop flag, deadline and progress) is checked before every timed
block; ``TimingRuns`` keeps each visitor's runs so Stop and a new Run reach them. One colour per backend
in every figure (live, recorded, exported); line style tells measured (solid) from recorded (dotted).
"""
from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

import plotly.graph_objects as go

from models.attention import BACKENDS, unavailable_reason
from models.masks import EMPTY, AttentionMask
from models.runinfo import RESULTS_DIR, device_name

from .figures import FONT, TEMPLATE, Figure, _log_ticks
from .measure import (YIELDED, Grid, Run, Status, grid_for, load_results, matmul_tflops, on_gpu,
                      sweep as benchmark_sweep)
from .limits import device, sweep_budget_s, sweep_turn_s, timing_max_len
from .schema import Settings, ValidationError

SETTINGS_GEOMETRY = "model settings"
# benchmark geometries the tab offers, per device: phoenix-prod is what the GPU is for (B=256, the
# production batch, one click away); on CPU it runs reduced (explorer.measure.CPU_REDUCTIONS)
GEOMETRIES = {"cuda": ("phoenix-prod", "phoenix-prod-b256", "long", SETTINGS_GEOMETRY),
              "cpu": (SETTINGS_GEOMETRY, "lecture", "phoenix-prod")}
# CPU bf16 matmuls are emulated: float32 is what a CPU is timed in; bf16 is what a GPU is for
TIMING_DTYPES = {"cuda": ("bfloat16", "float16", "float32"), "cpu": ("float32", "bfloat16")}
MAX_LENGTHS = 12
# a live run's warm-up time that does not spend its budget: first FlexAttention compiles (~20-40 s per
# new length on a CPU); past it, compiles count like measuring
COMPILE_ALLOWANCE_S = {"cpu": 90.0, "cuda": 60.0}
FLEX_BLOCK = 128        # FlexAttention's default block size: the tiles it skips when the mask empties one

log = logging.getLogger("explorer")

# One colour per backend in every figure (live, recorded, exported): Okabe-Ito, then Tol's purple and grey.
BACKEND_COLORS = {"naive": "#000000", "sdpa": "#56B4E9", "sdpa-flash": "#0072B2", "sdpa-efficient": "#CC79A7",
                  "sdpa-cudnn": "#999999", "flex": "#E69F00", "structured": "#009E73", "flash_attn": "#D55E00",
                  "fa4": "#AA4499"}
RECORDED_DASHES = ("dot", "dash", "dashdot", "longdash")     # one per committed file / batch size

# exact backends that win on this kind of device (committed results): ticked by default
DEFAULT_ON = {"cpu": ("naive", "flex", "sdpa-flash"),
              "cuda": ("naive", "sdpa-flash", "sdpa-efficient", "flex", "structured", "flash_attn", "fa4")}


def geometries() -> tuple[str, ...]:
    return GEOMETRIES[device()]


def dtypes() -> tuple[str, ...]:
    return TIMING_DTYPES[device()]


def check_choice(name: str, value, allowed: tuple) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValidationError(name, value, ", ".join(allowed) + f" (on {device().upper()})")
    return value


def geometry(s: Settings, name: str, dtype: str) -> Grid:
    """The shapes one run times: the sidebar's model (heads, key size, candidates; batch 1) or a
    benchmark grid's (batch, heads, head dim, candidates). Mask (prefix) and logit cap always come
    from the sidebar, so the live curve and the views agree on what attention computes."""
    check_choice("timing geometry", name, geometries())
    check_choice("dtype", dtype, dtypes())
    if name == SETTINGS_GEOMETRY:
        base = Grid(B=1, Hq=s.num_q_heads, Hkv=s.num_kv_heads, head_dim=s.key_size, dtype=dtype, seq_lens=(),
                    num_candidates=s.num_candidates)
    else:
        base = grid_for(name, device())
    return replace(base, dtype=dtype, masks=(s.mask_kind,), cap_methods=(s.cap_method,), cap=s.logit_cap,
                   paddings=(False,))


def default_lengths(name: str, num_candidates: int = 3) -> str:
    """The lengths a run times unless changed: powers of two above the candidates (the sidebar's
    model), or the preset's own lengths within this device's cap."""
    if name == SETTINGS_GEOMETRY:
        Ts = [T for T in (64, 128, 256, 512, 1024, 2048) if T > num_candidates][:4]
        return ", ".join(str(T) for T in Ts)
    return ", ".join(str(T) for T in grid_for(name, device()).seq_lens if T <= timing_max_len())


def default_backends(usable) -> list[str]:
    """The usable backends that win on this kind of device (DEFAULT_ON), naive always."""
    return [b for b in usable if b in DEFAULT_ON[device()]]


def backend_notes(s: Settings, name: str, dtype: str) -> str:
    """Markdown: per backend, why it is fast or slow here, or why it does not run here."""
    lines = []
    for b, reason in backend_options(s, name, dtype).items():
        if reason is None:
            here = BACKENDS[b].on(device())
            lines.append(f"- **{b}**: {here.description} — {here.speed_reason}")
        else:
            lines.append(f"- ~~{b}~~: {reason.removeprefix(b + ': ')}")
    return "Why each backend is fast or slow here:\n" + "\n".join(lines)


def live_shape(g: Grid, name: str) -> str:
    """What a live run times, short enough for a figure's panel title (three short lines)."""
    return (f"{name}, B {g.B}, {g.dtype}<br>{g.Hq} q / {g.Hkv} kv heads, head dim {g.head_dim}<br>"
            f"mask {g.masks[0]}, cap {g.cap_methods[0]}")


def describe(g: Grid, name: str) -> str:
    """The shape a run times, in words: which geometry, and its numbers."""
    where = "the sidebar's model" if name == SETTINGS_GEOMETRY else f"preset '{name}'"
    return (f"{where}: B = {g.B}, {g.Hq} query heads sharing {g.Hkv} KV heads, head dim {g.head_dim}, "
            f"{g.num_candidates} candidates, {g.dtype}, mask '{g.masks[0]}', cap {g.cap_methods[0]}")


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
    if not out:
        raise ValidationError("lengths", text, f"1 to {MAX_LENGTHS} sequence lengths such as '64, 128, 256' "
                                               "(the box is empty)")
    if len(out) > MAX_LENGTHS:
        raise ValidationError("lengths", text, f"between 1 and {MAX_LENGTHS} sequence lengths")
    return sorted(set(out))


@dataclass(frozen=True)
class Request:
    """One validated Run: what to time, how, on which backends."""
    geometry: Grid
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


def measurement_key(req: Request) -> tuple:
    """What a Run measures, and nothing else: this machine (its device and threads), the shapes, dtype, mask and
    cap the sweep times, its lengths and backends. The sidebar's seed, head, layer, candidate or the geometry's
    name change no number of it (the benchmark makes its own inputs), so two Runs of one key measure the same
    thing: one measurement answers both (server.timing_runs)."""
    return device_name(device()), replace(req.geometry, seq_lens=(), model_preset=None), req.lengths, req.backends


class LiveRun(Run):
    """A Run that also says how far it got: lengths measured of the lengths asked for."""

    def __init__(self, budget_s: Optional[float] = None, total: int = 0, yield_to=None, turn_s: float = 0.0):
        super().__init__(budget_s, compile_allowance_s=COMPILE_ALLOWANCE_S[device()], yield_to=yield_to, turn_s=turn_s)
        self.total, self.done = total, 0


@dataclass
class Sweep:
    """What one live run measured so far: records of the benchmark's schema, one per (backend, T)."""
    device: str
    records: list[dict] = field(default_factory=list)
    stopped: str = ""                               # why the run ended early, if it did
    matmul_tflops: Optional[float] = None           # the same device's dense matmul, the TFLOP/s yardstick
    lengths: tuple[int, ...] = ()                   # every length asked for, in the order measured
    elapsed_s: float = 0.0                          # wall time so far
    done: bool = False                              # every length measured (or the run stopped)
    measured: str = "now"                           # when, in words: "now", or "12 s ago" (a kept sweep)

    @property
    def points(self) -> list[dict]:
        return [r for r in self.records if r["status"] == "ok"]

    @property
    def measured_lengths(self) -> list[int]:
        return sorted({r["T"] for r in self.records})

    @property
    def skipped(self) -> dict[str, str]:
        """backend -> why it did not run (its first refusal, out of memory or error)."""
        out: dict[str, str] = {}
        for r in self.records:
            if r["status"] not in (Status.OK, Status.NOT_REACHED):
                out.setdefault(r["backend"], f"{r['status']}: {r['reason']} at T = {r['T']}")
        return out

    def eta_s(self) -> Optional[float]:
        """Seconds left, from the time the measured lengths took, scaled by T² to the lengths left
        (attention's work grows as T²); None before the first length."""
        done = self.measured_lengths
        left = [T for T in self.lengths if T not in done]
        if not done or not self.elapsed_s:
            return None
        return self.elapsed_s * sum(T * T for T in left) / sum(T * T for T in done)

    def progress(self) -> str:
        """'Measuring T = 256 (3 of 4 lengths) ... about 12 s left', or '' once done."""
        if self.done or self.stopped or not self.lengths:
            return ""
        k, n = len(self.measured_lengths), len(self.lengths)
        if k >= n:
            return ""
        eta = self.eta_s()
        left = f", about {eta:.0f} s left (T² scaling of the {self.elapsed_s:.1f} s so far)" if eta is not None \
            else " (the first length includes compiling and warm-up)"
        return f"Measuring T = {self.lengths[k]} ({k + 1} of {n} lengths){left}."


@functools.lru_cache(maxsize=4)
def device_matmul_tflops(dtype: str) -> float:
    """This GPU's measured dense matmul throughput in `dtype` (once per process)."""
    return matmul_tflops(device(), dtype)


STOP_REASONS = {"time budget spent": lambda: f"the time budget on {device().upper()} is spent",
                YIELDED: lambda: (f"other visitors' sweeps were waiting: the {device().upper()} times one sweep at a "
                                  f"time, each a turn of {sweep_turn_s():.0f} s while others wait; Run again for the rest")}


def stopped_note(why: str, done: list[int], total: int) -> str:
    reason = STOP_REASONS.get(why, lambda: "Stop was pressed")()
    kept = f"the measured points are kept (T = {', '.join(map(str, done))})" if done else "nothing was measured yet"
    return f"Stopped after {len(done)} of {total} lengths ({reason}): {kept}."


def sweep(s: Settings, req: Request, run: Optional[Run] = None) -> Iterator[Sweep]:
    """Time the request; yield the Sweep at once (nothing measured: the page shows its progress) and
    again after each sequence length, so points appear as measured and Stop keeps them. Ends at the
    budget or when `run` is cancelled."""
    run = run or LiveRun(sweep_budget_s())
    if isinstance(run, LiveRun):
        run.total = len(req.lengths)
    g = req.geometry
    start = time.perf_counter()
    result = Sweep(device_name(device()), lengths=tuple(req.lengths),
                   matmul_tflops=device_matmul_tflops(g.dtype) if device() == "cuda" else None)
    yield result
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
        result.elapsed_s = time.perf_counter() - start
        if isinstance(run, LiveRun):
            run.done = len(result.measured_lengths)
        batch = []
        yield result
    why = run.stopped()
    if why:
        result.stopped = stopped_note(why, sorted({r["T"] for r in result.points}), len(req.lengths))
    result.done = True
    result.elapsed_s = time.perf_counter() - start
    yield result


def measure(s: Settings, req: Request, run: Optional[Run] = None) -> Sweep:
    """The whole run at once (its last state)."""
    out = None
    for out in sweep(s, req, run):
        pass
    return out


def prewarm(s: Settings) -> None:
    """Compile flex for the tab's default run (the sidebar's model at the default lengths) so a
    visitor's first Run does not wait ~20-40 s per length: torch keeps the compiled kernels (and its
    on-disk cache keeps them across restarts), block masks are cached by the attention module."""
    import torch

    from models.attention import attend
    g = geometry(s, SETTINGS_GEOMETRY, dtypes()[0])
    if unavailable_reason("flex", device=device(), dtype=g.dtype, cap=g.cap, cap_method=g.cap_methods[0],
                          mask_kind=g.masks[0], head_dim=g.head_dim):
        return
    for T in parse_lengths(default_lengths(SETTINGS_GEOMETRY, g.num_candidates), g.num_candidates):
        q, k, v = (torch.zeros(1, T, h, g.head_dim) for h in (g.Hq, g.Hkv, g.Hkv))
        with torch.no_grad():
            attend(q, k, v, AttentionMask(g.masks[0], T, T - g.num_candidates), backend="flex",
                   multiplier=g.head_dim ** -0.5, cap=g.cap, cap_method=g.cap_methods[0])


# --- work the mask lets a kernel skip, beside the time it saves ---------------------------------

@functools.lru_cache(maxsize=256)
def work_skipped(kind: str, T: int, num_candidates: int, block: int = FLEX_BLOCK) -> dict:
    """For one layout (models.masks): the share of the T x T work the mask hides (its FLOPs), and what
    a block-sparse kernel with block x block tiles skips (tiles, and the elements in them)."""
    mask = AttentionMask(kind, T, T - num_candidates)
    t = mask.tiles(block, block)
    run = t.classes[0] != EMPTY
    return dict(tiles=int(run.numel()), run=int(run.sum()), skip_tiles=1 - int(run.sum()) / run.numel(),
                skip_elements=1 - int(t.size[run].sum()) / T ** 2,
                flops_hidden=1 - mask.useful_pairs() / T ** 2)


def work_note(sw: Sweep, g: Grid) -> str:
    """Per measured length: work skipped (tiles, FLOPs) beside time saved (the fastest exact backend
    against naive), and why the two differ."""
    rows = ["| T | 128×128 tiles a block-sparse kernel runs | work it skips | FLOPs the mask hides | "
            "time saved vs naive (fastest) |", "|---|---|---|---|---|"]
    naive = {r["T"]: r["median_ms"] for r in sw.points if r["backend"] == "naive"}
    for T in sorted({r["T"] for r in sw.points}):
        w = work_skipped(g.masks[0], T, g.num_candidates)
        best = min((r for r in sw.points if r["T"] == T), key=lambda r: r["median_ms"])
        saved = (f"{1 - best['median_ms'] / naive[T]:.0%} ({best['backend']})" if T in naive and
                 best["backend"] != "naive" else "0% (naive is fastest)")
        rows.append(f"| {T} | {w['run']} of {w['tiles']} | {w['skip_elements']:.0%} | {w['flops_hidden']:.0%} | "
                    f"{saved} |")
    if len(rows) == 2:
        return ""
    T = max(r["T"] for r in sw.points)
    scores_mib = 2 * 4 * g.B * g.Hq * T * T / 2**20
    return ("\n".join(rows) + "\n\nWork skipped is the most time skipping alone can save (the grey line in the "
            "speed-up chart). Measured savings differ: a fused kernel also saves naive's trip through memory "
            f"({scores_mib:,.0f} MiB of fp32 logits and probabilities at T = {T}), so it can beat the bound; "
            "per-call overhead and partial (masked) tiles cost time, which dominates at small T; and a "
            f"layout smaller than one {FLEX_BLOCK}×{FLEX_BLOCK} tile has nothing to skip.")


# --- figures -----------------------------------------------------------------------------------

def short_device(name: str) -> str:
    """'CPU Intel(R) Xeon(R) Processor (1 threads)' -> 'CPU Intel Xeon (1 threads)': short enough for a legend."""
    for word in ("(R)", "(TM)", " Processor", " CPU @", " with Max-Q Design"):
        name = name.replace(word, "")
    return " ".join(name.split())


def recorded_records(g: Grid) -> list[tuple[str, list[dict]]]:
    """Committed benchmark points of the same attention shape (heads, head dim, mask, cap, dtype):
    [(label "recorded on <device>, <date>, B=<n>", records)], one entry per file and batch size."""
    out = []
    for name, data in load_results(RESULTS_DIR):
        same = [r for r in data["records"] if r["status"] == Status.OK and r.get("median_ms") and not r.get("padded")
                and (r["Hq"], r["Hkv"], r["head_dim"], r["mask"], r.get("cap_method"), r["dtype"])
                == (g.Hq, g.Hkv, g.head_dim, g.masks[0], g.cap_methods[0], g.dtype)]
        for B in sorted({r["B"] for r in same}):
            label = f"recorded on {short_device(data['device_name'])}, {data.get('date', 'unknown date')}, B={B}"
            out.append((label, [r for r in same if r["B"] == B]))
    return out


@dataclass
class Curve:
    """One line of a benchmark figure: a backend's points from one source (measured now, or a file)."""
    backend: str
    source: str                     # "measured now on <device>, B=1" / "recorded on <device>, <date>, B=8"
    dash: str                       # "solid": measured now; RECORDED_DASHES: a committed file
    records: list[dict]


def min_max_bars(records: list[dict]) -> Optional[dict]:
    """plotly error_y spanning each point's min..max ms around its median (None for files from before
    min/max were kept)."""
    if not records or not all(r.get("min_ms") is not None and r.get("max_ms") is not None for r in records):
        return None
    return dict(type="data", symmetric=False, array=[r["max_ms"] - r["median_ms"] for r in records],
                arrayminus=[r["median_ms"] - r["min_ms"] for r in records], thickness=1.2, width=4)


def thinned_log_ticks(values, min_decades: float = 0.12) -> list[float]:
    """Tick values on a log axis at least `min_decades` apart, so no two labels overprint (1024 and
    1088 are 0.03 decades apart); the first of a close pair is kept."""
    kept: list[float] = []
    for v in sorted({float(v) for v in values if v and v > 0 and math.isfinite(v)}):
        if not kept or math.log10(v / kept[-1]) >= min_decades:
            kept.append(v)
    return kept


def benchmark_figure(curves: list[Curve], key, *, title: str, y_title: str, log_y: bool = True,
                     bars: bool = False, height: int = 460) -> go.Figure:
    """The one plotter of benchmark results (the tab, exports and the CLI's plots): x = sequence
    length T (log), colour = backend (BACKEND_COLORS), line style = source; the legend sits under
    the plot (never over the title) and names backends and line styles once each."""
    data, seen = [], set()
    for c in curves:
        ys = [key(r) for r in c.records]
        full = f"{c.backend} · {c.source}"
        data.append(dict(type="scatter", x=[r["T"] for r in c.records], y=ys, name=c.backend,
                         legendgroup=c.backend, showlegend=c.backend not in seen, mode="lines+markers",
                         line=dict(color=BACKEND_COLORS.get(c.backend, "#777777"), dash=c.dash, width=2),
                         marker=dict(size=7), opacity=1.0 if c.dash == "solid" else 0.8, meta=full,
                         error_y=min_max_bars(c.records) if bars else None,
                         hovertemplate=f"{full}<br>T %{{x}}<br>{y_title} %{{y:.4g}}<extra></extra>"))
        seen.add(c.backend)
    for dash, source in dict.fromkeys((c.dash, c.source) for c in curves):     # one entry per line style
        data.append(dict(type="scatter", x=[None], y=[None], mode="lines", name=f"{_DASH_WORD[dash]}: {source}",
                         line=dict(color="#555555", dash=dash, width=2), legendgroup="style", hoverinfo="skip"))
    xs = thinned_log_ticks([r["T"] for c in curves for r in c.records])
    ys = [key(r) for c in curves for r in c.records]
    axis = dict(gridcolor="#E5E5E5", zerolinecolor="#BBBBBB", linecolor="#444", automargin=True)
    layout = dict(
        template=TEMPLATE, title=dict(text=title, x=0, xref="paper", xanchor="left", y=0.97, yanchor="top",
                   font=dict(size=FONT["size"] + 2)),
        font=FONT, height=height, paper_bgcolor="white", plot_bgcolor="white",
        margin=dict(l=70, r=20, t=50, b=40),
        xaxis=dict(**axis, title=dict(text="sequence length T"), type="log", tickmode="array", tickvals=xs,
                   ticktext=[f"{v:g}" for v in xs]),
        yaxis=dict(**axis, title=dict(text=y_title), **(_log_ticks(ys) if log_y else {})),
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.22, yanchor="top", font=dict(size=12)),
    )
    return Figure(dict(data=data, layout=layout), _validate=False)


_DASH_WORD = {"solid": "solid", "dot": "dotted", "dash": "dashed", "dashdot": "dash-dot", "longdash": "long dash"}


def results_figure(data: dict) -> go.Figure:
    """A results file drawn whole (the benchmark CLI's plot): one row per preset, time | memory against
    T, through benchmark_figure (the tab's plotter): colour = backend, line style = mask, cap, padding."""
    from plotly.subplots import make_subplots
    ok = [r for r in data["records"] if r["status"] == Status.OK and r.get("median_ms")]
    presets = list(dict.fromkeys(r["preset"] for r in ok)) or ["(none)"]
    variants = list(dict.fromkeys((r["mask"], r["cap_method"], bool(r.get("padded"))) for r in ok))
    dashes = ("solid",) + RECORDED_DASHES
    fig = make_subplots(rows=len(presets), cols=2, vertical_spacing=0.3 / len(presets),
                        subplot_titles=[f"{p}: {what}" for p in presets
                                        for what in ("median ms per call (bars: min–max)", "peak MiB")])
    shown: set = set()
    for row, preset in enumerate(presets, 1):
        curves = [Curve(b, f"{mask}, cap {cap}" + (", padded" if padded else ""),
                        dashes[variants.index((mask, cap, padded)) % len(dashes)], rs)
                  for (mask, cap, padded) in variants
                  for b, rs in _grouped([r for r in ok if (r["preset"], r["mask"], r["cap_method"],
                                                           bool(r.get("padded"))) == (preset, mask, cap, padded)]).items()]
        for col, (key, y_title, bars) in enumerate(((lambda r: r["median_ms"], "ms", True),
                                                    (lambda r: max(r["peak_mem_bytes"] or 1, 1) / 2**20, "MiB",
                                                     False)), 1):
            part = benchmark_figure(curves, key, title="", y_title=y_title, bars=bars)
            for t in part.data:
                t.showlegend = t.showlegend is not False and t.name not in shown
                shown.add(t.name)
                fig.add_trace(t, row=row, col=col)
            fig.update_xaxes(part.layout.xaxis, row=row, col=col)
            fig.update_yaxes(part.layout.yaxis, row=row, col=col)
    fig.update_layout(title=f"Attention backends on {data['device_name']} — torch {data.get('torch')}, "
                            f"{data.get('date')}, commit {data.get('commit')}",
                      font=FONT, height=360 * len(presets) + 160, width=1300, paper_bgcolor="white",
                      plot_bgcolor="white", legend=dict(orientation="h", x=0, y=-0.08, yanchor="top"))
    return fig


def curves_of(sw: Sweep, recorded: list[tuple[str, list[dict]]], batch: int) -> list[Curve]:
    """Live points (solid) and each committed set (its own dash), one Curve per backend and source."""
    out = [Curve(b, f"measured {sw.measured} on {short_device(sw.device)}, B={batch}", "solid", rs) for b, rs in _grouped(sw.points).items()]
    for i, (label, recs) in enumerate(recorded):
        dash = RECORDED_DASHES[i % len(RECORDED_DASHES)]
        out += [Curve(b, label, dash, rs) for b, rs in _grouped(recs).items()]
    return out


NOTHING_MEASURED = "Nothing measured on this machine yet:<br><b>Run</b> (R when presenting)"


def sweep_figures(sw: Sweep, recorded: Optional[list[tuple[str, list[dict]]]] = None, batch: int = 1,
                  g: Optional[Grid] = None):
    """Time (median, bars min..max over the repeats), memory, speed-up over naive (beside the bound
    skipping alone gives, when the geometry `g` is known) and error, one colour per backend. Either a
    live run (`recorded` None: its points only, solid; a note while it has none) or committed curves
    (an empty `sw`, `recorded` dotted): never both on one axis."""
    if recorded is not None and sw.records:
        raise ValueError("sweep_figures: recorded curves never share a live run's axes")
    curves = curves_of(sw, recorded or [], batch)
    time_fig = benchmark_figure(curves, lambda r: r["median_ms"], bars=True, y_title="ms",
                                title="Time per call (median; bars: min–max)")
    ooms = [r for r in sw.records if r["status"] == Status.OOM]
    if ooms:                        # out of memory is a result too: drawn where the curve would go on
        top = max([r["max_ms"] or r["median_ms"] for r in sw.points] or [1.0])
        time_fig.add_trace(go.Scatter(x=[r["T"] for r in ooms], y=[top] * len(ooms), mode="markers+text",
                                      marker=dict(symbol="x", size=14, color="#D55E00"),
                                      text=[f"{r['backend']}: out of memory" for r in ooms],
                                      textposition="top center", name="out of memory (measured now)"))
    mem_fig = benchmark_figure(curves, lambda r: max(r["peak_mem_bytes"], 1) / 2**20, y_title="MiB",
                               title="Peak memory of one call, above its inputs")
    speed = []
    for c in curves:
        naive = {r["T"]: r["median_ms"] for cc in curves if cc.source == c.source and cc.backend == "naive"
                 for r in cc.records}
        kept = [dict(r, speedup=naive[r["T"]] / r["median_ms"]) for r in c.records if r["T"] in naive]
        if kept:
            speed.append(replace(c, records=kept))
    speed_fig = benchmark_figure(speed, lambda r: r["speedup"], y_title="× naive", log_y=False,
                                 title="Speed-up over naive (same run, same T)")
    lengths = sorted({r["T"] for c in speed for r in c.records})
    if g is not None and lengths:
        bound = [1 / max(1 - work_skipped(g.masks[0], T, g.num_candidates)["skip_elements"], 1e-9) for T in lengths]
        speed_fig.add_trace(go.Scatter(x=lengths, y=bound, mode="lines", name="if time followed the work "
                                       f"{FLEX_BLOCK}×{FLEX_BLOCK} tiles skip", line=dict(color="#999999", width=3),
                                       hovertemplate="skipping alone: at most %{y:.2f}× at T %{x}<extra></extra>"))
    err = [Curve(c.backend, c.source, c.dash, [r for r in c.records if r.get("max_abs_err") is not None])
           for c in curves if c.dash == "solid"]
    err_fig = benchmark_figure([c for c in err if c.records], lambda r: r["max_abs_err"], log_y=False,
                               y_title="max abs error", title="Max |error| vs the fp32 reference, same inputs")
    err_fig.update_yaxes(exponentformat="e", tickformat=".1e")
    figs = time_fig, mem_fig, speed_fig, err_fig
    if recorded is None and not sw.points:
        for fig in figs:
            fig.add_annotation(text=NOTHING_MEASURED, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                               font=dict(size=14, color="#555555"))
    return figs


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
    files = [(name, d) for name, d in load_results(RESULTS_DIR) if d["records"]]    # not a views-only file
    if not files:
        return "No recorded attention benchmark files are committed under `benchmarks/results/` yet."
    lines = [f"- `{name}`: recorded on **{d['device_name']}**, {d.get('date', 'unknown date')} "
             f"({sum(r.get('status') == 'ok' for r in d['records'])} points)" for name, d in files]
    if not any(on_gpu(d) for _, d in files):
        lines.append("- None of the recorded files comes from a GPU.")
    return ("Recorded benchmark files (`python -m benchmarks.attention`; the GPU's drawn above, on their own axes; "
            "each file's curves in the Export tab's timing figures):\n" + "\n".join(lines))


def recorded_view(s: Settings) -> tuple[go.Figure, go.Figure, go.Figure, str]:
    """For exports (the Export tab, the lecture pack), which never run a sweep: the committed curves of
    the first geometry and dtype this device offers that has any, as (time, memory, speed-up, what
    they show). The error figure is left out: it holds live points only."""
    choices = [(g, dt) for g in geometries() for dt in dtypes()]
    found = next(((g, dt, geometry(s, g, dt)) for g, dt in choices if recorded_records(geometry(s, g, dt))), None)
    name, dt, g = found or (*choices[0], geometry(s, *choices[0]))
    recorded = recorded_records(g)
    time_fig, mem_fig, speed_fig, _ = sweep_figures(Sweep(device_name(device())), recorded, batch=g.B, g=g)
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
    """The live figures before a run: empty axes saying nothing is measured yet."""
    g = geometry(s, geometry_name or geometries()[0], dtype or dtypes()[0])
    return sweep_figures(Sweep(device_name(device())), batch=g.B, g=g)

