"""scripts/perf_table.py: the README table comes from results files, says where each row is from, and
claims flash_attn verified only when a GPU file has a flash_attn point that ran."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("perf_table", ROOT / "scripts" / "perf_table.py")
perf_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(perf_table)


def record(backend, ms, status="ok"):
    return dict(preset="phoenix-prod", backend=backend, mask="recsys", dtype="bfloat16", B=32, Hq=20, Hkv=4,
                head_dim=128, T=1088, num_candidates=64, cap_method="tanh", median_ms=ms if status == "ok" else None,
                peak_mem_bytes=2**30 if status == "ok" else None, tflops=100.0 if status == "ok" else None,
                max_abs_err=1e-3 if status == "ok" else None, status=status)


def results_file(tmp_path, name, device, cuda, records):
    data = dict(device_name=device, torch="2.11.0", cuda=cuda, commit="abc1234", date="2026-11-21",
                matmul_tflops=700.0, records=records)
    (tmp_path / name).write_text(json.dumps(data))


def test_cpu_only_results_say_flash_attn_unverified(tmp_path):
    results_file(tmp_path, "cpu.json", "CPU AMD EPYC (1 threads)", None,
                 [record("naive", 100.0), record("flex", 10.0), record("flash_attn", None, "skipped: needs CUDA")])
    (tmp_path / "demo-training.json").write_text(json.dumps({"loss": 1.0}))   # not a results file
    md = perf_table.markdown(perf_table.load_results(tmp_path))
    assert "**not** been verified on a GPU" in md
    assert "CPU AMD EPYC (1 threads)" in md and "commit `abc1234`" in md and "2026-11-21" in md
    assert "| flex | 10.00 | 10.0 |" in md


def test_gpu_flash_attn_point_counts_as_verified(tmp_path):
    results_file(tmp_path, "h100.json", "NVIDIA H100 80GB HBM3", "13.0",
                 [record("naive", 30.0), record("flash_attn", 1.5)])
    md = perf_table.markdown(perf_table.load_results(tmp_path))
    assert "has been verified on a GPU: NVIDIA H100 80GB HBM3" in md
    assert "| flash_attn | 1.50 | 20.0 | 100 (14%) |" in md


def test_readme_rewritten_only_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{perf_table.START}\nold table\n{perf_table.END}\nafter\n")
    assert perf_table.rewrite_readme("new table", readme)
    assert readme.read_text() == f"before\n{perf_table.START}\nnew table\n{perf_table.END}\nafter\n"
    readme.write_text("no markers here\n")
    assert not perf_table.rewrite_readme("new table", readme)
    assert readme.read_text() == "no markers here\n"
