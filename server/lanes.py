"""The queue's lanes and the admission check every event passes before it is queued.

Every event that runs the ranking model (control changes, tab redraws, the view endpoints) queues in
one lane, or in the heavy lane when its estimated work (explorer.views.View.estimate) is over
LARGE_REQUEST_FLOPS: at most LANES["forward"].running small forwards and one heavy at once, whichever
event asked. A view's work is estimated from exactly the settings its handler will draw (the functions
of server.endpoints that the handler calls too), and a handler drawing more than was admitted is refused
(server.admission.check_drawn). Where a `work` returns what it read (server.guard.Read: the page's control
change and heatmap click), admission keeps it on the request and the handler draws from it: the settings
read once, the view's cost estimated once. A view already drawn for the same settings (explorer.views.View.kept:
a class on one lecture step) is admitted to the kept lane with no work share, and answered from those outputs,
pinned on the request. The mask view (no model, milliseconds) has its own lane; the
page's other queued steps theirs; exports, packs, uploads and timing sweeps have lanes of 1 (a Run whose sweep
measures what one running, waiting or just kept measures waits in the watchers' lane instead: timing_lane). Each lane bounds how many
may wait, and how many of them one visitor's (server.admission): a request over a bound is refused by name
when it is pushed, or, in a full lane, pushes out the heaviest network's latest. A page's redraw supersedes
its waiting ones. Every other event runs outside the queue (queue=False), bounded per visitor by the front
door's request rates."""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

import gradio as gr

from explorer import export, timing
from explorer.controls import CONTROL_FIELDS
from explorer.limits import LARGE_REQUEST_FLOPS
from explorer.schema import Settings, ValidationError
from explorer.settings import parse_settings

from . import admission, uploads
from .admission import ADMISSION, LANES, LaneFull
from .backoff import BACKOFF
from .fair_queue import WatchedQueue
from .gradio_patches import SKIP
from .visitors import visitor_of
from .endpoints import PageChange, kept_view, linked, picked, read_page_change, stepped, tab_cost
from .guard import Read, Work, as_text, session_of, settings_of
from .links import family_endpoint, preset_endpoint
from .timing_events import timing_request
from .timing_runs import TIMING_RUNS, identical_waiting

log = logging.getLogger("explorer")


def lane(name: str, units=1, work=None, redraw: bool = False, route=None) -> dict:
    """The event keywords of lane `name`: its concurrency group and its admission check (a request
    worth `units` of the lane's rate share, where it has one: a number, or `units(*inputs, request=...)`).
    `work(*inputs, request=...)`: the request's estimated FLOPs, for a view (its lane then follows: its own,
    or heavy), or what it read (server.guard.Read, its FLOPs estimated), kept for the handler. `redraw`: a
    page's redraw of its views, superseding the page's waiting ones. `route(*inputs, request=...)`: the lane
    the request waits in instead, where it chooses (a timing Run: timing_lane)."""
    return dict(concurrency_id=name, concurrency_limit=LANES[name].running,
                validator=admit_to(name, units, work, redraw, route))


def watch_lanes(demo: gr.Blocks) -> None:
    """Gradio 6 has no public hook on its queue: this module reads and changes it here, in lane_now and in
    push_out (Queue.event_queue_per_concurrency_id, EventQueue.queue, active_jobs, delete_lock); the rest of
    its internals are server.gradio_patches'. Each lane's queue is made up front as an
    fair_queue.WatchedQueue, so a request's ticket ends the moment it is queued (atomic bounds);
    tests/test_app.py fails if they move."""
    from gradio.queueing import EventQueue
    queues = demo._queue.event_queue_per_concurrency_id
    for name, bound in LANES.items():
        queues[name] = EventQueue(name, bound.running)
        queues[name].queue = WatchedQueue(name, ADMISSION, on_pushed_out=answer_pushed_out)


def admit_every_event(demo: gr.Blocks) -> None:
    """Any event can be pushed into the queue by its index (Gradio's /queue/join checks no `queue=False`),
    so every one passes a lane's admission: those wired without one (the page's own JS-only steps, the
    unload, an event added later) are checked as page steps. A Stop (an event that `cancels`) takes no
    check — Gradio hands it the session hash instead of its inputs, which a check could not read — and
    runs in microseconds, bounded by the front door's event rate and, like every push, by its visitor's
    rate of new sessions (server.gradio_patches.bound_sessions)."""
    for fn in demo.fns.values():
        if fn.validator is None and not fn.cancels:
            fn.validator = admit_to("control")
        if fn.concurrency_id not in LANES:
            fn.concurrency_id, fn.concurrency_limit = "control", LANES["control"].running


def lane_now(request, lane_name: str) -> tuple[list, list]:
    """(waiting, running): server.admission.Held of each event in a lane now."""
    try:
        queue = request.request.app.get_blocks()._queue
        waiting = queue.event_queue_per_concurrency_id.get(lane_name)
        running = [e for job in list(queue.active_jobs) if job for e in job if e.concurrency_id == lane_name]
        held = [ADMISSION.held(e) for e in (list(waiting.queue) if waiting is not None else [])]
        return [h for h in held if h], [h for h in map(ADMISSION.held, running) if h]
    except AttributeError:              # a Gradio that moved them: admit (logged), never refuse everyone
        log.warning("cannot read Gradio's queue: admission bounds are off", exc_info=True)
        return [], []


PUSHED_OUT = ValidationError("queue", "your place in a full lane", "room first for a visitor whose network holds "
                             "less of the lane than yours; try again in a moment")


def push_out(request, event) -> None:
    """Answer a waiting `event` that an arrival pushed out of its full lane (server.admission.check_admission)
    with PUSHED_OUT."""
    take_out(request, event, _pushed_out_payload(), success=False)


def answer_pushed_out(event) -> None:
    """(on the event loop, as Gradio queues it) Answer with PUSHED_OUT an event whose admission ticket an
    arrival pushed out before it was queued (fair_queue.WatchedQueue did not queue it)."""
    from gradio.server_messages import ProcessCompletedMessage
    queue = event.request.app.get_blocks()._queue
    queue.event_ids_to_events.pop(event._id, None)
    queue.send_message(event, ProcessCompletedMessage(output=_pushed_out_payload(), success=False))


def _pushed_out_payload() -> dict:
    from gradio.utils import error_payload
    return error_payload(gr.Error(as_text(str(PUSHED_OUT)), print_exception=False), True)


# the lanes a page's redraw waits in (its view's: server.lanes.page_redraw, heavy past LARGE_REQUEST_FLOPS, kept
# where its view is drawn already)
REDRAW_LANES = ("forward", "heavy", "light", "kept")


def answer_superseded(request, page: tuple) -> None:
    """`page`'s newer redraw was just admitted: its older ones still waiting are answered at once, every output
    left as the page shows it (gr.skip), instead of when their turn comes (they would run as no-ops): a
    lecturer who switches presets twice sees no figure wait, behind the heavy lane's running work, for the
    redraw of the preset left behind. Only the page's own redraws are looked at (this runs on every redraw's
    admission): their mark names the page (admit_to writes it)."""
    try:
        queues = request.request.app.get_blocks()._queue.event_queue_per_concurrency_id
    except AttributeError:                  # no Gradio queue behind the request (an in-process call): none waits
        return
    for name in REDRAW_LANES:
        for event in list(getattr(queues.get(name), "queue", ())):
            state = getattr(getattr(event, "request", None), "state", None)
            mark = getattr(state, "redraw", None)
            if (mark is not None and tuple(mark[0]) == page and not getattr(event, "_pushed_out", False)
                    and ADMISSION.superseded(state)):
                event._pushed_out = True
                take_out(request, event, {"data": [dict(SKIP) for _ in event.fn.outputs], "is_generating": False,
                                          "iterator": None, "duration": 0.0, "average_duration": None,
                                          "render_config": None, "changed_state_ids": []}, success=True)


_TAKING_OUT: set = set()         # the tasks of take_out, held until they end (the loop keeps only weak references)


def take_out(request, event, output: dict, success: bool) -> None:
    """Take a waiting `event` (marked `_pushed_out`: it counts no more) out of Gradio's queue, in a task of the
    event loop that admission runs on (admit_to), under the queue's own lock (its reader removes entries there),
    and answer it with `output`. If it started meanwhile, it runs (and counts again)."""
    from gradio.server_messages import ProcessCompletedMessage
    queue = request.request.app.get_blocks()._queue

    async def drop():
        async with queue.delete_lock:
            try:
                queue.event_queue_per_concurrency_id[event.concurrency_id].queue.remove(event)
            except (KeyError, ValueError):
                event._pushed_out = False           # it started: it counts again, and runs
                return
            queue.event_ids_to_events.pop(event._id, None)
        queue.send_message(event, ProcessCompletedMessage(output=output, success=success))
    task = asyncio.get_running_loop().create_task(drop())
    _TAKING_OUT.add(task)
    task.add_done_callback(_TAKING_OUT.discard)


def admit_to(lane_name: str, units=1, work=None, redraw: bool = False, route=None):
    """Gradio's `validator=` for a lane: it runs when an event is pushed, before it is queued, and
    refuses it by name ("queue: got ...") when a bound of the lane would be passed. A model view (`work`
    given) estimated over LARGE_REQUEST_FLOPS is admitted to the heavy lane instead, and its work counts
    against the visitor's share; what was admitted is written on the request (`admitted_flops`: the view
    checks it before drawing; `read`: what `work` read, where it returns a Read, for the handler to draw). A
    page redraw (`redraw`) is numbered: the page's older waiting ones then run as no-ops. In the timing lane
    a new Run replaces the visitor's running sweep (which stops within one timed block).
    A coroutine, so Gradio awaits it on the event loop instead of handing it to a worker thread: where the link
    was read before (explorer.query_string and View.estimate keep their answers) its reading takes microseconds,
    and the worker's round trip cost the loop more than that, and the event one more turn of the loop, which
    every mode of the soak keeps saturated."""
    def check(request: gr.Request, *inputs):
        chosen, flops, read, kept = lane_name, 0.0, None, None
        http = getattr(request, "request", None)
        visitor = visitor_of(request)
        try:
            if route is not None:
                chosen = route(*inputs, request=request)
            if work is not None:
                found = work(*inputs, request=request)
                read = found if isinstance(found, Read) else None
                flops, kept = getattr(found, "flops", found), kept_of(found)
                chosen = "kept" if kept is not None else "heavy" if flops > LARGE_REQUEST_FLOPS else lane_name
            taken = units(*inputs, request=request) if callable(units) else units
            number, victim = ADMISSION.admit(chosen, visitor, lambda: lane_now(request, chosen), taken,
                                             0.0 if kept is not None else flops, http, redraw)
        except ValidationError as e:
            log.info("refused at admission (%s): %s", chosen, e)
            if not isinstance(e, LaneFull):
                BACKOFF.refused(visitor[0])
            if not inputs:              # no input to mark the refusal on: it is answered in words
                raise gr.Error(as_text(str(e)), print_exception=False) from None
            return refused(str(e), len(inputs))
        if http is not None:
            http.state.admitted_flops = flops
            if read is not None:
                http.state.read = read              # server.guard.admitted_read: the handler draws from it
            if chosen != lane_name:
                http.state.lane = chosen            # fair_queue.WatchedQueue queues it in that lane
            if kept is not None:                    # server.endpoints.view_draw answers from them
                http.state.kept = (found.tab, found.settings, kept)
            if number is not None:
                http.state.redraw = (visitor, number)
        if victim is not None:
            log.info("pushed out of the full %s lane: a request of %s", chosen, victim.key)
            if not isinstance(victim.event, admission.Ticket):     # a ticket is answered as it enters
                push_out(request, victim.event)
        if redraw and http is not None:
            answer_superseded(request, tuple(visitor))
        if lane_name == "timing":           # in either lane: the visitor stops watching what it watched
            TIMING_RUNS.cancel(session_of(request))
        return refused(None, len(inputs)) if inputs else []

    async def admit(request: gr.Request, *inputs):
        return check(request, *inputs)
    admit.__name__ = f"admit_{lane_name}"
    return admit


def refused(message, n: int):
    """A validator's answer for `n` inputs: one gr.validate each, the refusal (if any) shown on the first. With
    one input Gradio reads the value itself (a 1-tuple would be taken for a valid answer: the check skipped)."""
    verdicts = [gr.validate(message is None, message or "")] + [gr.validate(True, "") for _ in range(n - 1)]
    return verdicts[0] if n == 1 else tuple(verdicts)


def view_request(s: Settings | None, tab: str) -> Work:
    """What drawing `tab` with settings `s` is: its estimated FLOPs (0: no model view, a model this device does
    not run — the handler then draws only the note — or settings the handler will refuse by name anyway)."""
    cost = tab_cost(s, tab)
    return Work(tab, s, cost.flops if cost is not None else 0.0, cost is not None)


def view_work(s: Settings | None, tab: str) -> float:
    """Estimated FLOPs of drawing `tab` with settings `s` (view_request's)."""
    return view_request(s, tab).flops


def kept_of(work) -> Optional[tuple]:
    """The outputs already drawn and kept for what `work` (a Work or a Read) will draw, else None."""
    if not isinstance(work, (Work, Read)) or not work.drawn or work.settings is None:
        return None
    return kept_view(work.tab, work.settings)


def _quietly(parse, *args) -> Settings | None:
    try:
        return parse(*args)
    except (ValidationError, gr.Error, TypeError, ValueError):
        return None


def work_of_query(view: str):
    """`work` for an endpoint of one view taking a query string."""
    return lambda query, request=None: view_request(_quietly(settings_of, query, request), view)


def work_of_tab(query: str, *rest, request=None) -> Work:
    """`work` for a redraw of the visible tab: (query, tab), the tab last."""
    return view_request(_quietly(settings_of, query, request), rest[-1] if rest else "")


def work_of_change(*args, request=None) -> Work | float:
    """`work` for an API client's control change: (every control's value..., tab), checked as the handler
    checks them (one bad value refuses the whole change)."""
    change = _quietly(lambda: PageChange.of(args, last_link=False))
    if change is None:
        return 0.0
    uploaded = uploads.uploads(session_of(request))
    return view_request(_quietly(lambda: parse_settings(dict(zip(CONTROL_FIELDS, change.values)), uploaded=uploaded)),
                     change.tab)


def work_of_page_change(*args, request=None) -> Read | float:
    """`work` for the page's control change: (every control's value..., tab, last valid link) -> what the
    handler draws, read once (server.endpoints.read_page_change: the valid controls, the last link's value
    for each invalid one; nothing drawn when the link did not change) and kept for the handler; 0 when it
    will refuse by name (it then reads the inputs itself, and refuses)."""
    read = _quietly(lambda: read_page_change(PageChange.of(args), request))
    return 0.0 if read is None else read


def work_of_figure(query: str, figure: str, *rest, request=None) -> float:
    """`work` for drawing one exportable figure (the Export tab's preview): its view's FLOPs (a figure is drawn
    from its part, never answered from the whole view's kept outputs)."""
    spec = export.FIGURES.get(figure) if isinstance(figure, str) else None
    return view_work(_quietly(settings_of, query, request), spec.view.name if spec else "")


def work_of_pick(pick: str, *args, request=None) -> Read | float:
    """`work` for a heatmap click: the controls the pick sets (server.endpoints.picked), then as the page's
    control change."""
    read = _quietly(lambda: read_page_change(picked(pick, PageChange.of(args))[0], request))
    return 0.0 if read is None else read


def work_of_keys(query: str, keys: str, tab: str, request=None) -> Work:
    """`work` for presentation mode's keys: the view they step to (server.endpoints.stepped)."""
    return view_request(_quietly(lambda: stepped(query, keys, request)), tab)


def work_of_link(link: str, request=None) -> Work | float:
    """`work` for Back / Forward: the view at the address they went to (server.endpoints.linked)."""
    drawn = _quietly(lambda: linked(link, request))
    return 0.0 if drawn is None else view_request(drawn[0], drawn[2])


def work_of_source(source: str, *args, request=None) -> Work:
    """`work` for a preset pick (preset, tab) or a family switch (query, family, tab)."""
    if len(args) == 1:
        return view_request(_quietly(lambda: settings_of(preset_endpoint(source), request)), args[0])
    return view_request(_quietly(lambda: settings_of(family_endpoint(source, args[0], request), request)), args[1])


FORWARD = lane("forward")


def timing_lane(query: str, lengths: str, backends, geometry: str = None, dtype: str = None, request=None) -> str:
    """The lane of a Run: "watch" when its sweep measures what another visitor's running, waiting or kept sweep
    measures (explorer.timing.measurement_key; server.timing_runs answers it with that one, so it takes no place
    in the timing lane, and holds one of the watchers' lane per visitor and address), else "timing". Its key is
    written on its request, so a later identical Run finds it waiting. A Run the handler will refuse by name:
    "timing"."""
    try:
        s, req = timing_request(query, lengths, backends, geometry or timing.geometries()[0],
                                dtype or timing.dtypes()[0], request)
    except (ValidationError, gr.Error, TypeError, ValueError):
        return "timing"
    key = timing.measurement_key(req)
    http = getattr(request, "request", None)
    if http is not None:
        http.state.timing_key = key
    session = session_of(request)
    joins = TIMING_RUNS.joinable(key, session) or identical_waiting(key, session)
    return "watch" if joins else "timing"


TIMING = lane("timing", route=timing_lane)


def renders_of_export(query: str, figure: str, fmt: str, aspect: str = "16:9", request=None) -> int:
    """What one export takes of the visitor's render share: 1, or 0 when the handler will refuse it by name
    (a fuzzed or mistyped request costs no share) or return a file kept from an earlier export of the same
    (a class exporting the lecture's figure: one render)."""
    try:
        s = settings_of(query, request, need_model=False)
        export.check_figure(figure), export.check_format(fmt), export.check_aspect(aspect)
    except (ValidationError, gr.Error, TypeError):
        return 0
    return 0 if export.is_kept(s, figure, fmt, aspect) else 1


def renders_of_pack(query: str, aspect: str = "16:9", request=None) -> int:
    """A lecture pack renders every figure in every format (0 when it will be refused by name, or when the
    same pack is kept: a class downloading the lecture's pack renders it once, and takes one pack's share)."""
    try:
        s = settings_of(query, request, need_model=False)
        export.check_aspect(aspect)
    except (ValidationError, gr.Error, TypeError):
        return 0
    return 0 if export.pack_is_kept(s, aspect) else len(export.FIGURES) * len(export.FORMATS)


EXPORT = lane("export", units=renders_of_export)


EXPORT_PACK = lane("pack", units=renders_of_pack)


# The page's cheap steps that stay in the queue (a page load's gr.Warning about a bad link needs it).
CONTROL = lane("control")


# Uploads: their own lane of 1 (the file check happens in upload_endpoint, so a refusal names the field).
UPLOAD = lane("upload")


# The page's own steps that need no queue (parsing a link, setting controls, JS-only steps): they run at
# once, bounded per visitor by the front door's request rates (server.front_door.EVENT_RATE).
UNQUEUED = dict(queue=False)


def forward(work) -> dict:
    """The model-view lane for an event whose estimated work `work` computes from its inputs (the heavy lane
    past LARGE_REQUEST_FLOPS)."""
    return lane("forward", work=work)


def page_redraw(work) -> dict:
    """The model-view lane for a page's redraw of its views, likewise; the page's newer redraw supersedes it
    while it waits."""
    return lane("forward", work=work, redraw=True)


def light(work) -> dict:
    """The mask view's lane, likewise (a mask of T 2048 is heavy)."""
    return lane("light", work=work)
