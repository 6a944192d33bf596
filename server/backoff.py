"""Backing off the refused: a visitor refused by name again and again — past a bound of its own (a lane's
per-visitor or per-address count, a work or export share, a request rate, an upload share) — waits before
its next request is read, longer the more it was refused lately (`Backoff.wait_s`), up to MAX_WAIT_S; and
every visitor of a network (a /24, an IPv6 /48) whose addresses are refused one after another (a botnet asking
from a fresh address each time) waits by how many were. The front door holds it there (an await: no thread,
no CPU).

Why: a refusal costs the server the request's parsing, routing and admission (measured in issue 34's soak: an
attacker looping on refusals from 40 connections asked ~70 times a second, and serving those refusals took the
interpreter from honest visitors' views). A client that backs off as told is never held; one that loops asks
about once every MAX_WAIT_S per connection. Honest visitors are refused rarely (a double click, a quick preset
switch): FREE_REFUSALS lately cost nothing, and a full lane ("the server is busy") is nobody's fault and never
counts. Refusals count per visitor key, per established browser behind an address (a class's thirty), and a
network's by its addresses refused, not its refusals: one student looping on refusals holds up no neighbour,
FREE_ADDRESSES of one block refused within a minute or so do (fair_queue.Usage: decayed counts)."""
from __future__ import annotations

import functools
import ipaddress
import threading
import time
from typing import Callable

from .fair_queue import Usage
from .visitors import network_of

FREE_REFUSALS = 4.0     # refusals (decayed) a visitor may have lately before any wait
FREE_ADDRESSES = 8.0    # addresses of one network refused lately before each of its visitors waits
STEP_S = 0.5            # the wait each refusal past them adds
MAX_WAIT_S = 8.0
HALF_LIFE_S = 30.0      # a refusal counts half after this long


class Backoff:
    """Refusals by name per visitor key and network, decayed; `wait_s(key, weight)`: how long the visitor's next
    request waits before it is read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.lock = threading.Lock()
        self.refusals = Usage(half_life_s=HALF_LIFE_S, clock=clock)       # per visitor key
        self.addresses = Usage(half_life_s=HALF_LIFE_S, clock=clock)      # per network: its keys newly refused

    def refused(self, key: str) -> None:
        if local(key):
            return
        with self.lock:
            if self.refusals.of(key) < 0.5:         # a visitor not refused lately: one more of its network's
                self.addresses.charge(network_of(key), 1.0)
            self.refusals.charge(key, 1.0)

    def wait_s(self, key: str, weight: int = 1) -> float:
        if local(key):
            return 0.0
        with self.lock:
            own = self.refusals.of(key) / max(1, weight) - FREE_REFUSALS
            spread = self.addresses.of(network_of(key)) - FREE_ADDRESSES
        return min(MAX_WAIT_S, max(0.0, own, spread) * STEP_S)


@functools.lru_cache(maxsize=4096)
def local(key: str) -> bool:
    """A visitor on this machine (a loopback address: a local run's own browser, its tests) is never held:
    every client of a server with no proxy in front is one key there."""
    kind, _, address = key.partition(":")
    try:
        net = ipaddress.ip_network(address, strict=False)
    except ValueError:
        return False
    return kind == "addr" and (net.network_address.is_loopback or (net.version == 6 and LOOPBACK6 in net))


LOOPBACK6 = ipaddress.ip_address("::1")


# the one record of this process: the front door reads it, whatever refuses by name writes it
BACKOFF = Backoff()
