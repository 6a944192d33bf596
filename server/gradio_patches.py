"""Where the app meets Gradio's internals: what its session state keeps (no deep-link copy, no output
values), its queue's analytics, its matplotlib probe, a file input that names what it refuses, and its
queue (one charge per event, per-session tables bounded, its loop restarted rather than stopped for good),
the event loop uvicorn serves it on, how long uvicorn keeps an idle connection, and what each request costs
that loop (the login check on it, the root URL worked out once per spelling). tests/test_app.py fails if the
internals these touch move."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import json
import logging
import math
import os
import sys
import time
from collections import OrderedDict
from typing import Optional

import gradio as gr
from gradio.components.plot import PlotData
from gradio.data_classes import FileData
from gradio.utils import LRUCache
from gradio_client.utils import is_file_obj_with_meta
from pydantic import model_validator

from explorer import budget
from explorer.schema import ValidationError

from .admission import QUEUE_MAX
from .backoff import BACKOFF
from .visitors import check_session_hash, scope_visitor_key, visitor_of
from .browsers import BROWSERS, SIGNER, cookie_value

log = logging.getLogger("explorer")


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


class NotAFile(str):
    """What the weights file input holds when it was sent no file it takes: the value sent (as text), and
    what is allowed (`why`), for upload_endpoint's message."""

    def __new__(cls, sent, why: str):
        text = super().__new__(cls, str(sent))
        text.why = why
        return text


def weights_file(**kw) -> gr.File:
    """A file input that answers anything but an uploaded file (e.g. a server-side path string from an
    API client) with "weights file: got ...; allowed: ..." instead of Gradio's generic error."""
    upload = gr.File(**kw)
    upload.data_model = UploadedFile
    preprocess = upload.preprocess

    def uploaded_only(payload):
        # no exception here: the upload lane's admission check preprocesses the inputs too, and an
        # exception there would reach the visitor as a bare HTTP 400; upload_endpoint names the field
        if isinstance(payload, FileData) and not payload.path:
            return NotAFile(payload.orig_name, "a .npz or .safetensors file uploaded through the page or "
                            "gradio_client.handle_file")
        try:
            return preprocess(payload)
        except gr.Error:                # Gradio's own check (a file type outside file_types)
            name = getattr(payload, "orig_name", None) or os.path.basename(str(getattr(payload, "path", "")))
            return NotAFile(name, "a .npz or .safetensors file (never pickle)")
    upload.preprocess = uploaded_only
    return upload


# What Gradio keeps per session: a copy of the page's config (~230 KB, built in ~11 ms on the event
# loop for every new session hash) and, by default, the last value of every output (the figures: 17 MB
# for a heavy mask, 346 MB for a zoomed grid), for 10,000 sessions and an hour after a page closes —
# outside every ceiling of ours, and a client mints a session per call. Both serve only deep links
# (/gradio_api/deep_link), which this app does not offer (the address bar carries the settings), so
# neither is kept, and at most server.memory.SESSION_CAPACITY sessions are (oldest dropped first: its page
# keeps working, the next event of it starts a fresh state).


def keep_outputs_out_of_session_state() -> None:
    """Gradio's SessionState builds a deep-link copy of every component's config when a session
    starts, rebuilds a component's at each update of it, and copies each output's value into it: the copy
    starts empty and stays so, and values go nowhere (the
    one other place, with watch_lanes, that touches Gradio's internals; tests/test_app.py fails if
    they move)."""
    from gradio.state_holder import SessionState
    make = SessionState.__init__
    if getattr(make, "without_deep_link_config", False):
        return

    def init(self, blocks):
        make(self, _NoDeepLinkConfig(blocks))
        # and no component's config rebuilt per update either (a pydantic schema each, 0.3 ms holding the GIL)
        self.blocks_config.config_for_block = _no_config
    init.without_deep_link_config = True
    SessionState.__init__ = init
    SessionState._update_value_in_config = lambda self, key, value: None


def skip_queue_analytics(demo: gr.Blocks) -> None:
    """After every event Gradio's queue rebuilds a pandas summary of the last 10,000 events (8-13 ms
    holding the GIL, measured; 6 % of the server's GIL time in the soak) for its monitoring dashboard,
    which this app does not open. It is never rebuilt, and the queue keeps only the last QUEUE_MAX
    events' records (each names the session it came from). Gradio reads both from its environment
    (GRADIO_ANALYTICS_CACHE_FREQUENCY, GRADIO_ANALYTICS_MAX_EVENTS) when the queue is made; set here
    on the queue itself, so a run with other settings in its environment gets the same server."""
    demo._queue.ANAYLTICS_CACHE_FREQUENCY = sys.maxsize        # (sic) Gradio's spelling
    demo._queue.ANALYTICS_MAX_EVENTS = QUEUE_MAX


# Gradio's queue, left to itself, wakes its event loop for nothing: its reader looks for an event to start every
# 1 ms while none can start (nothing waits, or every waiting lane is full: the whole of a busy spell), and its
# progress sender every 10 ms (this app reports no progress). Each wake-up takes the GIL back from the threads
# drawing views. Here they look every QUEUE_POLL_S and PROGRESS_POLL_S: an event arriving at an idle queue, or
# waiting for a slot of its lane, starts at most QUEUE_POLL_S after it could (5 ms on average). With the status
# below, under every mode of the soak: honest model views p95 7.48 -> 6.02 s, the median of five alternated pairs
# (benchmarks/results/load-soak-ab-poll-2026-11-27.json).
QUEUE_POLL_S, PROGRESS_POLL_S = 0.01, 0.1
# The queue's status (a waiting event's place and estimated wait): Gradio's default ("auto") sends every waiting
# event of a lane a new estimate each time an event of that lane starts, a message per waiting event per start
# (with a class waiting on 4 slots, hundreds a second, each a write on the event loop and a parse in a browser).
# app.py passes this as the queue's status_update_rate: every waiting event's status every QUEUE_STATUS_S.
QUEUE_STATUS_S = 2.0


def poll_less(demo: gr.Blocks) -> None:
    """The queue's reader and progress sender look every QUEUE_POLL_S and PROGRESS_POLL_S instead of 1 ms and
    10 ms (Queue.sleep_when_free, progress_update_sleep_when_free: set when the queue is made, read each time)."""
    demo._queue.sleep_when_free = QUEUE_POLL_S
    demo._queue.progress_update_sleep_when_free = PROGRESS_POLL_S


def stop_abandoned_work(demo: gr.Blocks) -> None:
    """Long work stops between its steps once its requester has gone (explorer.budget.check_wanted asks here):
    Gradio marks a running event not alive when its page's stream closes (Queue.clean_events, on the
    disconnect) but runs its function to the end, answering no one."""
    queue = demo._queue

    def still_wanted() -> bool:
        from gradio.context import LocalContext
        event_id = LocalContext.event_id.get(None)
        for job in list(queue.active_jobs) if event_id is not None else ():
            for event in job or ():
                if event._id == event_id:
                    return event.alive
        return True             # a direct call, or an event Gradio no longer holds as running
    budget.answer_wanted(still_wanted)


# The components whose preprocess and postprocess are pure and take microseconds on what this app passes them
# (a str, a number, a choice, a markdown table, a figure whose JSON is written already). Gradio runs each in a worker
# thread, one round trip per input and output: seven for an /attention call (its admission's process_api and its
# own), each a wake-up of a worker, a hand-back to the event loop, and two waits for the GIL under load.
INLINE_PROCESSING = (gr.Textbox, gr.Number, gr.Radio, gr.Dropdown, gr.CheckboxGroup, gr.Markdown, gr.HTML,
                     gr.Button, gr.State, gr.Plot)


def _cheap(fn, args) -> bool:
    """Whether `fn(*args)` is one of INLINE_PROCESSING's pre- or postprocessing (a gr.Plot's only where its
    figure's JSON is written: explorer.figures.Figure.freeze; else plotly writes it, milliseconds)."""
    owner, name = getattr(fn, "__self__", None), getattr(fn, "__name__", None)
    if name not in ("preprocess", "postprocess") or not isinstance(owner, INLINE_PROCESSING):
        return False
    if isinstance(owner, gr.Plot) and name == "postprocess" and args and args[0] is not None:
        value = args[0]
        return isinstance(value, PlotData) or getattr(value, "__dict__", {}).get("_frozen_json") is not None
    return True


class _InlineAnyio:
    """gradio.blocks' `anyio`, whose to_thread.run_sync runs _cheap work where it is asked, on the event loop;
    everything else is anyio's own. An event's function stays in a thread even where it only answers a kept view
    (milliseconds of parsing): on the loop that was worse, honest model views p95 3.89 -> 5.08 s in every pair
    (benchmarks/results/load-soak-ab-kept-inline-2026-12-01.json)."""

    def __init__(self, anyio):
        self._anyio = anyio
        self.to_thread = self

    async def run_sync(self, fn, *args, **kwargs):
        if _cheap(fn, args):
            return fn(*args)
        return await self._anyio.to_thread.run_sync(fn, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._anyio, name)


def process_cheap_components_inline() -> None:
    """Gradio's pre- and postprocessing of INLINE_PROCESSING's components runs on the event loop instead of a
    worker thread (gradio.blocks calls anyio.to_thread.run_sync for each input and output, and for the function)."""
    import gradio.blocks as gradio_blocks
    if not isinstance(gradio_blocks.anyio, _InlineAnyio):
        gradio_blocks.anyio = _InlineAnyio(gradio_blocks.anyio)


def check_logins_on_the_loop() -> None:
    """Gradio's login check (`login_check`: a dependency of the queue's join and stream routes, the upload route
    and every file and config route) is a plain function, which FastAPI hands to a worker thread at every request
    (fastapi.dependencies.utils.solve_dependencies): a wake-up of a worker, two waits for the GIL and one more
    turn of the event loop for the answer to come back, before the request is read on. A join and its stream
    pay it twice. It only compares the visitor's user (an async dependency solved before it) with the app's
    auth settings, so here it is called on the loop: every route's Dependant that names it calls an async
    function that calls it (FastAPI's own dependency_overrides would rebuild the dependency at every request).
    Applied to each app Gradio creates from then on (gradio.routes.App.create_app)."""
    import gradio.routes as routes
    create = routes.App.create_app
    if getattr(create, "checks_logins_on_the_loop", False):
        return

    def create_app(*args, **kwargs):
        app = create(*args, **kwargs)
        on_the_loop = {}

        def moved(check):
            if getattr(check, "__name__", None) != "login_check" or inspect.iscoroutinefunction(check):
                return check
            return on_the_loop.setdefault(check, _on_the_loop(check))
        for route in _routes(app.router.routes):
            if isinstance(getattr(route, "dependencies", None), list):      # what an included router builds from
                route.dependencies = [dataclasses.replace(d, dependency=moved(d.dependency)) for d in route.dependencies]
            for sub in getattr(getattr(route, "dependant", None), "dependencies", ()):     # what a route solves
                sub.call = moved(sub.call)
        return app
    create_app.checks_logins_on_the_loop = True
    routes.App.create_app = staticmethod(create_app)


def _routes(routes):
    """Every route, in included routers too (FastAPI builds an included route's own copy when first asked)."""
    for route in routes:
        yield route
        inner = getattr(route, "original_router", None)
        yield from _routes(getattr(inner, "routes", ()))
        yield from _routes(getattr(route, "_effective_candidates", ()))


def _on_the_loop(check):
    """`check` (a plain function) as a coroutine function of the same signature, which FastAPI awaits in place."""
    async def login_check(**values):
        return check(**values)
    login_check.__signature__ = inspect.signature(check)
    return login_check


# The request parts Gradio's root URL is made of (gradio.route_utils.get_root_url, get_request_origin: the URL
# starlette builds from the scope, and these headers); ROOT_URLS: how many answers are kept.
ROOT_URL_SCOPE = ("scheme", "server", "root_path", "app_root_path", "path", "query_string")
ROOT_URL_HEADERS = (b"host", b"x-forwarded-host", b"x-gradio-server", b"x-forwarded-proto")
ROOT_URLS = 256


def remember_root_urls() -> None:
    """Gradio works out the page's root URL (gradio.route_utils.get_root_url: the request's URL built and parsed
    twice by httpx) at every join and again as each event starts: 4 % of the event loop's time under every mode of
    the soak (py-spy). Its answer depends only on ROOT_URL_SCOPE, ROOT_URL_HEADERS and its arguments, so it is
    kept for the last ROOT_URLS of those (hosts a stranger makes up push out only each other's)."""
    from gradio import route_utils
    compute = route_utils.get_root_url
    if getattr(compute, "remembered", False):
        return
    kept = LRUCache(ROOT_URLS)

    def get_root_url(request, route_path: str, root_path):
        scope = request.scope
        key = (tuple(scope.get(k) for k in ROOT_URL_SCOPE),
               tuple((k, v) for k, v in scope.get("headers", ()) if k in ROOT_URL_HEADERS), route_path, root_path)
        try:
            kept.move_to_end(key)
            return kept[key]
        except KeyError:
            kept[key] = url = compute(request=request, route_path=route_path, root_path=root_path)
            return url
        except TypeError:                       # a part that cannot be a key: worked out every time
            return compute(request=request, route_path=route_path, root_path=root_path)
    get_root_url.remembered, get_root_url.__wrapped_compute__, get_root_url.kept_size = True, compute, kept.__len__
    route_utils.get_root_url = get_root_url


def asyncio_event_loop() -> None:
    """uvicorn, as Gradio launches it, runs asyncio's own event loop even where uvloop is installed (its "auto"
    loop takes uvloop when it can: uvicorn[standard], some Space images). libuv accepts one connection per turn of
    its loop (libuv#3696), and under every mode of the soak a turn took ~35 ms: the accept queue held 20-30
    connections (ss) and a new one waited 0.5 s (p50) before the server read it. asyncio accepts every waiting
    connection at each turn. Five alternated pairs of all-modes soaks (benchmarks/results/load-soak-ab-loop-2026-11-28.json):
    honest model views p95 4.03 -> 3.56 s, classroom 3.03 -> 2.76 s, a class's page loads 2.82 -> 1.97 s (p50),
    /mask p95 the same (1.73 -> 1.70 s)."""
    import uvicorn.config
    uvicorn.config.LOOP_FACTORIES["auto"] = uvicorn.config.LOOP_FACTORIES["asyncio"]


KEEP_ALIVE_S = 75.0


def keep_connections_alive() -> None:
    """uvicorn, as Gradio starts it, closes a kept-alive connection 5 s after its last answer. A client that
    checked the connection was open and then sent on it as the close went out (a browser, a proxy's pool of
    upstream connections, a soak client held up by its box) gets no answer: "Server disconnected without sending
    a response". A browser resends such a request; a proxy answers 502 where it resends nothing (a POST), and
    the visitor sees an error. An idle connection is kept KEEP_ALIVE_S here, longer than the 60 s the common
    proxies keep theirs (nginx's upstream keepalive_timeout, AWS's load balancers), so the server is never the
    side that closes one its client may be reusing. It holds nothing a stranger could not hold anyway: uvicorn
    keeps a connection that sends no request open without end."""
    from gradio import http_server
    init = http_server.Server.__init__
    if getattr(init, "keeps_alive", False):
        return

    def __init__(self, config, *args, **kwargs):
        config.timeout_keep_alive = max(config.timeout_keep_alive, KEEP_ALIVE_S)
        init(self, config, *args, **kwargs)
    __init__.keeps_alive = True
    http_server.Server.__init__ = __init__


def resolve_annotations(demo: gr.Blocks) -> None:
    """Gradio reads the type hints of an event's function (and of its admission check) at every call, to find
    a gr.Request parameter: typing.get_type_hints compiles each annotation written as a string (this codebase's
    `from __future__ import annotations`) anew, on the event loop. Each function's annotations are evaluated
    once here, to what get_type_hints gives, so every later call reads them as they are."""
    import typing
    for block_fn in demo.fns.values():
        for fn in (block_fn.fn, getattr(block_fn, "validator", None)):
            if fn is None or not callable(fn):
                continue
            target = fn if hasattr(fn, "__code__") or hasattr(fn, "__func__") else getattr(fn, "__call__", None)
            target = getattr(target, "__func__", target)
            if not isinstance(getattr(target, "__annotations__", None), dict):
                continue
            try:
                target.__annotations__ = typing.get_type_hints(target)
            except (NameError, TypeError):      # Gradio reads these as no hints at all; so do we
                continue


def skip_absent_matplotlib() -> None:
    """Gradio tries `import matplotlib` on entering and leaving every event (to switch its backend).
    Where it is not installed, each try searches sys.path again, on the event loop: marking it absent
    once makes each try a dictionary lookup."""
    import importlib.util
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        sys.modules["matplotlib"] = None


def _no_config(*args, **kwargs) -> dict:
    return {}


SKIP = {"__type__": "update"}       # gr.skip(): the output stays as the page shows it


# the props of an update that Gradio answers as they are (read back off the component it builds for them): a
# control's message under it and its classes (server.endpoints.control_change_on_page marks and clears every
# control on each change)
PLAIN_PROPS = ("info", "elem_classes")


def _plain_update(p) -> bool:
    return isinstance(p, dict) and p.get("__type__") == "update" and len(p) > 1 and set(p) <= {"__type__", *PLAIN_PROPS}


def _as_gradio_answers(update: dict) -> dict:
    """A plain update as Gradio answers it: None props dropped (utils.delete_none), a class name as a list."""
    out = {k: ([v] if k == "elem_classes" and isinstance(v, str) else v)
           for k, v in update.items() if k != "__type__" and v is not None}
    return {**out, "__type__": "update"}


def skip_unchanged_outputs(demo: gr.Blocks) -> None:
    """Gradio answers each gr.skip() of an event's outputs, and each update of a control's message or classes,
    by building the component anew (0.35 ms holding the GIL, measured: 23 ms for a page redraw's 64 outputs,
    most of them skipped, the 38 controls' marks updated). Those are answered as Gradio answers them (`SKIP`,
    _as_gradio_answers) without it; the others are postprocessed by Gradio."""
    import copy
    original = demo.postprocess_data

    async def postprocess_data(block_fn, predictions, state):
        n = len(block_fn.outputs)
        if n > 1 and not block_fn.batch and isinstance(predictions, (list, tuple)) and len(predictions) == n:
            out = [dict(SKIP) if isinstance(p, dict) and p == SKIP else _as_gradio_answers(p) if _plain_update(p)
                   else None for p in predictions]
            kept = [i for i, o in enumerate(out) if o is None]
            if len(kept) < n:
                if kept:
                    part = copy.copy(block_fn)
                    part.outputs = [block_fn.outputs[i] for i in kept]
                    values = [predictions[i] for i in kept]
                    done = await original(part, values if len(kept) > 1 else values[0], state)
                    for i, value in zip(kept, done):
                        out[i] = value
                return out
        return await original(block_fn, predictions, state)
    demo.postprocess_data = postprocess_data


class _NoDeepLinkConfig:
    """The Blocks as SessionState sees them, with no component to build a deep-link config of (it
    builds one for each component also in `blocks.blocks`)."""
    blocks: dict = {}

    def __init__(self, blocks):
        self._blocks = blocks

    def __getattr__(self, name):
        return getattr(self._blocks, name)


# --- the queue: one charge per event, sessions bounded, never stopped for good ------------------------

# A file each queued event is written to as one JSON line when it ends (visitor key, endpoint, lane, and the
# monotonic seconds it was queued, started and ended): where a request's time went, server side. Off unless
# set; the soak sets it (benchmarks/load_test.py: each run's server-side waits and processing, by lane).
EVENT_LOG_ENV = "EXPLORER_EVENT_LOG"


def charge_every_event(demo: gr.Blocks, admission) -> None:
    """Each queued event's running time charged once to its visitor (`admission.served`: the fair queue's
    usage, server.admission.Admission), however many guarded functions it calls: Gradio's
    Queue.process_events runs one event (or batch) from start to end, streams included. With EVENT_LOG_ENV
    set, each event is written to that file as it ends, and from the first event on the loop's lag too
    (watch_the_loop)."""
    queue = demo._queue
    process = queue.process_events
    path = os.environ.get(EVENT_LOG_ENV)
    log_file = open(path, "a", buffering=1) if path else None
    watching = []

    async def process_events(events, batch, begin_time, fn):
        started = time.monotonic()
        if log_file is not None and not watching:          # the first event: the loop is the one serving
            watching.append(asyncio.get_running_loop().create_task(watch_the_loop(log_file)))
        try:
            return await process(events, batch, begin_time, fn)
        finally:
            ended = time.monotonic()
            keys = [visitor_of(event)[0] for event in events]
            for key in set(keys):
                admission.served(key, ended - started)
            if log_file is not None:
                log_file.write("".join(json.dumps(dict(
                    key=key, api=getattr(fn, "api_name", None), lane=event.concurrency_id,
                    queued=getattr(event, "_queued_at", None), started=started, ended=ended)) + "\n"
                    for key, event in zip(keys, events)))
    queue.process_events = process_events


# Every request's time on the server is mostly the event loop's (its join, its stream, its messages): each step
# waits for the loop's turn. LOOP_TICK_S: how often the watcher asks for it; LOOP_WINDOW_S: how often it writes.
LOOP_TICK_S, LOOP_WINDOW_S = 0.01, 1.0


def _thread_schedstat() -> Optional[tuple[float, float]]:
    """This thread's seconds on a CPU and waiting on the run queue for one (Linux /proc/thread-self/schedstat),
    None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return None


async def watch_the_loop(log_file) -> None:
    """How late the event loop comes back to a LOOP_TICK_S sleep (its lag: what every step of a request waits
    for its turn), and how its thread spent the time (on a CPU, runnable but waiting for one, the rest asleep:
    idle or waiting for the GIL), written every LOOP_WINDOW_S to the event log as one line: `since` and `loop`
    its window's beginning and end (monotonic seconds), `window_s`, `lags_s` each tick's lag, `on_cpu_s` and
    `cpu_wait_s` (None off Linux). Runs on the loop itself (its schedstat is the loop thread's) until it ends."""
    begun, before = time.monotonic(), _thread_schedstat()
    lags: list[float] = []
    while True:
        asked = time.perf_counter()
        await asyncio.sleep(LOOP_TICK_S)
        lags.append(max(0.0, time.perf_counter() - asked - LOOP_TICK_S))
        now = time.monotonic()
        if now - begun >= LOOP_WINDOW_S:
            after = _thread_schedstat()
            on_cpu = cpu_wait = None
            if before is not None and after is not None:
                on_cpu, cpu_wait = round(after[0] - before[0], 4), round(after[1] - before[1], 4)
            log_file.write(json.dumps(dict(loop=now, since=begun, window_s=round(now - begun, 4),
                                           lags_s=[round(x, 5) for x in lags], on_cpu_s=on_cpu,
                                           cpu_wait_s=cpu_wait)) + "\n")
            begun, before, lags = now, after, []


class SessionMessages(LRUCache):
    """Gradio's per-session message queues (an LRUCache of 2000 filled at a session's first join), made
    safe: a session with an event queued or running is never dropped for a newer one (Gradio's reader
    raised KeyError for it, which stopped the queue for everyone); the session dropped is the least
    recently used idle one of the visitor key holding most sessions, and its event ids go with it."""

    def __init__(self, queue, capacity: int):
        super().__init__(capacity)
        self.queue = queue
        self.owner: dict[str, str] = {}             # session -> visitor key

    def __setitem__(self, session, messages) -> None:
        if session not in self and len(self) >= self.max_size:
            self.drop_one()
        OrderedDict.__setitem__(self, session, messages)
        self.move_to_end(session)

    def drop_one(self) -> None:
        busy = {event.session_hash for event in list(self.queue.event_ids_to_events.values())}
        idle = [s for s in self if s not in busy] or list(self)
        held = collections.Counter(self.owner.get(s, "") for s in idle)
        heaviest = max(held, key=held.get)
        session = next(s for s in idle if self.owner.get(s, "") == heaviest)
        OrderedDict.__delitem__(self, session)
        self.owner.pop(session, None)
        self.queue.pending_event_ids_session.pop(session, None)

    def __delitem__(self, session) -> None:
        if session in self:                 # Gradio deletes a session whose stream was cancelled, maybe twice
            OrderedDict.__delitem__(self, session)
        self.owner.pop(session, None)


# New session hashes per visitor key (a page load makes one, a gradio_client Client one): a class's arrival
# fits in the burst; a client minting one per call is held to the rate, and its idle sessions go first.
NEW_SESSION_RATE = dict(what="new sessions", burst=200, per_s=1.0)


def bound_sessions(demo: gr.Blocks, capacity: Optional[int] = None) -> None:
    """Every push into Gradio's queue first: the session hash one Gradio's clients could have made
    (server.visitors.check_session_hash), a new one within its visitor's NEW_SESSION_RATE, the page's load
    event noted for the browser cookie it carries (server.browsers); per-session messages in SessionMessages;
    a message for a session already dropped is dropped with it instead of raising in the queue's loop."""
    from .front_door import RateLimited, TokenBucket
    from .memory import SESSION_CAPACITY
    capacity = capacity or SESSION_CAPACITY
    queue = demo._queue
    sessions = queue.pending_messages_per_session = SessionMessages(queue, capacity)
    new_sessions = TokenBucket(**NEW_SESSION_RATE)
    push, send = queue.push, queue.send_message

    async def checked_push(body, request, username):
        session = body.session_hash                 # None from /call/<api>: Gradio makes one per call
        key = scope_visitor_key(request.scope, username)
        try:
            if session is not None:
                check_session_hash(session)
            fn = demo.fns.get(body.fn_index) if isinstance(body.fn_index, int) else None
            if fn is not None and fn.api_name == "load":
                BROWSERS.loaded(key, SIGNER.browser(cookie_value(request.headers)))
            if session not in sessions:
                new_sessions.take(key, math.sqrt(BROWSERS.weight(key)))
        except (ValidationError, RateLimited) as e:
            BACKOFF.refused(key)
            return False, str(e), "error"
        answer = await push(body, request, username)
        if body.session_hash in sessions:
            sessions.owner.setdefault(body.session_hash, key)
        if len(queue.pending_event_ids_session) > capacity + QUEUE_MAX:    # ids of sessions no longer held
            for gone in [s for s in queue.pending_event_ids_session if s not in sessions]:
                queue.pending_event_ids_session.pop(gone, None)
        return answer

    def send_message(event, message):
        if event.session_hash in sessions:
            send(event, message)
    queue.push, queue.send_message = checked_push, send_message


def keep_queue_alive(demo: gr.Blocks) -> None:
    """Gradio's queue loop (Queue.start_processing) sets `stopped` when anything raises in it, and from
    then every event of every visitor is refused ("Queue is stopped") while the page still loads. Its
    loops are restarted instead, each failure logged and counted (`demo._queue.restarts`); only
    Queue.close (the server stopping) ends them."""
    queue = demo._queue
    queue.restarts, queue.closing, queue.loop_alive = 0, False, False
    close, start = queue.close, queue.start

    def resilient(loop, main: bool):
        async def run():
            while True:
                if main:
                    queue.loop_alive = True
                try:
                    await loop()
                except Exception:
                    log.exception("Gradio's queue loop %s failed", loop.__name__)
                if queue.closing:
                    if main:
                        queue.loop_alive = False
                    return
                if main:
                    queue.restarts += 1
                    log.error("Gradio's queue had stopped; restarted (%d restarts)", queue.restarts)
                queue.stopped = False
                await asyncio.sleep(0.05)
        run.__name__ = loop.__name__
        return run
    for name, main in (("start_processing", True), ("start_progress_updates", False), ("notify_clients", False)):
        setattr(queue, name, resilient(getattr(queue, name), main))

    def closing():
        queue.closing = True
        close()

    def starting():
        queue.closing = False
        start()
    queue.close, queue.start = closing, starting


def queue_health(demo: gr.Blocks):
    """For /healthz (server.front_door): () -> (alive, details): the queue's loop running and not stopped,
    its restarts, and what the server holds of its bounded stores."""
    from . import uploads
    from .disk import RAW_UPLOADS, dir_bytes, temp_dir

    def health():
        queue = demo._queue
        alive = not queue.stopped and getattr(queue, "loop_alive", False)
        return alive, {"queue": "running" if alive else "stopped", "restarts": getattr(queue, "restarts", 0),
                       "sessions": len(queue.pending_messages_per_session),
                       "upload_store_bytes": uploads.store_bytes(), "raw_upload_bytes": RAW_UPLOADS.bytes_of(),
                       "temp_dir_bytes": dir_bytes(temp_dir())}
    return health
