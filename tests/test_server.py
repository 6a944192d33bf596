"""server/'s process policy and live-run bookkeeping: torch's threads set once from the environment,
the timing sweeps' stop flags by visitor."""
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
