"""benchmarks/view_cost.py writes what it measured: every case per version, min <= median <= max, the
device and the commit."""
import json

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
