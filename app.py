"""Attention explorer for recommendation transformers — the Gradio app. Layout and wiring only:
the work lives in explorer/ (plain functions) and models/.

    python app.py            # http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override)

Every view is also an API endpoint taking the URL query string of a configuration, e.g.
``Client("http://127.0.0.1:7860").predict("preset=lecture&head=1", api_name="/attention")``.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import threading
from dataclasses import fields
from urllib.parse import urlencode

import gradio as gr
import torch
from gradio.data_classes import FileData
from gradio_client.utils import is_file_obj_with_meta
from pydantic import model_validator

from explorer import export, runs, timing, views
from explorer.settings import (COLOR_SCALES, FAMILIES, INVARIANCE_OPS, LANES, MAX_BATCH, PERTURBATIONS, PRESETS,
                               QUEUE_MAX, VALUE_KINDS, XREX_ROPE, ZOOMS, Settings, ValidationError, check_admission,
                               check_model_fits, device, parse_query, parse_settings, retired_note, sweep_budget_s,
                               to_query, with_family)
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
# asked. Exports (one kaleido browser), uploads and timing sweeps have their own lanes of 1. Each lane
# also bounds how many may wait, and how many of them one visitor's (explorer.settings.LANES): a
# request over a bound is refused by name when it is pushed, before it takes a place in the queue.
def lane(name: str) -> dict:
    """The event keywords of lane `name`: its concurrency group and its admission check."""
    return dict(concurrency_id=name, concurrency_limit=LANES[name].running, validator=admission(name))


def queued_visitors(request, lane_name: str) -> list:
    """The visitors (session hashes) of the events waiting in a lane now, one entry per event.
    Gradio 6 has no public reader of its queue: this is the one place that reads its internals
    (Queue.event_queue_per_concurrency_id); tests/test_app.py fails if they move."""
    try:
        waiting = request.request.app.get_blocks()._queue.event_queue_per_concurrency_id.get(lane_name)
        return [event.session_hash for event in waiting.queue] if waiting is not None else []
    except AttributeError:              # a Gradio that moved them: admit (logged), never refuse everyone
        log.warning("cannot read Gradio's queue: admission bounds are off", exc_info=True)
        return []


def admission(lane_name: str):
    """Gradio's `validator=` for a lane: it runs when an event is pushed, before it is queued, and
    refuses it by name ("queue: got ...") when a bound of the lane would be passed. In the timing
    lane a new Run replaces the visitor's running sweep (which stops within one timed block)."""
    def admit(request: gr.Request, *inputs):
        # Gradio wants one gr.validate per input; the refusal is shown on the first
        visitor = session_of(request)
        verdicts = [gr.validate(True, "") for _ in inputs]
        try:
            check_admission(lane_name, queued_visitors(request, lane_name), visitor)
        except ValidationError as e:
            log.info("refused at admission (%s): %s", lane_name, e)
            verdicts[0] = gr.validate(False, as_text(str(e)))
            return tuple(verdicts)
        if lane_name == "timing":
            TIMING_RUNS.cancel(visitor)
        return tuple(verdicts)
    admit.__name__ = f"admit_{lane_name}"
    return admit


FORWARD = lane("forward")
TIMING = lane("timing")
EXPORT = lane("export")
# Uploads: their own lane of 1, with no admission check: a validator sees Gradio's preprocessed
# inputs, and the file check in that preprocessing ("weights file: got ...") would then reach the
# visitor as a bare HTTP 400. Gradio's upload size limit and QUEUE_MAX bound them.
UPLOAD = dict(concurrency_id="upload", concurrency_limit=1)
# The mask view runs no model (a few ms): its own lane, so a lecture's /mask never queues behind
# four probe passes on phoenix-nano.
LIGHT = dict(concurrency_id="light", concurrency_limit=4)


MAX_MESSAGE_CHARS = 2000


def as_text(message: str) -> str:
    """A message for a toast, shown as the text it is. Gradio renders gr.Error / gr.Warning messages as
    (sanitised) HTML, and messages echo what a visitor sent — a shared link's `?seed=<a href=...>`
    would become a link in someone else's toast, `<img src=...>` a request to an outside host. With
    < and > as entities no element can start; & stays, so API clients read `a&b` unchanged."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    return message.replace("<", "&lt;").replace(">", "&gt;")


def as_markdown_text(text: str) -> str:
    """`text` (e.g. an uploaded file's name) inside a gr.Markdown value, shown literally: Markdown's
    punctuation backslash-escaped, so no link, image or code span can be made of it."""
    return as_text(re.sub(r"([\\`*_{}\[\]()#+\-.!|~])", r"\\\1", text))


def guarded(fn):
    """No traceback reaches the page: validation problems become gr.Error with the field named,
    CUDA out-of-memory frees the caches, anything else is logged here and answered in one line."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ValueError as e:        # ValidationError and the models' own ValueErrors name the field
            raise gr.Error(as_text(str(e)), print_exception=False) from None
        except torch.OutOfMemoryError:
            runs.clear_caches()
            raise gr.Error("out of GPU memory for this configuration; caches were freed — try a shorter "
                           "sequence or a smaller model", print_exception=False) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise gr.Error(f"internal error in {fn.__name__}; it was logged on the server",
                           print_exception=False) from None
    return wrapper


def session_of(request) -> str:
    """The visitor: Gradio's session hash (one per page load; gradio_client keeps one per Client)."""
    return getattr(request, "session_hash", None) or "api"


def settings_of(query: str, request=None, need_model: bool = True) -> Settings:
    """The validated settings of a query string, for the visitor who sent it (their own uploads).
    `need_model=False`: the layout and view options only (the mask view builds no model)."""
    return parse_query(query, uploaded=runs.uploads(session_of(request)), need_model=need_model)


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


@guarded
def timing_request(query: str, lengths: str, backends, geometry: str, dtype: str, request=None):
    """Every timing control checked before anything runs -> (settings, timing.Request)."""
    s = settings_of(query, request)
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
    note = [f"Measured now on **{sw.device}** ({req.geometry_name}: B={req.geometry.B}, "
            f"{req.geometry.Hq}/{req.geometry.Hkv} heads, head dim {req.geometry.head_dim}, "
            f"{req.geometry.dtype}, {req.geometry.masks[0]} mask, cap {req.geometry.cap_methods[0]}); "
            "5 interleaved repeats per point."]
    note += [sw.stopped] if sw.stopped else []
    note += [timing.throughput_note(sw)] if sw.points else []
    note += [f"{b}: {why}" for b, why in sw.skipped.items()]
    note.append(timing.recorded_summary())
    return (*timing.sweep_figures(sw, recorded, batch=req.geometry.B), "\n\n".join(note))


class TimingRuns:
    """The live runs by session. Each run has its own stop flag (benchmarks.attention.Run): Stop
    cancels the session's runs, and a later Run makes a new flag, so it can never un-stop an old one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_session: dict[str, set] = {}
        self.threads = 0

    def start(self, session: str) -> timing.Run:
        run = timing.Run(sweep_budget_s())
        with self.lock:
            self.by_session.setdefault(session, set()).add(run)
            log.info("timing sweep started; %d running", self.running())
        return run

    def end(self, session: str, run: timing.Run) -> None:
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

    def cancel(self, session: str) -> None:
        with self.lock:
            for run in self.by_session.get(session, ()):
                run.cancel()


TIMING_RUNS = TimingRuns()


async def timing_endpoint(query: str, lengths: str, backends: list, geometry: str = None, dtype: str = None,
                          request: gr.Request = None):
    """Run a live sweep, streaming the figures after each length. The sweep runs in a worker thread;
    if this event is cancelled (Stop, or a client that cancels its job) the run's flag is set and the
    event waits for the thread to stop (within one timed block) before its queue slot is freed, so
    "one sweep at a time" holds however many runs are started and cancelled."""
    s, req = timing_request(query, lengths, backends, geometry or timing.geometries()[0],
                            dtype or timing.dtypes()[0], request)
    session = session_of(request)
    run = TIMING_RUNS.start(session)
    steps = timing.sweep(s, req, run)
    loop = asyncio.get_running_loop()
    try:
        recorded = await loop.run_in_executor(None, timing_recorded_curves, req)
        while True:
            step = loop.run_in_executor(None, timing_step, steps)
            try:
                sw = await asyncio.shield(step)
            except asyncio.CancelledError:
                run.cancel()
                while not step.done():          # hold the slot until the thread has stopped
                    try:
                        await asyncio.shield(step)
                    except asyncio.CancelledError:
                        continue
                    except Exception:           # noqa: BLE001 — already cancelled; its error is moot
                        break
                raise
            if sw is None:
                return
            yield timing_outputs(sw, req, recorded)
    finally:
        TIMING_RUNS.end(session, run)
        steps.close()


def stop_timing(request: gr.Request = None):
    TIMING_RUNS.cancel(session_of(request))


@guarded
def timing_options(query: str, geometry: str, dtype: str, chosen, request: gr.Request = None):
    """The backends this device runs for the geometry and dtype (only those can be ticked) and a
    line naming the others and why."""
    s = settings_of(query, request)
    why = timing.backend_options(s, geometry, dtype)
    usable = [b for b, reason in why.items() if reason is None]
    keep = [b for b in (chosen or []) if b in usable] or default_timing_backends(usable)
    others = "; ".join(f"`{b}`: {reason.removeprefix(b + ': ')}" for b, reason in why.items() if reason)
    return gr.update(choices=usable, value=keep), f"Not available here: {others}" if others else ""


def timing_lengths(geometry: str):
    return gr.update(value=timing.default_lengths(timing.check_choice("timing geometry", geometry,
                                                                      timing.geometries())))


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
    s = settings_of(query, request)
    g = timing.geometry(s, geometry, dtype)
    return (*timing.timing_view(s, geometry, dtype), timing.recorded_summary()
            + f"\n\nPress **Run** to measure {geometry} (B={g.B}) in {dtype} now.")


@guarded
def export_endpoint(query: str, figure: str, fmt: str, aspect: str = "16:9", request: gr.Request = None):
    return export.export_figure(settings_of(query, request), figure, fmt, aspect=aspect)


@guarded
def lecture_pack_endpoint(query: str, aspect: str = "16:9", request: gr.Request = None):
    return export.lecture_pack(settings_of(query, request), aspect=aspect)


@guarded
def upload_endpoint(query: str, path: str, request: gr.Request = None):
    s = settings_of(query, request)
    if not path:
        raise ValidationError("weights file", path, "a .npz or .safetensors file")
    name = runs.load_upload(s, path, session_of(request))
    s = parse_settings({**s.to_dict(), "weights": f"upload:{name}"}, uploaded=runs.uploads(session_of(request)))
    return to_query(s), (f"Loaded {as_markdown_text(os.path.basename(path))}: every shape matches; "
                         "the views now use it (for this visitor only).")


def forget_uploads(request: gr.Request = None):
    """The page was closed: its uploads go now rather than after runs.UPLOAD_TTL_S."""
    runs.forget_uploads(session_of(request))


# --- controls <-> query string --------------------------------------------------------------

CONTROL_FIELDS = [f.name for f in fields(Settings)]


@guarded
def settings_endpoint(request: gr.Request, *values):
    """Every control's value, in Settings field order -> the validated query string."""
    return to_query(parse_settings(dict(zip(CONTROL_FIELDS, values)), uploaded=runs.uploads(session_of(request))))


def settings_keeping_last_valid(values: list, last: Settings, request=None) -> tuple[Settings, dict[str, str]]:
    """The page's control values -> (settings to draw, {field: message} for each invalid control).
    An invalid control keeps its last valid value in the drawn settings, so every other control keeps
    working while it is marked; the model's device limits are named but do not stop the mask view."""
    raw, problems = dict(zip(CONTROL_FIELDS, values)), {}
    uploaded = runs.uploads(session_of(request))
    while True:
        try:
            s = parse_settings(raw, uploaded=uploaded, need_model=False)
            break
        except ValidationError as e:
            if e.field not in raw or e.field in problems:     # the last valid value fails too: draw `last`
                problems.setdefault(e.field if e.field in raw else "preset", str(e))
                s = last
                break
            problems[e.field] = str(e)
            raw[e.field] = getattr(last, e.field)
    return s, problems


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


def preset_choices():
    """Presets whose model does not fit this device say so in the list, before anyone picks them."""
    choices = []
    for name in PRESETS:
        limit = model_limit(parse_settings({"preset": name}, need_model=False))
        choices.append((f"{name} — mask view only on {device().upper()} (model too large)" if limit else name, name))
    return choices


@guarded
def load_endpoint(request: gr.Request):
    """Read the page's URL (a shared link) into the controls and open the tab it names."""
    params = dict(request.query_params) if request is not None else {}
    if retired_note(params):
        gr.Info(as_text(f"link: {retired_note(params)}"))
    query = urlencode({k: v for k, v in params.items() if k in CONTROL_FIELDS})
    tab = params.get("tab", "mask")
    tab = tab if tab in TABS else "mask"
    try:
        s = settings_of(query or "preset=lecture", request, need_model=False)
    except ValueError as e:
        gr.Warning(as_text(f"link ignored: {e}"))
        s = settings_of("preset=lecture", request)
    return to_query(s), tab, gr.Tabs(selected=tab)


@guarded
def query_to_controls(query: str, request: gr.Request = None):
    """Set every control from the query string; the head and weights lists follow the settings."""
    s = settings_of(query, request, need_model=False)
    clear = dict(info=None, elem_classes=[])        # a preset, upload or link replaces every marked value
    values = [gr.update(value=v, **clear) for v in control_values(s)]
    values[CONTROL_FIELDS.index("head")] = gr.update(choices=head_choices(s), value=s.head, **clear)
    values[CONTROL_FIELDS.index("weights")] = gr.update(choices=weight_choices(request), value=s.weights, **clear)
    return values


def head_choices(s: Settings):
    return [("all heads (grid)", -1)] + [(f"head {h} (KV {h // (s.num_q_heads // s.num_kv_heads)})", h)
                                        for h in range(s.num_q_heads)]


def weight_choices(request=None):
    """The weight sources, with this visitor's own uploads (never anyone else's)."""
    names = [("trained demo", "demo"), ("random (seed)", "random"), ("grok.py zeros", "zeros")]
    return names + [(f"uploaded {n}", f"upload:{n}") for n in runs.uploads(session_of(request))]


def default_timing_backends(usable) -> list:
    """What runs here quickly: FlexAttention compiles per shape (~20 s on CPU), so it is opt-in there."""
    return [b for b in usable if not (b == "flex" and device() == "cpu")]


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
    s, problems = settings_keeping_last_valid(values, last, request)
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
    return [query, sorted(problems), limit_note(limit)] + updates + views_out


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
    if tab == "mask":
        out["mask"] = mask_endpoint(query, request)
    elif tab == "attention":
        out["attention"] = attention_endpoint(query, request)
    elif tab == "anatomy":
        out["anatomy"] = anatomy_endpoint(query, request)
    elif tab == "isolation":
        out["isolation"] = isolation_endpoint(query, request)
    elif tab == "invariance":
        out["invariance"] = invariance_endpoint(query, request)
    elif tab == "variants":
        out["variants"] = variants_endpoint(query, request)
    flat = []
    for t, (n, _) in TAB_OUTPUTS.items():
        flat += list(out[t]) if out[t] is not None else [gr.skip()] * n
    return flat



# --- components that leave every check to explorer.settings -----------------------------------
# Instances patched rather than subclasses: Gradio writes a .pyi stub next to any module that
# subclasses a component.

def unchecked(component: gr.components.Component) -> gr.components.Component:
    """`component` drawn and behaving as usual on the page, but its value reaches the endpoint as
    sent: no rounding (2.5 -> 2, True -> 1), no parsing ("nan" in a number box) and no choice check
    ("Value: bogus is not in the list of choices", which names no field). explorer.settings then
    answers every bad value with "field: got ...; allowed: ..."."""
    component.preprocess = lambda payload: payload
    return component


def unchecked_kind(component_class: type):
    """A constructor of `component_class` instances that are unchecked(...)."""
    return lambda *args, **kw: unchecked(component_class(*args, **kw))


Number, Dropdown, Radio, CheckboxGroup = map(unchecked_kind, (gr.Number, gr.Dropdown, gr.Radio, gr.CheckboxGroup))


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

# The address bar follows the controls and the open tab, so a copied link reopens the same view.
# Plotly writes colour-bar gradients and clip paths as url('<page address>#id') when the page has a
# <base> element (Gradio's has), and keeps that address for later redraws: once the address changes
# they point into another document and draw nothing (a blank colour bar). Both are moved to the new
# address here.
WRITE_URL = """(q, tab) => {
    const before = window.location.href.split('#')[0];
    const u = new URL(window.location);
    u.search = q + (tab && tab !== 'mask' ? '&tab=' + encodeURIComponent(tab) : '');
    window.history.replaceState(null, '', u);
    const now = u.href.split('#')[0];
    if (now !== before) {
        document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
            if (gd._context && gd._context._baseUrl) gd._context._baseUrl = now;
            gd.querySelectorAll('[style*="url("], [clip-path], [fill^="url("]').forEach((el) => {
                for (const prop of ['fill', 'stroke', 'clip-path']) {
                    const v = el.style.getPropertyValue(prop);
                    if (v && v.includes(before)) el.style.setProperty(prop, v.split(before).join(now));
                    const a = el.getAttribute(prop);
                    if (a && a.includes(before)) el.setAttribute(prop, a.split(before).join(now));
                }
            });
        });
    }
    return [q, tab];
}"""

CSS = """.invalid { outline: 2px solid #D55E00; outline-offset: 2px; border-radius: 6px; }
.invalid .info, .invalid [data-testid="block-info"] + div, .invalid span.info { color: #B34700 !important; }
#limit-note:empty { display: none; }"""

# what to look for, one line per tab
LOOK_FOR = {
    "mask": "Look for: the candidate block's diagonal (each candidate sees the user, the history and only "
            "itself) against the causal mask, where later candidates also see earlier ones.",
    "attention": "Look for: candidate rows attend to history and to themselves only; heads sharing a KV head "
                 "(grouped query attention) often look alike; switch colour to quantile or log on random weights.",
    "anatomy": "Look for: how one query row is built — q·k per key, scaled, capped, masked to −∞, normalised by the "
               "softmax, and the weights mixing the values into the output.",
    "isolation": "Look for: under the recsys mask, perturbing candidate j changes only its own column; under the "
                 "causal mask the change leaks into every later candidate.",
    "invariance": "Look for: with sequential RoPE positions, reordering candidates moves their scores; with shared "
                  "or no positions they stay put (batch invariance).",
    "variants": "Look for: in the trained model's last row, the weight on the queried key/value pair (outlined).",
    "timing": "Look for: where the structured kernel overtakes naive attention as T grows, and the memory it saves.",
    "export": "Look for: figures redrawn in the lecture theme at 16:9, with captions describing each one.",
}

def number(label, **kw):
    """An integer box unless precision=None; the value is checked by explorer.settings either way."""
    return Number(label=label, precision=kw.pop("precision", 0), **kw)


# Gradio keeps every upload and every returned file (exports) in its cache: every 15 minutes, files
# older than an hour are removed (a download link lives that long).
DELETE_CACHE = (900, 3600)


def build_app() -> gr.Blocks:
    d = parse_settings({})
    with gr.Blocks(title="Attention explorer for recommendation transformers", delete_cache=DELETE_CACHE) as demo:
        gr.Markdown("# Attention explorer for recommendation transformers\n"
                    "A faithful PyTorch port of X's phoenix ranker (`grok.py`): masks, heatmaps from the model's "
                    "own forward, candidate isolation, batch invariance, RoPE and live kernel timings.")
        query = gr.Textbox(label="Link to this view (query string)", value=to_query(d), buttons=["copy"],
                           interactive=False, elem_id="query")
        # the visible tab; a hidden Textbox, not gr.State, so API calls can name the tab to redraw
        tab_state = gr.Textbox("mask", visible=False)
        marked = gr.State([])           # the controls marked invalid, to clear when they are fixed
        limit_md = gr.Markdown(elem_id="limit-note")
        c: dict[str, gr.components.Component] = {}
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                c["preset"] = Dropdown(preset_choices(), value=d.preset, label="preset")
                c["family"] = Radio([(label, name) for name, label in FAMILIES.items()], value=d.family,
                                    label="model family")
                c["weights"] = Dropdown(weight_choices(), value=d.weights, label="weights")
                c["seed"] = number("seed (weights and inputs)", value=d.seed)
                upload = weights_file(label="upload weights (.npz / .safetensors, haiku names)",
                                 file_types=[".npz", ".safetensors"], type="filepath", height=120)
                upload_msg = gr.Markdown()
                copy = gr.Button("Copy link", size="sm")
                c["zoom"] = Radio(list(ZOOMS), value=d.zoom, label="heatmap zoom (full resolution)")
                with gr.Accordion("sequence layout", open=True):
                    c["num_user"] = number("user tokens", value=d.num_user)
                    c["num_history"] = number("history length", value=d.num_history)
                    c["num_candidates"] = number("candidates", value=d.num_candidates)
                    c["history_padding"] = number("padded history slots", value=d.history_padding)
                    c["candidate_padding"] = number("padded candidate slots", value=d.candidate_padding)
                    with gr.Row():
                        c["batch_size"] = number(f"batch size (1–{MAX_BATCH})", value=d.batch_size, min_width=80)
                        c["row"] = number("batch row shown", value=d.row, min_width=80)
                with gr.Accordion("model", open=False):
                    c["emb_size"] = number("emb size", value=d.emb_size)
                    c["key_size"] = number("key size", value=d.key_size)
                    c["num_q_heads"] = number("query heads", value=d.num_q_heads)
                    c["num_kv_heads"] = number("KV heads", value=d.num_kv_heads)
                    c["num_layers"] = number("layers", value=d.num_layers)
                    c["widening_factor"] = number("widening factor", value=d.widening_factor, precision=None)
                    c["multiplier"] = number("attention multiplier (grok.py; production: √128 / key size)",
                                             value=d.multiplier, precision=None)
                    c["cap_method"] = Radio(list(CAP_METHODS), value=d.cap_method, label="logit cap")
                    c["logit_cap"] = number("cap value", value=d.logit_cap, precision=None)
                    c["prefix"] = Radio(list(PREFIX_MODES), value=d.prefix,
                                           label="prefix (causal: grok.py; bidirectional: production)")
                with gr.Accordion("RoPE", open=False):
                    c["rope_base"] = number("RoPE base", value=d.rope_base, precision=None)
                    c["rope_offset"] = number("RoPE offset", value=d.rope_offset)
                    c["rope_mode"] = Radio([*ROPE_MODES, XREX_ROPE], value=d.rope_mode, label="candidate positions")
            with gr.Column(scale=4):
                with gr.Row():                  # the attention and anatomy views read these
                    c["layer"] = number("layer", value=d.layer)
                    c["head"] = Dropdown(head_choices(d), value=d.head, label="head")
                    c["query"] = number("query row (-1: first candidate)", value=d.query)
                with gr.Tabs() as tabs:
                    with gr.Tab("1 · Mask", id="mask") as t_mask:
                        gr.Markdown(LOOK_FOR["mask"])
                        c["compare"] = Dropdown(list(MASK_KINDS), value=d.compare, label="compare with")
                        mask_fig = gr.Plot(label="mask", elem_id="mask-plot")
                        mask_text = gr.Markdown()
                        kernel_fig = gr.Plot(label="production's kernels: tiles run and skipped", elem_id="kernel-plot")
                        kernel_text = gr.Markdown()
                    with gr.Tab("2 · Attention", id="attention") as t_attn:
                        gr.Markdown(LOOK_FOR["attention"])
                        with gr.Row():
                            c["values"] = Radio(list(VALUE_KINDS), value=d.values, label="values")
                            c["color"] = Radio(list(COLOR_SCALES), value=d.color, label="colour")
                        attn_fig = gr.Plot(label="attention", elem_id="attention-plot")
                        row_fig = gr.Plot(label="query row")
                        attn_text = gr.Markdown()
                    with gr.Tab("2b · Anatomy", id="anatomy") as t_anat:
                        gr.Markdown(LOOK_FOR["anatomy"] + " Layer, head (the grid shows head 0) and query row "
                                    "are chosen above the tabs.")
                        anat_qk = gr.Plot(label="q and k after RoPE", elem_id="anatomy-plot")
                        anat_steps = gr.Plot(label="q·k → weights, step by step")
                        anat_out = gr.Plot(label="weighted sum of V")
                        anat_text = gr.Markdown()
                    with gr.Tab("3 · Isolation", id="isolation") as t_iso:
                        gr.Markdown(LOOK_FOR["isolation"])
                        with gr.Row():
                            c["candidate"] = number("candidate j", value=d.candidate)
                            c["perturbation"] = Radio(list(PERTURBATIONS), value=d.perturbation,
                                                         label="perturbation")
                            c["delta"] = number("size (scale factor / noise σ)", value=d.delta, precision=None)
                            c["replace_with"] = number("replace with item hash", value=d.replace_with)
                        iso_text = gr.Markdown()
                        iso_fig = gr.Plot(label="change per layer and position", elem_id="isolation-plot")
                        iso_bars = gr.Plot(label="change per candidate")
                    with gr.Tab("4 · Invariance & RoPE", id="invariance") as t_inv:
                        gr.Markdown(LOOK_FOR["invariance"])
                        c["operation"] = Radio(list(INVARIANCE_OPS), value=d.operation, label="operation")
                        inv_fig = gr.Plot(label="score change", elem_id="invariance-plot")
                        inv_text = gr.Markdown()
                        rope_angle = gr.Plot(label="RoPE angles")
                        rope_qk = gr.Plot(label="q·k vs distance")
                        rope_text = gr.Markdown()
                    with gr.Tab("5 · Variants", id="variants") as t_var:
                        gr.Markdown(LOOK_FOR["variants"])
                        with gr.Row():
                            c["variant"] = Dropdown(list(VARIANTS), value=d.variant,
                                                       label="attention variant (course notebooks)")
                            c["bug"] = Dropdown(["none", *bug_names("grok"), *bug_names("xrex")], value=d.bug,
                                                   label="plant a bug: a seed notebook's (grok.py) or a serving-kernel quirk (production)")
                        var_text = gr.Markdown()
                        var_fig = gr.Plot(label="variant attention", elem_id="variants-plot")
                        var_loss = gr.Plot(label="training loss of every variant", elem_id="variants-loss-plot")
                        bug_text = gr.Markdown()
                        bug_fig = gr.Plot(label="attention with the bug")
                    with gr.Tab("6 · Flash vs naive", id="timing") as t_time:
                        gr.Markdown(LOOK_FOR["timing"])
                        geometry0, dtype0 = timing.geometries()[0], timing.dtypes()[0]
                        with gr.Row():
                            geometry_pick = Radio(list(timing.geometries()), value=geometry0, scale=3,
                                                  label="shapes (mask and logit cap: the sidebar's)")
                            dtype_pick = Radio(list(timing.dtypes()), value=dtype0, label="dtype", scale=2)
                        with gr.Row():
                            lengths = gr.Textbox(timing.default_lengths(geometry0), label="sequence lengths T",
                                                 scale=3)
                            run_btn = gr.Button("Run", variant="primary", scale=1)
                            stop_btn = gr.Button("Stop", scale=1)
                        usable0, unavailable0 = timing_options(to_query(d), geometry0, dtype0, None)
                        backend_pick = CheckboxGroup(usable0["choices"], value=usable0["value"],
                                                     label="backends that run here")
                        unavailable_text = gr.Markdown(unavailable0)
                        timing_msg = gr.Markdown(elem_id="timing-check")
                        time_text = gr.Markdown(timing.recorded_summary())
                        with gr.Row():
                            time_fig, mem_fig = gr.Plot(label="time", elem_id="time-plot"), gr.Plot(label="memory")
                        with gr.Row():
                            speed_fig, err_fig = gr.Plot(label="speed-up"), gr.Plot(label="error")
                    with gr.Tab("7 · Export", id="export") as t_exp:
                        gr.Markdown(LOOK_FOR["export"])
                        with gr.Row():
                            fig_name = Dropdown(list(export.FIGURES), value="attention", label="figure")
                            fmt = Radio(list(export.FORMATS), value="png", label="format")
                            aspect = Radio(list(export.ASPECTS), value="16:9", label="slide shape")
                            exp_btn = gr.Button("Export figure")
                            pack_btn = gr.Button("Lecture pack (zip)", variant="primary")
                        gr.Markdown("Figures are drawn again from the current settings in the lecture theme "
                                    "(large fonts, tick labels of at least 16 px, colour-blind-safe colours, white "
                                    "background) at the slide shape chosen (16:9: 1600 × 900); PNG at 3x scale. "
                                    "The lecture pack holds every figure of every tab with a caption for each.")
                        exp_file = gr.File(label="download", elem_id="export-file")

        controls = [c[f] for f in CONTROL_FIELDS]
        # never shown: triggers and outputs for the API-only endpoints below
        hidden_q, hidden_out = gr.Textbox(visible=False), gr.Textbox(visible=False)
        view_outputs = [mask_fig, mask_text, kernel_fig, kernel_text, attn_fig, row_fig, attn_text, anat_qk, anat_steps,
                        anat_out, anat_text, iso_fig, iso_bars, iso_text,
                        inv_fig, inv_text, rope_angle, rope_qk, rope_text, var_fig, var_loss, var_text, bug_fig,
                        bug_text]
        write_url = WRITE_URL

        hidden = dict(api_visibility="undocumented")      # the page's own steps: not on the API page

        def redraw(event, after: str):
            return (event.then(None, [query, tab_state], None, js=write_url, **hidden)
                    .then(render_tab, [query, tab_state], view_outputs, api_name=f"render_after_{after}",
                          show_progress="minimal", **hidden, **FORWARD))

        # any control -> validated query string + the visible tab redrawn, in one round trip; an invalid
        # value is marked at its control and the rest keeps working
        gr.on([c[f].input for f in CONTROL_FIELDS if f not in ("preset", "family")], control_change_on_page,
              controls + [tab_state, query, marked], [query, marked, limit_md] + controls + view_outputs,
              api_name="render_on_change", trigger_mode="always_last", show_progress="minimal", **hidden,
              **FORWARD) \
            .then(None, [query, tab_state], None, js=write_url, **hidden)
        # the same change for API clients: a bad value is refused with the field named
        hidden_q.change(control_change, controls + [tab_state], [query, c["head"]] + view_outputs,
                        api_name="control_change", **FORWARD)
        hidden_q.blur(settings_endpoint, controls, hidden_out, api_name="settings")
        ev = c["preset"].input(preset_endpoint, c["preset"], query, api_name="preset")
        redraw(ev.success(query_to_controls, query, controls, api_name="sync_preset",
                          show_progress="hidden", **hidden)
               .then(limit_endpoint, query, limit_md, api_name="limit_after_preset", **hidden), "preset")
        ev = c["family"].input(family_endpoint, [query, c["family"]], query, api_name="family")
        redraw(ev.success(query_to_controls, query, controls, api_name="sync_family",
                          show_progress="hidden", **hidden)
               .then(limit_endpoint, query, limit_md, api_name="limit_after_family", **hidden), "family")
        ev = upload.upload(upload_endpoint, [query, upload], [query, upload_msg],
                           api_name="upload_weights", **UPLOAD)
        redraw(ev.success(query_to_controls, query, controls, api_name="sync_upload",
                          show_progress="hidden", **hidden), "upload")
        for tab, name in ((t_mask, "mask"), (t_attn, "attention"), (t_anat, "anatomy"), (t_iso, "isolation"),
                          (t_inv, "invariance"), (t_var, "variants"), (t_time, "timing"), (t_exp, "export")):
            tab.select(lambda n=name: n, None, tab_state, api_name=f"tab_{name}", show_progress="hidden", **hidden) \
               .then(None, [query, tab_state], None, js=write_url, **hidden) \
               .then(render_tab, [query, tab_state], view_outputs, api_name=f"render_{name}",
                     show_progress="minimal", **hidden, **FORWARD)
        copy.click(None, None, None, api_name="copy_link",
                   js="() => { navigator.clipboard && navigator.clipboard.writeText(window.location.href); }")
        redraw(demo.load(load_endpoint, None, [query, tab_state, tabs], api_name="load", **hidden)
               .success(query_to_controls, query, controls, api_name="sync_load", show_progress="hidden", **hidden)
               .then(limit_endpoint, query, limit_md, api_name="limit_after_load", **hidden), "load")
        demo.unload(forget_uploads)

        # the API: one endpoint per view, configuration as a query string
        for name, fn, outs in (
                ("mask", mask_endpoint, [mask_fig, mask_text, kernel_fig, kernel_text]),
                ("attention", attention_endpoint, [attn_fig, row_fig, attn_text]),
                ("anatomy", anatomy_endpoint, [anat_qk, anat_steps, anat_out, anat_text]),
                ("isolation", isolation_endpoint, [iso_fig, iso_bars, iso_text]),
                ("invariance", invariance_endpoint, [inv_fig, inv_text, rope_angle, rope_qk, rope_text]),
                ("variants", variants_endpoint, [var_fig, var_loss, var_text, bug_fig, bug_text])):
            hidden_q.submit(fn, hidden_q, outs, api_name=name, **(LIGHT if name == "mask" else FORWARD))
        timing_figs = [time_fig, mem_fig, speed_fig, err_fig, time_text]
        run_ev = run_btn.click(timing_endpoint, [query, lengths, backend_pick, geometry_pick, dtype_pick],
                               timing_figs, api_name="timing", **TIMING)
        # Stop sets the run's own flag and cancels the event: the figures keep what was streamed so far
        stop_btn.click(stop_timing, None, None, cancels=[run_ev], api_name="stop_timing", queue=False)
        # the timing controls are checked as they change (the message under them, Run disabled while
        # something is wrong); these helpers stay callable but off the API page
        timing_inputs = [query, lengths, backend_pick, geometry_pick, dtype_pick]
        quiet = dict(api_visibility="undocumented", show_progress="hidden", queue=False)
        check = dict(fn=timing_check, inputs=timing_inputs, outputs=[timing_msg, run_btn], **quiet)
        gr.on([geometry_pick.input, dtype_pick.input, query.change], timing_options,
              [query, geometry_pick, dtype_pick, backend_pick], [backend_pick, unavailable_text],
              api_name="timing_options", **quiet).then(api_name="timing_check_after_options", **check)
        geometry_pick.input(timing_lengths, geometry_pick, lengths, api_name="timing_lengths", **quiet) \
            .then(api_name="timing_check_after_lengths", **check)
        gr.on([lengths.input, backend_pick.input], api_name="timing_check", trigger_mode="always_last", **check)
        t_time.select(timing_recorded, [query, geometry_pick, dtype_pick, time_fig], timing_figs,
                      api_name="timing_recorded", **{**quiet, "queue": True})
        exp_btn.click(export_endpoint, [query, fig_name, fmt, aspect], exp_file, api_name="export_figure",
                      **EXPORT)
        pack_btn.click(lecture_pack_endpoint, [query, aspect], exp_file, api_name="lecture_pack",
                       **EXPORT)
    demo.queue(default_concurrency_limit=4, max_size=QUEUE_MAX)
    return demo


def warm_up() -> None:
    """Build the default view's model, then phoenix-nano's (~10 M parameters take seconds to
    initialise), in the background after start-up, so the first visitor to pick it waits less."""
    for query in ("preset=lecture", "preset=phoenix-nano"):
        try:
            runs.forward(settings_of(query))
        except Exception:               # a warm-up is best effort; the real request reports errors
            log.exception("warm-up of %s failed", query)


# show_error=True: our own functions answer every problem as a gr.Error already (`guarded`), so what
# this adds is Gradio's own refusal of a malformed call — "An event handler (mask_endpoint) didn't
# receive enough input values (needed: 1, got: 0)" — which show_error=False blanks to {"error": null}.
if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    runs.configure_threads()            # once, before any worker thread runs a forward
    runs.start_idle_trim()
    warm = threading.Timer(3.0, warm_up)
    warm.daemon = True
    warm.start()
    build_app().launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                       server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                       show_error=True, max_file_size="200mb", css=CSS)
