"""Identical timing sweeps share one measurement (issue 34, finding 7: a class behind one address pressing Run on
the same lecture step queued thirty identical sweeps in a lane that measures one at a time). Two Runs whose
sweeps measure the same thing (explorer.timing.measurement_key: not the seed, head, layer or candidate) are
answered by one measurement; one visitor's Stop leaves it going for the others; joiners take no place in the
timing lane; a just-finished one answers the same Run again, labelled with its age."""
import asyncio
import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest

from explorer import timing

LECTURE = "preset=lecture&weights=random"


def request_of(query: str, lengths: str = "16, 32", backends=("naive",)):
    from server.timing_events import timing_request
    return timing_request(query, lengths, list(backends), timing.geometries()[0], timing.dtypes()[0])


@pytest.fixture
def runs(monkeypatch):
    """A TimingRuns of the test's own, and a stand-in for the sweep (the sharing is what is tested: each step
    waits for `go`), counting the measurements started and how many ran at once."""
    from explorer.timing import Sweep
    from server import timing_runs
    go, calls, at_once = threading.Event(), [], [0, 0]

    def sweep(s, req, run=None):
        calls.append(req)
        run.total = len(req.lengths)
        sw = Sweep("CPU (test)", lengths=tuple(req.lengths))
        at_once[0] += 1
        at_once[1] = max(at_once)
        try:
            yield sw
            for T in req.lengths:
                while not go.wait(0.01) and not run.stopped():
                    pass
                if run.stopped():
                    break
                sw.records.append(dict(T=T, backend="naive", status="ok", repeats=5, median_ms=float(T)))
                run.done = len(sw.measured_lengths)
                yield sw
            if run.stopped():
                sw.stopped = timing.stopped_note(run.stopped(), sw.measured_lengths, len(req.lengths))
            sw.done = True
            yield sw
        finally:
            at_once[0] -= 1
    monkeypatch.setattr(timing, "sweep", sweep)
    out = timing_runs.TimingRuns()
    out.go, out.calls, out.at_once = go, calls, at_once
    return out


async def follow(runs, query: str, session: str, out: list, lengths: str = "16, 32", lead: bool = True):
    s, req = request_of(query, lengths)
    async for sw, shared, _ in runs.follow(s, req, session, lead=lead):
        out.append((sw, shared))


async def until(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_measurement_key_is_what_the_sweep_measures_not_what_the_views_show():
    key = lambda q, lengths="16, 32", backends=("naive",): timing.measurement_key(request_of(q, lengths, backends)[1])  # noqa: E731
    base = key(LECTURE)
    assert key(LECTURE + "&seed=3&head=2&layer=1&candidate=2") == base           # view-only: the same sweep
    assert key("preset=lecture&weights=demo") == base                            # the weights: no attention shape
    assert key(LECTURE, "16, 64") != base and key(LECTURE, backends=("naive", "structured")) != base
    assert key(LECTURE + "&prefix=bidirectional") != base                        # another mask
    assert key(LECTURE + "&num_candidates=6") != base                            # other shapes


def test_identical_runs_measure_once_and_every_visitor_gets_the_same_points(monkeypatch):
    """Four visitors press Run at once on the same lecture step (their seed and head differ): one measurement,
    on this machine, and each is shown its points, saying they are shared."""
    from server import timing_events, timing_runs
    real, calls = timing.sweep, []
    monkeypatch.setattr(timing, "sweep", lambda *a, **k: (calls.append(a), real(*a, **k))[1])
    monkeypatch.setattr(timing_runs, "TIMING_RUNS", timing_runs.TimingRuns())
    monkeypatch.setattr(timing_events, "TIMING_RUNS", timing_runs.TIMING_RUNS)

    async def main():
        outs = [[] for _ in range(4)]

        async def run(i):
            page = SimpleNamespace(session_hash=f"student-{i}")
            async for out in timing_events.timing_endpoint(f"{LECTURE}&seed={i}&head={i - 1}", "16, 32", ["naive"],
                                                           request=page):
                outs[i].append(out)
        await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(4))), timeout=120)
        return outs

    outs = asyncio.run(main())
    assert len(calls) == 1, f"{len(calls)} measurements for 4 identical Runs"
    finals = [out[-1] for out in outs]
    medians = [[list(t.y) for t in final[0].data if "measured now" in (t.meta or "")] for final in finals]
    assert medians[0] and all(m == medians[0] for m in medians), medians
    assert all("Done: 2 lengths" in f[-1] and "Measured now on" in f[-1] for f in finals)
    assert any("Shared: this one measurement answers the 4 visitors" in o[-1] for out in outs for o in out)


def test_one_visitors_stop_leaves_a_shared_run_going_for_the_others(runs):
    """Stop (or a new Run) by one watcher ends its own watching, said so, and the measurement goes on for the
    rest; once the last watcher stops, it is cancelled (its points kept)."""
    async def main():
        a, b = [], []
        ta = asyncio.create_task(follow(runs, LECTURE + "&seed=1", "a", a))
        tb = asyncio.create_task(follow(runs, LECTURE + "&seed=2&head=0", "b", b))
        await until(lambda: a and b and runs.running())
        note = runs.cancel("a")
        await asyncio.wait_for(ta, 5)                          # a stops watching at once
        run = next(iter(runs.live.values())).run
        assert run.stopped() is None and "goes on for the 1 other visitor" in note
        runs.go.set()
        await asyncio.wait_for(tb, 10)
        assert b[-1][0].done and not b[-1][0].stopped and b[-1][0].measured_lengths == [16, 32]
        assert not a[-1][0].done

        runs.go.clear()                                        # alone: Stop cancels it
        c = []
        tc = asyncio.create_task(follow(runs, LECTURE, "c", c, lengths="16, 64"))
        await until(lambda: c and runs.running())
        assert runs.cancel("c") == "Stopped after 0 of 2 lengths: the measured points are kept."
        await asyncio.wait_for(tc, 5)
        assert "Stop was pressed" in c[-1][0].stopped and runs.running() == 0

    asyncio.run(main())
    assert len(runs.calls) == 2


def test_a_kept_sweep_answers_another_visitors_identical_run_labelled_with_its_age(runs):
    """A sweep that measured every length answers the same Run of another visitor for RECENT_S, at once and
    said to be measured N s ago for another visitor; its own visitor's Run again measures anew."""
    runs.go.set()

    async def main():
        a, b, a2 = [], [], []
        await follow(runs, LECTURE, "a", a)
        await follow(runs, LECTURE + "&seed=3&candidate=1", "b", b)
        assert len(runs.calls) == 1 and len(b) == 1
        sw, note = b[0]
        assert sw.measured.endswith(" s ago") and sw.points == a[-1][0].points
        assert "for another visitor's identical Run" in note and "Run again to measure it anew" in note
        await follow(runs, LECTURE, "a", a2)
        assert len(runs.calls) == 2 and a2[-1][0].measured == "now"

    asyncio.run(main())


def test_a_joiner_waits_for_the_identical_run_queued_ahead_and_starts_it_if_that_one_left(runs, monkeypatch):
    """A Run the admission sent to the watchers' lane (an identical one waits in the timing lane) measures
    nothing itself while that one waits: the waiting one, once its turn comes, measures for both. If that one
    leaves unstarted (its visitor stopped it), the joiner starts the measurement (one at a time, as always)."""
    from server import timing_runs
    monkeypatch.setattr(timing_runs, "WATCH_POLL_S", 0.02)
    s, req = request_of(LECTURE)
    waiting = [SimpleNamespace(session_hash="leader", request=SimpleNamespace(
        state=SimpleNamespace(timing_key=timing.measurement_key(req))))]
    monkeypatch.setitem(timing_runs.ADMISSION.queues, "timing", waiting)
    runs.go.set()

    async def main():
        joiner, leader = [], []
        tj = asyncio.create_task(follow(runs, LECTURE + "&head=1", "joiner", joiner, lead=False))
        await asyncio.sleep(0.3)
        assert runs.calls == [] and runs.live            # it waits: the one ahead of it measures
        waiting.clear()                                  # that one's turn: it leaves the lane and runs
        await follow(runs, LECTURE, "leader", leader)
        await asyncio.wait_for(tj, 10)
        assert len(runs.calls) == 1 and joiner[-1][0].points == leader[-1][0].points

        runs.recent.clear()
        waiting.append(SimpleNamespace(session_hash="gone", request=SimpleNamespace(
            state=SimpleNamespace(timing_key=timing.measurement_key(req)))))
        alone = []
        tj = asyncio.create_task(follow(runs, LECTURE, "joiner-2", alone, lead=False))
        await asyncio.sleep(0.1)
        assert len(runs.calls) == 1
        waiting.clear()                                  # the Run it joined was stopped while it waited
        await asyncio.wait_for(tj, 10)
        assert len(runs.calls) == 2 and alone[-1][0].done and alone[-1][0].measured_lengths == [16, 32]

    asyncio.run(main())


def test_different_sweeps_still_measure_one_at_a_time(runs):
    async def main():
        a, b = [], []
        ta = asyncio.create_task(follow(runs, LECTURE, "a", a))
        await until(lambda: runs.running())
        tb = asyncio.create_task(follow(runs, LECTURE, "b", b, lengths="16, 64"))
        await asyncio.sleep(0.2)
        assert len(runs.calls) == 1                      # the second waits for the first's thread
        runs.go.set()
        await asyncio.wait_for(asyncio.gather(ta, tb), 10)
    asyncio.run(main())
    assert len(runs.calls) == 2 and runs.at_once[1] == 1


def test_a_run_joining_an_identical_one_waits_in_the_watchers_lane_not_the_timing_lane(monkeypatch):
    """The admission's choice of lane: a Run whose sweep waits, runs or is kept for another visitor watches it
    (the timing lane's waiting count does not grow for it); a different sweep, one this visitor saw, or its own
    running alone (Run again replaces it) queues in the timing lane; a bad Run queues there too, and its handler refuses it naming the field. The
    watchers' lane still bounds each visitor and address."""
    from explorer.schema import ValidationError
    from server import admission, lanes, timing_events, timing_runs
    fresh = timing_runs.TimingRuns()
    monkeypatch.setattr(lanes, "TIMING_RUNS", fresh)
    waiting = []
    monkeypatch.setitem(timing_runs.ADMISSION.queues, "timing", waiting)

    def asked(session):
        return SimpleNamespace(session_hash=session, request=SimpleNamespace(state=SimpleNamespace()))

    first = asked("b")
    assert lanes.timing_lane(LECTURE, "16, 32", ["naive"], request=first) == "timing"
    waiting.append(SimpleNamespace(session_hash="b", request=first.request))
    assert lanes.timing_lane(LECTURE + "&seed=2&head=0", "16, 32", ["naive"], request=asked("c")) == "watch"
    assert lanes.timing_lane(LECTURE, "16, 64", ["naive"], request=asked("d")) == "timing"
    assert lanes.timing_lane(LECTURE, "16, x", ["naive"], request=asked("e")) == "timing"
    with pytest.raises(gr.Error, match="lengths: got 'x'"):
        asyncio.run(anext(timing_events.timing_endpoint(LECTURE, "16, x", ["naive"], request=asked("e"))))
    waiting.clear()
    kept = timing_runs.Shared(timing.measurement_key(request_of(LECTURE)[1]), None, None)
    kept.finished_at, kept.seen_by = time.monotonic(), {"b"}
    fresh.recent[kept.key] = kept
    assert lanes.timing_lane(LECTURE, "16, 32", ["naive"], request=asked("c")) == "watch"
    assert lanes.timing_lane(LECTURE, "16, 32", ["naive"], request=asked("b")) == "timing"     # b saw it
    fresh.recent.clear()
    live = fresh.live[kept.key] = timing_runs.Shared(kept.key, None, None)
    live.watches.add(timing_runs.Watch("b"))
    assert lanes.timing_lane(LECTURE, "16, 32", ["naive"], request=asked("c")) == "watch"
    assert lanes.timing_lane(LECTURE, "16, 32", ["naive"], request=asked("b")) == "timing"     # its own: Run again
    held = [admission.Held("addr:192.0.2.7", "c")]
    with pytest.raises(ValidationError, match="1 of your joined sweeps waiting or running"):
        admission.check_admission("watch", [], ("addr:192.0.2.7", "c"), held)
    with pytest.raises(ValidationError, match="2 joined sweeps waiting or running from your address"):
        admission.check_admission("watch", [], ("addr:192.0.2.7", "f"), held + [admission.Held("addr:192.0.2.7", "g")])
