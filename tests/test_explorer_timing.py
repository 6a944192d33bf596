"""The live timing tab: its controls are checked before Run, it measures through the benchmark's own
module (interleaved repeats with their spread, error vs naive), stops within one block and keeps
what it measured, offers what this device runs (bf16 and phoenix-prod on CUDA), and draws the
committed curves beside the live points with their device and date."""
import json

import pytest

from explorer import timing
from explorer.query_string import parse_query
from explorer.schema import ValidationError
from models.presets import PRESETS
from tolerances import randn_attention_abs_bound

S = parse_query("preset=lecture&weights=random")
NO_CAP = parse_query("preset=lecture&weights=random&cap_method=none")


def request(lengths="16, 24", backends=("structured",), s=S, geometry=timing.SETTINGS_GEOMETRY, dtype="float32"):
    return timing.check_request(s, geometry, dtype, lengths, list(backends))


@pytest.mark.parametrize("text,match", [("", "the box is empty"), (" , ", "the box is empty"), ("64, x", "whole numbers"),
                                        ("1", r"\[4, 2048\]"), ("3", r"\[4, 2048\]"), ("4096", r"\[4, 2048\]"),
                                        ("64," * 13, "between 1 and 12")])
def test_bad_lengths_name_the_field(text, match):
    with pytest.raises(ValidationError, match="lengths: got .*" + match):
        timing.parse_lengths(text, num_candidates=3)


def test_lengths_sorted_unique():
    assert timing.parse_lengths("64; 16, 64") == [16, 64]


@pytest.mark.parametrize("field,args", [
    ("backends", dict(backends=["flash_attn"])),           # needs CUDA: refused before Run, not after
    ("backends", dict(backends=["sdpa"])),                 # no logit cap in SDPA, and the cap is on
    ("backends", dict(backends=["bogus"])),
    ("backends", dict(backends="naive")),
    ("timing geometry", dict(geometry="phoenix-prod-b256")),     # a GPU geometry, on CPU
    ("dtype", dict(dtype="float16")),
    ("lengths", dict(lengths="99999")),
])
def test_every_timing_control_is_checked_before_run(field, args):
    with pytest.raises(ValidationError, match=f"^{field}: got "):
        request(**args)


def test_only_backends_that_run_here_can_be_chosen():
    why = timing.backend_options(NO_CAP, timing.SETTINGS_GEOMETRY, "float32")
    assert why["naive"] is None and why["sdpa"] is None and "CUDA" in why["flash_attn"]
    assert "cap" in timing.backend_options(S, timing.SETTINGS_GEOMETRY, "float32")["sdpa"]


def test_cuda_offers_bf16_and_phoenix_prod_first_and_the_flash_backends(monkeypatch):
    """The defect: the tab hard-coded float32, so on CUDA every flash kernel was refused for its dtype."""
    import models.attention as attention
    monkeypatch.setattr(timing, "device", lambda: "cuda")
    monkeypatch.setattr(attention, "_needs_cuda_build", lambda: None)       # as on a CUDA build of torch
    assert timing.dtypes()[0] == "bfloat16" and timing.geometries()[0] == "phoenix-prod"
    assert timing.geometry(NO_CAP, "phoenix-prod", "bfloat16").B == 32
    assert timing.geometry(NO_CAP, "phoenix-prod-b256", "bfloat16").B == 256
    why = timing.backend_options(NO_CAP, "phoenix-prod", "bfloat16")
    assert why["naive"] is None and why["sdpa-efficient"] is None and why["structured"] is None
    assert "float32" not in str(why["flash_attn"]) and "bfloat16" not in str(why["flash_attn"])
    assert timing.default_lengths("phoenix-prod") == str(PRESETS["phoenix-prod"].layout.seq_len)   # its own T


def test_sweep_measures_against_naive_with_interleaved_repeats():
    sw = timing.measure(S, request())
    got = {(r["backend"], r["T"]) for r in sw.points}
    assert got == {("naive", 16), ("naive", 24), ("structured", 16), ("structured", 24)}
    for r in sw.points:
        assert r["repeats"] >= 5 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["max_abs_err"] <= randn_attention_abs_bound(max(r["T"], r["head_dim"]))
    assert not sw.stopped


def test_a_cancelled_sweep_keeps_what_it_measured_and_says_how_far_it_got():
    run = timing.LiveRun(total=0)
    states = []
    for sw in timing.sweep(S, request("16, 24, 32, 48"), run):
        states.append(len(sw.points))
        if sw.points:
            run.cancel()                       # Stop pressed after the first length
    assert states[0] == 0                      # drawn at once: recorded curves and progress, nothing measured
    assert states[-1] == 2 and sw.points[0]["T"] == 16
    assert sw.stopped == "Stopped after 1 of 4 lengths (Stop was pressed): the measured points are kept (T = 16)."
    assert (run.done, run.total) == (1, 4)


def test_a_sweep_whose_turn_is_over_while_others_wait_ends_and_says_so():
    """One sweep times the device at a time: past its turn (0 s here) a sweep ends within one timed block once
    another visitor's waits, keeps its points and says why; alone, or within its turn, it runs to the end."""
    from explorer.measure import YIELDED
    waiting = [0]
    run = timing.LiveRun(total=0, yield_to=lambda: waiting[0], turn_s=0.0)
    for sw in timing.sweep(S, request("16, 24, 32, 48"), run):
        if sw.points:
            waiting[0] = 2                      # two other visitors' sweeps join after the first length
    assert sorted({r["T"] for r in sw.points}) == [16] and (run.done, run.total) == (1, 4)
    assert sw.stopped == ("Stopped after 1 of 4 lengths (other visitors' sweeps were waiting: the CPU times one "
                          f"sweep at a time, each a turn of {timing.sweep_turn_s():.0f} s while others wait; Run "
                          "again for the rest): the measured points are kept (T = 16).")
    waiting[0] = 0
    assert run.stopped() == YIELDED             # ended: the others leaving does not restart it
    for turn_s, others in ((0.0, 0), (3600.0, 3)):
        alone = timing.measure(S, request("16, 24"), timing.LiveRun(yield_to=lambda: others, turn_s=turn_s))
        assert sorted({r["T"] for r in alone.points}) == [16, 24] and not alone.stopped


def test_progress_names_the_length_being_measured_and_a_t_squared_eta():
    sw = timing.Sweep("cpu", lengths=(64, 128, 256))
    assert sw.progress().startswith("Measuring T = 64 (1 of 3 lengths)") and sw.eta_s() is None
    sw.records = [record("naive", 64, 1.0)]
    sw.elapsed_s = 2.0
    assert sw.eta_s() == pytest.approx(2.0 * (128**2 + 256**2) / 64**2)      # T² scaling of the time so far
    assert sw.progress().startswith("Measuring T = 128 (2 of 3 lengths), about 40 s left")
    sw.done = True
    assert sw.progress() == ""


def test_defaults_on_cpu_tick_the_backends_that_win_here_and_say_why():
    """On CPU flex (compiled, skips empty tiles) is the exact backend that wins: ticked by default;
    structured (separate dense calls) is not. Every backend has a line saying why it is fast or slow."""
    usable = [b for b, why in timing.backend_options(S, timing.SETTINGS_GEOMETRY, "float32").items() if why is None]
    flex_here = timing.BACKENDS["flex"].on("cpu").available() is None   # not where torch cannot compile it
    assert timing.default_backends(usable) == (["naive", "flex"] if flex_here else ["naive"])
    notes = timing.backend_notes(S, timing.SETTINGS_GEOMETRY, "float32")
    for b in usable:                        # the registry's one description of each backend, and why here
        assert f"- **{b}**: {timing.BACKENDS[b].description} — {timing.BACKENDS[b].on('cpu').speed_reason}" in notes
    assert ("skips empty" in notes if flex_here else "~~flex~~: flex on CPU needs AVX2" in notes)
    assert "no fused kernel on CPU" in notes
    assert "~~flash_attn~~: " in notes and "CUDA" in notes
    assert set(timing.BACKEND_COLORS) == set(timing.BACKENDS)
    assert len(set(timing.BACKEND_COLORS.values())) == len(timing.BACKEND_COLORS)


def test_default_lengths_exceed_the_candidates():
    assert timing.default_lengths(timing.SETTINGS_GEOMETRY, 3) == "64, 128, 256, 512"
    assert timing.default_lengths(timing.SETTINGS_GEOMETRY, 64) == "128, 256, 512, 1024"
    timing.parse_lengths(timing.default_lengths(timing.SETTINGS_GEOMETRY, 64), 64)


def test_production_presets_time_their_attention_shapes_on_cpu():
    """phoenix-2026's model does not fit a CPU, but its attention shapes need no model."""
    s = parse_query("preset=phoenix-2026", need_model=False)
    req = timing.check_request(s, timing.SETTINGS_GEOMETRY, "float32",
                               timing.default_lengths(timing.SETTINGS_GEOMETRY, s.num_candidates).split(",")[0],
                               ["naive"])
    assert (req.geometry.Hq, req.geometry.num_candidates) == (s.num_q_heads, s.num_candidates)
    assert timing.describe(req.geometry, timing.SETTINGS_GEOMETRY).startswith("the sidebar's model: B = 1, ")
    sw = timing.measure(s, req)
    assert [r["backend"] for r in sw.points] == ["naive"] and not sw.stopped


def test_the_budget_ends_the_sweep_and_says_so():
    sw = timing.measure(S, request("16, 24"), timing.Run(budget_s=0.0))
    assert not sw.points and "time budget" in sw.stopped


def record(backend, T, ms, status="ok", **kw):
    spread = dict(min_ms=ms * 0.8, max_ms=ms * 1.5) if ms is not None else dict(min_ms=None, max_ms=None)
    return dict(backend=backend, T=T, median_ms=ms, **spread, repeats=5,
                peak_mem_bytes=2**20, max_abs_err=0.0, status=status, tflops=1.0, dtype="float32", **kw)


def test_figures_show_spread_out_of_memory_and_recorded_curves_on_their_own_axes():
    """Live points and committed curves are drawn, each on figures of their own: a committed curve of
    another batch never shares a live run's axes (issue 35 item 6), and asking for both is refused."""
    sw = timing.Sweep("CPU test", records=[record("naive", 64, 2.0), record("flex", 64, 1.0),
                                           record("naive", 128, None, status="oom"),
                                           record("flex", 128, 3.0)])
    recorded = [("recorded on GPU X, 2026-01-01, B=8", [record("naive", 64, 0.5), record("flex", 64, 0.1)])]
    time_fig, mem_fig, speed_fig, err_fig = timing.sweep_figures(sw)
    committed_time, _, committed_speed, _ = timing.sweep_figures(timing.Sweep("cpu"), recorded)
    names = [t.meta for t in time_fig.data if t.meta]
    assert "naive · measured now on CPU test, B=1" in names and not any("recorded" in n for n in names)
    assert "flex · recorded on GPU X, 2026-01-01, B=8" in [t.meta for t in committed_time.data]
    with pytest.raises(ValueError, match="never share"):
        timing.sweep_figures(sw, recorded)
    live = next(t for t in time_fig.data if (t.meta or "").startswith("flex · measured now"))
    assert list(live.error_y.array) == pytest.approx([0.5, 1.5]) and list(live.error_y.arrayminus) == pytest.approx([0.2, 0.6])
    dotted = [t for t in committed_time.data if "recorded on" in (t.meta or t.name or "")]
    assert dotted and all(t.line.dash == "dot" for t in dotted)
    oom = next(t for t in time_fig.data if "out of memory" in t.name)
    assert list(oom.x) == [128] and "naive: out of memory" in oom.text[0]
    speed = {t.meta: list(t.y) for t in speed_fig.data + committed_speed.data}
    assert speed["flex · measured now on CPU test, B=1"] == [2.0]          # against naive of the same run
    assert speed["flex · recorded on GPU X, 2026-01-01, B=8"] == [5.0]      # against the file's own naive


def test_timing_log_axes_are_labelled_in_plain_numbers():
    sw = timing.Sweep("cpu", records=[record("naive", T, ms) for T, ms in ((64, 0.4), (128, 3.0), (256, 40.0))])
    time_fig = timing.sweep_figures(sw)[0]
    assert list(time_fig.layout.xaxis.ticktext) == ["64", "128", "256"]
    assert list(time_fig.layout.yaxis.ticktext)[0] in ("0.2", "0.5")


def test_one_colour_per_backend_in_every_figure_line_style_for_measured_or_recorded():
    """The defect: a backend's colour followed its position in the legend, so recorded naive was blue
    before a run and teal after, and 'flex recorded' and 'structured measured' shared orange."""
    recorded = [("recorded on CPU X, 2026-01-01, B=8", [record("naive", 64, 0.5), record("flex", 64, 0.1),
                                                        record("structured", 64, 0.7)])]
    before = timing.sweep_figures(timing.Sweep("cpu"), recorded)
    after = timing.sweep_figures(timing.Sweep("cpu", records=[record("structured", 64, 2.0),
                                                              record("naive", 64, 1.0)]))
    for figs in (before, after):
        for fig in figs[:3]:
            for t in fig.data:
                if t.meta:
                    backend, source = t.meta.split(" · ")
                    assert t.line.color == timing.BACKEND_COLORS[backend]
                    assert t.line.dash == ("solid" if source.startswith("measured") else "dot")
    for fig in before + after:          # the legend sits under the plot: never over the title
        assert fig.layout.legend.y < 0 and fig.layout.legend.yanchor == "top"


def test_close_lengths_never_overprint_their_ticks():
    ticks = timing.thinned_log_ticks([64, 128, 256, 512, 1024, 1088, 2048])
    assert 1088 not in ticks and 1024 in ticks and 2048 in ticks
    assert all(b / a >= 10 ** 0.12 for a, b in zip(ticks, ticks[1:]))


def test_work_skipped_beside_time_saved():
    """The mask's hidden FLOPs and the tiles a block-sparse kernel skips, from models.masks: nothing to
    skip while the layout is one tile; at T = 1088 with 64 candidates the candidate block's empty tiles."""
    small = timing.work_skipped("recsys", 64, 3)
    assert small["tiles"] == 1 and small["skip_tiles"] == 0 and small["flops_hidden"] > 0.4
    big = timing.work_skipped("recsys", 1088, 64)
    nq = -(-1088 // 128)
    assert big["tiles"] == nq * nq and 0 < big["skip_elements"] < big["flops_hidden"] < 1
    sw = timing.Sweep("cpu", records=[record("naive", 64, 2.0), record("flex", 64, 1.0)])
    g = timing.geometry(S, timing.SETTINGS_GEOMETRY, "float32")
    note = timing.work_note(sw, g)
    assert "| 64 | 1 of 1 | 0% |" in note and "50% (flex)" in note
    speed = timing.sweep_figures(sw, g=g)[2]
    bound = next(t for t in speed.data if (t.name or "").startswith("if time followed"))
    assert list(bound.y) == [1.0]


def results_file(tmp_path, device_name, date, records):
    path = tmp_path / f"{device_name.split()[0].lower()}-{date}.json"
    path.write_text(json.dumps(dict(device_name=device_name, date=date, torch="2.13.0", cuda=None,
                                    commit="abc", matmul_tflops=1.0, records=records)))


def test_recorded_summary_names_each_committed_file_with_its_device_and_date(tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "RESULTS_DIR", tmp_path)
    assert timing.recorded_summary().startswith("No recorded")
    point = record("naive", 64, 1.0, Hq=4, Hkv=2, head_dim=16, mask="recsys", cap_method="tanh", B=8)
    results_file(tmp_path, "CPU Example (1 threads)", "2026-01-02", [point])
    summary = timing.recorded_summary()
    assert "CPU Example (1 threads)" in summary and "2026-01-02" in summary and "1 points" in summary
    assert "None of the recorded files comes from a GPU" in summary
    # and its curve is drawn for the same attention shape, labelled with device and date
    g = timing.geometry(S, timing.SETTINGS_GEOMETRY, "float32")
    (label, recs), = timing.recorded_records(g)
    assert label == "recorded on CPU Example (1 threads), 2026-01-02, B=8" and recs == [dict(point, reason="")]
    other = timing.geometry(parse_query("preset=lecture&weights=random&num_q_heads=8&num_kv_heads=2"),
                            timing.SETTINGS_GEOMETRY, "float32")
    assert timing.recorded_records(other) == []


def test_exports_draw_the_committed_curves_and_never_measure(monkeypatch):
    """The timing charts are in the Export tab's list and the lecture pack, drawn from the committed
    benchmark files (no sweep runs) with a caption saying so."""
    from explorer.measure import load_results
    from models.runinfo import RESULTS_DIR
    from explorer import export

    def no_sweep(*a, **k):
        raise AssertionError("an export ran a timing sweep")
    monkeypatch.setattr(timing, "sweep", no_sweep)
    monkeypatch.setattr(timing, "measure", no_sweep)
    for name in ("timing", "timing_memory", "timing_speedup"):
        assert name in export.FIGURES
    figs = {n: v for n, v in export.all_figures(S)[0].items() if n.startswith("timing")}
    fig, caption = figs["timing"]
    # every curve is a committed file's points for this geometry: medians equal the file's, per backend
    committed = {(r["backend"], r["T"]): r["median_ms"] for _, d in load_results(RESULTS_DIR) for r in d["records"]
                 if r["status"] == "ok" and (r["Hq"], r["Hkv"], r["head_dim"], r["mask"], r.get("cap_method"),
                                             r["dtype"]) == (4, 2, 16, "recsys", "tanh", "float32")}
    assert committed, "the lecture geometry has committed CPU curves"
    drawn = {(t.meta.split(" · ")[0], T): y for t in fig.data if t.meta for T, y in zip(t.x, t.y)}
    assert drawn and all(committed[k] == v for k, v in drawn.items())
    assert all("recorded on" in t.meta for t in fig.data if t.meta)
    assert "not measured for this export" in caption and "recorded on CPU" in caption
    assert "Peak memory" in figs["timing_memory"][1] and "over naive" in figs["timing_speedup"][1]


def test_export_caption_says_when_no_committed_curve_matches(monkeypatch):
    from explorer import export
    monkeypatch.setattr(timing, "recorded_records", lambda g: [])
    cap = export.caption(S, "timing")
    assert "No committed benchmark file matches" in cap and "nothing was measured" in cap


def test_the_cli_plots_results_files_through_the_same_plotter():
    """One plotter: a results file drawn whole keeps the tab's colour per backend; line style tells the
    mask / cap apart; every point drawn is the file's."""
    data = dict(device_name="CPU X", torch="2.13", date="2026-01-01", commit="abc", records=[
        dict(record("naive", 64, 2.0), preset="lecture", mask="recsys", cap_method="tanh"),
        dict(record("flex", 64, 1.0), preset="lecture", mask="recsys", cap_method="tanh"),
        dict(record("flex", 64, 0.5), preset="lecture", mask="recsys", cap_method="none"),
        dict(record("flex", 128, None, status="oom"), preset="lecture", mask="recsys", cap_method="none")])
    fig = timing.results_figure(data)
    lines = [t for t in fig.data if t.meta]
    assert all(t.line.color == timing.BACKEND_COLORS[t.meta.split(" · ")[0]] for t in lines)
    assert {t.meta: t.line.dash for t in lines if t.meta.startswith("flex")} == {
        "flex · recsys, cap tanh": "solid", "flex · recsys, cap none": "dot"}
    times = {(t.meta, x): y for t in lines if t.xaxis == "x" for x, y in zip(t.x, t.y)}
    assert times == {("naive · recsys, cap tanh", 64): 2.0, ("flex · recsys, cap tanh", 64): 1.0,
                     ("flex · recsys, cap none", 64): 0.5}
