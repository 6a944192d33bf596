"""Who a visitor is, and how much of the server one visitor may hold: the lanes requests queue in,
their admission (checked when a request is pushed, before it waits), and per-visitor byte and rate
shares (uploads). Plain Python: server/lanes.py hands in the request objects and Gradio's queue.

A visitor is keyed on what the client cannot mint: an HF-signed-in user where present, else the
client address as the proxy in front forwards it (the address it appends to X-Forwarded-For, not the
entries the client sent), else the peer address. Session hashes (chosen by the client) only tell
apart the tabs of one visitor.
"""
from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from explorer.schema import ValidationError

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


def forwarded_for(headers) -> list[str]:
    """Every X-Forwarded-For entry in the order the hops wrote them, across every header line (RFC 9110: lines
    of one field are one comma-joined list). `headers`: ASGI's [(name, value)] byte pairs, Starlette's
    Headers (their getlist), or a plain mapping of one value per name."""
    if isinstance(headers, (list, tuple)):
        lines = [v.decode("latin-1") for k, v in headers if k.lower() == b"x-forwarded-for"]
    elif hasattr(headers, "getlist"):
        lines = headers.getlist("x-forwarded-for")
    else:
        lines = [headers.get("x-forwarded-for") or ""]
    return [a.strip() for line in lines for a in line.split(",") if a.strip()]


def client_address(headers, peer: Optional[str], hops: int) -> str:
    """The address the outermost trusted proxy received the request from: the `hops`-th entry of
    X-Forwarded-For from the right (each trusted proxy appends one, to the last line or on a line of its own;
    what is left of them the client wrote and can make up). With no trusted proxy, or a header too short to
    have passed them, the peer address of the connection."""
    if hops > 0:
        forwarded = forwarded_for(headers)
        if len(forwarded) >= hops:
            return forwarded[-hops]
    return peer or "unknown"


def visitor_key(headers, peer: Optional[str], username: Optional[str] = None,
                hops: Optional[int] = None) -> str:
    """'user:<name>' for a signed-in visitor, else 'addr:<client address>'. The one function that decides
    who is asking: the queue, the HTTP front door and the upload store all call it."""
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


# Small forwards at once: 4 on a GPU; on a CPU two per core, up to 4 (each runs one torch thread, see
# server.memory.configure_threads). A lecture-size view spends much of its slot on Python (building figures,
# Gradio's postprocessing) waiting for the GIL, so one per core left a core idle: in the soak (30 visitors and
# the attacker on 2 cores), honest model views p95 3.5 s with 2 slots, 2.6 s with 4. Heavy views have
# their own lane of one.
FORWARDS_AT_ONCE = 4 if torch.cuda.is_available() else max(1, min(4, 2 * (os.cpu_count() or 1)))

LANES: dict[str, Lane] = {lane.name: lane for lane in (
    Lane("forward", "model views", running=FORWARDS_AT_ONCE, waiting=48, per_visitor=4, per_address=6),
    # views over limits.LARGE_REQUEST_FLOPS (any event that draws one): one at a time, so they never hold the
    # small views' slots
    Lane("heavy", "large views", running=1, waiting=6, per_visitor=1, per_address=2),
    # the mask view (no model): one address holds fewer than run at once, so others always find a slot
    Lane("light", "mask views", running=6, waiting=64, per_visitor=2, per_address=3),
    # the page's own cheap steps that stay queued (a page load's link check, the committed timing curves)
    Lane("control", "page steps", running=4, waiting=32, per_visitor=4, per_address=8),
    # a new Run replaces the visitor's running sweep, so only waiting ones count
    Lane("timing", "timing sweeps", running=1, waiting=16, per_visitor=1, per_address=1, count_running=False),
    Lane("export", "figure exports", running=1, waiting=4, per_visitor=1, per_address=2),
    # a lecture pack renders every figure: its own slot, so a one-figure export never waits behind one
    Lane("pack", "lecture packs", running=1, waiting=2, per_visitor=1, per_address=1),
    Lane("upload", "weight uploads", running=1, waiting=4, per_visitor=1, per_address=2),
)}
# Gradio's own bound on everything queued; above the lanes' sum, so no lane's refusals are pre-empted by
# Gradio's "Queue is full" (which names no field).
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
    request: Any = None  # the HTTP request that pushed it (the queued event carries the same one)


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
        self.rates = {"export": RateShare("export", **EXPORT_SHARE, clock=clock),
                      "work": RateShare("work", **WORK_SHARE, clock=clock)}
        self.usage = Usage(clock=clock)
        self.queues: dict[str, WatchedQueue] = {}

    def served(self, key: str, seconds: float) -> None:
        """A request of visitor `key` ran `seconds`: charged to its usage, and every lane's waiting
        requests put back in order (least usage first)."""
        with self.lock:
            self.usage.charge(key, seconds)
            for queue in self.queues.values():
                queue.reorder()

    def admit(self, lane: str, visitor: tuple, lane_now: Callable[[], tuple[list, list]], units: int = 1,
              flops: float = 0.0, request: Any = None) -> None:
        """Admit one request of `visitor` (key, session) to `lane`, worth `units` of the lane's rate
        share where it has one and `flops` of the visitor's WORK_SHARE, or raise ValidationError naming the
        bound. `lane_now()`: (waiting, running), the (key, session) of each request in the lane now;
        `request`: the HTTP request pushing it, by which its queued event spends the ticket."""
        with self.lock:
            now = self.clock()
            self.tickets = [t for t in self.tickets if now - t.issued < self.ticket_ttl_s]
            pending = [t.visitor for t in self.tickets if t.lane == lane]
            waiting, running = lane_now()
            check_admission(lane, list(waiting) + pending, visitor, running)
            shares = [(self.rates["export"], units)] if lane in ("export", "pack") and units else []
            if flops >= 1e9:
                shares.append((self.rates["work"], round(flops / 1e9)))
            for share in shares:
                share[0].check(visitor[0], share[1])
            for share in shares:                        # every share checked first: a refusal takes none
                share[0].take(visitor[0], share[1])
            self.tickets.append(Ticket(lane, tuple(visitor), now, request))

    def entered(self, lane: str, session: Optional[str], request: Any = None) -> None:
        """A request entered `lane`'s queue (call under self.lock): its ticket is spent — the one its HTTP
        request took (an API call without a session hash gets one only once queued), else one of `session`."""
        same = [i for i, t in enumerate(self.tickets) if t.lane == lane and request is not None and t.request is request]
        same = same or [i for i, t in enumerate(self.tickets) if t.lane == lane and t.visitor[1] == session]
        if same:
            del self.tickets[same[0]]


class WatchedQueue(list):
    """A lane's queue list (Gradio appends to it and serves its first entry) that tells `admission`
    when a request enters it and keeps its requests in order of their visitor's usage (least first;
    arrival order among equals)."""

    def __init__(self, lane: str, admission: Admission, items=()):
        super().__init__(items)
        self.lane, self.admission, self.arrivals = lane, admission, 0
        admission.queues[lane] = self

    def _rank(self, event) -> tuple[int, int]:
        """The visitor's usage less the seconds this request has waited, in whole seconds (within a
        second of each other: arrival order), then arrival. Waiting counts, so a busy visitor's request
        waits at most about its usage behind new arrivals, never for ever."""
        usage = self.admission.usage.of(getattr(event, "_visitor_key", ""))
        waited = self.admission.clock() - getattr(event, "_queued_at", self.admission.clock())
        return math.floor(usage - waited), getattr(event, "_arrival", -1)

    def append(self, event) -> None:
        """Queue `event` here, or in the lane its admission chose (`request.state.lane`: a model view
        estimated heavy waits in the heavy lane, whatever event asked for it)."""
        chosen = getattr(getattr(getattr(event, "request", None), "state", None), "lane", self.lane)
        if chosen != self.lane and chosen in self.admission.queues:
            event.concurrency_id = chosen
            return self.admission.queues[chosen].append(event)
        with self.admission.lock:       # the entry and its ticket's end are one step for every check
            event._visitor_key, event._arrival = visitor_of(event)[0], self.arrivals
            event._queued_at = self.admission.clock()
            self.arrivals += 1
            rank = self._rank(event)
            at = next((i for i, e in enumerate(self) if self._rank(e) > rank), len(self))
            self.insert(at, event)      # one step for Gradio's reader on the event loop
            self.admission.entered(self.lane, getattr(event, "session_hash", None), getattr(event, "request", None))

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
    requests (figures on their way out included, explorer.views.View.estimate), small requests let
    past it, every visitor's uploads, Gradio's session states, and the process itself."""
    from explorer import budget
    from explorer.limits import memory_ceiling

    from . import uploads
    parts = {"caches and running requests (EXPLORER_MEMORY_BYTES)": memory_ceiling(),
             "small requests past the ceiling (mask lane)": LANES["light"].running * budget.small_request_bytes(),
             "uploaded weights (every visitor)": uploads.MAX_UPLOAD_STORE_BYTES,
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

    def check(self, visitor: str, nbytes: int) -> None:
        """Raise as `take` would, taking nothing."""
        with self.lock:
            self._refuse_past(visitor, nbytes, self._window(visitor))

    def take(self, visitor: str, nbytes: int) -> None:
        with self.lock:
            q = self._window(visitor)
            self._refuse_past(visitor, nbytes, q)
            q.append((self.clock(), nbytes))

    def _window(self, visitor: str) -> collections.deque:
        """(call under self.lock) The visitor's calls within the window, older ones forgotten for everyone."""
        now = self.clock()
        for v in list(self.log):
            q = self.log[v]
            while q and now - q[0][0] >= self.window_s:
                q.popleft()
            if not q:
                del self.log[v]
        return self.log.setdefault(visitor, collections.deque())

    def _refuse_past(self, visitor: str, nbytes: int, q: collections.deque) -> None:
        used = sum(n for _, n in q)
        minutes = f"{self.window_s / 60:.0f} minutes"
        if len(q) >= self.max_calls:
            raise ValidationError(self.field, f"{len(q)} {self.what} in {minutes}",
                                  f"{self.max_calls} per visitor per {minutes}")
        if used + nbytes > self.max_bytes:
            raise ValidationError(self.field, f"{used + nbytes:,} {self.unit} in {minutes}",
                                  f"{self.max_bytes:,} {self.unit} per visitor per {minutes}")


# Exports render in one headless Chromium (a second process, about a core while it draws): per visitor
# key, renders per window (a lecture pack renders every figure of export.FIGURES in each format). A lecturer
# making slides renders a few dozen; a loop of them would keep the browser busy for everyone.
EXPORT_SHARE = dict(max_bytes=80, max_calls=80, window_s=600.0, unit="renders", what="exports")
# Model work per visitor key, estimated before a request runs (explorer.limits.view_cost): on average a
# quarter of a free Space's core for one address. A student on phoenix-nano draws ~30 views in 10 minutes
# (26-150 GFLOP each); a loop of the largest the budget admits (~550 GFLOP) gets 5, then waits for the
# window; lecture views (< 1 GFLOP) never count. A class behind one NAT address shares it: raise it there.
WORK_SHARE = dict(max_bytes=3000, max_calls=10**6, window_s=600.0, unit="GFLOP", what="model views")


# --- the HTTP front door: request rates, the page from a cache, bodies and raw uploads per visitor -------

MAX_JSON_BODY_BYTES = 1 * 2**20         # the page's largest event (every control at once) is ~20 KB
MAX_ERROR_BODY_BYTES = 4096             # a refusal that would echo a visitor's inputs is cut to this
DRAIN_BYTES = 256 * 2**20               # a refused body up to this is read (and dropped) before the answer
UPLOAD_ROUTE_SHARE = dict(max_bytes=400 * 2**20, max_calls=12, window_s=3600.0)   # per visitor, raw upload route


class RateLimited(ValidationError):
    """A visitor past a TokenBucket: the message names the rate; `retry_after_s` says when one is free."""

    def __init__(self, bucket: "TokenBucket", retry_after_s: float):
        self.retry_after_s = retry_after_s
        super().__init__("requests", f"more {bucket.what} from your address than the server answers",
                         f"{bucket.burst:.0f} at once, then {bucket.per_s:g} a second; retry in {retry_after_s:.1f} s")


class TokenBucket:
    """Per visitor key: `burst` requests at once, refilled at `per_s` a second. A refusal costs a dictionary
    lookup; keys whose bucket has refilled are forgotten once `max_keys` are held."""

    def __init__(self, what: str, burst: float, per_s: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 50_000):
        self.what, self.burst, self.per_s, self.clock, self.max_keys = what, burst, per_s, clock, max_keys
        self.lock = threading.Lock()
        self.level: dict[str, tuple[float, float]] = {}        # key -> (tokens, when)

    def take(self, key: str) -> None:
        """One request of `key`, or RateLimited naming the rate and when to retry."""
        with self.lock:
            now = self.clock()
            tokens, when = self.level.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - when) * self.per_s)
            if tokens < 1:
                self.level[key] = (tokens, now)
                raise RateLimited(self, (1 - tokens) / self.per_s)
            self.level[key] = (tokens - 1, now)
            if len(self.level) > self.max_keys:
                self.level = {k: (t, w) for k, (t, w) in self.level.items()
                              if t + (now - w) * self.per_s < self.burst}


# Per visitor key (a class behind one NAT address is one key: these leave it room for ~30 pages at once).
# Events: every POST that runs a function (queue joins, direct calls); pages: the routes that build the page
# or its config (served from PageCache after the first); requests: every HTTP request, assets included.
EVENT_RATE = dict(what="events", burst=120, per_s=20)
PAGE_RATE = dict(what="page loads", burst=90, per_s=1.5)
REQUEST_RATE = dict(what="requests", burst=900, per_s=60)
EVENT_ROUTES = ("/queue/join", "/run/", "/call/", "/api/")
# A request refused for its rate is answered TARPIT_S later (an await: no thread, no CPU): a client looping on
# refusals then asks once a second per connection instead of thousands of times, and spends no CPU of the
# machine it may share with the server. At most TARPIT_AT_ONCE wait; past that, refusals are answered at once.
TARPIT_S = 1.0
TARPIT_AT_ONCE = 512
PAGE_ROUTES = ("/", "/config", "/gradio_api/info", "/gradio_api/openapi.json")
# the headers a page's or config's content depends on (Gradio writes its root URL from them)
PAGE_KEY_HEADERS = (b"host", b"x-forwarded-host", b"x-forwarded-proto")


class PageCache:
    """The answers of PAGE_ROUTES, kept after the first (the page and its config are built from the Blocks,
    which do not change while the server runs: 24 ms and 17 ms each, measured). Keyed by path, query and
    PAGE_KEY_HEADERS; at most `entries`, least recently used first out; only a 200 that sets no cookie."""

    def __init__(self, entries: int = 32):
        self.entries = entries
        self.kept: collections.OrderedDict[tuple, list] = collections.OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def key(scope) -> tuple:
        headers = dict((k.lower(), v) for k, v in scope.get("headers", []) if k.lower() in PAGE_KEY_HEADERS)
        return (scope.get("root_path", ""), scope["path"], scope.get("query_string", b""),
                *(headers.get(h, b"") for h in PAGE_KEY_HEADERS))

    def get(self, key: tuple) -> Optional[list]:
        with self.lock:
            if key in self.kept:
                self.kept.move_to_end(key)
                return self.kept[key]
        return None

    def put(self, key: tuple, messages: list) -> None:
        start = messages[0]
        if start.get("status") != 200 or any(k.lower() == b"set-cookie" for k, _ in start.get("headers", [])):
            return
        with self.lock:
            self.kept[key] = messages
            while len(self.kept) > self.entries:
                self.kept.popitem(last=False)


def _json_response(status: int, detail: str, retry_after: Optional[float] = None) -> tuple[dict, dict]:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    return ({"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": body, "more_body": False})


class FrontDoor:
    """ASGI middleware in front of Gradio's app, the first thing every HTTP request meets: per visitor key
    (visitor_key: the same function the queue asks), every request, every event and every page load counted
    in a TokenBucket and refused past it with 429 before Gradio reads anything; the page and its config served
    from a PageCache; request bodies over MAX_JSON_BODY_BYTES refused before they are read (the raw upload
    route instead takes its bytes from the visitor's UPLOAD_ROUTE_SHARE); error answers of the queue cut to
    MAX_ERROR_BODY_BYTES (Gradio's "didn't receive enough input values" echoes every input it got)."""

    def __init__(self, app, upload_share: Optional[RateShare] = None):
        self.app = app
        self.uploads = upload_share or RateShare("upload", **UPLOAD_ROUTE_SHARE)
        self.requests, self.events, self.pages = (TokenBucket(**REQUEST_RATE), TokenBucket(**EVENT_RATE),
                                                  TokenBucket(**PAGE_RATE))
        self.cache = PageCache()
        self.tarpitted = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope.get("path", ""), scope.get("method")
        visitor = visitor_key(scope.get("headers", []), (scope.get("client") or (None,))[0])
        page = method in ("GET", "HEAD") and path.removeprefix(scope.get("root_path", "")) in PAGE_ROUTES
        try:
            self.requests.take(visitor)
            if page:
                self.pages.take(visitor)
            elif method == "POST" and any(r in path for r in EVENT_ROUTES):
                self.events.take(visitor)
        except RateLimited as e:
            declared = _declared_length(scope) if method == "POST" else -1
            if self.tarpitted < TARPIT_AT_ONCE:
                self.tarpitted += 1
                try:
                    await asyncio.sleep(TARPIT_S)
                finally:
                    self.tarpitted -= 1
            return await self._refuse(receive, send, 429, str(e), declared, e.retry_after_s)
        if page and method == "GET":
            return await self._page(scope, receive, send)
        if method != "POST":
            return await self.app(scope, receive, send)
        declared = _declared_length(scope)
        if path.endswith("/upload"):
            limit = self.uploads.max_bytes
            try:
                if declared < 0:
                    raise ValidationError("upload", "a body without Content-Length", "a declared size")
                self.uploads.take(visitor, declared)
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

    async def _page(self, scope, receive, send) -> None:
        """A page route from the cache, or built once by Gradio and kept."""
        key = self.cache.key(scope)
        kept = self.cache.get(key)
        if kept is None:
            messages = []

            async def keep(message):
                messages.append(message)
                await send(message)
            await self.app(scope, receive, keep)
            if messages and messages[0]["type"] == "http.response.start":
                body = b"".join(m.get("body", b"") for m in messages[1:])
                self.cache.put(key, [messages[0], {"type": "http.response.body", "body": body, "more_body": False}])
            return
        for message in kept:
            await send(message)

    @staticmethod
    async def _refuse(receive, send, status: int, detail: str, declared: int, retry_after=None) -> None:
        """Answer `detail` by name. A body up to DRAIN_BYTES is read and dropped first (held nowhere),
        so the client, still sending, reads the answer instead of a broken pipe."""
        if 0 <= declared <= DRAIN_BYTES:
            seen, more = 0, True
            while more and seen <= DRAIN_BYTES:
                message = await receive()
                seen += len(message.get("body", b""))
                more = message.get("more_body", False) and message["type"] == "http.request"
        start, body = _json_response(status, detail, retry_after)
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


def _declared_length(scope) -> int:
    """The body's declared Content-Length, or -1 (none, or not a number)."""
    for k, v in scope.get("headers", []):
        if k.lower() == b"content-length":
            try:
                return int(v)
            except ValueError:
                return -1
    return -1


# the one admission of this process: every lane, share and visitor count (server.lanes, server.guard)
ADMISSION = Admission()
