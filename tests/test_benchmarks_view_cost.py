"""benchmarks/view_cost.py writes what it measured: every case per version, min <= median <= max, the
device and the commit."""
import json

import pytest

from benchmarks import view_cost


def test_a_view_cost_run_writes_every_case_with_its_spread(tmp_path, monkeypatch):
    lecture = {k: v for k, v in view_cost.CASES.items() if k.startswith("lecture")}
    monkeypatch.setattr(view_cost, "CASES", lecture)
    out = tmp_path / "view-cost.json"
    view_cost.main(["--repeats", "2", "--inner", "1", "--out", str(out)])
    got = json.loads(out.read_text())
    assert got["device"].startswith("CPU") and got["commit"] and got["repeats"] == 2
    assert [r["case"] for r in got["records"]] == list(lecture)
    for r in got["records"]:
        assert r["version"] == "this" and r["n"] == 2 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert 0 < r["cpu_ms"]["min"] <= r["cpu_ms"]["median"] <= r["cpu_ms"]["max"]


def test_a_budgeted_run_stops_between_repeats_and_keeps_what_it_measured(tmp_path, monkeypatch):
    """--budget-s (the GPU session's share of its call): no repeat starts that the longest so far says would end past
    the budget (one always runs), and the results file is written after every repeat under its own name in
    --out-dir, so a call cut short keeps the repeats it finished."""
    monkeypatch.setattr(view_cost, "PRODUCTION_PRESETS", ("lecture",))
    monkeypatch.setattr(view_cost, "PRODUCTION_VIEWS", view_cost.PRODUCTION_VIEWS[2:4])     # anatomy, mask
    written, real = [], view_cost.write_results

    def write(*args):
        out, records = real(*args)
        written.append(out)
        return out, records
    monkeypatch.setattr(view_cost, "write_results", write)
    view_cost.main(["--production", "--device", "cpu", "--repeats", "4", "--inner", "1", "--budget-s", "0.001",
                    "--out-dir", str(tmp_path / "results")])
    (out,) = set(written)
    assert len(written) == 1 and out.parent == tmp_path / "results" and out.name.startswith("view-cost-production-")
    got = json.loads(out.read_text())
    assert got["repeats"] == 1 and {r["case"] for r in got["records"]} == {
        "lecture build", "lecture forward", "lecture anatomy", "lecture mask"}
    view_cost.main(["--production", "--device", "cpu", "--repeats", "2", "--inner", "1", "--budget-s", "600",
                    "--out-dir", str(tmp_path / "results")])
    assert len(written) == 3 and json.loads(out.read_text())["repeats"] == 2


@pytest.mark.parametrize("unpacked", [False, True])
def test_a_production_run_times_each_phase_and_says_whether_the_versions_drew_the_same(unpacked, tmp_path,
                                                                                         monkeypatch):
    """--production (here at the lecture preset, so it runs in seconds): the build and the forward, then every view's
    first and warm calls split into forwards, builds and the rest; with --before, each case's output hash of both
    versions (here the same commit: the same bytes), the other version archived from git or, where a machine has
    no git history, unpacked beforehand (--before-dir)."""
    import subprocess

    from harness.reports import checkout
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=view_cost.ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout: --before has no commit to archive")
    monkeypatch.setattr(view_cost, "PRODUCTION_PRESETS", ("lecture",))
    out = tmp_path / "view-cost-production.json"
    with checkout("HEAD") as before_dir:
        view_cost.main(["--production", "--device", "cpu", "--repeats", "1", "--inner", "1", "--before", "HEAD",
                        "--out", str(out)] + (["--before-dir", str(before_dir)] if unpacked else []))
    got = json.loads(out.read_text())
    assert got["device"].startswith("CPU") and got["repeats"] == 1
    records = {(r["version"], r["case"]): r for r in got["records"]}
    for version in ("before", "after"):
        build, forward = records[version, "lecture build"], records[version, "lecture forward"]
        assert 0 < build["build_ms"]["median"] <= build["wall_ms"]["median"]
        assert 0 < forward["forward_ms"]["median"] <= forward["wall_ms"]["median"]
        for case in view_cost.production_cases("lecture"):
            r = records[version, case]
            assert r["same_output_as_other_version"] and len(r["sha256"]) == 1
            for call in ("first", "warm"):
                m = {k: v["median"] for k, v in r[call].items()}
                assert m["wall_ms"] > 0 and m["rest_ms"] <= m["wall_ms"] and m["forward_ms"] + m["build_ms"] <= m["wall_ms"]
            assert r["cold_ms"] >= r["first"]["wall_ms"]["median"]
    assert records["after", "lecture isolation"]["first"]["forward_ms"]["median"] > 0      # its probe passes
