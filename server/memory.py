"""The process's memory and threads: what it may hold, part by part (memory_budget: the caches' ceiling, Gradio's
session states, the process), and its policy set once at start-up (app.py): torch's threads, the
start-up objects out of the collector's reach, and the idle janitor that shrinks explorer.budget's caches when
no request runs."""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import threading
import time

import torch

from explorer import budget
from explorer.budget import MEMORY
from explorer.limits import memory_ceiling
from explorer.schema import ValidationError

from . import drawing
from .admission import KEPT_MAX_BYTES, LANES

log = logging.getLogger("explorer")


THREADS_ENV = "EXPLORER_THREADS"


def configure_threads() -> int:
    """torch's intra-op threads for the whole process, set once before the server starts (app.py):
    up to four requests run at once, and on a busy 2-core machine a second OpenMP thread per request
    makes forwards wait at barriers (measured: a phoenix-nano probe pass 8 s with 2 threads, 0.36 s
    with 1, other engineers' jobs running). Default 1; EXPLORER_THREADS overrides."""
    raw = os.environ.get(THREADS_ENV, "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= (os.cpu_count() or 1):
        raise ValidationError(THREADS_ENV, raw, f"an integer in [1, {os.cpu_count()}]")
    torch.set_num_threads(n)
    return n


SWITCH_INTERVAL_ENV = "EXPLORER_SWITCH_INTERVAL_MS"
SWITCH_INTERVAL_MS = 1.0


def configure_gil_switch() -> float:
    """How long a thread holding the GIL keeps it while another asks for it (Python's default 5 ms), set once at
    start-up (app.py). Each torch op, socket wait or lock a thread releases it at costs it up to that long to
    take back while another thread runs Python (the event loop, the figures of four other draws): a lecture
    model view of ~10 ms of server CPU spent ~0.65 s in the soak of issue 34. 1 ms hands it over 5x sooner (the
    soaks before and after are in the commit that set it, d2d7d93; the soak of record in the README).
    EXPLORER_SWITCH_INTERVAL_MS overrides (5: Python's)."""
    raw = os.environ.get(SWITCH_INTERVAL_ENV, str(SWITCH_INTERVAL_MS))
    try:
        ms = float(raw)
    except ValueError:
        ms = 0.0
    if not 0.1 <= ms <= 100:
        raise ValidationError(SWITCH_INTERVAL_ENV, raw, "milliseconds in [0.1, 100]")
    sys.setswitchinterval(ms / 1000)
    return ms


ARENAS_ENV = "EXPLORER_MALLOC_ARENAS"
M_ARENA_MAX = -8                    # glibc's mallopt parameter (malloc.h)


def configure_malloc_arenas() -> int:
    """At most this many glibc malloc arenas, set once at start-up before the server's threads run (app.py):
    glibc gives new threads arenas of their own, up to 8 per core, each keeping freed pages until malloc_trim:
    fewer arenas, a lower working RSS under load (what the idle trim leaves is the same; d2d7d93 says how it was
    measured). EXPLORER_MALLOC_ARENAS overrides (0: glibc's default).
    A no-op where libc is not glibc. -> the number set."""
    raw = os.environ.get(ARENAS_ENV, "2")
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if not 0 <= n <= 64:
        raise ValidationError(ARENAS_ENV, raw, "an integer in [0, 64] (0: glibc's default)")
    if n:
        try:
            ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, n)
        except (OSError, AttributeError):
            return 0
    return n


IDLE_TRIM_S = 5.0                   # no request for this long: the caches shrink to IDLE_KEEP_BYTES (10 s let the
                                    # requests still queued when a load stops push the trim past 30 s after it)


IDLE_KEEP_BYTES = 256 * 2**20       # the lecture preset's models and forwards fit many times over


def freeze_startup_objects() -> None:
    """Move everything alive now (the imports, the page: ~424,000 objects) out of the collector's
    reach for good. A full gc.collect holds the GIL throughout — 220 ms here, about a second under
    load, with every request stalled — and the idle trim runs one; after this it scans only what
    requests made since (0 ms after the warm-up forwards). Call once, after the page is built."""
    gc.collect()
    gc.freeze()


def start_idle_trim(period_s: float = 2.0) -> threading.Thread:
    """The server's janitor (app.py starts it once): every `period_s`, MEMORY.trim_if_idle."""
    def loop():
        while True:
            time.sleep(period_s)
            if MEMORY.trim_if_idle(IDLE_TRIM_S, IDLE_KEEP_BYTES):
                log.info("idle: caches trimmed to %d MiB, freed memory returned", MEMORY.cached >> 20)
    thread = threading.Thread(target=loop, name="idle-trim", daemon=True)
    thread.start()
    return thread


# Gradio's per-session state (a copy of the page's config; app.py keeps no outputs in it): sessions kept
SESSION_CAPACITY = 2000
SESSION_STATE_BYTES = 32 * 2**10        # one SessionState of this page: 7 KiB with tracemalloc (no deep-link
                                        # config, app.keep_outputs_out_of_session_state), its gr.State values on top
PROCESS_BASE_BYTES = 1_100_000_000      # interpreter, torch, gradio, plotly, the demo models: RSS at start
DRAWING_PROCESS_BASE_BYTES = 300_000_000    # server.drawing's: interpreter, torch, plotly, explorer (242 MB measured)


def memory_budget() -> dict[str, int]:
    """What the server process may hold, part by part (bytes): the ceiling of caches and running
    requests (figures on their way out included, explorer.views.View.estimate), small requests let
    past it, Gradio's session states, and the process itself (visitors' uploads are on disk, server.uploads:
    a model built from one is in the caches); and, where model views are drawn beside it (server.drawing),
    that process's ceiling and itself."""
    parts = {"caches and running requests (EXPLORER_MEMORY_BYTES)": memory_ceiling(),
             "small requests past the ceiling (mask lane)": LANES["light"].running * budget.small_request_bytes(),
             # pinned while they wait (the cache may let them go meanwhile), each serialised on its way out
             "kept views past the ceiling (kept lane)": (LANES["kept"].waiting + 3 * LANES["kept"].running)
             * KEPT_MAX_BYTES,
             "Gradio session states": SESSION_CAPACITY * SESSION_STATE_BYTES,
             "the process at start": PROCESS_BASE_BYTES}
    if drawing.draw_processes():
        parts["the drawing process: its caches and views (EXPLORER_DRAW_MEMORY_BYTES)"] = drawing.process_memory_bytes()
        parts["the drawing process at start"] = DRAWING_PROCESS_BASE_BYTES
    return {**parts, "total": sum(parts.values())}
