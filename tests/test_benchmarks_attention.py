"""The benchmark core: counts, records, refusals and OOM as data, the results file's schema."""
import json

import pytest
import torch

from benchmarks import attention as bench
from models.masks import MASK_KINDS, AttentionMask

TINY = dict(B=1, Hq=4, Hkv=2, head_dim=8, T=12, num_candidates=3, min_time_s=0.0)
RECORD_KEYS = {"preset", "backend", "mask", "dtype", "B", "Hq", "Hkv", "head_dim", "T", "num_candidates",
               "median_ms", "peak_mem_bytes", "tflops", "max_abs_err", "status"}


@pytest.mark.parametrize("kind", list(MASK_KINDS))
@pytest.mark.parametrize("T,C", [(12, 3), (9, 0), (5, 5), (70, 64)])
def test_useful_pairs_counts_the_mask(kind, T, C):
    assert bench.useful_pairs(kind, T, T - C) == int(AttentionMask(kind, T, T - C).dense().sum())


def test_measure_point_records_a_real_measurement():
    r = bench.measure_point("structured", cap_method="tanh", **TINY)
    assert RECORD_KEYS <= set(r) and r["status"] == "ok"
    assert r["median_ms"] > 0 and r["tflops"] > 0
    assert r["max_abs_err"] is not None and r["max_abs_err"] < 1e-5


def test_refused_point_says_why_and_is_not_timed():
    r = bench.measure_point("sdpa", cap_method="tanh", **TINY)
    assert r["status"] == "skipped: sdpa: SDPA has no logit cap (exact only with the cap off)"
    assert r["median_ms"] is None


def test_out_of_memory_is_a_status_not_a_crash(monkeypatch):
    def boom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40 GiB")
    monkeypatch.setattr(bench, "attend", boom)
    assert bench.measure_point("naive", **TINY)["status"] == "oom"


def test_sweep_stops_at_budget_and_lists_the_whole_grid():
    records = list(bench.sweep("lecture", "cpu", budget_s=0.0, seq_lens=[9, 64]))
    p = bench.preset_for("lecture", "cpu")
    assert len(records) == 2 * len(p.masks) * len(p.cap_methods) * len(bench.BACKENDS)
    assert all(r["status"] == "skipped: time budget spent" for r in records)


def test_sweep_is_cancellable():
    cancelled = []
    records = []
    for r in bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive", "structured"],
                         should_stop=lambda: bool(cancelled), min_time_s=0.0):
        records.append(r)
        cancelled.append(True)                  # the user pressed stop after the first point
    assert records[0]["status"] == "ok" and len(records) > 1
    assert all(r["status"] == "skipped: cancelled" for r in records[1:])


def test_results_file_schema(tmp_path):
    records = list(bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive", "structured"], min_time_s=0.0))
    path = bench.write_results(records, "cpu", 0.1, tmp_path)
    data = json.loads(path.read_text())
    assert {"device_name", "torch", "cuda", "commit", "date", "matmul_tflops", "records"} <= set(data)
    assert all(RECORD_KEYS <= set(r) for r in data["records"])
    assert path.name.startswith("cpu-") and path.name.endswith(f"{data['date']}.json")


def test_results_merge_point_by_point(tmp_path):
    first = list(bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive", "structured"], min_time_s=0.0))
    bench.write_results(first, "cpu", 0.1, tmp_path)
    not_reached = [dict(r, status="skipped: time budget spent", median_ms=None) for r in first]
    later = list(bench.sweep("lecture", "cpu", seq_lens=[12], backends=["naive"], min_time_s=0.0))
    path = bench.write_results(not_reached + later, "cpu", 0.1, tmp_path)
    records = json.loads(path.read_text())["records"]
    assert len(records) == len(first) + len(later)            # T=12 added, nothing duplicated
    kept = {bench.point_key(r): r for r in records}
    assert all(kept[bench.point_key(r)]["status"] == r["status"] for r in first)   # not overwritten


def test_sweep_takes_a_custom_geometry():
    geometry = bench.Preset("app settings", B=1, Hq=2, Hkv=1, head_dim=8, dtype="float32", seq_lens=(10,),
                            num_candidates=2, masks=("recsys-bidirectional",), cap_methods=("soft_sign",), cap=5.0)
    records = list(bench.sweep(geometry, "cpu", backends=["structured"], min_time_s=0.0))
    assert [(r["preset"], r["backend"], r["status"]) for r in records] == [("custom", "naive", "ok"),
                                                                           ("custom", "structured", "ok")]
    assert records[1]["max_abs_err"] < 1e-5 and records[1]["Hq"] == 2
