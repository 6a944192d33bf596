"""The live timing sweeps by visitor: one stop flag per run, and the cancelled sweeps whose last step
is still in its thread (the next sweep waits for them)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Optional

from explorer.measure import Run
from explorer.limits import sweep_budget_s, sweep_turn_s
from explorer.timing import LiveRun

from .admission import ADMISSION

log = logging.getLogger("explorer")


class TimingRuns:
    """The live runs by visitor. Each run has its own stop flag (LiveRun): Stop cancels the visitor's
    runs, and a later Run makes a new flag, so it can never un-stop an old one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_session: dict[str, set] = {}
        self.threads = 0
        self.unfinished: set = set()        # cancelled sweeps' last steps, still in their threads

    def start(self, session: str, budget_s: Optional[float] = None) -> LiveRun:
        """A new run of `session`'s: its budget, and its turn while other visitors' sweeps wait (it then ends
        within one timed block, its points kept)."""
        run = LiveRun(sweep_budget_s() if budget_s is None else budget_s, yield_to=lambda: others_waiting(session),
                      turn_s=sweep_turn_s())
        with self.lock:
            self.by_session.setdefault(session, set()).add(run)
            log.info("timing sweep started; %d running", self.running())
        return run

    def end(self, session: str, run: Run) -> None:
        with self.lock:
            runs_here = self.by_session.get(session, set())
            runs_here.discard(run)
            if not runs_here:
                self.by_session.pop(session, None)
            log.info("timing sweep ended (%s); %d running", run.stopped() or "done", self.running())

    def running(self) -> int:
        return sum(len(runs_here) for runs_here in self.by_session.values())

    @contextlib.contextmanager
    def measuring(self):
        """Around each step of a sweep in its worker thread: counts the threads measuring right now
        (the log line is what the cancel-storm test reads)."""
        with self.lock:
            self.threads += 1
            log.info("timing sweep measuring; %d threads measuring", self.threads)
        try:
            yield
        finally:
            with self.lock:
                self.threads -= 1

    def cancel(self, session: str) -> str:
        """Stop the visitor's runs -> what Stop did, in a line ('' when nothing ran)."""
        with self.lock:
            runs_here = list(self.by_session.get(session, ()))
        for run in runs_here:
            run.cancel()
        notes = [f"Stopped after {r.done} of {r.total} lengths: the measured points are kept."
                 for r in runs_here if isinstance(r, LiveRun) and r.total]
        return " ".join(notes)

    def stopping(self, step) -> None:
        """A cancelled sweep's last step (an asyncio future), still in its thread: the next sweep waits."""
        with self.lock:
            self.unfinished.add(step)
        step.add_done_callback(lambda done: self.unfinished.discard(done))

    async def wait_stopped(self) -> None:
        """Until every cancelled sweep's thread has stopped (within one timed block): one sweep measures
        at a time however many are started and cancelled, and a cancel is answered at once."""
        while self.unfinished:
            with contextlib.suppress(Exception):
                await asyncio.shield(next(iter(self.unfinished)))


def others_waiting(session: str) -> int:
    """Timing sweeps of other pages waiting in the timing lane (server.admission's view of Gradio's queue)."""
    queue = ADMISSION.queues.get("timing", ())
    return sum(1 for event in list(queue)
               if getattr(event, "session_hash", None) != session and not getattr(event, "_pushed_out", False))


TIMING_RUNS = TimingRuns()
