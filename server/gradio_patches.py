"""Where the app meets Gradio's internals: what its session state keeps (no deep-link copy, no output
values), its queue's analytics, its matplotlib probe, and a file input that names what it refuses.
tests/test_app.py fails if the internals these touch move."""
from __future__ import annotations

import os
import sys

import gradio as gr
from gradio.data_classes import FileData
from gradio_client.utils import is_file_obj_with_meta
from pydantic import model_validator

from .admission import QUEUE_MAX


class UploadedFile(FileData):
    """FileData that lets a value which is no uploaded file through as an empty path: pydantic would
    wrap any error raised here (gr.Error is a ValueError) into Gradio's generic message. A dict
    without Gradio's `meta` marker is no uploaded file either (Gradio would refuse it in words that
    reach an API client as a blank error)."""
    @model_validator(mode="before")
    @classmethod
    def anything_else_as_empty_path(cls, value):
        if isinstance(value, FileData) or is_file_obj_with_meta(value):
            return value
        return {"path": "", "orig_name": str(value)[:200], "meta": {"_type": "gradio.FileData"}}


class NotAFile(str):
    """What the weights file input holds when it was sent no file it takes: the value sent (as text), and
    what is allowed (`why`), for upload_endpoint's message."""

    def __new__(cls, sent, why: str):
        text = super().__new__(cls, str(sent))
        text.why = why
        return text


def weights_file(**kw) -> gr.File:
    """A file input that answers anything but an uploaded file (e.g. a server-side path string from an
    API client) with "weights file: got ...; allowed: ..." instead of Gradio's generic error."""
    upload = gr.File(**kw)
    upload.data_model = UploadedFile
    preprocess = upload.preprocess

    def uploaded_only(payload):
        # no exception here: the upload lane's admission check preprocesses the inputs too, and an
        # exception there would reach the visitor as a bare HTTP 400; upload_endpoint names the field
        if isinstance(payload, FileData) and not payload.path:
            return NotAFile(payload.orig_name, "a .npz or .safetensors file uploaded through the page or "
                            "gradio_client.handle_file")
        try:
            return preprocess(payload)
        except gr.Error:                # Gradio's own check (a file type outside file_types)
            name = getattr(payload, "orig_name", None) or os.path.basename(str(getattr(payload, "path", "")))
            return NotAFile(name, "a .npz or .safetensors file (never pickle)")
    upload.preprocess = uploaded_only
    return upload


# What Gradio keeps per session: a copy of the page's config (~230 KB, built in ~11 ms on the event
# loop for every new session hash) and, by default, the last value of every output (the figures: 17 MB
# for a heavy mask, 346 MB for a zoomed grid), for 10,000 sessions and an hour after a page closes —
# outside every ceiling of ours, and a client mints a session per call. Both serve only deep links
# (/gradio_api/deep_link), which this app does not offer (the address bar carries the settings), so
# neither is kept, and at most server.admission.SESSION_CAPACITY sessions are (oldest dropped first: its page
# keeps working, the next event of it starts a fresh state).


def keep_outputs_out_of_session_state() -> None:
    """Gradio's SessionState builds a deep-link copy of every component's config when a session
    starts and copies each output's value into it: the copy starts empty, and values go nowhere (the
    one other place, with watch_lanes, that touches Gradio's internals; tests/test_app.py fails if
    they move)."""
    from gradio.state_holder import SessionState
    make = SessionState.__init__
    if getattr(make, "without_deep_link_config", False):
        return

    def init(self, blocks):
        make(self, _NoDeepLinkConfig(blocks))
    init.without_deep_link_config = True
    SessionState.__init__ = init
    SessionState._update_value_in_config = lambda self, key, value: None


def skip_queue_analytics(demo: gr.Blocks) -> None:
    """After every event Gradio's queue rebuilds a pandas summary of the last 10,000 events (8-13 ms
    holding the GIL, measured; 6 % of the server's GIL time in the soak) for its monitoring dashboard,
    which this app does not open. It is never rebuilt, and the queue keeps only the last QUEUE_MAX
    events' records (each names the session it came from). Gradio reads both from its environment
    (GRADIO_ANALYTICS_CACHE_FREQUENCY, GRADIO_ANALYTICS_MAX_EVENTS) when the queue is made; set here
    on the queue itself, so a run with other settings in its environment gets the same server."""
    demo._queue.ANAYLTICS_CACHE_FREQUENCY = sys.maxsize        # (sic) Gradio's spelling
    demo._queue.ANALYTICS_MAX_EVENTS = QUEUE_MAX


def skip_absent_matplotlib() -> None:
    """Gradio tries `import matplotlib` on entering and leaving every event (to switch its backend).
    Where it is not installed, each try searches sys.path again, on the event loop: marking it absent
    once makes each try a dictionary lookup."""
    import importlib.util
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        sys.modules["matplotlib"] = None


class _NoDeepLinkConfig:
    """The Blocks as SessionState sees them, with no component to build a deep-link config of (it
    builds one for each component also in `blocks.blocks`)."""
    blocks: dict = {}

    def __init__(self, blocks):
        self._blocks = blocks

    def __getattr__(self, name):
        return getattr(self._blocks, name)
