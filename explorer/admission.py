"""Who a visitor is, and how much of the server one visitor may hold: the lanes requests queue in,
their admission (checked when a request is pushed, before it waits), and per-visitor byte and rate
shares (uploads). Plain Python: handlers.py hands in the request objects and Gradio's queue.

A visitor is keyed on what the client cannot mint: an HF-signed-in user where present, else the
client address as the proxy in front forwards it (the address it appends to X-Forwarded-For, not the
entries the client sent), else the peer address. Session hashes (chosen by the client) only tell
apart the tabs of one visitor.
"""
from __future__ import annotations

import collections
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from .settings import ValidationError

# --- who is asking ----------------------------------------------------------------------------

# Proxies in front of the server that append the address they received from to X-Forwarded-For.
# A Hugging Face Space sits behind one (its ingress); a local run behind none.
TRUSTED_PROXIES_ENV = "EXPLORER_TRUSTED_PROXIES"


def trusted_proxies() -> int:
    """How many X-Forwarded-For entries, from the right, the server's own proxies wrote (env
    EXPLORER_TRUSTED_PROXIES; default 1 on a Space, where SPACE_ID is set, else 0)."""
    raw = os.environ.get(TRUSTED_PROXIES_ENV, "")
    if not raw.strip():
        return 1 if os.environ.get("SPACE_ID") else 0
    if not raw.strip().isdigit() or int(raw) > 8:
        raise ValidationError(TRUSTED_PROXIES_ENV, raw, "an integer in [0, 8]")
    return int(raw)


def client_address(headers: Mapping[str, str], peer: Optional[str], hops: int) -> str:
    """The address the outermost trusted proxy received the request from: the `hops`-th entry of
    X-Forwarded-For from the right (each trusted proxy appends one; what is left of them the client
    wrote and can make up). With no trusted proxy, or a header too short to have passed them, the
    peer address of the connection."""
    if hops > 0:
        forwarded = [a.strip() for a in (headers.get("x-forwarded-for") or "").split(",") if a.strip()]
        if len(forwarded) >= hops:
            return forwarded[-hops]
    return peer or "unknown"


def visitor_key(headers: Mapping[str, str], peer: Optional[str], username: Optional[str] = None,
                hops: Optional[int] = None) -> str:
    """'user:<name>' for a signed-in visitor, else 'addr:<client address>'."""
    if username:
        return f"user:{username}"
    return f"addr:{client_address(headers, peer, trusted_proxies() if hops is None else hops)}"


def visitor_of(request: Any) -> tuple[str, str]:
    """(visitor key, session hash) of a gr.Request, a Starlette request or a queued Gradio event
    (anything with `headers`, `client`, perhaps `username`, `session_hash` or a `request` holding
    them). No request: an in-process call."""
    if request is None:
        return "local", "local"
    session = getattr(request, "session_hash", None) or "api"
    inner = getattr(request, "request", None)
    if inner is not None and hasattr(inner, "headers"):
        http = inner
    else:
        http = request
    headers = getattr(http, "headers", None) or {}
    client = getattr(http, "client", None)
    peer = getattr(client, "host", None) if client is not None else None
    return visitor_key(headers, peer, getattr(request, "username", None)), session


# --- lanes: how many requests may wait, and how many of them one visitor's ---------------------

@dataclass(frozen=True)
class Lane:
    """A queue of the server: `running` at once, at most `waiting` behind them (all visitors). One
    visitor (a page or API client: a session) may hold at most `per_visitor` of its requests, one
    visitor key (an address or a signed-in user, which may hold many sessions: a class behind one NAT,
    or one client minting session hashes) `per_address`; held = waiting, plus running where
    `count_running`. A request over a bound is refused by name at once instead of filling the
    server's one queue, so one visitor cannot sink the rest."""
    name: str
    what: str            # in messages: "model views"
    running: int
    waiting: int
    per_visitor: int
    per_address: int
    count_running: bool = True


# Forwards at once: 4 on a GPU; on a CPU one per core (each forward runs one torch thread, see
# explorer.runs.configure_threads): more only time-share the cores.
FORWARDS_AT_ONCE = 4 if torch.cuda.is_available() else max(1, min(4, os.cpu_count() or 1))

LANES: dict[str, Lane] = {lane.name: lane for lane in (
    Lane("forward", "model views", running=FORWARDS_AT_ONCE, waiting=48, per_visitor=4, per_address=6),
    # the mask view (no model): one address holds fewer than run at once, so others always find a slot
    Lane("light", "mask views", running=6, waiting=64, per_visitor=2, per_address=3),
    # a new Run replaces the visitor's running sweep, so only waiting ones count
    Lane("timing", "timing sweeps", running=1, waiting=4, per_visitor=1, per_address=1, count_running=False),
    Lane("export", "exports", running=1, waiting=4, per_visitor=1, per_address=2),
)}
# Gradio's own bound on everything queued; above the lanes' sum, so only a flood of the cheap
# unbounded events (control syncs: milliseconds each) could reach it.
QUEUE_MAX = 256


def check_admission(lane: str, waiting: list, visitor: tuple, running: list = ()) -> None:
    """Raise ValidationError("queue", ...) when one more request of `visitor` (key, session) in `lane`
    would pass a bound. `waiting` / `running`: the (key, session) of each request waiting / running
    in the lane now."""
    bound = LANES[lane]
    if len(waiting) >= bound.waiting:
        raise ValidationError("queue", f"{len(waiting)} {bound.what} waiting",
                              f"{bound.waiting} at once; the server is busy, try again in a moment")
    held = [tuple(v) for v in (*waiting, *(running if bound.count_running else ()))]
    state = "waiting or running" if bound.count_running else "waiting"
    mine = sum(1 for v in held if v == tuple(visitor))
    if mine >= bound.per_visitor:
        raise ValidationError("queue", f"{mine} of your {bound.what} {state}",
                              f"{bound.per_visitor} per visitor; wait for one to finish (or Stop it)")
    ours = sum(1 for v in held if v[0] == visitor[0])
    if ours >= bound.per_address:
        raise ValidationError("queue", f"{ours} {bound.what} {state} from your address",
                              f"{bound.per_address} per address; wait for one to finish")


@dataclass
class Ticket:
    lane: str
    visitor: tuple       # (key, session)
    issued: float


class Usage:
    """Seconds of service each visitor key had lately: every request's running time, decayed with a
    half-life of `half_life_s`. The lanes serve first the waiting request whose visitor had least
    (least attained service): a visitor keeping the server busy with heavy requests waits behind
    everyone else's, and still has the server when nobody else wants it."""

    def __init__(self, half_life_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.half_life_s, self.clock = half_life_s, clock
        self.seconds: dict[str, tuple[float, float]] = {}        # key -> (seconds, when)

    def of(self, key: str) -> float:
        seconds, when = self.seconds.get(key, (0.0, 0.0))
        return seconds * 0.5 ** ((self.clock() - when) / self.half_life_s)

    def charge(self, key: str, seconds: float) -> None:
        now = self.clock()
        self.seconds = {k: (v, t) for k, (v, t) in self.seconds.items()       # forget what has decayed away
                        if v * 0.5 ** ((now - t) / self.half_life_s) > 1e-3}
        self.seconds[key] = (self.of(key) + seconds, now)


class Admission:
    """Atomic admission: a request admitted to a lane holds a ticket from its check until it is in
    the lane's queue (`queued`), so checks that run at once count each other and none races past a
    bound. A ticket whose request never reached the queue (refused later, dropped) lapses after
    `ticket_ttl_s`."""

    def __init__(self, ticket_ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.lock = threading.Lock()
        self.tickets: list[Ticket] = []
        self.ticket_ttl_s, self.clock = ticket_ttl_s, clock
        self.rates = {"export": RateShare("export", **EXPORT_SHARE, clock=clock)}
        self.usage = Usage(clock=clock)
        self.queues: list[WatchedQueue] = []

    def served(self, key: str, seconds: float) -> None:
        """A request of visitor `key` ran `seconds`: charged to its usage, and every lane's waiting
        requests put back in order (least usage first)."""
        with self.lock:
            self.usage.charge(key, seconds)
            for queue in self.queues:
                queue.reorder()

    def admit(self, lane: str, visitor: tuple, lane_now: Callable[[], tuple[list, list]], units: int = 1) -> None:
        """Admit one request of `visitor` (key, session) to `lane`, worth `units` of the lane's rate
        share where it has one, or raise ValidationError naming the bound. `lane_now()`: (waiting,
        running), the (key, session) of each request in the lane now."""
        with self.lock:
            now = self.clock()
            self.tickets = [t for t in self.tickets if now - t.issued < self.ticket_ttl_s]
            pending = [t.visitor for t in self.tickets if t.lane == lane]
            waiting, running = lane_now()
            check_admission(lane, list(waiting) + pending, visitor, running)
            if lane in self.rates:
                self.rates[lane].take(visitor[0], units)
            self.tickets.append(Ticket(lane, tuple(visitor), now))

    def entered(self, lane: str, session: Optional[str]) -> None:
        """A request of `session` entered `lane`'s queue (call under self.lock): its ticket is spent."""
        for i, t in enumerate(self.tickets):
            if t.lane == lane and t.visitor[1] == session:
                del self.tickets[i]
                return


class WatchedQueue(list):
    """A lane's queue list (Gradio appends to it and serves its first entry) that tells `admission`
    when a request enters it and keeps its requests in order of their visitor's usage (least first;
    arrival order among equals)."""

    def __init__(self, lane: str, admission: Admission, items=()):
        super().__init__(items)
        self.lane, self.admission, self.arrivals = lane, admission, 0
        admission.queues.append(self)

    def _rank(self, event) -> tuple[int, int]:
        """The visitor's usage less the seconds this request has waited, in whole seconds (within a
        second of each other: arrival order), then arrival. Waiting counts, so a busy visitor's request
        waits at most about its usage behind new arrivals, never for ever."""
        usage = self.admission.usage.of(getattr(event, "_visitor_key", ""))
        waited = self.admission.clock() - getattr(event, "_queued_at", self.admission.clock())
        return math.floor(usage - waited), getattr(event, "_arrival", -1)

    def append(self, event) -> None:
        with self.admission.lock:       # the entry and its ticket's end are one step for every check
            event._visitor_key, event._arrival = visitor_of(event)[0], self.arrivals
            event._queued_at = self.admission.clock()
            self.arrivals += 1
            rank = self._rank(event)
            at = next((i for i, e in enumerate(self) if self._rank(e) > rank), len(self))
            self.insert(at, event)      # one step for Gradio's reader on the event loop
            self.admission.entered(self.lane, getattr(event, "session_hash", None))

    def reorder(self) -> None:
        """Back in order after usage changed (call under the admission lock); a single slice
        assignment, so Gradio's reader never sees the list part-sorted or empty."""
        self[:] = sorted(self, key=self._rank)


# --- the process's memory budget ----------------------------------------------------------------

# Gradio's per-session state (a copy of the page's config; app.py keeps no outputs in it): sessions kept
SESSION_CAPACITY = 2000
SESSION_STATE_BYTES = 32 * 2**10        # one SessionState of this page: 7 KiB with tracemalloc (no deep-link
                                        # config, app.keep_outputs_out_of_session_state), its gr.State values on top
PROCESS_BASE_BYTES = 1_100_000_000      # interpreter, torch, gradio, plotly, the demo models: RSS at start


def memory_budget() -> dict[str, int]:
    """What the server process may hold, part by part (bytes): the ceiling of caches and running
    requests (figures on their way out included, explorer.settings.view_cost), small requests let
    past it, every visitor's uploads, Gradio's session states, and the process itself."""
    from . import runs
    from .settings import memory_ceiling
    parts = {"caches and running requests (EXPLORER_MEMORY_BYTES)": memory_ceiling(),
             "small requests past the ceiling (mask lane)": LANES["light"].running * runs.small_request_bytes(),
             "uploaded weights (every visitor)": runs.MAX_UPLOAD_STORE_BYTES,
             "Gradio session states": SESSION_CAPACITY * SESSION_STATE_BYTES,
             "the process at start": PROCESS_BASE_BYTES}
    return {**parts, "total": sum(parts.values())}


# --- byte and rate shares per visitor ----------------------------------------------------------

class RateShare:
    """Per visitor: at most `max_bytes` units (bytes, unless `unit` says otherwise) within any
    `window_s` and `max_calls` calls in it. `take` raises ValidationError naming `field` when one more
    would pass a share."""

    def __init__(self, field: str, max_bytes: int, max_calls: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic, unit: str = "bytes", what: str = "uploads"):
        self.field, self.max_bytes, self.max_calls, self.window_s, self.clock = field, max_bytes, max_calls, window_s, clock
        self.unit, self.what = unit, what
        self.lock = threading.Lock()
        self.log: dict[str, collections.deque] = {}

    def take(self, visitor: str, nbytes: int) -> None:
        with self.lock:
            now = self.clock()
            for v in list(self.log):                  # forget windows that have passed
                q = self.log[v]
                while q and now - q[0][0] >= self.window_s:
                    q.popleft()
                if not q:
                    del self.log[v]
            q = self.log.setdefault(visitor, collections.deque())
            used = sum(n for _, n in q)
            minutes = f"{self.window_s / 60:.0f} minutes"
            if len(q) >= self.max_calls:
                raise ValidationError(self.field, f"{len(q)} {self.what} in {minutes}",
                                      f"{self.max_calls} per visitor per {minutes}")
            if used + nbytes > self.max_bytes:
                raise ValidationError(self.field, f"{used + nbytes:,} {self.unit} in {minutes}",
                                      f"{self.max_bytes:,} {self.unit} per visitor per {minutes}")
            q.append((now, nbytes))


# Exports render in one headless Chromium (a second process, about a core while it draws): per visitor
# key, figures rendered per window (a lecture pack renders every figure of export.FIGURES). A lecturer
# making slides exports a few dozen; a loop of them would keep the browser busy for everyone.
EXPORT_SHARE = dict(max_bytes=60, max_calls=60, window_s=600.0, unit="figures", what="exports")


# --- the HTTP front door: bodies and raw uploads per visitor ---------------------------------

MAX_JSON_BODY_BYTES = 1 * 2**20         # the page's largest event (every control at once) is ~20 KB
MAX_ERROR_BODY_BYTES = 4096             # a refusal that would echo a visitor's inputs is cut to this
DRAIN_BYTES = 256 * 2**20               # a refused body up to this is read (and dropped) before the answer
UPLOAD_ROUTE_SHARE = dict(max_bytes=400 * 2**20, max_calls=12, window_s=3600.0)   # per visitor, raw upload route


def _json_response(status: int, detail: str) -> tuple[dict, dict]:
    body = json.dumps({"detail": detail}).encode()
    return ({"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body, "more_body": False})


class FrontDoor:
    """ASGI middleware in front of Gradio's app: request bodies over MAX_JSON_BODY_BYTES are refused
    before they are read (the raw upload route instead takes its bytes from the visitor's
    UPLOAD_ROUTE_SHARE), and error answers of the queue are cut to MAX_ERROR_BODY_BYTES (Gradio's
    "didn't receive enough input values" echoes every input it got)."""

    def __init__(self, app, upload_share: Optional[RateShare] = None):
        self.app = app
        self.uploads = upload_share or RateShare("upload", **UPLOAD_ROUTE_SHARE)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            declared = int(headers.get("content-length", "-1"))
        except ValueError:
            declared = -1
        path = scope.get("path", "")
        if path.endswith("/upload"):
            limit = self.uploads.max_bytes
            try:
                if declared < 0:
                    raise ValidationError("upload", "a body without Content-Length", "a declared size")
                peer = (scope.get("client") or (None,))[0]
                self.uploads.take(visitor_key(headers, peer), declared)
            except ValidationError as e:
                return await self._refuse(receive, send, 429 if "uploads in" in str(e) else 413, str(e), declared)
        else:
            limit = MAX_JSON_BODY_BYTES
            if declared > limit:
                return await self._refuse(receive, send, 413, str(ValidationError(
                    "request body", f"{declared:,} bytes", f"at most {limit:,} bytes")), declared)
        seen = 0

        async def bounded_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > max(limit, declared):         # a body longer than it said, or chunked past the bound
                raise ValueError(f"request body: more than {max(limit, declared):,} bytes")
            return message
        send_out = self._cut_errors(send) if path.endswith("/queue/join") else send
        return await self.app(scope, bounded_receive, send_out)

    @staticmethod
    async def _refuse(receive, send, status: int, detail: str, declared: int) -> None:
        """Answer `detail` by name. A body up to DRAIN_BYTES is read and dropped first (held nowhere),
        so the client, still sending, reads the answer instead of a broken pipe."""
        if 0 <= declared <= DRAIN_BYTES:
            seen, more = 0, True
            while more and seen <= DRAIN_BYTES:
                message = await receive()
                seen += len(message.get("body", b""))
                more = message.get("more_body", False) and message["type"] == "http.request"
        start, body = _json_response(status, detail)
        await send(start)
        await send(body)

    @staticmethod
    def _cut_errors(send):
        held = {}

        async def cut(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held["start"], held["body"] = message, b""
                return
            if "start" not in held:
                return await send(message)
            held["body"] += message.get("body", b"")
            if message.get("more_body"):
                return
            body = held["body"]
            if len(body) > MAX_ERROR_BODY_BYTES:
                try:
                    text = str(json.loads(body).get("detail"))
                except (ValueError, AttributeError):
                    text = body.decode("utf-8", "replace")
                start, out = _json_response(held["start"]["status"], text[:MAX_ERROR_BODY_BYTES // 2] + " ... (cut)")
                await send(start)
                return await send(out)
            await send(held["start"])
            await send({"type": "http.response.body", "body": body, "more_body": False})
        return cut
