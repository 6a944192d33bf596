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
from explorer.settings import (COLOR_SCALES, FAMILIES, INVARIANCE_OPS, MAX_BATCH, PERTURBATIONS, VALUE_KINDS,
                               XREX_ROPE, ZOOMS, Settings, ValidationError, device, parse_query, parse_settings,
                               retired_note, sweep_budget_s, to_query, with_family)
from models.attention import CAP_METHODS
from models.grok import ROPE_MODES
from models.masks import MASK_KINDS, PREFIX_MODES
from models.bugzoo import bug_names
from models.recsys import PRESETS
from models.variants import VARIANTS

log = logging.getLogger("explorer")

try:  # Hugging Face ZeroGPU: heavy calls borrow a GPU when the Space has one
    import spaces
    gpu = spaces.GPU
except ImportError:
    def gpu(fn):
        return fn

TABS = ("mask", "attention", "isolation", "invariance", "variants", "timing", "export")
# Every event that runs the ranking model (control changes, tab redraws, the view endpoints) queues in
# one group: at most this many forwards at once across all of them, whichever event asked. Exports
# (one kaleido browser), uploads and timing sweeps have their own limit of 1 on top.
FORWARD = dict(concurrency_id="forward", concurrency_limit=4)
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


def settings_of(query: str, request=None) -> Settings:
    """The validated settings of a query string, for the visitor who sent it (their own uploads)."""
    return parse_query(query, uploaded=runs.uploads(session_of(request)))


# --- endpoints: each takes the configuration as a URL query string -----------------------

@guarded
def mask_endpoint(query: str, request: gr.Request = None):
    s = settings_of(query, request)
    return (*views.mask_view(s), *views.kernel_view(s))


@guarded
def attention_endpoint(query: str, request: gr.Request = None):
    return views.attention_view(settings_of(query, request))


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
def export_endpoint(query: str, figure: str, fmt: str, request: gr.Request = None):
    return export.export_figure(settings_of(query, request), figure, fmt)


@guarded
def lecture_pack_endpoint(query: str, request: gr.Request = None):
    return export.lecture_pack(settings_of(query, request))


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


def control_values(s: Settings) -> list:
    return [getattr(s, f) for f in CONTROL_FIELDS]


@guarded
def family_endpoint(query: str, family: str, request: gr.Request = None):
    """The model family switches what it fixes (explorer.settings.with_family) and keeps the rest."""
    return to_query(with_family(settings_of(query, request), family))


@guarded
def preset_endpoint(preset: str):
    """A preset resets every model and layout control to its values."""
    return to_query(parse_settings({"preset": preset}))


@guarded
def load_endpoint(request: gr.Request):
    """Read the page's URL query string (a shared link) into the controls."""
    params = dict(request.query_params) if request is not None else {}
    if retired_note(params):
        gr.Info(as_text(f"link: {retired_note(params)}"))
    query = urlencode({k: v for k, v in params.items() if k in CONTROL_FIELDS})
    try:
        s = settings_of(query or "preset=lecture", request)
    except ValueError as e:
        gr.Warning(as_text(f"link ignored: {e}"))
        s = settings_of("preset=lecture", request)
    return to_query(s)


@guarded
def query_to_controls(query: str, request: gr.Request = None):
    """Set every control from the query string; the head and weights lists follow the settings."""
    s = settings_of(query, request)
    values = control_values(s)
    values[CONTROL_FIELDS.index("head")] = gr.update(choices=head_choices(s), value=s.head)
    values[CONTROL_FIELDS.index("weights")] = gr.update(choices=weight_choices(request), value=s.weights)
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
def render_tab(query: str, tab: str, request: gr.Request = None):
    """Redraw only the visible tab (the others redraw when they are opened)."""
    if not isinstance(tab, str) or tab not in TABS:
        raise ValidationError("tab", tab, ", ".join(TABS))
    settings_of(query, request)         # every tab checks the query, also those drawn on demand
    out = {t: None for t in TABS}
    if tab == "mask":
        out["mask"] = mask_endpoint(query, request)
    elif tab == "attention":
        out["attention"] = attention_endpoint(query, request)
    elif tab == "isolation":
        out["isolation"] = isolation_endpoint(query, request)
    elif tab == "invariance":
        out["invariance"] = invariance_endpoint(query, request)
    elif tab == "variants":
        out["variants"] = variants_endpoint(query, request)
    flat = []
    for t, n in (("mask", 4), ("attention", 3), ("isolation", 3), ("invariance", 5), ("variants", 5)):
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
        c: dict[str, gr.components.Component] = {}
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                c["preset"] = Dropdown(list(PRESETS), value=d.preset, label="preset")
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
                with gr.Tabs():
                    with gr.Tab("1 · Mask", id="mask") as t_mask:
                        c["compare"] = Dropdown(list(MASK_KINDS), value=d.compare, label="compare with")
                        mask_fig = gr.Plot(label="mask", elem_id="mask-plot")
                        mask_text = gr.Markdown()
                        kernel_fig = gr.Plot(label="production's kernels: tiles run and skipped", elem_id="kernel-plot")
                        kernel_text = gr.Markdown()
                    with gr.Tab("2 · Attention", id="attention") as t_attn:
                        with gr.Row():
                            c["layer"] = number("layer", value=d.layer)
                            c["head"] = Dropdown(head_choices(d), value=d.head, label="head")
                            c["values"] = Radio(list(VALUE_KINDS), value=d.values, label="values")
                            c["color"] = Radio(list(COLOR_SCALES), value=d.color, label="colour")
                            c["query"] = number("query row (-1: first candidate)", value=d.query)
                        attn_fig = gr.Plot(label="attention", elem_id="attention-plot")
                        row_fig = gr.Plot(label="query row")
                        attn_text = gr.Markdown()
                    with gr.Tab("3 · Isolation", id="isolation") as t_iso:
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
                        c["operation"] = Radio(list(INVARIANCE_OPS), value=d.operation, label="operation")
                        inv_fig = gr.Plot(label="score change", elem_id="invariance-plot")
                        inv_text = gr.Markdown()
                        rope_angle = gr.Plot(label="RoPE angles")
                        rope_qk = gr.Plot(label="q·k vs distance")
                        rope_text = gr.Markdown()
                    with gr.Tab("5 · Variants", id="variants") as t_var:
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
                        with gr.Row():
                            fig_name = Dropdown(list(export.FIGURES), value="attention", label="figure")
                            fmt = Radio(list(export.FORMATS), value="png", label="format")
                            exp_btn = gr.Button("Export figure")
                            pack_btn = gr.Button("Lecture pack (zip)", variant="primary")
                        gr.Markdown("Figures are drawn again from the current settings in the lecture theme "
                                    "(large fonts, colour-blind-safe colours, white background); PNG at 3x scale.")
                        exp_file = gr.File(label="download", elem_id="export-file")

        controls = [c[f] for f in CONTROL_FIELDS]
        # never shown: triggers and outputs for the API-only endpoints below
        hidden_q, hidden_out = gr.Textbox(visible=False), gr.Textbox(visible=False)
        view_outputs = [mask_fig, mask_text, kernel_fig, kernel_text, attn_fig, row_fig, attn_text, iso_fig, iso_bars, iso_text,
                        inv_fig, inv_text, rope_angle, rope_qk, rope_text, var_fig, var_loss, var_text, bug_fig,
                        bug_text]
        write_url = ("(q) => { const u = new URL(window.location); u.search = q; "
                     "window.history.replaceState(null, '', u); return q; }")

        def redraw(event, after: str):
            return (event.then(None, [query], None, js=write_url, api_name=f"write_url_after_{after}")
                    .then(render_tab, [query, tab_state], view_outputs, api_name=f"render_after_{after}",
                          show_progress="minimal", **FORWARD))

        # any control -> validated query string + the visible tab redrawn, in one round trip
        gr.on([c[f].input for f in CONTROL_FIELDS if f not in ("preset", "family")], control_change, controls + [tab_state],
              [query, c["head"]] + view_outputs, api_name="control_change", trigger_mode="always_last",
              show_progress="minimal", **FORWARD) \
            .then(None, [query], None, js=write_url, api_name="write_url_after_change")
        hidden_q.blur(settings_endpoint, controls, hidden_out, api_name="settings")
        ev = c["preset"].input(preset_endpoint, c["preset"], query, api_name="preset")
        redraw(ev.success(query_to_controls, query, controls, api_name="sync_preset",
                          show_progress="hidden"), "preset")
        ev = c["family"].input(family_endpoint, [query, c["family"]], query, api_name="family")
        redraw(ev.success(query_to_controls, query, controls, api_name="sync_family",
                          show_progress="hidden"), "family")
        ev = upload.upload(upload_endpoint, [query, upload], [query, upload_msg],
                           api_name="upload_weights", concurrency_limit=1, concurrency_id="heavy")
        redraw(ev.success(query_to_controls, query, controls, api_name="sync_upload",
                          show_progress="hidden"), "upload")
        for tab, name in ((t_mask, "mask"), (t_attn, "attention"), (t_iso, "isolation"),
                          (t_inv, "invariance"), (t_var, "variants"), (t_time, "timing"), (t_exp, "export")):
            tab.select(lambda n=name: n, None, tab_state, api_name=f"tab_{name}", show_progress="hidden") \
               .then(render_tab, [query, tab_state], view_outputs, api_name=f"render_{name}",
                     show_progress="minimal", **FORWARD)
        copy.click(None, None, None, api_name="copy_link",
                   js="() => { navigator.clipboard && navigator.clipboard.writeText(window.location.href); }")
        redraw(demo.load(load_endpoint, None, query, api_name="load")
               .success(query_to_controls, query, controls, api_name="sync_load", show_progress="hidden"), "load")
        demo.unload(forget_uploads)

        # the API: one endpoint per view, configuration as a query string
        for name, fn, outs in (
                ("mask", mask_endpoint, [mask_fig, mask_text, kernel_fig, kernel_text]),
                ("attention", attention_endpoint, [attn_fig, row_fig, attn_text]),
                ("isolation", isolation_endpoint, [iso_fig, iso_bars, iso_text]),
                ("invariance", invariance_endpoint, [inv_fig, inv_text, rope_angle, rope_qk, rope_text]),
                ("variants", variants_endpoint, [var_fig, var_loss, var_text, bug_fig, bug_text])):
            hidden_q.submit(fn, hidden_q, outs, api_name=name, **(LIGHT if name == "mask" else FORWARD))
        timing_figs = [time_fig, mem_fig, speed_fig, err_fig, time_text]
        run_ev = run_btn.click(timing_endpoint, [query, lengths, backend_pick, geometry_pick, dtype_pick],
                               timing_figs, api_name="timing", concurrency_limit=1, concurrency_id="timing")
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
        exp_btn.click(export_endpoint, [query, fig_name, fmt], exp_file, api_name="export_figure",
                      concurrency_limit=1, concurrency_id="export")
        pack_btn.click(lecture_pack_endpoint, query, exp_file, api_name="lecture_pack",
                       concurrency_limit=1, concurrency_id="export")
    demo.queue(default_concurrency_limit=4, max_size=64)
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
    warm = threading.Timer(3.0, warm_up)
    warm.daemon = True
    warm.start()
    build_app().launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                       server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                       show_error=True, max_file_size="200mb")
