"""Figures for lectures: every current figure as PNG (3x scale) or SVG through kaleido, sized for a
slide (16:9 by default) with tick labels of at least 16 px, and a lecture pack: a zip of every figure
that can be drawn here (PNG, SVG and the numbers drawn, as NPZ), captions generated from each figure's
own settings, what was left out and why, the configuration, and ``lesson.html`` — every figure
interactive in lesson order, in one file that needs no network.

Figures are rebuilt from the settings (views are deterministic for a configuration and seed), so an
export is the same picture the page shows, in the lecture theme. File names carry the preset and the
layer, head, row or bug a figure shows.
"""
from __future__ import annotations

import atexit
import base64
import collections
import contextlib
import functools
import hashlib
import html
import io
import itertools
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import plotly.graph_objects as go

from . import budget, views
from .figures import lecture_theme
from .lesson import LESSON, STORIES, Step
from .limits import check_model_fits, device
from .query_string import to_query
from .schema import Settings, ValidationError
from .settings import all_values

log = logging.getLogger("explorer")

FORMATS = ("png", "svg")
# slide shapes: (width, height) in layout pixels; "figure" keeps the figure's own size (OWN_WIDTH wide)
ASPECTS = {"16:9": (1600, 900), "4:3": (1440, 1080), "figure": None}
OWN_WIDTH = 1400
MIN_TICK_PX = 16
LESSON_MAX_BYTES = 15 << 20       # lesson.html: figures whose data would pass it stay in figures/ only
LESSON_PAGE_BYTES = 64 << 10      # the page around the figures: headings, captions, what was left out


@dataclass(frozen=True)
class FigureSpec:
    """One exportable figure (an Export of a Plot in explorer.views.VIEWS): the view and part that draw
    it, its index in what the part returns, its record (facts, caption, settings) and the Plot's label."""
    view: views.View
    part: int
    index: int
    export: views.Export
    label: str = ""

    @property
    def title(self) -> str:
        """What a lecturer calls it: 'Mask · production's kernels: tiles run and skipped'."""
        return f"{self.view.title.split(' · ', 1)[-1]} · {self.export.title or self.label}"

    @property
    def model(self) -> bool:
        """It runs the sidebar's model (then it needs the model to fit this device)."""
        return self.view.parts[self.part].model

    def adjust(self, s: Settings) -> Settings:
        return self.export.adjust(s)

    def draw(self, s: Settings) -> tuple:
        return self.view.draw_part(self.part, s)


def _figure_specs() -> dict[str, FigureSpec]:
    """Every export a view's record names, in tab order (the pack and lesson.html keep this order)."""
    return {export.name: FigureSpec(view, p, i, export, out.label)
            for view in views.VIEWS.values() for p, part in enumerate(view.parts)
            for i, out in enumerate(part.outputs) for export in getattr(out, "exports", ())}


FIGURES = _figure_specs()


def check_figure(name) -> FigureSpec:
    if not isinstance(name, str) or name not in FIGURES:      # a list from an API client is unhashable
        raise ValidationError("figure", name, ", ".join(FIGURES))
    return FIGURES[name]


def shown(s: Settings, name: str) -> dict[str, str]:
    """What one figure shows of the settings, each fact as the words its title uses ('layer 0',
    'query head 1', 'query C2', "bug 'x'"): captions and file names are generated from these."""
    spec = check_figure(name)
    return spec.export.facts(spec.adjust(s))


def file_stem(s: Settings, name: str) -> str:
    """'attention-lecture-L0-h1', 'query_row-lecture-L0-h0-C2', 'bug_zoo-lecture-L0-h0-bug-<bug>':
    the figure, the preset, and the layer, head, row, candidate or bug it shows."""
    parts = [name, s.preset]
    for key, fact in shown(s, name).items():
        last = fact.split()[-1]
        if key == "layer":
            parts.append("L" + (last if last.isdigit() else "all"))
        elif key == "head":
            parts.append("h" + (last if last.isdigit() else fact.split()[2] if " of " in fact else "all"))
        elif key == "bug":
            parts.append("bug-" + fact.split("'")[1])
        elif key == "candidate":
            parts.append(last)
        elif key == "zoom":
            parts.append("zoom")
        else:                                               # the row's token label, the variant's name
            parts.append(last.strip("'"))
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip("-")


def caption(s: Settings, name: str) -> str:
    """What the figure shows, in a sentence or two a slide can carry, from the settings it was drawn
    with (`shown`): its layer, head, query row, candidate or bug."""
    spec = check_figure(name)
    return spec.export.caption(spec.adjust(s), shown(s, name), s)


def figure(s: Settings, name: str) -> go.Figure:
    """The figure `name` for the settings; one that runs the sidebar's model is refused by name
    (ValidationError) where that model does not fit this device."""
    spec = check_figure(name)
    if spec.model:
        check_model_fits(s)
    return as_drawn(spec.draw(spec.adjust(s))[spec.index])


def as_drawn(fig: go.Figure) -> go.Figure:
    """The figure as it is drawn: the traces a view sends hidden for the page to show later (a one-head
    view's other heads, explorer.views.attention_view) left out of files and their data."""
    if all(t.visible is not False for t in fig.data):
        return fig
    return go.Figure(dict(data=[t for t in fig.data if t.visible is not False], layout=fig.layout), _validate=False)


def preview(s: Settings, name: str, aspect: str = "16:9") -> go.Figure:
    """The slide the figure makes: as its export draws it (the lecture theme, tick labels of at least
    MIN_TICK_PX) at the slide's size (the page shows it scaled to its box: static/page.js fitPreview)."""
    fig = slide_figure(figure(s, name), aspect)
    if fig.layout.width is None:                 # the figure's own shape: as figure_bytes renders it
        fig.update_layout(width=OWN_WIDTH)
    return fig


def pack_max_flops() -> float:
    """The model work one lecture pack may run (its figures' views, estimated): about 15 s of a free CPU
    Space's core; a pack past it leaves the largest views' figures out, each exported alone instead."""
    return 1e15 if device() == "cuda" else 150e9


FAILED = "internal error while drawing it"        # a figure a pack left out by a failure, not by a rule


def all_figures(s: Settings) -> tuple[dict[str, tuple[go.Figure, str]], dict[str, str]]:
    """({name: (figure, caption)} for every figure that can be drawn here, {name: why not} for the
    rest); each view runs once per settings it is drawn with, while the views' estimated work stays
    within pack_max_flops (in lesson order)."""
    outputs, drawn, left_out = {}, {}, {}
    spent = 0.0
    for name, spec in FIGURES.items():
        budget.check_wanted()                   # (outside the try: a requester gone is no figure's failure)
        key = (spec.view.name, spec.part, spec.adjust(s))
        try:
            if spec.model:
                check_model_fits(s)
            if key not in outputs:
                flops = spec.view.estimate(key[2]).flops if spec.model else 0.0
                if spent + flops > pack_max_flops():
                    raise ValidationError(
                        "lecture pack", f"{(spent + flops) / 1e9:,.0f} GFLOP of model views with {name}",
                        f"{pack_max_flops() / 1e9:,.0f} GFLOP per pack on this {device().upper()}: export "
                        f"{name} alone (Export figure), or make the model smaller")
                spent += flops
                outputs[key] = spec.draw(key[2])
        except ValidationError as e:
            fits = spec.model and e.field != "lecture pack"
            left_out[name] = f"runs the sidebar's model, which does not fit here: {e}" if fits else str(e)
            continue
        except Exception as e:  # noqa: BLE001 — one figure's failure must not cost the class the pack
            log.exception("lecture pack: %s failed", name)
            left_out[name] = f"{FAILED} ({type(e).__name__}; logged on the server)"
            continue
        drawn[name] = (as_drawn(outputs[key][spec.index]), caption(s, name))
    return drawn, left_out


def _array(value) -> np.ndarray:
    """A trace's x / y / z as numpy: plotly's base64 typed arrays decoded, categories as strings."""
    if isinstance(value, dict) and "bdata" in value:
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return out.reshape([int(n) for n in str(shape).split(",")]) if shape is not None else out
    arr = np.asarray(value, dtype=object)
    try:
        return np.asarray(np.where(arr == None, np.nan, arr), dtype=float)  # noqa: E711 — gaps are None
    except (TypeError, ValueError):
        return np.asarray(value, dtype=str)


DRAWN_KEYS = ("x", "y", "z", "base")


def figure_data(fig: go.Figure) -> dict[str, np.ndarray]:
    """Exactly the numbers drawn, per trace: 'trace<i>.<x|y|z>' arrays and 'trace<i>.name', plus
    error bars ('trace<i>.error_plus' / 'error_minus'). Read from the figure itself."""
    out = {}
    for i, t in enumerate(fig.to_plotly_json()["data"]):
        out[f"trace{i}.name"] = np.asarray(str(t.get("name") or t.get("meta") or t.get("type", "")))
        for key in DRAWN_KEYS:
            if t.get(key) is not None:
                out[f"trace{i}.{key}"] = _array(t[key])
        err = t.get("error_y") or {}
        if err.get("array") is not None:
            out[f"trace{i}.error_plus"] = _array(err["array"])
            out[f"trace{i}.error_minus"] = _array(err.get("arrayminus", err["array"]))
    return out


def npz_bytes(fig: go.Figure) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **figure_data(fig))
    return buf.getvalue()


@functools.lru_cache(maxsize=None)
def _browser_found() -> bool:
    """kaleido's own search; without a browser its server thread dies and the export would hang."""
    from choreographer.browsers.chromium import Chromium
    path = Chromium.find_browser(skip_local=False)
    return bool(path) and os.access(path, os.X_OK)


# kaleido's headless Chromium (~1 GB with its renderer, measured in the soak) is counted in the memory
# ceiling while it runs, and stopped BROWSER_IDLE_S after the last render (its memory back to the OS).
BROWSER_BYTES = 1 << 30
BROWSER_IDLE_S = 20.0
class _FairLock:
    """First come, first served: a released threading.Lock goes to whichever thread asks first, so a pack
    rendering figure after figure could take it back before a one-figure export that waits."""

    def __init__(self):
        self.cond, self.issued, self.serving = threading.Condition(), 0, 0

    def __enter__(self):
        with self.cond:
            ticket, self.issued = self.issued, self.issued + 1
            self.cond.wait_for(lambda: self.serving == ticket)

    def __exit__(self, *exc):
        with self.cond:
            self.serving += 1
            self.cond.notify_all()


_render_lock = _FairLock()
_browser = {"up": False, "last": 0.0, "timer": None}


@contextlib.contextmanager
def _renderer():
    """One render at a time, in one headless Chromium kept between renders (kaleido otherwise starts one per
    image, ~5 s). A lecture pack renders figure by figure, so a one-figure export waits for one render of
    it, never for the whole pack."""
    import kaleido
    with _render_lock:
        if not _browser["up"]:
            budget.MEMORY.hold("export browser", BROWSER_BYTES)
            kaleido.start_sync_server(silence_warnings=True)
            _browser["up"] = True
        try:
            yield
        finally:
            _browser["last"] = time.monotonic()
            _stop_browser_later(BROWSER_IDLE_S)


def _stop_browser_later(delay_s: float) -> None:
    """(call under _render_lock) Stop the browser `delay_s` from now unless another render comes first."""
    if _browser["timer"] is not None:
        _browser["timer"].cancel()
    _browser["timer"] = threading.Timer(delay_s, _stop_browser_if_idle)
    _browser["timer"].daemon = True
    _browser["timer"].start()


def _stop_browser_if_idle() -> None:
    with _render_lock:
        if _browser["up"] and time.monotonic() - _browser["last"] >= BROWSER_IDLE_S:
            _stop_browser()


def stop_browser() -> None:
    """Stop the export browser now (the next render starts it again)."""
    with _render_lock:
        _stop_browser()


def _stop_browser() -> None:
    import kaleido
    kaleido.stop_sync_server(silence_warnings=True)
    _browser["up"] = False
    budget.MEMORY.release("export browser")


# Processes this server started that keep its priority (the drawing process, server.drawing: the visitors'
# model views), whatever _browser_yields lowers; their pids, recorded as they start (under the lock the
# walk holds, so no walk finds one before it is recorded).
_KEEP_PRIORITY: set[int] = set()
_keep_priority_lock = threading.Lock()


def start_keeping_priority(start: Callable[[], Any]) -> Any:
    """start() (a subprocess.Popen) with its process kept out of _browser_yields' lowering until
    `priority_released(its pid)`."""
    with _keep_priority_lock:
        process = start()
        _KEEP_PRIORITY.add(process.pid)
    return process


def priority_released(pid: int) -> None:
    """Process `pid` (of start_keeping_priority) has ended: its pid, reused, is another process's."""
    with _keep_priority_lock:
        _KEEP_PRIORITY.discard(pid)


def _browser_yields() -> None:
    """Every thread of every process this server started (the export browser: kaleido's Chromium and
    the renderers it spawns, which set their own priorities) at budget.LOW_PRIORITY_NICE, so a render
    (about a core while it draws) yields to the views; not the processes started to keep the server's
    priority (start_keeping_priority) nor theirs. Linux (/proc); elsewhere a no-op.
    kaleido starts the browser in a session of its own, and where the kernel schedules by session group
    (autogroup, /proc/sys/kernel/sched_autogroup_enabled) a thread's nice weighs only inside its group: at thread
    nice 19 the browser's group still weighed as much as the server's whole group. So its group's nice is set too
    (_group_yields; the soaks before and after: benchmarks/results/load-soak-ab-autogroup-2026-11-27.json)."""
    with _keep_priority_lock:       # a process started to keep its priority is recorded before this walk reads /proc
        parents = {}
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        frontier = {os.getpid()}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in _KEEP_PRIORITY}
            for pid in frontier:
                _group_yields(pid)
                try:
                    tasks = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tasks:
                    try:
                        if os.getpriority(os.PRIO_PROCESS, int(tid)) < budget.LOW_PRIORITY_NICE:
                            os.setpriority(os.PRIO_PROCESS, int(tid), budget.LOW_PRIORITY_NICE)
                    except OSError:         # gone, or not ours to change
                        continue


def _group_yields(pid: int) -> None:
    """The scheduler group (autogroup) of `pid`'s session at budget.LOW_PRIORITY_NICE where it is another session's
    than this server's (an unprivileged process may raise a group's nice, never lower it); a no-op where the kernel
    has no autogroups or the group is this server's own."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            group = f.read().split()
        if os.getsid(pid) == os.getsid(0) or int(group[-1]) >= budget.LOW_PRIORITY_NICE:
            return
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(budget.LOW_PRIORITY_NICE))
    except (OSError, ValueError, IndexError):      # no autogroups, gone, or not ours to change
        return


def check_aspect(aspect) -> None:
    if not isinstance(aspect, str) or aspect not in ASPECTS:
        raise ValidationError("aspect", aspect, ", ".join(ASPECTS))


def slide_figure(fig: go.Figure, aspect: str = "16:9") -> go.Figure:
    """The lecture theme at the slide's size, every tick label at least MIN_TICK_PX."""
    check_aspect(aspect)
    fig = lecture_theme(fig)
    size = ASPECTS[aspect]
    if size is not None:
        fig.update_layout(width=size[0], height=size[1])
    for key in list(fig.layout.to_plotly_json()):
        if key.startswith(("xaxis", "yaxis")):
            axis = fig.layout[key]
            axis.tickfont.size = max(axis.tickfont.size or 0, MIN_TICK_PX)
    if fig.layout.legend.font.size is not None:             # a legend sized for the page: slide size too
        fig.layout.legend.font.size = max(fig.layout.legend.font.size, MIN_TICK_PX)
    for trace in fig.data:
        if getattr(trace, "colorbar", None) is not None and trace.type == "heatmap":
            trace.colorbar.tickfont.size = max(trace.colorbar.tickfont.size or 0, MIN_TICK_PX)
    return fig


# Rendered files by what they render: the figure's JSON (its digest), the format, the scale and the slide; and
# whole lecture packs by their settings and slide. A class exporting the lecture's figure, or downloading one
# preset's pack, renders each file once. Both counted in explorer.budget.MEMORY with the drawn views, so memory
# pressure drops them first-come. EXPORTED: which file an export of (settings, figure, format, slide) was, so
# admission can tell a kept one from a render (server.lanes.renders_of_export: a kept file takes no render share).
RENDERED = budget.ByteCache()
PACKS = budget.ByteCache()
EXPORTED: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
EXPORTED_KEPT = 4096                # entries (a few hundred bytes each)
_exported_lock = threading.Lock()


def figure_bytes(fig: go.Figure, fmt: str, scale: float = 3, aspect: str = "16:9") -> bytes:
    """`fig` as a slide (slide_figure) rendered to PNG (at `scale`) or SVG by the export browser; the same figure
    rendered again is the same file, kept in RENDERED."""
    return _rendered(fig, fmt, scale, aspect)[1]


def figure_digest(fig: go.Figure) -> str:
    """What RENDERED knows a figure by: the digest of its JSON."""
    return hashlib.sha256(fig.to_json().encode()).hexdigest()


def _rendered(fig: go.Figure, fmt: str, scale: float, aspect: str, digest: str | None = None) -> tuple[tuple, bytes]:
    """(RENDERED's key for the file, the file); `digest`: figure_digest(fig) where the caller has it."""
    check_format(fmt)
    check_aspect(aspect)
    if not _browser_found():
        raise ValueError("export: PNG/SVG export renders through kaleido, which needs a Chromium browser and "
                         "found none; install Debian's `chromium` (packages.txt does this on Spaces)")
    scale = scale if fmt == "png" else 1
    key = (digest or figure_digest(fig), fmt, float(scale), aspect)
    return key, RENDERED.get(key, lambda: _render(fig, fmt, scale, aspect))


def is_kept(s: Settings, name: str, fmt: str, aspect: str = "16:9") -> bool:
    """Whether export_figure(s, name, fmt, aspect=aspect) would return a kept file, rendering nothing."""
    with _exported_lock:
        key = EXPORTED.get((s, name, fmt, aspect))
    return key is not None and key in RENDERED.entries


def pack_is_kept(s: Settings, aspect: str = "16:9") -> bool:
    """Whether lecture_pack(s, aspect=aspect) would return a kept pack, drawing and rendering nothing."""
    return (s, aspect) in PACKS.entries


def _render(fig: go.Figure, fmt: str, scale: float, aspect: str) -> bytes:
    fig = slide_figure(fig, aspect)
    width = OWN_WIDTH if fig.layout.width is None else fig.layout.width
    with _renderer():
        _browser_yields()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)    # "kopts ignored if using a server": expected
                return fig.to_image(format=fmt, scale=scale, width=width, height=fig.layout.height or 600)
        finally:
            _browser_yields()           # the browser (started by the first render) and renderers it added


def check_format(fmt) -> None:
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValidationError("format", fmt, ", ".join(FORMATS))


# Exports without an out_dir go to one folder per export under one root per process; making a new
# one removes all but the newest KEEP_EXPORTS. The app returns each file to Gradio, which copies it
# into its own cache (emptied by delete_cache) before the next export starts — exports run one at a
# time — so a few folders are always enough, and the disk holds a few exports, not every one.
KEEP_EXPORTS = 4
_export_lock = threading.Lock()
_export_count = itertools.count()


def export_root() -> Path:
    return Path(tempfile.gettempdir()) / f"explorer-exports-{os.getpid()}"


def new_export_folder() -> Path:
    root = export_root()
    with _export_lock:
        if not root.is_dir():
            root.mkdir()
            atexit.register(shutil.rmtree, root, True)
        older = sorted(root.iterdir())              # named by a counter: oldest first
        for folder in older[:max(0, len(older) - KEEP_EXPORTS + 1)]:
            shutil.rmtree(folder, ignore_errors=True)
        return Path(tempfile.mkdtemp(dir=root, prefix=f"{next(_export_count):012d}-"))


def export_figure(s: Settings, name: str, fmt: str, out_dir: str | None = None, aspect: str = "16:9") -> str:
    """One figure as PNG or SVG, named for what it shows (file_stem)."""
    check_format(fmt)                   # before the figure's forward runs
    check_aspect(aspect)
    key, data = _rendered(figure(s, name), fmt, 3, aspect)
    with _exported_lock:
        EXPORTED[(s, name, fmt, aspect)] = key
        EXPORTED.move_to_end((s, name, fmt, aspect))
        while len(EXPORTED) > EXPORTED_KEPT:
            EXPORTED.popitem(last=False)
    out = Path(out_dir) if out_dir else new_export_folder()
    path = out / f"{file_stem(s, name)}.{fmt}"
    path.write_bytes(data)
    return str(path)


def lesson_steps() -> list[tuple[int, Step, go.Figure | None, str]]:
    """Every lesson step with its own figure drawn at the step's settings (explorer.lesson), or None and why
    not (its model does not fit this device): [(index, step, figure, why)] in lesson order."""
    out = []
    for i, st in enumerate(LESSON):
        try:
            out.append((i, st, as_drawn(st.draw()), ""))
        except ValidationError as e:
            out.append((i, st, None, f"not drawn on this device: {e}"))
        except Exception as e:  # noqa: BLE001 — one step's failure must not cost the class the pack
            log.exception("lecture pack: lesson step %s failed", st.title)
            out.append((i, st, None, f"{FAILED} ({type(e).__name__}; logged on the server)"))
    return out


def lesson_html(s: Settings, figs: dict[str, tuple[go.Figure, str]], left_out: dict[str, str],
                steps: list | None = None) -> str:
    """One self-contained page: the lesson — both stories in order, each step's title and claim over the
    figure that shows it (lesson_steps) — then every figure at the pack's settings under its caption, and
    what was left out. plotly.js inlined, every figure interactive (hover, zoom); no network, no server."""
    from plotly.offline import get_plotlyjs
    plotly_js = get_plotlyjs()
    scripts, left_out = [], dict(left_out)
    room = LESSON_MAX_BYTES - len(plotly_js) - LESSON_PAGE_BYTES

    def figure_div(key: str, fig: go.Figure) -> tuple[str, str]:
        """(the figure's place on the page, '') or ('', why it is left out)."""
        nonlocal room
        spec = lecture_theme(fig).to_json()
        if len(spec) > room:            # the page stays under LESSON_MAX_BYTES: this one is in figures/ only
            return "", (f"left out of lesson.html: its {len(spec) / 2**20:.1f} MB of data would take the page past "
                        f"{LESSON_MAX_BYTES >> 20} MB")
        room -= len(spec)
        scripts.append(f"Plotly.newPlot('{key}', ...(s => [s.data, s.layout])({spec}), "
                       "{responsive: true, displaylogo: false});")
        return f'<div class="figure" id="{key}"></div>', ""

    lesson, story = [], None
    for i, st, fig, why in steps if steps is not None else lesson_steps():
        if st.story != story:
            story = st.story
            lesson.append(f'<h2 class="story">{html.escape(STORIES[story])}</h2>')
        div, why = figure_div(f"step-fig-{i}", fig) if fig is not None else ("", why)
        shown = div or f'<p class="missing">{html.escape(why)}</p>'
        lesson.append(f'<section class="step" id="step-{i + 1}"><h3>Step {i + 1} · {html.escape(st.title)}</h3>'
                      f'<p class="claim">{html.escape(st.claim)}</p>{shown}<p class="link">In the app: '
                      f'<code>{html.escape(st.link(i))}</code></p></section>')
    every = []
    for name, (fig, text) in figs.items():
        div, why = figure_div(f"fig-{name}", fig)
        if why:
            left_out[name] = why + " (the PNG, SVG and NPZ are in the pack)"
            continue
        every.append(f'<section class="every" id="{html.escape(name)}"><h3>{html.escape(FIGURES[name].title)}</h3>'
                     f'<p>{html.escape(text)}</p>{div}</section>')
    missing = "".join(f"<li><b>{html.escape(FIGURES[n].title if n in FIGURES else n)}</b>: {html.escape(why)}</li>"
                      for n, why in left_out.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Attention explorer — the lesson</title>
<style>body{{font-family:DejaVu Sans,Arial,sans-serif;max-width:1500px;margin:2em auto;padding:0 1em;color:#222}}
section{{margin:0 0 3em}} .figure{{width:100%}} code{{background:#f2f2f2;padding:0 .2em}}
.claim{{font-size:1.25em;font-weight:600}} .story{{border-bottom:2px solid #0072B2;color:#0072B2}}
.link{{color:#555}} .missing{{color:#B34700}}</style>
<script>{plotly_js}</script></head><body>
<h1>Attention explorer — the lesson</h1>
<p>Two stories, step by step: each step's claim over the figure that shows it, drawn from the model's (or the
mask's) own outputs at the step's settings; the link under each opens the step in the app. Then every figure at
this pack's settings, <code>?{html.escape(to_query(s))}</code>. Hover for values, drag to zoom, double-click to
reset; the page needs no network, and the numbers drawn are in the pack's <code>data/</code> folder.</p>
{"".join(lesson)}
<h2 class="story">Every figure at these settings</h2>
{"".join(every)}
{f"<section id='left-out'><h2>Left out at this preset</h2><ul>{missing}</ul></section>" if missing else ""}
<script>{"".join(scripts)}</script></body></html>
"""


def lecture_pack(s: Settings, out_dir: str | None = None, aspect: str = "16:9") -> str:
    """A zip: every figure that can be drawn here as PNG, SVG and NPZ (the numbers drawn), named for
    what it shows; captions.md (with what was left out and why), config.json and lesson.html. The same
    settings and slide again are the same pack (PACKS), unless a figure failed (an internal error: drawn again).
    Once its requester has gone it stops between figures and renders (budget.Abandoned), keeping nothing."""
    check_aspect(aspect)
    data, _ = PACKS.get((s, aspect), lambda: _pack(s, aspect), keep=lambda made: made[1])
    out = Path(out_dir) if out_dir else new_export_folder()
    path = out / f"lecture-pack-{s.preset}.zip"
    path.write_bytes(data)
    return str(path)


def _pack(s: Settings, aspect: str) -> tuple[bytes, bool]:
    """(the pack's zip, whether every figure and lesson step it left out was left out by a rule, none by a failure)."""
    figs, left_out = all_figures(s)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        captions = [f"# Attention explorer — lecture pack\n\nConfiguration: `?{to_query(s)}`\n"]
        for name, (fig, text) in figs.items():
            stem = file_stem(s, name)
            digest = figure_digest(fig)                 # its JSON written once for every format
            for f in FORMATS:
                budget.check_wanted()
                z.writestr(f"figures/{stem}.{f}", _rendered(fig, f, 3, aspect, digest)[1])
            z.writestr(f"data/{stem}.npz", npz_bytes(fig))
            captions.append(f"- **{FIGURES[name].title}** (`figures/{stem}.png`, numbers in `data/{stem}.npz`): {text}")
        if left_out:
            captions.append("\n## Left out at this preset\n")
            captions += [f"- **{name}**: {why}" for name, why in left_out.items()]
        z.writestr("config.json", json.dumps({"settings": all_values(s), "query": to_query(s),
                                              "left_out": left_out}, indent=2))
        z.writestr("captions.md", "\n".join(captions) + "\n")
        steps = lesson_steps()
        z.writestr("lesson.html", lesson_html(s, figs, left_out, steps))
    failed = [why for why in (*left_out.values(), *(why for *_, why in steps)) if why and why.startswith(FAILED)]
    return buf.getvalue(), not failed
