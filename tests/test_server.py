"""server/'s process policy and live-run bookkeeping: torch's threads set once from the environment,
a live timing sweep's turn, a page's superseded redraws."""
import asyncio

import pytest
import torch

from explorer.schema import ValidationError
from server import memory


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


def test_the_gil_switch_interval_is_configured_once_from_the_environment(monkeypatch):
    import sys
    before = sys.getswitchinterval()
    try:
        monkeypatch.delenv(memory.SWITCH_INTERVAL_ENV, raising=False)
        assert memory.configure_gil_switch() == memory.SWITCH_INTERVAL_MS
        assert sys.getswitchinterval() == pytest.approx(memory.SWITCH_INTERVAL_MS / 1000)
        assert sys.getswitchinterval() < 0.005                      # below Python's default
        monkeypatch.setenv(memory.SWITCH_INTERVAL_ENV, "5")
        assert memory.configure_gil_switch() == 5 and sys.getswitchinterval() == pytest.approx(0.005)
        for bad in ("soon", "0", "1000"):
            monkeypatch.setenv(memory.SWITCH_INTERVAL_ENV, bad)
            with pytest.raises(ValidationError, match=f"EXPLORER_SWITCH_INTERVAL_MS: got '{bad}'; allowed: milli"):
                memory.configure_gil_switch()
    finally:
        sys.setswitchinterval(before)


ARENAS_OF_EIGHT_THREADS = """
import ctypes, os, sys, tempfile, threading
sys.path.insert(0, os.getcwd())
from server import memory
print(memory.configure_malloc_arenas())
go = threading.Barrier(8)
def allocate():
    go.wait()
    kept = [bytearray(200_000) for _ in range(20)]      # past pymalloc: glibc's malloc, from this thread's arena
libc = ctypes.CDLL("libc.so.6")
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(f))
libc.fclose(ctypes.c_void_p(f))
print(open(path).read().count("<heap nr="))
"""


@pytest.mark.parametrize("arenas", ["0", "2"])
def test_the_threads_share_at_most_the_configured_malloc_arenas(arenas):
    """glibc gives each new thread an arena of its own up to 8 per core, each keeping pages the idle trim
    cannot return; app.py sets at most EXPLORER_MALLOC_ARENAS (2 unless told) before its threads start."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", ARENAS_OF_EIGHT_THREADS], capture_output=True, text=True,
                         timeout=120, cwd=root, env={**os.environ, memory.ARENAS_ENV: arenas})
    assert out.returncode == 0, out.stderr
    configured, heaps = map(int, out.stdout.split())
    assert configured == int(arenas)
    if arenas == "0":
        assert heaps > 2, heaps                      # glibc's default: the threads spread over their own
    else:
        assert heaps <= 2, heaps
    main = open(os.path.join(root, "app.py")).read()
    assert main.index("memory.configure_malloc_arenas()") < main.index("build_app()\n")


def test_the_malloc_arenas_setting_refuses_what_is_no_count(monkeypatch):
    for bad in ("two", "-1", "65"):
        monkeypatch.setenv(memory.ARENAS_ENV, bad)
        with pytest.raises(ValidationError, match=f"EXPLORER_MALLOC_ARENAS: got '{bad}'; allowed: an integer"):
            memory.configure_malloc_arenas()


def test_a_running_sweep_yields_its_turn_to_other_pages_sweeps_waiting(monkeypatch):
    """A live run has its turn (explorer.limits.SWEEP_TURN_S): past it, the run ends once a sweep of
    another page waits in the timing lane; its own page's next sweep, or one pushed out, does not count."""
    from explorer import limits
    from explorer.measure import YIELDED
    from server import timing_runs
    monkeypatch.setitem(limits.SWEEP_TURN_S, "cpu", 0.0)
    monkeypatch.setitem(limits.SWEEP_TURN_S, "cuda", 0.0)
    waiting = []
    monkeypatch.setitem(timing_runs.ADMISSION.queues, "timing", waiting)
    event = lambda session, pushed_out=False: type("Event", (), {"session_hash": session, "_pushed_out": pushed_out})()  # noqa: E731
    run = timing_runs.live_run(lambda: {"a"})
    waiting += [event("a"), event("b", pushed_out=True)]
    assert run.stopped() is None and timing_runs.others_waiting("a") == 0
    waiting.append(event("b"))
    assert timing_runs.others_waiting("a") == 1 and run.stopped() == YIELDED


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


def test_a_head_change_on_the_page_reads_its_settings_once_and_estimates_its_view_once(monkeypatch):
    """Issue 36, item 1: a head change through the page's control change event, admitted as app.py admits it
    (lanes.admit_to with work_of_page_change, a redraw), reads its settings once — the last link and the
    controls, at admission (endpoints.page_change: two parse_settings) — and estimates its view once; the
    handler reads no query string and estimates nothing, and draws what a handler reading for itself draws
    (no admission: a test, an API call outside the queue). A heatmap click (render_after_pick) is read once
    alike. The change read its settings five times (six parse_settings) and estimated its view three times."""
    from types import SimpleNamespace

    from gradio.context import LocalContext

    from counting import count_reads
    from explorer.controls import CONTROL_FIELDS
    from explorer import query_string
    from explorer.query_string import parse_query
    from explorer.settings import control_value
    from server import admission, endpoints, lanes
    gate = admission.Admission()
    monkeypatch.setattr(lanes, "ADMISSION", gate)
    monkeypatch.setattr(endpoints, "ADMISSION", gate)
    last = "preset=lecture&weights=random"
    s = parse_query(last, need_model=False)
    values = [1 if f == "head" else control_value(s, f) for f in CONTROL_FIELDS]
    assert s.head != 1
    inputs = (*values, "attention", last)
    counts = count_reads(monkeypatch)

    def counted(fn):
        counts.update(parse_settings=0, parse_query=0, page_change=0, estimate=0)
        query_string._parsed_before.cache_clear()   # each step reads as if no link had been read before
        out = fn()
        return out, dict(counts)

    def admitted_and_drawn(work, handler, inputs):
        request = SimpleNamespace(request=SimpleNamespace(state=SimpleNamespace(), headers={}, client=None),
                                  session_hash="lecturer", headers={}, client=None, username=None)
        token = LocalContext.request.set(request)
        try:
            admit = lanes.admit_to("forward", work=work, redraw=True)
            verdict, at_admission = counted(lambda: asyncio.run(admit(request, *inputs)))
            assert all(v["is_valid"] for v in verdict)
            drawn, in_handler = counted(lambda: handler(request, *inputs))
        finally:
            LocalContext.request.reset(token)
        assert at_admission == {"parse_settings": 2, "parse_query": 1, "page_change": 1, "estimate": 1}
        assert in_handler == {"parse_settings": 0, "parse_query": 0, "page_change": 0, "estimate": 0}
        assert request.request.state.admitted_flops == request.request.state.read.flops > 0
        return drawn
    drawn = admitted_and_drawn(lanes.work_of_page_change, endpoints.control_change_on_page, inputs)
    clicked = admitted_and_drawn(lanes.work_of_pick, endpoints.pick_on_page, ("head=1", *inputs))
    assert clicked[0] == drawn[0]
    alone, by_itself = counted(lambda: endpoints.control_change_on_page(None, *inputs))
    assert by_itself == {"parse_settings": 2, "parse_query": 1, "page_change": 1, "estimate": 1}   # read once by the handler
    as_json = lambda out: [o.to_json() if hasattr(o, "to_json") else repr(o) for o in out]   # noqa: E731
    assert drawn[0] == alone[0] == last + "&head=1" and as_json(drawn) == as_json(alone)


def test_a_page_change_is_split_from_its_inputs_once_and_its_answer_names_each_controls_place():
    """Issue 36, item 3: the page's control change and heatmap click reach the server as Gradio's positional
    inputs (every control, the tab, the last link; a click first); endpoints.PageChange splits them in one place
    and refuses another count by name, and a control's update sits at endpoints.control_slot in the answer. The
    app's wiring is held to both: each input and output named by the control it is, not by an offset."""
    import app
    from explorer.controls import CONTROL_FIELDS, LABELS
    from server.endpoints import CHANGE_HEAD, CHANGE_OUTPUTS, LINK_HEAD, LINK_OUTPUTS, PageChange, control_slot
    values = tuple(f"v{i}" for i in range(len(CONTROL_FIELDS)))
    change = PageChange.of((*values, "attention", "preset=lecture"))

    def value(c, field):
        return c.values[CONTROL_FIELDS.index(field)]
    assert change == (values, "attention", "preset=lecture") and value(change, "head") == values[CONTROL_FIELDS.index("head")]
    assert value(change.with_values({"head": 3}), "head") == 3 and value(change.with_values({"head": 3}), "layer") == value(change, "layer")
    assert PageChange.of((*values, "mask"), last_link=False) == (values, "mask", "")
    for args, last_link in (((*values, "mask"), True), (values, False), ((*values, "mask", "q", "extra"), True)):
        with pytest.raises(ValidationError, match=rf"inputs: got '{len(args)} values'; allowed: {len(CONTROL_FIELDS)} controls"):
            PageChange.of(args, last_link=last_link)
    demo = app.build_app()
    wired = {d.api_name: d for d in demo.fns.values()}
    for api, before in (("render_on_change", 0), ("render_after_pick", 1)):
        inputs, outputs = wired[api].inputs, wired[api].outputs
        assert len(inputs) == before + len(CONTROL_FIELDS) + 2 and len(outputs) == CHANGE_OUTPUTS
        assert outputs[CHANGE_HEAD.index("query")].elem_id == inputs[-1].elem_id == "query"
        for i, f in enumerate(CONTROL_FIELDS):
            assert inputs[before + i].label == outputs[control_slot(f)].label == LABELS[f], f
    # the other redraws that set every control (a preset, a family, Reset, presentation keys; Back and Forward)
    for api, head, n in (("render_after_preset", CHANGE_HEAD, CHANGE_OUTPUTS), ("render_after_family", CHANGE_HEAD,
                         CHANGE_OUTPUTS), ("render_after_reset", CHANGE_HEAD, CHANGE_OUTPUTS),
                         ("render_after_key", CHANGE_HEAD, CHANGE_OUTPUTS), ("render_after_history", LINK_HEAD, LINK_OUTPUTS)):
        outputs = wired[api].outputs
        assert len(outputs) == n and outputs[head.index("query")].elem_id == "query", api
        assert [o.label for o in outputs[len(head):len(head) + len(CONTROL_FIELDS)]] == \
            [outputs[control_slot(f, head)].label for f in CONTROL_FIELDS] == [LABELS[f] for f in CONTROL_FIELDS], api
    assert type(wired["render_after_history"].outputs[LINK_HEAD.index("tabs")]).__name__ == "Tabs"


def test_every_page_event_comes_from_a_control_a_visitor_sees_or_from_a_declared_port():
    """Issue 36, item 3: no hidden textbox carries an event. An event's trigger is a control on the page, the page
    itself (load, unload), or one of its ports (app.page_port: a gr.HTML the page's script sends a payload through,
    its `submit`); no trigger is hidden (visible=False, or display: none in static/*.css by its id), and the
    scripts send only through declared ports, each port sent by some script."""
    import re
    from pathlib import Path

    import gradio as gr

    import app
    demo = app.build_app()
    ports = {b.elem_id.removeprefix("port-"): b for b in demo.blocks.values() if "page-port" in (b.elem_classes or [])}
    assert ports and all(isinstance(b, gr.HTML) for b in ports.values())
    css = "\n".join(p.read_text() for p in app.CSS_PATHS)
    hidden_ids = {i for rule in re.findall(r"([^{}]+)\{[^}]*display:\s*none", css) for i in re.findall(r"#([\w-]+)", rule)}
    for dep in demo.fns.values():
        for block_id, event in dep.targets:
            block = demo.blocks.get(block_id)
            if block is None or isinstance(block, gr.Blocks):        # the page's own load and unload
                continue
            name = f"{dep.api_name}: {type(block).__name__} #{block.elem_id} .{event}"
            assert block.visible is True and block.elem_id not in hidden_ids, name
            if isinstance(block, gr.HTML):
                assert block.elem_id.removeprefix("port-") in ports and event == "submit", name
    scripts = "\n".join(p.read_text() for p in sorted(app.STATIC.glob("*.js")))
    sent = set(re.findall(r"explorer\.send\('(\w+)'", scripts))
    assert sent == set(ports), (sent, set(ports))


def test_every_event_script_is_one_call_of_a_function_the_pages_scripts_define():
    """Issue 36, item 3: no JS in Python strings. An event's js (Gradio runs it in the browser) is app.page_call's
    one call of `explorer.<function>` with the event's inputs, in order, and static/*.js defines that function
    (`explorer.name = ` in page.js, `P.name = ` on explorer.present in present.js): a renamed or removed
    function fails here, not silently in a visitor's browser. The timing recheck was a snippet of its own
    (`if (tab === 'timing') ...`) on the link box's change; the head key's reordered its inputs."""
    import re

    import app
    scripts = {p.name: p.read_text() for p in app.STATIC.glob("*.js")}
    defined = set(re.findall(r"^\s*explorer\.(\w+) = ", scripts["page.js"], re.M)) \
        | {f"present.{m}" for m in re.findall(r"^\s*P\.(\w+) = ", scripts["present.js"], re.M)}
    assert {"writeUrl", "present.enter"} <= defined
    demo = app.build_app()
    called = set()
    for dep in demo.fns.values():
        if not dep.js:
            continue
        call = re.fullmatch(r"\(([\w, ]*)\) => explorer\.([\w.]+)\(([\w, ]*)\)", dep.js)
        assert call and call[1] == call[3], (dep.api_name, dep.js)
        names = [a for a in call[1].split(", ") if a]
        assert len(names) == len(dep.inputs), (dep.api_name, dep.js, len(dep.inputs))
        assert call[2] in defined, (dep.api_name, call[2])
        called.add(call[2])
    assert {"writeUrl", "queryRow", "recolour", "present.done"} <= called


def test_a_view_drawn_for_the_same_settings_is_answered_from_what_is_kept_outside_the_model_lanes(monkeypatch):
    """Issue 34, a classroom behind one address: thirty students on one lecture step ask for the same view. The
    first is drawn in the model lane; each later one is admitted to the kept lane with no work share, and its
    handler answers with the outputs pinned on its request at admission — the same objects, nothing drawn,
    even when the cache lets them go while it waits. Other settings still wait in the model lane, and the
    Export tab's preview (drawn from its part) is never answered from a whole view's outputs."""
    from types import SimpleNamespace

    from gradio.context import LocalContext

    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import parse_query
    from explorer.settings import control_value
    from explorer.views import records
    from server import admission, endpoints, lanes
    gate = admission.Admission()
    monkeypatch.setattr(lanes, "ADMISSION", gate)
    monkeypatch.setattr(endpoints, "ADMISSION", gate)
    records.DRAWN.cache_clear()
    draws = []
    real = records.View.draw
    monkeypatch.setattr(records.View, "draw", lambda self, s, cost=None: draws.append(self.name) or real(self, s, cost))
    last = "preset=lecture&weights=random"
    s = parse_query(last, need_model=False)

    def change(head):
        return (*[head if f == "head" else control_value(s, f) for f in CONTROL_FIELDS], "attention", last)

    def student(inputs, evict=False):
        request = SimpleNamespace(request=SimpleNamespace(state=SimpleNamespace(), headers={}, client=None),
                                  session_hash=f"student{len(draws)}", headers={}, client=None, username=None)
        token = LocalContext.request.set(request)
        try:
            admit = lanes.admit_to("forward", work=lanes.work_of_page_change, redraw=True)
            verdict = asyncio.run(admit(request, *inputs))
            assert all(v["is_valid"] for v in verdict)
            if evict:
                records.DRAWN.cache_clear()
            return request.request.state, endpoints.control_change_on_page(request, *inputs)
        finally:
            LocalContext.request.reset(token)
    first_state, first = student(change(1))
    assert draws == ["attention"] and getattr(first_state, "lane", "forward") == "forward"
    work = sum(n for log in gate.rates["work"].log.values() for _, n in log)
    later_state, later = student(change(1), evict=True)
    assert draws == ["attention"] and later_state.lane == "kept"            # nothing drawn again
    shown = [[o for o in out[-endpoints.VIEW_OUTPUTS:] if not isinstance(o, dict)] for out in (first, later)]
    assert len(shown[0]) == len(later_state.kept[2]) and all(a is b for a, b in zip(*shown))
    assert sum(n for log in gate.rates["work"].log.values() for _, n in log) == work     # no work share taken
    other_state, _ = student(change(2))
    assert draws == ["attention", "attention"] and not hasattr(other_state, "kept")
    monkeypatch.setattr(endpoints, "KEPT_MAX_BYTES", 1000)       # a kept view past what the lane may pin
    big_state, _ = student(change(2))
    assert draws == ["attention"] * 3 and not hasattr(big_state, "kept")     # View.draw in the model lane
    assert not isinstance(lanes.work_of_figure(last + "&head=2", "attention_head"), lanes.Work)
