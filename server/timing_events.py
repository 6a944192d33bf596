"""The timing tab's events: its controls checked as they change, live sweeps streamed from a worker
thread (one at a time, cancellable) beside the committed GPU run, the empty live figures before a run."""
from __future__ import annotations

import asyncio
import collections
import contextlib

import gradio as gr

from explorer import gpu_results, timing
from explorer.limits import device
from explorer.schema import ValidationError
from models.runinfo import device_name

from .guard import as_markdown_text, guarded, session_of, settings_of
from .timing_runs import TIMING_RUNS


@guarded
def timing_request(query: str, lengths: str, backends, geometry: str, dtype: str, request=None):
    """Every timing control checked before anything runs -> (settings, timing.Request)."""
    s = settings_of(query, request, need_model=False)       # attention shapes need no model
    return s, timing.check_request(s, geometry, dtype, lengths, backends)


def timing_outputs(sw: timing.Sweep, req: timing.Request, shared: str = "") -> tuple:
    """The live figures, the recorded GPU run beside this run (its own panel) and the notes; `shared`: a line
    saying whom the measurement answers besides this visitor (server.timing_runs)."""
    g = req.geometry
    status = sw.progress() or sw.stopped or f"Done: {len(sw.measured_lengths)} lengths in {sw.elapsed_s:.1f} s."
    note = [f"**{status}** Measured {sw.measured} on **{sw.device}**, {timing.describe(g, req.geometry_name)}; "
            "5 interleaved repeats per point."]
    note += [shared] if shared else []
    note += [timing.work_note(sw, g)] if sw.points else []
    note += [timing.throughput_note(sw)] if sw.points else []
    note += [f"{b}: {why}" for b, why in sw.skipped.items()]
    note.append(timing.recorded_summary())
    flash = gpu_results.flash_figure(gpu_results.gpu_run(), sw, timing.live_shape(g, req.geometry_name))
    return (*timing.sweep_figures(sw, batch=g.B, g=g), flash, "\n\n".join(note))


# the outputs of the last states drawn, by (state, request, note): the visitors watching one measurement are
# drawn each state once
_DRAWN: collections.OrderedDict = collections.OrderedDict()
_DRAWN_KEPT = 8


async def drawn(sw: timing.Sweep, req: timing.Request, shared: str, tag: tuple) -> tuple:
    """timing_outputs off the event loop, once per state for every watcher of it."""
    key = (tag, req, shared)
    outputs = _DRAWN.get(key)
    if outputs is None or outputs.get_loop() is not asyncio.get_running_loop():
        outputs = _DRAWN[key] = asyncio.get_running_loop().run_in_executor(None, timing_outputs, sw, req, shared)
        while len(_DRAWN) > _DRAWN_KEPT:
            _DRAWN.popitem(last=False)
    return await asyncio.shield(outputs)


async def timing_endpoint(query: str, lengths: str, backends: list, geometry: str = None, dtype: str = None,
                          request: gr.Request = None):
    """Run a live sweep, streaming the figures after each length: the measurement of its key
    (server.timing_runs), shared with every visitor whose Run measures the same, in a worker thread. If this
    event is cancelled (Stop, or a client that cancels its job) it stops watching at once; a measurement that
    nobody watches any more ends within one timed block, and the next starts measuring only after that, so
    "one sweep at a time" holds however many are started, joined and cancelled."""
    s, req = timing_request(query, lengths, backends, geometry or timing.geometries()[0],
                            dtype or timing.dtypes()[0], request)
    lane = getattr(getattr(getattr(request, "request", None), "state", None), "lane", "timing")
    async with contextlib.aclosing(TIMING_RUNS.follow(s, req, session_of(request), lead=lane != "watch")) as states:
        async for sw, shared, tag in states:            # (closed at once when this event is cancelled: it leaves)
            yield await drawn(sw, req, shared, tag)


def stop_timing(request: gr.Request = None):
    """Stop the visitor's sweep -> the line under the controls saying how far it got (a sweep that other
    visitors watch goes on for them)."""
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
    """Checked as the controls change, before Run: the message under the controls says what Run will
    measure (the shapes and dtype chosen), or what is wrong, once, with Run disabled until it is mended."""
    try:
        _, req = timing_request(query, lengths, backends, geometry, dtype, request)
    except gr.Error as e:
        return f"**Cannot run:** {as_markdown_text(e.message)}", gr.update(interactive=False)
    return (f"**Run** measures {as_markdown_text(timing.describe(req.geometry, req.geometry_name))} at T = "
            f"{', '.join(map(str, req.lengths))} on {', '.join(req.backends)}.", gr.update(interactive=True))


TIMING_OUTPUTS = 6          # time, memory, speed-up, error, the recorded GPU run beside the live one, notes


def before_run() -> tuple:
    """The recorded GPU run beside an empty live panel, and the notes: what the page shows before a run."""
    sw = timing.Sweep(device_name(device()))
    return (gpu_results.flash_figure(gpu_results.gpu_run(), sw),
            "Nothing measured on this machine yet: **Run** (R when presenting) times the backends ticked, live, "
            f"for the shapes named under the controls.\n\n{timing.recorded_summary()}")


@guarded
def timing_recorded(query: str, geometry: str, dtype: str, current, request: gr.Request = None):
    """Before a live run: the recorded GPU run beside empty live figures (a drawn live run is kept)."""
    if current is not None:
        return [gr.skip()] * TIMING_OUTPUTS
    s = settings_of(query, request, need_model=False)
    flash, note = before_run()
    return (*timing.timing_view(s, geometry, dtype), flash, note)


def timing_recorded_on_link(tab: str, query: str, geometry: str, dtype: str, current, request: gr.Request = None):
    return (timing_recorded(query, geometry, dtype, current, request) if tab == "timing"
            else [gr.skip()] * TIMING_OUTPUTS)
