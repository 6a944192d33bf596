"""Admission: who a visitor is (what the client cannot mint), the lanes' bounds checked atomically, and
per-visitor byte / rate shares."""
import asyncio
import threading

import pytest

from server import admission, visitors
from server.admission import LANES, QUEUE_MAX, Admission, check_admission
from server.fair_queue import NETWORK_SHARE, WatchedQueue
from server.shares import (EXPORT_SHARE, NETWORK_EXPORT_SHARE, NETWORK_WORK_SHARE, WORK_SHARE, WORK_WEIGHT_CAP,
                           RateShare)
from server.visitors import client_address, visitor_key
from explorer.schema import ValidationError


# --- who is asking -----------------------------------------------------------------------------

def test_the_address_is_the_one_the_trusted_proxy_appended_not_what_the_client_wrote():
    minted = {"x-forwarded-for": "1.2.3.4, 5.6.7.8, 203.0.113.9"}      # the client wrote the first two
    assert client_address(minted, "10.0.0.1", hops=1) == "203.0.113.9"
    assert client_address(minted, "10.0.0.1", hops=2) == "5.6.7.8"
    assert client_address(minted, "10.0.0.1", hops=0) == "10.0.0.1"     # no proxy: the connection's peer
    assert client_address({}, "10.0.0.1", hops=1) == "10.0.0.1"         # did not pass the proxy
    assert client_address({"x-forwarded-for": " , "}, None, hops=1) == "unknown"


def test_a_signed_in_user_is_the_visitor_whatever_the_address():
    assert visitor_key({}, "10.0.0.1", "alice", hops=0) == "user:alice"
    assert visitor_key({"x-forwarded-for": "9.9.9.9"}, "10.0.0.1", None, hops=1) == "addr:9.9.9.9"


def test_trusted_proxies_default_to_one_on_a_space(monkeypatch):
    monkeypatch.delenv(visitors.TRUSTED_PROXIES_ENV, raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert visitors.trusted_proxies() == 0
    monkeypatch.setenv("SPACE_ID", "someone/explorer")
    assert visitors.trusted_proxies() == 1
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "many")
    with pytest.raises(ValidationError, match="EXPLORER_TRUSTED_PROXIES: got 'many'"):
        visitors.trusted_proxies()


def test_minted_session_hashes_share_their_addresss_bound():
    """One client with a fresh session hash per call is still one address: its share of the lane ends."""
    lane = LANES["forward"]
    minted = [("addr:a", f"s{i}") for i in range(lane.per_address)]
    with pytest.raises(ValidationError, match=rf"^queue: got '{lane.per_address} model views waiting or running "
                                              rf"from your address'; allowed: {lane.per_address} per address"):
        check_admission("forward", minted, ("addr:a", "fresh"))
    check_admission("forward", minted, ("addr:b", "fresh"))          # another address: admitted


# --- the lanes' bounds ---------------------------------------------------------------------------

def test_admission_bounds_the_lane_and_each_visitor_by_name():
    timing = LANES["timing"]
    b = ("addr:b", "b")
    check_admission("timing", [b] * (timing.per_visitor - 1), b)       # room left: admitted
    with pytest.raises(ValidationError, match=r"^queue: got '1 of your timing sweeps waiting'; allowed: 1 per"):
        check_admission("timing", [b], b)
    check_admission("timing", [b], ("addr:c", "c"))                    # another visitor: fine
    full = [(f"addr:v{i}", f"v{i}") for i in range(timing.waiting)]
    with pytest.raises(ValidationError, match=rf"^queue: got '{timing.waiting} timing sweeps waiting'; "
                                              rf"allowed: {timing.waiting} at once"):
        check_admission("timing", full, ("addr:new", "new"))
    check_admission("timing", [], b, running=[b])                      # a new Run replaces the running sweep


def test_running_requests_count_against_a_visitors_share_in_the_lanes_that_say_so():
    light = LANES["light"]
    me = ("addr:a", "a")
    with pytest.raises(ValidationError, match="of your mask views waiting or running"):
        check_admission("light", [], me, running=[me] * light.per_visitor)
    assert light.per_address < light.running       # one address never holds every mask slot


def test_the_lanes_fit_under_gradios_own_queue_bound():
    """Gradio refuses everything ("Queue is full", no field named) once QUEUE_MAX events wait: the
    bounded lanes together must leave room for the cheap unbounded events."""
    assert sum(lane.waiting for lane in LANES.values()) <= QUEUE_MAX * 3 // 4


def test_checks_that_run_at_once_cannot_race_past_a_bound():
    """Admission holds a ticket from its check until the request is queued: 64 checks at once from
    one address (two sessions), none of them queued yet, admit exactly its share."""
    gate = Admission()
    admitted, refused = [], []
    start = threading.Barrier(64)

    def push(i):
        start.wait()
        try:
            gate.admit("forward", ("addr:a", f"s{i % 2}"), lambda: ([], []))
            admitted.append(i)
        except ValidationError:
            refused.append(i)
    threads = [threading.Thread(target=push, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lane = LANES["forward"]
    assert len(admitted) == min(2 * lane.per_visitor, lane.per_address) and len(refused) == 64 - len(admitted)


def test_a_ticket_ends_when_its_request_is_queued_or_lapses():
    now = [0.0]
    gate = Admission(ticket_ttl_s=10.0, clock=lambda: now[0])
    queue = WatchedQueue("forward", gate)
    event = type("Event", (), {"session_hash": "s"})()
    gate.admit("forward", ("addr:a", "s"), lambda: ([], []))
    assert len(gate.tickets) == 1
    queue.append(event)                                  # queued: counted from the queue now, not twice
    assert gate.tickets == [] and list(queue) == [event]
    gate.admit("forward", ("addr:a", "s"), lambda: ([], []))   # refused later by Gradio: never queued
    now[0] = 11.0
    for _ in range(LANES["forward"].per_visitor):        # the lapsed ticket holds no share
        gate.admit("forward", ("addr:a", "s"), lambda: ([], []))


def _event(session: str, address: str):
    """A queued Gradio event as visitor_of reads it: its session and the headers the proxy forwarded."""
    request = type("Request", (), {"headers": {"x-forwarded-for": address}, "client": None})()
    return type("Event", (), {"session_hash": session, "request": request})()


def test_lanes_serve_the_visitor_who_had_least_of_the_server_first(monkeypatch):
    """Least attained service, networks taking turns: a network's second waiting request comes after every
    network's first; within a round, a visitor whose requests ran long waits behind everyone else's,
    whatever the arrival order; equals keep arrival order; usage decays, and a charge re-sorts what waits."""
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    now = [0.0]
    gate = Admission(clock=lambda: now[0])
    queue = WatchedQueue("forward", gate)
    gate.served("addr:198.51.100.66", 30.0)              # the heavy user: 30 s of service
    gate.served("addr:10.2.0.1", 1.0)
    heavy = [_event(f"h{i}", "198.51.100.66") for i in range(3)]
    light = [_event(f"l{i}", f"10.{i + 1}.0.1") for i in range(3)]       # three networks
    for e in (heavy[0], light[0], heavy[1], light[1], heavy[2], light[2]):
        queue.append(e)
    assert list(queue) == [light[0], light[2], light[1], *heavy]     # 10.2.0.1 had 1 s, the others none
    gate.served("addr:10.1.0.1", 60.0)                   # 10.1.0.1's request ran a minute: now the heaviest
    assert list(queue) == [light[2], light[1], heavy[0], light[0], heavy[1], heavy[2]]   # its 1st before their 2nd
    now[0] = 20.0       # 20 s later the heavy user's 30 s decayed to 23.8, less 20 s waited: 3.8, ahead of
    late = _event("late", "10.7.0.1")                    # a newcomer with 5 s of usage
    gate.served("addr:10.7.0.1", 5.0)
    queue.append(late)
    assert list(queue) == [light[1], light[2], heavy[0], late, light[0], heavy[1], heavy[2]]
    now[0] = 600.0                                       # ten half-lives: everyone is even again
    gate.served("addr:10.9.0.1", 0.0)
    assert list(queue) == [heavy[0], light[0], light[1], light[2], late, heavy[1], heavy[2]]   # arrival, by round
    assert gate.usage.of("addr:198.51.100.66") < 0.05


def test_a_networks_later_requests_wait_behind_everyones_first_and_a_class_counts_its_browsers(monkeypatch):
    """Sixteen timing sweeps of one /24 waiting, then a lone honest one: it is served after the botnet's first,
    not its sixteenth. Thirty waiting requests of a class's address with 30 browsers are one round."""
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    gate = Admission(clock=lambda: 0.0)
    queue = WatchedQueue("timing", gate)
    botnet = [_event(f"b{i}", f"198.18.17.{i}") for i in range(16)]
    for e in botnet:
        queue.append(e)
    honest = _event("honest", "203.0.113.9")
    queue.append(honest)
    assert list(queue).index(honest) == 1
    gate.weights = lambda key: 30 if key == "addr:192.0.2.1" else 1
    lane = WatchedQueue("forward", gate)
    students = [_event(f"s{i}", "192.0.2.1") for i in range(30)]
    for e in students:
        lane.append(e)
    lane.append(honest)
    assert list(lane)[-1] is honest                      # the class's 30 are its first round


def test_a_networks_usage_ranks_its_addresses_and_a_class_ranks_as_its_browsers(monkeypatch):
    """Fairness weighting, not identity: twelve addresses of one /24 that took a minute each rank behind a
    lone newcomer of another network though each address is new to the lane; an address with 30 browsers
    established ranks by its usage per browser."""
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    gate = Admission(clock=lambda: 0.0)
    queue = WatchedQueue("forward", gate)
    for i in range(12):
        gate.served(f"addr:198.51.100.{i}", 60.0)
    fresh_of_botnet, lone = _event("b", "198.51.100.200"), _event("h", "203.0.113.5")
    gate.served("addr:203.0.113.5", 20.0)
    queue.append(fresh_of_botnet)
    queue.append(lone)
    assert list(queue) == [lone, fresh_of_botnet]        # 720 s over the /24, shared by 4: 180 s > 20 s
    assert gate.usage.rank("addr:198.51.100.200") == pytest.approx(720 / NETWORK_SHARE)
    gate.served("addr:192.0.2.1", 300.0)                 # a class's address: 30 browsers, 10 s each
    assert gate.usage.rank("addr:192.0.2.1", weight=30) == pytest.approx(10.0)


def test_exports_have_a_rate_share_per_visitor_counted_in_renders():
    now = [0.0]
    gate = Admission(clock=lambda: now[0])
    share = EXPORT_SHARE
    pack = 38                                            # a lecture pack: 19 figures, PNG and SVG
    packs = share["max_bytes"] // pack
    for _ in range(packs):
        gate.admit("pack", ("addr:a", "s"), lambda: ([], []), units=pack)
        gate.tickets.clear()                             # each one queued and served
    with pytest.raises(ValidationError, match=rf"^export: got '{pack * (packs + 1)} renders in 10 minutes'; "
                                              rf"allowed: {share['max_bytes']} renders per visitor"):
        gate.admit("pack", ("addr:a", "s"), lambda: ([], []), units=pack)
    gate.admit("pack", ("addr:b", "s"), lambda: ([], []), units=pack)   # another visitor's share
    gate.admit("export", ("addr:a", "s2"), lambda: ([], []))            # one figure still fits
    now[0] = share["window_s"] + 1
    gate.tickets.clear()
    gate.admit("pack", ("addr:a", "s"), lambda: ([], []), units=pack)


# --- byte and rate shares ------------------------------------------------------------------------

def test_a_rate_share_bounds_bytes_and_calls_per_visitor_within_its_window():
    now = [0.0]
    share = RateShare("upload", max_bytes=100, max_calls=3, window_s=60, clock=lambda: now[0])
    share.take("a", 60)
    with pytest.raises(ValidationError, match=r"^upload: got '110 bytes in 1 minutes'; allowed: 100 bytes per visitor"):
        share.take("a", 50)
    share.take("b", 90)                                  # another visitor's share is their own
    share.take("a", 10)
    share.take("a", 10)
    with pytest.raises(ValidationError, match=r"^upload: got '3 uploads in 1 minutes'; allowed: 3 per visitor"):
        share.take("a", 1)
    now[0] = 61.0
    share.take("a", 100)                                 # the window passed


# --- round three: heavy work in its own lane, work shares (the front door: tests/test_server_front_door.py) ---

def test_every_x_forwarded_for_line_counts_and_the_rightmost_hop_decides_everywhere():
    """A client sends two X-Forwarded-For lines, the first forged; the proxy appends the real address to the
    last. The queue (Starlette's Headers), the front door (ASGI's byte pairs) and a plain mapping all name
    the same visitor: the address the trusted proxy appended."""
    from starlette.datastructures import Headers
    raw = [(b"x-forwarded-for", b"203.0.113.1"), (b"host", b"x"), (b"x-forwarded-for", b"198.51.100.7, 192.0.2.9")]
    assert visitors.forwarded_for(raw) == ["203.0.113.1", "198.51.100.7", "192.0.2.9"]
    keys = {visitor_key(raw, "10.0.0.1", hops=1), visitor_key(Headers(raw=raw), "10.0.0.1", hops=1)}
    assert keys == {"addr:192.0.2.9"}
    assert visitor_key(Headers(raw=raw), "10.0.0.1", hops=3) == "addr:203.0.113.1"


def test_one_request_is_keyed_once_and_as_visitor_key_keys_it(monkeypatch):
    """The front door, the push, admission and the fair queue ask one request's visitor many times: its scope
    keeps the key visitor_key gives, worked out once, and a signed-in user or another count of trusted proxies
    is keyed anew."""
    from starlette.requests import Request
    raw = [(b"x-forwarded-for", b"203.0.113.1, 198.51.100.7")]
    scope = {"type": "http", "headers": raw, "client": ("10.0.0.1", 5000)}
    calls = []
    real = visitors.visitor_key
    monkeypatch.setattr(visitors, "visitor_key", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    request = Request(scope)
    keys = {visitors.scope_visitor_key(scope), visitors.visitor_of(request)[0], visitors.visitor_of(Request(scope))[0]}
    assert keys == {real(raw, "10.0.0.1", hops=1)} == {"addr:198.51.100.7"} and len(calls) == 1
    assert visitors.scope_visitor_key(scope, "alice") == "user:alice"
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "2")
    assert visitors.visitor_of(request)[0] == "addr:203.0.113.1"
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "0")
    assert visitors.visitor_of(request)[0] == "addr:10.0.0.1" and len(calls) == 4


def test_a_heavy_model_view_is_admitted_to_the_heavy_lane_and_queued_there(monkeypatch):
    """A view estimated over LARGE_REQUEST_FLOPS takes the heavy lane's bounds (one per visitor), counts
    against the visitor's work share, and waits in the heavy lane's queue whatever event asked for it;
    a small view of the same visitor still goes to the forward lane."""
    from server import lanes
    gate = Admission()
    monkeypatch.setattr(lanes, "ADMISSION", gate)
    forward_q, heavy_q = WatchedQueue("forward", gate), WatchedQueue("heavy", gate)
    validator = lanes.admit_to("forward", work=lambda query, request=None: 1e12 if "big" in query else 1e6)

    def admit(*args):               # as Gradio awaits it, on an event loop
        return asyncio.run(validator(*args))

    def request():
        http = type("Http", (), {"state": type("State", (), {})(), "headers": {}, "client": None})()
        return type("Request", (), {"request": http, "session_hash": "s", "headers": {}, "client": None,
                                    "username": None})()
    big = request()
    assert admit(big, "big")["is_valid"] is True and big.request.state.lane == "heavy"
    assert admit(request(), "big")["is_valid"] is False                      # one heavy per visitor at once
    small = request()
    assert admit(small, "small")["is_valid"] is True and not hasattr(small.request.state, "lane")
    event = type("Event", (), {"session_hash": "s", "request": big.request, "concurrency_id": "forward"})()
    forward_q.append(event)
    assert list(heavy_q) == [event] and list(forward_q) == [] and event.concurrency_id == "heavy"
    assert [t.lane for t in gate.tickets] == ["forward"]                     # the heavy ticket spent
    assert sum(n for _, n in gate.rates["work"].log[visitors.visitor_of(big)[0]]) == 1000   # 1e12 FLOPs


def test_a_visitors_work_share_refuses_by_name_and_takes_nothing_when_it_refuses():
    now = [0.0]
    gate = Admission(clock=lambda: now[0])
    limit = WORK_SHARE["max_bytes"]
    for _ in range(limit // 1000):
        gate.admit("heavy", ("addr:a", "s"), lambda: ([], []), flops=1000e9)
        gate.tickets.clear()
    with pytest.raises(ValidationError, match=rf"^work: got '{limit + 1000:,} GFLOP in 10 minutes'; "
                                              rf"allowed: {limit:,} GFLOP per visitor"):
        gate.admit("heavy", ("addr:a", "s"), lambda: ([], []), flops=1000e9)
    gate.admit("forward", ("addr:a", "s2"), lambda: ([], []), flops=0.2e9)    # under 1 GFLOP: not counted
    with pytest.raises(ValidationError, match="export"):                     # a refused share takes no work
        gate.admit("pack", ("addr:b", "s"), lambda: ([], []), units=10**6, flops=1000e9)
    assert "addr:b" not in gate.rates["work"].log


# --- round four: networks, full lanes, page redraws, classes behind one address ------------------------------

def test_an_ipv6_64_is_one_visitor_and_networks_weigh_fairness_only():
    """2^64 addresses of one subscriber are one visitor; an IPv4-mapped address is its IPv4 one; the /24 and
    the /48 are networks, never visitors."""
    keys = {visitor_key({"x-forwarded-for": f"2001:db8:1:2::{i:x}"}, None, hops=1) for i in range(1, 200, 7)}
    assert keys == {"addr:2001:db8:1:2::/64"}
    assert visitor_key({"x-forwarded-for": "2001:db8:1:3::1"}, None, hops=1) != keys.pop()
    assert visitor_key({"x-forwarded-for": "::ffff:198.51.100.7"}, None, hops=1) == "addr:198.51.100.7"
    assert visitors.network_of("addr:198.51.100.7") == visitors.network_of("addr:198.51.100.200") == "net:198.51.100.0/24"
    assert visitors.network_of("addr:2001:db8:1:2::/64") == "net:2001:db8:1::/48"
    assert visitors.network_of("user:alice") == "user:alice"
    assert visitor_key({"x-forwarded-for": "198.51.100.7"}, None, hops=1) == "addr:198.51.100.7"   # identity stays


def test_a_session_hash_is_one_gradios_clients_could_have_made():
    for good in ("abc123defgh", "0b9c3f2e-5d1a-4c7e-9f00-1234567890ab", "honest0001"):
        visitors.check_session_hash(good)
    for bad in ("x" * 65, "", "a b", "../x", None, 7, "é"):
        with pytest.raises(ValidationError, match=r"^session_hash: got .*allowed: 1 to 64 letters, digits"):
            visitors.check_session_hash(bad)


def queued(key: str, session: str, redraw: bool = False, stale: bool = False):
    """A request waiting in a lane's queue, as admission counts it (its event a stand-in)."""
    return admission.Held(key, session, redraw, stale, type("Event", (), {})())


def test_a_full_lane_pushes_out_the_heaviest_networks_latest_not_the_newcomer():
    """Twelve addresses of one /24 fill the timing lane (one sweep each, within every per-address bound):
    an honest newcomer of another network is admitted and the botnet's latest waiting sweep pushed out;
    another address of the botnet's network arriving is refused, and so is anyone when no network holds more
    than the newcomer's would."""
    lane = LANES["timing"]
    botnet = [queued(f"addr:198.51.100.{i}", f"s{i}") for i in range(lane.waiting)]
    victim = check_admission("timing", botnet, ("addr:203.0.113.5", "honest"))
    assert victim is botnet[-1]
    with pytest.raises(ValidationError, match=rf"^queue: got '{lane.waiting} timing sweeps waiting'"):
        check_admission("timing", botnet, ("addr:198.51.100.99", "more"))
    spread = [queued(f"addr:10.{i}.0.1", f"s{i}") for i in range(lane.waiting)]     # one per network
    with pytest.raises(ValidationError, match="timing sweeps waiting"):
        check_admission("timing", spread, ("addr:203.0.113.5", "honest"))
    tickets = [admission.Held(f"addr:198.51.100.{i}", f"s{i}") for i in range(lane.waiting)]   # not queued yet
    with pytest.raises(ValidationError, match="timing sweeps waiting"):
        check_admission("timing", tickets, ("addr:203.0.113.5", "honest"))


def test_the_model_views_lane_waits_a_class_its_lone_visitors_and_page_visitors_at_once():
    """Issue 34's soak keeps this many honest model views waiting at once when the box is slow, none of them
    heavier than another: a class of thirty browsers behind one address, thirty lone visitors, eight page and
    API visitors. The probe's request arriving then waits too, instead of being refused ("64 model views
    waiting" refused 1-3 honest requests a run)."""
    class_key = "addr:10.15.0.1"
    weights = {class_key: 30}.get
    waiting = ([queued(class_key, f"class{k:02d}") for k in range(30)]
               + [queued(f"addr:10.1.{i}.1", f"honest{i}") for i in range(30)]
               + [queued(f"addr:10.3.{i}.1", f"page{i}") for i in range(8)])
    assert check_admission("forward", waiting, ("addr:10.2.0.1", "probe"), weight=1,
                           weights=lambda key: weights(key, 1)) is None


def test_a_pushed_out_request_stops_counting_and_the_arrival_takes_its_place():
    gate = Admission()
    lane = LANES["timing"]
    botnet = [queued(f"addr:198.51.100.{i}", f"s{i}") for i in range(lane.waiting)]
    waiting = list(botnet)

    def now():
        return [h for h in waiting if not getattr(h.event, "_pushed_out", False)], []
    _, victim = gate.admit("timing", ("addr:203.0.113.5", "honest"), now)
    assert victim is botnet[-1] and victim.event._pushed_out and len(now()[0]) == lane.waiting - 1


def test_a_full_lane_of_tickets_pushes_out_the_heaviest_networks_latest_ticket_answered_as_it_enters(monkeypatch):
    """In a burst, a full lane can be mostly tickets: requests admitted, not yet in Gradio's queue. An honest
    newcomer then found nothing to push out and was refused ('16 timing sweeps waiting', seen in the soak
    while a botnet's /24 filled the lane). Now the heaviest network's latest ticket is pushed out: when its
    request enters the queue it is answered (PUSHED_OUT, by the lane) instead of queued; the rest queue."""
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    gate = Admission()
    queue, answered = WatchedQueue("timing", gate, on_pushed_out=lambda event: answered.append(event)), []
    lane = LANES["timing"]
    bots = [(f"addr:198.51.100.{i}", f"s{i}") for i in range(lane.waiting)]
    for bot in bots:                                        # admitted, none queued yet
        gate.admit("timing", bot, lambda: ([], []))
    assert len(gate.tickets) == lane.waiting
    _, victim = gate.admit("timing", ("addr:203.0.113.5", "honest"), lambda: ([], []))
    assert (victim.key, victim.session) == bots[-1] and victim.event.pushed_out
    for key, session in bots:
        queue.append(_event(session, key.removeprefix("addr:")))
    assert [e.session_hash for e in answered] == [bots[-1][1]] and answered[0]._pushed_out
    assert sorted(e.session_hash for e in queue) == sorted(session for _, session in bots[:-1])
    with pytest.raises(ValidationError, match="timing sweeps waiting"):    # the botnet's next: its own doing
        gate.admit("timing", ("addr:198.51.100.200", "more"), lambda: (list(map(gate.held, queue)), []))


def test_a_page_redraw_supersedes_its_pages_waiting_ones_and_is_never_refused_for_them():
    """A lecturer switching presets fast: the heavy lane holds one per visitor, counting the running one; a
    page's newer redraw is admitted while its older one runs or waits, the waiting one marked superseded (it
    then draws nothing), and only STALE_PER_SESSION of those may wait."""
    gate = Admission()
    page = ("addr:192.0.2.1", "lecturer")
    running = [admission.Held(*page, True)]
    first, _ = gate.admit("heavy", page, lambda: ([], running), redraw=True)
    gate.tickets.clear()                                # queued: counted from the queue below
    state = type("State", (), {"redraw": (page, first)})()
    assert not gate.superseded(state)
    second, _ = gate.admit("heavy", page, lambda: ([queued(*page, True)], running),
                           redraw=True)
    gate.tickets.clear()
    assert gate.superseded(state) and not gate.superseded(type("State", (), {"redraw": (page, second)})())
    with pytest.raises(ValidationError, match=r"1 of your large views waiting or running'; allowed: 1 per visitor"):
        gate.admit("heavy", page, lambda: ([], running))                 # an API call of that page: as before
    stale = [queued(*page, True, True)] * admission.STALE_PER_SESSION
    with pytest.raises(ValidationError, match=r"of your earlier redraws waiting"):
        check_admission("forward", stale, page, redraw=True)


def test_an_address_bound_grows_with_its_established_browsers_and_heavy_work_does_not():
    """A class of 30 behind one address: the light lanes' per-address bounds grow a visitor's share per
    browser (capped under the lane), the heavy, timing, export, pack and upload lanes do not, and the work
    share grows to WORK_WEIGHT_CAP visitors' worth."""
    forward = LANES["forward"]
    assert admission.address_bound(forward, 1) == forward.per_address
    assert admission.address_bound(forward, 30) == forward.waiting * 3 // 4 > forward.per_address
    for name in ("heavy", "timing", "export", "pack", "upload"):
        assert admission.address_bound(LANES[name], 30) == LANES[name].per_address
    students = [(f"addr:192.0.2.1", f"student{i}") for i in range(forward.per_address)]
    with pytest.raises(ValidationError, match="from your address"):
        check_admission("forward", students, ("addr:192.0.2.1", "student99"))
    check_admission("forward", students, ("addr:192.0.2.1", "student99"), weight=30)
    now = [0.0]
    gate = Admission(clock=lambda: now[0])
    gate.weights = lambda key: 30
    limit = WORK_SHARE["max_bytes"] * WORK_WEIGHT_CAP
    for _ in range(limit // 1000):
        gate.admit("heavy", ("addr:192.0.2.1", "s"), lambda: ([], []), flops=1000e9)
        gate.tickets.clear()
    with pytest.raises(ValidationError, match=rf"allowed: {limit:,} GFLOP for your address \(4 visitors' worth\)"):
        gate.admit("heavy", ("addr:192.0.2.1", "s"), lambda: ([], []), flops=1000e9)


def test_a_view_drawing_more_than_its_event_was_admitted_for_is_refused_by_name():
    state = type("State", (), {"admitted_flops": 0.01e9})()
    admission.check_drawn(state, 0.5e9)                         # small work: no share, no heavy lane
    admission.check_drawn(type("State", (), {})(), 554e9)       # no event (a direct call): nothing to compare
    with pytest.raises(ValidationError, match=r"^work: got '554.0 GFLOP drawn'; allowed: the 0.0 GFLOP this request"):
        admission.check_drawn(state, 554e9)
    admission.check_drawn(type("State", (), {"admitted_flops": 554e9})(), 554e9)


def test_fresh_addresses_of_one_network_share_its_work_and_render_shares():
    """A botnet asking for the largest views, or lecture packs, from a fresh address of one /24 each time:
    each address is within its own share, the network's ends them; another network still draws."""
    gate = Admission(clock=lambda: 0.0)
    limit = NETWORK_WORK_SHARE["max_bytes"]
    for i in range(limit // 1000):
        gate.admit("heavy", (f"addr:198.18.18.{i}", "s"), lambda: ([], []), flops=1000e9)
        gate.tickets.clear()
    with pytest.raises(ValidationError, match=r"^work: got .* GFLOP in 10 minutes'; allowed: .* GFLOP per network"):
        gate.admit("heavy", ("addr:198.18.18.99", "s"), lambda: ([], []), flops=1000e9)
    gate.admit("heavy", ("addr:203.0.113.1", "s"), lambda: ([], []), flops=1000e9)
    renders = NETWORK_EXPORT_SHARE["max_bytes"]
    for i in range(renders // 40):
        gate.admit("pack", (f"addr:198.18.19.{i}", "s"), lambda: ([], []), units=40)
        gate.tickets.clear()
    with pytest.raises(ValidationError, match=r"^export: got .* renders in 10 minutes'; allowed: .* per network"):
        gate.admit("pack", ("addr:198.18.19.99", "s"), lambda: ([], []), units=40)


def test_a_refusal_of_the_visitors_own_bound_counts_toward_its_backoff_and_a_full_lane_does_not(monkeypatch):
    """Admission tells server.backoff of each refusal past a bound of the visitor's own (one heavy view per
    visitor), never of a full lane's "the server is busy" (LaneFull: nobody's own bound) — unless the arrival's
    network is the one holding most of the lane (a botnet's own addresses filling it)."""
    from server import backoff, lanes
    from server.admission import Held, LaneFull
    gate, record = Admission(), backoff.Backoff(clock=lambda: 0.0)   # no decay between refusal and reading
    monkeypatch.setattr(lanes, "ADMISSION", gate)
    monkeypatch.setattr(lanes, "BACKOFF", record)
    WatchedQueue("forward", gate), WatchedQueue("heavy", gate)
    validator = lanes.admit_to("forward", work=lambda query, request=None: 1e12 if "big" in query else 1e6)

    def admit(*args):               # as Gradio awaits it, on an event loop
        return asyncio.run(validator(*args))

    def request(address):
        headers = {"x-forwarded-for": address}
        http = type("Http", (), {"state": type("State", (), {})(), "headers": headers, "client": None})()
        return type("Request", (), {"request": http, "session_hash": "s", "headers": headers, "client": None,
                                    "username": None})()
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1")
    assert admit(request("192.0.2.1"), "big")["is_valid"] is True
    assert admit(request("192.0.2.1"), "big")["is_valid"] is False           # one heavy per visitor
    assert record.refusals.of("addr:192.0.2.1") == pytest.approx(1.0)
    full = [Held(f"addr:198.51.{i}.1", "s", event=object()) for i in range(LANES["forward"].waiting)]
    monkeypatch.setattr(lanes, "lane_now", lambda request, lane: (full, []))
    with pytest.raises(LaneFull):
        check_admission("forward", full, ("addr:203.0.113.9", "s"))
    assert admit(request("203.0.113.9"), "small")["is_valid"] is False        # the server is busy
    assert record.refusals.of("addr:203.0.113.9") == 0.0
    ours = [Held(f"addr:198.51.100.{i}", "s", event=object()) for i in range(LANES["forward"].waiting)]
    with pytest.raises(ValidationError) as refused:                          # a network holding it all: its doing
        check_admission("forward", ours, ("addr:198.51.100.200", "s"))
    assert not isinstance(refused.value, LaneFull)
    monkeypatch.setattr(lanes, "lane_now", lambda request, lane: (ours, []))
    assert admit(request("198.51.100.200"), "small")["is_valid"] is False
    assert record.refusals.of("addr:198.51.100.200") == pytest.approx(1.0)
