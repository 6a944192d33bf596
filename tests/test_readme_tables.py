"""scripts/readme_tables.py: the README table comes from results files, says where each row is from, and
claims flash_attn verified only when a GPU file has a flash_attn point that ran."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "scripts" / "readme_tables.py")
readme_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_tables)


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
    md = readme_tables.markdown(readme_tables.load_results(tmp_path))
    assert "**not** been verified on a GPU" in md
    assert "CPU AMD EPYC (1 threads)" in md and "commit `abc1234`" in md and "2026-11-21" in md
    assert "| flex | 10.00 | 10.0 |" in md


def test_gpu_flash_attn_point_counts_as_verified(tmp_path):
    results_file(tmp_path, "h100.json", "NVIDIA H100 80GB HBM3", "13.0",
                 [record("naive", 30.0), record("flash_attn", 1.5)])
    md = readme_tables.markdown(readme_tables.load_results(tmp_path))
    assert "has been verified on a GPU: NVIDIA H100 80GB HBM3" in md
    assert "| flash_attn | 1.50 | 20.0 | 100 (14%) |" in md


def test_readme_rewritten_only_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{readme_tables.START}\nold table\n{readme_tables.END}\nafter\n")
    assert readme_tables.rewrite_readme("new table", readme)
    assert readme.read_text() == (f"before\n{readme_tables.START}\n{readme_tables.GENERATED}\n\nnew table\n\n"
                                  f"{readme_tables.END}\nafter\n")
    readme.write_text("no markers here\n")
    assert not readme_tables.rewrite_readme("new table", readme)
    assert readme.read_text() == "no markers here\n"


def test_app_latency_block_says_which_targets_were_missed(tmp_path):
    data = dict(device="CPU X (2 threads)", date="2026-11-21", commit="abc1234", cores=2,
                targets=dict(cold_start_s=10.0, control_change_p95_ms=150.0, nano_s=3.0),
                cold_start=dict(server_up_s=3.0, first_view_s=4.0),
                control_change_ms=dict(n=80, p50=70.0, p95=180.0, max=300.0),
                phoenix_nano=dict(isolation=dict(first_s=1.0, repeat_s=0.1)))
    (tmp_path / "app-latency-2026-11-21.json").write_text(json.dumps(data))
    md = readme_tables.app_latency_block(tmp_path)
    assert "| 4.00 s | met |" in md and "180 ms (p50 70) | **missed** |" in md and "commit `abc1234`" in md


def test_load_test_block_reports_failures_from_the_file(tmp_path):
    data = dict(date="2026-11-21T13:00:00+00:00", git_commit="abcdef0123",
                device=dict(cpu="AMD EPYC", cores=2), parameters=dict(sessions=20, duration_s=60.0),
                views=dict(mask=dict(requests=10, failures=1, p50_s=0.2, p95_s=0.9)),
                total=dict(requests=10, failures=1, requests_per_s=0.2))
    (tmp_path / "load-2026-11-21.json").write_text(json.dumps(data))
    md = readme_tables.load_test_block(tmp_path)
    assert "**10 requests, 1 failed**" in md and "| mask | 10 | 1 | 0.20 s | 0.90 s |" in md


def test_a_days_second_results_file_is_newer_than_its_first(tmp_path):
    """<what>-<date>-2.json is the day's second file: the README quotes it, not the first (by name alone "-2.json"
    sorts before ".json"); the next day's first file is newer than both."""
    for name, commit in (("load-2026-11-21.json", "first00"), ("load-2026-11-21-2.json", "second0"),
                         ("load-2026-11-20-3.json", "older00")):
        data = dict(date="2026-11-21T13:00:00+00:00", git_commit=commit, device=dict(cpu="AMD EPYC", cores=2),
                    parameters=dict(sessions=20, duration_s=60.0), views={},
                    total=dict(requests=10, failures=0, requests_per_s=0.2))
        (tmp_path / name).write_text(json.dumps(data))
    assert "`second0`" in readme_tables.load_test_block(tmp_path)
    first = (tmp_path / "load-2026-11-21.json").read_text()
    (tmp_path / "load-2026-11-22.json").write_text(first.replace("first00", "next000"))
    assert "`next000`" in readme_tables.load_test_block(tmp_path)


def test_load_abuse_block_says_which_targets_were_missed(tmp_path):
    kinds = {k: dict(clients=1, requests=10, failures=0, refused_by_name=0, p50_s=0.1, p95_s=0.2, max_s=0.3)
             for k in ("lecture /mask", "uploads")}
    data = dict(date="2026-11-21T00:00:00+00:00", git_commit="abcdef1234", device=dict(cores=2, cpu="X"),
                parameters=dict(duration_s=55, clients={"lecture /mask": 1, "uploads": 1}, conditions="busy"),
                kinds=kinds, total=dict(requests=20, failures=0, refused_by_name=3),
                memory=dict(rss_start_gb=1.0, peak_rss_gb=7.5, rss_after_gb=1.2, after_s=15.0),
                lecture_mask_p95_s=0.2,
                targets=dict(failures=0, peak_rss_gb=6.0, mask_p95_s=1.0, rss_after_over_start=1.5,
                             met=dict(failures=True, peak_rss_gb=False, mask_p95_s=True, rss_after_over_start=True)))
    (tmp_path / "load-abuse-2026-11-21.json").write_text(json.dumps(data))
    md = readme_tables.load_abuse_block(tmp_path)
    assert "| peak server RSS | < 6 GB | 7.50 GB | **not met** |" in md
    assert "0 of 20 (3 refused by name)" in md and "conditions: busy" in md
    assert "load-abuse" not in readme_tables.load_test_block(tmp_path)    # the plain load test ignores it


def test_browser_latency_block_has_a_row_per_control_kind_from_the_file(tmp_path):
    records = [dict(control="radio (values)", preset="lecture", n=12, p50_ms=120.0, p95_ms=180.0, min_ms=100.0,
                    max_ms=200.0, mean_ms=130.0, target_p95_ms=300.0),
               dict(control="preset switch", preset="lecture <-> phoenix-nano", n=12, p50_ms=1800.0, p95_ms=2600.0,
                    min_ms=1500.0, max_ms=2700.0, mean_ms=1900.0, target_p95_ms=2000.0)]
    (tmp_path / "browser-latency-2026-11-22.json").write_text(json.dumps(dict(
        device="CPU X (2 threads)", date="2026-11-22", commit="abc1234", repeats=12, records=records)))
    md = readme_tables.browser_latency_block(tmp_path)
    assert "| radio (values) | `lecture` | 120 ms | 180 ms | < 300 ms | met |" in md
    assert "| preset switch | `lecture <-> phoenix-nano` | 1800 ms | 2600 ms | < 2000 ms | **missed** |" in md
    assert "abc1234" in md and "browser-latency-2026-11-22.json" in md


def test_browser_latency_block_shows_both_versions_and_each_control_kind(tmp_path):
    row = dict(n=12, p50_ms=60.0, p95_ms=90.0, min_ms=50.0, max_ms=95.0, mean_ms=65.0, driver_p95_ms=300.0)
    records = [dict(control="radio (colour)", control_kind="display", preset="lecture", target_p95_ms=100.0,
                    must_p95_ms=150.0, version=v, version_commit=c, **{**row, "p95_ms": p95})
               for v, c, p95 in (("before", "1b1412f", 343.0), ("after", "abc1234", 90.0))]
    (tmp_path / "browser-latency-2026-11-23.json").write_text(json.dumps(dict(
        device="CPU X (2 threads)", date="2026-11-23", commit="abc1234", repeats=12, records=records,
        load_average_1min=dict(before=3.0, after=4.5), cores=2)))
    md = readme_tables.browser_latency_block(tmp_path)
    assert "| version | control | kind | preset |" in md
    assert "| before | radio (colour) | display | `lecture` | 60 ms | 343 ms | < 100 ms (must 150) | **missed** |" in md
    assert "| after | radio (colour) | display | `lecture` | 60 ms | 90 ms | < 100 ms (must 150) | met |" in md
    assert "**before** = commit `1b1412f`" in md and "load average 3.0 before, 4.5 after" in md
    assert "one after the other" in md and "interleaved" not in md
    data = json.loads((tmp_path / "browser-latency-2026-11-23.json").read_text())
    (tmp_path / "browser-latency-2026-11-23.json").write_text(json.dumps({**data, "interleaved": True}))
    md = readme_tables.browser_latency_block(tmp_path)
    assert "same run, interleaved" in md and "one after the other" not in md


def test_the_readme_view_table_is_the_registry():
    """Every tab's row comes from its record (explorer.views.VIEWS): a view added there appears here
    once scripts/readme_tables.py is run, and this fails until it is."""
    from explorer.views import VIEWS
    block = readme_tables.views_block()
    assert block in (ROOT / "README.md").read_text(), "README's views block is stale: run scripts/readme_tables.py"
    assert [line.split(" | ")[0].lstrip("| ") for line in block.splitlines()[2:]] == [v.title for v in VIEWS.values()]


def test_the_gpu_blocks_come_from_the_committed_h100_files():
    """The README's GPU numbers are the committed H100 run's (2026-11-26, commit 801f962), derived here and never
    typed: × naive and the share of that run's matmul, the cap's cost, the trunk per backend beside the kernel,
    the views; the rows naive could not check say so."""
    results = readme_tables.load_results()
    md = readme_tables.markdown(results)
    assert "793.8 TFLOP/s bfloat16" in md and "has been verified on a GPU: NVIDIA H100 80GB HBM3" in md
    assert "| phoenix-prod | recsys | none | bfloat16 | 32 | 20/4 | 1087 | 35/10/36 |" in md and "| fa4 | 0.63 (" in md
    assert "| 30.6 | 309 (39%) |" in md and "unchecked (no reference fitted)" in md
    assert "nvidia-h100-80gb-hbm3-2026-11-26.png" in md
    cap = readme_tables.cap_cost_block(results)
    assert "| phoenix-prod | recsys | 32 | 1087 | fa4 | 0.625 | 1.71 | 2.73× | 309 (39%) | 113 (14%) |" in cap
    assert "(0.54× the uncapped throughput)" in cap
    trunk = readme_tables.trunk_block()
    assert "| phoenix-prod | tanh | 32 | 1087 | bfloat16 | 303 |" in trunk and "| fa4 | 115 |" in trunk
    assert "| phoenix-prod | none | 32 | 1087 | bfloat16 | 255 |" in trunk and "| fa4 | 107 |" in trunk
    assert "8 layers × the kernel" in trunk and "| 2.6× | 17.0× |" in trunk
    assert "| phoenix-prod | 61 / 67 | 3673 / 677 |" in readme_tables.device_views_block()


def test_the_trunk_table_puts_the_forward_at_the_trunk_calls_own_peak(tmp_path):
    """A session's trunk is a call of its own with its own matmul peak (trunk_matmul_tflops): the trunk table's
    'at the matmul rate' is the forward's FLOPs at that peak, not at the kernels' call's."""
    from explorer.measure import TRUNK_KEYS
    T = 24
    trunk = [dict(dict.fromkeys(TRUNK_KEYS), preset="lecture", B=1, T=T, dtype="float32", cap_method="none",
                  mask="recsys", backend=b, status="ok", median_ms=ms, repeats=5) for b, ms in (("naive", 4.0), ("flex", 2.0))]
    (tmp_path / "nvidia-h100-80gb-hbm3-2026-11-27.json").write_text(json.dumps(dict(
        device_name="NVIDIA H100 80GB HBM3", torch="2.11", cuda="13.0", commit="abc", date="2026-11-27",
        matmul_tflops=1e-3, trunk_matmul_tflops=2e-3, records=[], trunk=trunk)))
    flops = readme_tables.trunk_flops("lecture", 1, T)
    block = readme_tables.trunk_block(tmp_path)
    assert f"= {flops / 2e9 * 1e3:.0f} ms at the matmul rate" in block
    assert f"= {flops / 1e9 * 1e3:.0f} ms at the matmul rate" not in block


def test_numerics_block_sets_naive_beside_the_best_fused_kernel(tmp_path):
    def row(backend, median):
        return dict(preset="phoenix-prod", B=1, T=1087, Hq=20, Hkv=4, head_dim=128, dtype="bfloat16", mask="recsys",
                    cap_method="none", qk_scale=2.0, backend=backend, seeds=5,
                    rel_err=dict(min=median / 2, median=median, max=median * 2), bound_ratio=dict(min=0, median=0, max=0.3))
    data = dict(device_name="CPU X (2 threads)", torch="2.13.0", commit="abc1234", date="2026-11-26", seeds=5,
                rows=[row("naive", 2e-2), row("structured", 2e-2), row("sdpa", 4e-3), row("flex", 3e-3)],
                recorded=[dict(file="h100.json", device_name="NVIDIA H100", commit="801f962", mask="recsys",
                               cap_method="none", B=32, T=1087, fa4_vs_naive_max_abs_err=0.015625,
                               naive_vs_fp32_max_abs_err=0.0184, naive_vs_fp32_rel_err=0.0045, reference_max_abs=4.1)])
    (tmp_path / "numerics-cpu-x-2026-11-26.json").write_text(json.dumps(data))
    md = readme_tables.numerics_block(tmp_path)
    assert "| phoenix-prod | 1 × 1087, 20/4, 128 | bfloat16 | none | 4 | 2.0e-02 (1.0e-02–4.0e-02) | flex | " in md
    assert "| 6.7× |" in md and "| 1.56e-02 | 1.84e-02 |" in md and "commit `abc1234`" in md


def soak_run(mask_p95: float, model_p95: float, class_p95: float, peak: float, refused: int = 0) -> dict:
    """One synthetic run of benchmarks.load_test's soak, as run_soak writes it (the fields the suite reads)."""
    from benchmarks.load_test import SOAK_TARGETS
    kind = dict(requests=10, failures=0, refused_by_name=0, p50_s=0.1, p95_s=0.2, max_s=0.3)
    met = dict(honest_mask_p95_s=mask_p95 < 1, honest_model_views_p95_s=model_p95 < 3, classroom_views_p95_s=class_p95 < 3,
               honest_failures=refused == 0, peak_rss_gb=peak < 6, rss_after_gb=True, stores_within_bounds=True,
               honest_uploads_taken=True, queue_alive_at_end=True, mode_checks=True, attacker_refused_by_name=True)
    return dict(honest_mask_p95_s=mask_p95, honest_model_views_p95_s=model_p95, classroom_views_p95_s=class_p95,
                honest_total=dict(requests=900, failures=0, refused_by_name=refused),
                memory=dict(peak_rss_gb=peak, rss_after_gb=0.9, rss_start_gb=0.5), targets=dict(SOAK_TARGETS, met=met),
                honest={"mask": kind}, classroom={"class view": kind}, fairness={}, attacker={"17 botnet": dict(
                    kind, refused_by_name=40)}, wall_s=90.0, honest_uploads=dict(requests=9, taken=9),
                stores=dict(most=dict(temp_dir_bytes=2**20, raw_upload_bytes=0, upload_store_bytes=2**21),
                            bounds=dict(temp_dir_bytes=2**31, raw_upload_bytes=2**30, upload_store_bytes=2**29),
                            queue_restarts=0),
                queue_alive_at_end=True, checks_failed=[], cpu_seconds=dict(server_s=150.0, why="shared"))


def test_the_soak_block_claims_the_worst_of_several_runs_and_each_modes_cost(tmp_path):
    """A synthetic suite of three full runs: the README quotes the worst run (most targets missed) with min /
    median / max beside it, says which target it missed (or which other run missed one it met), and what each
    mode alone cost against the baseline."""
    from benchmarks.load_test import summarise_suite
    runs = [soak_run(0.6, 2.1, 1.9, 3.0), soak_run(0.9, 3.4, 2.5, 3.5, refused=2), soak_run(0.7, 2.4, 2.0, 6.2)]
    alone = {"17 botnet": soak_run(0.8, 2.6, 2.2, 3.1)}
    data = dict(kind="soak-suite", date="2026-11-27T10:00:00+00:00", git_commit="abcdef0123",
                device=dict(cpu="X", cores=2, load_average_before=0.2, load_average_after=2.1),
                parameters=dict(honest_visitors=30, duration_s=90, mode_duration_s=30, runs=3, conditions="idle box",
                                modes={"17 botnet": {}}, memory_budget_bytes={"the process at start": 10**9,
                                                                             "total": 10**9}),
                summary=summarise_suite(soak_run(0.4, 1.5, 1.4, 2.0), alone, runs), runs=runs)
    (tmp_path / "load-soak-2026-11-24.json").write_text(json.dumps(dict(kind="soak")))    # older: not chosen
    (tmp_path / "load-soak-2026-11-27.json").write_text(json.dumps(data))
    (tmp_path / "load-soak-quick-2026-11-28.json").write_text("{}")                          # a quick look: not chosen
    md = readme_tables.load_soak_block(tmp_path)
    assert "**3 runs of 90 s with every mode**" in md and "run 2" in md and "commit `abcdef0`" in md
    assert "| honest lecture model views p95 | < 3 s | 3.40 s | 2.10 s / 2.40 s / 3.40 s | **not met** |" in md
    assert "| honest requests failed or refused | 0 | 2 of 900 | 0 / 0 / 2 | **not met** |" in md
    assert "| honest `/mask` p95 | < 1 s | 0.90 s | 0.60 s / 0.70 s / 0.90 s | met |" in md
    # the worst run met the peak, another did not: not met, and where
    assert "| 3.50 GB | 3.00 GB / 3.50 GB / 6.20 GB | **not met** in run 3 |" in md
    assert "| none (honest visitors alone) | 0.40 s | 1.50 s | 1.40 s | 0 | — | — |" in md
    assert "| 17 botnet | 0.80 s | 2.60 s | 2.20 s | 0 | 40 | none |" in md


def test_a_soaks_cpu_is_named_for_who_used_it_in_old_and_new_files():
    """Files from before the drawing process had its own CPU tally filed it under export_browser_s: the README
    names that sum for both; newer files name each."""
    old = readme_tables._cpu_parts(dict(server_s=150.0, export_browser_s=58.0, honest_clients_s=18.0, why="x"))
    assert old == "server 150, drawing process and export browser 58, honest clients 18"
    new = readme_tables._cpu_parts(dict(server_s=150.0, drawing_process_s=40.0, export_browser_s=18.0, why="x"))
    assert new == "server 150, drawing process 40, export browser 18"
    split = readme_tables._cpu_parts(dict(server_s=150.0, server_low_priority_s=30.0, drawing_process_s=40.0,
                                          why="x"))
    assert split == "server 150 (30 of it at low priority), drawing process 40"      # a part, not a sum
