"""The timing tab's events: its controls checked as they change, live sweeps streamed from a worker
thread (one at a time, cancellable) beside the committed GPU run, the empty live figures before a run."""
from __future__ import annotations

import asyncio

import gradio as gr

from explorer import budget, gpu_results, timing
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


@guarded
def timing_step(steps):
    """The next state of a live sweep (run in a worker thread), or None when it is done."""
    with TIMING_RUNS.measuring():
        return next(steps, None)


def timing_outputs(sw: timing.Sweep, req: timing.Request) -> tuple:
    """The live figures, the recorded GPU run beside this run (its own panel) and the notes."""
    g = req.geometry
    status = sw.progress() or sw.stopped or f"Done: {len(sw.measured_lengths)} lengths in {sw.elapsed_s:.1f} s."
    note = [f"**{status}** Measured now on **{sw.device}**, {timing.describe(g, req.geometry_name)}; "
            "5 interleaved repeats per point."]
    note += [timing.work_note(sw, g)] if sw.points else []
    note += [timing.throughput_note(sw)] if sw.points else []
    note += [f"{b}: {why}" for b, why in sw.skipped.items()]
    note.append(timing.recorded_summary())
    flash = gpu_results.flash_figure(gpu_results.gpu_run(), sw, timing.live_shape(g, req.geometry_name))
    return (*timing.sweep_figures(sw, batch=g.B, g=g), flash, "\n\n".join(note))


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
    pool = budget.LOW_PRIORITY if max(req.lengths) > SMALL_SWEEP_MAX_LEN else None
    ends_with_thread = False
    try:
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
            yield await loop.run_in_executor(None, timing_outputs, sw, req)   # figures: off the event loop
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
