"""Browsers behind one address: a cookie the server signs on every page load, and which of the cookies an
address holds are established — loaded the page, ran its load event with the cookie, asked something
lately, and were never refused for their rate. Their count is the weight the address's light shares
scale by (server.admission): a class of 30 behind one university address is 30 visitors there, never more
than ESTABLISHED_CAP, and heavy work stays bounded per address whatever the weight.

What the server can know: Gradio's session hash is whatever a client writes; the address is what the
Space's proxy saw; the cookie is one the server signed (a client can get one per page load, as a
browser does, and no more of them counted than ESTABLISHED_CAP). A browser that sends no cookie back
(a blocked third-party cookie in the Space's frame, an API client) is simply not counted: its address
has the shares of one visitor, as before."""
from __future__ import annotations

import collections
import hashlib
import hmac
import os
import secrets
import threading
import time
from typing import Callable, Optional

COOKIE = "explorer-browser"
COOKIE_SECRET_ENV = "EXPLORER_COOKIE_SECRET"        # set it to keep cookies valid across restarts
COOKIE_MAX_AGE_S = 12 * 3600
ESTABLISHED_CAP = 40            # a class of 30, its lecturer and a few second tabs
ACTIVE_S = 300.0                # a browser counts while it has asked anything within this
REFUSED_S = 600.0               # refused for its rate: not counted for this long
BROWSERS_PER_KEY = 4 * ESTABLISHED_CAP      # cookies remembered per visitor key (oldest forgotten)
MAX_KEYS = 50_000


class CookieSigner:
    """`issue()` a fresh browser id signed with the process's secret; `browser(value)` the id of a cookie
    value the server signed, else None."""

    def __init__(self, secret: Optional[bytes] = None):
        env = os.environ.get(COOKIE_SECRET_ENV, "")
        self.secret = secret or (env.encode() if env else secrets.token_bytes(32))

    def _mac(self, browser: str) -> str:
        return hmac.new(self.secret, browser.encode(), hashlib.sha256).hexdigest()[:24]

    def issue(self) -> str:
        browser = secrets.token_hex(8)
        return f"{browser}.{self._mac(browser)}"

    def browser(self, value: Optional[str]) -> Optional[str]:
        if not value or len(value) > 64 or value.count(".") != 1:
            return None
        browser, mac = value.split(".")
        return browser if hmac.compare_digest(mac, self._mac(browser)) else None


def cookie_value(headers) -> Optional[str]:
    """The explorer cookie's value in ASGI headers ([(name, value)] bytes) or a mapping with a `cookie`."""
    if isinstance(headers, (list, tuple)):
        lines = [v.decode("latin-1") for k, v in headers if k.lower() == b"cookie"]
    else:
        lines = [headers.get("cookie") or ""]
    for line in lines:
        for part in line.split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
    return None


def set_cookie_header(value: str, https: bool) -> tuple[bytes, bytes]:
    """The Set-Cookie header for a browser id. Over HTTPS (a Space, shown in huggingface.co's frame) the
    cookie is a partitioned third-party one, which browsers keep in a frame; locally a plain first-party one."""
    where = "Secure; SameSite=None; Partitioned" if https else "SameSite=Lax"
    return b"set-cookie", f"{COOKIE}={value}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; {where}".encode()


class Browsers:
    """Per visitor key: the signed browsers seen, when each last asked, whether its page ran its load
    event, and until when it is not counted (refused for its rate). `weight(key)`: how many are
    established now, at least 1 and at most ESTABLISHED_CAP."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.lock = threading.Lock()
        self.seen: dict[str, collections.OrderedDict] = {}      # key -> browser -> [last seen, loaded, refused until]

    def _entry(self, key: str, browser: str) -> list:
        mine = self.seen.get(key)
        if mine is None:
            if len(self.seen) >= MAX_KEYS:
                self._forget_idle()
            mine = self.seen[key] = collections.OrderedDict()
        entry = mine.get(browser)
        if entry is None:
            entry = mine[browser] = [self.clock(), False, 0.0]
            while len(mine) > BROWSERS_PER_KEY:
                mine.popitem(last=False)
        mine.move_to_end(browser)
        return entry

    def _forget_idle(self) -> None:
        now = self.clock()
        for key in [k for k, m in self.seen.items() if all(now - e[0] > ACTIVE_S for e in m.values())]:
            del self.seen[key]

    def asked(self, key: str, browser: Optional[str]) -> None:
        """A request of `key` carrying the signed `browser` cookie."""
        if browser:
            with self.lock:
                self._entry(key, browser)[0] = self.clock()

    def loaded(self, key: str, browser: Optional[str]) -> None:
        """The page's load event was pushed with this cookie: the browser ran the page."""
        if browser:
            with self.lock:
                entry = self._entry(key, browser)
                entry[0], entry[1] = self.clock(), True

    def refused(self, key: str, browser: Optional[str]) -> None:
        """A request of this browser was refused for its rate: not counted for REFUSED_S."""
        if browser:
            with self.lock:
                self._entry(key, browser)[2] = self.clock() + REFUSED_S

    def weight(self, key: str) -> int:
        now = self.clock()
        with self.lock:
            mine = self.seen.get(key, {})
            n = sum(1 for last, loaded, refused_until in mine.values()
                    if loaded and now - last <= ACTIVE_S and now >= refused_until)
        return max(1, min(ESTABLISHED_CAP, n))


SIGNER = CookieSigner()
BROWSERS = Browsers()


def browser_of(request) -> Optional[str]:
    """The signed browser id a request (a gr.Request, a Starlette request: anything with `headers`) carries."""
    return SIGNER.browser(cookie_value(getattr(request, "headers", None) or {}))
