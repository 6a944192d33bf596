"""Model views drawn in a process beside the server's (server.drawing): the same outputs as drawn in the server,
a refusal arriving as the ValidationError it is, what it takes and what it leaves, a dead process noticed and
replaced, and the pickles its answers travel as (frozen figures, refusals)."""
import concurrent.futures
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from explorer import figures
from explorer.figures import Figure
from explorer.limits import LARGE_REQUEST_FLOPS
from explorer.schema import ValidationError
from explorer.settings import parse_settings
from explorer.views import VIEWS
from explorer.budget import MEMORY
from explorer.views.records import DRAWN
from server import drawing, endpoints
from server.drawing import DRAWING, PROCESSES_ENV


@pytest.fixture
def one_thread():
    """The drawing process runs torch on one thread (server.memory.configure_threads): draws compared with it
    are the same computation at the same thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def process(monkeypatch):
    monkeypatch.setenv(PROCESSES_ENV, "1")
    MEMORY.clear()              # every cache: what the server draws here is made from the same files as there
    assert DRAWING.start(wait_s=120), "the drawing process did not say it was ready"
    yield DRAWING
    DRAWING.stop()
    DRAWN.cache_clear()


LECTURE = {"preset": "lecture", "weights": "demo", "seed": 2, "head": 1, "layer": 1}


def test_a_frozen_figure_pickles_as_its_dicts_and_json():
    s = parse_settings(LECTURE)
    for name in ("attention", "invariance", "variants"):
        drawn = VIEWS[name].draw(s)
        back = pickle.loads(pickle.dumps(drawn, protocol=pickle.HIGHEST_PROTOCOL))
        for ours, theirs in zip(drawn, back):
            if isinstance(ours, Figure):
                assert theirs.__dict__["_frozen_json"] == ours.to_json()      # sent as written, not written again
                assert theirs.held_bytes() == ours.held_bytes()
                assert theirs.layout.to_plotly_json() == ours.layout.to_plotly_json()   # plotly's objects still build
            else:
                assert theirs == ours
    plain = Figure(dict(data=[dict(type="bar", y=[1, 2])], layout={}), _validate=False)     # not frozen: plotly's
    assert json.loads(pickle.loads(pickle.dumps(plain)).to_json())["data"][0]["y"] == [1, 2]


def test_a_frozen_figure_gives_the_collector_nothing_to_scan_until_read():
    """The server keeps the views it draws and those a drawing process sends (DRAWN) and serves them as their
    JSON: once frozen, their dicts stay packed in bytes, so a full collection (which stops every thread) has no
    container of theirs to walk. Read, they are the dicts that were sent, the template shared as in a figure
    drawn here; sent on again unread, they travel as they came."""
    MEMORY.clear()
    DRAWN.cache_clear()                 # drawn anew: a kept view another test read has built plotly's objects
    s = parse_settings(LECTURE)
    for name in ("mask", "attention", "isolation"):
        for ours in (o for o in VIEWS[name].draw(s) if isinstance(o, Figure)):
            assert [type(v).__name__ for v in ours.__dict__.values() if gc.is_tracked(v)] == [], name  # frozen here
            back = pickle.loads(pickle.dumps(ours, protocol=pickle.HIGHEST_PROTOCOL))
            assert [type(v).__name__ for v in back.__dict__.values() if gc.is_tracked(v)] == [], name
            again = pickle.loads(pickle.dumps(back, protocol=pickle.HIGHEST_PROTOCOL))
            assert again.__dict__["_packed"] == back.__dict__["_packed"]          # not unpacked to be sent on
            assert back.to_json() == ours.to_json() and back.held_bytes() == ours.held_bytes()
            traces, layout = back._held()
            assert layout["template"] is figures._template_held()
            assert figures._for_json(traces) == figures._for_json(ours._held()[0])
            assert figures._for_json(layout) == figures._for_json(ours._held()[1])
            assert again.layout.to_plotly_json() == ours.layout.to_plotly_json()   # plotly's objects still build


def test_a_refusal_pickles_whole():
    e = pickle.loads(pickle.dumps(ValidationError("kv_heads", 3, "a divisor of heads", also=("heads",))))
    assert (e.field, e.value, e.allowed, e.also) == ("kv_heads", 3, "a divisor of heads", ("heads",))
    assert str(e) == "kv_heads: got 3; allowed: a divisor of heads"


def test_what_the_process_takes(monkeypatch):
    s = parse_settings(LECTURE)
    view = VIEWS["attention"]
    cost = view.estimate(s)
    monkeypatch.setenv(PROCESSES_ENV, "0")
    assert not DRAWING.takes(view, s, cost)
    monkeypatch.delenv(PROCESSES_ENV)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert drawing.draw_processes() == 0                                            # off but on a Space
    monkeypatch.setenv("SPACE_ID", "someone/explorer")
    assert drawing.draw_processes() == 1
    monkeypatch.setenv(PROCESSES_ENV, "1")
    assert DRAWING.takes(view, s, cost)
    assert not DRAWING.takes(VIEWS["mask"], s, VIEWS["mask"].estimate(s))          # no model: the server's
    assert not DRAWING.takes(view, s, None)                                         # past the budget: refused here
    assert not DRAWING.takes(view, s, replace(cost, flops=2 * LARGE_REQUEST_FLOPS))  # the heavy lane's
    assert not DRAWING.takes(view, replace(s, weights="upload:mine"), cost)         # a visitor's own weights
    assert not DRAWING.takes(view, s, replace(cost, peak_bytes=drawing.process_memory_bytes()))   # past its half
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert not DRAWING.takes(view, s, cost)                                         # ZeroGPU lends the server its GPU
    monkeypatch.delenv("SPACES_ZERO_GPU")
    monkeypatch.setenv(PROCESSES_ENV, "2")
    with pytest.raises(ValidationError, match="EXPLORER_DRAW_PROCESSES: got '2'; allowed: 0"):
        DRAWING.takes(view, s, cost)
    for env, bad in ((drawing.IDLE_ENV, "soon"), (drawing.IDLE_ENV, "0"), (drawing.MEMORY_ENV, "1e3")):
        monkeypatch.setenv(env, bad)
        with pytest.raises(ValidationError, match=f"{env}: got '{bad}'; allowed: "):
            drawing.idle_exit_s() if env == drawing.IDLE_ENV else drawing.process_memory_bytes()
        monkeypatch.delenv(env)


def test_the_process_draws_what_the_server_draws(process, one_thread):
    for seed in (0, 3):
        s = parse_settings({**LECTURE, "seed": seed})
        for name in ("attention", "isolation", "invariance", "variants"):
            there = endpoints.VIEW_DRAWS[name](s)
            assert process._process is not None and process._process.poll() is None
            here = VIEWS[name].parts and tuple(out for p in VIEWS[name].parts for out in p.draw(s))
            assert len(there) == len(here)
            for a, b in zip(there, here):
                if isinstance(b, Figure):
                    _same_figure(json.loads(a.to_json()), json.loads(b.to_json()), (name, seed))
                else:
                    assert a == b, (name, seed)
            assert DRAWN.peek((VIEWS[name], s)) is there                            # kept in the server


def _same_figure(a, b, where):
    """Equal, numbers within float32's rounding (the same computation in two processes: equal unless their
    libraries' kernels differ; a 1e-5 difference fails)."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() == b.keys(), where
        for k in b:
            _same_figure(a[k], b[k], (*where, k))
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_figure(x, y, (*where, i))
    elif isinstance(b, float) and isinstance(a, (int, float)):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (where, a, b)
    else:
        assert a == b, (where, a, b)


def test_a_refusal_in_the_process_names_its_field(process):
    s = parse_settings(LECTURE)
    cost = VIEWS["attention"].estimate(s)
    with pytest.raises(ValidationError) as refused:                                 # past the process's own ceiling
        process.draw("attention", s, replace(cost, peak_bytes=2**40, host_bytes=2**40))
    assert refused.value.field and str(refused.value).startswith(f"{refused.value.field}: got ")


def _nices(pid: int) -> set:
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads thread priorities from /proc (Linux)")
def test_the_process_keeps_the_servers_priority_when_the_export_browser_is_lowered(process):
    """The export browser's lowering (every process this server started, at budget.LOW_PRIORITY_NICE) passes over
    the drawing process: the visitors' model views drawn there run at the server's priority, not at the heavy
    lane's and the renders'. It runs in a session of its own (its own scheduler group where the kernel has
    autogroups, not a share of the event loop's), and that group is not lowered either."""
    from explorer import budget, export
    browser = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])     # stands for the browser
    try:
        export._browser_yields()
        assert _nices(browser.pid) == {budget.LOW_PRIORITY_NICE}
        pid = process._process.pid
        assert _nices(pid) == {os.getpriority(os.PRIO_PROCESS, 0)}
        assert os.getsid(pid) == pid != os.getsid(0)
        if os.path.exists(f"/proc/{pid}/autogroup"):
            with open(f"/proc/{pid}/autogroup") as f:
                assert f.read().split()[-1] == "0"
    finally:
        browser.kill()
        browser.wait()


def test_a_dead_process_is_noticed_and_replaced(process):
    s = parse_settings(LECTURE)
    endpoints.VIEW_DRAWS["attention"](s)
    first = process._process
    os.kill(first.pid, signal.SIGSTOP)                  # a request it will never answer...
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(process.draw, "isolation", s, VIEWS["isolation"].estimate(s))
    while not process._waiting:
        time.sleep(0.01)
    first.kill()                                        # ... then it dies: the request is told, not left waiting
    with pytest.raises(drawing.NotDrawnThere):
        waiting.result(timeout=30)
    first.wait()
    while process._process is first:                    # until the server has seen it end
        time.sleep(0.01)
    out = endpoints.VIEW_DRAWS["invariance"](parse_settings({**LECTURE, "seed": 3}))  # drawn here; another starts
    assert isinstance(out[0], Figure)
    assert process._process is not None and process._process is not first
    assert process.start(wait_s=120) and process._process.poll() is None


def test_the_process_ends_when_idle_and_the_next_view_starts_it(process, monkeypatch):
    s = parse_settings(LECTURE)
    process.stop()
    monkeypatch.setenv(drawing.IDLE_ENV, "0.5")
    assert process.start(wait_s=120)
    idle = process._process
    process.draw("attention", s, VIEWS["attention"].estimate(s))
    assert idle.wait(timeout=30) == 0                   # it ended by itself, its memory with it
    while process._process is idle:
        time.sleep(0.01)
    with pytest.raises(drawing.NotDrawnThere, match="starting"):
        process.draw("isolation", s, VIEWS["isolation"].estimate(s))
    assert process.start(wait_s=120)


def test_a_view_the_process_cannot_answer_is_drawn_in_the_server(process, monkeypatch):
    def gone(*args):
        raise drawing.NotDrawnThere("the drawing process ended")
    monkeypatch.setattr(DRAWING, "draw", gone)
    s = parse_settings({**LECTURE, "seed": 1})
    out = endpoints.VIEW_DRAWS["attention"](s)
    assert isinstance(out[0], Figure) and DRAWN.peek((VIEWS["attention"], s)) == out
