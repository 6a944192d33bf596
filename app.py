"""Attention explorer for recommendation transformers — the Gradio app. Layout and wiring only:
the functions the events call live in server/, the work in explorer/ (plain functions) and models/;
the tabs of drawn views are built from their records (explorer.views.VIEWS).

    python app.py            # http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override)

Every view is also an API endpoint taking the URL query string of a configuration, e.g.
``Client("http://127.0.0.1:7860").predict("preset=lecture&head=1", api_name="/attention")``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from explorer import export, gpu_results, lesson, runs, timing, views
from explorer.controls import CONTROL_FIELDS, LABELS, NUMBER_FIELDS
from explorer.controls import INFO as CONTROL_INFO
from explorer.families import FAMILIES, XREX_ROPE
from explorer.page_contract import FIGURE_TEXT
from explorer.query_string import link_defaults, to_query
from explorer.schema import FIELD_TYPES, Control, Settings
from explorer.settings import COLOR_SCALES, VALUE_KINDS, ZOOMS, parse_settings
from explorer.views import VIEWS, drawn_views
from server import disk, drawing, front_door, gradio_patches, memory, uploads
from server.admission import ADMISSION, QUEUE_MAX
from server.endpoints import (VIEW_ENDPOINTS, control_change, control_change_on_page, export_endpoint,
                              export_preview_endpoint, family_on_page, lecture_pack_endpoint, link_on_page, page_gone,
                              pick_on_page, preset_on_page, present_key_on_page, render_tab, upload_endpoint)
from server.gradio_patches import weights_file
from server.guard import settings_of
from server.lanes import (CONTROL, EXPORT, EXPORT_PACK, TIMING, UNQUEUED, UPLOAD, admit_every_event, forward, light,
                          page_redraw, watch_lanes, work_of_change, work_of_figure, work_of_keys, work_of_link,
                          work_of_page_change, work_of_pick, work_of_query, work_of_source, work_of_tab)
from server.links import (family_endpoint, head_choices, head_of_link, limit_endpoint, link_to_controls,
                          load_endpoint, preset_choices, preset_endpoint, query_to_controls, settings_endpoint,
                          tab_opened, weight_choices)
from server.timing_events import (before_run, stop_timing, timing_check, timing_endpoint, timing_lengths,
                                  timing_lengths_kept, timing_options, timing_recorded, timing_recorded_on_link)
from models.attention import CAP_METHODS
from models.grok import ROPE_MODES
from models.masks import PREFIX_MODES

log = logging.getLogger("explorer")


# --- controls whose values reach the endpoints as sent ------------------------------------------
# Every event that reads a control passes preprocess=False (Gradio's own event option), so the value
# arrives as sent: no rounding (2.5 -> 2, True -> 1), no parsing ("nan" in a number box) and no choice
# check ("Value: bogus is not in the list of choices", which names no field). explorer.settings then
# answers every bad value with "field: got ...; allowed: ...". tests/test_app.py checks that every
# event reading a Number, Dropdown, Radio or CheckboxGroup has it.
RAW = dict(preprocess=False)
CHECKED_BY_SETTINGS = (gr.Number, gr.Dropdown, gr.Radio, gr.CheckboxGroup)


# --- layout -----------------------------------------------------------------------------------

# The page's own scripts and styles: every static/*.js goes into the page's <head> once (each defines
# functions on window.explorer, which the events below call by name), every static/*.css into its styles.
STATIC = Path(__file__).resolve().parent / "static"
# The lesson (explorer/lesson.py) goes first, as data for static/present.js; "</" escaped inside the script;
# with it the Settings field order and the defaults of the fields page.js writes (explorer.page_contract), so it
# writes a link as the server does, and the figure text it rewrites (page_contract.FIGURE_TEXT).
LESSON_DATA = json.dumps({"steps": lesson.as_data(), "main": lesson.MAIN_FIGURE}).replace("</", "<\\/")
HEAD = (f"<script>\nwindow.explorer = window.explorer || {{}};\nexplorer.lessonData = {LESSON_DATA};\n"
        f"explorer.fields = {json.dumps(CONTROL_FIELDS)};\nexplorer.linkDefaults = {json.dumps(link_defaults())};\n"
        f"explorer.figureText = {json.dumps(FIGURE_TEXT)};\n</script>\n"
        + "".join(f"<script>\n{p.read_text()}\n</script>\n" for p in sorted(STATIC.glob("*.js"))))
CSS_PATHS = sorted(STATIC.glob("*.css"))


def page_call(function: str, *inputs: str) -> str:
    """An event's js: the page's own `explorer.<function>` (static/*.js) called with the event's inputs, named
    `inputs` in order, nothing else in Python (tests/test_server.py: every event's js is one, of a function the
    scripts define)."""
    return f"({', '.join(inputs)}) => explorer.{function}({', '.join(inputs)})"


WRITE_URL = page_call("writeUrl", "q", "tab")
PICK_ROW = page_call("pickRow")
COPY_LINK = page_call("copyLink")
# display changes the page draws itself from the data it holds: control -> the page.js call (new link)
IN_BROWSER = {"color": page_call("recolour", "kind", "q")}
# the query row, drawn by the page where the attention tab holds its row (else it sends the redraw port)
QUERY_ROW = page_call("queryRow", "v", "q")
LAYER = page_call("layerPick", "layer", "v", "q")            # likewise, the layer
HEAD_PICK = page_call("headPick", "head", "v", "q")          # another head of a one-head view
VALUES_PICK = page_call("valuesPick", "values", "v", "q")    # another value kind of one
HEAD_KEY = page_call("headKey", "head", "q")                 # a head stepHead drew

# A port: an event the page's own script sends with its payload (static/page.js explorer.send). A gr.HTML that
# draws nothing; as it mounts, its js_on_load registers a function that sets its value to the payload and fires
# its `submit` (Gradio 6's custom HTML components: js_on_load, props, trigger). Its events read the payload as
# the port's value. Every send is an event, the same payload twice too.
PORT_JS = "(window.explorerPorts = window.explorerPorts || {{}})[{name}] = (payload) => {{ props.value = payload; trigger('submit'); }};"


def page_port(name: str) -> gr.HTML:
    return gr.HTML("", html_template="", js_on_load=PORT_JS.format(name=json.dumps(name)), elem_id=f"port-{name}",
                   elem_classes=["page-port"], container=False, padding=False)


def number_boxes(d: Settings, c: dict, names: list[str], **kw) -> None:
    """A number box per Settings field, labelled (explorer.controls.LABELS, INFO); integer boxes for int
    fields. explorer.settings checks the value either way."""
    for field in names:
        c[field] = gr.Number(label=LABELS[field], value=getattr(d, field),
                             precision=None if FIELD_TYPES[field] == "float" else 0,
                             info=CONTROL_INFO.get(field), **kw)


# Gradio keeps every upload and every returned file (exports) in its cache: every 15 minutes, files
# older than an hour are removed (a download link lives that long).
DELETE_CACHE = (900, 3600)


# --- layout: one builder per part of the page. `c` collects the controls by Settings field; each view
# tab returns its outputs in its endpoint's order. ----------------------------------------------------

def page_header(d: Settings) -> SimpleNamespace:
    """The first screen's top: the title, Present and Reset, and the lesson's steps, each a link."""
    with gr.Row(elem_id="page-header", equal_height=True):
        gr.Markdown(elem_id="page-title", value="# Attention explorer for recommendation transformers\n"
                    "X's phoenix rankers (2025 `grok.py`, 2026 production) ported to PyTorch: masks, attention, "
                    "isolation, invariance, RoPE, kernel timings.")
        present = gr.Button("▶ Present", variant="primary", size="lg", scale=0, min_width=150, elem_id="present-btn")
        reset = gr.Button("↺ Reset to preset", size="lg", scale=0, min_width=200, elem_id="reset-btn")
    gr.Markdown(lesson.strip_markdown(), elem_id="lesson-strip")
    return SimpleNamespace(
        present=present, reset=reset,
        keys=page_port("keys"),         # presentation mode's keys pressed since its last step (static/present.js)
        # the visible tab; a hidden Textbox, not gr.State, so API calls can name the tab to redraw
        tab_state=gr.Textbox("mask", visible=False),
        marked=gr.State({}),            # a link's dropped values, from its load to the controls it marks
        limit_md=gr.Markdown(elem_id="limit-note"),
        # never shown, never an event's trigger: the declared query-string input and text output of the API-only
        # endpoints (api_only)
        api_query=gr.Textbox(visible=False), api_text=gr.Textbox(visible=False),
        pick=page_port("pick"),         # a click on a heatmap cell: `layer=1&head=3&query=7` (pick_on_page)
        redraw=page_port("redraw"),     # a display change the page could not draw itself: the server redraws
        head_key=page_port("head"),     # presentation mode's ↑ ↓: a head the page drew itself (stepHead)
        history=page_port("history"))   # the browser's Back and Forward: the address they went to


def source_controls(d: Settings, c: dict, page: SimpleNamespace) -> None:
    """The sidebar's top: preset, family, weights (and the upload), seed, zoom, the link."""
    c["preset"] = gr.Dropdown(preset_choices(), value=d.preset, label=LABELS["preset"])
    c["family"] = gr.Radio([(label, name) for name, label in FAMILIES.items()], value=d.family,
                           label=LABELS["family"])
    c["weights"] = gr.Dropdown(weight_choices(), value=d.weights, label=LABELS["weights"])
    number_boxes(d, c, ["seed"])
    c["zoom"] = gr.Radio(list(ZOOMS), value=d.zoom, label=LABELS["zoom"])
    page.query = gr.Textbox(label="Link to this view (query string)", value=to_query(d), buttons=["copy"],
                            interactive=False, elem_id="query")
    page.copy = gr.Button("Copy link", size="sm")
    page.upload = weights_file(label="upload weights (.npz / .safetensors, haiku names of the family chosen)",
                               file_types=[".npz", ".safetensors"], type="filepath", height=120)
    page.upload_msg = gr.Markdown()


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
    """The sidebar's first: the layer, head and query row the attention and anatomy views show (the mask
    outlines the row), touched most during a class."""
    with gr.Row():
        number_boxes(d, c, ["layer"], elem_id="layer-box", min_width=70, scale=1)
        c["head"] = gr.Dropdown(head_choices(d), value=d.head, label=LABELS["head"], min_width=150, scale=2)
    number_boxes(d, c, ["query"], elem_id="query-row")


# the shared view fields a tab shows that pick from a list (a radio); a view's own controls say theirs (Control)
CHOICES = {"values": VALUE_KINDS, "color": COLOR_SCALES}


def view_control(d: Settings, c: dict, control: str | Control) -> None:
    """A tab's control: a shared Settings field (a number box, or a radio of CHOICES), or a view's own
    control built from its record (a number box, or its choices in a radio, or a menu for many)."""
    if not isinstance(control, Control):
        if control in NUMBER_FIELDS:
            number_boxes(d, c, [control])
        else:
            c[control] = gr.Radio(list(CHOICES[control]), value=getattr(d, control), label=LABELS[control])
        return
    name = control.name
    if control.number:
        c[name] = gr.Number(label=LABELS[name], value=control.of(d), precision=None if control.number is float else 0,
                            info=CONTROL_INFO.get(name))
        return
    choices = control.page_choices() if control.page_choices else list(control.choices)
    c[name] = (gr.Dropdown if control.menu else gr.Radio)(choices, value=control.of(d), label=LABELS[name])


# a figure the width of the tab's column: drawn never narrower than at a projector's 1280 x 720 (its text is laid out
# for that), its block scrolling sideways below it (150 % zoom, a phone): static/page.css
WIDE_FIGURE = ["wide-figure"]
# the timing tab's figures two to a row: below two of this width a row holds one (Gradio wraps it)
HALF_FIGURE_PX = 420


def output_component(out: views.Plot | views.Text):
    if isinstance(out, views.Plot):
        return gr.Plot(label=out.label, elem_id=out.elem_id, show_label=out.show_label, elem_classes=WIDE_FIGURE)
    return gr.Markdown(elem_id=out.elem_id)


def view_tab(view: views.View, d: Settings, c: dict) -> list:
    """A drawn view's tab from its record: its own controls (in a row), then each part's outputs, a
    leading text above its part's figures. -> the outputs in the endpoint's order."""
    with gr.Row() if len(view.controls) > 1 else contextlib.nullcontext():
        for control in view.controls:
            view_control(d, c, control)
    built = []
    for part in view.parts:
        shown = sorted(range(len(part.outputs)), key=lambda i: not getattr(part.outputs[i], "lead", False))
        made = {i: output_component(part.outputs[i]) for i in shown}
        built += [made[i] for i in range(len(part.outputs))]
    return built


def timing_tab(d: Settings, c: dict) -> SimpleNamespace:
    """The recorded GPU run first (drawn into the page: every visitor sees it before anything runs), the
    live run's panel beside it; the controls; the whole forward; the live figures; the words under them."""
    geometry0, dtype0 = timing.geometries()[0], timing.dtypes()[0]
    t = SimpleNamespace()
    flash0, note0 = before_run()
    run = gpu_results.gpu_run()
    # no label badge on the figures: it would sit over the figure's own title
    flash_fig = gr.Plot(flash0, label="flash vs naive", elem_id="flash-plot", show_label=False,
                        elem_classes=WIDE_FIGURE)
    with gr.Row():
        t.geometry = gr.Radio(list(timing.geometries()), value=geometry0, scale=3,
                              label="shapes (mask and logit cap: the sidebar's)")
        t.dtype = gr.Radio(list(timing.dtypes()), value=dtype0, label="dtype", scale=2)
    usable0, unavailable0 = timing_options(to_query(d), geometry0, dtype0, None)
    with gr.Row():
        t.lengths = gr.Textbox(timing.default_lengths(geometry0, d.num_candidates), label="sequence lengths T", scale=2)
        t.backends = gr.CheckboxGroup(usable0["choices"], value=usable0["value"], label="backends that run here",
                                      scale=3)
        t.run = gr.Button("Run", variant="primary", scale=1)
        t.stop = gr.Button("Stop", scale=1)
    t.message = gr.Markdown(elem_id="timing-check")
    t.recheck = page_port("recheck")    # sent by the page: see wire_timing
    gr.Plot(gpu_results.trunk_figure(run), label="the whole forward", elem_id="trunk-plot", show_label=False,
            elem_classes=WIDE_FIGURE)
    with gr.Row():
        time_fig = gr.Plot(label="time", elem_id="time-plot", show_label=False, min_width=HALF_FIGURE_PX)
        mem_fig = gr.Plot(label="memory", show_label=False, min_width=HALF_FIGURE_PX)
    with gr.Row():
        speed_fig, err_fig = (gr.Plot(label=label, show_label=False, min_width=HALF_FIGURE_PX)
                              for label in ("speed-up", "error"))
    # the words under the figures (the figures first on the screen): the recorded numbers, the live results and
    # why each backend is fast or slow here
    gr.Markdown(gpu_results.evidence_markdown(run), elem_id="gpu-text")
    text = gr.Markdown(note0)
    t.unavailable = gr.Markdown(unavailable0)
    t.figures = [time_fig, mem_fig, speed_fig, err_fig, flash_fig, text]      # server.timing_events' order
    return t


def export_tab(d: Settings, c: dict) -> SimpleNamespace:
    e = SimpleNamespace()
    with gr.Row():
        e.figure = gr.Dropdown([(spec.title, name) for name, spec in export.FIGURES.items()], value="attention",
                               label="figure", scale=3)
        e.format = gr.Radio(list(export.FORMATS), value="png", label="format", scale=1)
        e.aspect = gr.Radio(list(export.ASPECTS), value="16:9", label="slide shape", scale=2)
        e.figure_btn = gr.Button("Export figure", scale=1)
        e.pack_btn = gr.Button("Lecture pack (zip)", variant="primary", scale=1)
    # the slide the figure chosen makes, in the lecture theme
    e.preview = gr.Plot(label="slide preview", elem_id="export-preview", show_label=False, elem_classes=WIDE_FIGURE)
    e.file = gr.File(label="download", elem_id="export-file")
    gr.Markdown("Figures are drawn again from the current settings in the lecture theme (large fonts, tick labels "
                "of at least 16 px, colour-blind-safe colours, white background) at the slide shape chosen (16:9: "
                "1600 × 900); PNG at 3x scale, named for the preset, layer, head and row shown. The lecture pack "
                "holds every figure this device can draw at these settings (PNG, SVG and the numbers drawn as NPZ), "
                "captions made from each figure's settings, a list of what was left out and why, and "
                "`lesson.html`: the lesson, step by step, each step's claim under its figure, then every figure "
                "at these settings, interactive and offline.")
    return e


# the tabs the app builds and wires itself (explorer.views.VIEWS without a cost); every other tab is
# built from its view's record (view_tab)
OWN_TABS = {"timing": timing_tab, "export": export_tab}


# --- wiring: one function per group of events ---------------------------------------------------

HIDDEN = dict(api_visibility="undocumented")      # the page's own steps: not on the API page
STEP = dict(**HIDDEN, **UNQUEUED)                 # ... and those that need no queue (server.lanes.UNQUEUED)


def redraw(page: SimpleNamespace, event, after: str):
    """After `event`: the address bar follows the query, then the visible tab is redrawn."""
    return (event.then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
            .then(render_tab, [page.query, page.tab_state], page.view_outputs, api_name=f"render_after_{after}",
                  **figures_of(page.view_outputs), **HIDDEN, **page_redraw(work_of_tab)))


def picked(control: gr.components.Component):
    """The event of a visitor's own change of `control`. A dropdown's is .select: its .input fires twice
    per pick in Gradio 6 (two identical redraws queued back to back)."""
    return control.select if isinstance(control, gr.Dropdown) else control.input


# The progress animation only on the figures: Gradio redraws a status tracker for every output of an
# event (here every control, to mark an invalid one), a cost paid on every change for nothing.
def figures_of(outputs: list) -> dict:
    return dict(show_progress="minimal", show_progress_on=[o for o in outputs if isinstance(o, gr.Plot)])


def api_only(fn, inputs, outputs, **kw):
    """An endpoint for API clients that nothing on the page triggers (an event with no triggers, as gr.api makes
    one), its inputs and outputs declared by components and admitted like any other (`kw`: its lane)."""
    return gr.on([], fn, inputs, outputs, **kw)


def wire_controls(page: SimpleNamespace, c: dict) -> None:
    """Any control -> validated query string + the visible tab redrawn, in one round trip; an invalid value
    is marked at its control and the rest keeps working. API clients get the same change, refused with
    the field named. A click on a heatmap cell sets its layer, head and query row together (PICK_ROW). The
    colour scale is redrawn in the browser (IN_BROWSER), and where the page holds them (else the server
    redraws) the query row (QUERY_ROW), the layer (LAYER), the head (HEAD_PICK) and the values shown
    (VALUES_PICK): the next server change reads them from their controls."""
    controls = [c[f] for f in CONTROL_FIELDS]
    page.pick.submit(pick_on_page, [page.pick] + controls + [page.tab_state, page.query],
                    [page.query, page.limit_md] + controls + page.view_outputs,
                    api_name="render_after_pick", trigger_mode="always_last", **figures_of(page.view_outputs), **HIDDEN,
                    **page_redraw(work_of_pick), **RAW).then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
    for f, js in IN_BROWSER.items():    # no server request: the page redraws and writes the link
        picked(c[f])(None, [c[f], page.query], [page.query], js=js, api_name=f"{f}_in_browser", **STEP, **RAW) \
            .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
    picked(c["query"])(None, [c["query"], page.query], [page.query], js=QUERY_ROW,
                       api_name="query_in_browser", **STEP, **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
    for f, js in (("layer", LAYER), ("head", HEAD_PICK), ("values", VALUES_PICK)):
        picked(c[f])(None, [c[f], c["query"], page.query], [page.query],
                     js=js, api_name=f"{f}_in_browser", **STEP, **RAW) \
            .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
    gr.on([picked(c[f]) for f in CONTROL_FIELDS if f not in ("preset", "family", "query", "layer", "head", "values",
                                                              *IN_BROWSER)]
          + [page.redraw.submit], control_change_on_page,
          controls + [page.tab_state, page.query],
          [page.query, page.limit_md] + controls + page.view_outputs,
          api_name="render_on_change", trigger_mode="always_last", **figures_of(page.view_outputs), **HIDDEN,
          **page_redraw(work_of_page_change), **RAW).then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
    api_only(control_change, controls + [page.tab_state], [page.query, c["head"]] + page.view_outputs,
             api_name="control_change", **forward(work_of_change), **RAW)
    api_only(settings_endpoint, controls, page.api_text, api_name="settings", **UNQUEUED, **RAW)


def wire_sources(page: SimpleNamespace, c: dict) -> None:
    """A preset, a family or an uploaded file sets many controls at once and the visible tab redraws: on
    the page in one round trip. /preset and /family answer API clients with the query string alone (api_only)."""
    controls = [c[f] for f in CONTROL_FIELDS]
    for name, api_fn, page_fn, inputs in (
            ("preset", preset_endpoint, preset_on_page, [c["preset"]]),
            ("family", family_endpoint, family_on_page, [page.query, c["family"]])):
        api_only(api_fn, inputs, page.api_text, api_name=name, **UNQUEUED, **RAW)
        outputs = [page.query, page.limit_md] + controls + page.view_outputs
        picked(c[name])(page_fn, inputs + [page.tab_state], outputs, api_name=f"render_after_{name}",
                        **figures_of(outputs), **HIDDEN, **page_redraw(work_of_source), **RAW) \
            .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
    # Reset: every control back to the preset's values, as picking the preset again would
    outputs = [page.query, page.limit_md] + controls + page.view_outputs
    page.reset.click(preset_on_page, [c["preset"], page.tab_state], outputs, api_name="render_after_reset",
                     **figures_of(outputs), **HIDDEN, **page_redraw(work_of_source), **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)
    ev = page.upload.upload(upload_endpoint, [page.query, page.upload], [page.query, page.upload_msg],
                            api_name="upload_weights", **UPLOAD)
    redraw(page, ev.success(query_to_controls, page.query, controls, api_name="sync_upload",
                            show_progress="hidden", **STEP), "upload")


def wire_navigation(demo: gr.Blocks, page: SimpleNamespace, c: dict) -> None:
    """Opening a tab redraws it; a page load reads its link; closing the page forgets its uploads."""
    for name, tab in page.tab.items():
        tab.select(tab_opened(name), page.tab_state, page.tab_state, api_name=f"tab_{name}", show_progress="hidden",
                   **STEP) \
           .success(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP) \
           .then(render_tab, [page.query, page.tab_state], page.view_outputs, api_name=f"render_{name}",
                 **figures_of(page.view_outputs), **HIDDEN, **page_redraw(work_of_tab))
    page.copy.click(None, None, None, api_name="copy_link", js=COPY_LINK, **STEP)
    # the load stays queued: its gr.Warning about a bad link reaches the page through the queue
    redraw(page, demo.load(load_endpoint, None, [page.query, page.tab_state, page.tabs, page.marked], api_name="load",
                           **HIDDEN, **CONTROL)
           .success(link_to_controls, [page.query, page.marked], [c[f] for f in CONTROL_FIELDS], api_name="sync_load",
                    show_progress="hidden", **STEP)
           .then(limit_endpoint, page.query, page.limit_md, api_name="limit_after_load", **STEP), "load")
    demo.load(None, None, None, js=PICK_ROW, api_name="pick_row", **STEP)
    demo.unload(page_gone)
    # Back and Forward: the address they went to read as a link (its controls, tab and view), the address
    # kept as it is (static/page.js: explorer.restoring)
    page.history.submit(link_on_page, page.history,
                        [page.query, page.tab_state, page.tabs, page.limit_md] + [c[f] for f in CONTROL_FIELDS]
                        + page.view_outputs, api_name="render_after_history", **figures_of(page.view_outputs),
                        **HIDDEN, **page_redraw(work_of_link), **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)


def wire_presentation(page: SimpleNamespace, c: dict) -> None:
    """Presentation mode (static/present.js): the Present button enters it in the browser; the keys pressed
    step the view on the server in one round trip (controls set, visible tab redrawn, link moved)."""
    outputs = [page.query, page.limit_md] + [c[f] for f in CONTROL_FIELDS] + page.view_outputs
    page.keys.submit(present_key_on_page, [page.query, page.keys, page.tab_state], outputs, api_name="render_after_key",
                     **figures_of(outputs), **HIDDEN, **page_redraw(work_of_keys), **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP) \
        .then(None, None, None, js=page_call("present.done"), **STEP)
    page.present.click(None, None, None, js=page_call("present.enter"), api_name="present", **STEP)
    # ↑ ↓ where the page holds the head's panel: drawn by the page, then the link, the dropdown and the address
    page.head_key.submit(None, [page.head_key, page.query], page.query, js=HEAD_KEY, api_name="head_key_in_browser",
                         **STEP, **RAW) \
        .then(head_of_link, page.query, c["head"], api_name="head_of_link", show_progress="hidden", **STEP, **RAW) \
        .then(None, [page.query, page.tab_state], None, js=WRITE_URL, **STEP)


def wire_view_api(page: SimpleNamespace, outputs: dict) -> None:
    """The API: one endpoint per view, the configuration as a query string."""
    for view in drawn_views():
        lane = forward if view.needs_model else light       # the mask builds no model: milliseconds
        api_only(VIEW_ENDPOINTS[view.name], page.api_query, outputs[view.name], api_name=view.name,
                 **lane(work_of_query(view.name)))


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
    # .change, not .input: Gradio's textbox sends no input event when characters are deleted, so an emptied
    # box would keep the last message and Run enabled
    gr.on([t.lengths.change, t.backends.input], api_name="timing_check", trigger_mode="always_last", **check)
    # the sidebar sets the shapes, mask, cap and candidates: the message follows it while the tab is open (the page
    # sends the recheck port as it writes a new link there: static/page.js explorer.writeUrl)
    t.recheck.submit(api_name="timing_check_after_query", trigger_mode="always_last", **check)
    page.tab["timing"].select(timing_recorded, [page.query, t.geometry, t.dtype, t.figures[0]], t.figures,
                              api_name="timing_recorded", **{**quiet, "queue": True}, **CONTROL)
    # a link that opens on this tab (a page load, Back or Forward: the tabs change; the lesson's timing step) draws
    # the committed curves as well
    page.tabs.change(timing_recorded_on_link, [page.tab_state, page.query, t.geometry, t.dtype, t.figures[0]],
                     t.figures, api_name="timing_recorded_on_link", **{**quiet, "queue": True}, **CONTROL)


def wire_export(page: SimpleNamespace, e: SimpleNamespace) -> None:
    gr.on([page.tab["export"].select, e.figure.select, e.aspect.input], export_preview_endpoint,
          [page.query, e.figure, e.aspect], e.preview, api_name="render_export_preview", show_progress="minimal", **HIDDEN,
          **forward(work_of_figure), **RAW)
    e.figure_btn.click(export_endpoint, [page.query, e.figure, e.format, e.aspect], e.file, api_name="export_figure",
                       **EXPORT, **RAW)
    e.pack_btn.click(lecture_pack_endpoint, [page.query, e.aspect], e.file, api_name="lecture_pack",
                     **EXPORT_PACK, **RAW)


def build_app() -> gr.Blocks:
    runs.serve_uploads(uploads.state_of)        # "upload:<name>" weights: this server's store of each visitor's
    d, c = parse_settings({}), {}
    with gr.Blocks(title="Attention explorer for recommendation transformers", delete_cache=DELETE_CACHE) as demo:
        page = page_header(d)
        with gr.Row():
            with gr.Column(scale=1, min_width=300, elem_id="sidebar"):
                view_controls(d, c)
                source_controls(d, c, page)
                layout_controls(d, c)
                model_controls(d, c)
            with gr.Column(scale=4):
                built, page.tab = {}, {}
                # every tab's title in view (wrapped onto a second row where the width is short), none in a menu
                with gr.Tabs(overflow_behavior="wrap") as page.tabs:
                    for view in VIEWS.values():
                        with gr.Tab(view.title, id=view.name) as page.tab[view.name]:
                            gr.Markdown(view.look_for, elem_classes=["look-for"])
                            built[view.name] = (view_tab(view, d, c) if view.drawn
                                                else OWN_TABS[view.name](d, c))
        page.view_outputs = [out for view in drawn_views() for out in built[view.name]]
        wire_controls(page, c)
        wire_sources(page, c)
        wire_navigation(demo, page, c)
        wire_presentation(page, c)
        wire_view_api(page, built)
        wire_timing(page, built["timing"])
        wire_export(page, built["export"])
    # api_open=False: a queued event never runs through /run/<name> past its lane (the default off a Space)
    demo.queue(default_concurrency_limit=4, max_size=QUEUE_MAX, api_open=False,
               status_update_rate=gradio_patches.QUEUE_STATUS_S)
    admit_every_event(demo)
    watch_lanes(demo)
    gradio_patches.bound_sessions(demo)
    gradio_patches.charge_every_event(demo, ADMISSION)
    gradio_patches.keep_queue_alive(demo)
    gradio_patches.skip_queue_analytics(demo)
    gradio_patches.poll_less(demo)
    gradio_patches.stop_abandoned_work(demo)
    gradio_patches.keep_outputs_out_of_session_state()
    gradio_patches.skip_unchanged_outputs(demo)
    gradio_patches.skip_absent_matplotlib()
    gradio_patches.resolve_annotations(demo)
    gradio_patches.process_cheap_components_inline()
    gradio_patches.check_logins_on_the_loop()
    gradio_patches.remember_root_urls()
    gradio_patches.asyncio_event_loop()
    gradio_patches.keep_connections_alive()
    return demo



def launch_options(demo: gr.Blocks | None = None) -> dict:
    """demo.launch keywords: the front door (rates, body and upload-route bounds per visitor; with `demo`, its
    /healthz answers for demo's queue), the session capacity, and no run history (a page of its own that
    records every call)."""
    from starlette.middleware import Middleware
    health = gradio_patches.queue_health(demo) if demo is not None else None
    return dict(show_error=True, max_file_size=f"{runs.MAX_UPLOAD_BYTES}b", head=HEAD, css_paths=CSS_PATHS,
                state_session_capacity=memory.SESSION_CAPACITY, run_history=False,
                app_kwargs={"middleware": [Middleware(front_door.FrontDoor, health=health)]})


def warm_up() -> None:
    """Build and run the models explorer.runs.warm_up_queries names (the default view's, phoenix-nano's, and on a
    GPU the production presets'), in the background after start-up, so the first visitor to pick one waits less."""
    for query in runs.warm_up_queries():
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


# show_error=True: our own functions answer every problem as a gr.Error already (`server.guard.guarded`), so what
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
    memory.configure_threads()          # once, before any worker thread runs a forward
    memory.configure_malloc_arenas()    # before any thread but this one allocates
    memory.configure_gil_switch()
    drawing.draw_processes(), drawing.process_memory_bytes(), drawing.idle_exit_s()   # a bad value stops the start, named
    demo = build_app()
    memory.freeze_startup_objects()     # the idle trim's collections then skip the page and the imports
    memory.start_idle_trim()
    disk.start_sweeper()
    warm = threading.Timer(3.0, warm_up)
    warm.daemon = True
    warm.start()
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), **launch_options(demo))
