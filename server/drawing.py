"""Model views drawn in a process of their own, beside the server's: its interpreter, not the server's, runs their
Python (the forward's ops, the figures' dicts and JSON). The server's one interpreter is what every request queues
for (the event loop, admission, Gradio's queue, the answers' way out); under every mode of the soak its Python was
busy ~0.7 of the time (benchmarks/results/load-soak-send-2026-12-01.json), a third of it drawing.

Which views go there (DRAWING.takes): a drawn view of the forward lane (its estimate at most LARGE_REQUEST_FLOPS:
the heavy lane's stay in the server, on its low-priority threads) with a model the process makes from the settings
alone (preset, demo or random weights: an upload is the server's, for its visitor only), on a CPU (on a GPU and
ZeroGPU the device is the server's). The process draws as many at once as the forward lane runs, with
explorer.views.View.draw as the server would (its own caches under its own ceiling, EXPLORER_DRAW_MEMORY_BYTES;
its idle trim as the server's), and answers the outputs pickled: frozen figures travel as their dicts and JSON
(explorer.figures.Figure.__reduce__), a refusal as the ValidationError it is. The server keeps what comes back in its own DRAWN (the kept lane answers
from it) and its admission, lanes and accounts are as before.

EXPLORER_DRAW_PROCESSES: 1 (the default on a Space) starts the process in the background at the first view it
takes, the server drawing until it is ready; 0 (the default elsewhere) draws in the server. The
process ends after IDLE_EXIT_S without a view (EXPLORER_DRAW_IDLE_S), and its memory with it; where it is starting, has ended or dies,
the view is drawn in the server and the next one starts it again."""
from __future__ import annotations

import itertools
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Optional

from explorer.export import priority_released, start_keeping_priority
from explorer.limits import LARGE_REQUEST_FLOPS, Cost, bytes_from_env, limits_device
from explorer.schema import Settings, ValidationError

log = logging.getLogger("explorer")

PROCESSES_ENV = "EXPLORER_DRAW_PROCESSES"
MEMORY_ENV = "EXPLORER_DRAW_MEMORY_BYTES"
IDLE_ENV = "EXPLORER_DRAW_IDLE_S"
DEFAULT_MEMORY_BYTES = 2**30            # the lecture preset's models, forwards and views many times over
_HEADER = struct.Struct("<Q")
READY = "ready"                         # the process's first message: its imports done, it draws from now on
IDLE_EXIT_S = 10.0                      # no view asked for this long: the process ends (its memory with it) and
                                        # the next view starts it again (the soak measures RSS 30 s after its load)


def draw_processes() -> int:
    """1: model views are drawn in a process beside the server's; 0: in the server (EXPLORER_DRAW_PROCESSES;
    default 1 on a Space, where SPACE_ID is set, else 0)."""
    raw = os.environ.get(PROCESSES_ENV, "")
    if not raw.strip():
        return 1 if os.environ.get("SPACE_ID") else 0
    if raw.strip() not in ("0", "1"):
        raise ValidationError(PROCESSES_ENV, raw, "0 (draw in the server) or 1 (a drawing process beside it)")
    return int(raw)


def process_memory_bytes() -> int:
    """The drawing process's ceiling: its caches and running views (EXPLORER_DRAW_MEMORY_BYTES, as
    EXPLORER_MEMORY_BYTES is the server's)."""
    return bytes_from_env(MEMORY_ENV, DEFAULT_MEMORY_BYTES)


def idle_exit_s() -> float:
    """Seconds without a view after which the process ends (EXPLORER_DRAW_IDLE_S, default IDLE_EXIT_S)."""
    raw = os.environ.get(IDLE_ENV, "")
    try:
        seconds = float(raw) if raw.strip() else IDLE_EXIT_S
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 3600:
        raise ValidationError(IDLE_ENV, raw, "seconds in [0.1, 3600]")
    return seconds


def _send(stream, message) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _receive(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the drawing process has gone")
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError("the drawing process has gone")
    return pickle.loads(body)


class NotDrawnThere(RuntimeError):
    """The drawing process did not draw the view (not started yet, starting, or ended before it answered): the
    server draws it instead."""


class Drawing:
    """The drawing process, as the server sees it: started in the background at the first view it takes (the
    server draws the views asked for until it says it is ready), one pipe each way, a reader thread handing each
    answer to its waiting request; ended by itself when idle."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process: Optional[subprocess.Popen] = None
        self._ready = threading.Event()
        self._waiting: dict[int, Future] = {}
        self._ids = itertools.count()

    def takes(self, view, s: Settings, cost: Optional[Cost]) -> bool:
        """Whether view `view` for `s` (estimated `cost`) is the process's to draw."""
        return (draw_processes() == 1 and view.drawn and view.needs_model and cost is not None
                and cost.flops <= LARGE_REQUEST_FLOPS and 2 * cost.peak_bytes <= process_memory_bytes()
                and not s.weights.startswith("upload:") and limits_device() == "cpu" and not _zero_gpu())

    def draw(self, name: str, s: Settings, cost: Cost) -> tuple:
        """View `name`'s outputs for `s`, drawn in the process; its refusal raised here. NotDrawnThere where the
        process is not ready (it is started) or ended before it answered."""
        future: Future = Future()
        with self._lock:
            if self._process is None:
                self._start()
            if not self._ready.is_set():
                raise NotDrawnThere("the drawing process is starting")
            key = next(self._ids)
            self._waiting[key] = future
            try:
                _send(self._process.stdin, (key, name, s, cost))
            except (OSError, ValueError) as e:
                self._waiting.pop(key, None)
                raise NotDrawnThere(str(e)) from None
        ok, value = future.result()
        if ok:
            return value
        raise value

    def _start(self) -> None:
        env = {**os.environ, "EXPLORER_MEMORY_BYTES": str(process_memory_bytes())}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # at the server's priority: the export browser's lowering (explorer.export) is for renders, not the views.
        # In a session of its own: where Linux shares the CPU by session (autogroup), its drawing threads and the
        # server's event loop were one group, so on a busy core the loop shared the group's part with them; apart,
        # the server's group weighs on the loop's core alone. Three alternated pairs of 45 s all-modes soaks (fewer
        # than the five a claim needs: an indication)
        # (benchmarks/results/load-soak-ab-drawing-session-2026-12-04.json): honest /mask p95 lower and honest
        # requests served higher in every pair (medians 0.60 -> 0.51 s, 3,295 -> 3,726), model views the same
        process = start_keeping_priority(lambda: subprocess.Popen(
            [sys.executable, "-m", "server.drawing_process"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, cwd=root, start_new_session=True))
        self._process, self._ready = process, threading.Event()
        threading.Thread(target=self._read, args=(process,), name="drawing-answers", daemon=True).start()
        log.info("drawing process %d starting", process.pid)

    def _read(self, process: subprocess.Popen) -> None:
        try:
            if _receive(process.stdout) == READY:
                with self._lock:
                    if self._process is process:
                        self._ready.set()
            while True:
                key, ok, value = _receive(process.stdout)
                future = self._waiting.pop(key, None)
                if future is not None:
                    future.set_result((ok, value))
        except Exception as e:                          # noqa: BLE001 — any end of the pipe ends the process's answers
            log.info("drawing process %d ended: %s", process.pid, e)
        with self._lock:
            if self._process is process:
                self._process, self._ready = None, threading.Event()
            gone, self._waiting = self._waiting, {}
        process.kill()
        process.wait()
        priority_released(process.pid)
        for future in gone.values():
            future.set_result((False, NotDrawnThere("the drawing process ended before it answered")))

    def start(self, wait_s: float = 0.0) -> bool:
        """Start the process where it is not running (a view asking starts it too, and is drawn in the server
        meanwhile); wait up to `wait_s` for it to be ready. -> whether it is."""
        with self._lock:
            if self._process is None:
                self._start()
            ready = self._ready
        return ready.wait(wait_s)

    def stop(self) -> None:
        with self._lock:
            process, self._process, self._ready = self._process, None, threading.Event()
        if process is not None:
            process.kill()


def _zero_gpu() -> bool:
    """A ZeroGPU Space (SPACES_ZERO_GPU=true, as the `spaces` package reads it): the device is lent to the
    server's own calls (spaces.GPU), not to another process. A CPU Space has `spaces` installed too."""
    return os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true")


DRAWING = Drawing()


def serve(requests, answers, idle_s: float, at_once: int) -> None:
    """The drawing process: each request (key, view name, settings, cost) drawn on one of `at_once` threads,
    answered (key, ok, outputs or the exception) as each is done; it returns when the server's pipe closes or
    nothing has been asked for `idle_s`."""
    from concurrent.futures import ThreadPoolExecutor
    from explorer.views import VIEWS
    answering, running, last = threading.Lock(), [0], [time.monotonic()]

    def answer(key, name, s, cost) -> None:
        try:
            message = (key, True, VIEWS[name].draw(s, cost))
        except Exception as e:                          # noqa: BLE001 — every refusal or failure goes back as it is
            message = (key, False, e)
        with answering:
            try:
                _send(answers, message)
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                _send(answers, (key, False, RuntimeError(f"the drawing process could not answer: {e}")))
            running[0] -= 1
            last[0] = time.monotonic()

    def idle() -> None:
        while True:
            time.sleep(min(1.0, idle_s / 4))
            with answering:
                if not running[0] and time.monotonic() - last[0] > idle_s:
                    os._exit(0)                         # the server sees its pipe end and starts another when asked

    _send(answers, READY)
    threading.Thread(target=idle, name="idle-exit", daemon=True).start()
    with ThreadPoolExecutor(at_once, thread_name_prefix="draw") as pool:
        while True:
            try:
                request = _receive(requests)
            except EOFError:
                os._exit(0)
            with answering:
                running[0] += 1
                last[0] = time.monotonic()
            pool.submit(answer, *request)
