"""Settings that keep their valid parts: the page's controls (an invalid one falls back to its last valid
value, every control involved is marked) and shared links (a bad value dropped, the rest kept), in the
labels a visitor sees."""
import re
from dataclasses import replace

import pytest

from explorer.controls import CONTROL_FIELDS, LABELS, as_typed, from_link, keep_valid, last_valid_note, short_label
from explorer.query_string import parse_query
from explorer.schema import ValidationError
from explorer.settings import all_values, parse_settings

RANDOM = parse_query("preset=lecture&weights=random", need_model=False)


def page_values(s, **changes):
    return {**all_values(s), **changes}


def test_a_shape_two_controls_make_invalid_marks_both_and_draws_the_last_valid_settings():
    """8 query heads (valid with 2 KV heads), then 3 KV heads: 8 % 3 != 0 involves both controls."""
    last = replace(RANDOM, num_q_heads=8)
    s, problems = keep_valid(page_values(last, num_kv_heads=3), last)
    assert s == last
    assert set(problems) == {"num_q_heads", "num_kv_heads"}
    assert all(m.startswith("query heads: got 8") and "KV heads = 3" in m for m in problems.values())
    assert "figures show the last valid settings" in last_valid_note(problems)


def test_an_invalid_control_keeps_its_last_value_and_every_other_change_is_drawn():
    s, problems = keep_valid(page_values(RANDOM, key_size=7, rope_offset=100, values="capped logits"), RANDOM)
    assert (s.key_size, s.rope_offset, s.values) == (16, 100, "capped logits")
    assert set(problems) == {"key_size"} and problems["key_size"].startswith("key size: got 7")


@pytest.mark.parametrize("empty", [None, "", "  "])
def test_an_emptied_number_box_is_flagged_not_silently_reset(empty):
    s, problems = keep_valid(page_values(RANDOM, seed=empty, num_history=7), RANDOM)
    assert s.seed == RANDOM.seed and s.num_history == 7
    assert set(problems) == {"seed"} and problems["seed"].startswith("seed: empty")


def test_when_the_last_valid_values_fail_too_the_last_settings_are_drawn():
    """A view field out of range after the geometry it depends on is restored: nothing to repair."""
    last = replace(RANDOM, layer=1)
    s, problems = keep_valid(page_values(last, num_layers=1), last)
    assert s == last and {"layer", "num_layers"} <= set(problems)


def test_messages_use_the_labels_on_screen_not_field_names():
    last = replace(RANDOM, num_q_heads=8)
    cases = [page_values(last, num_kv_heads=3), page_values(RANDOM, history_padding=9),
             page_values(RANDOM, candidate_padding=3), page_values(RANDOM, batch_size=2, row=5),
             page_values(RANDOM, key_size=7), page_values(RANDOM, rope_base=-1)]
    for values in cases:
        _, problems = keep_valid(values, last)
        assert problems
        for message in problems.values():
            assert not re.search(r"\b[a-z]+_[a-z_]+\b", message.split("got", 1)[1]), message
            assert message.split(":")[0] in {short_label(f) for f in LABELS}, message


def test_a_link_with_one_bad_value_keeps_the_rest():
    s, problems = from_link({"preset": "phoenix-2026-nano", "family": "grok"})
    assert (s.preset, s.family) == ("phoenix-2026-nano", "xrex") and set(problems) == {"family"}
    assert problems["family"].startswith("model family: got 'grok'")
    s, problems = from_link({"preset": "phoenix-nano", "num_q_heads": "5", "seed": "7", "head": "1", "tab": "anatomy"})
    assert (s.preset, s.seed, s.head, s.num_q_heads) == ("phoenix-nano", 7, 1, 4) and set(problems) == {"num_q_heads"}
    s, problems = from_link({"preset": "nope", "seed": "3"})
    assert (s.preset, s.seed) == ("lecture", 3) and set(problems) == {"preset"}


def test_a_hostile_value_in_a_link_cannot_become_a_link_in_a_controls_info_line():
    """Gradio renders a control's info as escaped text plus a mini-Markdown with [text](url) links."""
    _, problems = from_link({"seed": "[Sign in](//evil.example)"})
    assert "](" not in problems["seed"]


def test_a_bug_of_the_other_family_names_the_family_to_switch_to():
    with pytest.raises(ValidationError) as e:
        parse_settings({"preset": "lecture", "bug": "serving-padding"}, need_model=False)
    assert e.value.field == "bug" and e.value.also == ("family",) and "switch the model family" in str(e.value)
    s, problems = keep_valid(page_values(RANDOM, bug="serving-padding"), RANDOM)
    assert s == RANDOM and "production" in problems["bug"]


def test_every_control_has_a_label():
    assert set(LABELS) == set(all_values(RANDOM)) == set(CONTROL_FIELDS)


def test_keyboard_steps_stay_inside_the_model_and_the_sequence():
    from explorer.controls import step_view
    s = RANDOM                                   # lecture: T = 9, 4 query heads, 2 layers; query -1 = C0 (6)
    assert step_view(s, "query+").query == 7 and step_view(s, "query-").query == 5
    assert step_view(replace(s, query=8), "query+").query == 8 and step_view(replace(s, query=0), "query-").query == 0
    assert step_view(s, "head+").head == 0 and step_view(s, "head-").head == -1
    assert step_view(replace(s, head=3), "head+").head == 3
    assert step_view(s, "layer+").layer == 1 and step_view(replace(s, layer=1), "layer+").layer == 1
    for key in ("query+", "head+", "layer+", "query-", "head-", "layer-"):
        assert parse_settings(step_view(s, key).to_dict(), need_model=False) == step_view(s, key)    # still valid
    with pytest.raises(ValidationError, match="key: got"):
        step_view(s, "sideways")


def test_a_message_says_the_number_as_it_was_typed():
    """A number box sends 1e9 as 1000000000 (a lecturer read 'got 9' once a keystroke was lost): the message
    reads it back as typed, and says why it is not allowed."""
    _, problems = keep_valid(page_values(RANDOM, candidate=1e9), RANDOM)
    assert problems["candidate"].startswith("candidate j: got 1e9; allowed: an integer in [0, 2]")
    assert [as_typed(v) for v in (1000000000, -1, 7, 2.5, 1234567, 1e-7, "x")] == \
        ["1e9", "-1", "7", "2.5", "1234567", "1e-7", "'x'"]
