"""explorer.views.VIEWS is the one list of views: each record's outputs are what its function returns,
and a view added as one module (its function and its record) reaches the page, the API, the admission's
cost model, the lecture pack, presentation mode and the README's table with nothing else edited."""
import json
import os
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest

from explorer.query_string import parse_query
from explorer.schema import VIEW_FIELDS
from explorer.views import VIEWS, Plot, Text, drawn_views

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", [v.name for v in drawn_views()])
def test_each_view_returns_what_its_record_says(name):
    view = VIEWS[name]
    out = view.draw(parse_query("preset=lecture"))
    assert len(out) == len(view.outputs)
    for value, spec in zip(out, view.outputs):
        assert isinstance(value, go.Figure if isinstance(spec, Plot) else str), (name, spec)


@pytest.mark.parametrize("name", [v.name for v in drawn_views()])
def test_a_view_is_drawn_once_per_settings_and_sent_as_drawn(name):
    """View.draw keeps what it drew for the settings (records.DRAWN): the same settings again get the same
    outputs, no part run; their figures' JSON equals that of the parts drawn afresh, byte for byte (the
    same computation), and the kept figures are counted in the memory account."""
    from explorer.budget import MEMORY
    from explorer.views.records import DRAWN
    view = VIEWS[name]
    s = parse_query("preset=lecture&seed=5&head=1")
    DRAWN.cache_clear()
    first = view.draw(s)
    assert view.draw(s) is first
    fresh = tuple(out for p in view.parts for out in p.draw(s))
    assert [o.to_json() if isinstance(o, go.Figure) else o for o in first] == \
        [o.to_json() if isinstance(o, go.Figure) else o for o in fresh]
    kept = MEMORY.entries[(DRAWN, (view, s))][0]
    assert kept >= sum(len(o.to_json()) for o in first if isinstance(o, go.Figure)) > 0


@pytest.mark.parametrize("link", ["preset=lecture&head=1", "preset=lecture&zoom=candidates&head=2",
                                  "preset=phoenix-nano&head=1"])
def test_a_kept_view_is_counted_at_least_at_what_it_holds(link):
    """The memory account counts a kept view's figures at least at the memory they hold (tracemalloc, the view
    drawn once before so that only its own outputs are new): counted at its arrays and JSON alone, a lecture view
    was 5-10x under, and the server's memory 30 s after the soak passed its bound."""
    import gc
    import tracemalloc

    from explorer.views.records import _frozen
    s = parse_query(link)
    for view in drawn_views():
        tuple(out for p in view.parts for out in p.draw(s))
        gc.collect()
        tracemalloc.start()
        try:
            outputs = _frozen(tuple(out for p in view.parts for out in p.draw(s)))
            gc.collect()
            held = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        counted = sum(o.held_bytes() for o in outputs if hasattr(o, "held_bytes"))
        assert counted >= held, (view.name, counted, held)


def test_a_class_asking_for_one_view_at_once_waits_for_one_drawing():
    """Thirty identical requests at once: one drawing, thirty identical answers; other settings are drawn apart."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace as dc_replace

    from explorer.views.records import DRAWN
    view = VIEWS["attention"]
    part = view.parts[0]
    calls, gate = [], threading.Event()

    def slow(s):
        calls.append(s)
        gate.wait(5)
        return part.draw(s)
    object.__setattr__(view, "parts", (dc_replace(part, draw=slow),) + view.parts[1:])      # a frozen record
    try:
        DRAWN.cache_clear()
        s = parse_query("preset=lecture&seed=6")
        with ThreadPoolExecutor(30) as pool:
            answers = [pool.submit(view.draw, s) for _ in range(30)]
            gate.set()
            outs = [a.result(timeout=60) for a in answers]
        assert len(calls) == 1 and all(o is outs[0] for o in outs)
        view.draw(dc_replace(s, seed=7))
        assert len(calls) == 2
    finally:
        object.__setattr__(view, "parts", (part,) + view.parts[1:])
        DRAWN.cache_clear()


def test_outputs_the_cache_cannot_count_are_drawn_each_time():
    """A part returning a plain plotly figure (a toy view's) is not kept: its bytes are not counted."""
    from dataclasses import replace as dc_replace

    from explorer.views.records import DRAWN, Part
    view = VIEWS["mask"]
    plain = dc_replace(view, name="plain", parts=(Part(lambda s: (go.Figure(), "text"), (Plot("x"), Text())),))
    s = parse_query("preset=lecture")
    DRAWN.cache_clear()
    assert plain.draw(s) is not plain.draw(s)
    assert not DRAWN.entries


def test_records_name_their_figures_once():
    ids = [o.elem_id for v in VIEWS.values() for o in v.outputs if o.elem_id]
    assert len(ids) == len(set(ids))
    exports = [e.name for v in VIEWS.values() for o in v.outputs for e in getattr(o, "exports", ())]
    assert len(exports) == len(set(exports))
    assert all(v.main for v in drawn_views()) and all(any(isinstance(o, Text) for o in v.outputs)
                                                      for v in drawn_views())   # where a device limit is said


def test_a_views_own_controls_only_change_what_is_shown():
    """A tab's controls are its own (Control records, held in Settings.view) or shared view fields
    (explorer.schema.VIEW_FIELDS): both are Settings.shown, outside the model caches' key, Settings.model, so
    moving one redraws from the model and forward already cached."""
    from explorer.schema import Control
    shared = {c for v in VIEWS.values() for c in v.controls if not isinstance(c, Control)}
    assert shared <= set(VIEW_FIELDS) and "view" in VIEW_FIELDS
    own = [c for v in VIEWS.values() for c in v.controls if isinstance(c, Control)]
    assert own and len({c.name for c in own}) == len(own)        # one name per control
    s = parse_query("preset=lecture")
    for c in own:
        values = c.choices or ([v for _, v in c.page_choices()] if c.page_choices else (c.lo, c.hi))
        other = next(x for x in values if x != c.default)
        moved = parse_query(f"preset=lecture&{c.name}={other}")
        assert c.of(moved) != c.of(s) and moved.model == s.model, c.name


# a view's own module, as each of explorer/views/ is: its function, its cost, its Export's caption and its record
TOY_MODULE = r'''
import plotly.graph_objects as go

from explorer.limits import Cost
from explorer.schema import Control
from explorer.views.records import Export, Part, Plot, Text, View

# the toy's own control: how its two values are drawn
SHAPE = Control("toy_shape", "bars", "toy shape (bars or dots)", choices=("bars", "dots"))


def toy_view(s):
    trace = (go.Bar if SHAPE.of(s) == "bars" else go.Scatter)(x=[0, 1], y=[s.seed, s.num_history])
    return go.Figure(trace, layout=dict(title="toy")), f"toy of seed {s.seed} as {SHAPE.of(s)}"


def _toy_cost(s):
    return Cost(flops=1e8 * s.num_history, peak_bytes=1000)


EXPORT_TOY = Export("toy", lambda s, facts, chosen: f"Two bars: the seed {s.seed} and {facts['history']}.",
                    facts=lambda s: dict(history=f"{s.num_history} history slots"))

VIEW = View(
    "toy", "8 · Toy", look_for="Look for: the toy bars.", teaches="A toy view that draws two bars.",
    parts=(Part(toy_view, (Plot("toy figure", "toy-plot", exports=(EXPORT_TOY,)), Text())),),
    cost=_toy_cost, controls=(SHAPE,), needs_model=False)
'''

TOY = r'''
import json
import toy_view
from explorer import views
from explorer.limits import FIGURE_PEAK_BYTES

views.VIEWS[toy_view.VIEW.name] = toy_view.VIEW      # as explorer/views/__init__.py lists its modules' records

import app
from explorer import export, lesson
from explorer.query_string import parse_query
from scripts.readme_tables import views_block
from server import endpoints, lanes
from server.admission import LANES

found = {}
demo = app.build_app()
page = [(type(b).__name__, getattr(b, "label", None), getattr(b, "elem_id", None), getattr(b, "value", None))
        for b in demo.blocks.values()]
found["page"] = (("Tab", "8 · Toy", None, None) in [(t, l, None, None) for t, l, _, _ in page]
                 and ("Plot", "toy figure", "toy-plot") in [p[:3] for p in page]
                 and any(v == "Look for: the toy bars." for *_, v in page) and "toy-plot" in app.LESSON_DATA)
found["api"] = "toy" in [fn.api_name for fn in demo.fns.values()]
fig, text = endpoints.VIEW_ENDPOINTS["toy"]("preset=lecture&seed=5")
found["endpoint"] = [list(fig.data[0].y), text]
flat = endpoints.render_tab("preset=lecture&seed=6", "toy")
found["redraw"] = [list(flat[-2].data[0].y), flat[-1]]
s = parse_query("preset=lecture&num_history=40")
found["cost"] = [lanes.view_work(s, "toy"), views.VIEWS["toy"].estimate(s).peak_bytes - 1000 == FIGURE_PEAK_BYTES]
drawn, left_out = export.all_figures(parse_query("preset=lecture&seed=7"))
found["pack"] = [list(drawn["toy"][0].data[0].y), drawn["toy"][1], export.file_stem(parse_query("preset=lecture"), "toy"),
                 lesson.MAIN_FIGURE["toy"]]
found["readme"] = "| 8 · Toy | A toy view that draws two bars. |" in views_block()
# its own control, declared in its module alone: on its tab, parsed and refused by name, in links and the API's
# controls, labelled, and out of the model's cache key
from explorer import controls
from explorer.query_string import to_query
from explorer.schema import ValidationError
from server import links
found["widget"] = [(t, l, v) for t, l, _, v in page if l == "toy shape (bars or dots)"]
dots = parse_query("preset=lecture&seed=5&toy_shape=dots")
found["link"] = [to_query(dots), parse_query(to_query(dots)) == dots, to_query(parse_query("preset=lecture&seed=5"))]
found["shown"] = [type(endpoints.VIEW_ENDPOINTS["toy"]("preset=lecture&seed=5&toy_shape=dots")[0].data[0]).__name__,
                  endpoints.VIEW_ENDPOINTS["toy"]("preset=lecture&seed=5&toy_shape=dots")[1]]
try:
    parse_query("preset=lecture&toy_shape=cubes")
except ValidationError as e:
    found["refused"] = [str(e), controls.on_screen(e)]
found["page_link"] = controls.from_link({"preset": "lecture", "toy_shape": "cubes", "seed": "3"})[1]
found["api"] = [controls.CONTROL_FIELDS[-1], links.control_values(dots)[-1], controls.LABELS["toy_shape"]]
seeded = parse_query("preset=lecture&seed=5")
found["cache"] = dots.model == seeded.model and dots != seeded
print("FOUND" + json.dumps(found))
'''


@pytest.mark.slow
def test_a_view_added_as_one_record_reaches_every_consumer(tmp_path):
    """A view in a module of its own, its record registered before the app is built: the tab, its figure,
    the API endpoint and the page's redraw, the work the admission estimates, the pack, presentation
    mode's main figure and the README's row all come from that record; and its own control, declared in that
    module alone: its widget on the tab, its parsing and refusal by name, its label, its place in links and
    the API's controls, and the model's cache kept when only it changes."""
    (tmp_path / "toy_view.py").write_text(TOY_MODULE)
    script = tmp_path / "toy.py"
    script.write_text(TOY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    line = next((l for l in done.stdout.splitlines() if l.startswith("FOUND")), None)
    assert line, done.stdout[-2000:] + done.stderr[-4000:]
    found = json.loads(line[5:])
    assert found["page"] and found["api"] and found["readme"]
    assert found["endpoint"] == [[5, 5], "toy of seed 5 as bars"]            # the lecture preset's 5 history slots
    assert found["redraw"] == [[6, 5], "toy of seed 6 as bars"]
    assert found["cost"] == [4e9, True]
    assert found["pack"] == [[7, 5], "Two bars: the seed 7 and 5 history slots.", "toy-lecture-slots", "toy-plot"]
    assert found["widget"] == [["Radio", "toy shape (bars or dots)", "bars"]]
    assert found["link"] == ["preset=lecture&seed=5&toy_shape=dots", True, "preset=lecture&seed=5"]
    assert found["shown"] == ["Scatter", "toy of seed 5 as dots"]
    assert found["refused"] == ["toy_shape: got 'cubes'; allowed: bars, dots",
                                "toy shape: got 'cubes'; allowed: bars, dots"]
    assert found["page_link"] == {"toy_shape": "toy shape: got 'cubes'; allowed: bars, dots"}
    assert found["api"] == ["toy_shape", "dots", "toy shape (bars or dots)"]
    assert found["cache"] is True
