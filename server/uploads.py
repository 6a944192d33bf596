"""Each visitor's uploaded weights: held per session, never listed to anyone else, forgotten after a
while, bounded per visitor, per network and in all. They are kept on disk, not in the server's memory,
and read back memory-mapped when a model is built from them: the model cache reads them by name
(state_of, handed to explorer.runs.serve_uploads at start-up)."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from explorer import budget, runs
from explorer.schema import Settings, ValidationError
from explorer.settings import WEIGHT_GEOMETRY

from .visitors import network_of


# Held per session (Gradio's session hash; gradio_client keeps one per Client) and never listed to
# anyone else; forgotten UPLOAD_TTL_S after they were uploaded (using them does not renew them: uploading
# again does), or PAGE_GONE_GRACE_S after the page was closed (a dropped heartbeat of an open page is back
# within seconds; another page of the same address uploading changes nothing). A session keeps its newest
# UPLOADS_PER_SESSION; the sessions of one visitor key (server.admission: an address or a signed-in user)
# hold at most UPLOAD_SHARE_BYTES together, those of one network (server.visitors.network_of: a /24, an
# IPv6 /48) NETWORK_SHARE_BYTES. When the store (MAX_UPLOAD_STORE_BYTES) is full, the network holding the
# most gives up its oldest uploads, if it holds more than the uploader's network then would: an honest
# upload is taken while a few addresses fill the store, and they cannot push out a lighter one's.
# Names are the file's content hash, so two sessions holding one name hold the same weights.
UPLOADS_PER_SESSION = 2
MAX_UPLOAD_STORE_BYTES = 512 * 2**20        # as fp32 tensors: ~3 models at the CPU's 40M-parameter cap
UPLOAD_SHARE_BYTES = MAX_UPLOAD_STORE_BYTES * 3 // 8    # one visitor: one cap-sized model, or a few small
NETWORK_SHARE_BYTES = MAX_UPLOAD_STORE_BYTES // 2
UPLOAD_TTL_S = 3600.0
PAGE_GONE_GRACE_S = 600.0


# The store's files: one per name (the checked fp32 state, torch.save'd), in a directory of this process
# (never Gradio's temp dir, whose trim would delete them), removed when no session holds the name and at
# exit. On disk they leave the memory a Space's visitors share: measured in the soak, the store held 0.36 GB
# of a server's 1.3 GB 30 s after the load, for the hour an upload is kept.
_STORE: Optional[Path] = None
STORE_PREFIX = "explorer-uploads-"


def store_dir() -> Path:
    """This process's directory of uploads (made at first use, named by its pid). A server killed rather
    than stopped leaves its directory behind: making one first removes those of processes no longer alive."""
    global _STORE
    if _STORE is None or not _STORE.is_dir():
        _remove_dead_stores()
        _STORE = Path(tempfile.mkdtemp(prefix=f"{STORE_PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, _STORE, True)
    return _STORE


def _remove_dead_stores() -> None:
    for path in Path(tempfile.gettempdir()).glob(f"{STORE_PREFIX}*"):
        pid = path.name[len(STORE_PREFIX):].partition("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:                 # alive, another user's
            pass


def _file_of(name: str) -> Path:
    return store_dir() / f"{name}.pt"


def _drop_unheld_files() -> None:
    """(call under _uploads_lock) Remove the files of names no session holds any more."""
    if _STORE is None:
        return
    held = {n for mine in _UPLOADS.values() for n in mine}
    for path in _STORE.glob("*.pt"):
        if path.stem not in held:
            path.unlink(missing_ok=True)


@dataclass
class Upload:
    geometry: dict[str, Any]            # the settings its shapes were checked against
    nbytes: int
    loaded: float                       # time.monotonic() of the upload
    visitor: str = "local"              # server.admission's visitor key of the session that loaded it
    browser: Optional[str] = None       # the page's signed browser (server.browsers), where it sent one


_UPLOADS: dict[str, dict[str, Upload]] = {}     # session -> name -> upload, oldest first


_GONE: dict[str, float] = {}                    # session -> when its page was closed


_FORGOTTEN: dict[str, tuple[set, str]] = {}     # session -> (names forgotten, why), for the next message


_uploads_lock = threading.Lock()


def _expire_uploads(now: float) -> None:
    dropped = False
    for session in list(_UPLOADS):
        mine = _UPLOADS[session]
        gone = _GONE.get(session)
        if gone is not None and now - gone > PAGE_GONE_GRACE_S:
            why = f"{PAGE_GONE_GRACE_S / 60:.0f} minutes after the page was closed"
            expired = list(mine)
        else:
            why = f"{UPLOAD_TTL_S / 60:.0f} minutes after they were uploaded"
            expired = [n for n, u in mine.items() if now - u.loaded > UPLOAD_TTL_S]
        for name in expired:
            del mine[name]
        if expired:
            dropped = True
            names, _ = _FORGOTTEN.get(session, (set(), ""))
            _FORGOTTEN[session] = (names | set(expired), why)
        if not mine:
            del _UPLOADS[session]
            _GONE.pop(session, None)
    while len(_FORGOTTEN) > 10_000:                 # notes for sessions that never came back
        _FORGOTTEN.pop(next(iter(_FORGOTTEN)))
    if dropped:                     # it runs at every page's ask (uploads()): the directory is listed only then
        _drop_unheld_files()


def uploads(session: str) -> dict[str, dict[str, Any]]:
    """This session's uploads: name -> the geometry they fit (explorer.settings' `uploaded`). Asking
    counts as the page being open (a closed page that asks is back)."""
    with _uploads_lock:
        _expire_uploads(time.monotonic())
        _GONE.pop(session, None)
        return {name: dict(u.geometry) for name, u in _UPLOADS.get(session, {}).items()}


def store_bytes() -> int:
    """Bytes of weights the store holds now, every visitor's."""
    with _uploads_lock:
        return sum(u.nbytes for mine in _UPLOADS.values() for u in mine.values())


def forgotten(session: str, name: str) -> Optional[str]:
    """Why this session's upload `name` was forgotten (e.g. '10 minutes after the page was closed'),
    or None if it never held it."""
    with _uploads_lock:
        names, why = _FORGOTTEN.get(session, (set(), ""))
        return why if name in names else None


def page_gone(session: str) -> None:
    """The page of `session` was closed (or lost its connection): its uploads go after
    PAGE_GONE_GRACE_S unless it comes back."""
    with _uploads_lock:
        if session in _UPLOADS:
            _GONE[session] = time.monotonic()


def _check_room(session: str, visitor: str, nbytes: int, name: str = "", evict: bool = False,
                browser: Optional[str] = None) -> dict[str, Upload]:
    """(call under _uploads_lock) Refuse by name an upload of `nbytes` past the visitor's share, its network's
    or the store; -> the session's uploads. The same browser's closed pages (a reload without the link) and the
    session's oldest past UPLOADS_PER_SESSION make room; the store full, the heaviest network's oldest uploads
    do (only when it holds more than the uploader's network then would; with `evict` they are forgotten, else
    only counted out). Another browser's closed page keeps its uploads for its grace, whatever its address."""
    if evict and browser is not None:
        for other in [o for o in _UPLOADS if o in _GONE and o != session]:
            if any(u.browser == browser for u in _UPLOADS[other].values()):
                _forget(other, "when your reloaded page uploaded again")
    mine = _UPLOADS.get(session, {})
    others = [n for n in mine if n != name]     # `name` is replaced; the oldest past the session's count go
    replaced = set(others[:max(0, len(others) - UPLOADS_PER_SESSION + 1)]) | {name}
    kept = [(s, n, u) for s, m in _UPLOADS.items() for n, u in m.items() if m is not mine or n not in replaced
            if browser is None or s == session or s not in _GONE or u.browser != browser]
    ours = sum(u.nbytes for _, _, u in kept if u.visitor == visitor)
    if ours + nbytes > UPLOAD_SHARE_BYTES:
        raise ValidationError("weights file", f"{ours + nbytes:,} bytes of weights held by your uploads",
                              f"{UPLOAD_SHARE_BYTES:,} bytes per visitor (every page and client of one "
                              f"address together; a closed page's uploads go {PAGE_GONE_GRACE_S / 60:.0f} "
                              f"minutes after it closed, the others {UPLOAD_TTL_S / 60:.0f} minutes after upload)")
    network = network_of(visitor)
    by_network: dict[str, int] = {}
    for _, _, u in kept:
        by_network[network_of(u.visitor)] = by_network.get(network_of(u.visitor), 0) + u.nbytes
    theirs = by_network.get(network, 0) + nbytes
    if theirs > NETWORK_SHARE_BYTES:
        raise ValidationError("weights file", f"{theirs:,} bytes of weights held by uploads from your network",
                              f"{NETWORK_SHARE_BYTES:,} bytes per network; try again later")
    held = sum(by_network.values())
    while held + nbytes > MAX_UPLOAD_STORE_BYTES:
        heaviest = max((n for n in by_network if n != network), key=by_network.get, default=None)
        if heaviest is None or by_network[heaviest] <= theirs:
            raise ValidationError("weights file", f"{nbytes:,} bytes of weights",
                                  f"room in the server's upload store ({MAX_UPLOAD_STORE_BYTES - held:,} of "
                                  f"{MAX_UPLOAD_STORE_BYTES:,} bytes free; uploads are forgotten "
                                  f"{UPLOAD_TTL_S / 60:.0f} minutes after upload) — try again later")
        s, n, u = min(((s, n, u) for s, n, u in kept if network_of(u.visitor) == heaviest), key=lambda k: k[2].loaded)
        kept.remove((s, n, u))
        by_network[heaviest] -= u.nbytes
        held -= u.nbytes
        if evict:
            _forget(s, "when the store needed room for a lighter network's upload", names={n})
    return mine


def _forget(session: str, why: str, names: Optional[set] = None) -> None:
    """(call under _uploads_lock) Drop the uploads `names` of `session` (all of them by default), noting why
    for its next message."""
    mine = _UPLOADS.get(session, {})
    gone = set(mine) if names is None else names & set(mine)
    for name in gone:
        del mine[name]
    noted, _ = _FORGOTTEN.get(session, (set(), ""))
    _FORGOTTEN[session] = (noted | gone, why)
    if not mine:
        _UPLOADS.pop(session, None)
        _GONE.pop(session, None)
    if gone:
        _drop_unheld_files()


def adopt(session: str, visitor: str, name: str) -> bool:
    """A page opened on a link naming `upload:<name>` takes that upload over from a closed page of the same
    visitor (a reload: a new session hash, the old one gone), so it is not left counting against the share
    until it expires. -> whether it did."""
    with _uploads_lock:
        for other, theirs in _UPLOADS.items():
            u = theirs.get(name)
            if other != session and other in _GONE and u is not None and u.visitor == visitor:
                mine = _UPLOADS.setdefault(session, {})
                mine[name] = theirs.pop(name)
                if not theirs:
                    del _UPLOADS[other]
                    _GONE.pop(other, None)
                return True
    return False


def state_of(weights: str) -> dict[str, torch.Tensor]:
    """The tensors behind "upload:<name>": the validation layer has checked that the asking session
    holds that name, and equal names are equal files, so any session's copy serves."""
    name = weights[len("upload:"):]
    with _uploads_lock:             # read under the lock: no sweep removes the file meanwhile
        holders = [session for session, mine in _UPLOADS.items() if name in mine]
        if holders:
            try:
                return torch.load(_file_of(name), map_location="cpu", mmap=True, weights_only=True)
            except FileNotFoundError:   # its directory was cleared under the server: the name is forgotten
                for session in holders:
                    _forget(session, "when the server's store of uploads was cleared", names={name})
    raise ValidationError("weights", weights, "an uploaded file the server still holds; upload it again")


def load_upload(s: Settings, path: str, session: str, visitor: str = "local", browser: Optional[str] = None) -> str:
    """Check an uploaded file against the current configuration (explorer.runs.check_upload) and keep it
    for this session -> its name for ``Settings.weights = "upload:<name>"``. On any problem a
    ValidationError names it and nothing changes (the current weights stay), a store without room
    included."""
    def room(nbytes: int) -> None:
        with _uploads_lock:
            _expire_uploads(time.monotonic())
            _check_room(session, visitor, nbytes, browser=browser)   # counted only: the model may still fail
    name, state = runs.check_upload(s, path, room)
    nbytes = budget.nbytes(state)
    geometry = {f: getattr(s, f) for f in WEIGHT_GEOMETRY}
    written = _file_of(name).with_suffix(f".{os.getpid()}-{threading.get_ident()}.part")     # outside the lock
    try:
        try:
            torch.save(state, written)
        except OSError as e:
            raise ValidationError("weights file", f"{nbytes:,} bytes of weights",
                                  f"room on the server's disk ({e.strerror or e}); try again later") from None
        del state
        now = time.monotonic()
        with _uploads_lock:
            _expire_uploads(now)
            mine = _check_room(session, visitor, nbytes, name, evict=True, browser=browser)
            mine.pop(name, None)                     # uploaded again: now the newest, with this geometry
            for n in list(mine)[:max(0, len(mine) - UPLOADS_PER_SESSION + 1)]:
                del mine[n]
            written.replace(_file_of(name))         # equal names are equal files: an older copy is the same
            mine[name] = Upload(geometry, nbytes, now, visitor, browser)
            _UPLOADS[session] = mine
            _FORGOTTEN.pop(session, None)
            _drop_unheld_files()
    finally:
        written.unlink(missing_ok=True)
    return name

