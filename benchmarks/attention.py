"""Attention benchmark CLI: every available backend on grok.py's attention, swept over sequence length, the
whole trunk forward per backend beside it, and every explorer view timed on the device.

    python -m benchmarks.attention --preset lecture|phoenix-prod|phoenix-prod-b256|phoenix-2026|long
                                   [--device cpu|cuda] [--parts attention,trunk] [--views lecture,phoenix-prod]
                                   [--budget-s N] [--repeats 5] [--note "shared 2-core machine"]

Measures through explorer.measure (the library the app's timing tab shares) together with dense matmul
throughput as the yardstick, and writes benchmarks/results/<device-slug>-<date>.json (+ .html and .png plots):
"records" (attention points), "trunk" (each grid's trunk forward per backend, explorer.measure.TRUNK_GRIDS, with
attention's share of it) and "views" (each drawn view's first and warm call, figure JSON included); read back
by explorer.measure.load_results and load_model_timings. An entry point: nothing imports it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from explorer.measure import (GRIDS, TRUNK_KEYS, VIEW_KEYS, WRONG, Run, Status, matmul_tflops, point_key,
                              results_path, sweep, sweep_trunks, sync, with_status)
from models.runinfo import RESULTS_DIR, device_name, git_commit

PARTS = ("attention", "trunk")


def write_results(records: list[dict], device: str, matmul: float, out_dir: Path = RESULTS_DIR,
                  conditions: Optional[dict] = None, trunk: list[dict] = (), views: list[dict] = ()) -> Path:
    """Merge into today's file for this device, point by point: a new record replaces the old one at the
    same point unless it was merely not reached (time budget / cancel). So a later run of one backend
    (say flash_attn once built) or of a few lengths adds to an earlier run; trunk and view records likewise
    (by preset, backend, cap, dtype, B, T / by preset and view). `conditions`: how the machine was while
    measuring (load, other users), kept with the numbers."""
    date = dt.date.today().isoformat()
    path = results_path(device, date, out_dir)
    before = json.loads(path.read_text()) if path.exists() else {}
    merged = {point_key(r): r for r in (with_status(r) for r in before.get("records", []))}
    for r in records:
        if r["status"] != Status.NOT_REACHED or point_key(r) not in merged:
            merged[point_key(r)] = r
    # each part's shares are over the peak of the call that measured it: a GPU session's steps are calls of their
    # own, each measuring the peak again, and the last (the views, which quote none) wrote its own over the
    # kernels' until 2026-11-27 (gpu-run-2026-11-27-4)
    measured = lambda part: any(r["status"] != Status.NOT_REACHED for r in part)     # noqa: E731
    data = dict(device_name=device_name(device), torch=torch.__version__, cuda=torch.version.cuda,
                commit=git_commit(), date=date,
                matmul_tflops=matmul if measured(records) or "matmul_tflops" not in before else before["matmul_tflops"],
                matmul_dtype="bfloat16" if device == "cuda" else "float32",
                conditions=conditions or {}, records=list(merged.values()))
    if measured(trunk) or before.get("trunk_matmul_tflops"):
        data["trunk_matmul_tflops"] = matmul if measured(trunk) else before["trunk_matmul_tflops"]
    for key, new, point in (("trunk", trunk, TRUNK_KEYS[:7]), ("views", views, VIEW_KEYS[:2])):
        kept = {tuple(r.get(k) for k in point): r for r in [*before.get(key, []), *new]}
        if kept:
            data[key] = list(kept.values())
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def time_views(presets: list[str], device: str, repeats: int = 3, run: Optional[Run] = None):
    """Every drawn view (explorer.views) at each preset on `device`, as a request runs it (View.draw) with the
    JSON of every figure it returns: its first call in this process, then the median of `repeats` more.
    Every call draws: the drawn views' cache (records.DRAWN, which serves the same settings again without
    drawing) is emptied before each, the model and its recorded forward are kept — so warm is what a redraw
    at new settings of a loaded model costs, not a cache lookup (the 2026-11-26 third GPU run timed lookups).
    Yields records {preset, view, cold_ms, warm_ms, repeats}; a view that fails has no times (and says why
    on stdout); once `run` stops, the rest are not tried."""
    from explorer.query_string import parse_query
    from explorer.views import drawn_views
    from explorer.views.records import DRAWN
    run = run or Run()
    for preset in presets:
        for view in drawn_views():
            record = dict(preset=preset, view=view.name, cold_ms=None, warm_ms=None, repeats=0)
            if run.stopped():
                print(f"view {preset} {view.name}: not timed ({run.stopped()})", flush=True)
                continue

            def call():
                DRAWN.cache_clear()
                t = time.perf_counter()
                for out in view.draw(parse_query(f"preset={preset}")):
                    getattr(out, "to_json", lambda: None)()
                sync(device)
                return (time.perf_counter() - t) * 1e3
            try:
                cold = call()
                warm = [call() for _ in range(repeats)]
            except Exception as e:  # noqa: BLE001 — a failing view is reported, the rest still run
                print(f"view {preset} {view.name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                yield record
                continue
            record.update(cold_ms=cold, warm_ms=statistics.median(warm), repeats=repeats)
            print(f"view {preset:>18} {view.name:>12}: first {cold:9.1f} ms, warm {record['warm_ms']:9.1f} ms", flush=True)
            yield record


def write_plots(path: Path, data: dict) -> list[Path]:
    try:
        from explorer.timing import results_figure     # the one plotter of benchmark results
        fig = results_figure(data)
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
    ap.add_argument("--preset", action="append", choices=list(GRIDS),
                    help="a grid (explorer.measure.GRIDS: a preset's attention shapes); repeat for several; "
                         "default lecture")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget-s", type=float, default=None, help="stop measuring after this many seconds")
    ap.add_argument("--backends", default=None, help="comma-separated subset (naive always runs)")
    ap.add_argument("--seq-lens", default=None, help="comma-separated T values overriding the grid's")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--replot", type=Path, default=None, help="only redraw the plots of this results file")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds per shape, backends interleaved (>= 5)")
    ap.add_argument("--note", default="", help="what else ran on the machine (kept in the results file)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="what to time at each --preset: attention (its grid), trunk (its trunk forward per "
                         "backend, explorer.measure.TRUNK_GRIDS); comma-separated, may be empty")
    ap.add_argument("--views", default="", help="comma-separated presets at which to time every explorer view")
    a = ap.parse_args(argv)
    parts = [x for x in a.parts.split(",") if x]
    if set(parts) - set(PARTS):
        ap.error(f"--parts: got {a.parts!r}; allowed: a comma-separated subset of {', '.join(PARTS)}")
    view_presets = [x for x in a.views.split(",") if x]
    from models.presets import PRESETS
    if set(view_presets) - set(PRESETS):
        ap.error(f"--views: got {a.views!r}; allowed: comma-separated presets among {', '.join(PRESETS)}")
    if a.replot:
        for p in write_plots(a.replot, json.loads(a.replot.read_text())):
            print(f"wrote {p}")
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    if a.repeats < 5:
        ap.error(f"--repeats: got {a.repeats}; allowed: 5 or more (min / median / max need several)")
    backends = a.backends.split(",") if a.backends else None
    seq_lens = [int(t) for t in a.seq_lens.split(",")] if a.seq_lens else None
    start = time.perf_counter()
    load_before = os.getloadavg()[0]
    matmul = matmul_tflops(a.device)
    print(f"{device_name(a.device)}: dense matmul {matmul:.2f} TFLOP/s")
    records, trunk, views = [], [], []
    run = Run(a.budget_s)

    def save():
        return write_results(records, a.device, matmul, a.out_dir, conditions(), trunk, views)

    def conditions():
        return dict(cores=os.cpu_count(), threads=torch.get_num_threads(), load_average_before=load_before,
                    load_average_after=os.getloadavg()[0], wall_s=round(time.perf_counter() - start, 1),
                    repeats=a.repeats, note=a.note)
    for preset in a.preset or ["lecture"]:
        for r in sweep_trunks([preset], a.device, backends=backends, repeats=a.repeats, run=run) \
                if "trunk" in parts else ():
            trunk.append(r)
            save()                                      # on disk as measured: a run killed later keeps it
            print(f"trunk {r['preset']:>17} {r['backend']:>14} {r['mask']:>20} cap {r['cap_method']:>4} B {r['B']:>2} "
                  f"T {r['T']:>5} {r['dtype']}: " + (
                      f"{r['median_ms']:9.2f} ms [{r['min_ms']:.2f}-{r['max_ms']:.2f}] x{r['repeats']}, attention "
                      f"{r['attention_ms']:8.2f} ms, rel err {r['rel_err']:.1e}" if r["status"] == "ok"
                      else f"{r['status']}: {r['reason']}"), flush=True)
        for r in sweep(preset, a.device, backends=backends, seq_lens=seq_lens, repeats=a.repeats, run=run) \
                if "attention" in parts else ():
            records.append(r)
            if r["status"] != Status.NOT_REACHED:       # on disk as measured: a run killed later keeps it
                save()
            if r["status"] == "ok":
                print(f"{r['preset']:>12} {r['backend']:>14} {r['mask']:>20} cap {r['cap_method']:>4} "
                      f"{'padded' if r['padded'] else 'dense '} B {r['B']:>2} T {r['T']:>6} tiles {r['tiles']}: "
                      f"{r['median_ms']:9.3f} ms "
                      f"[{r['min_ms']:.3f}-{r['max_ms']:.3f}] x{r['repeats']}  "
                      f"{r['peak_mem_bytes'] / 2**20:9.1f} MiB  {r['tflops']:7.3f} TFLOP/s  "
                      f"err {r['max_abs_err'] if r['max_abs_err'] is not None else float('nan'):.1e}", flush=True)
            elif r["status"] != Status.NOT_REACHED:
                print(f"{r['preset']:>12} {r['backend']:>14} {r['mask']:>20} cap {r['cap_method']:>4} "
                      f"{'padded' if r['padded'] else 'dense '} T {r['T']:>6}: {r['status']}: {r['reason']}", flush=True)
    for r in time_views(view_presets, a.device, run=run):
        views.append(r)
        save()
    path = save()
    print(f"wrote {path}")
    if not a.no_plot and records:
        for p in write_plots(path, json.loads(path.read_text())):
            print(f"wrote {p}")
    wrong = [f"{r['backend']} {r['mask']} cap {r['cap_method']} T {r['T']}: {r['reason']}" for r in records
             if r["status"] == Status.ERROR and r["reason"].startswith(WRONG)]
    wrong += [f"trunk {r['preset']} {r['backend']} cap {r['cap_method']}: {r['reason']}" for r in trunk
              if r["status"] == "wrong"]
    if wrong:       # recorded in the file all the same; a wrong kernel's speed is no result
        sys.exit("\n".join(f"FAILED {w}" for w in wrong))


if __name__ == "__main__":
    main()
