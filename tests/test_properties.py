"""Properties over random configurations (hypothesis, bounded and derandomised for CI):

- any valid configuration and layout keeps candidate isolation exact — perturbing candidate j's
  embedding changes no other position's output, bit for bit — and gives the documented shapes;
- any invalid value raises ValueError (the settings layer: ValidationError) naming the field, and
  never another exception type;
- the explorer's settings parser accepts or refuses every raw value it can be sent, and what it accepts
  round-trips through the URL query string and runs.
"""
import math
import re
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from models.grok import ROPE_MODES, Linear, TransformerConfig
from models.attention import CAP_METHODS
from models.masks import PREFIX_MODES
from models.recsys import ACTIONS, RecsysConfig, RecsysModel, SequenceLayout, init_recsys, synthetic_batch
from tolerances import assert_beyond_rounding, assert_bit_exact, assert_rounding_close, forward_bound, relative_error

# small and derandomised: the file runs in well under a minute on two cores
BOUNDED = settings(max_examples=50, deadline=None, derandomize=True, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(BOUNDED, max_examples=20)


# --- strategies: valid configurations ------------------------------------------------------

@st.composite
def transformer_configs(draw, backend="naive"):
    kv = draw(st.integers(1, 3))
    cap_method = "none" if backend == "sdpa" else draw(st.sampled_from(CAP_METHODS))
    return TransformerConfig(
        emb_size=draw(st.sampled_from([8, 16, 24])),
        key_size=draw(st.sampled_from([2, 4, 8])),
        num_q_heads=kv * draw(st.integers(1, 3)),
        num_kv_heads=kv,
        num_layers=draw(st.integers(1, 2)),
        widening_factor=draw(st.sampled_from([1.0, 2.0, 4.0])),
        attn_output_multiplier=draw(st.floats(0.05, 2.0)),
        logit_cap=draw(st.sampled_from([0.0, 5.0, 30.0])),
        cap_method=cap_method,
        rope_mode=draw(st.sampled_from(ROPE_MODES)),
        rope_offset=draw(st.integers(0, 50)),
        prefix=draw(st.sampled_from(PREFIX_MODES)),
    )


@st.composite
def layouts(draw, min_candidates=1):
    history = draw(st.integers(0, 6))
    candidates = draw(st.integers(min_candidates, 5))
    return SequenceLayout(num_user=draw(st.integers(1, 2)), num_history=history, num_candidates=candidates,
                          history_padding=draw(st.integers(0, history)),
                          candidate_padding=draw(st.integers(0, candidates)))


def ranking_model(config: TransformerConfig, layout: SequenceLayout, seed: int) -> RecsysModel:
    rc = RecsysConfig(config, hash_vocab_size=64, num_user_tokens=layout.num_user)
    return init_recsys(RecsysModel(rc), "random", seed).eval()


def perturbed(emb: torch.Tensor, position: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = emb.clone()
    out[:, position] += 3.0 * torch.randn(out[:, position].shape, generator=g)
    return out


# --- valid configurations: isolation and shapes ----------------------------------------------

@BOUNDED
@given(data=st.data(), backend=st.sampled_from(["naive", "structured", "sdpa"]), seed=st.integers(0, 2**16))
def test_perturbing_one_candidate_changes_nothing_else_bit_for_bit(data, backend, seed):
    config = data.draw(transformer_configs(backend), "config")
    layout = data.draw(layouts(), "layout")
    j = data.draw(st.integers(0, layout.num_candidates - 1), "candidate")
    model = ranking_model(config, layout, seed)
    batch = synthetic_batch(model.config, layout, seed=seed, batch=2)
    with torch.no_grad():
        emb, valid, off = model.embed(batch)
        # the layout decides padding (zero hashes); user tokens are never padded
        assert torch.equal(valid, layout.valid().expand(2, -1))
        base = model.score_embeddings(emb, valid, off, backend=backend)
        moved = model.score_embeddings(perturbed(emb, off + j, seed), valid, off, backend=backend)

    B, T, D, C = 2, layout.seq_len, config.emb_size, layout.num_candidates
    assert base.logits.shape == (B, C, len(ACTIONS))
    assert base.trunk.embeddings.shape == (B, T, D)
    assert off == layout.candidate_start_offset
    others = [p for p in range(T) if p != off + j]
    assert_bit_exact(moved.trunk.embeddings[:, others], base.trunk.embeddings[:, others], "isolation")
    other_cands = [c for c in range(C) if c != j]
    assert_bit_exact(moved.logits[:, other_cands], base.logits[:, other_cands], "isolation")
    if j < C - layout.candidate_padding:            # a real candidate: its own score does move
        # beyond the trunk's forward_bound plus the head's two stages (its norm, the unembedding)
        assert_beyond_rounding(moved.logits[:, j], base.logits[:, j], n=max(D, config.ffn_hidden, T),
                               depth=6 * config.num_layers + 3)
    assert torch.isfinite(base.logits).all()


@BOUNDED
@given(config=transformer_configs(), layout=layouts(), seed=st.integers(0, 2**16))
def test_recorded_weights_have_the_mask_shape_and_candidates_never_attend_each_other(config, layout, seed):
    model = ranking_model(config, layout, seed)
    with torch.no_grad():
        out = model(synthetic_batch(model.config, layout, seed=seed), record=True)
    T, off = layout.seq_len, layout.candidate_start_offset
    valid = layout.valid()
    assert len(out.trunk.layers) == config.num_layers
    for trace in out.trunk.layers:
        assert trace.probs.shape == trace.logits.shape == (1, config.num_q_heads, T, T)
        assert trace.after_attention.shape == trace.after_ffn.shape == (1, T, config.emb_size)
        assert_rounding_close(trace.probs.sum(-1), torch.ones(1, config.num_q_heads, T), n=T)
        cand = trace.probs[0, :, off:, off:]                                   # [Hq, C, C]
        off_diagonal = ~torch.eye(T - off, dtype=torch.bool)
        # masked keys are -1e30 before the softmax: exactly 0 after it
        for masked in (cand[:, off_diagonal], trace.probs[0, :, :off, off:],  # the prefix never sees candidates
                       trace.probs[0][..., ~valid]):                           # padded keys get nothing
            assert_bit_exact(masked, torch.zeros_like(masked), "isolation")


@FEW
@given(config=transformer_configs(), layout=layouts(min_candidates=2), seed=st.integers(0, 2**16),
       data=st.data())
def test_scores_follow_their_candidate_under_permutation_without_sequential_rope(config, layout, seed, data):
    assume(config.rope_mode != "sequential")
    perm = torch.tensor(data.draw(st.permutations(range(layout.num_candidates)), "perm"))
    layout = SequenceLayout(layout.num_user, layout.num_history, layout.num_candidates, layout.history_padding)
    model = ranking_model(config, layout, seed)
    batch = synthetic_batch(model.config, layout, seed=seed)
    with torch.no_grad():
        base, moved = model(batch).logits, model(batch.select_candidates(perm)).logits
    # exact in real arithmetic (the order changes only how fp32 sums are blocked): within the rounding bound of
    # the forward, its longest reduction the widest projection, the FFN or the sequence; +1 layer for the embedding
    widest = max(m.w.shape[0] for m in model.modules() if isinstance(m, Linear))
    bound = forward_bound(config.num_layers + 1, widest, config.ffn_hidden, layout.seq_len)
    assert relative_error(moved, base[:, perm]) <= bound


# --- invalid values: a ValueError naming the field, never another exception -----------------

NOT_A_NUMBER = [None, "4", [4], float("nan"), float("inf"), -float("inf"), True]
BAD_TRANSFORMER = {
    **{name: [0, -3, 2.0, *NOT_A_NUMBER]
       for name in ("emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers", "ffn_multiple_of")},
    "widening_factor": [0, -1.0, *NOT_A_NUMBER],
    "attn_output_multiplier": NOT_A_NUMBER,
    "logit_cap": NOT_A_NUMBER,
    "rope_base": [1.0, 0.5, -10, *NOT_A_NUMBER],
    "norm_eps": [0.0, -1e-5, *NOT_A_NUMBER],
    "cap_method": ["TANH", "", None, 3, ["tanh"]],
    "rope_mode": ["rotary", "", None, 0],
    "prefix": ["bidi", None, 1],
    "rope_offset": [1.5, "0", None, True, float("nan")],
}
BAD_LAYOUT = {name: [-1, 1.0, "2", None, True, float("inf")]
              for name in ("num_user", "num_history", "num_candidates", "history_padding", "candidate_padding")}


def raises_naming(fields, build):
    """build() must raise ValueError whose message starts with one of `fields`."""
    with pytest.raises(Exception) as info:
        build()
    assert isinstance(info.value, ValueError), f"{type(info.value).__name__}: {info.value}"
    named = str(info.value).split(":", 1)[0]
    assert named in fields, f"message names {named!r}, expected one of {sorted(fields)}: {info.value}"
    return info.value


@BOUNDED
@given(config=transformer_configs(), data=st.data())
def test_invalid_transformer_config_names_the_field(config, data):
    broken = data.draw(st.lists(st.sampled_from(sorted(BAD_TRANSFORMER)), min_size=1, max_size=2, unique=True))
    changes = {name: data.draw(st.sampled_from(BAD_TRANSFORMER[name]), name) for name in broken}
    raises_naming(set(broken), lambda: config.replace(**changes))


@BOUNDED
@given(config=transformer_configs(), odd=st.integers(0, 20).map(lambda n: 2 * n + 1),
       extra=st.integers(1, 5))
def test_relations_between_fields_are_refused_by_name(config, odd, extra):
    raises_naming({"key_size"}, lambda: config.replace(key_size=odd))
    kv = config.num_kv_heads + extra                         # q heads no longer a multiple of kv heads
    assume(config.num_q_heads % kv)
    raises_naming({"num_q_heads"}, lambda: config.replace(num_kv_heads=kv))


@BOUNDED
@given(layout=layouts(), data=st.data())
def test_invalid_layout_names_the_field(layout, data):
    name = data.draw(st.sampled_from(sorted(BAD_LAYOUT)))
    value = data.draw(st.sampled_from(BAD_LAYOUT[name]))
    fields = dict(num_user=layout.num_user, num_history=layout.num_history, num_candidates=layout.num_candidates,
                  history_padding=0, candidate_padding=0)
    raises_naming({name}, lambda: SequenceLayout(**{**fields, name: value}))
    too_many = layout.num_history + data.draw(st.integers(1, 5))
    raises_naming({"history_padding"}, lambda: SequenceLayout(**{**fields, "history_padding": too_many}))


@BOUNDED
@given(config=transformer_configs(), layout=layouts(), data=st.data())
def test_trunk_refuses_inputs_that_do_not_fit_by_name(config, layout, data):
    model = ranking_model(config, layout, 0)
    with torch.no_grad():
        emb, valid, off = model.embed(synthetic_batch(model.config, layout, seed=0))
    T, D = layout.seq_len, config.emb_size
    case = data.draw(st.sampled_from(["width", "rank", "mask", "offset", "backend", "mask_kind"]))
    trunk = model.transformer
    if case == "width":
        wrong = data.draw(st.integers(1, 40).filter(lambda d: d != D))
        raises_naming({"embeddings"}, lambda: trunk(torch.zeros(1, T, wrong), valid, off))
    elif case == "rank":
        raises_naming({"embeddings"}, lambda: trunk(emb[0], valid, off))
    elif case == "mask":
        wrong = data.draw(st.integers(1, 12).filter(lambda t: t != T))
        raises_naming({"mask"}, lambda: trunk(emb, torch.ones(1, wrong, dtype=torch.bool), off))
    elif case == "offset":
        bad = data.draw(st.one_of(st.integers(-50, -1), st.integers(T + 1, T + 50)))
        raises_naming({"candidate_start_offset"}, lambda: trunk(emb, valid, bad))
    elif case == "backend":
        raises_naming({"backend"}, lambda: trunk(emb, valid, off, backend=data.draw(st.text(max_size=8))))
    else:
        raises_naming({"mask kind"}, lambda: trunk(emb, valid, off, mask_kind="diagonal"))


# --- the explorer's one validation layer -----------------------------------------------------

@pytest.fixture(scope="module")
def explorer():
    """The app's own parser and model builder: explorer.schema, .settings, .limits, .query_string and .runs."""
    from explorer import limits, query_string, runs, schema, settings as settings_mod
    return SimpleNamespace(schema=schema, settings=settings_mod, limits=limits, query_string=query_string, runs=runs)


def field_names(explorer):
    """Every control's name: the Settings fields and the views' own controls (explorer.settings.view_controls)."""
    return (list(explorer.schema.FIELDS)
            + [c.name for c in explorer.settings.view_controls()])


# anything a URL, a form or a gradio_client caller can send
WILD = st.one_of(
    st.none(), st.booleans(), st.integers(-10**30, 10**30), st.integers(-3, 20),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", " 3 ", "1e400", "-0", "0x10", "nan", "inf", "x" * 10_000, "lecture", "recsys",
                     "tanh", "naive", "demo", "upload:", "upload:../../etc/passwd", "é\u202e\x00"]),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=1),
)
MESSAGE = re.compile(r"^(?P<field>[\w ]+): got .+; allowed: .+", re.S)


def assert_clear(error, names, *expected):
    """A ValidationError whose message reads 'field: got value; allowed: ...', short and traceback-free."""
    assert isinstance(error, ValueError), f"{type(error).__name__}: {error}"
    text = str(error)
    m = MESSAGE.match(text)
    assert m, f"unclear message: {text[:300]!r}"
    assert m["field"] in (set(names) | {"settings"}), text[:300]
    if expected:
        assert m["field"] in expected, f"expected {expected} named: {text[:300]}"
    assert len(text) < 1500 and "Traceback" not in text


@BOUNDED
@given(data=st.data())
def test_settings_parser_accepts_or_refuses_anything_by_name(explorer, data):
    names = field_names(explorer)
    keys = data.draw(st.lists(st.sampled_from(names + ["unknown_field"]), max_size=5, unique=True), "keys")
    raw = {k: data.draw(WILD, k) for k in keys}
    try:
        s = explorer.settings.parse_settings(raw)
    except Exception as e:                          # noqa: BLE001 — the property is about the type
        assert_clear(e, names)
        assert isinstance(e, explorer.schema.ValidationError)
    else:
        assert isinstance(s, explorer.schema.Settings)
        assert s.seq_len <= explorer.limits.max_seq_len()


def bad_values_for(name: str) -> list:
    """Values refused for `name` whatever the other fields hold."""
    universal = [float("nan"), float("inf"), "-inf", "abc", "x" * 10_000, [1], True, 10**30, -10**30, "1e400"]
    if name == "delta":
        return universal + [-1e7]
    if name in ("preset", "cap_method", "prefix", "weights", "rope_mode", "backend", "values", "color",
                "perturbation", "operation", "compare"):
        return universal + ["", "upload:nothing", 3]
    return universal + [-5, 2.5 if name not in ("widening_factor", "multiplier", "logit_cap", "rope_base")
                        else -2.5]


SMALL = dict(preset="lecture", weights="random", num_history=4, num_candidates=3, emb_size=16, key_size=4)


@BOUNDED
@given(data=st.data())
def test_settings_parser_names_the_one_bad_field(explorer, data):
    names = field_names(explorer)
    name = data.draw(st.sampled_from(names), "field")
    value = data.draw(st.sampled_from(bad_values_for(name)), "value")
    as_text = data.draw(st.booleans(), "as_text")              # URL values arrive as strings
    raw = {**SMALL, name: str(value) if as_text and not isinstance(value, str) else value}
    with pytest.raises(Exception) as info:
        explorer.settings.parse_settings(raw)
    assert_clear(info.value, names, name)
    assert isinstance(info.value, explorer.schema.ValidationError) and info.value.field == name


def test_every_field_refuses_lists_and_dicts_by_name(explorer):
    """Not sampled: every field meets every structured value (a list or a dict is unhashable; the
    parser once raised TypeError for preset=[] where hypothesis had only tried strings)."""
    names = field_names(explorer)
    for name in names:
        for value in ([], [1], ["lecture"], {}, {"a": 1}, (1,), b"lecture"):
            with pytest.raises(Exception) as info:
                explorer.settings.parse_settings({**SMALL, name: value})
            assert_clear(info.value, names, name)
            assert isinstance(info.value, explorer.schema.ValidationError) and info.value.field == name, (name, value)


@st.composite
def small_settings(draw):
    kv = draw(st.integers(1, 2))
    q = kv * draw(st.integers(1, 2))
    history = draw(st.integers(0, 5))
    candidates = draw(st.integers(1, 4))
    cand_pad = draw(st.integers(0, candidates - 1))
    layers = draw(st.integers(1, 2))
    raw = dict(preset="lecture", weights=draw(st.sampled_from(["random", "zeros"])), seed=draw(st.integers(0, 99)),
               num_user=draw(st.integers(1, 2)), num_history=history, num_candidates=candidates,
               history_padding=draw(st.integers(0, history)), candidate_padding=cand_pad,
               emb_size=draw(st.sampled_from([8, 16])), key_size=draw(st.sampled_from([2, 4, 8])),
               num_q_heads=q, num_kv_heads=kv, num_layers=layers,
               multiplier=draw(st.floats(0.05, 2.0)), cap_method=draw(st.sampled_from(CAP_METHODS)),
               logit_cap=draw(st.sampled_from([0.0, 5.0, 30.0])), prefix=draw(st.sampled_from(PREFIX_MODES)),
               rope_mode=draw(st.sampled_from(ROPE_MODES)), rope_offset=draw(st.integers(0, 9)),
               layer=draw(st.integers(0, layers - 1)), head=draw(st.integers(-1, q - 1)),
               candidate=draw(st.integers(0, candidates - cand_pad - 1)), delta=draw(st.floats(-100, 100)))
    if draw(st.booleans()):                                      # the URL path: every value as text
        raw = {k: repr(v) if isinstance(v, float) else str(v) for k, v in raw.items()}
    return raw


@FEW
@given(raw=small_settings())
def test_valid_settings_round_trip_and_keep_candidates_isolated(explorer, raw):
    runs = explorer.runs
    s = explorer.settings.parse_settings(raw)
    assert explorer.query_string.parse_query(explorer.query_string.to_query(s)) == s
    model = runs.build_model(s)
    batch = runs.batch_for(s)
    with torch.no_grad():
        emb, valid, off = model.embed(batch)
        base = model.score_embeddings(emb, valid, off)
        moved = model.score_embeddings(perturbed(emb, off + s.candidate, s.seed), valid, off)
    others = [c for c in range(s.num_candidates) if c != s.candidate]
    assert base.logits.shape == (1, s.num_candidates, model.config.num_actions)
    assert_bit_exact(moved.logits[:, others], base.logits[:, others], "isolation")
    assert math.isfinite(float(base.logits.abs().max()))
