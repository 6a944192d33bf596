"""Byte and rate shares per visitor key (and per network): how much of a resource one visitor may take within a
window — renders of exports, GFLOP of model work, bytes of uploads — refused by name past it (`RateShare`), and the
shares server.admission takes at admission."""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from explorer.schema import ValidationError


class RateShare:
    """Per visitor: at most `max_bytes` units (bytes, unless `unit` says otherwise) within any
    `window_s` and `max_calls` calls in it. `take` raises ValidationError naming `field` when one more
    would pass a share; `scale` (a visitor worth several: established browsers) multiplies both bounds."""

    def __init__(self, field: str, max_bytes: int, max_calls: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic, unit: str = "bytes", what: str = "uploads"):
        self.field, self.max_bytes, self.max_calls, self.window_s, self.clock = field, max_bytes, max_calls, window_s, clock
        self.unit, self.what = unit, what
        self.lock = threading.Lock()
        self.log: dict[str, collections.deque] = {}

    def check(self, visitor: str, nbytes: int, scale: int = 1) -> None:
        """Raise as `take` would, taking nothing."""
        with self.lock:
            self._refuse_past(visitor, nbytes, self._window(visitor), scale)

    def take(self, visitor: str, nbytes: int, scale: int = 1) -> None:
        with self.lock:
            q = self._window(visitor)
            self._refuse_past(visitor, nbytes, q, scale)
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

    def _refuse_past(self, visitor: str, nbytes: int, q: collections.deque, scale: int = 1) -> None:
        used = sum(n for _, n in q)
        minutes = f"{self.window_s / 60:.0f} minutes"
        whose = ("per network" if "network" in self.what else "per visitor") if scale == 1 else \
            f"for your address ({scale} visitors' worth)"
        if len(q) >= self.max_calls * scale:
            raise ValidationError(self.field, f"{len(q)} {self.what} in {minutes}",
                                  f"{self.max_calls * scale} {whose} per {minutes}")
        if used + nbytes > self.max_bytes * scale:
            raise ValidationError(self.field, f"{used + nbytes:,} {self.unit} in {minutes}",
                                  f"{self.max_bytes * scale:,} {self.unit} {whose} per {minutes}")


# Exports render in one headless Chromium (a second process, about a core while it draws): per visitor
# key, renders per window (a lecture pack renders every figure of export.FIGURES in each format). A lecturer
# making slides renders a few dozen; a loop of them would keep the browser busy for everyone.
EXPORT_SHARE = dict(max_bytes=80, max_calls=80, window_s=600.0, unit="renders", what="exports")
NETWORK_EXPORT_SHARE = dict(EXPORT_SHARE, max_bytes=160, max_calls=160, what="exports from your network")
# Model work per visitor key, estimated before a request runs (explorer.limits.view_cost): on average a
# quarter of a free Space's core for one address. A student on phoenix-nano draws ~30 views in 10 minutes
# (26-150 GFLOP each); a loop of the largest the budget admits (~550 GFLOP) gets 5, then waits for the
# window; lecture views (< 1 GFLOP) never count. A class behind one NAT address has up to WORK_WEIGHT_CAP of it.
WORK_SHARE = dict(max_bytes=3000, max_calls=10**6, window_s=600.0, unit="GFLOP", what="model views")
# ... and per network (a /24, an IPv6 /48): two visitors' worth, so fresh addresses of one block each asking for the
# largest views cannot keep the heavy lane busy (a botnet's heavy views, finding 7 of issue 34)
NETWORK_WORK_SHARE = dict(WORK_SHARE, max_bytes=2 * WORK_SHARE["max_bytes"], what="model views from your network")


# The work share grows with the browsers established behind an address up to this many visitors' worth: a class
# on phoenix-nano gets a core, not thirty (heavy work stays bounded per address).
WORK_WEIGHT_CAP = 4
