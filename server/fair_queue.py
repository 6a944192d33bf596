"""The fair queue: each lane's waiting requests in serving order — least recent service first (`Usage`:
seconds of service per visitor key and network, decayed), networks taking turns, a page's superseded redraws
first (they run as no-ops) — kept so as Gradio's reader takes them (`WatchedQueue`)."""
from __future__ import annotations

import collections
import math
import time
from typing import Callable, Optional

from .visitors import network_of, visitor_of


# A network's usage counts in its visitors' ranks shared by this many (a /24 of a botnet ranks behind lone
# visitors; a home or an office of a few shares little); weighting only, never identity.
NETWORK_SHARE = 4


class Usage:
    """Seconds of service each visitor key (and each network, network_of) had lately: every request's
    running time, decayed with a half-life of `half_life_s`. The lanes serve first the waiting request
    whose visitor had least (least attained service, `rank`): a visitor keeping the server busy with heavy
    requests waits behind everyone else's, and still has the server when nobody else wants it."""

    def __init__(self, half_life_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.half_life_s, self.clock = half_life_s, clock
        self.seconds: dict[str, tuple[float, float]] = {}        # key -> (seconds, when)
        self.kept = 1024                                            # keys held before the decayed are forgotten

    def of(self, key: str) -> float:
        seconds, when = self.seconds.get(key, (0.0, 0.0))
        return seconds * 0.5 ** ((self.clock() - when) / self.half_life_s)

    def rank(self, key: str, weight: int = 1) -> float:
        """The key's usage, at least its network's shared by NETWORK_SHARE, per established browser."""
        return max(self.of(key), self.of(network_of(key)) / NETWORK_SHARE) / max(1, weight)

    def charge(self, key: str, seconds: float) -> None:
        now = self.clock()
        if len(self.seconds) > self.kept:       # forget what has decayed away (a pass over every key: now and then)
            self.seconds = {k: (v, t) for k, (v, t) in self.seconds.items()
                            if v * 0.5 ** ((now - t) / self.half_life_s) > 1e-3}
            self.kept = 2 * max(len(self.seconds), 512)
        for k in {key, network_of(key)}:
            self.seconds[k] = (self.of(k) + seconds, now)



class WatchedQueue(list):
    """A lane's queue list (Gradio appends to it and serves its first entry) that tells `admission`
    when a request enters it and keeps its requests in serving order (`order`)."""

    def __init__(self, lane: str, admission, items=(), on_pushed_out: Callable = lambda event: None):
        super().__init__(items)
        self.lane, self.admission, self.arrivals = lane, admission, 0
        self.on_pushed_out = on_pushed_out        # answers an event pushed out before it was queued
        admission.queues[lane] = self

    def order(self, events: Optional[list] = None) -> list:
        """(call under the admission lock) The requests (`events`, by default the queue's) in serving order: a superseded page redraw first (it
        runs as a no-op); then by round — how many requests of its network wait ahead of it, per browser
        established behind its visitor (networks take turns, so the heaviest's later requests wait behind
        everyone's first); then the visitor's usage rank less the seconds it has waited, in whole seconds
        (so a busy visitor waits at most about its usage behind new arrivals, never for ever); then arrival."""
        now, ahead, keys, ranks = self.admission.clock(), collections.Counter(), [], {}
        for event in sorted(self if events is None else events, key=lambda e: getattr(e, "_arrival", -1)):
            key = getattr(event, "_visitor_key", "")
            if self.admission.superseded(getattr(getattr(event, "request", None), "state", None)):
                keys.append(((-1, 0, getattr(event, "_arrival", -1)), event))
                continue
            if key not in ranks:                # once per visitor, however many of its requests wait
                weight = self.admission.weights(key)
                ranks[key] = (weight, network_of(key), self.admission.usage.rank(key, weight))
            weight, network, rank = ranks[key]
            usage = rank - (now - getattr(event, "_queued_at", now))
            keys.append(((ahead[network] // max(1, weight), math.floor(usage), getattr(event, "_arrival", -1)), event))
            ahead[network] += 1
        return [event for _, event in sorted(keys, key=lambda k: k[0])]

    def append(self, event) -> None:
        """Queue `event` here, or in the lane its admission chose (`request.state.lane`: a model view
        estimated heavy waits in the heavy lane, whatever event asked for it)."""
        chosen = getattr(getattr(getattr(event, "request", None), "state", None), "lane", self.lane)
        if chosen != self.lane and chosen in self.admission.queues:
            event.concurrency_id = chosen
            return self.admission.queues[chosen].append(event)
        with self.admission.lock:       # the entry and its ticket's end are one step for every check
            ticket = self.admission.entered(self.lane, getattr(event, "session_hash", None),
                                            getattr(event, "request", None))
            if ticket is not None and ticket.pushed_out:    # an arrival pushed it out while it was a ticket
                event._pushed_out = True
            else:
                event._visitor_key, event._arrival = visitor_of(event)[0], self.arrivals
                event._queued_at = self.admission.clock()
                self.arrivals += 1
                self[:] = self.order([*self, event])      # one step for Gradio's reader on the event loop
                return
        self.on_pushed_out(event)

    def reorder(self) -> None:
        """Back in order after usage changed (call under the admission lock); a single slice
        assignment, so Gradio's reader never sees the list part-sorted or empty."""
        if len(self) > 1:
            self[:] = self.order()
