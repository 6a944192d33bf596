"""The live timing sweeps: one measurement per measurement key (explorer.timing.measurement_key) however many
visitors ask for it — a class pressing Run on the same lecture step watches one sweep — one measuring at a time,
and a just-finished one kept a minute to answer the same request again, labelled with its age."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator, Optional

from explorer import budget, timing
from explorer.limits import sweep_budget_s, sweep_turn_s
from explorer.schema import Settings
from explorer.timing import LiveRun, Sweep

from .admission import ADMISSION
from .guard import guarded

log = logging.getLogger("explorer")

# a finished sweep answers a Run of its key this long, labelled "measured N s ago" (a visitor who saw it
# measures anew); at most RECENT_KEPT are kept, records only (a few kB each: no tensor, nothing for
# explorer.budget's ceiling to count)
RECENT_S = 60.0
RECENT_KEPT = 16
# how often a watcher of a sweep not started yet checks that the Run it joined still waits in the timing lane
WATCH_POLL_S = 1.0
# a sweep past this length yields to small requests (runs at a lower CPU priority); a small one (milliseconds a
# step) would only wait behind them, holding the lane of one sweep at a time
SMALL_SWEEP_MAX_LEN = 256

_serials = itertools.count()


@dataclass(eq=False)
class Watch:
    """One visitor's Run watching a measurement; `left` once it stopped watching (Stop, a new Run)."""
    session: str
    left: bool = False


class Shared:
    """One measurement and the Runs watching it: its run (stop flag, budget and turn, made when it starts to
    measure), its latest state (a copy per step: watchers never read what the worker thread writes) and its
    version, and whether it finished, was cancelled (nobody watches) or failed."""

    def __init__(self, key: tuple, s: Settings, req: timing.Request):
        self.key, self.s, self.req, self.serial = key, s, req, next(_serials)
        self.run: Optional[LiveRun] = None
        self.state: Optional[Sweep] = None
        self.version = 0
        self.error: Optional[BaseException] = None
        self.cancelled = self.finished = False
        self.finished_at = 0.0
        self.watches: set[Watch] = set()
        self.seen_by: set[str] = set()          # sessions it answered: a kept sweep is measured anew for them
        self.changed = asyncio.Event()
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    @property
    def started(self) -> bool:
        return self.run is not None

    def sessions(self) -> set[str]:
        return {w.session for w in list(self.watches)}       # (a Stop may change it from another thread)

    def wake(self) -> None:
        """(on its event loop) Every watcher looks again."""
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class TimingRuns:
    """The measurements live (running, or waiting to start) by key, the finished ones kept by key, and what
    each visitor watches (Stop and a new Run reach it). A measurement runs in a task of its own, not in any
    visitor's event: one visitor's Stop leaves it going for the others, and it is cancelled when nobody watches
    (it then ends within one timed block, its points kept). The next starts only once the last one's worker
    thread has returned, so one sweep measures at a time however many are started, joined and cancelled."""

    def __init__(self):
        self.lock = threading.Lock()        # Stop and a new Run's admission reach it from Gradio's threads
        self.live: dict[tuple, Shared] = {}
        self.recent: collections.OrderedDict[tuple, Shared] = collections.OrderedDict()
        self.by_session: dict[str, set[Shared]] = {}
        self.threads = 0
        self.unfinished: set = set()        # measuring tasks, each until its worker thread's last step returned

    def running(self) -> int:
        """Measurements running now (started, not finished)."""
        with self.lock:
            return sum(1 for e in self.live.values() if e.started and not e.finished)

    def joinable(self, key: tuple, session: str) -> bool:
        """Whether a Run of `key` from `session` would be answered by a measurement that other visitors watch
        (running, or about to start) or one kept that `session` has not seen (the admission then gives it no
        place in the timing lane). A visitor's own sweep alone is no such: its Run again replaces it, and
        queues in the timing lane as before."""
        with self.lock:
            self._forget_old()
            live, kept = self.live.get(key), self.recent.get(key)
            return (live is not None and bool(live.sessions() - {session})
                    or kept is not None and session not in kept.seen_by)

    async def follow(self, s: Settings, req: timing.Request, session: str,
                     lead: bool = True) -> AsyncIterator[tuple[Sweep, str, tuple]]:
        """The states of the measurement answering `req` for `session`, as they come: (sweep, a line saying
        whom it is shared with ('' when nobody else), a tag naming that state for drawing it once). A kept
        sweep of the same key that this visitor has not seen answers at once, labelled with its age; else the
        live one is joined; else a new one is measured here, once the one measuring now has stopped. `lead`:
        whether this Run may start a measurement while an identical Run waits in the timing lane (one the
        admission sent to the watchers' lane waits for it, and starts it only if that Run left unstarted)."""
        key = timing.measurement_key(req)
        with self.lock:
            self._forget_old()
            kept = self.recent.get(key)
            if kept is not None and session not in kept.seen_by:
                kept.seen_by.add(session)
            else:
                kept = None
                entry = self.live.get(key)
                if entry is None:
                    entry = self.live[key] = Shared(key, s, req)
                    entry.loop = asyncio.get_running_loop()
                watch = Watch(session)
                entry.watches.add(watch)
                entry.seen_by.add(session)
                self.by_session.setdefault(session, set()).add(entry)
        if kept is not None:
            age = time.monotonic() - kept.finished_at
            yield (replace(kept.state, measured=f"{age:.0f} s ago"),
                   f"Measured {age:.0f} s ago on this machine for another visitor's identical Run (the same shapes, "
                   "dtype, mask, cap, lengths and backends), not again for yours: Run again to measure it anew.",
                   (kept.serial, kept.version))
            return
        try:
            seen = 0
            while True:
                if entry.error is not None:
                    raise entry.error
                if entry.version > seen:
                    seen = entry.version
                    yield entry.state, self.shared_note(entry), (entry.serial, seen)
                    continue
                if entry.finished or entry.cancelled and not entry.started:
                    return
                if watch.left and entry.watches:        # it goes on for the others
                    return
                if not entry.started and not entry.cancelled and (lead or not identical_waiting(key)):
                    await self._start(entry)
                    continue
                changed = entry.changed
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), None if entry.started else WATCH_POLL_S)
        finally:
            self._leave(entry, watch)

    def shared_note(self, entry: Shared) -> str:
        n = len(entry.sessions())
        return (f"Shared: this one measurement answers the {n} visitors watching it, who asked for the same shapes, "
                "dtype, mask, cap, lengths and backends." if n > 1 else "")

    async def _start(self, entry: Shared) -> None:
        """Start measuring `entry` once no other sweep's thread measures (no-op if it started meanwhile)."""
        while not entry.started and not entry.cancelled:
            if self.unfinished:
                with contextlib.suppress(Exception):
                    await asyncio.shield(next(iter(self.unfinished)))
                continue
            entry.run = live_run(entry.sessions)
            task = asyncio.ensure_future(self._measure(entry))
            self.unfinished.add(task)
            task.add_done_callback(self.unfinished.discard)
            log.info("timing sweep started; %d running", self.running())

    async def _measure(self, entry: Shared) -> None:
        """Measure `entry` step by step in a worker thread, publishing each state to its watchers."""
        loop = asyncio.get_running_loop()
        steps = timing.sweep(entry.s, entry.req, entry.run)
        pool = budget.LOW_PRIORITY if max(entry.req.lengths) > SMALL_SWEEP_MAX_LEN else None
        try:
            while (sw := await loop.run_in_executor(pool, self.step, steps)) is not None:
                self._publish(entry, replace(sw, records=list(sw.records)))
        except asyncio.CancelledError:          # the event loop is closing: the thread ends within one block
            entry.run.cancel()
            raise
        except Exception as e:                  # noqa: BLE001 — every watcher is answered with it
            entry.error = e
        finally:
            with contextlib.suppress(ValueError):       # (a generator still in its thread cannot be closed)
                steps.close()
            self._publish(entry, None)

    @guarded
    def step(self, steps):
        """The next state of a sweep (in a worker thread), or None when it is done."""
        with self.measuring():
            return next(steps, None)

    def _publish(self, entry: Shared, sw: Optional[Sweep]) -> None:
        """(on the event loop) `sw`, the entry's next state (None: it ended): a finished sweep that measured
        every length is kept for its key."""
        with self.lock:
            if sw is not None:
                entry.state, entry.version = sw, entry.version + 1
            if (sw is None or sw.done) and not entry.finished:
                entry.finished, entry.finished_at = True, time.monotonic()
                if self.live.get(entry.key) is entry:
                    del self.live[entry.key]
                done = entry.state
                if entry.error is None and done is not None and done.done and not done.stopped:
                    self.recent[entry.key] = entry
                    self.recent.move_to_end(entry.key)
                    self._forget_old()
                log.info("timing sweep ended (%s); %d running", entry.run.stopped() if entry.run else "not started",
                         sum(1 for e in self.live.values() if e.started and not e.finished))
        entry.wake()

    def _forget_old(self) -> None:
        """(under self.lock) Kept sweeps past RECENT_S, and the oldest past RECENT_KEPT, are let go."""
        now = time.monotonic()
        while self.recent and (len(self.recent) > RECENT_KEPT
                               or now - next(iter(self.recent.values())).finished_at > RECENT_S):
            self.recent.popitem(last=False)

    def _leave(self, entry: Shared, watch: Watch) -> None:
        """`watch` stops watching `entry`: when nobody watches, the measurement is cancelled (it ends within one
        timed block) and no later Run joins it."""
        with self.lock:
            entry.watches.discard(watch)
            watch.left = True
            if not any(w.session == watch.session for w in entry.watches):
                mine = self.by_session.get(watch.session, set())
                mine.discard(entry)
                if not mine:
                    self.by_session.pop(watch.session, None)
            if entry.watches or entry.finished:
                return
            entry.cancelled = True
            if self.live.get(entry.key) is entry:
                del self.live[entry.key]
        if entry.run is not None:
            entry.run.cancel()

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
        """The visitor stops watching (Stop, or its new Run) -> what Stop did, in a line ('' when nothing ran).
        A measurement others still watch goes on for them; one nobody watches is cancelled."""
        with self.lock:
            entries = list(self.by_session.get(session, ()))
            watching = [(e, w) for e in entries for w in list(e.watches) if w.session == session]
        notes = []
        for entry, watch in watching:
            self._leave(entry, watch)
            if entry.loop is not None and not entry.loop.is_closed():
                entry.loop.call_soon_threadsafe(entry.wake)
            run = entry.run
            if run is None or not run.total or entry.finished:
                continue
            others = len(entry.sessions())
            notes.append(f"Stopped watching after {run.done} of {run.total} lengths: the sweep goes on for the "
                         f"{others} other visitor{'s' if others > 1 else ''} who asked for the same." if others else
                         f"Stopped after {run.done} of {run.total} lengths: the measured points are kept.")
        return " ".join(notes)

    async def wait_stopped(self) -> None:
        """Until every measuring task's thread has stopped (within one timed block of a cancel)."""
        while self.unfinished:
            with contextlib.suppress(Exception):
                await asyncio.shield(next(iter(self.unfinished)))


def live_run(sessions) -> LiveRun:
    """A new run for the Runs of `sessions()` (the visitors watching it): its budget, and its turn while other
    visitors' sweeps wait in the timing lane (it then ends within one timed block, its points kept)."""
    return LiveRun(sweep_budget_s(), yield_to=lambda: others_waiting(*sessions()), turn_s=sweep_turn_s())


def others_waiting(*sessions: str) -> int:
    """Timing sweeps of other pages than `sessions` waiting in the timing lane (server.admission's view of
    Gradio's queue)."""
    queue = ADMISSION.queues.get("timing", ())
    return sum(1 for event in list(queue)
               if getattr(event, "session_hash", None) not in sessions and not getattr(event, "_pushed_out", False))


def identical_waiting(key: tuple, session: Optional[str] = None) -> bool:
    """Whether a Run of measurement key `key` (of another page than `session`) waits in the timing lane, or was
    just admitted to it (its key is on its request: server.lanes.timing_lane)."""
    requests = [getattr(event, "request", None) for event in list(ADMISSION.queues.get("timing", ()))
                if not getattr(event, "_pushed_out", False) and getattr(event, "session_hash", None) != session]
    requests += [t.request for t in list(ADMISSION.tickets)
                 if t.lane == "timing" and not t.pushed_out and t.visitor[1] != session]
    return any(getattr(getattr(r, "state", None), "timing_key", None) == key for r in requests)


TIMING_RUNS = TimingRuns()
