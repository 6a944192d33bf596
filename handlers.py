"""The functions the app's events call, and the state they share: each takes what the page or an API
client sent (a configuration as a URL query string, control values), checks it through explorer.settings
and answers with explorer/'s data and figures. Every refusal names its field (`guarded`); per-visitor
admission and the queue lanes, and the timing sweeps' lifecycle, live here with the handlers that use
them. app.py lays out the page and wires its events to these."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
from urllib.parse import parse_qsl

import gradio as gr
import torch
from gradio.data_classes import FileData
from gradio_client.utils import is_file_obj_with_meta
from pydantic import model_validator

from explorer import admission, controls, export, runs, timing, views
from explorer.admission import LANES, visitor_of
from explorer.controls import CONTROL_FIELDS
from explorer.families import FAMILIES
from explorer.limits import LARGE_REQUEST_FLOPS, check_model_fits, device, view_cost
from explorer.links import parse_query, retired_note, to_query
from explorer.schema import Settings, ValidationError
from explorer.settings import parse_settings, with_family
from models.bugzoo import bug_names
from models.presets import PRESETS

log = logging.getLogger("explorer")

try:  # Hugging Face ZeroGPU: heavy calls borrow a GPU when the Space has one
    import spaces
    gpu = spaces.GPU
except ImportError:
    def gpu(fn):
        return fn

TABS = ("mask", "attention", "anatomy", "isolation", "invariance", "variants", "timing", "export")
# what each tab's redraw fills: (number of outputs, index of its text), in view_outputs' order
TAB_OUTPUTS = {"mask": (4, 1), "attention": (3, 2), "anatomy": (4, 3), "isolation": (3, 2), "invariance": (5, 1),
               "variants": (5, 2)}
VIEW_OUTPUTS = sum(n for n, _ in TAB_OUTPUTS.values())
# Every event that runs the ranking model (control changes, tab redraws, the view endpoints) queues in
# one lane, or in the heavy lane when its estimated work is over LARGE_REQUEST_FLOPS: at most
# LANES["forward"].running small forwards and one heavy at once, whichever event asked. The mask view (no
# model, milliseconds) has its own lane; the page's other queued steps theirs; exports, packs, uploads and
# timing sweeps have lanes of 1. Each lane bounds how many may wait, and how many of them one visitor's
# (explorer.admission): a request over a bound is refused by name when it is pushed. Every other event runs
# outside the queue (queue=False), bounded per visitor by the front door's request rates.
ADMISSION = admission.Admission()


def lane(name: str, units=1, work=None) -> dict:
    """The event keywords of lane `name`: its concurrency group and its admission check (a request
    worth `units` of the lane's rate share, where it has one: a number, or `units(*inputs, request=...)`).
    `work(*inputs, request=...)`: the request's estimated FLOPs, for a view (its lane then follows: its own,
    or heavy)."""
    return dict(concurrency_id=name, concurrency_limit=LANES[name].running, validator=admit_to(name, units, work))


def watch_lanes(demo: gr.Blocks) -> None:
    """Gradio 6 has no public hook on its queue: this is the one place that touches its internals
    (Queue.event_queue_per_concurrency_id, EventQueue.queue). Each lane's queue is made up front as
    an admission.WatchedQueue, so a request's ticket ends the moment it is queued (atomic bounds);
    tests/test_app.py fails if they move."""
    from gradio.queueing import EventQueue
    queues = demo._queue.event_queue_per_concurrency_id
    for name, bound in LANES.items():
        queues[name] = EventQueue(name, bound.running)
        queues[name].queue = admission.WatchedQueue(name, ADMISSION)


def admit_every_event(demo: gr.Blocks) -> None:
    """Any event can be pushed into the queue by its index (Gradio's /queue/join checks no `queue=False`),
    so every one passes a lane's admission: those wired without one (the page's own JS-only steps, the
    unload, an event added later) are checked as page steps. A Stop (an event that `cancels`) takes no
    check — Gradio hands it the session hash instead of its inputs, which a check could not read — and
    runs in microseconds, bounded by the front door's event rate."""
    for fn in demo.fns.values():
        if fn.validator is None and not fn.cancels:
            fn.validator = admit_to("control")
        if fn.concurrency_id not in LANES:
            fn.concurrency_id, fn.concurrency_limit = "control", LANES["control"].running


def lane_now(request, lane_name: str) -> tuple[list, list]:
    """(waiting, running): (visitor key, session) of each event in a lane now."""
    try:
        queue = request.request.app.get_blocks()._queue
        waiting = queue.event_queue_per_concurrency_id.get(lane_name)
        running = [e for job in list(queue.active_jobs) if job for e in job if e.concurrency_id == lane_name]
        return ([visitor_of(e) for e in list(waiting.queue)] if waiting is not None else [],
                [visitor_of(e) for e in running])
    except AttributeError:              # a Gradio that moved them: admit (logged), never refuse everyone
        log.warning("cannot read Gradio's queue: admission bounds are off", exc_info=True)
        return [], []


def admit_to(lane_name: str, units=1, work=None):
    """Gradio's `validator=` for a lane: it runs when an event is pushed, before it is queued, and
    refuses it by name ("queue: got ...") when a bound of the lane would be passed. A model view (`work`
    given) estimated over LARGE_REQUEST_FLOPS is admitted to the heavy lane instead, and its work counts
    against the visitor's share. In the timing lane a new Run replaces the visitor's running sweep (which
    stops within one timed block)."""
    def admit(request: gr.Request, *inputs):
        chosen, flops = lane_name, 0.0
        http = getattr(request, "request", None)
        try:
            if work is not None:
                flops = work(*inputs, request=request)
                chosen = "heavy" if flops > LARGE_REQUEST_FLOPS else lane_name
            taken = units(*inputs, request=request) if callable(units) else units
            ADMISSION.admit(chosen, visitor_of(request), lambda: lane_now(request, chosen), taken, flops, http)
        except ValidationError as e:
            log.info("refused at admission (%s): %s", chosen, e)
            if not inputs:              # no input to mark the refusal on: it is answered in words
                raise gr.Error(as_text(str(e)), print_exception=False) from None
            return refused(str(e), len(inputs))
        if http is not None and chosen != lane_name:
            http.state.lane = chosen                # admission.WatchedQueue queues it in that lane
        if lane_name == "timing":
            TIMING_RUNS.cancel(session_of(request))
        return refused(None, len(inputs)) if inputs else []
    admit.__name__ = f"admit_{lane_name}"
    return admit


def refused(message, n: int):
    """A validator's answer for `n` inputs: one gr.validate each, the refusal (if any) shown on the first. With
    one input Gradio reads the value itself (a 1-tuple would be taken for a valid answer: the check skipped)."""
    verdicts = [gr.validate(message is None, message or "")] + [gr.validate(True, "") for _ in range(n - 1)]
    return verdicts[0] if n == 1 else tuple(verdicts)


def view_work(s: Settings | None, tab: str) -> float:
    """Estimated FLOPs of drawing `tab` with settings `s` (0: no model view, or settings the handler will
    refuse by name anyway)."""
    if s is None or tab not in TAB_OUTPUTS:
        return 0.0
    try:
        return view_cost(s, tab).flops
    except ValidationError:
        return 0.0


def _quietly(parse, *args) -> Settings | None:
    try:
        return parse(*args)
    except (ValidationError, gr.Error, TypeError, ValueError):
        return None


def work_of_query(view: str):
    """`work` for an endpoint of one view taking a query string."""
    return lambda query, request=None: view_work(_quietly(settings_of, query, request), view)


def work_of_tab(query: str, *rest, request=None) -> float:
    """`work` for a redraw of the visible tab: (query, tab) or (query, keys, tab), the tab last."""
    return view_work(_quietly(settings_of, query, request), rest[-1] if rest else "")


def work_of_change(*args, request=None) -> float:
    """`work` for a control change: (every control's value..., tab[, last valid link, marked]); the controls
    as they parse, else the last valid link."""
    n = len(CONTROL_FIELDS)
    values, tab = args[:n], args[n] if len(args) > n else ""
    uploaded = runs.uploads(session_of(request))
    s = _quietly(lambda: parse_settings(dict(zip(CONTROL_FIELDS, values)), uploaded=uploaded))
    if s is None and len(args) > n + 1:
        s = _quietly(settings_of, args[n + 1], request)
    return view_work(s, tab)


def work_of_pick(pick: str, *args, request=None) -> float:
    """`work` for a heatmap click: the pick, then as work_of_change."""
    return work_of_change(*args, request=request)


def work_of_source(source: str, *args, request=None) -> float:
    """`work` for a preset pick (preset, tab) or a family switch (query, family, tab)."""
    if len(args) == 1:
        return view_work(_quietly(lambda: parse_query(preset_endpoint(source))), args[0])
    return view_work(_quietly(lambda: parse_query(family_endpoint(source, args[0], request))), args[1])


FORWARD = lane("forward")
TIMING = lane("timing")
def renders_of_export(query: str, figure: str, fmt: str, aspect: str = "16:9", request=None) -> int:
    """What one export takes of the visitor's render share: 1, or 0 when the handler will refuse it by name
    (a fuzzed or mistyped request costs no share)."""
    try:
        settings_of(query, request, need_model=False)
        export.check_figure(figure), export.check_format(fmt), export.check_aspect(aspect)
    except (ValidationError, gr.Error, TypeError):
        return 0
    return 1


def renders_of_pack(query: str, aspect: str = "16:9", request=None) -> int:
    """A lecture pack renders every figure in every format (0 when it will be refused by name)."""
    try:
        settings_of(query, request, need_model=False)
        export.check_aspect(aspect)
    except (ValidationError, gr.Error, TypeError):
        return 0
    return len(export.FIGURES) * len(export.FORMATS)


EXPORT = lane("export", units=renders_of_export)
EXPORT_PACK = lane("pack", units=renders_of_pack)
# The page's cheap steps that stay in the queue (a page load's gr.Warning about a bad link needs it).
CONTROL = lane("control")
# Uploads: their own lane of 1 (the file check happens in upload_endpoint, so a refusal names the field).
UPLOAD = lane("upload")
# The page's own steps that need no queue (parsing a link, setting controls, JS-only steps): they run at
# once, bounded per visitor by the front door's request rates (explorer.admission.EVENT_RATE).
UNQUEUED = dict(queue=False)


def forward(work) -> dict:
    """The model-view lane for an event whose estimated work `work` computes from its inputs (the heavy lane
    past LARGE_REQUEST_FLOPS)."""
    return lane("forward", work=work)


def light(work) -> dict:
    """The mask view's lane, likewise (a mask of T 2048 is heavy)."""
    return lane("light", work=work)


MAX_MESSAGE_CHARS = 2000


def current_request():
    """The gr.Request of the event being answered (None in a direct call)."""
    from gradio.context import LocalContext
    return LocalContext.request.get(None)


def for_api_client() -> bool:
    """The event being answered comes from an API client (gradio_client and the JS client send
    x-gradio-user: api, MCP mcp; the page sends app), which shows messages as plain text."""
    return (getattr(current_request(), "headers", None) or {}).get("x-gradio-user") in ("api", "mcp")


def as_text(message: str) -> str:
    """A message for a toast, shown as the text it is. Gradio renders gr.Error / gr.Warning messages as
    (sanitised) HTML on the page, and messages echo what a visitor sent — a shared link's
    `?seed=<a href=...>` would become a link in someone else's toast, `<img src=...>` a request to an
    outside host. For the page (or an unknown caller) < and > become entities, so no element can
    start; API clients read the words as they are."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    return message if for_api_client() else message.replace("<", "&lt;").replace(">", "&gt;")


def as_markdown_text(text: str) -> str:
    """`text` (e.g. an uploaded file's name) inside a gr.Markdown value, shown literally: Markdown's
    punctuation backslash-escaped and < > as entities, so no link, image, element or code span can be
    made of it."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~])", r"\\\1", text[:MAX_MESSAGE_CHARS]).replace("<", "&lt;") \
        .replace(">", "&gt;")


def guarded(fn):
    """No traceback reaches the page: the validation layer's refusals (ValidationError) become gr.Error
    with the field named, CUDA out-of-memory frees the caches, anything else — a bug — is logged with
    its traceback and answered "internal error (logged)"."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ValidationError as e:
            raise gr.Error(as_text(str(e)), print_exception=False) from None
        except torch.OutOfMemoryError:
            runs.clear_caches()
            raise gr.Error("out of GPU memory for this configuration; caches were freed — try a shorter "
                           "sequence or a smaller model", print_exception=False) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise gr.Error(f"{fn.__name__}: internal error (logged)", print_exception=False) from None
        finally:                        # the visitor's usage orders the lanes (explorer.admission.Usage)
            ADMISSION.served(visitor_of(current_request())[0], time.monotonic() - started)
    return wrapper


def session_of(request) -> str:
    """The visitor: Gradio's session hash (one per page load; gradio_client keeps one per Client)."""
    return getattr(request, "session_hash", None) or "api"


def settings_of(query: str, request=None, need_model: bool = True) -> Settings:
    """The validated settings of a query string, for the visitor who sent it (their own uploads).
    `need_model=False`: the layout and view options only (the mask view builds no model)."""
    session = session_of(request)
    try:
        return parse_query(query, uploaded=runs.uploads(session), need_model=need_model)
    except ValidationError as e:
        why = runs.forgotten(session, str(e.value).removeprefix("upload:")) if e.field == "weights" else None
        if why:
            raise ValidationError("weights", e.value, f"an upload the server still holds: these weights were "
                                  f"forgotten {why}; upload the file again") from None
        raise


def model_limit(s: Settings) -> str:
    """'' when the model of `s` runs on this device, else why not (the field named), in one line."""
    try:
        check_model_fits(s)
    except ValidationError as e:
        return str(e)
    return ""


# --- endpoints: each takes the configuration as a URL query string -----------------------

@guarded
def mask_endpoint(query: str, request: gr.Request = None):
    s = settings_of(query, request, need_model=False)
    return (*views.mask_view(s), *views.kernel_view(s))


@guarded
def attention_endpoint(query: str, request: gr.Request = None):
    return views.attention_view(settings_of(query, request))


@guarded
def anatomy_endpoint(query: str, request: gr.Request = None):
    return views.anatomy_view(settings_of(query, request))


@guarded
@gpu
def isolation_endpoint(query: str, request: gr.Request = None):
    return views.isolation_view(settings_of(query, request))


@guarded
@gpu
def invariance_endpoint(query: str, request: gr.Request = None):
    s = settings_of(query, request)
    return (*views.invariance_view(s), *views.rope_view(s))


@guarded
def variants_endpoint(query: str, request: gr.Request = None):
    s = settings_of(query, request)
    return (*views.variant_view(s), *views.bug_zoo_view(s))


# the view tabs' endpoints, in TAB_OUTPUTS order (also their API names)
VIEW_ENDPOINTS = {"mask": mask_endpoint, "attention": attention_endpoint, "anatomy": anatomy_endpoint,
                  "isolation": isolation_endpoint, "invariance": invariance_endpoint, "variants": variants_endpoint}
assert tuple(VIEW_ENDPOINTS) == tuple(TAB_OUTPUTS)


@guarded
def timing_request(query: str, lengths: str, backends, geometry: str, dtype: str, request=None):
    """Every timing control checked before anything runs -> (settings, timing.Request)."""
    s = settings_of(query, request, need_model=False)       # attention shapes need no model
    return s, timing.check_request(s, geometry, dtype, lengths, backends)


@guarded
def timing_recorded_curves(req: timing.Request):
    return timing.recorded_records(req.geometry)


@guarded
def timing_step(steps):
    """The next state of a live sweep (run in a worker thread), or None when it is done."""
    with TIMING_RUNS.measuring():
        return next(steps, None)


def timing_outputs(sw: timing.Sweep, req: timing.Request, recorded) -> tuple:
    g = req.geometry
    status = sw.progress() or sw.stopped or f"Done: {len(sw.measured_lengths)} lengths in {sw.elapsed_s:.1f} s."
    note = [f"**{status}** Measured now on **{sw.device}**, {timing.describe(g, req.geometry_name)}; "
            "5 interleaved repeats per point."]
    note += [timing.work_note(sw, g)] if sw.points else []
    note += [timing.throughput_note(sw)] if sw.points else []
    note += [f"{b}: {why}" for b, why in sw.skipped.items()]
    note.append(timing.recorded_summary())
    return (*timing.sweep_figures(sw, recorded, batch=g.B, g=g), "\n\n".join(note))


TIMING_RUNS = timing.TimingRuns()
SMALL_SWEEP_MAX_LEN = 256


async def timing_endpoint(query: str, lengths: str, backends: list, geometry: str = None, dtype: str = None,
                          request: gr.Request = None):
    """Run a live sweep, streaming the figures after each length. The sweep runs in a worker thread;
    if this event is cancelled (Stop, or a client that cancels its job) the run's flag is set and the
    cancellation is answered at once; the thread stops within one timed block, and the next sweep
    starts measuring only after that, so "one sweep at a time" holds however many are cancelled."""
    s, req = timing_request(query, lengths, backends, geometry or timing.geometries()[0],
                            dtype or timing.dtypes()[0], request)
    session = session_of(request)
    await TIMING_RUNS.wait_stopped()
    run = TIMING_RUNS.start(session)
    steps = timing.sweep(s, req, run)
    loop = asyncio.get_running_loop()
    # a sweep past SMALL_SWEEP_MAX_LEN yields to small requests (runs at a lower CPU priority); a small one
    # (milliseconds a step) would only wait behind them, holding the lane of one sweep at a time
    pool = runs.LOW_PRIORITY if max(req.lengths) > SMALL_SWEEP_MAX_LEN else None
    ends_with_thread = False
    try:
        recorded = await loop.run_in_executor(None, timing_recorded_curves, req)
        while True:
            step = loop.run_in_executor(pool, timing_step, steps)
            try:
                sw = await asyncio.shield(step)
            except asyncio.CancelledError:
                run.cancel()
                if not step.done():             # the thread ends the run when it stops
                    ends_with_thread = True
                    TIMING_RUNS.stopping(step)
                    step.add_done_callback(lambda _: (TIMING_RUNS.end(session, run), steps.close()))
                raise
            if sw is None:
                return
            yield await loop.run_in_executor(None, timing_outputs, sw, req, recorded)   # figures: off the event loop
    finally:
        if not ends_with_thread:
            TIMING_RUNS.end(session, run)
            steps.close()


def stop_timing(request: gr.Request = None):
    """Stop the visitor's sweep -> the line under the controls saying how far it got."""
    return TIMING_RUNS.cancel(session_of(request))


@guarded
def timing_options(query: str, geometry: str, dtype: str, chosen, request: gr.Request = None):
    """The backends this device runs for the geometry and dtype (only those can be ticked) and a
    line naming the others and why."""
    s = settings_of(query, request, need_model=False)
    why = timing.backend_options(s, geometry, dtype)
    usable = [b for b, reason in why.items() if reason is None]
    keep = [b for b in (chosen or []) if b in usable] or timing.default_backends(usable)
    return gr.update(choices=usable, value=keep), timing.backend_notes(s, geometry, dtype)


@guarded
def timing_lengths(query: str, geometry: str, request: gr.Request = None):
    s = settings_of(query, request, need_model=False)
    return gr.update(value=timing.default_lengths(timing.check_choice("timing geometry", geometry, timing.geometries()),
                                                  s.num_candidates))


@guarded
def timing_lengths_kept(query: str, geometry: str, lengths: str, request: gr.Request = None):
    """On opening the tab: the lengths typed stay while they fit the sidebar's candidates, else the
    defaults for them (phoenix-2026's 128 candidate slots need T > 128)."""
    s = settings_of(query, request, need_model=False)
    g = timing.geometry(s, geometry, timing.dtypes()[0])
    try:
        timing.parse_lengths(lengths, g.num_candidates)
        return gr.skip()
    except ValidationError:
        return timing_lengths(query, geometry, request)


def timing_check(query: str, lengths: str, backends, geometry: str, dtype: str, request: gr.Request = None):
    """Checked as the controls change, before Run: the message sits under the controls and Run is
    disabled while something is wrong."""
    try:
        timing_request(query, lengths, backends, geometry, dtype, request)
    except gr.Error as e:
        return f"**Cannot run:** {as_markdown_text(e.message)}", gr.update(interactive=False)
    return "", gr.update(interactive=True)


@guarded
def timing_recorded(query: str, geometry: str, dtype: str, current, request: gr.Request = None):
    """Before a live run: the committed curves for this geometry (a drawn live run is kept)."""
    if current is not None:
        return [gr.skip()] * 5
    s = settings_of(query, request, need_model=False)
    g = timing.geometry(s, geometry, dtype)
    return (*timing.timing_view(s, geometry, dtype), f"Press **Run** to measure {timing.describe(g, geometry)} "
            f"now.\n\n{timing.recorded_summary()}")


def timing_recorded_on_link(tab: str, query: str, geometry: str, dtype: str, current, request: gr.Request = None):
    return timing_recorded(query, geometry, dtype, current, request) if tab == "timing" else [gr.skip()] * 5


@guarded
def export_endpoint(query: str, figure: str, fmt: str, aspect: str = "16:9", request: gr.Request = None):
    # mask, tile and timing figures need no model: they export at every preset (export.figure checks
    # the model for the figures that run it)
    return export.export_figure(settings_of(query, request, need_model=False), figure, fmt, aspect=aspect)


@guarded
def lecture_pack_endpoint(query: str, aspect: str = "16:9", request: gr.Request = None):
    return export.lecture_pack(settings_of(query, request, need_model=False), aspect=aspect)


@guarded
def upload_endpoint(query: str, path: str, request: gr.Request = None):
    if isinstance(path, NotAFile):
        raise ValidationError("weights file", str(path), path.why)
    s = settings_of(query, request)
    if not path:
        raise ValidationError("weights file", path, "a .npz or .safetensors file")
    name = runs.load_upload(s, path, session_of(request), visitor_of(request)[0])
    s = parse_settings({**s.to_dict(), "weights": f"upload:{name}"}, uploaded=runs.uploads(session_of(request)))
    return to_query(s), (f"Loaded {as_markdown_text(os.path.basename(path))}: every shape matches; "
                         "the views now use it (for this visitor only).")


def page_gone(request: gr.Request = None):
    """The page was closed, or its connection dropped: its uploads go runs.PAGE_GONE_GRACE_S later
    unless it comes back (any request of the session), rather than after runs.UPLOAD_TTL_S."""
    runs.page_gone(session_of(request))


# --- controls <-> query string --------------------------------------------------------------


@guarded
def settings_endpoint(request: gr.Request, *values):
    """Every control's value, in Settings field order -> the validated query string."""
    return to_query(parse_settings(dict(zip(CONTROL_FIELDS, values)), uploaded=runs.uploads(session_of(request))))


def control_values(s: Settings) -> list:
    return [getattr(s, f) for f in CONTROL_FIELDS]


@guarded
def family_endpoint(query: str, family: str, request: gr.Request = None):
    """The model family switches what it fixes (explorer.settings.with_family) and keeps the rest; like a
    preset, on any device (the model views name the limit)."""
    return to_query(with_family(settings_of(query, request, need_model=False), family))


@guarded
def preset_endpoint(preset: str):
    """A preset resets every model and layout control to its values, the family included (production's
    presets run on production's trunk, grok.py's on grok.py's). Every preset is offered on every device:
    the mask view draws it, and model views say when its model does not fit here."""
    return to_query(parse_settings({"preset": preset}, need_model=False))


def source_change_on_page(query: str, tab: str, request=None) -> list:
    """After a preset or family switch on the page, in the same round trip: the query string, the device
    note, every control set from it and the visible tab redrawn (one event instead of four chained)."""
    return ([query, limit_endpoint(query, request)] + query_to_controls(query, request)
            + render_tab(query, tab, request))


@guarded
def present_key_on_page(query: str, keys: str, tab: str, request: gr.Request = None):
    """Presentation mode's keys, comma-separated (those pressed since the last answer): the view stepped
    (explorer.controls.step_view), every control set from it and the visible tab redrawn."""
    s = settings_of(query, request, need_model=False)
    for key in str(keys or "").split(",")[:64]:
        if key:
            s = controls.step_view(s, key)
    return source_change_on_page(to_query(s), tab, request)


@guarded
def preset_on_page(preset: str, tab: str, request: gr.Request = None):
    return source_change_on_page(preset_endpoint(preset), tab, request)


@guarded
def family_on_page(query: str, family: str, tab: str, request: gr.Request = None):
    return source_change_on_page(family_endpoint(query, family, request), tab, request)


def preset_choices():
    """Presets whose model does not fit this device say so in the list, before anyone picks them."""
    choices = []
    for name in PRESETS:
        limit = model_limit(parse_settings({"preset": name}, need_model=False))
        choices.append((f"{name} — mask view only on {device().upper()} (model too large)" if limit else name, name))
    return choices


@guarded
def load_endpoint(request: gr.Request):
    """Read the page's URL (a shared link) into the controls and open the tab it names. A bad value is
    dropped and its control marked; the rest of the link is kept. -> (query, tab, tabs, {field: message})"""
    params = dict(request.query_params) if request is not None else {}
    if retired_note(params):
        gr.Info(as_text(f"link: {retired_note(params)}"))
    tab = params.get("tab", "mask")
    tab = tab if tab in TABS else "mask"
    weights = params.get("weights", "")
    if isinstance(weights, str) and weights.startswith("upload:"):    # a reload: its old page's upload is its own
        runs.adopt(session_of(request), visitor_of(request)[0], weights.removeprefix("upload:"))
    s, problems = controls.from_link(params, runs.uploads(session_of(request)))
    if problems:
        gr.Warning(as_text("link: " + "; ".join(problems.values()) + ". The rest of the link was kept; the "
                           "control is marked."))
    return to_query(s), tab, gr.Tabs(selected=tab), problems


@guarded
def link_to_controls(query: str, problems: dict, request: gr.Request = None):
    """After a page load: every control set from the link, the values it dropped marked at their controls."""
    values = query_to_controls(query, request)
    for f, message in (problems or {}).items():
        if f in CONTROL_FIELDS:
            values[CONTROL_FIELDS.index(f)]["info"] = "⚠ " + message
            values[CONTROL_FIELDS.index(f)]["elem_classes"] = ["invalid"]
    return values


@guarded
def head_of_link(query: str, request: gr.Request = None):
    """The head dropdown set from the link, nothing redrawn: presentation mode's ↑ ↓ drawn by the page
    (static/page.js stepHead); later changes read the head from the dropdown."""
    return gr.update(value=settings_of(query, request, need_model=False).head)


@guarded
def query_to_controls(query: str, request: gr.Request = None):
    """Set every control from the query string; the head and weights lists follow the settings."""
    s = settings_of(query, request, need_model=False)
    clear = dict(info=None, elem_classes=[])        # a preset, upload or link replaces every marked value
    values = [gr.update(value=v, **clear) for v in control_values(s)]
    values[CONTROL_FIELDS.index("head")] = gr.update(choices=head_choices(s), value=s.head, **clear)
    values[CONTROL_FIELDS.index("weights")] = gr.update(choices=weight_choices(request), value=s.weights, **clear)
    return values


def bug_choices():
    """Every family's bugs, each under its family's name: a seed notebook's (grok.py) or a serving-kernel
    quirk (production); picking one of the other family's marks the menu with the family to switch to."""
    return [("none", "none")] + [(f"{FAMILIES[family].split(' (')[0]} · {name}", name)
                                 for family in FAMILIES for name in bug_names(family)]


def head_choices(s: Settings):
    return [("all heads (grid)", -1)] + [(f"head {h} (KV {h // (s.num_q_heads // s.num_kv_heads)})", h)
                                        for h in range(s.num_q_heads)]


def weight_choices(request=None):
    """The weight sources, with this visitor's own uploads (never anyone else's)."""
    names = [("trained demo", "demo"), ("random (seed)", "random"), ("grok.py zeros", "zeros")]
    return names + [(f"uploaded {n}", f"upload:{n}") for n in runs.uploads(session_of(request))]


@guarded
def control_change(request: gr.Request, *args):
    """What one control change does on the page, in one round trip: validate every control, write
    the query string, keep the head list in step with the geometry, redraw the visible tab."""
    *values, tab = args
    query = settings_endpoint(request, *values)
    s = settings_of(query, request)
    return [query, gr.update(choices=head_choices(s), value=s.head)] + render_tab(query, tab, request)


@guarded
def control_change_on_page(request: gr.Request, *args):
    """The page's control change: like control_change, but an invalid value is marked at its control
    (its message under it) instead of refusing the whole change; the last valid view stays drawn and
    every other control keeps working. Model views name the device limit instead of failing."""
    *values, tab, last_query, marked = args
    last = settings_of(last_query, request, need_model=False)
    s, problems = controls.keep_valid(dict(zip(CONTROL_FIELDS, values)), last, runs.uploads(session_of(request)))
    query = to_query(s)
    limit = model_limit(s)
    marks = {f: gr.update(info="⚠ " + msg, elem_classes=["invalid"]) for f, msg in problems.items()}
    for f in set(marked or []) - set(problems):
        marks[f] = gr.update(info=None, elem_classes=[])
    updates = [marks.get(f, gr.skip()) for f in CONTROL_FIELDS]
    head = CONTROL_FIELDS.index("head")
    updates[head] = gr.update(choices=head_choices(s), value=s.head, **({"info": None, "elem_classes": []}
                                                                       if "head" in (marked or []) else {}))
    if "head" in problems:
        updates[head] = gr.update(choices=head_choices(s), info="⚠ " + problems["head"], elem_classes=["invalid"])
    views_out = render_tab(query, tab, request) if query != last_query else [gr.skip()] * VIEW_OUTPUTS
    note = "\n\n".join(n for n in (controls.last_valid_note(problems), limit_note(limit)) if n)
    return [query, sorted(problems), note] + updates + views_out


PICKED = ("layer", "head", "query")


@guarded
def pick_on_page(request: gr.Request, pick: str, *args):
    """A click on a heatmap cell (static/page.js writes `layer=1&head=3&query=7`, or only `query` for a
    panel of no one head): those controls set together, then the usual control change; the layer and
    query boxes show the values drawn."""
    *values, tab, last_query, marked = args
    chosen = dict(parse_qsl(pick if isinstance(pick, str) else "", keep_blank_values=True))
    if not chosen or set(chosen) - {*PICKED, "n"}:
        raise ValidationError("pick", pick, "layer=<int>&head=<int>&query=<int> from a click on a heatmap")
    for f in PICKED:
        if f in chosen:
            values[CONTROL_FIELDS.index(f)] = chosen[f]
    out = control_change_on_page(request, *values, tab, last_query, marked)
    s = settings_of(out[0], request, need_model=False)
    first = 3                            # control_change_on_page: query, marked, note, then the controls
    for f in ("layer", "query"):
        if f in chosen and f not in out[1]:
            out[first + CONTROL_FIELDS.index(f)] = gr.update(value=getattr(s, f))
    return out


@guarded
def limit_endpoint(query: str, request: gr.Request = None) -> str:
    """The note above the tabs for a configuration: '' or the model's device limit."""
    return limit_note(model_limit(settings_of(query, request, need_model=False)))


def limit_note(limit: str) -> str:
    return (f"⚠ **This model does not fit on {device().upper()}** — {limit}. The Mask tab still draws the layout; "
            "the model views wait for smaller settings." if limit else "")


@guarded
def render_tab(query: str, tab: str, request: gr.Request = None):
    """Redraw only the visible tab (the others redraw when they are opened)."""
    if not isinstance(tab, str) or tab not in TABS:
        raise ValidationError("tab", tab, ", ".join(TABS))
    s = settings_of(query, request, need_model=False)   # every tab checks the query, also those drawn on demand
    limit = model_limit(s)
    out = {t: None for t in TABS}
    if limit and tab in TAB_OUTPUTS and tab != "mask":
        n, text = TAB_OUTPUTS[tab]
        out[tab] = [None] * n
        out[tab][text] = limit_note(limit)
        tab = "none"
    if tab in VIEW_ENDPOINTS:
        out[tab] = VIEW_ENDPOINTS[tab](query, request)
    flat = []
    for t, (n, _) in TAB_OUTPUTS.items():
        flat += list(out[t]) if out[t] is not None else [gr.skip()] * n
    return flat


# --- the weights upload: anything but an uploaded file answered by name ---------------------------

class UploadedFile(FileData):
    """FileData that lets a value which is no uploaded file through as an empty path: pydantic would
    wrap any error raised here (gr.Error is a ValueError) into Gradio's generic message. A dict
    without Gradio's `meta` marker is no uploaded file either (Gradio would refuse it in words that
    reach an API client as a blank error)."""
    @model_validator(mode="before")
    @classmethod
    def anything_else_as_empty_path(cls, value):
        if isinstance(value, FileData) or is_file_obj_with_meta(value):
            return value
        return {"path": "", "orig_name": str(value)[:200], "meta": {"_type": "gradio.FileData"}}


class NotAFile(str):
    """What the weights file input holds when it was sent no file it takes: the value sent (as text), and
    what is allowed (`why`), for upload_endpoint's message."""

    def __new__(cls, sent, why: str):
        text = super().__new__(cls, str(sent))
        text.why = why
        return text


def weights_file(**kw) -> gr.File:
    """A file input that answers anything but an uploaded file (e.g. a server-side path string from an
    API client) with "weights file: got ...; allowed: ..." instead of Gradio's generic error."""
    upload = gr.File(**kw)
    upload.data_model = UploadedFile
    preprocess = upload.preprocess

    def uploaded_only(payload):
        # no exception here: the upload lane's admission check preprocesses the inputs too, and an
        # exception there would reach the visitor as a bare HTTP 400; upload_endpoint names the field
        if isinstance(payload, FileData) and not payload.path:
            return NotAFile(payload.orig_name, "a .npz or .safetensors file uploaded through the page or "
                            "gradio_client.handle_file")
        try:
            return preprocess(payload)
        except gr.Error:                # Gradio's own check (a file type outside file_types)
            name = getattr(payload, "orig_name", None) or os.path.basename(str(getattr(payload, "path", "")))
            return NotAFile(name, "a .npz or .safetensors file (never pickle)")
    upload.preprocess = uploaded_only
    return upload
