"""The benchmark CLI's results file: its schema, and merging point by point."""
import json

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


def test_each_record_is_on_disk_as_it_is_measured(tmp_path, monkeypatch):
    """A run killed mid-sweep (a device call's time limit) keeps every record measured before it."""
    real = list(bench.sweep("lecture", "cpu", seq_lens=[9], backends=["naive"], min_block_ms=0.0))

    def killed_after_the_first(*args, **kwargs):
        yield real[0]
        raise KeyboardInterrupt("the call's time limit")
    monkeypatch.setattr(cli, "sweep", killed_after_the_first)
    monkeypatch.setattr(cli, "matmul_tflops", lambda device: 0.1)
    try:
        cli.main(["--device", "cpu", "--out-dir", str(tmp_path), "--no-plot"])
    except KeyboardInterrupt:
        pass
    (path,) = tmp_path.glob("*.json")
    assert [r["backend"] for r in json.loads(path.read_text())["records"]] == ["naive"]
