"""Every handler's guard: what a visitor sent becomes settings (their own uploads), read once per event
where its admission read it (Read), every refusal a gr.Error naming its field, every message safe to show;
a bug is logged, never shown."""
from __future__ import annotations

import contextvars
import functools
import logging
import re
from dataclasses import dataclass
from typing import Mapping, Optional

import gradio as gr
import torch

from explorer import budget, runs
from explorer.query_string import parse_query
from explorer.limits import Cost, check_model_fits, device
from explorer.schema import Settings, ValidationError

from . import uploads

log = logging.getLogger("explorer")


try:  # Hugging Face ZeroGPU: heavy calls borrow a GPU when the Space has one
    import spaces
    gpu = spaces.GPU
except ImportError:
    def gpu(fn):
        return fn


MAX_MESSAGE_CHARS = 2000


def current_request():
    """The gr.Request of the event being answered (None in a direct call)."""
    from gradio.context import LocalContext
    return LocalContext.request.get(None)


def for_api_client() -> bool:
    """The event being answered comes from an API client (gradio_client and the JS client send
    x-gradio-user: api, MCP mcp; the page sends app), which shows messages as plain text."""
    return (getattr(current_request(), "headers", None) or {}).get("x-gradio-user") in ("api", "mcp")


def as_text(message: str) -> str:
    """A message for a toast, shown as the text it is. Gradio renders gr.Error / gr.Warning messages as
    (sanitised) HTML on the page, and messages echo what a visitor sent — a shared link's
    `?seed=<a href=...>` would become a link in someone else's toast, `<img src=...>` a request to an
    outside host. For the page (or an unknown caller) < and > become entities, so no element can
    start; API clients read the words as they are."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    return message if for_api_client() else message.replace("<", "&lt;").replace(">", "&gt;")


def as_markdown_text(text: str) -> str:
    """`text` (e.g. an uploaded file's name) inside a gr.Markdown value, shown literally: Markdown's
    punctuation backslash-escaped and < > as entities, so no link, image, element or code span can be
    made of it."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~])", r"\\\1", text[:MAX_MESSAGE_CHARS]).replace("<", "&lt;") \
        .replace(">", "&gt;")


_GUARDED = contextvars.ContextVar("guarded", default=False)


def guarded(fn):
    """No traceback reaches the page: the validation layer's refusals (ValidationError) become gr.Error
    with the field named, CUDA out-of-memory frees the caches, anything else — a bug — is logged with
    its traceback and answered "internal error (logged)". One guard per event: a guarded function called
    inside another (a page redraw calls the view endpoint) runs as it is, the outer guard answering. The
    time an event takes is charged once, by the queue (server.gradio_patches.charge_every_event)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _GUARDED.get():
            return fn(*args, **kwargs)
        token = _GUARDED.set(True)
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ValidationError as e:
            raise gr.Error(as_text(str(e)), print_exception=False) from None
        except budget.Abandoned:            # its requester has gone: Gradio answers no one; not a bug
            log.info("%s stopped: its requester has gone", fn.__name__)
            raise gr.Error("stopped: the page that asked for this has gone", print_exception=False) from None
        except torch.OutOfMemoryError:
            runs.clear_caches()
            raise gr.Error("out of GPU memory for this configuration; caches were freed — try a shorter "
                           "sequence or a smaller model", print_exception=False) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise gr.Error(f"{fn.__name__}: internal error (logged)", print_exception=False) from None
        finally:
            _GUARDED.reset(token)
    return wrapper


def session_of(request) -> str:
    """The visitor: Gradio's session hash (one per page load; gradio_client keeps one per Client)."""
    return getattr(request, "session_hash", None) or "api"


def settings_of(query: str, request=None, need_model: bool = True) -> Settings:
    """The validated settings of a query string, for the visitor who sent it (their own uploads).
    `need_model=False`: the layout and view options only (the mask view builds no model)."""
    session = session_of(request)
    try:
        return parse_query(query, uploaded=uploads.uploads(session), need_model=need_model)
    except ValidationError as e:
        why = uploads.forgotten(session, str(e.value).removeprefix("upload:")) if e.field == "weights" else None
        if why:
            raise ValidationError("weights", e.value, f"an upload the server still holds: these weights were "
                                  f"forgotten {why}; upload the file again") from None
        raise


@dataclass(frozen=True)
class Work:
    """What an event's admission found it will draw: the view (its tab name), the settings, the estimated
    FLOPs, and whether a view is drawn at all (`drawn`: False for no settings, a model this device does not
    run, settings past the budget)."""
    tab: str
    settings: Optional[Settings]
    flops: float
    drawn: bool


@dataclass(frozen=True)
class Read:
    """What an event's admission read of its inputs, kept on its request (server.lanes.admit_to writes
    `state.read`) so the handler draws from it instead of reading the inputs again: the settings drawn, each
    control's problem ({field: message}), the tab, and the view's estimated cost (None: no view drawn — the
    link unchanged, no model on this device, no drawn view — or settings past the budget, which the draw
    refuses by name). `inputs`: what was read; a handler takes the record only for those same inputs."""
    inputs: tuple
    settings: Settings
    problems: Mapping[str, str]
    tab: str
    cost: Optional[Cost]

    @property
    def flops(self) -> float:
        """The admission's work estimate (server.lanes: the lane, the visitor's share)."""
        return self.cost.flops if self.cost is not None else 0.0

    @property
    def drawn(self) -> bool:
        """Whether a view is drawn (as Work.drawn)."""
        return self.cost is not None


def admitted_read(request, inputs: tuple) -> Optional[Read]:
    """The Read this event's admission kept, when it read exactly `inputs`, else None (no admission: a direct
    call, a test; the handler then reads its inputs itself). An upload the settings name must still be held:
    one forgotten while the event waited is read again, and refused by name as before."""
    read = getattr(getattr(getattr(request, "request", None), "state", None), "read", None)
    if not isinstance(read, Read) or read.inputs != inputs:
        return None
    weights = read.settings.weights
    if weights.startswith("upload:") and weights.removeprefix("upload:") not in uploads.uploads(session_of(request)):
        return None
    return read


def model_limit(s: Settings) -> str:
    """'' when the model of `s` runs on this device, else why not (the field named), in one line."""
    try:
        check_model_fits(s)
    except ValidationError as e:
        return str(e)
    return ""


def limit_note(limit: str) -> str:
    return (f"⚠ **This model does not fit on {device().upper()}** — {limit}. The Mask tab still draws the layout; "
            "the model views wait for smaller settings." if limit else "")
