"""server/'s process policy and live-run bookkeeping: torch's threads set once from the environment,
the timing sweeps' stop flags by visitor, a page's superseded redraws."""
import pytest
import torch

from explorer.schema import ValidationError
from server import memory
from server.timing_runs import TimingRuns


def test_threads_are_configured_once_from_the_environment(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(memory.THREADS_ENV, "1")
        assert memory.configure_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv(memory.THREADS_ENV, "many")
        with pytest.raises(ValidationError, match="EXPLORER_THREADS: got 'many'; allowed: an integer in"):
            memory.configure_threads()
    finally:
        torch.set_num_threads(before)


def test_timing_runs_stop_a_visitors_run_and_say_how_far_it_got():
    runs = TimingRuns()
    mine, theirs = runs.start("a", budget_s=None), runs.start("b", budget_s=None)
    mine.total, mine.done = 4, 1
    assert runs.running() == 2
    assert runs.cancel("a") == "Stopped after 1 of 4 lengths: the measured points are kept."
    assert mine.stopped() == "cancelled" and theirs.stopped() is None
    runs.end("a", mine)
    assert runs.running() == 1 and runs.cancel("a") == ""
    later = runs.start("a", budget_s=None)          # a new run has its own flag: never un-stops the old
    assert later.stopped() is None and mine.stopped() == "cancelled"
    with runs.measuring():
        assert runs.threads == 1
    assert runs.threads == 0


def test_a_superseded_page_redraw_draws_nothing_and_leaves_every_output_as_it_is(monkeypatch):
    """A page's redraw that waited while the page sent a newer one answers with every output skipped (the
    newer one draws), however it was asked for: a change, a click, a preset, a tab; a current one draws."""
    from types import SimpleNamespace

    import gradio as gr
    from gradio.context import LocalContext

    from explorer.controls import CONTROL_FIELDS
    from server import admission, endpoints
    gate = admission.Admission()
    monkeypatch.setattr(endpoints, "ADMISSION", gate)
    page = ("addr:192.0.2.1", "lecturer")
    old, _ = gate.admit("forward", page, lambda: ([], []), redraw=True)
    new, _ = gate.admit("forward", page, lambda: ([], []), redraw=True)

    def asked(number):
        http = SimpleNamespace(state=SimpleNamespace(redraw=(page, number)))
        return SimpleNamespace(request=http, session_hash="lecturer", headers={}, client=None, username=None)
    token = LocalContext.request.set(asked(old))
    try:
        for out, n in ((endpoints.render_tab("preset=lecture", "mask"), endpoints.VIEW_OUTPUTS),
                       (endpoints.preset_on_page("lecture", "mask"), endpoints.SOURCE_OUTPUTS),
                       (endpoints.pick_on_page(None, "query=1", *([None] * len(CONTROL_FIELDS)), "mask", "preset=lecture"),
                        endpoints.CHANGE_OUTPUTS)):
            assert len(out) == n and all(o == gr.skip() for o in out)
    finally:
        LocalContext.request.reset(token)
    token = LocalContext.request.set(asked(new))
    try:
        drawn = endpoints.render_tab("preset=lecture", "mask")
        assert len(drawn) == endpoints.VIEW_OUTPUTS and any(o != gr.skip() for o in drawn)
    finally:
        LocalContext.request.reset(token)
