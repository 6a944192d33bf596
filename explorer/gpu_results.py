"""The recorded GPU evidence, shown to every visitor (a CPU Space too): from the newest committed GPU results
file, production's attention per backend (× naive, useful TFLOP/s as a share of the same run's matmul peak, the
tiles, the cap's cost, the longest T) and the whole trunk's forward per backend with attention's share of it.

Every number is read from the committed files under benchmarks/results/ (the results file, and for files from
before results kept trunk timings, their GPU session's folder); nothing here is measured. The live run of this
machine is drawn beside the recorded one, on its own axes (``flash_figure``), never on the same ones.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import plotly.graph_objects as go

from models.presets import PRESETS
from models.runinfo import RESULTS_DIR

from .figures import FONT, TEMPLATE, Figure
from .limits import trunk_params
from .measure import Status, TrunkTimings, day_order, file_stamps, load_results, on_gpu, run_order, trunk_timings, useful_flops
from .families import preset_settings
from .schema import ValidationError
from .timing import BACKEND_COLORS, Sweep, short_device

# the 2025 model's own attention at production's batch: the shape the GPU evidence is shown at
SHAPE = dict(preset="phoenix-prod", mask="recsys")
CAPS = ("none", "tanh")
CAP_WORDS = {"none": "no cap", "tanh": "tanh cap"}
LONG = "long"                       # the benchmark grid that grows phoenix-prod's attention to long sequences


@dataclass(frozen=True)
class GpuRun:
    """One committed GPU results file, with the trunk timings and cap probe of its session where kept."""
    name: str                       # the results file's name under benchmarks/results/
    data: dict
    trunk: Optional[TrunkTimings]
    capprobe: Optional[dict]        # the cap probe's rows and where they are (`source`), same device
    long: Optional[dict] = None     # the newest file with the long grid, where this one has none (a later run
                                    # that had no time for it): its records and its own matmul peak
    tests: Optional["GpuTests"] = None      # the GPU tests run at this file's commit on this device

    @property
    def device(self) -> str:
        return self.data["device_name"]

    @property
    def gpu(self) -> str:
        """'H100' of 'NVIDIA H100 80GB HBM3': the chip's name where it has one, else the device's."""
        m = re.search(r"\b[A-Z]{1,2}\d{2,4}[A-Za-z]?\b", self.device)
        return m.group(0) if m else self.device

    @property
    def peak(self) -> float:
        """The same run's dense matmul throughput (TFLOP/s): the yardstick of every share."""
        return float(self.data["matmul_tflops"])

    def label(self) -> str:
        return f"{self.device}, {self.data.get('date')}, commit {self.data.get('commit')}"


def gpu_run(results_dir: Path = RESULTS_DIR) -> Optional[GpuRun]:
    """The newest committed GPU results file (run_order) that timed the kernels at the evidence shape, or None
    when none did; its long-sequence grid from the newest file that has one. A later file that timed only other
    parts (the views, say) is no kernel evidence and displaces none."""
    files = sorted(((n, d) for n, d in load_results(results_dir) if on_gpu(d) and d.get("matmul_tflops")
                    and any(r["preset"] == SHAPE["preset"] and r["status"] == Status.OK for r in d["records"])),
                   key=lambda f: run_order(*f))
    if not files:
        return None
    name, data = files[-1]
    long = next((dict(name=n, records=d["records"], peak=d["matmul_tflops"]) for n, d in reversed(files)
                 if any(r["preset"] == LONG for r in d["records"])), None)
    return GpuRun(name, data, trunk_timings(name, data, results_dir), _capprobe(str(results_dir), data["device_name"]),
                  long, _tests(str(results_dir), str(data.get("commit")), data["device_name"]))


def _stamps(results_dir: str, pattern: str) -> tuple:
    """measure.file_stamps of the files matching `pattern`, newest session first."""
    root = Path(results_dir)
    return file_stamps(sorted(root.glob(pattern), key=lambda p: (day_order(p.relative_to(root).parents[-2].name),
                                                                 str(p)), reverse=True))


def _capprobe(results_dir: str, device: str) -> Optional[dict]:
    return _read_capprobe(results_dir, device, _stamps(results_dir, "gpu-run-*/capprobe.json"))


@functools.lru_cache(maxsize=4)
def _read_capprobe(results_dir: str, device: str, stamps: tuple) -> Optional[dict]:
    """The newest GPU session's cap probe on `device` (its rows and its path), or None."""
    for path, _, _ in stamps:
        try:
            found = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if found.get("device") == device and found.get("rows"):
            return dict(rows=found["rows"], source=Path(path).relative_to(results_dir).as_posix())
    return None


@dataclass(frozen=True)
class GpuTests:
    """A GPU session's tests, as its call streamed them (benchmarks/pytest_stream.py): tests by outcome, each
    skip's reason once, and whether pytest reached its end (its JUnit file is written only then)."""
    source: str                     # the folder under benchmarks/results/
    outcomes: dict                  # outcome -> number of tests
    skips: tuple
    finished: bool


def _tests(results_dir: str, commit: str, device: str) -> Optional[GpuTests]:
    return _read_tests(results_dir, commit, device, _stamps(results_dir, "gpu-run-*/**/gpu-tests.jsonl"))


@functools.lru_cache(maxsize=4)
def _read_tests(results_dir: str, commit: str, device: str, stamps: tuple) -> Optional[GpuTests]:
    """The newest GPU session call (a folder with session.json, as gpu_session.sh writes it, beside its streamed
    outcomes) that ran the GPU tests at `commit` on `device`, or None. A test's outcome is its call's, or its
    setup's where it went no further; a failure at any stage is a failure."""
    root = Path(results_dir)
    for outcomes, _, _ in stamps:
        path = Path(outcomes).with_name("session.json")
        try:
            session = json.loads(path.read_text())
            lines = [json.loads(line) for line in Path(outcomes).read_text().splitlines() if line]
        except (OSError, ValueError):
            continue
        if session.get("commit") != commit or session.get("device") != device or not lines:
            continue
        outcome, skips = {}, {}
        for line in lines:
            if line["outcome"] == "failed" or line["nodeid"] not in outcome:
                outcome[line["nodeid"]] = line["outcome"]
            if line["outcome"] == "skipped":
                skips.setdefault(line.get("message", "").removeprefix("Skipped: "), None)
        counts = {k: sum(v == k for v in outcome.values()) for k in ("passed", "failed", "skipped")}
        return GpuTests(path.parent.relative_to(root).as_posix(), counts, tuple(skips),
                        (path.parent / "gpu-tests.xml").exists())
    return None


def required(run: Optional[GpuRun]) -> GpuRun:
    """The run, or a refusal naming what is missing (an export of a GPU figure where none is committed)."""
    if run is None:
        raise ValidationError("gpu results", "none committed", "a GPU results file under benchmarks/results/ "
                              "(python -m benchmarks.attention on a GPU)")
    return run


# --- the numbers, each read from the file --------------------------------------------------------------

def kernel_points(run: GpuRun, preset: str = SHAPE["preset"], mask: str = SHAPE["mask"]) -> dict[str, list[dict]]:
    """cap method -> the records that ran at `preset` (no padding, its own T), each with `speedup` (naive's
    median over its own, same cap) and `share` (its useful TFLOP/s over the run's matmul peak); naive first."""
    out = {}
    for cap in CAPS:
        rs = [r for r in run.data["records"] if r["preset"] == preset and r["mask"] == mask and not r.get("padded")
              and r["cap_method"] == cap and r["status"] == Status.OK and r.get("median_ms")]
        naive = {r["T"]: r["median_ms"] for r in rs if r["backend"] == "naive"}
        rs = [dict(r, speedup=naive[r["T"]] / r["median_ms"], share=(r["tflops"] or 0) / run.peak)
              for r in rs if r["T"] in naive]
        if rs:
            out[cap] = sorted(rs, key=lambda r: r["backend"] != "naive")
    return out


def cap_costs(run: GpuRun) -> dict[str, float]:
    """backend -> its time with the tanh cap over its time without, at the evidence shape."""
    by = {cap: {r["backend"]: r["median_ms"] for r in rs} for cap, rs in kernel_points(run).items()}
    return {b: by["tanh"][b] / ms for b, ms in by.get("none", {}).items() if b in by.get("tanh", {})}


def tiles(run: GpuRun) -> Optional[dict]:
    """FA4's 128 x 128 tile classes over the evidence shape's mask, as the file records them."""
    rs = [r for rs in kernel_points(run).values() for r in rs if r.get("tiles")]
    return rs[0]["tiles"] if rs else None


def longest(run: GpuRun) -> list[dict]:
    """At the longest T any backend reached on the long grid: every record that ran there (both caps), with
    its share of the peak; and for each backend that stopped earlier, its first failure."""
    if run.long is None:
        return []
    rs = [r for r in run.long["records"] if r["preset"] == LONG]
    ok = [r for r in rs if r["status"] == Status.OK and r.get("median_ms")]
    if not ok:
        return []
    T = max(r["T"] for r in ok)
    top = [dict(r, share=(r["tflops"] or 0) / run.long["peak"]) for r in ok if r["T"] == T]
    ran = {r["backend"] for r in top}
    failed = {}
    for r in sorted(rs, key=lambda r: r["T"]):
        if r["backend"] not in ran and r["status"] == Status.OOM:
            failed.setdefault(r["backend"], r)
    return top + list(failed.values())


def forward_tflop(preset: str, B: int) -> float:
    """Useful work of one trunk forward (TFLOP): 2 x trunk parameters per token, plus each layer's q.k and p.v
    over the pairs the model's mask allows."""
    s = preset_settings(preset)
    attention = s.num_layers * useful_flops(s.mask_kind, B, s.num_q_heads, s.key_size, s.seq_len, s.num_candidates)
    return (2 * B * s.seq_len * trunk_params(s) + attention) / 1e12


def trunk_peak(run: GpuRun) -> float:
    """The matmul peak of the run that timed the trunk (another call of the session, where it was split)."""
    return float(run.trunk.peak or run.peak)


def trunk_points(run: GpuRun, preset: str = SHAPE["preset"]) -> dict[str, list[dict]]:
    """cap method -> the whole-forward records that ran at `preset` (its largest batch), each with `speedup`
    over naive (same cap), `attention` ms and whether it was `derived`: where the file has no attention_ms,
    the same run's kernel median at the same shape (B, T, mask, cap, no padding) x the preset's layers."""
    if run.trunk is None:
        return {}
    rs = [r for r in run.trunk.records if r["preset"] == preset and r["status"] == Status.OK and r["median_ms"]]
    if not rs:
        return {}
    B, layers = max(r["B"] for r in rs), PRESETS[preset].geometry.num_layers
    out = {}
    for cap in reversed(CAPS):                          # the model's own tanh cap first
        here = [r for r in rs if r["B"] == B and r["cap_method"] == cap]
        naive = next((r["median_ms"] for r in here if r["backend"] == "naive"), None)
        kernel = {(k["backend"]): k["median_ms"] for k in run.data["records"]
                  if (k["preset"], k["B"], k["mask"], k["cap_method"], k["dtype"]) == (preset, B, here[0]["mask"], cap,
                                                                                   here[0]["dtype"])
                  and not k.get("padded") and k["status"] == Status.OK and k.get("median_ms")} if here else {}
        pts = []
        for r in here:
            derived = r.get("attention_ms") is None
            attention = kernel.get(r["backend"], math.nan) * layers if derived else r["attention_ms"]
            pts.append(dict(r, speedup=naive / r["median_ms"] if naive else math.nan, attention=attention,
                            derived=derived))
        if pts:
            out[cap] = sorted(pts, key=lambda r: r["backend"] != "naive")
    return out


# --- figures ---------------------------------------------------------------------------------------------

def _kernel_text(r: dict) -> str:
    return f"{r['speedup']:.3g}× · {r['median_ms']:.3g} ms · {r['share']:.0%}"


def _bars(rows: list[dict], text, *, name: str, axes: tuple[str, str], source: str, pattern: str = "") -> dict:
    """One horizontal bar trace of × naive, a bar per backend in its own colour, the numbers printed beside
    each; `source` (its device) in its hover and meta."""
    return dict(type="bar", orientation="h", name=name, y=[r["backend"] for r in rows],
                x=[r["speedup"] for r in rows], text=[text(r) for r in rows], textposition="outside",
                cliponaxis=False, xaxis=axes[0], yaxis=axes[1], meta=source,
                showlegend=False, hovertemplate=f"{source}<br>%{{y}} · {name}: %{{text}}<extra></extra>",
                marker=dict(color=[BACKEND_COLORS.get(r["backend"], "#777777") for r in rows],
                            pattern=dict(shape=pattern, fgcolor="white", solidity=0.35) if pattern else None,
                            line=dict(color="#333333", width=0.5)))


def _layout(title: str, height: int, **layout) -> dict:
    return {**dict(template=TEMPLATE, font=FONT, height=height, paper_bgcolor="white", plot_bgcolor="white",
                   title=dict(text=title, x=0.01, xanchor="left", yref="container", y=1, yanchor="top",
                              pad=dict(t=12), font=dict(size=FONT["size"] + 2)),
                   barmode="group", bargap=0.25, showlegend=False, margin=dict(l=110, r=30, t=120, b=50)),
            **layout}


def _axis(**kw) -> dict:
    return dict(gridcolor="#E5E5E5", zerolinecolor="#BBBBBB", linecolor="#444", automargin=True, **kw)


def _heading(x: float, text: str) -> dict:
    """A panel's title, left-aligned over it (an annotation: the page's presentation mode sizes it)."""
    return dict(text=text, x=x, y=1.0, yshift=8, xref="paper", yref="paper", xanchor="left", yanchor="bottom",
                align="left", showarrow=False, font=dict(size=13))


RECORDED_DOMAIN, LIVE_DOMAIN = (0.0, 0.56), (0.7, 1.0)
SPEEDUP_TICKS = (0.3, 1, 3, 10, 30, 100, 300)
CAP_COST_SHOWN = ("flex", "fa4")    # the fused kernels: the cap's cost is theirs


def live_points(sw: Sweep) -> tuple[Optional[int], list[dict]]:
    """(T, records with `speedup` over naive) at the longest length the live run measured naive and another
    backend at; (None, []) before that."""
    for T in sorted({r["T"] for r in sw.points}, reverse=True):
        here = [r for r in sw.points if r["T"] == T]
        naive = next((r["median_ms"] for r in here if r["backend"] == "naive"), None)
        if naive and len(here) > 1:
            rows = [dict(r, speedup=naive / r["median_ms"]) for r in here]
            return T, sorted(rows, key=lambda r: r["backend"] != "naive")
    return None, []


def recorded_heading(run: GpuRun, rec: dict[str, list[dict]]) -> str:
    r = next(iter(rec.values()))[0]
    return (f"<b>Recorded on {run.device}</b><br>{run.data.get('date')} · commit {run.data.get('commit')} · "
            f"{r['dtype']}<br>{r['preset']} attention, B {r['B']}, T {r['T']}<br>hatched: {CAP_WORDS['tanh']}, which "
            "costs " + ", ".join(f"{b} {c:.2g}×" for b, c in cap_costs(run).items() if b in CAP_COST_SHOWN))


def flash_figure(run: Optional[GpuRun], live: Optional[Sweep] = None, live_shape: str = "") -> go.Figure:
    """Flash vs naive, × naive per backend on a log scale: recorded on the GPU at production's shape, both
    caps (left), and, when `live` is given, this machine's live run at its longest length so far (right,
    `live_shape` naming what it times) — two panels, each on its own axes and titled with its device, batch
    and dtype, on the same x scale so the bars compare. Beside each bar: × naive, ms and (GPU) its useful
    TFLOP/s as a share of the same run's matmul peak."""
    rec = kernel_points(run) if run else {}
    data, notes = [], []
    for cap, rs in rec.items():
        data.append(_bars(rs, _kernel_text, name=CAP_WORDS[cap], axes=("x", "y"), pattern="/" if cap != "none" else "",
                          source=f"recorded on {run.label()}"))
    notes.append(_heading(RECORDED_DOMAIN[0], recorded_heading(run, rec) if rec else
                          "<b>No GPU results file is committed</b><br>(python -m benchmarks.attention on a GPU)"))
    speeds = [r["speedup"] for rs in rec.values() for r in rs]
    side = RECORDED_DOMAIN if live is not None else (0.0, 1.0)
    layout = dict(xaxis=_axis(domain=list(side), title=dict(text="× naive · ms · % of the matmul peak")),
                  yaxis=_axis(anchor="x", type="category", autorange="reversed"))
    if live is not None:
        T, rows = live_points(live)
        speeds += [r["speedup"] for r in rows]
        where = f"<b>Measured {live.measured}, here</b><br>{short_device(live.device)}<br>"
        if rows:
            data.append(dict(_bars(rows, lambda r: f"{r['speedup']:.3g}× · {r['median_ms']:.3g} ms", name=f"T {T}",
                                   axes=("x2", "y2"), source=f"measured {live.measured} on {live.device}"), width=0.45))
            notes.append(_heading(LIVE_DOMAIN[0], f"{where}T {T} · {live_shape}"))
        else:
            notes.append(_heading(LIVE_DOMAIN[0], where + live_shape))
            notes.append(dict(text="Nothing measured here yet:<br><b>Run</b> (R when presenting)<br>times these "
                                   "backends live", x=sum(LIVE_DOMAIN) / 2, y=0.5, xref="paper", yref="paper",
                              showarrow=False, font=dict(size=14, color="#555555")))
        layout.update(xaxis2=_axis(domain=list(LIVE_DOMAIN), anchor="y2", title=dict(text="× naive · ms")),
                      yaxis2=_axis(anchor="x2", type="category", autorange="reversed"))
    lo, hi = min([0.5, *speeds]), max([10.0, *speeds]) * 12             # room right of the bars for the numbers
    ticks = [t for t in SPEEDUP_TICKS if lo <= t <= hi]
    for key, shown in (("xaxis", ticks), ("xaxis2", [t for t in ticks if math.log10(t).is_integer()])):
        if key in layout:
            layout[key].update(type="log", range=[math.log10(lo), math.log10(hi)], tickmode="array",
                               tickvals=shown, ticktext=[f"{t:g}×" for t in shown])
    return Figure(dict(data=data, layout=_layout("", 480, annotations=notes, **layout)), _validate=False)


def rest_span(pts: dict[str, list[dict]]) -> tuple[float, float]:
    """The least and most of the forward that is not attention, over every backend and cap drawn."""
    rest = [r["median_ms"] - r["attention"] for rs in pts.values() for r in rs]
    return min(rest), max(rest)


def trunk_figure(run: Optional[GpuRun]) -> go.Figure:
    """The whole trunk's forward per backend, both caps: attention (dark) and the rest (grey) stacked, the
    total and × naive printed; a line at the time the forward's useful work would take at the matmul peak."""
    pts = trunk_points(run) if run else {}
    if not pts:
        why = "No whole-forward timings are committed" + (f" with {run.name}" if run else "")
        return Figure(dict(data=[], layout=_layout(why, 300)), _validate=False)
    data, notes, layout = [], [], {}
    first = next(iter(pts.values()))[0]
    floor = forward_tflop(first["preset"], first["B"]) / trunk_peak(run) * 1e3        # ms at the peak
    width = 1.0 / len(pts)
    top = max(r["median_ms"] for rs in pts.values() for r in rs)
    for i, (cap, rs) in enumerate(pts.items()):
        ax = "" if i == 0 else str(i + 1)
        dom = [i * width + (0.1 if i else 0.0), (i + 1) * width - (0.1 if i < len(pts) - 1 else 0.0)]
        for part, colour in (("attention", None), ("rest", "#C8C8C8")):
            xs = [r["attention"] if part == "attention" else r["median_ms"] - r["attention"] for r in rs]
            data.append(dict(type="bar", orientation="h", y=[r["backend"] for r in rs], x=xs, name=part,
                             marker=dict(color=colour or [BACKEND_COLORS.get(r["backend"], "#777") for r in rs]),
                             text=[f"{r['median_ms']:.0f} ms · attention {r['attention']:.0f} · "
                                   f"{r['speedup']:.2g}×" for r in rs] if part == "rest"
                             else None, textposition="outside", cliponaxis=False,
                             xaxis=f"x{ax}", yaxis=f"y{ax}", showlegend=False, meta=f"recorded on {run.label()}",
                             hovertemplate=f"%{{y}} · {CAP_WORDS[cap]} · {part}: %{{x:.4g}} ms<extra></extra>"))
        layout[f"xaxis{ax}"] = _axis(domain=dom, anchor=f"y{ax}", title=dict(text="ms per forward"),
                                     range=[0, top * 1.9], **({"matches": "x"} if ax else {}))
        layout[f"yaxis{ax}"] = _axis(anchor=f"x{ax}", type="category", autorange="reversed",
                                     showticklabels=True)
        notes.append(_heading(dom[0], f"<b>{CAP_WORDS[cap]}</b>"))
        layout.setdefault("shapes", []).append(dict(type="line", x0=floor, x1=floor, y0=0, y1=1, xref=f"x{ax}",
                                                    yref=f"y{ax} domain", line=dict(color="#444", dash="dot")))
    derived = any(r["derived"] for rs in pts.values() for r in rs)
    lo, hi = rest_span(pts)
    title = (f"The whole forward on {run.device}: {first['preset']} trunk, B {first['B']}, T {first['T']}, "
             f"{first['dtype']}")
    subtitle = ("colour: attention" + (f" (derived: the kernel's time × "
                f"{PRESETS[first['preset']].geometry.num_layers} layers)" if derived else "") +
                f" · grey: the rest, {lo:.0f}–{hi:.0f} ms in every backend<br>dotted: all "
                f"{forward_tflop(first['preset'], first['B']):.1f} TFLOP of its useful work at the matmul peak = "
                f"{floor:.0f} ms")
    fig = _layout(title, 420, annotations=notes, bargap=0.3, barmode="stack", **layout)
    fig["title"]["subtitle"] = dict(text=subtitle)
    fig["margin"] = dict(fig["margin"], t=130)
    return Figure(dict(data=data, layout=fig), _validate=False)


# --- in words: the table beside the figures, captions, the lesson's claims -------------------------------

def _ms(r: Optional[dict]) -> str:
    if not r:
        return "—"
    spread = f" ({r['min_ms']:.3g}–{r['max_ms']:.3g})" if r.get("min_ms") is not None else ""
    return f"{r['median_ms']:.3g}{spread}"


def kernel_table(run: GpuRun) -> str:
    """Markdown: per backend at the evidence shape, each cap's ms (min–max), × naive, useful TFLOP/s and its
    share of the run's matmul peak, and what the tanh cap costs it."""
    rec = kernel_points(run)
    costs = cap_costs(run)
    by = {cap: {r["backend"]: r for r in rs} for cap, rs in rec.items()}
    rows = ["| backend | " + " | ".join(f"{CAP_WORDS[c]}: ms (min–max) | × naive | TFLOP/s (share of peak)"
                                         for c in rec) + " | the cap costs |",
            "|---" * (2 + 3 * len(rec)) + "|"]
    for b in dict.fromkeys(r["backend"] for rs in rec.values() for r in rs):
        cells = []
        for cap in rec:
            r = by[cap].get(b)
            cells += [_ms(r), f"{r['speedup']:.3g}×" if r else "—",
                      f"{r['tflops']:.0f} ({r['share']:.0%})" if r else "did not run"]
        rows.append(f"| {b} | " + " | ".join(cells) + f" | {f'{costs[b]:.2f}×' if b in costs else '—'} |")
    return "\n".join(rows)


def longest_line(run: GpuRun) -> str:
    rows = longest(run)
    ran = [r for r in rows if r["status"] == Status.OK]
    if not ran:
        return ""
    r0 = ran[0]
    parts = [f"{r['backend']} {CAP_WORDS[r['cap_method']]} {r['median_ms']:.3g} ms = {r['tflops']:.0f} TFLOP/s "
             f"({r['share']:.0%})" for r in sorted(ran, key=lambda r: r["median_ms"])]
    failed = [f"{r['backend']} ran out of memory from T = {r['T']}" for r in rows if r["status"] != Status.OK]
    unchecked = any(r.get("max_abs_err") is None for r in ran)
    where = f", `{run.long['name']}`" if run.long["name"] != run.name else ""
    return (f"The longest sequence (the `{LONG}` grid{where}: B {r0['B']}, T {r0['T']}, {r0['mask']}, {r0['dtype']}): "
            + "; ".join(parts) + (". " + "; ".join(failed) if failed else "")
            + (". These points were not checked against a reference (none fit in memory beside them)"
               if unchecked else "") + ".")


def cap_probe_line(run: GpuRun) -> str:
    """What the session's cap probe found, from its file: FlexAttention with the tanh cap, and with FMA-only
    polynomials for tanh in its place (each with its error on tanh), as shares of the uncapped throughput."""
    rows = (run.capprobe or {}).get("rows", {})
    if "none" not in rows or "torch.tanh" not in rows:
        return ""
    base, tanh = rows["none"]["ms_median"], rows["torch.tanh"]["ms_median"]
    polys = sorted((v for k, v in rows.items() if k.startswith("poly")), key=lambda v: -v["fit_abs_err_tanh"])
    session = run.tests.source.split("/")[0] if run.tests else None          # the folder of the run's own session
    same = session is not None and run.capprobe["source"].startswith(f"{session}/")
    which = "the same" if same else "an earlier" if session else "a"        # no session.json: which is unknown
    line = (f"Why the cap costs: in {which} session on this device, FlexAttention "
            f"alone at this shape ran {base:.3g} ms uncapped and "
            f"{tanh:.3g} ms with `30·tanh(s/30)` ({base / tanh:.2f}× the uncapped throughput)")
    if polys:
        line += (", and " + ", ".join(f"{v['ms_median']:.3g} ms ({base / v['ms_median']:.2f}×)" for v in polys) +
                 " with tanh as FMA-only polynomials of max error " +
                 ", ".join(f"{v['fit_abs_err_tanh']:.1e}" for v in polys) + " on tanh: moving tanh off the "
                 "special-function unit recovers little — the cost is the per-score elementwise work as a whole")
    return line + f" (`{run.capprobe['source']}`)."


def tests_line(run: GpuRun) -> str:
    """What the GPU tests found at the run's commit on its device, from the call's streamed outcomes."""
    tests = run.tests
    if tests is None:
        return ""
    n = tests.outcomes
    ran = f"{n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped" + (
        f" ({'; '.join(tests.skips)})" if tests.skips else "")
    return (f"**The GPU tests at this commit on this device** (`{tests.source}/`): {ran}"
            + ("" if tests.finished else "; the call's time ran out before the last tests") + ". They check every "
            "backend against the fp32 reference at each mask and cap, the whole trunk per backend against naive, "
            "a forward without a host sync, the masks built on the device, and every view drawn there.")


def trunk_table(run: GpuRun) -> str:
    """Markdown: the whole forward per backend and cap, with attention's share and where it comes from."""
    pts = trunk_points(run)
    if not pts:
        return ""
    first = next(iter(pts.values()))[0]
    flops = forward_tflop(first["preset"], first["B"])
    rows = ["| cap | backend | forward ms | × naive | attention ms (share) | the rest ms | useful TFLOP/s (share of "
            "peak) |", "|---|---|---|---|---|---|---|"]
    for cap, rs in pts.items():
        for r in rs:
            rows.append(f"| {CAP_WORDS[cap]} | {r['backend']} | {_ms(r)} | {r['speedup']:.2g}× | "
                        f"{r['attention']:.3g} ({r['attention'] / r['median_ms']:.0%}) | "
                        f"{r['median_ms'] - r['attention']:.3g} | {flops / r['median_ms'] * 1e3:.0f} "
                        f"({flops / r['median_ms'] * 1e3 / trunk_peak(run):.0%}) |")
    layers = PRESETS[first["preset"]].geometry.num_layers
    how = (f"attention = the kernel's median in the results file at the same shape (B {first['B']}, T {first['T']}, "
           f"{first['mask']}, same cap, no padding) × {layers} layers — derived, not timed inside the forward"
           if any(r["derived"] for rs in pts.values() for r in rs) else "attention timed inside the forward")
    return (f"**What flash buys the model** — the whole {first['preset']} trunk forward (B {first['B']}, "
            f"T {first['T']}, {first['dtype']}, mask {first['mask']}) per backend, from `{run.trunk.source}` "
            f"({run.trunk.method}); {how}. The forward's useful work is {flops:.1f} TFLOP: "
            f"{flops / trunk_peak(run) * 1e3:.0f} ms at the run's matmul peak.\n\n" + "\n".join(rows))


def evidence_markdown(run: Optional[GpuRun]) -> str:
    """Everything the figures show and more, as text: where it was recorded, the kernel table, the tiles,
    the longest T, why the cap costs, the whole forward."""
    if run is None:
        return ("No GPU results file is committed under `benchmarks/results/`: the recorded GPU evidence appears "
                "here once `python -m benchmarks.attention` has run on a GPU and its file is committed.")
    rec = kernel_points(run)
    r = next(iter(rec.values()))[0] if rec else None
    t = tiles(run)
    head = (f"**Recorded on {run.device}**, {run.data.get('date')}, commit {run.data.get('commit')} "
            f"(`benchmarks/results/{run.name}`; torch {run.data.get('torch')}; "
            f"{(run.data.get('conditions') or {}).get('repeats', 5)} interleaved repeats per point; the "
            f"{run.data.get('matmul_dtype', 'bfloat16')} matmul peak measured in the same run: {run.peak:.1f} "
            "TFLOP/s). Nothing in this part was measured on this machine.")
    parts = [head] + [line for line in (tests_line(run),) if line]
    if r:
        parts.append(f"Attention at {r['preset']} (B {r['B']}, T {r['T']}, {r['Hq']} query / {r['Hkv']} KV heads, "
                     f"head dim {r['head_dim']}, {r['dtype']}, mask {r['mask']}):\n\n{kernel_table(run)}")
    if t:
        parts.append(f"FA4's 128 × 128 tiles over this mask: {t['full']} run in full, {t['partial']} run with the "
                     f"mask, {t['empty']} skipped (of {sum(t.values())}).")
    parts += [line for line in (longest_line(run), cap_probe_line(run), trunk_table(run)) if line]
    return "\n\n".join(parts)


def kernel_caption(run: Optional[GpuRun]) -> str:
    r = required(run)
    rec = kernel_points(r)
    x = next(iter(rec.values()))[0]
    return (f"Attention per backend as a multiple of naive's speed (log scale), recorded on {r.device} "
            f"({r.data.get('date')}, commit {r.data.get('commit')}) at {x['preset']}'s shape (B {x['B']}, T {x['T']}, "
            f"{x['dtype']}, mask {x['mask']}), without and with the tanh cap (hatched); beside each bar its median ms "
            f"and its useful TFLOP/s as a share of the same run's {r.peak:.0f} TFLOP/s matmul peak. From "
            f"benchmarks/results/{r.name}; nothing was measured for this export.")


def trunk_caption(run: Optional[GpuRun]) -> str:
    r = required(run)
    pts = trunk_points(r)
    if not pts:
        raise ValidationError("gpu results", r.name, "a results file with whole-forward timings (its \"trunk\" "
                              "records, or its GPU session's probe.json)")
    x = next(iter(pts.values()))[0]
    return (f"The whole {x['preset']} trunk forward per backend (B {x['B']}, T {x['T']}, {x['dtype']}), recorded on "
            f"{r.device} ({r.data.get('date')}, commit {r.data.get('commit')}; {r.trunk.method}): attention "
            + ("(the kernel's benchmark time × the layers, derived) " if x["derived"] else "")
            + f"in colour, the rest in grey; the dotted line is the forward's useful work at the matmul peak. From "
            f"benchmarks/results/{r.trunk.source}; nothing was measured for this export.")


def evidence_view(s=None) -> tuple[go.Figure, go.Figure, str]:
    """The recorded GPU evidence, as exports draw it (no live panel): kernels, whole forward, the table.
    The same for every setting (`s` is the view's contract); refused by name where no GPU file is committed."""
    run = required(gpu_run())
    return flash_figure(run), trunk_figure(run), evidence_markdown(run)


def headline(run: GpuRun) -> Optional[dict]:
    """The fastest backend without the cap at the evidence shape (its record, with speedup and share)."""
    rs = [r for r in kernel_points(run).get("none", []) if r["backend"] != "naive"]
    return max(rs, key=lambda r: r["speedup"]) if rs else None


def kernel_claim(run: Optional[GpuRun]) -> str:
    """The lesson's claim on flash_figure, in one line, from the file."""
    best = headline(run) if run else None
    if best is None:
        return "No GPU run is committed yet: Run (R) times naive attention against the kernels live on this machine."
    cost = cap_costs(run).get(best["backend"])
    return (f"Recorded on an {run.gpu}: {best['backend']} runs {best['preset']}'s attention {best['speedup']:.3g}× "
            f"faster than naive ({best['share']:.0%} of matmul peak)" +
            (f"; the tanh cap costs it {cost:.2g}×" if cost else "") + ". R runs it live here.")


def trunk_claim(run: Optional[GpuRun]) -> str:
    """The lesson's claim on trunk_figure, in one line, from the file: the model's gain with its own cap."""
    pts = trunk_points(run) if run else {}
    rs = next(iter(pts.values()), [])
    naive = next((r for r in rs if r["backend"] == "naive"), None)
    best = max((r for r in rs if r["backend"] != "naive"), key=lambda r: r["speedup"], default=None)
    if naive is None or best is None:
        return "No whole-forward timings are committed yet."
    lo, hi = rest_span(pts)
    return (f"The whole forward gains only {best['speedup']:.2g}× ({naive['median_ms']:.0f} → "
            f"{best['median_ms']:.0f} ms, {CAP_WORDS[best['cap_method']]}): attention falls from {naive['attention']:.0f} to "
            f"{best['attention']:.0f} ms; the rest stays {lo:.0f}–{hi:.0f} ms.")
