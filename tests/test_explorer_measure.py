"""The measurement library: counts, records, refusals and OOM as data, interleaving, stop and budget."""
import json

import pytest
import torch

from explorer import measure as bench
from models.masks import MASK_KINDS, AttentionMask
from models.runinfo import RESULTS_DIR
from tolerances import randn_attention_abs_bound

TINY = dict(B=1, Hq=4, Hkv=2, head_dim=8, T=12, num_candidates=3, min_block_ms=0.0)
RECORD_KEYS = {"preset", "backend", "mask", "dtype", "B", "Hq", "Hkv", "head_dim", "T", "num_candidates",
               "repeats", "median_ms", "min_ms", "max_ms", "peak_mem_bytes", "tflops", "max_abs_err", "status",
               "padded", "tiles"}


@pytest.mark.parametrize("kind", list(MASK_KINDS))
@pytest.mark.parametrize("T,C", [(12, 3), (9, 0), (5, 5), (70, 64)])
def test_useful_pairs_counts_the_mask(kind, T, C):
    assert bench.useful_pairs(kind, T, T - C) == int(AttentionMask(kind, T, T - C).dense().sum())


def test_measure_shape_records_a_real_measurement_with_its_spread():
    naive, r = bench.measure_shape(["structured"], cap_method="tanh", **TINY)
    assert RECORD_KEYS <= set(r) and r["status"] == "ok" and naive["backend"] == "naive"
    assert r["repeats"] >= 5 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["tflops"] > 0
    assert r["max_abs_err"] is not None and r["max_abs_err"] <= randn_attention_abs_bound(12)
    assert naive["max_abs_err"] <= randn_attention_abs_bound(12) and r["err_vs"] == naive["err_vs"] == "fp32"
    assert 0 < r["rel_err"] <= r["max_abs_err"] / 0.1          # relative to max |reference| (well above 0.1 here)


def test_refused_point_says_why_and_is_not_timed():
    r = bench.measure_shape(["sdpa"], cap_method="tanh", **TINY)[1]
    assert (r["status"], r["reason"]) == (bench.Status.SKIPPED, "sdpa: SDPA has no logit cap (exact only with the cap off)")
    assert r["median_ms"] is None and r["repeats"] == 0


def planted(monkeypatch, backend, change):
    """`backend` returning change(its true output): a kernel that runs and computes something else."""
    from models import attention as A
    real = A.BACKENDS[backend]
    monkeypatch.setitem(A.BACKENDS, backend, A.replace(
        real, fn=lambda *a, **k: A.AttentionOutput(change(real.fn(*a, **k).out))))


@pytest.mark.parametrize("change", [lambda out: out * (1 + 1e-3), lambda out: out.index_fill(1, torch.tensor([0]), float("nan"))],
                         ids=["1e-3 relative", "nan row"])
def test_output_off_the_reference_beyond_rounding_fails_the_point(monkeypatch, change):
    """A planted error far below what a plot shows but above the rounding bound (or a NaN): the record is an
    error naming the error and the bound, and the wrong kernel is not timed."""
    planted(monkeypatch, "structured", change)
    naive, r = bench.measure_shape(["structured"], cap_method="tanh", **TINY)
    assert naive["status"] == "ok" and r["status"] == bench.Status.ERROR and r["median_ms"] is None
    assert r["reason"].startswith(f"{bench.WRONG}: |out - fp32 reference| is above the rounding bound")


def test_the_reference_in_pieces_is_the_whole_one_and_no_piece_exceeds_its_bytes(monkeypatch):
    """reference_attention cut to single query rows of one KV head (a budget of one row's scores) computes what
    one piece does, within fp32 rounding, and no piece's [b, G, rows, T] scores pass the budget."""
    from models import attention as A
    from tolerances import assert_rounding_close, rounding_bound
    q, k, v = bench.make_inputs(3, 4, 2, 8, 40, "float32", "cpu", seed=1)
    mask = bench.AttentionMask("recsys", 40, 30, bench.padded_valid(3, 40, 30))
    kw = dict(multiplier=8 ** -0.5, cap=30.0, cap_method="tanh")
    whole = bench.reference_attention(q, k, v, mask, piece_bytes=1 << 30, **kw)
    pieces, real = [], A.grouped_attention
    monkeypatch.setattr(A, "grouped_attention", lambda q, k, *a, **kw: pieces.append((*q.shape[:3], k.shape[1]))
                        or real(q, k, *a, **kw))
    one_row = 2 * 40 * 4 * bench.SCORE_COPIES                      # G = 2 query heads x T = 40 keys, fp32
    cut = bench.reference_attention(q, k, v, mask, piece_bytes=one_row, **kw)
    assert len(pieces) == 3 * 40 * 2 and all(b * rows * G * T * 4 * bench.SCORE_COPIES <= one_row
                                               for b, rows, G, T in pieces)
    for a, b in ((cut.out, whole.out), (cut.scale, whole.scale)):
        assert_rounding_close(a, b, n=40, depth=3)
    # a logit is a K-term fp32 dot product (K = 8) from a GEMM of another shape, which MKL may sum in another
    # order (its AVX2 path does): each side is off by at most gamma_K * dot_max, and the cap only shrinks that
    assert whole.logit_max > 0 and cut.dot_max == whole.dot_max
    assert abs(cut.logit_max - whole.logit_max) <= rounding_bound(torch.float32, 8) * whole.dot_max


def test_every_timed_point_is_checked_where_naive_does_not_fit(monkeypatch):
    """Naive refused for memory (its [B, H, T, T] scores over the limit, as phoenix-prod-b256 or T 32768 on a GPU)
    and the reference cut into pieces: a wrong kernel still fails the point, and a right one is checked."""
    monkeypatch.setattr(bench, "CPU_SCORES_LIMIT", 1000)                   # naive's scores here: 9 kB
    monkeypatch.setitem(bench.REFERENCE_PIECE_BYTES, "cpu", 2 * 12 * 4 * bench.SCORE_COPIES)   # one row a piece
    naive, right = bench.measure_shape(["sdpa-flash"], cap_method="none", **TINY)      # sdpa-flash: fused
    assert naive["status"] == bench.Status.SKIPPED and "GiB of RAM" in naive["reason"]
    assert right["status"] == "ok" and right["max_abs_err"] <= randn_attention_abs_bound(12)
    planted(monkeypatch, "sdpa-flash", lambda out: out * (1 + 1e-3))
    wrong = bench.measure_shape(["sdpa-flash"], cap_method="none", **TINY)[1]
    assert wrong["status"] == bench.Status.ERROR and wrong["reason"].startswith(bench.WRONG)


def test_benchmark_cli_fails_on_a_wrong_backend_after_writing_its_results(monkeypatch, tmp_path):
    from benchmarks import attention as cli
    planted(monkeypatch, "structured", lambda out: out * (1 + 1e-3))
    monkeypatch.setattr(cli, "matmul_tflops", lambda device: 0.1)
    with pytest.raises(SystemExit) as failed:
        cli.main(["--device", "cpu", "--seq-lens", "9", "--backends", "structured", "--out-dir", str(tmp_path),
                  "--no-plot"])
    assert "FAILED structured" in str(failed.value.code) and bench.WRONG in str(failed.value.code)
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_padded_query_rows_are_left_out_of_the_error(monkeypatch):
    """Outputs at padded positions mean nothing (the flash kernels zero them): garbage there is no error."""
    valid = bench.padded_valid(TINY["B"], TINY["T"], TINY["T"] - TINY["num_candidates"])
    planted(monkeypatch, "structured", lambda out: torch.where(valid[..., None, None], out, 1e3))
    r = bench.measure_shape(["structured"], cap_method="tanh", padded=True, **TINY)[1]
    assert r["status"] == "ok" and r["max_abs_err"] <= randn_attention_abs_bound(12)


def test_out_of_memory_is_a_status_not_a_crash(monkeypatch):
    def boom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40 GiB")
    monkeypatch.setattr(bench, "attend", boom)
    assert [r["status"] for r in bench.measure_shape(["structured"], **TINY)] == [bench.Status.OOM] * 2


def recording_calls(monkeypatch, after=None):
    """Replace the one attention call with a recorder: every call appends its backend."""
    calls = []
    real = bench._call

    def call(backend, *args):
        calls.append(backend)
        if after:
            after(calls)
        return real(backend, *args)
    monkeypatch.setattr(bench, "_call", call)
    return calls


def test_backends_are_timed_interleaved(monkeypatch):
    """After each backend's warm-up and memory calls, the timed calls go A B C, A B C, ... so a slow
    spell of a shared machine falls on every backend alike (not all on one)."""
    calls = recording_calls(monkeypatch)
    bench.measure_shape(["structured", "sdpa"], cap_method="none", repeats=6, **TINY)
    prep, timed = calls[:6], calls[6:]
    assert prep == ["naive", "naive", "structured", "structured", "sdpa", "sdpa"]
    assert timed == ["naive", "structured", "sdpa"] * 6


def test_a_cancelled_run_stops_within_one_timed_block(monkeypatch):
    """The flag is read before every timed block, not only between points: cancelling during the
    repeats ends the point at once and keeps the repeats done so far."""
    run = bench.Run()
    calls = recording_calls(monkeypatch, after=lambda calls: run.cancel() if len(calls) == 6 else None)
    naive, structured = bench.measure_shape(["structured"], run=run, repeats=50, **TINY)
    assert len(calls) == 6                  # 2 warm-up + 2 memory calls, then 1 timed block each
    assert naive["repeats"] == 1 and structured["repeats"] == 1 and naive["status"] == "ok"


def test_the_budget_holds_within_one_call(monkeypatch):
    """Slow backends (each call 0.2 s: a shape is 4 warm-up/memory calls + 5 repeats x 2 backends =
    2.8 s) under a 1 s budget: the run ends a call or two past it, not at the end of the shape (the
    old check, between points only) or of the sweep."""
    import time
    bench.measure_shape(["structured"], **TINY)         # first-call costs of this process, not timed below
    started = []
    recording_calls(monkeypatch, after=lambda calls: (started.append(time.perf_counter()), time.sleep(0.2)))
    start = time.perf_counter()
    records = list(bench.sweep("lecture", "cpu", run=bench.Run(1.0), seq_lens=[9, 16, 32, 64],
                               backends=["naive", "structured"], min_block_ms=0.0))
    late = [t for t in started if t > start + 1.0]
    assert len(late) <= 2, f"{len(late)} calls began past the budget"     # counted, not timed: any machine
    assert any((r["status"], r["reason"]) == (bench.Status.NOT_REACHED, "time budget spent") for r in records)


def test_sweep_stops_at_budget_and_lists_the_whole_grid():
    records = list(bench.sweep("lecture", "cpu", budget_s=0.0, seq_lens=[9, 64]))
    p = bench.grid_for("lecture", "cpu")
    assert len(records) == 2 * len(p.masks) * len(p.cap_methods) * len(p.paddings) * len(bench.BACKENDS)
    assert all((r["status"], r["reason"]) == (bench.Status.NOT_REACHED, "time budget spent") for r in records)


def test_sweep_is_cancellable():
    run, records = bench.Run(), []
    for r in bench.sweep("lecture", "cpu", seq_lens=[9, 16], backends=["naive", "structured"], run=run,
                         min_block_ms=0.0):
        records.append(r)
        run.cancel()                            # the user pressed stop after the first shape
    first = [r for r in records if r["T"] == 9 and r["cap_method"] == "tanh"]
    assert all(r["status"] == "ok" for r in first) and len(records) > len(first)
    assert all((r["status"], r["reason"]) == (bench.Status.NOT_REACHED, "cancelled") for r in records[len(first):])


def test_a_backend_out_of_memory_is_skipped_at_longer_lengths_and_the_others_go_on(monkeypatch):
    real = bench._call

    def naive_runs_out_past_16(backend, q, *args):
        if backend == "naive" and q.shape[1] > 16:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(backend, q, *args)
    monkeypatch.setattr(bench, "_call", naive_runs_out_past_16)
    records = list(bench.sweep("lecture", "cpu", seq_lens=[16, 24, 32], backends=["structured"], min_block_ms=0.0))
    status = {(r["backend"], r["T"], r["cap_method"]): r["status"] for r in records}
    assert status[("naive", 24, "tanh")] == "oom"
    assert status[("naive", 32, "tanh")] == bench.Status.SKIPPED
    assert {r["reason"] for r in records if (r["backend"], r["T"]) == ("naive", 32)} == {"ran out of memory at T = 24"}
    assert status[("structured", 32, "tanh")] == "ok"


def test_sweep_takes_a_custom_geometry():
    geometry = bench.Grid(B=1, Hq=2, Hkv=1, head_dim=8, dtype="float32", seq_lens=(10,), num_candidates=2,
                          masks=("recsys-bidirectional",), cap_methods=("soft_sign",), cap=5.0)
    records = list(bench.sweep(geometry, "cpu", backends=["structured"], min_block_ms=0.0))
    assert [(r["preset"], r["backend"], r["status"]) for r in records] == [("custom", "naive", "ok"),
                                                                           ("custom", "structured", "ok")]
    assert records[1]["max_abs_err"] <= randn_attention_abs_bound(10) and records[1]["Hq"] == 2


def test_no_dense_mask_is_built_inside_the_timed_calls(monkeypatch):
    """naive and sdpa read the mask's dense form: it is built in the warm-up, once per shape, and the
    timed repeats only reuse it (else they would time mask building, not attention)."""
    import models.masks as masks
    masks._shared_structure_dense.cache_clear()
    built = []
    real_dense = masks.dense
    monkeypatch.setattr(masks, "dense", lambda *a, **k: built.append(1) or real_dense(*a, **k))
    seen = recording_calls(monkeypatch)
    at_call = []
    real_call = bench._call
    monkeypatch.setattr(bench, "_call", lambda *a: at_call.append(len(built)) or real_call(*a))
    bench.measure_shape(["sdpa"], cap_method="none", **TINY)
    assert built and seen
    timed = at_call[4:]                      # after naive's and sdpa's warm-up + memory calls
    assert len(timed) >= 10 and len(set(timed)) == 1


def test_padded_point_runs_the_padded_paths_and_counts_only_valid_keys():
    unpadded, padded = (bench.measure_shape(["structured"], cap_method="tanh", padded=p, **TINY) for p in (False, True))
    assert [r["padded"] for r in unpadded + padded] == [False, False, True, True]
    assert padded[1]["status"] == "ok" and padded[1]["max_abs_err"] <= randn_attention_abs_bound(12)
    valid = bench.padded_valid(1, 12, 9)
    assert not bool(valid.all()) and bool(valid[:, 0]) and bool(valid[:, 9:].all())
    mask = AttentionMask("recsys", 12, 9, valid)
    flops = bench.mask_flops(mask, 1, 4, 8, 3, "cpu")
    assert flops == 4 * 4 * 8 * int(mask.dense().sum()) < bench.useful_flops("recsys", 1, 4, 8, 12, 3)


def test_2026_serving_layout_is_a_geometry_with_its_tile_counts():
    """P 2 + L 1022 = 1024, 64 candidates in 128 slots, T 1152: 128 x 128 tiles, 73 of 81 run (72 full,
    the candidate tile's diagonal partial), the prefix rows' 8 candidate tiles skipped (docs/originals.md §7)."""
    p = bench.GRIDS["phoenix-2026"]
    assert (p.seq_lens, p.seq_lens[0] - p.num_candidates, p.dtype, p.masks, p.cap_methods) == (
        (1152,), 1024, "bfloat16", ("recsys-bidirectional",), ("none",))
    assert set(p.paddings) == {False, True}
    assert bench.tile_counts(AttentionMask("recsys-bidirectional", 1152, 1024), "cpu") == dict(empty=8, partial=1,
                                                                                                full=72)
    r = bench.measure_shape(["structured"], mask="recsys-bidirectional", B=1, Hq=4, Hkv=2, head_dim=8, T=1152,
                            num_candidates=128, cap_method="none", run=bench.Run(0.0))[0]
    assert r["tiles"] == dict(empty=8, partial=1, full=72) and (r["status"], r["reason"]) == (bench.Status.NOT_REACHED, "time budget spent")


def test_statuses_are_an_enum_with_a_reason_and_old_files_read_the_same(tmp_path):
    """No free string matched by prefix: a record's status is a Status and its reason apart. A file
    written before (status 'skipped: <why>') reads as the same status and reason."""
    import json
    r = bench.measure_shape(["sdpa"], T=12, cap_method="tanh", repeats=1, min_block_ms=0.0)[1]
    assert isinstance(r["status"], bench.Status) and json.loads(json.dumps(r))["status"] == "skipped"
    legacy = [dict(r, status="skipped: sdpa: SDPA has no logit cap (exact only with the cap off)"),
              dict(r, status="skipped: time budget spent"), dict(r, status="error: RuntimeError: boom"),
              dict(r, status="oom"), dict(r, status="ok")]
    for rec in legacy:
        rec.pop("reason")
    (tmp_path / "cpu-old.json").write_text(json.dumps(dict(device_name="CPU old", records=legacy)))
    (_, data), = bench.load_results(tmp_path)
    assert [(x["status"], x["reason"]) for x in data["records"]] == [
        (bench.Status.SKIPPED, r["reason"]), (bench.Status.NOT_REACHED, "time budget spent"),
        (bench.Status.ERROR, "RuntimeError: boom"), (bench.Status.OOM, "out of memory"), (bench.Status.OK, "")]


def test_a_warm_up_within_the_compile_allowance_does_not_spend_the_budget():
    """A first FlexAttention compile (~20-40 s on a CPU) must not use up a live run's budget before
    anything is timed: warm-up time moves the deadline, up to the run's allowance, and no further."""
    run = bench.Run(budget_s=10.0, compile_allowance_s=5.0)
    start = run.deadline
    run.warmed_up(3.0)
    assert run.deadline == pytest.approx(start + 3.0) and run.compile_left == pytest.approx(2.0)
    run.warmed_up(4.0)                                  # only what is left of the allowance
    assert run.deadline == pytest.approx(start + 5.0) and run.compile_left == 0
    plain = bench.Run(budget_s=10.0)                    # the CLI's runs: warm-ups count as they always did
    before = plain.deadline
    plain.warmed_up(3.0)
    assert plain.deadline == before


def test_trunk_records_come_from_the_trunk_key_or_the_run_folder(tmp_path):
    """One reader, two sources, one schema: a file's own "trunk" list as written; else its session's probe.json
    (same device, gpu-run-<date>/), its skipped backends kept with their reason; else nothing."""
    name = "nvidia-h100-80gb-hbm3-2026-11-26.json"
    data = json.loads((RESULTS_DIR / name).read_text())
    written = json.loads((RESULTS_DIR / "gpu-run-2026-11-26" / "probe.json").read_text())
    probe = bench.trunk_timings(name, data)
    assert probe.source == "gpu-run-2026-11-26/probe.json" and "not interleaved" in probe.method
    assert all(set(r) == set(bench.TRUNK_KEYS) for r in probe.records) and len(probe.records) == len(written["trunk"])
    fa4 = next(r for r in probe.records if (r["preset"], r["cap_method"], r["backend"]) == ("phoenix-prod", "tanh", "fa4"))
    assert (fa4["median_ms"], fa4["B"], fa4["T"], fa4["dtype"], fa4["mask"], fa4["repeats"], fa4["min_ms"]) == \
        (written["trunk"]["phoenix-prod B32 cap tanh fa4"]["ms"], 32, 1087, "bfloat16", "recsys", 7, None)
    sdpa = next(r for r in probe.records if (r["preset"], r["cap_method"], r["backend"]) == ("phoenix-prod", "tanh", "sdpa"))
    assert sdpa["status"] == bench.Status.SKIPPED and "no logit cap" in sdpa["reason"] and sdpa["median_ms"] is None

    own = dict(preset="phoenix-prod", B=32, T=1087, dtype="bfloat16", cap_method="none", mask="recsys", backend="fa4",
               status="ok", reason="", repeats=5, median_ms=100.0, min_ms=99.0, max_ms=101.0, attention_ms=4.0,
               rel_err=0.01)
    with_key = bench.trunk_timings("x.json", dict(data, trunk=[own]), tmp_path)
    assert with_key.records == (dict(own, status=bench.Status.OK),) and with_key.source == "x.json"
    assert "5 repeats" in with_key.method
    assert bench.trunk_timings(name, data, tmp_path) is None                       # no run folder there
    (tmp_path / "gpu-run-2026-11-26").mkdir()
    (tmp_path / "gpu-run-2026-11-26" / "probe.json").write_text(json.dumps(dict(written, device="another GPU")))
    assert bench.trunk_timings(name, data, tmp_path) is None                       # another device's probe
