"""Attention benchmark CLI: every available backend on grok.py's attention, swept over sequence length.

    python -m benchmarks.attention --preset lecture|phoenix-prod|phoenix-prod-b256|phoenix-2026|long
                                   [--device cpu|cuda]
                                   [--budget-s N] [--repeats 5] [--note "shared 2-core machine"]

Measures through explorer.measure (the library the app's timing tab shares) together with dense matmul
throughput as the yardstick, and writes benchmarks/results/<device-slug>-<date>.json (+ .html and .png plots).
An entry point: nothing imports it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from explorer.measure import GRIDS, WRONG, Status, matmul_tflops, point_key, results_path, sweep, with_status
from models.runinfo import RESULTS_DIR, device_name, git_commit


def write_results(records: list[dict], device: str, matmul: float, out_dir: Path = RESULTS_DIR,
                  conditions: Optional[dict] = None) -> Path:
    """Merge into today's file for this device, point by point: a new record replaces the old one at the
    same point unless it was merely not reached (time budget / cancel). So a later run of one backend
    (say flash_attn once built) or of a few lengths adds to an earlier run. `conditions`: how the machine
    was while measuring (load, other users), kept with the numbers."""
    date = dt.date.today().isoformat()
    path = results_path(device, date, out_dir)
    old = [with_status(r) for r in json.loads(path.read_text()).get("records", [])] if path.exists() else []
    merged = {point_key(r): r for r in old}
    for r in records:
        if r["status"] != Status.NOT_REACHED or point_key(r) not in merged:
            merged[point_key(r)] = r
    data = dict(device_name=device_name(device), torch=torch.__version__, cuda=torch.version.cuda,
                commit=git_commit(), date=date, matmul_tflops=matmul,
                matmul_dtype="bfloat16" if device == "cuda" else "float32",
                conditions=conditions or {}, records=list(merged.values()))
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


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
    a = ap.parse_args(argv)
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
    records = []

    def conditions():
        return dict(cores=os.cpu_count(), threads=torch.get_num_threads(), load_average_before=load_before,
                    load_average_after=os.getloadavg()[0], wall_s=round(time.perf_counter() - start, 1),
                    repeats=a.repeats, note=a.note)
    for preset in a.preset or ["lecture"]:
        left = None if a.budget_s is None else max(0.0, a.budget_s - (time.perf_counter() - start))
        for r in sweep(preset, a.device, budget_s=left, backends=backends, seq_lens=seq_lens, repeats=a.repeats):
            records.append(r)
            if r["status"] != Status.NOT_REACHED:       # on disk as measured: a run killed later keeps it
                write_results(records, a.device, matmul, a.out_dir, conditions())
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
    path = write_results(records, a.device, matmul, a.out_dir, conditions())
    print(f"wrote {path}")
    if not a.no_plot:
        for p in write_plots(path, json.loads(path.read_text())):
            print(f"wrote {p}")
    wrong = [r for r in records if r["status"] == Status.ERROR and r["reason"].startswith(WRONG)]
    if wrong:       # recorded in the file all the same; a wrong kernel's speed is no result
        sys.exit("\n".join(f"FAILED {r['backend']} {r['mask']} cap {r['cap_method']} T {r['T']}: {r['reason']}"
                           for r in wrong))


if __name__ == "__main__":
    main()
