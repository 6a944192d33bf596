"""The live timing view: lengths are validated, a sweep stops on request or at its budget, error is
measured against naive, and committed result files are labelled with their device."""
import pytest

from explorer import timing
from explorer.settings import ValidationError, parse_query

S = parse_query("preset=lecture&weights=random")


@pytest.mark.parametrize("text,match", [("", "between 1 and 12"), ("64, x", "whole numbers"),
                                        ("1", r"\[2, 1087\]"), ("64," * 13, "between 1 and 12")])
def test_bad_lengths_name_the_field(text, match):
    with pytest.raises(ValidationError, match="lengths: got .*" + match):
        timing.parse_lengths(text)


def test_lengths_sorted_unique():
    assert timing.parse_lengths("64; 16, 64") == [16, 64]


def test_sweep_measures_naive_and_structured_against_naive():
    sw = timing.sweep(S, [16, 24], ["naive", "structured", "flash_attn"], min_time_s=0.01)
    got = {(p.backend, p.seq_len) for p in sw.points}
    assert got == {("naive", 16), ("naive", 24), ("structured", 16), ("structured", 24)}
    assert all(p.max_abs_error < 1e-5 for p in sw.points) and "flash_attn" in sw.skipped
    assert all(p.ms > 0 for p in sw.points)


def test_sweep_stops_when_asked_and_at_budget():
    assert "cancelled" in timing.sweep(S, [16], ["naive"], should_stop=lambda: True).stopped
    sw = timing.sweep(S, [16, 32], ["naive"], budget_s=1e-9)
    assert "budget" in sw.stopped and not sw.points


def test_recorded_files_are_labelled_with_device_and_date():
    for f in timing.recorded_results():
        assert f["device"] and f["date"] and f["gpu"] == (not f["device"].upper().startswith("CPU"))
    summary = timing.recorded_summary()
    assert "not measured now" in summary or "No recorded" in summary
