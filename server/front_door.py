"""The HTTP front door: ASGI middleware in front of Gradio's app, the first thing every request meets. Per
visitor key (server.visitors.visitor_key: the same function the queue asks) every request, event and page
load is counted in a TokenBucket and refused past it with 429 before Gradio reads anything, at rates that
grow with the browsers established behind the address (server.browsers); the page and its config are served
from a PageCache however their path is spelled, gzipped where the browser takes it; the routes this app never
uses are closed; every page load gets a signed cookie; request bodies are bounded; the raw upload route takes
its bytes from the visitor's share, its network's and the disk's (server.disk); error answers are cut;
/healthz says whether the queue is alive."""
from __future__ import annotations

import asyncio
import collections
import gzip
import json
import math
import threading
import time
from typing import Callable, NamedTuple, Optional
from urllib.parse import parse_qs

from explorer.schema import ValidationError

from .backoff import BACKOFF
from .shares import RateShare
from .visitors import check_session_hash, network_of, scope_visitor_key
from .browsers import BROWSERS, SIGNER, cookie_value, set_cookie_header
from .disk import RAW_UPLOADS, RawUploads

MAX_JSON_BODY_BYTES = 1 * 2**20         # the page's largest event (every control at once) is ~20 KB
MAX_ERROR_BODY_BYTES = 4096             # an error answer that would echo a visitor's inputs is cut to this
DRAIN_BYTES = 256 * 2**20               # a refused body up to this is read (and dropped) before the answer
UPLOAD_ROUTE_SHARE = dict(max_bytes=400 * 2**20, max_calls=12, window_s=3600.0)   # per visitor, raw upload route
# per network (server.visitors.network_of: a /24, an IPv6 /48): a few visitors' worth, so addresses of one
# block cannot each take a visitor's share
NETWORK_UPLOAD_SHARE = dict(max_bytes=800 * 2**20, max_calls=24, window_s=3600.0)


class RateLimited(ValidationError):
    """A visitor past a TokenBucket: the message names the rate; `retry_after_s` says when one is free."""

    def __init__(self, what: str, burst: float, per_s: float, retry_after_s: float):
        self.retry_after_s = retry_after_s
        super().__init__("requests", f"more {what} from your address than the server answers",
                         f"{burst:.0f} at once, then {per_s:g} a second; retry in {retry_after_s:.1f} s")


class TokenBucket:
    """Per visitor key: `burst` requests at once, refilled at `per_s` a second (both times `scale`, a key
    worth several visitors). A refusal costs a dictionary lookup; keys whose bucket has refilled are
    forgotten once `max_keys` are held."""

    def __init__(self, what: str, burst: float, per_s: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 50_000):
        self.what, self.burst, self.per_s, self.clock, self.max_keys = what, burst, per_s, clock, max_keys
        self.lock = threading.Lock()
        self.level: dict[str, tuple[float, float]] = {}        # key -> (tokens, when)

    def take(self, key: str, scale: float = 1.0) -> None:
        """One request of `key`, or RateLimited naming the rate and when to retry."""
        burst, per_s = self.burst * scale, self.per_s * scale
        with self.lock:
            now = self.clock()
            tokens, when = self.level.get(key, (burst, now))
            tokens = min(burst, tokens + (now - when) * per_s)
            if tokens < 1:
                self.level[key] = (tokens, now)
                raise RateLimited(self.what, burst, round(per_s, 2), (1 - tokens) / per_s)
            self.level[key] = (tokens - 1, now)
            if len(self.level) > self.max_keys:
                self.level = {k: (t, w) for k, (t, w) in self.level.items()
                              if t + (now - w) * self.per_s < self.burst}


# Per visitor key, for one visitor: a class's arrival (30 page loads at once, before any browser counts) fits
# in the bursts; its browsers established, an address gets sqrt(browsers) times these (server.browsers).
# Events: every POST that runs a function (queue joins, direct calls); pages: the routes that build the page
# or its config (served from PageCache after the first); requests: every HTTP request, assets included.
EVENT_RATE = dict(what="events", burst=120, per_s=20)
PAGE_RATE = dict(what="page loads", burst=90, per_s=1.5)
REQUEST_RATE = dict(what="requests", burst=900, per_s=60)
EVENT_ROUTES = ("/queue/join", "/run/", "/call/", "/api/")
# A request refused for its rate is answered TARPIT_S later (an await: no thread, no CPU): a client looping on
# refusals then asks once a second per connection instead of thousands of times, and spends no CPU of the
# machine it may share with the server. A visitor refused again and again waits before its next request is
# read (server.backoff). At most TARPIT_AT_ONCE wait; past that, refusals are answered at once.
TARPIT_S = 1.0
TARPIT_AT_ONCE = 512
# The routes that build the page or its config (with or without a trailing slash, any query string): one
# cached copy each. The info route's one parameter is kept; every other query is dropped before Gradio sees it
# (the page offers no deep links), so no spelling of a URL builds another copy.
PAGE_ROUTES = ("/", "/config", "/gradio_api/info", "/gradio_api/openapi.json")
PAGE_QUERY = {"/gradio_api/info": ("all_endpoints",)}
# the headers a page's or config's content depends on (Gradio writes its root URL from them)
PAGE_KEY_HEADERS = (b"host", b"x-forwarded-host", b"x-forwarded-proto")
# Gradio's routes this app never uses: the run history (another uncached copy of the page), screen recordings
# (ffmpeg per call where installed), the monitoring dashboard, the vibe editor, profiling, deep links, media
# streams, the URL proxy, custom components, MCP, logins. Answered 404 before Gradio sees them.
CLOSED_ROUTES = ("/gradio_api/process_recording", "/gradio_api/runs", "/gradio_api/run-history", "/monitoring",
                 "/gradio_api/vibe", "/gradio_api/undo-vibe-edit", "/gradio_api/profiling", "/gradio_api/dev/",
                 "/gradio_api/deep_link", "/gradio_api/stream/", "/gradio_api/proxy=",
                 "/gradio_api/custom_component/", "/gradio_api/mcp", "/login", "/logout")
HEALTH_ROUTE = "/healthz"


def route_of(scope) -> str:
    """The request's path below the app's root, without a trailing slash ('/' for the root)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    path = path[len(root):] if root and path.startswith(root) else path
    return path.rstrip("/") or "/"


def accepts_gzip(scope) -> bool:
    """Whether the request's Accept-Encoding takes gzip (named, or `*`, at a q above 0)."""
    accepted = b",".join(v for k, v in scope.get("headers", []) if k.lower() == b"accept-encoding")
    for coding in accepted.decode("latin-1").lower().split(","):
        name, *params = [part.strip() for part in coding.split(";")]
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        if name in ("gzip", "*") and q > 0:
            return True
    return False


class Answer(NamedTuple):
    """A kept page route's answer: the http.response.start message and its whole body."""
    start: dict
    body: bytes

    def varied(self) -> "Answer":
        """This answer marked as one of several by Accept-Encoding (for caches between)."""
        return Answer(dict(self.start, headers=[*self.start["headers"], (b"vary", b"Accept-Encoding")]), self.body)

    def gzipped(self) -> Optional["Answer"]:
        """This answer gzip-compressed, or None where it is encoded already. The page and its config are
        plain JSON and script (340 and 250 KB; Gradio compresses only paths with a file extension): about a
        seventh as many bytes, compressed once when kept — a class of 30 loading the page at once on one
        university link fetches 1.4 MB of page instead of 10 (the page embeds its config)."""
        headers = self.start["headers"]
        if any(k.lower() == b"content-encoding" for k, _ in headers):
            return None
        body = gzip.compress(self.body, compresslevel=6, mtime=0)
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        return Answer(dict(self.start, headers=[*headers, (b"content-encoding", b"gzip"),
                                                (b"content-length", str(len(body)).encode())]), body).varied()


class PageCache:
    """The answers of PAGE_ROUTES, kept after the first (the page and its config are built from the Blocks,
    which do not change while the server runs: 24 ms and 17 ms each, measured), each plain and gzipped.
    Keyed by route, the query it reads (PAGE_QUERY) and PAGE_KEY_HEADERS; at most `entries`, least recently
    used first out; only a 200 that sets no cookie."""

    def __init__(self, entries: int = 32):
        self.entries = entries
        self.kept: collections.OrderedDict[tuple, list] = collections.OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def query(scope) -> bytes:
        """The part of the query string the route's answer depends on, normalised."""
        wanted = PAGE_QUERY.get(route_of(scope), ())
        params = parse_qs(scope.get("query_string", b"").decode("latin-1")[:2000])
        return "&".join(f"{k}={str(params[k][-1]).lower() in ('1', 'true')}" for k in wanted if k in params).encode()

    @staticmethod
    def key(scope) -> tuple:
        headers = dict((k.lower(), v) for k, v in scope.get("headers", []) if k.lower() in PAGE_KEY_HEADERS)
        return (scope.get("root_path", ""), route_of(scope), PageCache.query(scope),
                *(headers.get(h, b"") for h in PAGE_KEY_HEADERS))

    def get(self, key: tuple) -> Optional[tuple[Answer, Optional[Answer]]]:
        """(the plain answer, the gzipped one or None), or None where nothing is kept."""
        with self.lock:
            if key in self.kept:
                self.kept.move_to_end(key)
                return self.kept[key]
        return None

    def put(self, key: tuple, answer: Answer) -> None:
        start = answer.start
        if start.get("status") != 200 or any(k.lower() == b"set-cookie" for k, _ in start.get("headers", [])):
            return
        gzipped = answer.gzipped()
        with self.lock:
            self.kept[key] = (answer.varied() if gzipped else answer, gzipped)
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
    """ASGI middleware in front of Gradio's app (module docstring). `health()`: (alive, details) for
    /healthz (server.gradio_patches.queue_health); `files`: the raw upload route's bytes on disk."""

    def __init__(self, app, upload_share: Optional[RateShare] = None, health: Optional[Callable] = None,
                 files: Optional[RawUploads] = None):
        self.app = app
        self.uploads = upload_share or RateShare("upload", **UPLOAD_ROUTE_SHARE)
        self.network_uploads = RateShare("upload", **NETWORK_UPLOAD_SHARE, what="uploads from your network")
        self.files = files or RAW_UPLOADS
        self.health = health
        self.requests, self.events, self.pages = (TokenBucket(**REQUEST_RATE), TokenBucket(**EVENT_RATE),
                                                  TokenBucket(**PAGE_RATE))
        self.cache = PageCache()
        self.tarpitted = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method, route = scope.get("path", ""), scope.get("method"), route_of(scope)
        headers = scope.get("headers", [])
        visitor = scope_visitor_key(scope)
        browser = SIGNER.browser(cookie_value(headers))
        BROWSERS.asked(visitor, browser)
        page = method in ("GET", "HEAD") and route in PAGE_ROUTES
        weight = BROWSERS.weight(visitor)
        if route != HEALTH_ROUTE:
            wait = BACKOFF.wait_s(visitor, weight)
            if wait > 0 and not await self._hold(wait):
                return await self._refuse(receive, send, 429, str(ValidationError(
                    "requests", "refusal after refusal from your address",
                    f"a wait of {wait:.1f} s before the next; slow down")), _declared_length(scope), wait)
        try:
            scale = math.sqrt(weight)
            self.requests.take(visitor, scale)
            if page:
                self.pages.take(visitor, scale)
            elif method == "POST" and any(r in path for r in EVENT_ROUTES):
                self.events.take(visitor, scale)
        except RateLimited as e:
            BROWSERS.refused(visitor, browser)
            BACKOFF.refused(visitor)
            declared = _declared_length(scope) if method == "POST" else -1
            await self._hold(TARPIT_S)
            return await self._refuse(receive, send, 429, str(e), declared, e.retry_after_s)
        if route.startswith(CLOSED_ROUTES):
            BACKOFF.refused(visitor)
            return await self._refuse(receive, send, 404, f"Not Found: {route[:200]} is closed on this server",
                                      _declared_length(scope))
        if route == HEALTH_ROUTE and self.health is not None:
            alive, details = self.health()
            body = json.dumps(details).encode()
            await send({"type": "http.response.start", "status": 200 if alive else 503,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body, "more_body": False})
        try:
            self._check_session(route, scope)
        except ValidationError as e:
            BACKOFF.refused(visitor)
            return await self._refuse(receive, send, 400, str(e), _declared_length(scope))
        if page:
            return await self._page(scope, receive, send, route == "/" and browser is None)
        if method != "POST":
            return await self.app(scope, receive, self._cut_errors(send))
        declared = _declared_length(scope)
        held = None
        if route == "/gradio_api/upload":
            limit, network = self.uploads.max_bytes, network_of(visitor)
            try:
                if declared < 0:
                    raise ValidationError("upload", "a body without Content-Length", "a declared size")
                self.uploads.check(visitor, declared)
                self.network_uploads.check(network, declared)
                held = self.files.reserve(network, declared)
                self.uploads.take(visitor, declared)
                self.network_uploads.take(network, declared)
            except ValidationError as e:
                status = 429 if "uploads" in str(e).split(";")[0] else 507 if "disk" in str(e) else 413
                if status != 507:               # a full disk is nobody's own bound
                    BACKOFF.refused(visitor)
                return await self._refuse(receive, send, status, str(e), declared)
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
        if held is None:
            return await self.app(scope, bounded_receive, self._cut_errors(send))
        answer = []
        try:
            await self.app(scope, bounded_receive, self._kept(send, answer))
        finally:
            self.files.arrived(held, _paths(answer))

    async def _hold(self, seconds: float) -> bool:
        """Wait `seconds` before answering (an await: no thread, no CPU), unless TARPIT_AT_ONCE wait already
        -> whether it waited."""
        if self.tarpitted >= TARPIT_AT_ONCE:
            return False
        self.tarpitted += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self.tarpitted -= 1
        return True

    @staticmethod
    def _check_session(route: str, scope) -> None:
        """The session hash of a queue stream or a heartbeat is one Gradio's clients could have made."""
        if route.endswith("/queue/data"):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1")[:4000])
            check_session_hash((query.get("session_hash") or [""])[-1])
        elif route.startswith("/gradio_api/heartbeat/"):
            check_session_hash(route.rsplit("/", 1)[-1])

    async def _page(self, scope, receive, send, new_browser: bool) -> None:
        """A page route from the cache, or built once by Gradio (a GET of its one spelling) and kept; the
        page itself carries a new browser cookie where the request had none."""
        key = self.cache.key(scope)
        kept = self.cache.get(key)
        if kept is None:
            canonical = dict(scope, method="GET", query_string=PageCache.query(scope),
                             path=scope.get("root_path", "") + route_of(scope))
            messages = []

            async def keep(message):
                messages.append(message)
            await self.app(canonical, receive, keep)
            if not messages or messages[0]["type"] != "http.response.start":
                return
            plain = Answer(messages[0], b"".join(m.get("body", b"") for m in messages[1:]))
            self.cache.put(key, plain)
            kept = self.cache.get(key) or (plain, None)
        plain, gzipped = kept
        start, body = gzipped if gzipped is not None and accepts_gzip(scope) else plain
        if new_browser and start.get("status") == 200:
            https = scope.get("scheme") == "https" or dict(scope.get("headers", [])).get(b"x-forwarded-proto") == b"https"
            start = dict(start, headers=[*start["headers"], set_cookie_header(SIGNER.issue(), https)])
        await send(start)
        await send({"type": "http.response.body", "body": body if scope.get("method") == "GET" else b"",
                    "more_body": False})

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

    def _kept(self, send, answer: list):
        """`send` with errors cut, and a 200's body kept in `answer` (the upload route's file list)."""
        cut = self._cut_errors(send)

        async def keep(message):
            if message["type"] == "http.response.start":
                answer.append(message.get("status"))
            elif answer and answer[0] == 200:
                answer.append(message.get("body", b""))
            await cut(message)
        return keep

    @staticmethod
    def _cut_errors(send):
        """Every error answer cut to MAX_ERROR_BODY_BYTES (Gradio's "didn't receive enough input values" echoes
        every input it got, on every route that runs a function)."""
        held = {}

        async def cut(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held["start"], held["body"] = message, b""
                return
            if "start" not in held:
                return await send(message)
            held["body"] = (held["body"] + message.get("body", b""))[:MAX_ERROR_BODY_BYTES * 4]
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


def _paths(answer: list) -> list[str]:
    """The file paths of a 200 answer of the upload route (a JSON list), else []."""
    if not answer or answer[0] != 200:
        return []
    try:
        paths = json.loads(b"".join(answer[1:]))
    except ValueError:
        return []
    return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []


def _declared_length(scope) -> int:
    """The body's declared Content-Length, or -1 (none, or not a number)."""
    for k, v in scope.get("headers", []):
        if k.lower() == b"content-length":
            try:
                return int(v)
            except ValueError:
                return -1
    return -1
