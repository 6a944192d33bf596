"""Gradio's temp dir on disk. The raw upload route's files are bounded in bytes for everyone together
(RAW_UPLOAD_BYTES) and deleted RAW_UPLOAD_TTL_S after they arrive (the page's upload event reads its file
at once). When an upload would pass the bound, the network holding most of it (server.visitors.network_of)
loses its oldest files first, if it holds more than the newcomer's would then hold: an honest upload is
accepted while a botnet's files fill the bound, and a botnet cannot push out a lone uploader. The whole
directory (Gradio's copies of exports too) is trimmed, oldest first, past TEMP_DIR_BYTES."""
from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from explorer.schema import ValidationError

log = logging.getLogger("explorer")

RAW_UPLOAD_BYTES_ENV, TEMP_DIR_BYTES_ENV = "EXPLORER_RAW_UPLOAD_BYTES", "EXPLORER_TEMP_DIR_BYTES"
RAW_UPLOAD_BYTES = int(os.environ.get(RAW_UPLOAD_BYTES_ENV, 1 * 2**30))     # every raw upload held at once
TEMP_DIR_BYTES = int(os.environ.get(TEMP_DIR_BYTES_ENV, 2 * 2**30))         # Gradio's temp dir in all
RAW_UPLOAD_TTL_S = 600.0
TRIM_MIN_AGE_S = 60.0           # younger files (an export on its way to its visitor) are never trimmed


def temp_dir() -> Path:
    """Where Gradio keeps uploads and the files it serves (GRADIO_TEMP_DIR, else <tmp>/gradio)."""
    return Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")


@dataclass
class Held:
    network: str
    nbytes: int
    when: float
    paths: list = field(default_factory=list)       # empty while the upload is in flight


class RawUploads:
    """The raw upload route's files by network: `reserve` before a body is read (room made or a refusal
    by name), `arrived` with the paths Gradio answered, `sweep` deletes those past RAW_UPLOAD_TTL_S."""

    def __init__(self, max_bytes: int = RAW_UPLOAD_BYTES, ttl_s: float = RAW_UPLOAD_TTL_S,
                 clock: Callable[[], float] = time.monotonic, remove: Callable[[str], None] = os.remove):
        self.max_bytes, self.ttl_s, self.clock, self.remove = max_bytes, ttl_s, clock, remove
        self.lock = threading.Lock()
        self.held: list[Held] = []                  # oldest first

    def bytes_of(self, network: Optional[str] = None) -> int:
        with self.lock:
            return sum(h.nbytes for h in self.held if network is None or h.network == network)

    def reserve(self, network: str, nbytes: int) -> Held:
        """Room for an upload of `nbytes` from `network`, the heaviest network's oldest arrived files deleted
        where that makes it; else ValidationError naming the bound."""
        with self.lock:
            mine = sum(h.nbytes for h in self.held if h.network == network) + nbytes
            while sum(h.nbytes for h in self.held) + nbytes > self.max_bytes:
                by_network: dict[str, int] = {}
                for h in self.held:
                    by_network[h.network] = by_network.get(h.network, 0) + h.nbytes
                heaviest = max(by_network, key=by_network.get, default=None)
                oldest = next((h for h in self.held if h.network == heaviest and h.paths), None)
                if heaviest is None or heaviest == network or by_network[heaviest] <= mine or oldest is None:
                    free = self.max_bytes - sum(h.nbytes for h in self.held)
                    raise ValidationError("upload", f"{nbytes:,} bytes", f"room on the server's disk for uploads "
                                          f"({max(0, free):,} of {self.max_bytes:,} bytes free; files go "
                                          f"{self.ttl_s / 60:.0f} minutes after they arrive) — try again later")
                self._drop(oldest, "the disk bound for uploads, for a lighter network")
            held = Held(network, nbytes, self.clock())
            self.held.append(held)
            return held

    def arrived(self, held: Held, paths: list[str]) -> None:
        """The upload answered with `paths` (its files; counted at the declared size, which holds them and
        their multipart framing); no paths: it failed, and its room is freed."""
        with self.lock:
            if paths:
                held.paths = list(paths)
            else:
                self.held = [h for h in self.held if h is not held]

    def sweep(self) -> int:
        """Delete the files past their time -> how many uploads went. A reservation never answered (a dropped
        connection) goes as well."""
        now = self.clock()
        with self.lock:
            old = [h for h in self.held if now - h.when > self.ttl_s]
            for h in old:
                self._drop(h, "its time")
        return len(old)

    def _drop(self, held: Held, why: str) -> None:
        """(call under self.lock) Delete one upload's files and forget it."""
        for path in held.paths:
            try:
                self.remove(path)
            except OSError:
                pass
        self.held = [h for h in self.held if h is not held]
        log.info("raw upload of %s (%d bytes) deleted: %s", held.network, held.nbytes, why)


def dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def trim_dir(root: Path, max_bytes: int = TEMP_DIR_BYTES, min_age_s: float = TRIM_MIN_AGE_S) -> int:
    """Delete the oldest files under `root` older than `min_age_s` until it holds at most `max_bytes`
    -> bytes it holds after."""
    files, total, now = [], 0, time.time()
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            total += st.st_size
            files.append((st.st_mtime, st.st_size, path))
    for mtime, size, path in sorted(files):
        if total <= max_bytes or now - mtime < min_age_s:
            break
        try:
            os.remove(path)
            total -= size
        except OSError:
            pass
    return total


RAW_UPLOADS = RawUploads()


def start_sweeper(period_s: float = 10.0) -> threading.Thread:
    """Every `period_s` (app.py starts it once): raw uploads past their time deleted, the temp dir trimmed."""
    def loop():
        while True:
            time.sleep(period_s)
            try:
                RAW_UPLOADS.sweep()
                trim_dir(temp_dir())
            except Exception:           # the sweeper keeps going; the next pass retries
                log.exception("temp dir sweep failed")
    thread = threading.Thread(target=loop, name="temp-dir-sweep", daemon=True)
    thread.start()
    return thread
