"""Who is asking: a visitor is keyed on what the client cannot mint — an HF-signed-in user where present,
else the client address as the proxy in front forwards it (the address it appends to X-Forwarded-For, not
the entries the client sent; an IPv6 address as its /64), else the peer address. Session hashes (chosen
by the client) only tell apart the tabs of one visitor; networks (a /24, an IPv6 /48) weigh fairness,
never identity. The queue, the front door and the upload store all ask this module."""
from __future__ import annotations

import functools
import ipaddress
import os
import re
from typing import Any, Optional

from explorer.schema import ValidationError

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


@functools.lru_cache(maxsize=65536)
def normalised_address(address: str) -> str:
    """An IPv6 address as its /64 (one subscriber's network: its 2^64 addresses are one visitor's to
    choose from), an IPv4 (or IPv4-mapped) address as itself, anything else as written, cut to 64 characters."""
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return address[:64]
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


@functools.lru_cache(maxsize=65536)
def network_of(key: str) -> str:
    """The network of a visitor key, for fairness weighting only (never identity: a /24 can be many
    homes): an IPv4 address's /24, an IPv6 /64's /48; a signed-in user or an unparsed address is its own."""
    kind, _, address = key.partition(":")
    if kind != "addr":
        return key
    try:
        net = ipaddress.ip_network(address, strict=False)
    except ValueError:
        return key
    return f"net:{net.supernet(new_prefix=24 if net.version == 4 else 48)}"


def visitor_key(headers, peer: Optional[str], username: Optional[str] = None,
                hops: Optional[int] = None) -> str:
    """'user:<name>' for a signed-in visitor, else 'addr:<client address>' (an IPv6 one as its /64). The one
    function that decides who is asking: the queue, the HTTP front door and the upload store all call it."""
    if username:
        return f"user:{username}"
    return f"addr:{normalised_address(client_address(headers, peer, trusted_proxies() if hops is None else hops))}"


VISITOR_MEMO = "explorer.visitor"      # an ASGI scope's key: ((hops, username), the visitor key worked out)


def scope_visitor_key(scope: dict, username: Optional[str] = None) -> str:
    """visitor_key of one HTTP request (its ASGI scope), worked out once and kept in the scope: the front door,
    the push, admission's count of each lane and the fair queue's order ask it of one request many times."""
    hops = trusted_proxies()
    memo = scope.get(VISITOR_MEMO)
    if memo is not None and memo[0] == (hops, username):
        return memo[1]
    key = visitor_key(scope.get("headers", []), (scope.get("client") or (None,))[0], username, hops)
    scope[VISITOR_MEMO] = ((hops, username), key)
    return key


SESSION_HASH = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_session_hash(session) -> None:
    """A session hash as Gradio's clients make them (the page: 11 characters; gradio_client: a uuid), or
    a refusal by name: every session hash is a key in Gradio's per-session tables."""
    if not isinstance(session, str) or not SESSION_HASH.fullmatch(session):
        raise ValidationError("session_hash", str(session)[:80], "1 to 64 letters, digits, - or _")


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
    scope = getattr(http, "scope", None)
    if isinstance(scope, dict) and scope.get("type") == "http":
        return scope_visitor_key(scope, getattr(request, "username", None)), session
    headers = getattr(http, "headers", None) or {}
    client = getattr(http, "client", None)
    peer = getattr(client, "host", None) if client is not None else None
    return visitor_key(headers, peer, getattr(request, "username", None)), session
