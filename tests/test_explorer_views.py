"""Views draw what the model computed: figure data equals the recorded forward, labels and segment
boundaries follow the layout, probe verdicts are right for isolating and non-isolating masks."""
import numpy as np
import pytest
import torch

from explorer import runs, views
from explorer.figures import Panel, boundaries, heatmap_figure, pool
from explorer.families import demo_transformer
from explorer.query_string import parse_query
from explorer.settings import VALUE_KINDS
from tolerances import assert_beyond_rounding, assert_bit_exact, assert_rounding_close, rounding_bound

LECTURE = "preset=lecture&weights=random"


def heatmaps(fig):
    """The value heatmaps (not the masked pairs drawn over them)."""
    return [t for t in fig.data if t.type == "heatmap" and not (t.meta and t.meta.get("overlay"))]


def shown(fig):
    return [t for t in heatmaps(fig) if t.visible is not False]


def test_single_head_heatmap_equals_recorded_probabilities():
    s = parse_query(LECTURE + "&head=3&layer=1")
    fig, bars, _ = views.attention_view(s)
    (hm,) = shown(fig)
    probs = runs.forward(s).trunk.layers[1].probs[0, 3].numpy()
    assert_bit_exact(np.asarray(hm.z, dtype=np.float64), probs.astype(np.float64), "same computation")
    assert list(hm.x) == list(hm.y) == s.layout.token_labels()
    row = runs.forward(s).trunk.layers[1].probs[0, 3, s.query_position].numpy()
    assert_bit_exact(np.asarray(bars.data[0].y, dtype=np.float64), row, "same computation")


@pytest.mark.parametrize("query", ["&head=2&layer=1", "&head=0&color=log", "&head=3&color=quantile&query=4",
                                   "&head=1&values=masked+logits&color=log&history_padding=2"])
def test_a_one_head_view_holds_the_models_other_panels_hidden_for_the_page(query, monkeypatch):
    """Where the page draws query rows itself (static/page.js drawPanel), a small model's one-head view carries
    every value kind, layer and head: its own drawn exactly as without the others (same trace, axes, lines,
    outline), each other hidden with its recorded values (float32, exactly; masked cells NaN), and the title,
    colour bar, zmin and colour scale its own view has."""
    from dataclasses import replace

    from plotly.io.json import to_json_plotly
    s = parse_query(LECTURE + query)
    fig = views.attention_view(s)[0]
    monkeypatch.setattr(views.attention, "HEADS_ON_PAGE_CELLS", 0)
    alone = views.attention_view(s)[0]
    monkeypatch.undo()
    (want,) = heatmaps(alone)
    assert [(t.meta["values"], t.meta["layer"], t.meta["head"]) for t in heatmaps(fig)] == \
        [(v, layer, h) for v in VALUE_KINDS for layer in range(s.num_layers) for h in range(s.num_q_heads)]
    (got,) = shown(fig)
    assert got.meta.pop("colour") == alone.layout.meta["colour"]
    assert to_json_plotly(got.to_plotly_json()) == to_json_plotly(want.to_plotly_json())
    # the page draws the bars from the probabilities it holds, whatever the values shown
    assert fig.layout.meta["query"]["values"] == s.values
    if s.values != "probabilities":
        assert "query" not in alone.layout.meta
        fig.layout.meta = {k: v for k, v in fig.layout.meta.items() if k != "query"}
    assert to_json_plotly(fig.layout.to_plotly_json()) == to_json_plotly(alone.layout.to_plotly_json())
    for t in heatmaps(fig):
        if t.visible is False:
            v, layer, h = t.meta["values"], t.meta["layer"], t.meta["head"]
            assert_bit_exact(np.asarray(t.z), views.attention_values(replace(s, values=v), layer)[h],
                             "same computation")
            assert t.customdata is None
            other = views.attention_view(replace(s, values=v, layer=layer, head=h))[0]
            assert t.meta["colour"] == other.layout.meta["colour"]
            assert t.colorscale == shown(other)[0].colorscale


@pytest.mark.parametrize("query", ["&head=1&zoom=candidates", "&head=-1", "&head=1&num_history=300",
                                   "&head=1&num_history=66&values=capped+logits"])
def test_a_view_the_page_cannot_redraw_carries_no_hidden_panels(query):
    """A zoom, the every-head grid, a long sequence, or logits where the model's panels do not fit (the bars'
    probabilities would not travel): what is sent is only what is shown."""
    fig = views.attention_view(parse_query(LECTURE + query))[0]
    assert all(t.visible is not False for t in fig.data)


def test_a_larger_one_head_view_holds_only_its_layers_heads():
    """Past HEADS_ON_PAGE_CELLS for every panel, a probabilities view still carries its layer's heads."""
    s = parse_query(LECTURE + "&head=1&num_history=66")
    assert len(VALUE_KINDS) * s.num_layers * s.num_q_heads * s.seq_len ** 2 > views.HEADS_ON_PAGE_CELLS
    fig = views.attention_view(s)[0]
    assert [(t.meta["values"], t.meta["layer"], t.meta["head"]) for t in heatmaps(fig)] == \
        [("probabilities", s.layer, h) for h in range(s.num_q_heads)]


def test_grid_groups_query_heads_under_their_kv_head():
    s = parse_query(LECTURE)          # 4 query heads, 2 KV heads, 2 layers
    fig, _, _ = views.attention_view(s)
    assert len(heatmaps(fig)) == s.num_layers * s.num_q_heads
    texts = [a.text for a in fig.layout.annotations]
    assert "<b>KV head 0</b>" in texts and "<b>KV head 1</b>" in texts
    # panel order: layer 0 heads 0..3, then layer 1
    probs = runs.forward(s).trunk.layers[1].probs[0, 2].numpy()
    assert_bit_exact(np.asarray(heatmaps(fig)[6].z, dtype=np.float64), probs.astype(np.float64),
                     "same computation")


def test_masked_logits_are_gaps_exactly_where_the_mask_forbids():
    s = parse_query(LECTURE + "&head=0&values=masked+logits&history_padding=2")
    (hm,) = shown(views.attention_view(s)[0])
    z = np.asarray(hm.z, dtype=np.float64)
    allowed = views.mask_dense(s, "recsys")
    assert np.array_equal(np.isfinite(z), allowed)
    logits = runs.forward(s).trunk.layers[0].logits[0, 0].numpy()
    assert_bit_exact(z[allowed], logits[allowed], "same computation")


def test_mask_view_values_labels_and_boundaries():
    s = parse_query(LECTURE + "&num_history=4&candidate_padding=1&compare=causal")
    fig, text = views.mask_view(s)
    ours, causal = heatmaps(fig)
    T, off = s.seq_len, s.candidate_start_offset
    z = np.asarray(ours.z)
    for q in range(T):
        for k in range(T):
            pad_key = s.layout.segments()[k] == "P"
            want = (k <= q and (k < off or k == q)) and not pad_key
            assert z[q, k] == float(want), (q, k)
    assert not np.asarray(causal.z)[:, T - 1].any()     # the padded last candidate is hidden as a key
    assert np.asarray(causal.z)[T - 1, off] == 1.0      # causal: a later candidate sees C0
    lines = {(sh.x0, sh.xref) for sh in fig.layout.shapes if sh.x0 == sh.x1}
    assert (1 - 0.5, "x") in lines and (off - 0.5, "x") in lines
    allowed = int(z.sum())
    assert f"| recsys | {allowed:,} | {T * T:,} |" in text


def test_boundaries_keep_padding_inside_its_block():
    assert boundaries(list("UHHPCCP")) == [1, 4]


def test_pooling_takes_block_max_and_names_ranges():
    z = np.arange(36, dtype=float).reshape(6, 6)
    labels = [f"t{i}" for i in range(6)]
    p = pool(Panel(z, labels, labels), 3)
    assert p.z.shape == (3, 3) and p.z[0, 0] == z[:2, :2].max() and p.row_labels[0] == "t0–t1"


def test_isolation_verdict_isolated_for_recsys_not_for_causal():
    s = parse_query(LECTURE + "&candidate=1&perturbation=noise&delta=3")
    ours, causal = views.isolation_reading(s), views.isolation_reading(s, "causal")
    assert ours.isolated and ours.residual.value == ours.logits.value == 0.0
    assert not causal.isolated and causal.residual.value > 1e-4 and causal.logits.value > 1e-4
    assert causal.residual.where == causal.logits.where == "C2"     # under a causal mask only later candidates see C1
    assert "isolated" in views.verdict(ours) and "NOT isolated" in views.verdict(causal)
    # the perturbed candidate itself changes under both masks
    assert ours.logit_change[1] > 0 and causal.logit_change[1] > 0


def test_a_probe_added_to_the_registry_reaches_the_bug_zoo_table(monkeypatch):
    """One probe registry: an entry added to models.probes.PROBES is a column of the Variants tab's bug
    zoo table, flagged where its value passes its tolerance."""
    from models.probes import PROBES, Probe
    monkeypatch.setitem(PROBES, "output-size", Probe(lambda model, x, mask, off, **_: float(
        model(x, mask, off).embeddings.abs().max()), 1e-3, "is any output non-zero?"))
    try:
        _, text = views.bug_zoo_view(parse_query(LECTURE + "&seed=4242"))
    finally:
        runs.clear_caches()             # no cached report with the extra column outlives the test
    header = next(line for line in text.splitlines() if line.startswith("| bug |"))
    assert header.endswith("| isolation | causality | parity | output-size | flagged |")
    correct = next(line for line in text.splitlines() if line.startswith("| **none**") or line.startswith("| none"))
    assert correct.endswith("| output-size |"), correct


def test_isolation_holds_with_bidirectional_prefix_and_replacement():
    s = parse_query(LECTURE + "&prefix=bidirectional&perturbation=replace&replace_with=7&candidate=0")
    r = views.isolation_reading(s)
    assert r.mask_kind == "recsys-bidirectional" and r.isolated
    assert r.logit_change[0] > 0


def test_isolation_view_figure_matches_probe_numbers():
    s = parse_query(LECTURE + "&candidate=2")
    fig, bars, text = views.isolation_view(s)
    r = views.isolation_reading(s)
    assert_bit_exact(np.asarray(heatmaps(fig)[0].z, dtype=float), r.change, "same computation")
    assert_bit_exact(np.asarray(bars.data[0].y, dtype=float), r.logit_change, "same computation")
    assert text.startswith("**recsys: isolated — largest change on any other candidate: residual stream 0, logits 0")


def test_the_isolation_headline_names_each_quantity_and_agrees_with_its_figure():
    """One number per quantity, each named: the residual stream's is the heatmap's largest cell in another
    candidate's column (any layer), the logits' the bars' largest on another candidate; both printed on the
    figures. (The headline once printed the larger of the two as 'the largest change'.)"""
    s = parse_query(LECTURE + "&candidate=1")
    fig, bars, text = views.isolation_view(s)
    labels = s.layout.token_labels()
    others = [i for i in range(s.candidate_start_offset, s.seq_len) if i != s.candidate_start_offset + 1]
    causal_panel, causal_bars = heatmaps(fig)[1], bars.data[1]
    residual = float(np.nanmax(np.asarray(causal_panel.z, dtype=float)[:, others]))
    logits = max(float(causal_bars.y[i - s.candidate_start_offset]) for i in others)
    assert residual != logits                                    # two quantities, two numbers
    line = text.split("\n\n")[1]
    assert f"residual stream {residual:.6g} (C2)" in line and f"logits {logits:.6g} (C2)" in line, line
    titles = [a.text for a in fig.layout.annotations]
    assert f"causal mask: NOT isolated<br>largest on another candidate: {residual:.6g} (C2)" in titles, titles
    assert "recsys mask: isolated<br>largest on another candidate: 0" in titles, titles
    assert f"causal mask (largest on another candidate: {logits:.6g} (C2))" == causal_bars.name
    assert list(causal_bars.text) == [f"{v:.3g}" for v in causal_bars.y] and bars.data[0].text[0] == "0"
    assert causal_bars.x[1] == "C1 (perturbed)" and labels[s.candidate_start_offset + 1] == "C1"


@pytest.mark.parametrize("op", ["permute", "drop", "add"])
def test_batch_invariance_holds_without_sequential_rope(op):
    for mode in ("shared", "none"):
        b, a, pairs = views.invariance(parse_query(LECTURE + f"&rope_mode={mode}&operation={op}&candidate=1"))
        assert np.abs(a - b).max() < views.FP32_TOLERANCE, mode
        assert len(pairs) == (2 if op == "drop" else 3)


def test_sequential_rope_moves_scores_when_candidates_move():
    b, a, _ = views.invariance(parse_query(LECTURE + "&rope_mode=sequential&operation=permute"))
    assert np.abs(a - b).max() > 1e-3


def test_rope_view_angles_follow_the_formula():
    s = parse_query(LECTURE + "&rope_base=500&rope_offset=3")
    angle_fig, qk_fig, text = views.rope_view(s)
    z = np.asarray(heatmaps(angle_fig)[0].z)
    inv = 1.0 / 500 ** (np.arange(0, s.key_size, 2) / s.key_size)
    # the model's inv_freq is fp32 (exponent, power, reciprocal: three roundings), the angle 7 times it
    atol = 7 * rounding_bound(torch.float32, 1, depth=3)
    np.testing.assert_allclose(z[:, 4], np.mod((4 + 3) * inv, 2 * np.pi), rtol=0, atol=atol)
    assert qk_fig.data[0].y[0] == s.key_size                     # q = k = ones at distance 0: cos 0 = 1, exactly


def test_forward_is_cached_across_view_options():
    s1 = parse_query(LECTURE + "&head=1")
    s2 = parse_query(LECTURE + "&values=capped+logits&candidate=2")
    assert runs.forward(s1) is runs.forward(s2)
    assert runs.build_model(s1) is runs.build_model(s2)


def test_nbytes_counts_the_arrays_among_a_figures_labels_and_a_frozen_figure_counts_once(monkeypatch):
    """The caches count what they hold at each get and put (explorer.budget.nbytes): arrays and tensors deep in
    a figure's dicts and lists among its labels, each counted once; a frozen figure, which never changes, walks
    its traces once (that walk was 15 % of a lecture view's CPU, issue 34)."""
    from explorer import figures
    from explorer.budget import nbytes
    a, t = np.zeros((3, 4)), torch.zeros(5)
    value = {"x": ["a", "b", 1, 2.0, None, True], "z": [a, {"customdata": t, "name": "n"}], "k": (t, "label")}
    assert nbytes(value) == a.nbytes + t.numel() * 4
    fig = figures.bar_figure(["a", "b"], [1.0, 2.0], title="bars", segments=["U", "H"]).freeze()
    first = fig.held_bytes()
    calls = []
    monkeypatch.setattr(figures, "nbytes", lambda *args: calls.append(args) or 0)
    assert fig.held_bytes() == first and calls == []
    unfrozen = figures.bar_figure(["a", "b"], [1.0, 2.0], title="bars", segments=["U", "H"])
    unfrozen.held_bytes()
    assert len(calls) == 1                                   # a figure that may still change is counted as it is


@pytest.mark.parametrize("family", ["grok", "xrex"])
def test_models_of_one_geometry_share_its_weights_and_compute_as_a_copy_would(family):
    """Another RoPE mode or cap is another model over the same tensors (no copy, and counted once in the memory
    budget: explorer.budget.nbytes), and it computes the bits a model holding its own copy of the weights does."""
    from explorer.budget import nbytes
    from models.recsys import RecsysModel
    from models.xrex import XrexRecsys
    base = LECTURE + ("&family=xrex" if family == "xrex" else "")
    other = base + ("&logit_cap=10&cap_method=tanh" if family == "xrex" else "&rope_mode=none")
    s1, s2 = parse_query(base), parse_query(other)
    m1, m2 = runs.build_model(s1), runs.build_model(s2)
    assert m1 is not m2 and (m1.xrex != m2.xrex if family == "xrex" else m1.config != m2.config)
    assert [p.data_ptr() for p in m1.parameters()] == [p.data_ptr() for p in m2.parameters()]
    assert nbytes([m1, m2]) == nbytes(m1) == sum(p.numel() * 4 for p in m1.parameters())
    own = XrexRecsys(s2.xrex_config()) if family == "xrex" else RecsysModel(s2.recsys_config())
    own.load_state_dict(m2.state_dict())                     # copied in
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(own.parameters(), m2.parameters()))
    batch = runs.batch_for(s2)
    with torch.no_grad():
        assert_bit_exact(m2(batch).logits, own.eval()(batch).logits, "same computation")


@pytest.mark.parametrize("query", [LECTURE, LECTURE + "&family=xrex", "preset=lecture&weights=zeros&seed=3"])
def test_seeded_weights_are_those_of_a_model_built_and_then_initialised(query):
    """The explorer's seeded weights (drawn into unfilled memory, each parameter in place) are, bit for bit, those
    models.grok.init_params / models.recsys.init_recsys give a model constructed as usual."""
    from models.grok import init_params
    from models.recsys import RecsysModel, init_recsys
    from models.xrex import XrexRecsys
    s = parse_query(query)
    got = runs._initialised(s).state_dict()
    if s.family == "xrex":
        want = init_params(XrexRecsys(s.xrex_config()), s.weights, s.seed).state_dict()
    else:
        want = init_recsys(RecsysModel(s.recsys_config()), s.weights, s.seed).state_dict()
    assert list(got) == list(want)
    for name in want:
        assert_bit_exact(got[name], want[name], "same computation", name)


def test_a_cpu_runs_the_production_presets_only_inside_gpu_limits():
    """explorer.limits.limits_of("cuda") lets a benchmark run phoenix-prod's views on a CPU; outside it the CPU's
    own limits refuse the model by name, as a CPU Space does."""
    from explorer import limits
    from explorer.schema import ValidationError
    if torch.cuda.is_available():
        pytest.skip("a GPU's own limits admit phoenix-prod")
    with pytest.raises(ValidationError, match="emb_size: got 2560.*on CPU"):
        parse_query("preset=phoenix-prod")
    with limits.limits_of("cuda"):
        s = parse_query("preset=phoenix-prod")
        assert limits.max_params() == limits.GPU_MAX_PARAMS and s.seq_len == 1087
        with pytest.raises(ValidationError, match="emb_size: got 2560.*on CPU"):
            with limits.limits_of("cpu"):
                parse_query("preset=phoenix-prod")
        assert limits.limits_device() == "cuda"
    with pytest.raises(ValidationError, match="emb_size"):
        parse_query("preset=phoenix-prod")
    with pytest.raises(ValueError, match="limits_of: got 'tpu'"):
        with limits.limits_of("tpu"):
            pass


def test_heatmap_builder_log_scale_hovers_raw_values():
    z = np.array([[1e-6, 1e-2], [0.5, 1.0]])
    fig = heatmap_figure([Panel(z, ["a", "b"], ["a", "b"])], title="t", color="log")
    hm = heatmaps(fig)[0]
    assert_bit_exact(np.asarray(hm.customdata), z, "no rounding")
    assert_bit_exact(np.asarray(hm.z), np.log10(z), "same computation")
    assert "customdata" in hm.hovertemplate


def test_demo_weights_default_on_lecture_when_present():
    assert demo_transformer() is not None           # the weights ship with the repo
    s = parse_query("preset=lecture")
    assert s.weights == "demo"
    out = runs.forward(s)
    assert torch.isfinite(out.logits).all()


def test_variant_view_draws_the_variants_own_weights():
    s = parse_query(LECTURE + "&variant=mqa&seed=3")
    fig, _, text = views.variant_view(s)
    run = views.variants._variant_run("mqa", 3)
    hm = heatmaps(fig)
    assert len(hm) == len(run.out.layers) * run.out.layers[0].probs.shape[1]
    assert_bit_exact(np.asarray(hm[1].z, dtype=np.float32), run.out.layers[0].probs[0, 1].numpy(),
                     "same computation")
    assert "multi-query" in text


@pytest.mark.parametrize("name", ["gqa", "din-target-attention"])
def test_variant_view_uses_the_trained_weights_and_labels_the_recall_tokens(name):
    from models.recall import TRAINED_WEIGHTS, load_trained_variant, recall_example
    if not TRAINED_WEIGHTS.is_file():
        pytest.skip("run python -m models.train_variants")
    fig, _, text = views.variant_view(parse_query(LECTURE + f"&variant={name}&seed=5"))
    model = load_trained_variant(name)
    tokens, _, labels = recall_example(5, model.task)
    with torch.no_grad():
        probs = model.body(**model.body_inputs(tokens), record=True).layers[-1].probs[0, -1]    # [Tq, Tk] head H-1
    hm = heatmaps(fig)
    assert_bit_exact(np.asarray(hm[-1].z, dtype=np.float32), probs.numpy(), "same computation")
    assert [y.replace("\u200b", "") for y in hm[0].y][-1] == labels[-1] and labels[-1].startswith("?k")
    assert "trained" in fig.layout.title.text and "held-out accuracy" in text and labels[-1] in text
    if name == "gqa":                    # the trained decoder's layer 0 holds a previous-token head
        assert "looks one back at its own key" in text


def test_variant_view_falls_back_to_random_weights_and_says_so(monkeypatch, tmp_path):
    import models.recall
    monkeypatch.setattr(models.recall, "TRAINED_WEIGHTS", tmp_path / "missing.safetensors")
    views.variants._variant_run.cache_clear()
    try:
        fig, _, text = views.variant_view(parse_query(LECTURE + "&variant=mha"))
    finally:
        views.variants._variant_run.cache_clear()
    assert "random" in fig.layout.title.text and "No trained weights" in text
    assert heatmaps(fig)[0].y[0] == "t0"


def test_loss_figure_plots_every_curve_of_the_training_report():
    report = views.variant_training_report()
    if report is None:
        pytest.skip("run python -m models.train_variants")
    fig = views.variant_loss_figure(report, "mla")
    assert len(fig.data) == len(report["variants"])
    for trace, (name, r) in zip(fig.data, report["variants"].items()):
        assert trace.name.startswith(name + " · ")
        assert list(trace.x) == [s for s, _ in r["loss"]] and list(trace.y) == [v for _, v in r["loss"]]
        assert trace.line.width == (4 if name == "mla" else 1.5)
    assert str(report["steps"]) in fig.layout.title.text and report["date"][:10] in fig.layout.title.text


def test_bug_zoo_flags_the_unmasked_decoder_and_passes_the_port():
    fig, text = views.bug_zoo_view(parse_query(LECTURE + "&bug=unmasked-decoder"))
    rows = {line.split("|")[1].strip(" *"): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["none"].rstrip().endswith("| — |")
    assert "isolation" in rows["unmasked-decoder"].split("|")[-2]
    # the planted bug lets candidates see each other: C1 attends to C0 in layer 0
    z = np.asarray(heatmaps(fig)[0].z, dtype=float)
    s = parse_query(LECTURE)
    assert z[s.candidate_start_offset + 1, s.candidate_start_offset] > 0


from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402


@hsettings(max_examples=15, deadline=None)
@given(num_history=st.integers(0, 12), num_candidates=st.integers(2, 6), history_padding=st.integers(0, 3),
       candidate_padding=st.integers(0, 1), prefix=st.sampled_from(["causal", "bidirectional"]),
       rope=st.sampled_from(["sequential", "shared", "none"]), perturbation=st.sampled_from(["scale", "noise"]),
       seed=st.integers(0, 1000))
def test_isolation_is_exact_for_any_valid_layout(num_history, num_candidates, history_padding,
                                                 candidate_padding, prefix, rope, perturbation, seed):
    s = parse_query(f"{LECTURE}&num_history={num_history}&num_candidates={num_candidates}"
                    f"&history_padding={min(history_padding, num_history)}&candidate_padding={candidate_padding}"
                    f"&prefix={prefix}&rope_mode={rope}&perturbation={perturbation}&delta=3&seed={seed}")
    r = views.isolation_reading(s)
    assert r.isolated, views.verdict(r)
    assert r.change.shape == (s.num_layers, s.seq_len) and r.logit_change.shape == (s.num_candidates,)


def test_every_view_shows_the_selected_batch_row():
    """Inputs are generated for the whole batch; the heatmap, the query row, the isolation probe and
    the invariance scores all read row 2, and row 2 is a different sequence from row 0."""
    s = parse_query(LECTURE + "&batch_size=3&row=2&head=1&candidate=1&perturbation=noise&delta=5")
    out = runs.forward(s)
    assert out.logits.shape[0] == 3
    assert_beyond_rounding(out.embeddings[0], out.embeddings[2], n=1)               # another sequence
    fig, bars, _ = views.attention_view(s)
    (hm,) = shown(fig)
    assert_bit_exact(np.asarray(hm.z, dtype=np.float32), out.trunk.layers[0].probs[2, 1].numpy(),
                     "same computation")
    assert_bit_exact(np.asarray(bars.data[0].y, dtype=np.float64),
                     out.trunk.layers[0].probs[2, 1, s.query_position].numpy(), "same computation")
    assert "batch row 2 of 3" in fig.layout.title.text
    r = views.isolation_reading(s)
    assert r.isolated and r.logit_change[1] > 0
    alone = views.isolation_reading(parse_query(LECTURE + "&batch_size=3&row=0&candidate=1&perturbation=noise&delta=5"))
    assert_beyond_rounding(r.logit_change, alone.logit_change, n=1)      # another row, another sequence
    before, _, pairs = views.invariance(s)
    assert_bit_exact(before, out.logits[2].numpy()[[o for o, _ in pairs]], "same computation")


@pytest.mark.parametrize("operation", ["permute", "drop", "add"])
def test_batch_invariance_holds_in_every_row(operation):
    for row in range(3):
        b, a, _ = views.invariance(parse_query(LECTURE + f"&batch_size=3&row={row}&rope_mode=shared"
                                               f"&operation={operation}"))
        assert np.abs(a - b).max() < views.FP32_TOLERANCE


def test_panels_beside_the_first_do_not_repeat_its_row_labels():
    """Repeated y tick labels would print over the neighbouring panel's right edge."""
    fig = views.isolation_view(parse_query(LECTURE))[0]
    assert fig.layout.yaxis.showticklabels and fig.layout.yaxis2.showticklabels is False


def test_long_axes_tick_segment_starts_and_never_crowd():
    # phoenix-nano: 1 user + 1022 history + 64 candidates; ticks must name C0 and stay apart
    from explorer.figures import _sparse_ticks
    labels = ["U"] + [f"H{i}" for i in range(1022)] + [f"C{i}" for i in range(64)]
    segments = ["U"] + ["H"] * 1022 + ["C"] * 64
    for cols in (1, 2, 4):
        ticks = _sparse_ticks(labels, segments, cols)
        positions = [labels.index(v) for v in ticks["tickvals"]]
        assert ticks["ticktext"][0] == "U" and "C0" in ticks["ticktext"]
        assert 2 <= len(positions) <= 11
        assert min(b - a for a, b in zip(positions, positions[1:])) >= 50


def test_kernel_view_draws_and_counts_the_registry_tiles():
    """Each kernel panel is its KERNEL_TILINGS tile map at element resolution (3 where it computes a
    pair the mask hides), and the table's counts are kernel_work's for the same mask."""
    from models.masks import KERNEL_TILINGS, kernel_work
    s = parse_query(LECTURE + "&num_history=140&num_candidates=6&prefix=bidirectional&history_padding=2")
    fig, text = views.kernel_view(s)
    element, *kernels = heatmaps(fig)
    mask = views.layout_mask(s, s.mask_kind)
    np.testing.assert_array_equal(np.asarray(element.z) == 2, mask.dense()[0, 0].numpy())
    assert all(views.KERNEL_TILINGS[n].title in a.text for n, a in zip(views.KERNEL_ORDER, fig.layout.annotations[1:]))
    for name, hm in zip(views.KERNEL_ORDER, kernels):
        k = KERNEL_TILINGS[name]
        z = np.asarray(hm.z)
        t = k.tiles(mask)
        tile_of = t.classes[0].numpy()[np.arange(s.seq_len)[:, None] // k.block_q, np.arange(s.seq_len)[None] // k.block_kv]
        hidden_but_computed = k.computed(mask)[0].numpy() & ~mask.dense()[0, 0].numpy()
        np.testing.assert_array_equal(z, np.where(hidden_but_computed, 3, tile_of))
        w = kernel_work(k, mask)
        assert f"| {name} | {k.block_q}×{k.block_kv} | {w['run']} of {w['tiles']} " in text
        assert f"| {w['leaked']:,} |" in text
    assert "mask no padded key" in text and "multiples of 128" in text


# --- the production (2026) family: every view runs on models.xrex ---------------------------

XREX = "preset=lecture&family=xrex&history_padding=1&num_candidates=4"


def test_production_heatmaps_are_the_xrex_rankers_own_record():
    """The heatmap is layer 1's probabilities recorded by XrexRanker through models.attention.attend, on
    the trunk input the explorer built; the prefix attends both ways."""
    s = parse_query(XREX + "&head=2&layer=1")
    out = runs.forward(s)
    model = runs.build_model(s)
    with torch.no_grad():
        direct = model.ranker(out.embeddings, out.valid, record=True).layers[1].probs[0, 2]
    (hm,) = shown(views.attention_view(s)[0])
    assert_bit_exact(np.asarray(hm.z, dtype=np.float32), direct.numpy(), "same computation")
    P_L = s.candidate_start_offset
    assert (np.asarray(hm.z)[0, 1:P_L - 1] > 0).all()          # the user token sees the later history
    mask_panel = heatmaps(views.mask_view(s)[0])[0]
    assert np.asarray(mask_panel.z)[0, 1:P_L - 1].all()      # and the mask view says so


def test_production_isolation_invariance_and_positions():
    s = parse_query(XREX + "&perturbation=noise&delta=3")
    assert views.isolation_reading(s).isolated and not views.isolation_reading(s, "causal").isolated
    for op in ("permute", "drop", "add"):
        b, a, _ = views.invariance(parse_query(XREX + f"&operation={op}&candidate=1"))
        # right-anchored RoPE: invariant in real arithmetic, so at most rounding (a permuted candidate is
        # another row of every matmul; T changes with drop and add): the logits' forward bound
        assert_rounding_close(a, b, n=max(s.xrex_config().ffn_hidden, s.seq_len + 1), depth=6 * s.num_layers + 3)
    fig, text = views.invariance_view(s)
    assert [t.name for t in fig.data] == ["RoPE right-anchored"] and "by construction" in text
    positions = views.rope_positions(s)
    P, L = s.num_user, s.num_history
    assert positions[P + L - 2] == P + L - 1 and positions[P + L - 1] == 0     # last real event; padded slot
    assert (positions[P + L:] == P + L).all()                                   # every candidate at P + L
    _, _, rope_text = views.rope_view(s)
    assert "right-anchored" in rope_text


def test_production_bug_zoo_runs_its_own_quirks():
    from models.bugzoo import BUGS, bug_names
    s = parse_query(XREX + "&bug=serving-block-rounding")
    fig, text = views.bug_zoo_view(s)
    rows = views.variants._bug_report(s.model, 0)
    assert [r["bug"] for r in rows] == ["none", *bug_names("xrex")]
    for r in rows[1:]:
        assert BUGS[r["bug"]].probe in r["flagged"], r        # history padding and P+L = 6: both caught
    assert "isolation" not in rows[0]["flagged"] and "parity" not in rows[0]["flagged"]
    assert "causality, which flags the bidirectional prefix by design" in views.bug_zoo_view(
        parse_query(XREX))[1]


def test_production_bug_zoo_on_a_capped_layout():
    """Long layouts run the probes on a capped one; production's trunk keeps its P and takes the
    shorter history, and its quirks are still caught."""
    from models.bugzoo import BUGS
    s = parse_query("preset=lecture&family=xrex&num_history=40&history_padding=3")
    rows = views.variants._bug_report(s.model, 0)
    assert rows[0]["probe_positions"]["causality"] < s.seq_len
    for r in rows[1:]:
        assert BUGS[r["bug"]].probe in r["flagged"], r


@pytest.mark.parametrize("n", range(1, 65))
def test_grid_domains_stay_inside_the_figure_for_1_to_64_panels(n):
    """Fixed gaps pushed a 63-column grid's domains below zero (plotly refused the figure)."""
    z = np.ones((2, 2))
    for cols, panels in ((n, [Panel(z, ["a", "b"], ["a", "b"], f"p{i}") for i in range(n)]),
                         (max(1, n // 4), [None if i % 5 == 4 else Panel(z, ["a", "b"], ["a", "b"])
                                           for i in range(n)])):
        if all(p is None for p in panels):
            continue
        fig = heatmap_figure(panels, title="t", cols=cols)
        for axis in ("xaxis", "yaxis"):
            doms = sorted({tuple(v["domain"]) for k, v in fig.to_dict()["layout"].items()
                           if k.startswith(axis)})
            for lo, hi in doms:
                assert 0 <= lo < hi <= 1
            for (_, hi), (lo, _) in zip(doms, doms[1:]):
                assert hi <= lo + 1e-12                      # no overlap
            # the gaps take at most a quarter of the span: every panel keeps a readable share
            assert sum(hi - lo for lo, hi in doms) >= 0.6 * (doms[-1][1] - doms[0][0]) or len(doms) == 1


def test_every_head_grid_caps_its_columns_and_says_which_heads_it_shows():
    s = parse_query("preset=phoenix-nano&num_q_heads=56&num_kv_heads=8&num_layers=1")
    fig, _, _ = views.attention_view(s)        # raised a plotly domain error before the fix
    hms = heatmaps(fig)
    assert len(hms) == 14                      # two KV groups of 7 and a spacer: 15 <= GRID_MAX_COLS columns
    assert "query heads 0-13 of 56" in fig.layout.title.text
    for q, kv in ((4, 2), (56, 8), (64, 64), (64, 1), (16, 4), (32, 2)):
        heads = views.grid_heads(q, kv)
        G = q // kv
        cols = len(heads) + sum(1 for i, h in enumerate(heads) if i and h % G == 0)
        assert cols <= views.GRID_MAX_COLS and heads == list(range(len(heads)))
        assert len(heads) == q or cols + min(G, views.GRID_MAX_COLS) + 1 > views.GRID_MAX_COLS


def test_invariance_bars_draw_rounding_as_rounding_and_explain_the_operation():
    """Production's trunk adds a candidate: every change is fp32 rounding (or exactly 0), so the axis keeps
    its 1e-3 floor instead of stretching the noise to full height; each operation has its own explanation."""
    fig, text = views.invariance_view(parse_query("preset=lecture&family=xrex&operation=add"))
    largest = max(max(t.y) for t in fig.data)
    assert largest < views.FP32_TOLERANCE and fig.layout.yaxis.range[1] >= 1e-3 > 100 * largest
    assert all(label in ("0", "~0") for t in fig.data for label in t.text)
    texts = {op: views.invariance_view(parse_query(f"{LECTURE}&operation={op}&candidate=1"))[1]
             for op in ("permute", "drop", "add")}
    assert "**Permute**" in texts["permute"] and "**Drop** removes C1" in texts["drop"] and "**Add**" in texts["add"]
    fig, _ = views.invariance_view(parse_query(f"{LECTURE}&operation=permute"))
    assert fig.layout.yaxis.range[1] >= max(max(t.y) for t in fig.data)       # a real change is drawn whole


# hues a projector (or a colour-blind eye) shows alike
ALIKE = [{"#E69F00", "#D55E00"}, {"#0072B2", "#56B4E9"}]


def test_every_variant_curve_has_its_own_look_that_a_projector_tells_apart():
    """Ten loss curves: no two share a colour and dash, no two alike hues (orange and vermillion) share a dash,
    each carries its own marker symbol, and none is yellow (faint on white)."""
    report = views.variant_training_report()
    if report is None:
        pytest.skip("no committed variants-training.json")
    fig = views.variant_loss_figure(report)
    looks = [(t.line.color, t.line.dash or "solid", t.marker.symbol) for t in fig.data]
    assert len(looks) == len(report["variants"]) == len({(c, d) for c, d, _ in looks}) == len({m for *_, m in looks})
    hue = {c: next((i for i, group in enumerate(ALIKE) if c in group), c) for c, _, _ in looks}
    assert len({(hue[c], d) for c, d, _ in looks}) == len(looks), looks
    assert "#F0E442" not in {c for c, _, _ in looks} and all(t.mode == "lines+markers" for t in fig.data)


def test_anatomy_steps_label_their_keys_and_carry_the_segment_legend():
    _, steps, _, _ = views.anatomy_view(parse_query(LECTURE + "&query=7"))
    axes = sorted(k for k in steps.layout.to_plotly_json() if k.startswith("xaxis"))
    # the keys under the last panel; every panel shares its axis
    assert len(axes) == 5 and [bool(steps.layout[k].showticklabels) for k in axes] == [False] * 4 + [True]
    assert all(steps.layout[k].matches == "x" for k in axes[1:])
    assert {t.name for t in steps.data if t.showlegend is not False and t.name} >= {"user", "history", "candidate"}
    assert steps.layout.showlegend


def test_a_zoomed_grid_is_pooled_to_the_figure_payload_bound(monkeypatch):
    """With `zoom` set a figure still holds at most MAX_FIGURE_CELLS heatmap cells (16 layers x 8 heads x
    512 candidates unpooled is a 180 MB response); past it the panels pool and the title does not claim
    full resolution. Its bytes are counted in the view's cost."""
    from explorer import limits
    monkeypatch.setattr(views.panels, "MAX_FIGURE_CELLS", 50_000)         # read by cells()
    s = parse_query("preset=lecture&weights=random&num_candidates=200&zoom=candidates&head=-1")
    fig = views.attention_view(s)[0]
    shown = sum(np.asarray(t.z).size for t in heatmaps(fig))
    assert shown <= 50_000 and 8 * 200 * 200 > 50_000
    assert "zoom: candidates" in fig.layout.title.text and "full resolution" not in fig.layout.title.text
    assert views.VIEWS["attention"].estimate(s).peak_bytes >= 2 * limits.FIGURE_PEAK_BYTES


# --- masked pairs on every heatmap, and the kernels' tile grid ---------------------------------------

def overlays(fig):
    return [t for t in fig.data if t.type == "heatmap" and t.meta and t.meta.get("overlay")]


@pytest.mark.parametrize("query", ["preset=lecture&head=-1", "preset=lecture&head=3&layer=1",
                                   "preset=lecture&head=3&values=masked+logits", "preset=phoenix-2026-nano&head=0",
                                   "preset=lecture&head=1&zoom=candidates"])
def test_the_pairs_the_mask_hides_look_masked_on_the_attention_heatmaps(query):
    """Over weights and masked logits every hidden pair is drawn in the masked colour (a grey that neither
    Viridis nor RdBu holds, so 'exactly 0' never reads as 'a tiny weight'), named in the legend, and no
    allowed pair is; a small panel carries a × in each. Over capped logits (the values before the mask)
    the grey travels hidden, for the page to show with another kind."""
    from explorer.figures import MASKED_COLOUR, MASKED_NAME
    s = parse_query(query)
    fig, _, _ = views.attention_view(s)
    rows, cols = views.zoom_region(s)
    hidden = ~views.mask_dense(s, s.mask_kind)[np.ix_(rows, cols)]
    shown = [t for t in overlays(fig) if t.visible is not False]
    assert len(shown) == len(heatmaps(fig) if s.head < 0 else [1])
    for t in shown:
        z = np.asarray(t.z, dtype=bool)
        if len(rows) <= views.SINGLE_MAX_CELLS:                          # unpooled: pair for pair
            np.testing.assert_array_equal(z, hidden)
        assert t.colorscale[-1][1] == MASKED_COLOUR and t.colorscale[0][1] == "rgba(0,0,0,0)"
    assert any(t.name == MASKED_NAME and t.visible is not False for t in fig.data)
    if max(hidden.shape) <= 24 and s.head >= 0:
        assert np.array_equal(np.asarray(shown[0].text) == "×", hidden)
    capped, _, _ = views.attention_view(parse_query(query + "&values=capped+logits"))
    assert all(t.visible is False for t in overlays(capped))
    # the grey is no colour of the value scales
    import plotly.colors as pc
    for scale in ("Viridis", "RdBu"):
        assert MASKED_COLOUR.lower() not in {c.lower() for c in pc.get_colorscale(scale) for c in [c[1]]}
        assert all(pc.hex_to_rgb(MASKED_COLOUR) != pc.unlabel_rgb(c) if c.startswith("rgb") else True
                   for _, c in pc.get_colorscale(scale))


def test_a_planted_bug_shows_its_leaks_as_weights_not_as_masked():
    """The bug zoo's heatmap marks masked what the model's mask hides and the bugged model left at exactly 0:
    the faithful trunk's every hidden pair; under the unmasked decoder none — its C1 → C0 shows its weight."""
    s = parse_query("preset=lecture")
    fig, _ = views.bug_zoo_view(s)
    hidden = ~views.mask_dense(s, s.mask_kind)
    np.testing.assert_array_equal(np.asarray(overlays(fig)[0].z, dtype=bool), hidden)
    fig, _ = views.bug_zoo_view(parse_query("preset=lecture&bug=unmasked-decoder"))
    weights = np.asarray(heatmaps(fig)[0].z, dtype=float)
    c0, c1 = s.candidate_start_offset, s.candidate_start_offset + 1
    assert hidden[c1, c0] and weights[c1, c0] > 0 and not overlays(fig)


def test_the_kernel_tile_map_draws_the_tile_grid_crosses_each_skipped_tile_and_writes_its_counts():
    """phoenix-2026-nano: FA4's 9 x 9 tiles of 128, 8 lines each way, a cross (two strokes) over each of its
    8 skipped tiles; the panel titles carry the counts and shares the lesson quotes; run-with-a-mask and
    computed-but-masked are two hues (not orange and vermillion)."""
    from explorer.figures import TILE_SCALE, _step_colour
    s = parse_query("preset=phoenix-2026-nano")
    fig, _ = views.kernel_view(s)
    fa4 = next(i for i, a in enumerate(fig.layout.annotations) if a.text.startswith("FA4"))
    ax = "x" if fa4 == 0 else f"x{fa4 + 1}"
    paths = [sh.path for sh in fig.layout.shapes if sh.type == "path" and sh.xref == ax]
    grid, crosses = paths
    assert grid.count("M") == 16 and crosses.count("M") == 2 * 8
    assert fig.layout.annotations[fa4].text.endswith("72 full · 1 masked · 8 skipped<br>9.9% of the work skipped")
    assert fig.layout.annotations[0].text.endswith("11.1% of the pairs masked")
    assert {_step_colour(TILE_SCALE, 1 / 3), _step_colour(TILE_SCALE, 1.0)} == {"#E69F00", "#CC79A7"}
    names = [t.name for t in fig.data if t.type == "scatter"]
    assert "skipped (×) / masked" in names


def _count_plantings(monkeypatch) -> dict:
    """Each bug's plantings (models.bugzoo.BUGS[bug].patch: once a copy), counted."""
    import dataclasses
    from models import bugzoo
    planted = {}
    for name, bug in list(bugzoo.BUGS.items()):
        def patch(model, _name=name, _patch=bug.patch):
            planted[_name] = planted.get(_name, 0) + 1
            _patch(model)
        monkeypatch.setitem(bugzoo.BUGS, name, dataclasses.replace(bug, patch=patch))
    return planted


def test_a_models_bug_reports_and_bug_zoo_views_copy_it_once_per_bug(monkeypatch):
    """The bugged copies are kept beside the model (explorer.runs.bugged_trunk): two rows' reports and the view
    of a bug plant each bug in one copy of the model, not one a report and one a request."""
    from models.bugzoo import bug_names
    s = parse_query(LECTURE + "&seed=4343&batch_size=2&bug=rope-interleaved")
    planted = _count_plantings(monkeypatch)
    views.variants._bug_report(s.model, 0)
    views.variants._bug_report(s.model, 1)
    views.bug_zoo_view(s)
    views.bug_zoo_view(parse_query(LECTURE + "&seed=4343&batch_size=2&bug=rope-interleaved&row=1&head=2"))
    assert planted == {bug: 1 for bug in bug_names("grok")}


def test_a_kept_bugged_copy_goes_with_its_model(monkeypatch):
    """A bugged copy lives as long as its model in the weights' models (runs.Weights): the same copy while the
    model is kept, over the model's own tensors; evicting the model drops its copies, and nothing holds them."""
    import gc
    import weakref
    monkeypatch.setattr(runs, "MODELS_PER_WEIGHTS", 1)
    s = parse_query(LECTURE + "&seed=4344")
    buggy = runs.bugged_trunk(s, "unmasked-decoder")
    assert runs.bugged_trunk(s, "unmasked-decoder") is buggy
    assert runs.bugged_trunk(s, "none") is runs.build_model(s).transformer
    assert [p.data_ptr() for p in buggy.parameters()] == [p.data_ptr() for p in runs.build_model(s).transformer.parameters()]
    weights = runs._weights(tuple((k, getattr(s.model, k)) for k in runs._GEOMETRY))
    assert (s.model, "unmasked-decoder") in weights.bugged
    gone = weakref.ref(buggy)
    del buggy
    runs.build_model(parse_query(LECTURE + "&seed=4344&prefix=bidirectional"))     # another model over the weights
    gc.collect()
    assert s.model not in weights.models and not weights.bugged and gone() is None


def test_the_variant_view_is_drawn_once_per_variant_seed_and_training_report(monkeypatch, tmp_path):
    """What variant_view draws depends on the variant, the seed and the training report only: another head,
    layer or model draws nothing again (~30 ms of plotly a call); a changed report is drawn again."""
    import json
    drawn = []
    real = views.variants.heatmap_figure
    monkeypatch.setattr(views.variants, "heatmap_figure", lambda *a, **k: drawn.append(1) or real(*a, **k))
    first = views.variant_view(parse_query(LECTURE + "&variant=mla&seed=7"))
    again = views.variant_view(parse_query(LECTURE + "&variant=mla&seed=7&head=2&layer=1&prefix=bidirectional"))
    assert len(drawn) == 1 and again == first
    report = views.variant_training_report()
    if report is not None:
        steps = report["steps"] + 1
        (tmp_path / "variants-training.json").write_text(json.dumps({**report, "steps": steps}))
        monkeypatch.setattr(views.variants, "RESULTS_DIR", tmp_path)
        changed = views.variant_view(parse_query(LECTURE + "&variant=mla&seed=7"))
        assert len(drawn) == 2 and f"{steps} steps" in changed[1].layout.title.text


def test_a_views_estimate_is_kept_and_is_what_its_parts_cost():
    """View.estimate keeps what it worked out per (view, settings) — a server estimates each event's view at
    its admission and where it draws — and what it keeps is the parts' cost, every figure and the model
    counted: the same object for the same settings, another for other settings."""
    from dataclasses import replace
    from explorer import limits
    from explorer.views.records import Plot
    s = parse_query("preset=lecture&weights=random&num_history=9")
    for name in ("attention", "isolation", "invariance", "variants", "mask"):
        view = views.VIEWS[name]
        plots = sum(isinstance(o, Plot) for o in view.outputs)
        own = view.cost(s).holding(plots * limits.FIGURE_PEAK_BYTES)
        own = own.holding(limits.model_bytes(s), on_device=True) if view.needs_model else own
        assert view.estimate(s) == own and view.estimate(s) is view.estimate(s), name
        longer = view.estimate(replace(s, num_history=s.num_history + 40))
        assert longer.flops > own.flops and longer == view.estimate(replace(s, num_history=s.num_history + 40)), name
