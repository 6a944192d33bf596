"""The view endpoints (one per drawn view of explorer.views.VIEWS, each taking the configuration as a
URL query string), the page's redraws (a control change, a heatmap click, a preset, presentation
mode's keys: the visible tab redrawn in the same round trip), the exports and the weights upload. What a
redraw draws is decided by functions its admission calls too (page_change, picked, stepped:
server.lanes estimates exactly that), and a redraw the page has superseded draws nothing. The page's
control change and heatmap click are read once: their admission keeps what it read (read_page_change: the
settings, the marks, the view's cost) and the handler draws from that, passing Settings down (drawn_tab,
VIEW_DRAWS), never a query string to parse again."""
from __future__ import annotations

import functools
import os
from typing import NamedTuple, Optional
from urllib.parse import parse_qsl

import gradio as gr

from explorer import controls, export
from explorer.controls import CONTROL_FIELDS
from explorer.limits import Cost
from explorer.query_string import to_query
from explorer.schema import Settings, ValidationError
from explorer.settings import parse_settings
from explorer.views import VIEWS, Text, View, check_view, drawn_views

from . import uploads
from .admission import ADMISSION, KEPT_MAX_BYTES, check_drawn
from .browsers import browser_of
from .drawing import DRAWING, NotDrawnThere
from .visitors import visitor_of
from .gradio_patches import NotAFile
from .guard import (Read, admitted_read, as_markdown_text, current_request, gpu, guarded, limit_note, model_limit,
                    session_of, settings_of)
from .links import (family_endpoint, head_choices, limit_endpoint, link_to_controls, preset_endpoint, query_to_controls,
                    settings_endpoint)


def view_endpoint(view: View):
    """The API endpoint of a view: the configuration as a query string -> the view's outputs."""
    name = view.name

    def endpoint(query: str, request: gr.Request = None):
        s = settings_of(query, request, need_model=VIEWS[name].needs_model)
        return VIEW_DRAWS[name](s, request)
    endpoint.__name__ = endpoint.__qualname__ = f"{view.name}_endpoint"
    return guarded(endpoint)


def view_draw(view: View):
    """A view drawn from validated settings (the model's fit already checked where it needs one), in
    spaces.GPU where the view asks for it: its cost estimated once — `cost`, where the caller has it (the
    admission's Read) — refused by name past what the event was admitted for (check_drawn), then drawn. Where
    the admission found this view already drawn for these settings, it answers with those outputs, pinned on
    the request (`state.kept`, server.lanes.admit_to): kept there, they cannot be evicted while it waits."""
    name = view.name

    def draw(s: Settings, request=None, cost: Optional[Cost] = None) -> tuple:
        current = VIEWS[name]                   # the record as it is now (a test may stand one in)
        cost = cost if cost is not None else view_cost(current, s)
        check_drawn(getattr(getattr(request, "request", None), "state", None), cost.flops if cost else 0.0)
        if current is view and DRAWING.takes(current, s, cost):
            try:
                return current.draw(s, cost, elsewhere=lambda: DRAWING.draw(name, s, cost))
            except NotDrawnThere:
                pass                            # drawn here; the next view starts the process again
        return current.draw(s, cost)
    draw.__name__ = draw.__qualname__ = f"{view.name}_draw"
    drawn = gpu(draw) if view.gpu else draw

    def answer(s: Settings, request=None, cost: Optional[Cost] = None) -> tuple:
        kept = getattr(getattr(getattr(request, "request", None), "state", None), "kept", None)
        if kept is not None and kept[0] == name and kept[1] == s:
            return kept[2]                      # no device borrowed, nothing drawn
        return drawn(s, request, cost)
    answer.__name__ = answer.__qualname__ = f"{view.name}_draw"
    return answer


def kept_view(tab: str, s: Settings) -> Optional[tuple]:
    """The outputs of view `tab` already drawn for `s` and kept (explorer.views.View.kept) in at most
    KEPT_MAX_BYTES, else None."""
    view = VIEWS.get(tab) if isinstance(tab, str) else None
    return view.kept(s, KEPT_MAX_BYTES) if view is not None and view.drawn else None


def view_cost(view: View, s: Settings) -> Optional[Cost]:
    """`view`'s estimated cost with `s` (View.estimate), None past the budget (draw() refuses it by name)."""
    try:
        return view.estimate(s)
    except ValidationError:
        return None


def tab_cost(s: Optional[Settings], tab: str) -> Optional[Cost]:
    """What drawing `tab` with `s` costs; None when nothing is drawn (no settings, no drawn view, a model this
    device does not run — the handler then draws only the note) or settings past the budget."""
    view = VIEWS.get(tab) if isinstance(tab, str) else None
    if s is None or view is None or not view.drawn or (view.needs_model and model_limit(s)):
        return None
    return view_cost(view, s)


VIEW_DRAWS = {v.name: view_draw(v) for v in drawn_views()}
VIEW_ENDPOINTS = {v.name: view_endpoint(v) for v in drawn_views()}
# the outputs every redraw fills: each drawn view's, in tab order (app.py's page.view_outputs)
VIEW_OUTPUTS = sum(len(v.outputs) for v in drawn_views())
# a page redraw's answer (app.wire_controls's outputs, in order): these, then every control, then the views
CHANGE_HEAD = ("query", "note")
CHANGE_OUTPUTS = len(CHANGE_HEAD) + len(CONTROL_FIELDS) + VIEW_OUTPUTS
SOURCE_OUTPUTS = CHANGE_OUTPUTS                                 # a preset, a family, presentation keys, Reset
# Back / Forward's answer (app.wire_navigation): these, then every control, then the views
LINK_HEAD = ("query", "tab", "tabs", "note")
LINK_OUTPUTS = len(LINK_HEAD) + len(CONTROL_FIELDS) + VIEW_OUTPUTS


def control_slot(field: str, head: tuple = CHANGE_HEAD) -> int:
    """Where the update of `field`'s control sits in a page redraw's answer (`head`, then CONTROL_FIELDS)."""
    return len(head) + CONTROL_FIELDS.index(field)


class PageChange(NamedTuple):
    """The page's control change as Gradio hands it over (app.wire_controls lists its inputs in this order):
    every control's value, in CONTROL_FIELDS order, the visible tab, the last valid link. Split from Gradio's
    positional inputs here, once (PageChange.of), for the handlers and their admission (server.lanes); the
    API's control change (`control_change`: no last link) is split by the same function."""
    values: tuple
    tab: str
    last_query: str = ""

    @classmethod
    def of(cls, args, last_link: bool = True) -> "PageChange":
        """Gradio's positional inputs -> the change; a call with another number of them is refused by name."""
        n, rest = len(CONTROL_FIELDS), ("tab", "last link") if last_link else ("tab",)
        if len(args) != n + len(rest):
            raise ValidationError("inputs", f"{len(args)} values", f"{n} controls' values, then the {' and the '.join(rest)}")
        return cls(tuple(args[:n]), *args[n:])

    def with_values(self, chosen: dict) -> "PageChange":
        """The change with the controls in `chosen` ({field: value}) set."""
        return self._replace(values=tuple(chosen.get(f, v) for f, v in zip(CONTROL_FIELDS, self.values)))


def unless_superseded(outputs: int):
    """A page redraw's handler: when its page has sent a newer redraw since this one was admitted (it waited
    meanwhile: server.admission.Admission.superseded), its `outputs` are left as they are and nothing is drawn."""
    def wrap(fn):
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            if ADMISSION.superseded(getattr(getattr(current_request(), "request", None), "state", None)):
                return [gr.skip()] * outputs
            return fn(*args, **kwargs)
        return handler
    return wrap


@unless_superseded(VIEW_OUTPUTS)
@guarded
def render_tab(query: str, tab: str, request: gr.Request = None):
    """Redraw only the visible tab (the others redraw when they are opened): every drawn view's outputs,
    skipped but the visible one's. A view whose model does not fit this device says so in its first text."""
    view = check_view(tab, "tab")
    s = settings_of(query, request, need_model=False)   # every tab checks the query, also those drawn on demand
    return drawn_tab(view, s, request)


@unless_superseded(VIEW_OUTPUTS)
def drawn_tab(view: View, s: Settings, request=None, cost: Optional[Cost] = None) -> list:
    """render_tab's outputs from validated settings (`cost`: the view's estimate, where the caller has it)."""
    limit = model_limit(s) if view.drawn and view.needs_model else ""
    if limit:
        shown = [None] * len(view.outputs)
        shown[next(i for i, o in enumerate(view.outputs) if isinstance(o, Text))] = limit_note(limit)
    else:
        shown = VIEW_DRAWS[view.name](s, request, cost) if view.drawn else None
    flat = []
    for v in drawn_views():
        flat += list(shown) if v is view else [gr.skip()] * len(v.outputs)
    return flat


@guarded
def control_change(request: gr.Request, *args):
    """What one control change does on the page, in one round trip: validate every control, write
    the query string, keep the head list in step with the geometry, redraw the visible tab."""
    change = PageChange.of(args, last_link=False)
    query = settings_endpoint(request, *change.values)
    s = settings_of(query, request)
    return [query, gr.update(choices=head_choices(s), value=s.head)] + render_tab(query, change.tab, request)


def page_change(change: PageChange, request=None) -> tuple[Settings, dict]:
    """What the page's control change draws -> (settings, {field: message}): every valid control, and for
    each invalid one the value of the last valid link (explorer.controls.keep_valid)."""
    last = settings_of(change.last_query, request, need_model=False)
    return controls.keep_valid(dict(zip(CONTROL_FIELDS, change.values)), last, uploads.uploads(session_of(request)))


def read_page_change(change: PageChange, request=None) -> Read:
    """The page's control change read once: what it draws (page_change) and its view's cost (none when the
    link did not change: no view is redrawn). Its admission (server.lanes.work_of_page_change) reads it and
    keeps it on the request; the handler takes that (page_read). The Read keeps the change as its inputs."""
    s, problems = page_change(change, request)
    cost = None if to_query(s) == change.last_query else tab_cost(s, change.tab)
    return Read(change, s, problems, change.tab, cost)


def page_read(change: PageChange, request=None) -> Read:
    """The control change's Read its admission kept, or, with none (a direct call), read here."""
    return admitted_read(request, change) or read_page_change(change, request)


@unless_superseded(CHANGE_OUTPUTS)
@guarded
def control_change_on_page(request: gr.Request, *args):
    """The page's control change: like control_change, but an invalid value is marked at its control
    (its message under it) instead of refusing the whole change; the last valid view stays drawn and
    every other control keeps working, its mark cleared — every control's, whatever marks the page shows
    (a change typed while an earlier one is answered must not leave that one's mark). Model views name the
    device limit instead of failing."""
    return draw_page_change(page_read(PageChange.of(args), request), request)


def draw_page_change(read: Read, request=None) -> list:
    """control_change_on_page's answer for a change read (page_read; `read.inputs` the PageChange): CHANGE_HEAD,
    the controls' marks, the views."""
    s, problems, change = read.settings, read.problems, read.inputs
    query = to_query(s)
    marks = {f: gr.update(info="⚠ " + problems[f], elem_classes=["invalid"]) if f in problems
             else gr.update(info=controls.INFO.get(f), elem_classes=[]) for f in CONTROL_FIELDS}
    marks["head"].update(choices=head_choices(s), **({"value": s.head} if "head" not in problems else {}))
    views_out = (drawn_tab(check_view(change.tab, "tab"), s, request, read.cost) if query != change.last_query
                 else [gr.skip()] * VIEW_OUTPUTS)
    note = "\n\n".join(n for n in (controls.last_valid_note(problems), limit_note(model_limit(s))) if n)
    return [query, note] + [marks[f] for f in CONTROL_FIELDS] + views_out


PICKED = ("layer", "head", "query")


def picked(pick: str, change: PageChange) -> tuple[PageChange, dict]:
    """A heatmap click (static/page.js sends `layer=1&head=3&query=7`, or only `query` for a panel of no
    one head) on a control change -> (the change with those controls set, {control: value picked})."""
    chosen = dict(parse_qsl(pick if isinstance(pick, str) else "", keep_blank_values=True))
    if not chosen or set(chosen) - set(PICKED):
        raise ValidationError("pick", pick, "layer=<int>&head=<int>&query=<int> from a click on a heatmap")
    return change.with_values({f: chosen[f] for f in PICKED if f in chosen}), chosen


@unless_superseded(CHANGE_OUTPUTS)
@guarded
def pick_on_page(request: gr.Request, pick: str, *args):
    """A click on a heatmap cell: those controls set together (picked), then the usual control
    change; the layer and query boxes show the values drawn."""
    change, chosen = picked(pick, PageChange.of(args))
    read = page_read(change, request)
    out = draw_page_change(read, request)
    for f in ("layer", "query"):
        if f in chosen and not out[control_slot(f)].get("elem_classes"):
            out[control_slot(f)] = gr.update(value=getattr(read.settings, f), info=controls.INFO.get(f),
                                             elem_classes=[])
    return out


def source_change_on_page(query: str, tab: str, request=None) -> list:
    """After a preset or family switch on the page, in the same round trip: the query string, the device
    note, every control set from it and the visible tab redrawn (one event instead of four chained)."""
    return ([query, limit_endpoint(query, request)] + query_to_controls(query, request)
            + render_tab(query, tab, request))


@unless_superseded(LINK_OUTPUTS)
@guarded
def link_on_page(link: str, request: gr.Request = None):
    """The browser's Back or Forward (static/page.js writes the address it went to): that address read as a
    page load reads a link — every control set from it, a bad value dropped and marked, its tab opened and
    redrawn, in one round trip. -> (query, tab, the tabs' update, device note, controls..., views...)"""
    s, problems, tab = linked(link, request)
    query = to_query(s)
    return ([query, tab, gr.Tabs(selected=tab), limit_endpoint(query, request)] + link_to_controls(query, problems, request)
            + render_tab(query, tab, request))


def linked(link: str, request=None) -> tuple[Settings, dict, str]:
    """What Back / Forward draws -> (settings, {field: message}, tab): the address read as a page load reads a
    link (explorer.controls.from_link: a bad value dropped), its tab or the first."""
    params = dict(parse_qsl(str(link or "").lstrip("?"), keep_blank_values=True))
    tab = params.get("tab") if params.get("tab") in VIEWS else "mask"
    s, problems = controls.from_link(params, uploads.uploads(session_of(request)))
    return s, problems, tab


def stepped(query: str, keys: str, request=None) -> Settings:
    """Presentation mode's keys, comma-separated (those pressed since the last answer), stepping the view of
    `query` (explorer.controls.step_view)."""
    s = settings_of(query, request, need_model=False)
    for key in str(keys or "").split(",")[:64]:
        if key:
            s = controls.step_view(s, key)
    return s


@unless_superseded(SOURCE_OUTPUTS)
@guarded
def present_key_on_page(query: str, keys: str, tab: str, request: gr.Request = None):
    """Presentation mode's keys: the view stepped, every control set from it and the visible tab redrawn."""
    return source_change_on_page(to_query(stepped(query, keys, request)), tab, request)


@unless_superseded(SOURCE_OUTPUTS)
@guarded
def preset_on_page(preset: str, tab: str, request: gr.Request = None):
    return source_change_on_page(preset_endpoint(preset), tab, request)


@unless_superseded(SOURCE_OUTPUTS)
@guarded
def family_on_page(query: str, family: str, tab: str, request: gr.Request = None):
    return source_change_on_page(family_endpoint(query, family, request), tab, request)


@guarded
def export_endpoint(query: str, figure: str, fmt: str, aspect: str = "16:9", request: gr.Request = None):
    # mask, tile and timing figures need no model: they export at every preset (export.figure checks
    # the model for the figures that run it)
    return export.export_figure(settings_of(query, request, need_model=False), figure, fmt, aspect=aspect)


@guarded
def export_preview_endpoint(query: str, figure: str, aspect: str = "16:9", request: gr.Request = None):
    """The Export tab's picture: the figure chosen as its slide draws it."""
    return export.preview(settings_of(query, request, need_model=False), figure, aspect)


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
    name = uploads.load_upload(s, path, session_of(request), visitor_of(request)[0], browser_of(request))
    s = parse_settings({**s.to_dict(), "weights": f"upload:{name}"}, uploaded=uploads.uploads(session_of(request)))
    return to_query(s), (f"Loaded {as_markdown_text(os.path.basename(path))}: every shape matches; "
                         "the views now use it (for this visitor only).")


def page_gone(request: gr.Request = None):
    """The page was closed, or its connection dropped: its uploads go uploads.PAGE_GONE_GRACE_S later
    unless it comes back (any request of the session), rather than after uploads.UPLOAD_TTL_S."""
    uploads.page_gone(session_of(request))
