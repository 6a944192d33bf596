"""Attention explorer for recommendation transformers — the Gradio app. Layout and wiring only:
the work lives in explorer/ (plain functions) and models/.

    python app.py            # http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override)

Every view is also an API endpoint taking the URL query string of a configuration, e.g.
``Client("http://127.0.0.1:7860").predict("preset=lecture&head=1", api_name="/attention")``.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import signal
import threading
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qsl

import gradio as gr
import torch
from gradio.data_classes import FileData
from gradio_client.utils import is_file_obj_with_meta
from pydantic import model_validator

from explorer import admission, controls, export, lesson, runs, timing, views
from explorer.admission import LANES, QUEUE_MAX, visitor_of
from explorer.controls import CONTROL_FIELDS, LABELS
from explorer.settings import (COLOR_SCALES, FAMILIES, INVARIANCE_OPS, MAX_BATCH, PERTURBATIONS, PRESETS,
                               VALUE_KINDS, XREX_ROPE, ZOOMS, Settings, ValidationError, check_model_fits, device,
                               parse_query, parse_settings, retired_note, sweep_budget_s, to_query, with_family)
from models.attention import CAP_METHODS
from models.grok import ROPE_MODES
from models.masks import MASK_KINDS, PREFIX_MODES
from models.bugzoo import bug_names
from models.variants import VARIANTS

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
# one lane: at most LANES["forward"].running forwards at once across all of them, whichever event
# asked. The mask view (no model, milliseconds) has its own; exports (one kaleido browser), uploads
# and timing sweeps have lanes of 1. Each lane bounds how many may wait, and how many of them one
# visitor's (explorer.admission): a request over a bound is refused by name when it is pushed.
ADMISSION = admission.Admission()


def lane(name: str) -> dict:
    """The event keywords of lane `name`: its concurrency group and its admission check."""
    return dict(concurrency_id=name, concurrency_limit=LANES[name].running, validator=admit_to(name))


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


def admit_to(lane_name: str):
    """Gradio's `validator=` for a lane: it runs when an event is pushed, before it is queued, and
    refuses it by name ("queue: got ...") when a bound of the lane would be passed. In the timing
    lane a new Run replaces the visitor's running sweep (which stops within one timed block)."""
    def admit(request: gr.Request, *inputs):
        # Gradio wants one gr.validate per input, the refusal shown on the first; with one input it
        # reads the value itself (a 1-tuple would be taken for a valid answer: the check skipped)
        verdicts = [gr.validate(True, "") for _ in inputs]
        try:
            ADMISSION.admit(lane_name, visitor_of(request), lambda: lane_now(request, lane_name))
        except ValidationError as e:
            log.info("refused at admission (%s): %s", lane_name, e)
            verdicts[0] = gr.validate(False, str(e))
        else:
            if lane_name == "timing":
                TIMING_RUNS.cancel(session_of(request))
        return verdicts[0] if len(verdicts) == 1 else tuple(verdicts)
    admit.__name__ = f"admit_{lane_name}"
    return admit


FORWARD = lane("forward")
TIMING = lane("timing")
EXPORT = lane("export")
# The mask view runs no model (a few ms): its own lane, so a lecture's /mask never queues behind
# four probe passes on phoenix-nano.
LIGHT = lane("light")
# Uploads: their own lane of 1, with no admission check: a validator sees Gradio's preprocessed
# inputs, and the file check in that preprocessing ("weights file: got ...") would then reach the
# visitor as a bare HTTP 400. The raw upload route's per-visitor share and QUEUE_MAX bound them.
UPLOAD = dict(concurrency_id="upload", concurrency_limit=1)


MAX_MESSAGE_CHARS = 2000


def for_api_client() -> bool:
    """The event being answered comes from an API client (gradio_client and the JS client send
    x-gradio-user: api, MCP mcp; the page sends app), which shows messages as plain text."""
    from gradio.context import LocalContext
    request = LocalContext.request.get(None)
    return (getattr(request, "headers", None) or {}).get("x-gradio-user") in ("api", "mcp")


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
    ends_with_thread = False
    try:
        recorded = await loop.run_in_executor(None, timing_recorded_curves, req)
        while True:
            step = loop.run_in_executor(runs.LOW_PRIORITY, timing_step, steps)   # yields to small requests
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
            yield timing_outputs(sw, req, recorded)
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

FIELD_TYPES = {f.name: f.type for f in fields(Settings)}


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



# --- controls whose values reach the endpoints as sent ------------------------------------------
# Every event that reads a control passes preprocess=False (Gradio's own event option), so the value
# arrives as sent: no rounding (2.5 -> 2, True -> 1), no parsing ("nan" in a number box) and no choice
# check ("Value: bogus is not in the list of choices", which names no field). explorer.settings then
# answers every bad value with "field: got ...; allowed: ...". tests/test_app.py checks that every
# event reading a Number, Dropdown, Radio or CheckboxGroup has it.
RAW = dict(preprocess=False)
CHECKED_BY_SETTINGS = (gr.Number, gr.Dropdown, gr.Radio, gr.CheckboxGroup)


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


def weights_file(**kw) -> gr.File:
    """A file input that answers anything but an uploaded file (e.g. a server-side path string from an
    API client) with "weights file: got ...; allowed: ..." instead of Gradio's generic error."""
    upload = gr.File(**kw)
    upload.data_model = UploadedFile
    preprocess = upload.preprocess

    def uploaded_only(payload):
        if isinstance(payload, FileData) and not payload.path:
            raise gr.Error(as_text(str(ValidationError(
                "weights file", payload.orig_name, "a .npz or .safetensors file uploaded through the page or "
                "gradio_client.handle_file"))), print_exception=False)
        return preprocess(payload)
    upload.preprocess = uploaded_only
    return upload


# --- layout -----------------------------------------------------------------------------------

# The page's own scripts and styles: every static/*.js goes into the page's <head> once (each defines
# functions on window.explorer, which the events below call by name), every static/*.css into its styles.
STATIC = Path(__file__).resolve().parent / "static"
# The lesson (explorer/lesson.py) goes first, as data for static/present.js; "</" escaped inside the script;
# with it the Settings field order, in which page.js writes a link as the server does.
LESSON_DATA = json.dumps({"steps": lesson.as_data(), "main": lesson.MAIN_FIGURE}).replace("</", "<\\/")
HEAD = (f"<script>\nwindow.explorer = window.explorer || {{}};\nexplorer.lessonData = {LESSON_DATA};\n"
        f"explorer.fields = {json.dumps(CONTROL_FIELDS)};\n</script>\n"
        + "".join(f"<script>\n{p.read_text()}\n</script>\n" for p in sorted(STATIC.glob("*.js"))))
CSS_PATHS = sorted(STATIC.glob("*.css"))
WRITE_URL = "(q, tab) => explorer.writeUrl(q, tab)"
PICK_ROW = "() => explorer.pickRow()"
COPY_LINK = "() => explorer.copyLink()"
# display changes the page draws itself from the data it holds: control -> the page.js call (new link)
IN_BROWSER = {"color": "(kind, q) => explorer.recolour(kind, q)"}
# the query row, drawn by the page where the attention tab holds its row (else it counts a redraw)
QUERY_ROW = "(v, q, n) => explorer.queryRow(v, q, n)"
LAYER = "(layer, v, q, n) => explorer.layerPick(layer, v, q, n)"        # likewise, the bars' layer in the grid

# what to look for, one line per tab
LOOK_FOR = {
    "mask": "Look for: the candidate block's diagonal (each candidate sees the user, the history and only "
            "itself) against the causal mask, where later candidates also see earlier ones.",
    "attention": "Look for: candidate rows attend to history and to themselves only; heads sharing a KV head "
                 "(grouped query attention) often look alike; switch colour to quantile or log on random weights.",
    "anatomy": "Look for: how one query row is built — q·k per key, scaled, capped, masked to −∞, normalised by the "
               "softmax, and the weights mixing the values into the output. Layer, head (the grid shows head 0) and "
               "query row are chosen above the tabs.",
    "isolation": "Look for: under the recsys mask, perturbing candidate j changes only its own column; under the "
                 "causal mask the change leaks into every later candidate.",
    "invariance": "Look for: with sequential RoPE positions, reordering candidates moves their scores; with shared "
                  "or no positions they stay put (batch invariance).",
    "variants": "Look for: in the trained model's last row, the weight on the queried key/value pair (outlined).",
    "timing": "Look for: where a fused kernel that skips empty tiles (flex here) pulls away from naive as T grows, "
              "and how its speed-up compares with the grey line, what skipping work alone could save.",
    "export": "Look for: figures redrawn in the lecture theme at 16:9, with captions describing each one.",
}

def number_boxes(d: Settings, c: dict, names: list[str], **kw) -> None:
    """A number box per Settings field, labelled (explorer.controls.LABELS); integer boxes for int fields.
    explorer.settings checks the value either way."""
    for field in names:
        c[field] = gr.Number(label=LABELS[field], value=getattr(d, field),
                             precision=None if FIELD_TYPES[field] == "float" else 0,
                             **kw)


# Gradio keeps every upload and every returned file (exports) in its cache: every 15 minutes, files
# older than an hour are removed (a download link lives that long).
DELETE_CACHE = (900, 3600)


# --- layout: one builder per part of the page. `c` collects the controls by Settings field; each view
# tab returns its outputs in its endpoint's order. ----------------------------------------------------

def page_header(d: Settings) -> SimpleNamespace:
    gr.Markdown(elem_id="page-header", value="# Attention explorer for recommendation transformers\n"
                "Faithful PyTorch ports of X's phoenix rankers — the 2025 open-source `grok.py` and the 2026 "
                "production trunk (`phoenix-2026*` presets, *model family*): masks, heatmaps from the model's "
                "own forward, candidate isolation, batch invariance, RoPE and live kernel timings.")
    return SimpleNamespace(
        query=gr.Textbox(label="Link to this view (query string)", value=to_query(d), buttons=["copy"],
                         interactive=False, elem_id="query"),
        present=gr.Button("Present: the figure full-screen, keys step it (Esc leaves)", size="sm",
                          elem_id="present-btn"),
        key=gr.Button("key", elem_id="present-key"),     # clicked by static/present.js with the keys pressed
        # the visible tab; a hidden Textbox, not gr.State, so API calls can name the tab to redraw
        tab_state=gr.Textbox("mask", visible=False),
        marked=gr.State([]),            # the controls marked invalid, to clear when they are fixed
        limit_md=gr.Markdown(elem_id="limit-note"),
        # never shown: triggers and outputs for the API-only endpoints
        hidden_q=gr.Textbox(visible=False), hidden_out=gr.Textbox(visible=False),
        # on the page but hidden by static/page.css: page.js writes a heatmap click here (pick_on_page)
        pick=gr.Textbox(elem_id="pick", show_label=False, container=False),
        # likewise: page.js counts here a query row change it could not draw itself (the server redraws)
        query_redraw=gr.Textbox(elem_id="query-redraw", show_label=False, container=False))


def source_controls(d: Settings, c: dict, page: SimpleNamespace) -> None:
    """The sidebar's top: preset, family, weights (and the upload), seed, link, zoom."""
    c["preset"] = gr.Dropdown(preset_choices(), value=d.preset, label=LABELS["preset"])
    c["family"] = gr.Radio([(label, name) for name, label in FAMILIES.items()], value=d.family,
                           label=LABELS["family"])
    c["weights"] = gr.Dropdown(weight_choices(), value=d.weights, label=LABELS["weights"])
    number_boxes(d, c, ["seed"])
    page.upload = weights_file(label="upload weights (.npz / .safetensors, haiku names of the family chosen)",
                               file_types=[".npz", ".safetensors"], type="filepath", height=120)
    page.upload_msg = gr.Markdown()
    page.copy = gr.Button("Copy link", size="sm")
    c["zoom"] = gr.Radio(list(ZOOMS), value=d.zoom, label=LABELS["zoom"])


def layout_controls(d: Settings, c: dict) -> None:
    with gr.Accordion("sequence layout", open=True):
        number_boxes(d, c, ["num_user", "num_history", "num_candidates", "history_padding", "candidate_padding"])
        with gr.Row():
            number_boxes(d, c, ["batch_size", "row"], min_width=80)


def model_controls(d: Settings, c: dict) -> None:
    with gr.Accordion("model", open=False):
        number_boxes(d, c, ["emb_size", "key_size", "num_q_heads", "num_kv_heads", "num_layers", "widening_factor",
                            "multiplier"])
        c["cap_method"] = gr.Radio(list(CAP_METHODS), value=d.cap_method, label=LABELS["cap_method"])
        number_boxes(d, c, ["logit_cap"])
        c["prefix"] = gr.Radio(list(PREFIX_MODES), value=d.prefix,
                               label=LABELS["prefix"])
    with gr.Accordion("RoPE", open=False):
        number_boxes(d, c, ["rope_base", "rope_offset"])
        c["rope_mode"] = gr.Radio([*ROPE_MODES, XREX_ROPE], value=d.rope_mode, label=LABELS["rope_mode"])


def view_controls(d: Settings, c: dict) -> None:
    """Above the tabs: the attention and anatomy views read these."""
    with gr.Row():
        number_boxes(d, c, ["layer"], elem_id="layer-box")
        c["head"] = gr.Dropdown(head_choices(d), value=d.head, label=LABELS["head"])
        number_boxes(d, c, ["query"], elem_id="query-row")


def mask_tab(d: Settings, c: dict) -> list:
    c["compare"] = gr.Dropdown(list(MASK_KINDS), value=d.compare, label=LABELS["compare"])
    return [gr.Plot(label="mask", elem_id="mask-plot"), gr.Markdown(),
            gr.Plot(label="production's kernels: tiles run and skipped", elem_id="kernel-plot"), gr.Markdown()]


def attention_tab(d: Settings, c: dict) -> list:
    with gr.Row():
        c["values"] = gr.Radio(list(VALUE_KINDS), value=d.values, label=LABELS["values"])
        c["color"] = gr.Radio(list(COLOR_SCALES), value=d.color, label=LABELS["color"])
    return [gr.Plot(label="attention", elem_id="attention-plot"), gr.Plot(label="query row", elem_id="query-bars-plot"),
            gr.Markdown(elem_id="query-text")]


def anatomy_tab(d: Settings, c: dict) -> list:
    return [gr.Plot(label="q and k after RoPE", elem_id="anatomy-plot"),
            gr.Plot(label="q·k → weights, step by step"), gr.Plot(label="weighted sum of V"), gr.Markdown()]


def isolation_tab(d: Settings, c: dict) -> list:
    with gr.Row():
        number_boxes(d, c, ["candidate"])
        c["perturbation"] = gr.Radio(list(PERTURBATIONS), value=d.perturbation, label=LABELS["perturbation"])
        number_boxes(d, c, ["delta", "replace_with"])
    text = gr.Markdown()
    return [gr.Plot(label="change per layer and position", elem_id="isolation-plot"),
            gr.Plot(label="change per candidate"), text]


def invariance_tab(d: Settings, c: dict) -> list:
    c["operation"] = gr.Radio(list(INVARIANCE_OPS), value=d.operation, label=LABELS["operation"])
    return [gr.Plot(label="score change", elem_id="invariance-plot"), gr.Markdown(),
            gr.Plot(label="RoPE angles"), gr.Plot(label="q·k vs distance"), gr.Markdown()]


def variants_tab(d: Settings, c: dict) -> list:
    with gr.Row():
        c["variant"] = gr.Dropdown(list(VARIANTS), value=d.variant, label=LABELS["variant"])
        c["bug"] = gr.Dropdown(bug_choices(), value=d.bug, label=LABELS["bug"])
    text = gr.Markdown()
    fig = gr.Plot(label="variant attention", elem_id="variants-plot")
    loss = gr.Plot(label="training loss of every variant", elem_id="variants-loss-plot")
    bug_text = gr.Markdown()
    return [fig, loss, text, gr.Plot(label="attention with the bug"), bug_text]


def timing_tab(d: Settings, c: dict) -> SimpleNamespace:
    geometry0, dtype0 = timing.geometries()[0], timing.dtypes()[0]
    t = SimpleNamespace()
    with gr.Row():
        t.geometry = gr.Radio(list(timing.geometries()), value=geometry0, scale=3,
                              label="shapes (mask and logit cap: the sidebar's)")
        t.dtype = gr.Radio(list(timing.dtypes()), value=dtype0, label="dtype", scale=2)
    with gr.Row():
        t.lengths = gr.Textbox(timing.default_lengths(geometry0, d.num_candidates), label="sequence lengths T", scale=3)
        t.run = gr.Button("Run", variant="primary", scale=1)
        t.stop = gr.Button("Stop", scale=1)
    usable0, unavailable0 = timing_options(to_query(d), geometry0, dtype0, None)
    t.backends = gr.CheckboxGroup(usable0["choices"], value=usable0["value"], label="backends that run here")
    t.unavailable = gr.Markdown(unavailable0)
    t.message = gr.Markdown(elem_id="timing-check")
    text = gr.Markdown(timing.recorded_summary())
    with gr.Row():
        # no label badge: it would sit over the figure's own title
        time_fig = gr.Plot(label="time", elem_id="time-plot", show_label=False)
        mem_fig = gr.Plot(label="memory", show_label=False)
    with gr.Row():
        speed_fig, err_fig = gr.Plot(label="speed-up", show_label=False), gr.Plot(label="error", show_label=False)
    t.figures = [time_fig, mem_fig, speed_fig, err_fig, text]
    return t


def export_tab(d: Settings, c: dict) -> SimpleNamespace:
    e = SimpleNamespace()
    with gr.Row():
        e.figure = gr.Dropdown(list(export.FIGURES), value="attention", label="figure")
        e.format = gr.Radio(list(export.FORMATS), value="png", label="format")
        e.aspect = gr.Radio(list(export.ASPECTS), value="16:9", label="slide shape")
        e.figure_btn = gr.Button("Export figure")
        e.pack_btn = gr.Button("Lecture pack (zip)", variant="primary")
    gr.Markdown("Figures are drawn again from the current settings in the lecture theme (large fonts, tick labels "
                "of at least 16 px, colour-blind-safe colours, white background) at the slide shape chosen (16:9: "
                "1600 × 900); PNG at 3x scale, named for the preset, layer, head and row shown. The lecture pack "
                "holds every figure this device can draw at these settings (PNG, SVG and the numbers drawn as NPZ), "
                "captions made from each figure's settings, a list of what was left out and why, and "
                "`lesson.html`: every figure interactive in lesson order, offline.")
    e.file = gr.File(label="download", elem_id="export-file")
    return e


# every tab in TABS order: its title and builder
TAB_BUILDERS = {"mask": ("1 · Mask", mask_tab), "attention": ("2 · Attention", attention_tab),
                "anatomy": ("2b · Anatomy", anatomy_tab), "isolation": ("3 · Isolation", isolation_tab),
                "invariance": ("4 · Invariance & RoPE", invariance_tab), "variants": ("5 · Variants", variants_tab),
                "timing": ("6 · Flash vs naive", timing_tab), "export": ("7 · Export", export_tab)}
assert tuple(TAB_BUILDERS) == TABS


# --- wiring: one function per group of events ---------------------------------------------------

HIDDEN = dict(api_visibility="undocumented")      # the page's own steps: not on the API page


def redraw(page: SimpleNamespace, event, after: str):
    """After `event`: the address bar follows the query, then the visible tab is redrawn."""
    return (event.then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN)
            .then(render_tab, [page.query, page.tab_state], page.view_outputs, api_name=f"render_after_{after}",
                  **figures_of(page.view_outputs), **HIDDEN, **FORWARD))


def picked(control: gr.components.Component):
    """The event of a visitor's own change of `control`. A dropdown's is .select: its .input fires twice
    per pick in Gradio 6 (two identical redraws queued back to back)."""
    return control.select if isinstance(control, gr.Dropdown) else control.input


# The progress animation only on the figures: Gradio redraws a status tracker for every output of an
# event (here every control, to mark an invalid one), a cost paid on every change for nothing.
def figures_of(outputs: list) -> dict:
    return dict(show_progress="minimal", show_progress_on=[o for o in outputs if isinstance(o, gr.Plot)])


def wire_controls(page: SimpleNamespace, c: dict) -> None:
    """Any control -> validated query string + the visible tab redrawn, in one round trip; an invalid value
    is marked at its control and the rest keeps working. API clients get the same change, refused with
    the field named. A click on a heatmap cell sets its layer, head and query row together (PICK_ROW). The
    colour scale is redrawn in the browser (IN_BROWSER), and the query row where the page holds it (QUERY_ROW,
    else the server redraws), and the layer in the every-head grid (LAYER): the next server change reads them
    from their controls."""
    controls = [c[f] for f in CONTROL_FIELDS]
    page.pick.change(pick_on_page, [page.pick] + controls + [page.tab_state, page.query, page.marked],
                    [page.query, page.marked, page.limit_md] + controls + page.view_outputs,
                    api_name="render_after_pick", trigger_mode="always_last", **figures_of(page.view_outputs), **HIDDEN,
                    **FORWARD, **RAW).then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN)
    for f, js in IN_BROWSER.items():    # no server request: the page redraws and writes the link
        picked(c[f])(None, [c[f], page.query], [page.query], js=js, api_name=f"{f}_in_browser", **HIDDEN, **RAW) \
            .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN)
    picked(c["query"])(None, [c["query"], page.query, page.query_redraw], [page.query, page.query_redraw], js=QUERY_ROW,
                       api_name="query_in_browser", **HIDDEN, **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN)
    picked(c["layer"])(None, [c["layer"], c["query"], page.query, page.query_redraw], [page.query, page.query_redraw],
                       js=LAYER, api_name="layer_in_browser", **HIDDEN, **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN)
    gr.on([picked(c[f]) for f in CONTROL_FIELDS if f not in ("preset", "family", "query", "layer", *IN_BROWSER)]
          + [page.query_redraw.change], control_change_on_page,
          controls + [page.tab_state, page.query, page.marked],
          [page.query, page.marked, page.limit_md] + controls + page.view_outputs,
          api_name="render_on_change", trigger_mode="always_last", **figures_of(page.view_outputs), **HIDDEN,
          **FORWARD, **RAW).then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN)
    page.hidden_q.change(control_change, controls + [page.tab_state], [page.query, c["head"]] + page.view_outputs,
                         api_name="control_change", **FORWARD, **RAW)
    page.hidden_q.blur(settings_endpoint, controls, page.hidden_out, api_name="settings", **RAW)


def wire_sources(page: SimpleNamespace, c: dict) -> None:
    """A preset, a family or an uploaded file sets many controls at once and the visible tab redraws: on
    the page in one round trip. /preset and /family answer API clients with the query string alone
    (hidden_q never fires in the browser)."""
    controls = [c[f] for f in CONTROL_FIELDS]
    for name, api_fn, page_fn, inputs, trigger in (
            ("preset", preset_endpoint, preset_on_page, [c["preset"]], page.hidden_q.focus),
            ("family", family_endpoint, family_on_page, [page.query, c["family"]], page.hidden_q.select)):
        trigger(api_fn, inputs, page.hidden_out, api_name=name, **RAW)
        outputs = [page.query, page.limit_md] + controls + page.view_outputs
        picked(c[name])(page_fn, inputs + [page.tab_state], outputs, api_name=f"render_after_{name}",
                        **figures_of(outputs), **HIDDEN, **FORWARD, **RAW) \
            .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN)
    ev = page.upload.upload(upload_endpoint, [page.query, page.upload], [page.query, page.upload_msg],
                            api_name="upload_weights", **UPLOAD)
    redraw(page, ev.success(query_to_controls, page.query, controls, api_name="sync_upload",
                            show_progress="hidden", **HIDDEN), "upload")


def wire_navigation(demo: gr.Blocks, page: SimpleNamespace, c: dict) -> None:
    """Opening a tab redraws it; a page load reads its link; closing the page forgets its uploads."""
    for name, tab in page.tab.items():
        tab.select(lambda n=name: n, None, page.tab_state, api_name=f"tab_{name}", show_progress="hidden",
                   **HIDDEN) \
           .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN) \
           .then(render_tab, [page.query, page.tab_state], page.view_outputs, api_name=f"render_{name}",
                 **figures_of(page.view_outputs), **HIDDEN, **FORWARD)
    page.copy.click(None, None, None, api_name="copy_link",
                    js=COPY_LINK)
    redraw(page, demo.load(load_endpoint, None, [page.query, page.tab_state, page.tabs, page.marked], api_name="load",
                           **HIDDEN)
           .success(link_to_controls, [page.query, page.marked], [c[f] for f in CONTROL_FIELDS], api_name="sync_load",
                    show_progress="hidden", **HIDDEN)
           .then(limit_endpoint, page.query, page.limit_md, api_name="limit_after_load", **HIDDEN), "load")
    demo.load(None, None, None, js=PICK_ROW, api_name="pick_row", **HIDDEN)
    demo.unload(page_gone)


def wire_presentation(page: SimpleNamespace, c: dict) -> None:
    """Presentation mode (static/present.js): the Present button enters it in the browser; the keys pressed
    step the view on the server in one round trip (controls set, visible tab redrawn, link moved)."""
    outputs = [page.query, page.limit_md] + [c[f] for f in CONTROL_FIELDS] + page.view_outputs
    page.key.click(present_key_on_page, [page.query, page.hidden_out, page.tab_state], outputs,
                   js="(q, keys, tab) => [q, explorer.present.pendingKey, tab]", api_name="render_after_key",
                   **figures_of(outputs), **HIDDEN, **FORWARD, **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **HIDDEN) \
        .then(None, None, None, js="() => explorer.present.done()", **HIDDEN)
    page.present.click(None, None, None, js="() => explorer.present.enter()", api_name="present", **HIDDEN)


def wire_view_api(page: SimpleNamespace, outputs: dict) -> None:
    """The API: one endpoint per view, the configuration as a query string."""
    for name in TAB_OUTPUTS:
        page.hidden_q.submit(VIEW_ENDPOINTS[name], page.hidden_q, outputs[name], api_name=name,
                             **(LIGHT if name == "mask" else FORWARD))


def wire_timing(page: SimpleNamespace, t: SimpleNamespace) -> None:
    inputs = [page.query, t.lengths, t.backends, t.geometry, t.dtype]
    # the figures stay drawn while measuring (progress is in the text): no overlay hides them
    run_ev = t.run.click(timing_endpoint, inputs, t.figures, api_name="timing", show_progress="hidden",
                         **TIMING, **RAW)
    # Stop sets the run's own flag and cancels the event: the figures keep what was streamed so far
    t.stop.click(stop_timing, None, t.message, cancels=[run_ev], api_name="stop_timing", queue=False)
    # the timing controls are checked as they change (the message under them, Run disabled while
    # something is wrong); these helpers stay callable but off the API page
    quiet = dict(api_visibility="undocumented", show_progress="hidden", queue=False, **RAW)
    check = dict(fn=timing_check, inputs=inputs, outputs=[t.message, t.run], **quiet)
    # on opening the tab, not on every change of the link: a display change drawn in the browser
    # writes the link and must not call the server
    gr.on([t.geometry.input, t.dtype.input, page.tab["timing"].select], timing_options,
          [page.query, t.geometry, t.dtype, t.backends], [t.backends, t.unavailable],
          api_name="timing_options", **quiet).then(api_name="timing_check_after_options", **check)
    t.geometry.input(timing_lengths, [page.query, t.geometry], t.lengths, api_name="timing_lengths", **quiet) \
        .then(api_name="timing_check_after_lengths", **check)
    page.tab["timing"].select(timing_lengths_kept, [page.query, t.geometry, t.lengths], t.lengths,
                              api_name="timing_lengths_kept", **quiet).then(api_name="timing_check_after_kept", **check)
    gr.on([t.lengths.input, t.backends.input], api_name="timing_check", trigger_mode="always_last", **check)
    page.tab["timing"].select(timing_recorded, [page.query, t.geometry, t.dtype, t.figures[0]], t.figures,
                              api_name="timing_recorded", **{**quiet, "queue": True})
    # a link that opens on this tab (the lesson's timing step) draws the committed curves as well
    page.tab_state.change(timing_recorded_on_link, [page.tab_state, page.query, t.geometry, t.dtype, t.figures[0]],
                          t.figures, api_name="timing_recorded_on_link", **{**quiet, "queue": True})


def wire_export(page: SimpleNamespace, e: SimpleNamespace) -> None:
    e.figure_btn.click(export_endpoint, [page.query, e.figure, e.format, e.aspect], e.file, api_name="export_figure",
                       **EXPORT, **RAW)
    e.pack_btn.click(lecture_pack_endpoint, [page.query, e.aspect], e.file, api_name="lecture_pack",
                     **EXPORT, **RAW)


def build_app() -> gr.Blocks:
    d, c = parse_settings({}), {}
    with gr.Blocks(title="Attention explorer for recommendation transformers", delete_cache=DELETE_CACHE) as demo:
        page = page_header(d)
        with gr.Row():
            with gr.Column(scale=1, min_width=300, elem_id="sidebar"):
                source_controls(d, c, page)
                with gr.Accordion("lesson: two stories, step by step", open=False):
                    gr.Markdown(lesson.index_markdown())
                layout_controls(d, c)
                model_controls(d, c)
            with gr.Column(scale=4):
                view_controls(d, c)
                built, page.tab = {}, {}
                with gr.Tabs() as page.tabs:
                    for name, (title, build) in TAB_BUILDERS.items():
                        with gr.Tab(title, id=name) as page.tab[name]:
                            gr.Markdown(LOOK_FOR[name])
                            built[name] = build(d, c)
        page.view_outputs = [out for name in TAB_OUTPUTS for out in built[name]]
        wire_controls(page, c)
        wire_sources(page, c)
        wire_navigation(demo, page, c)
        wire_presentation(page, c)
        wire_view_api(page, built)
        wire_timing(page, built["timing"])
        wire_export(page, built["export"])
    demo.queue(default_concurrency_limit=4, max_size=QUEUE_MAX)
    watch_lanes(demo)
    keep_outputs_out_of_session_state()
    return demo


# What Gradio keeps per session: a copy of the page's config (~240 KB) and, by default, the last value
# of every output (the figures: 17 MB for a heavy mask, 346 MB for a zoomed grid), for 10,000 sessions
# and an hour after a page closes — outside every ceiling of ours, and a client mints a session per
# call. This app offers no deep links (the one reader of those values), so none are kept, and at most
# admission.SESSION_CAPACITY sessions are (oldest dropped first: its page keeps working, the next event
# of it starts a fresh state; the address bar carries the settings).


def keep_outputs_out_of_session_state() -> None:
    """Gradio's SessionState._update_value_in_config copies each output's value into the session's
    deep-link config: made a no-op (the one other place, with watch_lanes, that touches Gradio's
    internals; tests/test_app.py fails if it moves)."""
    from gradio.state_holder import SessionState
    SessionState._update_value_in_config = lambda self, key, value: None


def launch_options() -> dict:
    """demo.launch keywords: the front door (body and upload-route bounds per visitor) and the
    session capacity."""
    from starlette.middleware import Middleware
    return dict(show_error=True, max_file_size=f"{runs.MAX_UPLOAD_BYTES}b", head=HEAD, css_paths=CSS_PATHS,
                state_session_capacity=admission.SESSION_CAPACITY, app_kwargs={"middleware": [Middleware(admission.FrontDoor)]})



def warm_up() -> None:
    """Build the default view's model, then phoenix-nano's (~10 M parameters take seconds to
    initialise), in the background after start-up, so the first visitor to pick it waits less."""
    for query in ("preset=lecture", "preset=phoenix-nano"):
        try:
            runs.forward(settings_of(query))
        except Exception:               # a warm-up is best effort; the real request reports errors
            log.exception("warm-up of %s failed", query)
    if os.environ.get("EXPLORER_PREWARM_FLEX", "1") == "0":     # the localhost launcher's tests and benchmarks
        return
    try:                                # then flex's compiles for the timing tab's default Run
        timing.prewarm(settings_of("preset=lecture"))
    except Exception:
        log.exception("warm-up of the timing tab's flex kernels failed")


# show_error=True: our own functions answer every problem as a gr.Error already (`guarded`), so what
# this adds is Gradio's own refusal of a malformed call — "An event handler (mask_endpoint) didn't
# receive enough input values (needed: 1, got: 0)" — which show_error=False blanks to {"error": null}.
def stop_on_sigterm() -> None:
    """SIGTERM (a Space restarting, `kill`) ends the server like Ctrl-C: Gradio closes it and the
    interpreter exits normally, so atexit handlers run (export folders in the temp dir are removed)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    stop_on_sigterm()
    runs.configure_threads()            # once, before any worker thread runs a forward
    runs.start_idle_trim()
    warm = threading.Timer(3.0, warm_up)
    warm.daemon = True
    warm.start()
    build_app().launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                       server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                       **launch_options())
