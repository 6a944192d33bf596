"""How much of the server one visitor may hold: the lanes requests queue in and their bounds, and the
admission every request passes when it is pushed, before it waits (atomic: tickets until it is queued; the
visitor's shares taken, server.shares; a page's older redraws superseded). Plain Python: server/lanes.py hands
in the request objects and Gradio's queue, server.fair_queue orders each lane. Who a visitor is, is
server.visitors' to say; an address's light shares scale with the browsers established behind it
(server.browsers: a class behind one NAT), its heavy work does not.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch

from explorer.limits import LARGE_REQUEST_FLOPS
from explorer.schema import ValidationError

from .browsers import BROWSERS
from .fair_queue import Usage, WatchedQueue
from .shares import (EXPORT_SHARE, NETWORK_EXPORT_SHARE, NETWORK_WORK_SHARE, WORK_SHARE, WORK_WEIGHT_CAP,
                     RateShare)
from .visitors import network_of, visitor_of

# --- lanes: how many requests may wait, and how many of them one visitor's ---------------------

@dataclass(frozen=True)
class Lane:
    """A queue of the server: `running` at once, at most `waiting` behind them (all visitors). One
    visitor (a page or API client: a session) may hold at most `per_visitor` of its requests, one
    visitor key (an address or a signed-in user, which may hold many sessions: a class behind one NAT,
    or one client minting session hashes) `per_address`; held = waiting, plus running where
    `count_running`. A request over a bound is refused by name at once instead of filling the
    server's one queue, so one visitor cannot sink the rest. Where `scales`, `per_address` grows with
    the browsers established behind the address (address_bound)."""
    name: str
    what: str            # in messages: "model views"
    running: int
    waiting: int
    per_visitor: int
    per_address: int
    count_running: bool = True
    scales: bool = False


def address_bound(lane: Lane, weight: int) -> int:
    """One visitor key's bound in `lane` when `weight` browsers are established behind it: a visitor's
    share more per browser where the lane scales, never past three quarters of the lane."""
    if not lane.scales or weight <= 1:
        return lane.per_address
    return min(lane.per_address + lane.per_visitor * (weight - 1), lane.waiting * 3 // 4)


# Small forwards at once: 4 on a GPU; on a CPU two per core, up to 4 (each runs one torch thread, see
# server.memory.configure_threads). A lecture-size view spends much of its slot on Python (building figures,
# Gradio's postprocessing) waiting for the GIL, so one per core left a core idle: in the soak (30 visitors and
# the attacker on 2 cores), honest model views p95 3.5 s with 2 slots, 2.6 s with 4. Six (three per core) bettered
# the model views under every mode at once but slowed /mask, the honest visitors alone and raised peak RSS by ~1 GB
# (benchmarks/results/load-soak-ab-rejected-2026-11-28.json). Heavy views have their own lane of one.
FORWARDS_AT_ONCE = 4 if torch.cuda.is_available() else max(1, min(4, 2 * (os.cpu_count() or 1)))

LANES: dict[str, Lane] = {lane.name: lane for lane in (
    # room for a class's thirty, as many lone visitors and the page visitors beside them waiting at once (the soak
    # holds 69 when the box is slow; at 64 it refused 1-3 honest requests a run); the mask lane's wait is milliseconds
    Lane("forward", "model views", running=FORWARDS_AT_ONCE, waiting=96, per_visitor=4, per_address=6, scales=True),
    # views over limits.LARGE_REQUEST_FLOPS (any event that draws one): one at a time, so they never hold the
    # small views' slots
    Lane("heavy", "large views", running=1, waiting=6, per_visitor=1, per_address=2),
    # a view already drawn for the same settings (a class on one lecture step: explorer.views.View.kept),
    # answered from what is kept in milliseconds: it waits behind no model view and takes no work share. Its
    # answer's time is the event loop's (Gradio's starts, pre- and postprocessing, the message out), not CPU, so
    # its slots are many: with 4, a lecture /mask under every mode of the soak waited 0.5 s (p50) for one
    Lane("kept", "kept views", running=12, waiting=64, per_visitor=4, per_address=6, scales=True),
    # the mask view (no model): one address holds fewer than run at once, so others always find a slot
    Lane("light", "mask views", running=6, waiting=48, per_visitor=2, per_address=3, scales=True),
    # the page's own cheap steps that stay queued (a page load's link check, the committed timing curves); a
    # class's 31 page loads at once from one address fit under three quarters of it
    Lane("control", "page steps", running=4, waiting=48, per_visitor=4, per_address=8, scales=True),
    # a new Run replaces the visitor's running sweep, so only waiting ones count
    Lane("timing", "timing sweeps", running=1, waiting=16, per_visitor=1, per_address=1, count_running=False),
    # Runs answered by a sweep another Run measures (server.timing_runs: running, waiting or just kept), watching
    # it: no place in the timing lane; a class's thirty behind one address watch at once, an address past its
    # share is refused
    Lane("watch", "joined sweeps", running=64, waiting=48, per_visitor=1, per_address=2, scales=True),
    Lane("export", "figure exports", running=1, waiting=4, per_visitor=1, per_address=2),
    # a lecture pack renders every figure: its own slot, so a one-figure export never waits behind one
    Lane("pack", "lecture packs", running=1, waiting=2, per_visitor=1, per_address=1),
    Lane("upload", "weight uploads", running=1, waiting=4, per_visitor=1, per_address=2),
)}
# The largest kept view the kept lane answers (a lecture view is about 0.5 MiB, phoenix-nano's heatmaps 5): what
# it pins while it waits, and serialises on its way out, is past the memory ceiling (server.memory.memory_budget).
KEPT_MAX_BYTES = 4 << 20

# Gradio's own bound on everything queued; the lanes' sum (336: the kept views' 64, the watchers' 48 and the model
# views' 32 more raised it from 192) under three quarters of it, so no lane's refusals are pre-empted by Gradio's
# "Queue is full" (which names no field).
QUEUE_MAX = 456


class Held(NamedTuple):
    """One request a lane holds, as admission counts it: its visitor key and session, whether it is a
    page redraw and superseded by its session's newer one (it then runs as a no-op), and its queued
    Gradio event (or, not queued yet, its admission Ticket; None where neither is known)."""
    key: str
    session: str
    redraw: bool = False
    stale: bool = False
    event: Any = None


def _held(entry) -> Held:
    return entry if isinstance(entry, Held) else Held(*entry)


# A page's superseded redraws that may wait at once (each runs as a no-op, in milliseconds).
STALE_PER_SESSION = 4


def check_admission(lane: str, waiting: list, visitor: tuple, running: list = (), weight: int = 1,
                    redraw: bool = False, weights: Callable[[str], int] = lambda key: 1) -> Optional[Held]:
    """Raise ValidationError("queue", ...) when one more request of `visitor` (key, session) in `lane`
    would pass a bound; -> the waiting request it pushes out when the lane is full (None: there is room).
    `waiting` / `running`: what the lane holds now (Held records, or (key, session) pairs); `weight`: the
    browsers established behind the key (address_bound), `weights` the same for any key. A page redraw
    (`redraw`) supersedes its session's waiting ones: only the session's other requests count against its
    own bound. A full lane refuses the arrival only when no network holds more of it than the arrival's
    network would: else that network's latest waiting request is pushed out (the heaviest pays)."""
    bound = LANES[lane]
    waiting, running = [_held(h) for h in waiting], [_held(h) for h in running]
    key, session = visitor
    counted = waiting + (running if bound.count_running else [])
    state = "waiting or running" if bound.count_running else "waiting"
    mine = [h for h in counted if (h.key, h.session) == (key, session)]
    superseded = [h for h in waiting if (h.key, h.session) == (key, session) and h.redraw] if redraw else []
    if len(superseded) >= STALE_PER_SESSION:
        raise ValidationError("queue", f"{len(superseded)} of your earlier redraws waiting",
                              f"{STALE_PER_SESSION} per page; wait for the views to catch up")
    if redraw:                          # its page's other redraws: superseded if waiting, ending if running
        mine = [h for h in mine if not h.redraw]
    if len(mine) >= bound.per_visitor:
        raise ValidationError("queue", f"{len(mine)} of your {bound.what} {state}",
                              f"{bound.per_visitor} per visitor; wait for one to finish (or Stop it)")
    ours = sum(1 for h in counted if h.key == key) - len(superseded)
    limit = address_bound(bound, weight)
    if ours >= limit:
        raise ValidationError("queue", f"{ours} {bound.what} {state} from your address",
                              f"{limit} per address; wait for one to finish")
    if len(waiting) < bound.waiting:
        return None
    victim = _heaviest(waiting, counted, key, weights)
    if victim is None:
        full = ValidationError if _holding_most(counted, key, weights) else LaneFull
        raise full("queue", f"{len(waiting)} {bound.what} waiting",
                   f"{bound.waiting} at once; the server is busy, try again in a moment")
    return victim


def _holding_most(counted: list, key: str, weights: Callable[[str], int]) -> bool:
    """Whether the network of `key` holds the most of a lane (per established browser) of every network in it."""
    load, per = _network_loads(counted, weights)
    here = network_of(key)
    return here in load and load[here] / per[here] >= max(load[n] / per[n] for n in load)


def _network_loads(counted: list, weights: Callable[[str], int]) -> tuple[collections.Counter, dict]:
    """(requests a lane holds per network, the most browsers established behind one of its visitors)."""
    load, per = collections.Counter(network_of(h.key) for h in counted), {}
    for h in counted:
        per[network_of(h.key)] = max(per.get(network_of(h.key), 1), weights(h.key))
    return load, per


class LaneFull(ValidationError):
    """A full lane refused an arrival whose network holds less of it than another: the server is busy, which
    is no bound of the visitor's own (server.backoff never counts it). A network holding most of the full lane
    is refused with a plain ValidationError: its own doing, counted."""


def _heaviest(waiting: list, counted: list, key: str, weights: Callable[[str], int]) -> Optional[Held]:
    """The waiting request to push out for an arrival of `key`: the latest of the network holding most of
    the lane per established browser, if that is more than the arrival's network would hold."""
    load, per = _network_loads(counted, weights)
    here = network_of(key)
    arrival = (load[here] + 1) / max(per.get(here, 1), weights(key))
    candidates = [h for h in waiting if h.event is not None and not h.stale]
    if not candidates:
        return None
    heaviest = max(candidates, key=lambda h: load[network_of(h.key)] / per[network_of(h.key)])
    net = network_of(heaviest.key)
    if net == here or load[net] / per[net] <= arrival:
        return None
    return [h for h in candidates if network_of(h.key) == net][-1]


@dataclass(eq=False)
class Ticket:
    lane: str
    visitor: tuple       # (key, session)
    issued: float
    request: Any = None  # the HTTP request that pushed it (the queued event carries the same one)
    redraw: bool = False
    pushed_out: bool = False    # an arrival pushed it out before it was queued: answered PUSHED_OUT on entry


class Admission:
    """Atomic admission: a request admitted to a lane holds a ticket from its check until it is in
    the lane's queue (`queued`), so checks that run at once count each other and none races past a
    bound. A ticket whose request never reached the queue (refused later, dropped) lapses after
    `ticket_ttl_s`. Page redraws are numbered per page: an older one still waiting is superseded."""

    def __init__(self, ticket_ttl_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.lock = threading.Lock()
        self.tickets: list[Ticket] = []
        self.ticket_ttl_s, self.clock = ticket_ttl_s, clock
        self.rates = {"export": RateShare("export", **EXPORT_SHARE, clock=clock),
                      "work": RateShare("work", **WORK_SHARE, clock=clock),
                      "network work": RateShare("work", **NETWORK_WORK_SHARE, clock=clock),
                      "network export": RateShare("export", **NETWORK_EXPORT_SHARE, clock=clock)}
        self.usage = Usage(clock=clock)
        self.queues: dict[str, WatchedQueue] = {}
        self.weights: Callable[[str], int] = BROWSERS.weight
        self.redraws: collections.OrderedDict[tuple, int] = collections.OrderedDict()   # page -> newest redraw
        self.redraw_count = 0

    def served(self, key: str, seconds: float) -> None:
        """A request of visitor `key` ran `seconds`: charged to its usage, and every lane's waiting
        requests put back in order (least usage first)."""
        with self.lock:
            self.usage.charge(key, seconds)
            for queue in self.queues.values():
                queue.reorder()

    def admit(self, lane: str, visitor: tuple, lane_now: Callable[[], tuple[list, list]], units: int = 1,
              flops: float = 0.0, request: Any = None, redraw: bool = False) -> tuple[Optional[int], Optional[Held]]:
        """Admit one request of `visitor` (key, session) to `lane`, worth `units` of the lane's rate
        share where it has one and `flops` of the visitor's WORK_SHARE, or raise ValidationError naming the
        bound. `lane_now()`: (waiting, running), Held records of each request in the lane now;
        `request`: the HTTP request pushing it, by which its queued event spends the ticket. -> (its number
        as a page redraw (`redraw`), else None; the waiting request it pushes out (check_admission), which
        no longer counts and the caller answers, else None)."""
        with self.lock:
            now = self.clock()
            self.tickets = [t for t in self.tickets if now - t.issued < self.ticket_ttl_s]
            # an admitted request not queued yet holds its ticket, which a full lane's arrival may push out too
            # (in a burst most of a lane can be tickets: a lane full of them refused every arrival)
            pending = [Held(*t.visitor, t.redraw, False, t) for t in self.tickets if t.lane == lane and not t.pushed_out]
            waiting, running = lane_now()
            weight = self.weights(visitor[0])
            victim = check_admission(lane, list(waiting) + pending, visitor, running, weight, redraw, self.weights)
            shares = [(self.rates["export"], visitor[0], units, 1), (self.rates["network export"],
                      network_of(visitor[0]), units, 1)] if lane in ("export", "pack") and units else []
            if flops >= 1e9:
                scale = min(weight, WORK_WEIGHT_CAP)
                shares += [(self.rates["work"], visitor[0], round(flops / 1e9), scale),
                           (self.rates["network work"], network_of(visitor[0]), round(flops / 1e9), scale)]
            for share, who, n, scale in shares:
                share.check(who, n, scale)
            for share, who, n, scale in shares:         # every share checked first: a refusal takes none
                share.take(who, n, scale)
            self.tickets.append(Ticket(lane, tuple(visitor), now, request, redraw))
            if isinstance(getattr(victim, "event", None), Ticket):
                victim.event.pushed_out = True
            elif victim is not None:
                victim.event._pushed_out = True
            if not redraw:
                return None, victim
            self.redraw_count += 1
            self.redraws[tuple(visitor)] = self.redraw_count
            self.redraws.move_to_end(tuple(visitor))
            while len(self.redraws) > 10_000:
                self.redraws.popitem(last=False)
            return self.redraw_count, victim

    def superseded(self, state: Any) -> bool:
        """Whether the page redraw marked on `state` (an HTTP request's state: `redraw` = (page, number))
        has a newer one of its page admitted since."""
        mark = getattr(state, "redraw", None)
        if mark is None:
            return False
        newest = self.redraws.get(mark[0])
        return newest is not None and newest != mark[1]

    def held(self, event: Any) -> Optional[Held]:
        """How a queued or running Gradio event counts in its lane (None: pushed out, answered already)."""
        if getattr(event, "_pushed_out", False):
            return None
        state = getattr(getattr(event, "request", None), "state", None)
        return Held(*visitor_of(event), getattr(state, "redraw", None) is not None, self.superseded(state), event)

    def entered(self, lane: str, session: Optional[str], request: Any = None) -> Optional[Ticket]:
        """A request entered `lane`'s queue (call under self.lock): its ticket is spent — the one its HTTP
        request took (an API call without a session hash gets one only once queued), else one of `session`.
        -> the ticket spent (pushed out meanwhile, the request is answered so: fair_queue.WatchedQueue)."""
        same = [i for i, t in enumerate(self.tickets) if t.lane == lane and request is not None and t.request is request]
        same = same or [i for i, t in enumerate(self.tickets) if t.lane == lane and t.visitor[1] == session]
        return self.tickets.pop(same[0]) if same else None


def check_drawn(state: Any, flops: float) -> None:
    """Refuse by name a view about to draw `flops` under an event admitted for less (`state`: the event's
    HTTP request state, where server.lanes wrote `admitted_flops`): a handler drawing other settings than
    its admission judged would run past the heavy lane and the work share. Small work (no share, no heavy
    lane) always passes; a call from no event (`admitted_flops` unset) too."""
    admitted = getattr(state, "admitted_flops", None)
    if admitted is None or flops <= admitted * (1 + 1e-6) or (flops < 1e9 and flops <= LARGE_REQUEST_FLOPS):
        return
    raise ValidationError("work", f"{flops / 1e9:,.1f} GFLOP drawn",
                          f"the {admitted / 1e9:,.1f} GFLOP this request was admitted for")


# the one admission of this process: every lane, share and visitor count (server.lanes, server.guard)
ADMISSION = Admission()
