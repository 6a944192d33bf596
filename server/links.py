"""The page's controls and the link (a URL query string) in both directions: control values to a
checked link, a link, a preset or a family to every control, the choices the menus offer."""
from __future__ import annotations

import gradio as gr

from explorer import controls
from explorer.controls import CONTROL_FIELDS
from explorer.limits import device
from explorer.query_string import retired_note, to_query
from explorer.schema import Settings
from explorer.settings import all_values, parse_settings, with_family
from explorer.views import VIEWS
from models.presets import PRESETS

from . import uploads
from .visitors import visitor_of
from .guard import as_text, guarded, limit_note, model_limit, session_of, settings_of


@guarded
def settings_endpoint(request: gr.Request, *values):
    """Every control's value, in CONTROL_FIELDS order -> the validated query string."""
    return to_query(parse_settings(dict(zip(CONTROL_FIELDS, values)), uploaded=uploads.uploads(session_of(request))))


def control_values(s: Settings) -> list:
    """Every control's value in `s`, in the page's order (the views' controls looked up once, not per field)."""
    values = all_values(s)
    return [values[f] for f in CONTROL_FIELDS]


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


def tab_opened(name: str):
    """A tab's select event -> the open tab, `name`; the chain after it (the link written, the tab redrawn)
    runs only when the tab changed. Gradio 6 also selects the first tab as the page mounts, before the page
    has read its link (measured: before the load's own request in some page loads under load): that select
    must neither write the address — the load reads the link from it — nor redraw the default view."""
    def opened(was: str) -> str:
        if was == name:
            raise gr.Error("the tab is open already", visible=False, print_exception=False)
        return name
    return opened


@guarded
def load_endpoint(request: gr.Request):
    """Read the page's URL (a shared link) into the controls and open the tab it names. A bad value is
    dropped and its control marked; the rest of the link is kept. -> (query, tab, tabs, {field: message})"""
    params = dict(request.query_params) if request is not None else {}
    if retired_note(params):
        gr.Info(as_text(f"link: {retired_note(params)}"))
    tab = params.get("tab", "mask")
    tab = tab if isinstance(tab, str) and tab in VIEWS else "mask"
    weights = params.get("weights", "")
    if isinstance(weights, str) and weights.startswith("upload:"):    # a reload: its old page's upload is its own
        uploads.adopt(session_of(request), visitor_of(request)[0], weights.removeprefix("upload:"))
    s, problems = controls.from_link(params, uploads.uploads(session_of(request)))
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
    # a preset, upload or link replaces every marked value: each control's own info line again
    values = [gr.update(value=v, info=controls.INFO.get(f), elem_classes=[]) for f, v in zip(CONTROL_FIELDS,
                                                                                           control_values(s))]
    clear = dict(info=None, elem_classes=[])
    values[CONTROL_FIELDS.index("head")] = gr.update(choices=head_choices(s), value=s.head, **clear)
    values[CONTROL_FIELDS.index("weights")] = gr.update(choices=weight_choices(request), value=s.weights, **clear)
    return values


def head_choices(s: Settings):
    return [("all heads (grid)", -1)] + [(f"head {h} (KV {h // (s.num_q_heads // s.num_kv_heads)})", h)
                                        for h in range(s.num_q_heads)]


def weight_choices(request=None):
    """The weight sources, with this visitor's own uploads (never anyone else's)."""
    names = [("trained demo", "demo"), ("random (seed)", "random"), ("grok.py zeros", "zeros")]
    return names + [(f"uploaded {n}", f"upload:{n}") for n in uploads.uploads(session_of(request))]


@guarded
def limit_endpoint(query: str, request: gr.Request = None) -> str:
    """The note above the tabs for a configuration: '' or the model's device limit."""
    return limit_note(model_limit(settings_of(query, request, need_model=False)))
