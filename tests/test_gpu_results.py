"""The recorded GPU evidence every visitor sees: read from the committed files only (every number shown equals
the file's, recomputed here from the raw JSON), shown at every CPU preset before anything runs, never on the live
run's axes; the whole forward read from a results file's "trunk" records or, for files from before them, from
their GPU session's probe.json, labelled with how it was measured."""
import json
import re
from pathlib import Path

import pytest

from explorer import gpu_results, timing
from models.presets import PRESETS
from models.runinfo import RESULTS_DIR

FIRST = "nvidia-h100-80gb-hbm3-2026-11-26.json"          # the first H100 run: the whole grid, trunk in probe.json
H100 = "nvidia-h100-80gb-hbm3-2026-11-26-2.json"         # the second: phoenix-prod, trunk and views in the file
NEWEST = "nvidia-h100-80gb-hbm3-2026-11-27-7.json"       # the seventh session's one call ("all"): kernels and trunk
TRUNK = NEWEST                                           # its trunk at phoenix-prod is in the same file
SPLIT = ("nvidia-h100-80gb-hbm3-2026-11-27-5.json",      # the sixth session's kernels (its first call, "all")
         "nvidia-h100-80gb-hbm3-2026-11-27-6.json")      # and its second call ("bench"): the trunk
RAW = json.loads((RESULTS_DIR / NEWEST).read_text())
RAW_TRUNK = json.loads((RESULTS_DIR / TRUNK).read_text())
RAW_FIRST = json.loads((RESULTS_DIR / FIRST).read_text())
PROBE = json.loads((RESULTS_DIR / "gpu-run-2026-11-26" / "probe.json").read_text())


def raw(preset="phoenix-prod", mask="recsys", padded=False, data=RAW, **match) -> dict:
    """backend -> the committed record at the evidence shape, as written in the file."""
    return {r["backend"]: r for r in data["records"] if (r["preset"], r["mask"], bool(r["padded"])) == (preset, mask, padded)
            and r["status"] == "ok" and all(r[k] == v for k, v in match.items())}


@pytest.fixture(scope="module")
def first_run_dir(tmp_path_factory):
    """The results folder as it was after the first H100 run: its file and its session's folder."""
    d = tmp_path_factory.mktemp("first-run")
    (d / FIRST).write_text((RESULTS_DIR / FIRST).read_text())
    (d / "gpu-run-2026-11-26").mkdir()
    for name in ("probe.json", "capprobe.json"):
        (d / "gpu-run-2026-11-26" / name).write_text((RESULTS_DIR / "gpu-run-2026-11-26" / name).read_text())
    return d


def test_the_newest_gpu_file_is_the_evidence():
    """The newest file that timed the kernels at the evidence shape (a later -2 file of that day timed
    phoenix-2026 only); the long grid, which it had no time for, is read from the newest file that has it, with
    its own matmul peak."""
    run = gpu_results.gpu_run()
    assert run.name == NEWEST and run.device == RAW["device_name"] == "NVIDIA H100 80GB HBM3" and run.gpu == "H100"
    assert run.peak == RAW["matmul_tflops"] and run.data["commit"] == "fc1d2e2"
    assert run.long["name"] == FIRST and run.long["peak"] == RAW_FIRST["matmul_tflops"]
    assert [gpu_results.run_order(n, {"date": "2026-11-26"}) for n in (FIRST, H100)] == [("2026-11-26", 1),
                                                                                          ("2026-11-26", 2)]


def test_a_later_file_without_kernels_at_the_evidence_shape_is_not_the_evidence(tmp_path):
    """A later run that timed only the views (gpu-run-2026-11-26-3: its kernels file kept in its folder) leaves
    the evidence with the newest file that timed the kernels; given kernels at the shape, it is the evidence."""
    (tmp_path / H100).write_text((RESULTS_DIR / H100).read_text())
    later = dict(RAW, records=[], commit="later")
    (tmp_path / "nvidia-h100-80gb-hbm3-2026-11-26-3.json").write_text(json.dumps(later))
    assert gpu_results.gpu_run(tmp_path).name == H100
    (tmp_path / "nvidia-h100-80gb-hbm3-2026-11-26-3.json").write_text(json.dumps(dict(later, records=RAW["records"])))
    assert gpu_results.gpu_run(tmp_path).data["commit"] == "later"


def test_a_split_session_reads_the_trunk_from_its_other_call(tmp_path):
    """The sixth session timed the kernels in one call and the trunk in the next, whose kernel file's trunk records
    are all 'not reached': the trunk shown is the same commit's on the same device, with that call's matmul peak; a
    file of another commit never supplies it."""
    kernels, trunk = SPLIT
    raw_kernels, raw_trunk = (json.loads((RESULTS_DIR / n).read_text()) for n in SPLIT)
    for name in SPLIT:
        (tmp_path / name).write_text((RESULTS_DIR / name).read_text())
    assert not any(r["status"] == "ok" for r in raw_kernels["trunk"])
    run = gpu_results.gpu_run(tmp_path)
    assert run.name == kernels and run.trunk.source == trunk and run.trunk.peak == raw_trunk["matmul_tflops"]
    assert gpu_results.trunk_points(run)["tanh"][0]["backend"] == "naive"
    (tmp_path / trunk).write_text(json.dumps(dict(raw_trunk, commit="another")))
    run = gpu_results.gpu_run(tmp_path)
    assert run.trunk.source == kernels and gpu_results.trunk_points(run) == {}
    assert "No whole-forward timings are committed" in gpu_results.trunk_figure(run).layout.title.text


def test_every_kernel_number_shown_equals_the_committed_file():
    """The bars (× naive), the numbers beside them (ms, share of the same run's matmul peak), the cap's cost in
    the heading and the table: each recomputed from the raw file."""
    run = gpu_results.gpu_run()
    fig = gpu_results.flash_figure(run)
    bars = {(t.name, b): (x, text) for t in fig.data for b, x, text in zip(t.y, t.x, t.text)}
    for cap, word in (("none", "no cap"), ("tanh", "tanh cap")):
        committed = raw(cap_method=cap)
        naive = committed["naive"]["median_ms"]
        assert {b for (w, b) in bars if w == word} == set(committed)
        for b, r in committed.items():
            x, text = bars[(word, b)]
            share = r["tflops"] / RAW["matmul_tflops"]
            assert x == naive / r["median_ms"]
            assert text == f"{naive / r['median_ms']:.3g}× · {r['median_ms']:.3g} ms · {share:.0%}"
    assert "29.9× · 0.639 ms · 38%" in [t for _, t in bars.values()]         # fa4's headline, from the file
    none, tanh = raw(cap_method="none"), raw(cap_method="tanh")
    heading = fig.layout.annotations[0].text
    for b in ("flex", "fa4"):
        assert f"{b} {tanh[b]['median_ms'] / none[b]['median_ms']:.2g}×" in heading
    assert RAW["device_name"] in heading and RAW["date"] in heading and RAW["commit"] in heading
    table = gpu_results.evidence_markdown(run)
    fa4 = none["fa4"]
    assert f"| {fa4['tflops']:.0f} ({fa4['tflops'] / RAW['matmul_tflops']:.0%}) |" in table
    assert f"{tanh['fa4']['median_ms'] / fa4['median_ms']:.2f}×" in table
    t = fa4["tiles"]
    assert f"{t['full']} run in full, {t['partial']} run with the mask, {t['empty']} skipped" in table
    longest = max(r["T"] for r in RAW_FIRST["records"] if r["preset"] == "long" and r["status"] == "ok")
    fa4_long = next(r for r in RAW_FIRST["records"] if (r["preset"], r["backend"], r["cap_method"], r["T"], r["status"])
                    == ("long", "fa4", "none", longest, "ok"))
    assert (f"T {longest}" in table and f"`{FIRST}`" in table and f"fa4 no cap {fa4_long['median_ms']:.3g} ms = "
            f"{fa4_long['tflops']:.0f} TFLOP/s ({fa4_long['tflops'] / RAW_FIRST['matmul_tflops']:.0%})" in table)


def test_every_forward_number_shown_equals_the_committed_file():
    """The session's trunk file times attention inside the forward: the figure draws its attention_ms and the
    rest, and its dotted line is the forward's useful work at that call's own matmul peak."""
    run = gpu_results.gpu_run()
    fig = gpu_results.trunk_figure(run)
    floor = gpu_results.forward_tflop("phoenix-prod", 32) / RAW_TRUNK["trunk_matmul_tflops"] * 1e3
    assert {s.x0 for s in fig.layout.shapes} == {floor} and floor != gpu_results.forward_tflop("phoenix-prod", 32) \
        / RAW["matmul_tflops"] * 1e3                                         # the trunk's call's peak, not the kernels'

    for i, cap in ((0, "tanh"), (2, "none")):
        rec = {r["backend"]: r for r in RAW_TRUNK["trunk"] if (r["preset"], r["cap_method"], r["B"], r["status"])
               == ("phoenix-prod", cap, 32, "ok")}
        attention, rest = fig.data[i], fig.data[i + 1]
        assert set(attention.y) == set(rec)
        for b, att, other, text in zip(attention.y, attention.x, rest.x, rest.text):
            ms = rec[b]["median_ms"]
            assert att == rec[b]["attention_ms"] and other == ms - att
            assert text == f"{ms:.0f} ms · attention {att:.0f} · {rec['naive']['median_ms'] / ms:.2g}×"
    assert "derived" not in fig.layout.title.subtitle.text


def test_a_first_run_forward_is_read_from_its_probe_and_derived(first_run_dir):
    """The whole forward from the session's probe.json; attention derived from the same run's kernel records at
    the same shape × the layers, and the figure says so."""
    run = gpu_results.gpu_run(first_run_dir)
    assert run.name == FIRST
    fig = gpu_results.trunk_figure(run)
    layers = PRESETS["phoenix-prod"].geometry.num_layers
    for cap in ("tanh", "none"):
        kernels = raw(cap_method=cap, B=32, data=RAW_FIRST)
        probe = {k.rsplit(" ", 1)[1]: v["ms"] for k, v in PROBE["trunk"].items()
                 if k.startswith(f"phoenix-prod B32 cap {cap} ") and "ms" in v}
        i = 0 if cap == "tanh" else 2                                 # (attention, rest) traces per cap
        attention, rest = fig.data[i], fig.data[i + 1]
        assert list(attention.y) == list(rest.y) and set(attention.y) == set(probe)
        for b, att, other, text in zip(attention.y, attention.x, rest.x, rest.text):
            assert att == kernels[b]["median_ms"] * layers and other == probe[b] - att
            assert text == f"{probe[b]:.0f} ms · attention {att:.0f} · {probe['naive'] / probe[b]:.2g}×"
    words = fig.layout.title.text + fig.layout.title.subtitle.text
    assert "derived: the kernel's time × 8 layers" in words and RAW_FIRST["device_name"] in words
    table = gpu_results.evidence_markdown(run)
    assert "median of 7 calls after 2 warm-ups" in table and "not interleaved" in table and "derived" in table


def test_attention_timed_inside_the_forward_is_used_as_recorded(tmp_path):
    """Where the trunk records carry attention_ms the figure draws it and says nothing is derived."""
    trunk = [dict(preset="phoenix-prod", B=32, T=1087, dtype="bfloat16", cap_method="none", mask="recsys", backend=b,
                  status="ok", reason="", repeats=5, median_ms=ms, min_ms=ms, max_ms=ms, attention_ms=att, rel_err=0.0)
             for b, ms, att in (("naive", 250.0, 150.0), ("fa4", 110.0, 6.0))]
    (tmp_path / H100).write_text(json.dumps(dict(RAW, trunk=trunk)))
    run = gpu_results.gpu_run(tmp_path)
    pts = gpu_results.trunk_points(run)["none"]
    assert [(r["backend"], r["attention"], r["derived"]) for r in pts] == [("naive", 150.0, False), ("fa4", 6.0, False)]
    fig = gpu_results.trunk_figure(run)
    assert "derived" not in fig.layout.title.subtitle.text and list(fig.data[1].x) == [100.0, 104.0]


def test_without_a_gpu_file_the_tab_says_so_and_exports_are_refused_by_name(tmp_path, monkeypatch):
    assert gpu_results.gpu_run(tmp_path) is None
    assert "No GPU results file is committed" in gpu_results.evidence_markdown(None)
    assert "No GPU results file" in gpu_results.flash_figure(None).layout.annotations[0].text
    monkeypatch.setattr(gpu_results, "gpu_run", lambda: None)
    from explorer import export
    from explorer.query_string import parse_query
    with pytest.raises(Exception, match="gpu results: got 'none committed'"):
        export.figure(parse_query("preset=lecture"), "gpu_kernels")


def axes_sources(fig) -> dict:
    """(x axis, y axis) -> the sources ('recorded' / 'measured now') of the traces drawn on them."""
    out = {}
    for t in fig.data:
        meta = t.meta or ""
        if "recorded" in meta or "measured now" in meta:
            out.setdefault((t.xaxis or "x", t.yaxis or "y"), set()).add("recorded" if "recorded" in meta else "live")
    return out


def test_recorded_and_live_are_never_on_one_axis():
    """Every figure the live run streams (the four live charts and the GPU run beside them): each pair of axes
    holds one source only; the live panel titles its own device and batch."""
    from server.timing_events import timing_outputs
    from explorer.query_string import parse_query
    s = parse_query("preset=lecture")
    req = timing.check_request(s, timing.SETTINGS_GEOMETRY, "float32", "16, 32", ["naive", "flex"])
    records = [dict(backend=b, T=T, median_ms=ms, min_ms=ms, max_ms=ms, repeats=5, peak_mem_bytes=1, max_abs_err=0.0,
                    status="ok", reason="", tflops=1.0, dtype="float32")
               for b, T, ms in (("naive", 16, 1.0), ("flex", 16, 0.5), ("naive", 32, 2.0), ("flex", 32, 1.5))]
    sw = timing.Sweep("CPU test (1 threads)", records=records, done=True)
    *figs, note = timing_outputs(sw, req)
    flash = figs[4]
    assert axes_sources(flash) == {("x", "y"): {"recorded"}, ("x2", "y2"): {"live"}}
    assert all(len(src) == 1 for fig in figs for src in axes_sources(fig).values())
    live = next(t for t in flash.data if t.xaxis == "x2")
    assert list(live.y) == ["naive", "flex"] and list(live.x) == [1.0, 2.0 / 1.5]       # at the longest T, 32
    headings = " ".join(a.text for a in flash.layout.annotations)
    assert "Measured now, here" in headings and "T 32" in headings and "B 1" in headings and "B 32" in headings


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_gpu_evidence_shows_at_every_cpu_preset_before_anything_runs(preset):
    """The defect: the Flash tab drew committed curves only where their shapes matched the sidebar's, so the
    H100 file showed at no CPU preset. Now the tab's first draw (and a lesson link's) holds it at every preset,
    geometry and dtype this device offers."""
    from server.timing_events import timing_recorded
    for geometry in timing.geometries():
        for dtype in timing.dtypes():
            *figs, note = timing_recorded(f"preset={preset}", geometry, dtype, None)
            metas = [t.meta for fig in figs for t in fig.data if t.meta]
            assert any(m.startswith(f"recorded on {RAW['device_name']}") for m in metas), (preset, geometry, dtype)
            assert not any(m for m in metas if "measured now" in m)                 # nothing ran


def test_captions_are_generated_from_the_files(first_run_dir):
    run = gpu_results.gpu_run()
    for caption in (gpu_results.kernel_caption(run), gpu_results.trunk_caption(run)):
        assert RAW["device_name"] in caption and RAW["date"] in caption and f"commit {RAW['commit']}" in caption
        assert "nothing was measured for this export" in caption
    assert f"benchmarks/results/{TRUNK};" in gpu_results.trunk_caption(run)
    assert "gpu-run-2026-11-26/probe.json" in gpu_results.trunk_caption(gpu_results.gpu_run(first_run_dir))


def test_the_forwards_useful_work_is_its_matmuls_and_its_masked_attention(first_run_dir):
    """2 x parameters per token plus q.k and p.v over the allowed pairs, per layer: about 25 TFLOP at
    phoenix-prod, B 32 (the issue's figure), so the fastest forward runs under 30 % of the matmul peak."""
    from explorer.limits import trunk_params
    from explorer.query_string import parse_query
    from explorer.measure import useful_pairs
    s = parse_query("preset=phoenix-prod", need_model=False)
    pairs = useful_pairs("recsys", 1087, 1087 - 64)
    expect = 32 * (2 * 1087 * trunk_params(s) + 8 * 4 * 20 * 128 * pairs) / 1e12
    assert gpu_results.forward_tflop("phoenix-prod", 32) == pytest.approx(expect, rel=1e-12)
    assert 24 < expect < 26
    fastest = min(v["ms"] for k, v in PROBE["trunk"].items() if k.startswith("phoenix-prod B32") and "ms" in v)
    assert expect / fastest * 1e3 / RAW_FIRST["matmul_tflops"] < 0.30
    assert re.search(r"\| fa4 \| 107 \| 2\.4× \| .* \| 232 \(29%\) \|",
                     gpu_results.trunk_table(gpu_results.gpu_run(first_run_dir)))
    fa4 = next(r for r in RAW_TRUNK["trunk"] if (r["preset"], r["cap_method"], r["backend"]) == ("phoenix-prod", "none", "fa4"))
    rate = gpu_results.forward_tflop("phoenix-prod", 32) / fa4["median_ms"] * 1e3
    assert rate / RAW_TRUNK["trunk_matmul_tflops"] < 0.35
    assert f"| {rate:.0f} ({rate / RAW_TRUNK['trunk_matmul_tflops']:.0%}) |" in gpu_results.trunk_table(gpu_results.gpu_run())


def test_why_the_cap_costs_is_read_from_the_sessions_cap_probe():
    rows = json.loads((RESULTS_DIR / "gpu-run-2026-11-26" / "capprobe.json").read_text())["rows"]
    line = gpu_results.cap_probe_line(gpu_results.gpu_run())
    base = rows["none"]["ms_median"]
    assert f"({base / rows['torch.tanh']['ms_median']:.2f}× the uncapped throughput)" in line
    for k, v in rows.items():
        if k.startswith("poly"):
            assert f"{v['ms_median']:.3g} ms ({base / v['ms_median']:.2f}×)" in line and f"{v['fit_abs_err_tanh']:.1e}" in line


def test_the_cap_probe_of_an_earlier_session_on_the_device_says_so(tmp_path):
    """The newest file's session ran no cap probe: the newest probe on the same device is shown, named as an
    earlier session's with its path; a probe of another device is not. The run's session is the folder of its
    tests (session.json: its commit, its device), not its date: a day can hold two sessions."""
    assert "in an earlier session on this device" in gpu_results.cap_probe_line(gpu_results.gpu_run())
    assert "`gpu-run-2026-11-26/capprobe.json`" in gpu_results.cap_probe_line(gpu_results.gpu_run())
    (tmp_path / NEWEST).write_text((RESULTS_DIR / NEWEST).read_text())
    probe = json.loads((RESULTS_DIR / "gpu-run-2026-11-26" / "capprobe.json").read_text())
    (tmp_path / "gpu-run-2026-11-26").mkdir()
    (tmp_path / "gpu-run-2026-11-26" / "capprobe.json").write_text(json.dumps(dict(probe, device="another GPU")))
    assert gpu_results.cap_probe_line(gpu_results.gpu_run(tmp_path)) == ""
    (tmp_path / "gpu-run-2026-11-27").mkdir()
    (tmp_path / "gpu-run-2026-11-27" / "capprobe.json").write_text(json.dumps(probe))
    assert "in a session on this device" in gpu_results.cap_probe_line(gpu_results.gpu_run(tmp_path))  # no tests
    session_dir(tmp_path, "gpu-run-2026-11-27-2/all", RAW["commit"], [("t::a", "call", "passed", "")])
    assert "in an earlier session on this device" in gpu_results.cap_probe_line(gpu_results.gpu_run(tmp_path))
    (tmp_path / "gpu-run-2026-11-27-2" / "capprobe.json").write_text(json.dumps(probe))
    assert "in the same session on this device" in gpu_results.cap_probe_line(gpu_results.gpu_run(tmp_path))


def session_dir(root: Path, name: str, commit: str, outcomes: list, finished=True, device=RAW["device_name"]) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "session.json").write_text(json.dumps(dict(commit=commit, device=device, step="all")))
    (d / "gpu-tests.jsonl").write_text("".join(json.dumps(dict(nodeid=n, when=w, outcome=o, seconds=0.1,
                                                                properties={}, **({"message": m} if m else {})))
                                               + "\n" for n, w, o, m in outcomes))
    if finished:
        (d / "gpu-tests.xml").write_text("<testsuites/>")


def test_the_gpu_tests_shown_are_those_of_the_files_commit_on_its_device():
    """The committed session's outcomes, counted from its streamed file: each test once (its call, or its setup
    where it went no further), the skips' reasons once each, and the tab says it finished."""
    run = gpu_results.gpu_run()
    lines = [json.loads(x) for x in (RESULTS_DIR / "gpu-run-2026-11-27-4" / "all" / "gpu-tests.jsonl").read_text()
             .splitlines()]
    outcome = {x["nodeid"]: x["outcome"] for x in lines}
    line = gpu_results.tests_line(run)
    assert (f"{sum(o == 'passed' for o in outcome.values())} passed, 0 failed, "
            f"{sum(o == 'skipped' for o in outcome.values())} skipped (flash-attn not installed;") in line
    assert "`gpu-run-2026-11-27-4/all/`" in line and "ran out" not in line
    assert line in gpu_results.evidence_markdown(run)


def test_gpu_tests_of_another_commit_or_device_are_not_shown_and_a_failure_counts_once(tmp_path):
    (tmp_path / NEWEST).write_text((RESULTS_DIR / NEWEST).read_text())
    assert gpu_results.tests_line(gpu_results.gpu_run(tmp_path)) == ""
    session_dir(tmp_path, "gpu-run-2026-11-27/all", "older", [("t::a", "call", "passed", "")])
    session_dir(tmp_path, "gpu-run-2026-11-27/other", RAW["commit"], [("t::a", "call", "passed", "")],
                device="another GPU")
    assert gpu_results.tests_line(gpu_results.gpu_run(tmp_path)) == ""
    session_dir(tmp_path, "gpu-run-2026-11-27-2/tests", RAW["commit"],
                [("t::a", "call", "passed", ""), ("t::a", "teardown", "failed", "boom"),
                 ("t::b", "setup", "skipped", "Skipped: needs CUDA"), ("t::c", "call", "passed", "")], finished=False)
    line = gpu_results.tests_line(gpu_results.gpu_run(tmp_path))
    assert "(`gpu-run-2026-11-27-2/tests/`): 1 passed, 1 failed, 1 skipped (needs CUDA); the call's time ran out" in line
