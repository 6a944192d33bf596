"""The front door (server/front_door.py), the browsers it signs (server/browsers.py) and the disk it guards
(server/disk.py): one copy of the page however it is asked for, closed routes, errors that echo little, the
health answer, session hashes checked at the door, cookies that establish a class, and the raw upload
route bounded per network and on disk with honest uploads taken."""
import asyncio
import json
import os

import pytest

from explorer.schema import ValidationError
from server import backoff, browsers, disk, front_door, visitors


class ToyApp:
    """An ASGI app that counts the requests it answers: a page for GETs, `status` and `body` for POSTs,
    and for the upload route a JSON list of one file it writes under `folder`."""

    def __init__(self, status: int = 200, body: bytes = b"ok", folder=None):
        self.seen, self.status, self.body, self.folder = [], status, body, folder

    async def __call__(self, scope, receive, send):
        self.seen.append((scope["method"], scope["path"], scope.get("query_string", b"")))
        status, body = 200, f"page {len(self.seen)}".encode()
        if scope["method"] == "POST":
            while (await receive()).get("more_body"):
                pass
            status, body = self.status, self.body
            if scope["path"].endswith("/upload") and self.folder is not None:
                path = os.path.join(self.folder, f"f{len(self.seen)}.npz")
                open(path, "wb").write(b"\0" * 100)
                body = json.dumps([path]).encode()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def call(door, method: str, path: str, address: str, body: bytes = b"", query: bytes = b"", headers=()):
    """One request through `door` from `address` (forwarded by one trusted proxy) -> (status, headers, body)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": query,
             "client": ("10.9.9.9", 1), "headers": [(b"host", b"space"), (b"x-forwarded-for", address.encode()),
                                                   (b"content-length", str(len(body)).encode()), *headers]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)
    asyncio.run(door(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture(autouse=True)
def behind_one_proxy(monkeypatch):
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    monkeypatch.setattr(front_door, "TARPIT_S", 0.0)
    monkeypatch.setattr(browsers, "BROWSERS", browsers.Browsers())
    monkeypatch.setattr(front_door, "BROWSERS", browsers.BROWSERS)
    monkeypatch.setattr(front_door, "BACKOFF", backoff.Backoff())


def test_every_spelling_of_the_page_and_its_config_is_one_cached_copy():
    """/config/ (trailing slash), a query string (a deep link, a cache-buster) and HEAD are the same copy,
    built once from the route's one spelling; the info route keeps its one parameter."""
    app = ToyApp()
    door = front_door.FrontDoor(app)
    config = call(door, "GET", "/config", "203.0.113.1")[2]
    for path, query in (("/config/", b""), ("/config", b"x=1"), ("/config/", b"deep_link=abc&_=7")):
        assert call(door, "GET", path, "203.0.113.1", query=query)[2] == config
    page = call(door, "GET", "/", "203.0.113.1")[2]
    assert call(door, "GET", "/", "203.0.113.1", query=b"v=12345")[2] == page
    status, _, body = call(door, "HEAD", "/", "203.0.113.1")
    assert status == 200 and body == b""
    call(door, "GET", "/gradio_api/info/", "203.0.113.1", query=b"all_endpoints=true")
    call(door, "GET", "/gradio_api/info", "203.0.113.1", query=b"all_endpoints=True&junk=1")
    assert app.seen == [("GET", "/config", b""), ("GET", "/", b""), ("GET", "/gradio_api/info", b"all_endpoints=True")]


def test_routes_the_app_never_uses_are_closed_and_error_answers_echo_little():
    """The run history (another uncached copy of the page) and screen recordings are refused before Gradio
    sees them; an error answer of any route (Gradio's /run/ echoes every input it got) is cut."""
    app = ToyApp(status=422, body=json.dumps({"detail": "x" * 900_000}).encode())
    door = front_door.FrontDoor(app)
    for path in ("/gradio_api/runs", "/gradio_api/runs/", "/gradio_api/process_recording", "/monitoring",
                 "/gradio_api/vibe-edit/", "/gradio_api/run-history/records"):
        status, _, body = call(door, "POST" if "process" in path else "GET", path, "203.0.113.1")
        assert status == 404 and b"is closed on this server" in body, path
    assert app.seen == []
    status, _, body = call(door, "POST", "/gradio_api/run/mask", "203.0.113.1", b'{"data": []}')
    assert status == 422 and len(body) < front_door.MAX_ERROR_BODY_BYTES and body.endswith(b'(cut)"}')


def test_the_health_answer_says_whether_the_queue_is_alive():
    alive = [True]
    door = front_door.FrontDoor(ToyApp(), health=lambda: (alive[0], {"queue": "running" if alive[0] else "stopped"}))
    status, _, body = call(door, "GET", "/healthz", "203.0.113.1")
    assert status == 200 and json.loads(body) == {"queue": "running"}
    alive[0] = False
    status, _, body = call(door, "GET", "/healthz", "203.0.113.1")
    assert status == 503 and json.loads(body) == {"queue": "stopped"}


def test_a_stream_or_heartbeat_of_a_session_hash_no_client_makes_is_refused_at_the_door():
    app = ToyApp()
    door = front_door.FrontDoor(app)
    status, _, body = call(door, "GET", "/gradio_api/queue/data", "203.0.113.1", query=b"session_hash=" + b"x" * 5000)
    assert status == 400 and b"session_hash: got" in body
    assert call(door, "GET", "/gradio_api/heartbeat/" + "y" * 200, "203.0.113.1")[0] == 400
    assert call(door, "GET", "/gradio_api/queue/data", "203.0.113.1", query=b"session_hash=abc123")[0] == 200
    assert len(app.seen) == 1


def test_each_page_load_gets_a_signed_cookie_that_the_cache_never_keeps():
    door = front_door.FrontDoor(ToyApp())
    _, headers, _ = call(door, "GET", "/", "203.0.113.1")
    cookie = headers[b"set-cookie"].decode()
    assert cookie.startswith(f"{browsers.COOKIE}=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    assert browsers.SIGNER.browser(value) is not None
    _, again, _ = call(door, "GET", "/", "203.0.113.1", headers=[(b"cookie", f"{browsers.COOKIE}={value}".encode())])
    assert b"set-cookie" not in again                             # a browser that has one keeps it
    _, other, _ = call(door, "GET", "/", "203.0.113.2")
    assert other[b"set-cookie"] != headers[b"set-cookie"]         # every new browser its own
    _, https, _ = call(door, "GET", "/", "203.0.113.3", headers=[(b"x-forwarded-proto", b"https")])
    assert b"Secure; SameSite=None; Partitioned" in https[b"set-cookie"]
    forged = value[:-1] + ("0" if value[-1] != "0" else "1")
    assert browsers.SIGNER.browser(forged) is None and browsers.SIGNER.browser("x" * 500) is None


def test_browsers_count_once_they_ran_the_page_lately_and_behaved_up_to_a_cap():
    now = [0.0]
    seen = browsers.Browsers(clock=lambda: now[0])
    assert seen.weight("addr:a") == 1
    for i in range(30):
        seen.asked("addr:a", f"b{i}")               # a cookie alone (a script's GET /) counts for nothing
    assert seen.weight("addr:a") == 1
    for i in range(30):
        seen.loaded("addr:a", f"b{i}")
    assert seen.weight("addr:a") == 30 and seen.weight("addr:b") == 1
    seen.refused("addr:a", "b0")
    assert seen.weight("addr:a") == 29
    for i in range(100):
        seen.loaded("addr:a", f"c{i}")
    assert seen.weight("addr:a") == browsers.ESTABLISHED_CAP
    now[0] += browsers.ACTIVE_S + 1                 # the class went home
    assert seen.weight("addr:a") == 1


def test_an_established_class_gets_a_classs_rates_at_the_door():
    """Thirty browsers behind one address, each having run the page: the address's event rate grows with
    their number (sqrt), so the class is not refused where one visitor would be."""
    door = front_door.FrontDoor(ToyApp())
    burst = int(front_door.EVENT_RATE["burst"])
    lone = [call(door, "POST", "/gradio_api/queue/join", "203.0.113.9", b"{}")[0] for _ in range(burst + 20)]
    assert 429 in lone
    for i in range(30):
        browsers.BROWSERS.loaded("addr:192.0.2.1", f"student{i}")
    codes = [call(door, "POST", "/gradio_api/queue/join", "192.0.2.1", b"{}")[0] for _ in range(burst * 3)]
    assert codes == [200] * (burst * 3)


def test_the_raw_upload_route_is_bounded_per_network_and_on_disk_with_honest_uploads_taken(tmp_path):
    """Addresses of one /24 each within their own share: their network's share ends them. Uploads from many
    networks fill the disk bound: a newcomer's upload deletes the heaviest network's oldest file, never a
    lighter one's; files go after their time."""
    app = ToyApp(folder=tmp_path)
    files = disk.RawUploads(max_bytes=3000)
    door = front_door.FrontDoor(app, files=files)
    door.network_uploads = front_door.RateShare("upload", max_bytes=2500, max_calls=100, window_s=3600,
                                                what="uploads from your network")
    codes = [call(door, "POST", "/gradio_api/upload", f"198.51.100.{i}", b"\0" * 1000)[0] for i in range(3)]
    assert codes == [200, 200, 413]
    status, _, body = call(door, "POST", "/gradio_api/upload", "203.0.113.1", b"\0" * 1000)
    assert status == 200 and files.bytes_of() == 3000 and len(os.listdir(tmp_path)) == 3
    status, _, body = call(door, "POST", "/gradio_api/upload", "192.0.2.1", b"\0" * 1000)
    assert status == 200 and files.bytes_of("net:198.51.100.0/24") == 1000 and len(os.listdir(tmp_path)) == 3
    status, _, body = call(door, "POST", "/gradio_api/upload", "192.0.2.99", b"\0" * 1000)
    assert status == 507 and b"room on the server's disk for uploads" in body      # nobody holds more


def test_raw_uploads_go_after_their_time_and_the_temp_dir_is_trimmed_oldest_first(tmp_path):
    now = [0.0]
    files = disk.RawUploads(max_bytes=10**6, ttl_s=600, clock=lambda: now[0])
    path = tmp_path / "upload.npz"
    path.write_bytes(b"\0" * 100)
    files.arrived(files.reserve("net:a", 100), [str(path)])
    now[0] = 601
    assert files.sweep() == 1 and not path.exists() and files.bytes_of() == 0
    failed = files.reserve("net:a", 100)
    files.arrived(failed, [])                        # answered without files: its room is freed
    assert files.bytes_of() == 0
    for i in range(5):
        (tmp_path / f"old{i}").write_bytes(b"\0" * 1000)
        os.utime(tmp_path / f"old{i}", (1000 + i, 1000 + i))
    (tmp_path / "fresh").write_bytes(b"\0" * 1000)
    assert disk.trim_dir(tmp_path, max_bytes=2500) == 2000
    assert sorted(os.listdir(tmp_path)) == ["fresh", "old4"]
    with pytest.raises(ValidationError):
        disk.RawUploads(max_bytes=10).reserve("net:a", 11)


# --- rates per visitor, answered late (round three) ------------------------------------------------------------

def test_a_token_bucket_bounds_each_visitor_and_names_when_to_retry():
    now = [0.0]
    bucket = front_door.TokenBucket("events", burst=3, per_s=2, clock=lambda: now[0])
    for _ in range(3):
        bucket.take("a")
    with pytest.raises(front_door.RateLimited, match=r"^requests: got 'more events from your address than the "
                                                    r"server answers'; allowed: 3 at once, then 2 a second; "
                                                    r"retry in 0\.5 s") as refused:
        bucket.take("a")
    assert refused.value.retry_after_s == pytest.approx(0.5)
    bucket.take("b")                                     # another visitor's bucket
    now[0] = 0.5
    bucket.take("a")                                     # refilled one


def test_the_page_is_built_once_and_page_loads_and_events_are_bounded_per_visitor():
    """GET / built by Gradio once and then served from the cache, byte for byte; one address past its
    page-load or event rate is answered 429 by name before Gradio sees the request; another address is not."""
    app = ToyApp()
    door = front_door.FrontDoor(app)
    first = call(door, "GET", "/", "10.0.0.1")[::2]
    assert all(call(door, "GET", "/", "10.0.0.1")[::2] == first for _ in range(5)) and app.seen == [("GET", "/", b"")]
    for _ in range(int(front_door.PAGE_RATE["burst"]) - 6):
        call(door, "GET", "/config", "10.0.0.1")
    status, _, body = call(door, "GET", "/", "10.0.0.1")
    assert status == 429 and b"requests: got 'more page loads from your address" in body
    assert call(door, "GET", "/", "10.0.0.2")[::2] == first                 # another visitor
    before = len(app.seen)
    burst = int(front_door.EVENT_RATE["burst"])      # a few more refill while these run (20 a second)
    answers = [call(door, "POST", "/gradio_api/queue/join", "10.0.0.3", b"{}") for _ in range(burst + 10)]
    codes = [code for code, _, _ in answers]
    assert codes[:burst] == [200] * burst and 429 in codes and len(app.seen) - before == codes.count(200)
    assert b"more events from your address" in answers[codes.index(429)][2]


def test_a_refusal_for_rate_is_answered_late_so_a_loop_of_them_slows_down(monkeypatch):
    """A client looping on refusals gets each TARPIT_S late (an await, no thread): about one a second per
    connection instead of thousands."""
    import time
    monkeypatch.setattr(front_door, "TARPIT_S", 0.3)
    door = front_door.FrontDoor(ToyApp())
    for _ in range(int(front_door.PAGE_RATE["burst"])):
        call(door, "GET", "/", "10.0.0.1")
    t0 = time.monotonic()
    assert call(door, "GET", "/", "10.0.0.1")[0] == 429 and time.monotonic() - t0 >= 0.3
    monkeypatch.setattr(front_door, "TARPIT_AT_ONCE", 0)                    # too many waiting: at once
    t0 = time.monotonic()
    assert call(door, "GET", "/", "10.0.0.1")[0] == 429 and time.monotonic() - t0 < 0.3


def test_a_visitor_refused_again_and_again_waits_before_its_next_request_is_read(monkeypatch):
    """Past FREE_REFUSALS refusals lately, each of a visitor's requests waits STEP_S more per refusal (at most
    MAX_WAIT_S) before the app reads it; another visitor, an honest one of the same network, a loopback client
    and the health answer are not held; past TARPIT_AT_ONCE held at once, the held visitor is refused at once."""
    import time
    monkeypatch.setattr(backoff, "STEP_S", 0.1)
    monkeypatch.setattr(backoff, "MAX_WAIT_S", 0.35)
    app = ToyApp()
    door = front_door.FrontDoor(app, health=lambda: (True, {}))

    def timed(address, path="/gradio_api/queue/join"):
        t0 = time.monotonic()
        status = call(door, "POST", path, address, b"{}")[0]
        return status, time.monotonic() - t0
    for _ in range(int(backoff.FREE_REFUSALS)):
        front_door.BACKOFF.refused("addr:10.0.0.1")
    assert timed("10.0.0.1") == (200, pytest.approx(0.0, abs=0.05))       # a few refusals lately: free
    for n in (1, 2):
        front_door.BACKOFF.refused("addr:10.0.0.1")
        status, took = timed("10.0.0.1")
        assert status == 200 and took >= 0.1 * n * 0.95
    for _ in range(20):
        front_door.BACKOFF.refused("addr:10.0.0.1")
    status, took = timed("10.0.0.1")
    assert status == 200 and 0.33 <= took < 0.6                           # capped at MAX_WAIT_S
    assert timed("10.0.0.2")[1] < 0.05                                    # a neighbour never refused is not held
    assert timed("127.0.0.1")[1] < 0.05                                   # nor the machine's own clients
    t0 = time.monotonic()
    assert call(door, "GET", "/healthz", "10.0.0.1")[0] == 200 and time.monotonic() - t0 < 0.05
    monkeypatch.setattr(front_door, "TARPIT_AT_ONCE", 0)                  # too many held: refused at once
    status, took = timed("10.0.0.1")
    assert status == 429 and took < 0.05


def test_refusals_decay_count_per_network_and_scale_with_a_class():
    """A refusal counts half after HALF_LIFE_S; an address with an established class has a class's free refusals;
    one address looping on refusals holds up no neighbour, but addresses of one /24 refused one after another
    (a botnet asking from a fresh address each time) hold up every visitor of that /24, and no other."""
    clock = [0.0]
    b = backoff.Backoff(clock=lambda: clock[0])
    free, step = backoff.FREE_REFUSALS, backoff.STEP_S
    for _ in range(int(free) + 4):
        b.refused("addr:10.1.1.1")
    assert b.wait_s("addr:10.1.1.1") == pytest.approx(4 * step)
    assert b.wait_s("addr:10.1.1.1", weight=30) == 0.0
    for _ in range(200):
        b.refused("addr:10.1.1.1")
    assert b.wait_s("addr:10.1.1.1") == backoff.MAX_WAIT_S and b.wait_s("addr:10.1.1.2") == 0.0
    clock[0] += 1000.0
    for _ in range(int(free) + 8):
        b.refused("addr:10.1.1.1")
    clock[0] += backoff.HALF_LIFE_S                                       # they count half
    assert b.wait_s("addr:10.1.1.1") == pytest.approx(((free + 8) / 2 - free) * step, rel=1e-3)
    for i in range(int(backoff.FREE_ADDRESSES) + 6):                     # a fresh address each time
        b.refused(f"addr:10.2.2.{i}")
    assert b.wait_s("addr:10.2.2.200") == pytest.approx(6 * step, rel=0.01)   # every visitor of that /24
    assert b.wait_s("addr:10.2.3.1") == 0.0


def test_the_page_and_its_config_go_gzipped_to_a_browser_that_takes_it_and_plain_to_others():
    """The kept page is compressed once: a browser sending Accept-Encoding gzip (or *) gets the same bytes
    gzipped, with their own length; one that does not, or refuses it (q=0), gets them plain; both say they
    vary by Accept-Encoding, HEAD sends the headers alone, and Gradio builds the page once."""
    import gzip
    page = b"<html>" + b"the lesson's page " * 4000 + b"</html>"

    class PageApp(ToyApp):
        async def __call__(self, scope, receive, send):
            self.seen.append(scope["path"])
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/html"), (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page, "more_body": False})
    app = PageApp()
    door = front_door.FrontDoor(app)
    for accept, zipped in ((b"gzip, deflate, br", True), (b"br;q=1.0, gzip;q=0.5", True), (b"*", True),
                           (b"identity", False), (b"gzip;q=0", False), (b"br", False), (None, False)):
        headers = [(b"accept-encoding", accept)] if accept is not None else []
        status, got, body = call(door, "GET", "/", "203.0.113.1", headers=headers)
        assert status == 200 and got[b"vary"] == b"Accept-Encoding", accept
        assert int(got[b"content-length"]) == len(body), accept
        assert (got.get(b"content-encoding") == b"gzip") is zipped, accept
        assert (gzip.decompress(body) if zipped else body) == page, accept
        if zipped:
            assert len(body) < len(page) / 20
    status, got, body = call(door, "HEAD", "/config", "203.0.113.1", headers=[(b"accept-encoding", b"gzip")])
    assert status == 200 and body == b"" and got[b"content-encoding"] == b"gzip"
    assert app.seen == ["/", "/config"]
