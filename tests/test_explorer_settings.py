"""The one validation layer: every bad value is refused with field, value and what is allowed;
settings survive the URL round trip; every field either picks the model or only changes what is shown."""
import math
from dataclasses import fields, replace

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from explorer.controls import CONTROL_FIELDS
from explorer.families import preset_defaults
from explorer.limits import CPU_MAX_SEQ_LEN
from explorer.query_string import parse_query, retired_note, to_query
from explorer.schema import (FIELDS, MODEL_FIELDS, VIEW_FIELDS, WEIGHT_GEOMETRY, ModelSettings, Settings, Shown,
                            ValidationError, ViewOptions)
from explorer.settings import control_value, parse_settings, view_controls

BAD = [
    ("num_q_heads", "3", "multiple of num_kv_heads"),
    ("key_size", "15", "even"),
    ("num_candidates", "0", "at least one candidate"),
    ("delta", "nan", "finite"),
    ("delta", "inf", "finite"),
    ("multiplier", "-1", "> 0"),
    ("num_history", str(CPU_MAX_SEQ_LEN), "<="),
    ("preset", "gpt-5", "lecture"),
    ("cap_method", "sigmoid", "tanh"),
    ("rope_mode", "absolute", "sequential"),
    ("emb_size", "abc", "integer"),
    ("seed", "1.5", "integer"),
    ("history_padding", "9", "history"),
    ("candidate", "7", "candidate"),
    ("query", "99", "position"),
    ("layer", "2", "[0, 1]"),
    ("batch_size", "0", "[1, 8]"),
    ("batch_size", "9", "[1, 8]"),
    ("row", "1", "a row of the batch"),          # batch_size is 1
]


@pytest.mark.parametrize("field,value,allowed", BAD)
def test_bad_value_names_field_value_and_allowed(field, value, allowed):
    with pytest.raises(ValidationError) as e:
        parse_query(f"preset=lecture&weights=random&{field}={value}")
    msg = str(e.value)
    assert msg.startswith(f"{field}: got"), msg
    assert value in msg and "allowed:" in msg and allowed in msg, msg
    assert isinstance(e.value, ValueError)


def test_unknown_field_is_refused():
    with pytest.raises(ValidationError, match="settings: got 'bogus'"):
        parse_query("bogus=1")


def test_too_long_sequence_names_the_device_cap():
    with pytest.raises(ValidationError, match=f"num_history: got 2000; allowed: .*<= {CPU_MAX_SEQ_LEN} on CPU"):
        parse_settings({"preset": "lecture", "weights": "random", "num_history": 2000, "num_candidates": 100},
                       need_model=False)


def test_a_long_sequence_is_bounded_by_the_models_memory_not_its_length():
    """The CPU's limit on a model view is what it holds: production's 1152 tokens run at nano's size,
    and the same length with many heads and layers is refused by the field that makes it large."""
    s = parse_settings({"preset": "lecture", "weights": "random", "num_history": 1100, "num_candidates": 52})
    assert s.seq_len == 1153
    with pytest.raises(ValidationError, match=r"num_layers: got 16; allowed: layers x query heads x T\^2 within"):
        parse_settings({"preset": "lecture", "weights": "random", "num_history": 1100, "num_candidates": 52,
                        "num_layers": 16, "num_q_heads": 16, "num_kv_heads": 2})


def test_phoenix_prod_is_refused_on_cpu_with_reason():
    with pytest.raises(ValidationError, match="needs a GPU"):
        parse_query("preset=phoenix-prod")


def test_phoenix_nano_length_is_allowed():
    s = parse_query("preset=phoenix-nano")
    assert s.seq_len == 1087 and s.candidate_start_offset == 1023


def test_preset_alone_fills_every_field():
    for name in ("lecture", "lecture-003", "phoenix-nano"):
        s = parse_query(f"preset={name}")
        d = preset_defaults(name)
        assert all(getattr(s, k) == v for k, v in d.items()), name


def test_query_is_short_and_round_trips():
    s = parse_query("preset=lecture&num_candidates=4&multiplier=0.5&head=1&values=masked+logits")
    q = to_query(s)
    assert q.startswith("preset=lecture") and "emb_size" not in q
    assert parse_query(q) == s
    assert parse_query("?" + q) == s


@hsettings(max_examples=40, deadline=None)
@given(num_history=st.integers(0, 30), num_candidates=st.integers(1, 12), kv=st.sampled_from([1, 2, 4]),
       group=st.sampled_from([1, 2]), multiplier=st.floats(0.01, 4), rope=st.sampled_from(["sequential", "shared", "none"]),
       seed=st.integers(0, 10_000))
def test_valid_settings_round_trip(num_history, num_candidates, kv, group, multiplier, rope, seed):
    raw = dict(preset="lecture", weights="random", num_history=num_history, num_candidates=num_candidates,
               num_kv_heads=kv, num_q_heads=kv * group, multiplier=multiplier, rope_mode=rope, seed=seed)
    s = parse_settings(raw)
    assert parse_query(to_query(s)) == s
    assert s.seq_len == 1 + num_history + num_candidates


@hsettings(max_examples=60, deadline=None)
@given(field=st.sampled_from([f for f in CONTROL_FIELDS if f != "preset"]),
       value=st.one_of(st.text(max_size=30), st.floats(allow_nan=True, allow_infinity=True),
                       st.integers(-10**12, 10**12), st.none()))
def test_any_value_gives_settings_or_validation_error(field, value):
    """Never another exception, whatever arrives from the page or the API."""
    try:
        s = parse_settings({"preset": "lecture", "weights": "random", field: value})
    except ValidationError as e:
        assert str(e).startswith(f"{e.field}: got")
    else:
        assert isinstance(s, Settings)
        assert all(not isinstance(v, float) or math.isfinite(v) for v in s.to_dict().values())


def test_a_batch_too_big_to_record_names_the_batch_size():
    with pytest.raises(ValidationError, match=r"^batch_size: got 8; allowed: .*fewer rows"):
        parse_query("preset=phoenix-nano&batch_size=8")
    assert parse_query("preset=phoenix-nano&batch_size=2").batch_size == 2


# --- the model family --------------------------------------------------------------------

XREX_BAD = [
    ("family", "gpt", "grok, xrex"),
    ("prefix", "causal", "bidirectional with the production (2026) family"),
    ("rope_mode", "shared", "right-anchored with the production (2026) family"),
    ("weights", "zeros-ish", "random"),
    ("bug", "exact-gelu", "serving-padding"),          # grok.py's notebook bugs are not production's
    ("rope_offset", "3", "offset 0 with the production (2026) family"),
    ("rope_base", "10000.5", "an integer RoPE base"),
]


@pytest.mark.parametrize("field,value,allowed", XREX_BAD)
def test_production_family_refuses_what_it_does_not_have(field, value, allowed):
    with pytest.raises(ValidationError) as e:
        parse_query(f"preset=lecture&family=xrex&{field}={value}")
    assert e.value.field == field and str(e.value).startswith(f"{field}: got") and allowed in str(e.value)


def test_production_family_in_the_link_and_its_fixed_values():
    from explorer.settings import with_family
    s = parse_query("preset=lecture&family=xrex&history_padding=1")
    assert (s.family, s.prefix, s.rope_mode, s.weights, s.mask_kind) == (
        "xrex", "bidirectional", "right-anchored", "random", "recsys-bidirectional")
    assert to_query(s) == "preset=lecture&family=xrex&history_padding=1"     # what the family fixes is implied
    assert parse_query(to_query(s)) == s
    assert control_value(parse_query("preset=lecture&family=xrex&bug=serving-padding"), "bug") == "serving-padding"
    back = with_family(s, "grok")
    assert back == parse_query("preset=lecture&history_padding=1")
    assert with_family(back, "xrex") == replace(s, weights="demo")     # the trained demo exists for both families
    assert with_family(replace(back, weights="random"), "xrex") == s
    with pytest.raises(ValidationError, match="family: got 'nope'"):
        with_family(s, "nope")
    c = s.xrex_config()
    assert (c.num_user_prefix_tokens, c.history_seq_len, c.emb_size, c.qk_norm) == (s.num_user, s.num_history, 64, True)


def test_old_links_with_the_retired_backend_field_open():
    """The views have no backend field; a link that carries `backend=` opens (the field is dropped)
    instead of being refused as an unknown field."""
    assert "backend" not in FIELDS
    for value in ("flash_attn", "sdpa", "nonsense"):
        s = parse_query(f"preset=lecture&backend={value}&head=1")
        assert s == parse_query("preset=lecture&head=1") and "backend" not in to_query(s)
    assert "backend: ignored" in retired_note(["backend", "head"]) and retired_note(["head", "seed"]) == ""
    with pytest.raises(ValidationError, match="settings: got 'backends'"):
        parse_query("preset=lecture&backends=naive")          # only retired names are dropped


# --- production's presets in the app: they imply the family, links carry both ----------------------

@pytest.mark.parametrize("name", ["phoenix-2026", "phoenix-2026-nano", "phoenix-2026-seqpack"])
def test_a_production_preset_sets_production_family_and_its_geometry(name):
    """docs/originals.md §3 through models.presets.PRESETS: P = 2, L = 1022, 64 candidates padded to T = 1152, and
    the preset's own qk_norm / primer_norm / cap in the trunk the views build."""
    from models.presets import PRESETS
    preset = PRESETS[name].xrex_config()
    s = parse_query(f"preset={name}", need_model=False)        # the mask view's settings: on any device
    assert (s.family, s.prefix, s.rope_mode, s.mask_kind) == ("xrex", "bidirectional", "right-anchored",
                                                              "recsys-bidirectional")
    assert (s.num_user, s.num_history, s.seq_len, s.num_candidates - s.candidate_padding) == (2, 1022, 1152, 64)
    c = s.xrex_config()
    capped = preset.attn_logit_cap > 0                          # uncapped: cap method "none" in the app
    assert c == (preset if capped else preset.replace(attn_logit_cap=c.attn_logit_cap, attn_logit_cap_method="none"))
    assert s.attn_scale == preset.attn_scale and (s.cap_method != "none") == capped
    assert to_query(s) == f"preset={name}" and parse_query(to_query(s), need_model=False) == s


def test_production_presets_name_their_device_limit_and_nano_runs_on_cpu():
    """The full-size production presets are refused for model views by field, before anything runs;
    nano (T 1152) fits the CPU's memory and work budget."""
    from explorer.limits import check_budget
    from explorer.views import drawn_views
    for name in ("phoenix-2026", "phoenix-2026-seqpack"):
        with pytest.raises(ValidationError, match=r"emb_size: got 2560; allowed: .*needs a GPU"):
            parse_query(f"preset={name}")
    s = parse_query("preset=phoenix-2026-nano")
    for view in drawn_views():
        check_budget(s, view.name, view.estimate)


def test_preset_and_family_stay_consistent_and_links_carry_both():
    from explorer.settings import with_family
    with pytest.raises(ValidationError, match=r"family: got 'grok'; allowed: xrex .* choose the preset phoenix-nano"):
        parse_query("preset=phoenix-2026-nano&family=grok")
    # a 2025 preset opens on grok.py's family; the family control moves it, and the link says so
    lecture = parse_query("preset=lecture")
    assert lecture.family == "grok"
    moved = with_family(lecture, "xrex")
    assert to_query(moved) == "preset=lecture&family=xrex&weights=demo" and parse_query(to_query(moved)) == moved
    # a production preset implies its family: the link needs no family=, and leaving the family goes to
    # grok.py's preset of the same geometry, with grok.py's cap and multiplier back
    nano = parse_query("preset=phoenix-2026-nano&num_history=100&head=1")
    back = with_family(nano, "grok")
    assert (back.preset, back.family, back.num_history, back.head, back.cap_method) == (
        "phoenix-nano", "grok", 100, 1, "tanh")
    assert parse_query(to_query(back)) == back and "family" not in to_query(back)
    seqpack = with_family(parse_query("preset=phoenix-2026-seqpack", need_model=False), "xrex")
    assert (seqpack.cap_method, seqpack.logit_cap) == ("soft_sign", 80.0)       # its own cap is kept



def changed(s: Settings, f) -> Settings:
    """`s` with the field `f` (of ModelSettings or Shown) set to another value."""
    value = (ViewOptions((("operation", "permute"),)) if f.name == "view" else "other" if f.type == "str"
             else getattr(s, f.name) + 1)
    return replace(s, **{f.name: value})


def test_the_model_caches_key_on_the_model_part_alone():
    """The model caches (explorer.runs and the probes') key on Settings.model: a change of any field of the shown
    part (every view's own control among them, in Shown.view) keeps the key and reuses the recorded forward; a
    change of any field of the model part changes it. Both lists are read from the dataclasses, so a new field
    is covered; FIELDS, the link order, names each field of both parts but `view` once."""
    from explorer import runs
    assert sorted(FIELDS) == sorted({*MODEL_FIELDS, *VIEW_FIELDS} - {"view"}) and len(set(FIELDS)) == len(FIELDS)
    default = Settings()
    for f in fields(Shown):
        other = changed(default, f)
        assert other != default and hash(other) != hash(default), f.name
        assert other.model == default.model and runs.forward(other) is runs.forward(default), f.name
    for f in fields(ModelSettings):
        other = changed(default, f)
        assert other.model != default.model and other.shown == default.shown, f.name
    for c in view_controls():
        other = replace(default, view=ViewOptions(((c.name, "other"),)))
        assert other != default and other.model == default.model, c.name


def test_settings_are_made_and_changed_by_field_name():
    """Settings(field=...) and replace(s, field=...) set the field in its part, leave every other as it was, and
    refuse a name that is no field; settings made the same way are equal with one hash (the caches' keys)."""
    s = Settings(preset="phoenix-nano", seed=3, head=1, view=ViewOptions((("operation", "drop"),)))
    assert (s.model.preset, s.model.seed, s.shown.head, s.shown.view.get("operation", None)) == (
        "phoenix-nano", 3, 1, "drop")
    moved = replace(s, head=2, num_layers=3)
    assert (moved.head, moved.num_layers) == (2, 3)
    assert {n: getattr(moved, n) for n in FIELDS if n not in ("head", "num_layers")} == \
        {n: getattr(s, n) for n in FIELDS if n not in ("head", "num_layers")}
    assert Settings(s.model, s.shown) == s and hash(Settings(s.model, s.shown)) == hash(s)
    assert hash(parse_query(to_query(s))) == hash(parse_query(to_query(s)))
    assert Settings.preset == Settings().preset == "lecture"       # on the class: the default
    with pytest.raises(TypeError, match="bogus"):
        Settings(bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        replace(s, bogus=1)
    with pytest.raises(AttributeError):
        s.head = 3


def test_a_link_read_again_is_the_same_settings_and_its_checks_still_apply(monkeypatch):
    """parse_query keeps what it read (a server reads each event's query twice): the same link gives the same
    Settings object; the model's limits are checked at every read (a lower limit refuses a kept link), the
    layout's by the device whose limits apply; a refusal is raised at every read, and a link naming an upload
    is read against the visitor's uploads each time (percent-encoded too)."""
    from explorer import limits
    from explorer.query_string import _parsed_before
    q = "preset=lecture&seed=11&head=1"
    first = parse_query(q)
    assert parse_query(q) is first and parse_query(q) == parse_settings(dict(preset="lecture", seed=11, head=1))
    monkeypatch.setattr(limits, "max_params", lambda: 1)
    with pytest.raises(ValidationError, match="emb_size: got"):
        parse_query(q)
    assert parse_query(q, need_model=False) is first                # the layout alone: no model to fit
    monkeypatch.undo()
    hits = _parsed_before.cache_info().hits
    for _ in range(2):
        with pytest.raises(ValidationError, match="num_history"):
            parse_query(f"preset=lecture&num_history={CPU_MAX_SEQ_LEN + 1}")
    assert _parsed_before.cache_info().hits == hits                 # a refusal is never kept
    lecture = parse_query("preset=lecture")
    mine = {"mine": {f: getattr(lecture, f) for f in WEIGHT_GEOMETRY}}
    for link in ("preset=lecture&weights=upload:mine", "preset=lecture&weights=upl%6Fad%3Amine"):
        with pytest.raises(ValidationError, match="weights"):
            parse_query(link, uploaded={})
        assert parse_query(link, uploaded=mine).weights == "upload:mine"
