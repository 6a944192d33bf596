"""The benchmark CLI's results file: its schema, merging point by point, the trunk forward per backend and the
views timed beside the attention points, and the loader the Flash tab reads them through."""
import json
from dataclasses import replace

import pytest
import torch

from benchmarks import attention as cli
from explorer import measure as bench
from test_explorer_measure import RECORD_KEYS


def test_results_file_schema(tmp_path):
    records = list(bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive", "structured"], min_block_ms=0.0))
    path = cli.write_results(records, "cpu", 0.1, tmp_path)
    data = json.loads(path.read_text())
    assert {"device_name", "torch", "cuda", "commit", "date", "matmul_tflops", "records"} <= set(data)
    assert all(RECORD_KEYS <= set(r) for r in data["records"])
    assert path.name.startswith("cpu-") and path.name.endswith(f"{data['date']}.json")


def test_results_merge_point_by_point(tmp_path):
    first = list(bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive", "structured"], min_block_ms=0.0))
    cli.write_results(first, "cpu", 0.1, tmp_path)
    not_reached = [dict(r, status=bench.Status.NOT_REACHED, reason="time budget spent", median_ms=None) for r in first]
    later = list(bench.sweep("lecture", "cpu", seq_lens=[12], backends=["naive"], min_block_ms=0.0))
    path = cli.write_results(not_reached + later, "cpu", 0.1, tmp_path)
    records = json.loads(path.read_text())["records"]
    assert len(records) == len(first) + len(later)            # T=12 added, nothing duplicated
    kept = {bench.point_key(r): r for r in records}
    assert all(kept[bench.point_key(r)]["status"] == r["status"] for r in first)   # not overwritten


def test_each_part_keeps_the_peak_of_the_call_that_measured_it(tmp_path):
    """A GPU session's kernels, trunk and views are three calls, each measuring the matmul peak again: the
    kernels' shares stay over the kernels' call's peak and the trunk's over its own (the seventh session's file
    carried the views call's peak, 0.5 % off both); a call that measured neither leaves both as they were."""
    kernels = list(bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive"], min_block_ms=0.0))
    trunk = [dict(dict.fromkeys(bench.TRUNK_KEYS), preset="lecture", backend="naive", B=1, T=9, dtype="float32",
                  cap_method="none", mask="recsys", status=bench.Status.OK, median_ms=1.0)]
    views = [dict(preset="lecture", view="mask", cold_ms=1.0, warm_ms=0.5, repeats=3)]
    cli.write_results(kernels, "cpu", 1.0, tmp_path)
    path = cli.write_results([], "cpu", 2.0, tmp_path, trunk=trunk)
    data = json.loads(path.read_text())
    assert (data["matmul_tflops"], data["trunk_matmul_tflops"], bench.trunk_peak(data)) == (1.0, 2.0, 2.0)
    data = json.loads(cli.write_results([], "cpu", 3.0, tmp_path, views=views).read_text())
    assert (data["matmul_tflops"], data["trunk_matmul_tflops"]) == (1.0, 2.0) and data["views"] == views
    not_reached = [dict(r, status=bench.Status.NOT_REACHED, reason="time budget spent") for r in trunk]
    data = json.loads(cli.write_results(kernels, "cpu", 4.0, tmp_path, trunk=not_reached).read_text())
    assert (data["matmul_tflops"], data["trunk_matmul_tflops"]) == (4.0, 2.0)
    assert bench.trunk_peak({"matmul_tflops": 5.0}) == 5.0          # files written before: their one peak


def test_each_record_is_on_disk_as_it_is_measured(tmp_path, monkeypatch):
    """A run killed mid-sweep (a device call's time limit) keeps every record measured before it."""
    real = list(bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive"], min_block_ms=0.0))

    def killed_after_the_first(*args, **kwargs):
        yield real[0]
        raise KeyboardInterrupt("the call's time limit")
    monkeypatch.setattr(cli, "sweep", killed_after_the_first)
    monkeypatch.setattr(cli, "matmul_tflops", lambda device: 0.1)
    try:
        cli.main(["--device", "cpu", "--out-dir", str(tmp_path), "--no-plot", "--parts", "attention"])
    except KeyboardInterrupt:
        pass
    (path,) = tmp_path.glob("*.json")
    assert [r["backend"] for r in json.loads(path.read_text())["records"]] == ["naive"]


def test_trunk_forward_is_timed_per_backend_with_attention_inside_it():
    """The lecture trunk on CPU: one record per backend in the results file's trunk schema, naive first, each
    checked against the fp32 reference, its attention timed inside the same forwards (so never longer)."""
    grid = bench.trunk_grid_for("lecture", "cpu")
    records = bench.measure_trunk(grid, "none", "cpu", backends=["sdpa", "flash_attn"], min_block_ms=0.0)
    assert [tuple(r) for r in records] == [bench.TRUNK_KEYS] * 3
    naive, sdpa, flash = records
    assert (naive["backend"], sdpa["backend"], flash["status"]) == ("naive", "sdpa", "skipped")
    for r in (naive, sdpa):
        assert (r["preset"], r["B"], r["T"], r["dtype"], r["mask"], r["status"]) == ("lecture", 8, 9, "float32",
                                                                                      "recsys", "ok")
        assert r["repeats"] >= 5 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert 0 < r["attention_ms"] <= r["median_ms"] and r["rel_err"] <= 1e-5


def test_a_wrong_kernel_fails_the_trunk_and_is_not_timed(monkeypatch):
    """Each query reading its neighbour's output (a real leak, unlike a scale the next RMSNorm would undo) lands
    above the trunk's rounding bound: status wrong, untimed, and the CLI exits naming it."""
    from test_explorer_measure import planted
    planted(monkeypatch, "sdpa", lambda out: out.roll(1, dims=1))
    naive, sdpa = bench.measure_trunk(bench.trunk_grid_for("lecture", "cpu"), "none", "cpu", backends=["sdpa"],
                                      min_block_ms=0.0)
    assert naive["status"] == "ok" and sdpa["status"] == "wrong" and sdpa["median_ms"] is None
    assert sdpa["reason"].startswith(bench.WRONG) and sdpa["rel_err"] > 1e-2


def test_the_xrex_trunk_is_timed_too():
    """phoenix-2026's family (production's trunk, qk_norm, no cap) on CPU: its nano geometry, one batch row."""
    grid = replace(bench.trunk_grid_for("phoenix-2026", "cpu"), B=1)
    naive, flash = bench.measure_trunk(grid, "none", "cpu", backends=["sdpa-flash"], min_block_ms=0.0)
    assert (naive["preset"], naive["T"], naive["mask"]) == ("phoenix-2026-nano", 1152, "recsys-bidirectional")
    assert naive["status"] == flash["status"] == "ok" and flash["rel_err"] <= 1e-5
    assert flash["attention_ms"] <= flash["median_ms"]


def test_views_are_timed_as_a_request_draws_them(monkeypatch):
    """Through View.draw, and every timed call draws: a warm call served by the drawn views' cache would time a
    lookup (the third GPU run's warm views, 0.2-1.4 ms)."""
    from explorer import budget
    from explorer.views import drawn_views
    drawn, within = [], budget.within_budget
    monkeypatch.setattr(budget, "within_budget", lambda *a: drawn.append(a) or within(*a))
    records = list(cli.time_views(["lecture"], "cpu", repeats=2))
    assert [r["view"] for r in records] == [v.name for v in drawn_views()]
    assert all(tuple(r) == bench.VIEW_KEYS and r["cold_ms"] > 0 and r["warm_ms"] > 0 and r["repeats"] == 2
               for r in records)
    assert len(drawn) == 3 * len(records)          # the first call and both warm ones drew


def test_the_cli_writes_trunk_and_views_and_the_loader_reads_them(tmp_path, monkeypatch):
    """One CPU run at lecture (attention, trunk, views) lands in one results file; a second run of the trunk only
    replaces its records and keeps the views; load_model_timings returns both lists in the schema, and a record
    with a status outside it reads as an error."""
    monkeypatch.setattr(cli, "matmul_tflops", lambda device: 0.1)
    args = ["--device", "cpu", "--seq-lens", "9", "--backends", "sdpa", "--out-dir", str(tmp_path), "--no-plot"]
    cli.main(args + ["--views", "lecture"])
    cli.main(args + ["--parts", "trunk"])
    (name, data), = bench.load_model_timings(tmp_path)
    assert data["device_name"].startswith("CPU") and data["commit"] and data["date"]
    assert [(r["backend"], r["cap_method"]) for r in data["trunk"]] == [("naive", "tanh"), ("sdpa", "tanh"),
                                                                          ("naive", "none"), ("sdpa", "none")]
    assert {r["view"] for r in data["views"]} >= {"mask", "attention"}
    assert all(tuple(r) == bench.TRUNK_KEYS for r in data["trunk"]) and all(tuple(r) == bench.VIEW_KEYS for r in data["views"])
    (_, attention), = bench.load_results(tmp_path)
    assert attention["records"] and attention["trunk"] and attention["views"]
    raw = json.loads((tmp_path / name).read_text())
    raw["trunk"][0]["status"] = "fast"
    (tmp_path / name).write_text(json.dumps(raw))
    assert bench.load_model_timings(tmp_path)[0][1]["trunk"][0]["status"] == "error"


@pytest.mark.parametrize("args,message", [(["--parts", "attention,views"], "--parts: got 'attention,views'"),
                                          (["--views", "lecture,nope"], "--views: got 'lecture,nope'")])
def test_bad_parts_and_view_presets_are_refused_by_name(args, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--device", "cpu"] + args)
    assert message in capsys.readouterr().err


def test_the_first_gpu_runs_probe_reads_as_the_same_schema(tmp_path):
    """The H100 run of 2026-11-26 timed the trunk and the views apart (gpu-run-2026-11-26/probe.json): the loader
    gives them in TRUNK_KEYS / VIEW_KEYS beside its results file, a tab's time the sum of its parts'; a probe of
    another device, or none, gives nothing."""
    from models.runinfo import RESULTS_DIR
    from explorer.views import VIEWS
    tab_of = {part.draw.__name__: v.name for v in VIEWS.values() for part in v.parts}
    (name, data), = [x for x in bench.load_model_timings(RESULTS_DIR, tab_of)
                     if x[0] == "nvidia-h100-80gb-hbm3-2026-11-26.json"]
    assert (data["device_name"], data["date"], data["commit"]) == ("NVIDIA H100 80GB HBM3", "2026-11-26", "801f962")
    trunk = {(r["preset"], r["cap_method"], r["backend"]): r for r in data["trunk"]}
    assert all(tuple(r) == bench.TRUNK_KEYS for r in data["trunk"])
    assert trunk[("phoenix-prod", "tanh", "naive")]["median_ms"] == 302.958
    assert trunk[("phoenix-prod", "none", "fa4")]["median_ms"] == 107.426 and trunk[("phoenix-prod", "none", "fa4")]["B"] == 32
    assert trunk[("phoenix-prod", "tanh", "sdpa")]["status"] == "skipped"
    views = {(r["preset"], r["view"]): r for r in data["views"]}
    assert views[("phoenix-prod", "attention")]["warm_ms"] == 677.3
    assert views[("lecture", "mask")]["cold_ms"] == pytest.approx(124.1 + 17.7)      # mask_view + kernel_view
    probe = json.loads((RESULTS_DIR / "gpu-run-2026-11-26" / "probe.json").read_text())
    results = json.loads((RESULTS_DIR / name).read_text())
    (tmp_path / name).write_text(json.dumps(results))
    assert bench.load_model_timings(tmp_path) == []
    (tmp_path / "gpu-run-2026-11-26").mkdir()
    (tmp_path / "gpu-run-2026-11-26" / "probe.json").write_text(json.dumps(dict(probe, device="another GPU")))
    assert bench.load_model_timings(tmp_path) == []
