"""Figures for lectures: every current figure as PNG (3x scale) or SVG through kaleido, sized for a
slide (16:9 by default) with tick labels of at least 16 px, and a lecture pack (a zip of every figure of
every tab, the configuration as JSON and a file of captions that describe each figure).

Figures are rebuilt from the settings (views are deterministic for a configuration and seed), so an
export is the same picture the page shows, in the lecture theme.
"""
from __future__ import annotations

import atexit
import functools
import io
import itertools
import json
import os
import shutil
import tempfile
import threading
import warnings
import zipfile
from pathlib import Path

import plotly.graph_objects as go

from . import timing, views
from .figures import lecture_theme
from .settings import Settings, ValidationError, to_query

FORMATS = ("png", "svg")
# slide shapes: (width, height) in layout pixels; "figure" keeps the figure's own size (1400 wide)
ASPECTS = {"16:9": (1600, 900), "4:3": (1440, 1080), "figure": None}
MIN_TICK_PX = 16


# figure name -> (view function, index of the figure in what it returns)
FIGURES = {
    "mask": (views.mask_view, 0),
    "kernels": (views.kernel_view, 0),
    "attention": (views.attention_view, 0),
    "query_row": (views.attention_view, 1),
    "anatomy_qk": (views.anatomy_view, 0),
    "anatomy_steps": (views.anatomy_view, 1),
    "anatomy_sum": (views.anatomy_view, 2),
    "isolation": (views.isolation_view, 0),
    "isolation_logits": (views.isolation_view, 1),
    "invariance": (views.invariance_view, 0),
    "rope_angles": (views.rope_view, 0),
    "rope_qk": (views.rope_view, 1),
    "variant": (views.variant_view, 0),
    "variant_loss": (views.variant_view, 1),
    "bug_zoo": (views.bug_zoo_view, 0),
    "timing": (timing.recorded_view, 0),
    "timing_memory": (timing.recorded_view, 1),
    "timing_speedup": (timing.recorded_view, 2),
}


def caption(s: Settings, name: str) -> str:
    """What the figure shows, in a sentence or two a slide can carry."""
    lay = (f"{s.num_user} user token(s), {s.num_history} history items and {s.num_candidates} candidates "
           f"(T = {s.seq_len})")
    head = f"head {max(s.head, 0)}" if s.head >= 0 else "every head"
    row = s.layout.token_labels()[s.query_position]
    return {
        "mask": f"Who may attend to whom over {lay}: rows are queries, columns keys; blue cells may attend. "
                f"Left the model's own mask '{s.mask_kind}', right '{s.compare}' for comparison; dashed lines "
                "separate user, history and candidates.",
        "kernels": f"The work production's attention kernels do over this layout (T = {s.seq_len}): tiles run in "
                   "full, run with a mask, skipped, and pairs computed that the mask hides.",
        "attention": f"Attention {s.values} of layer {s.layer}, {head}, from the model's own forward pass "
                     f"({s.weights} weights) over {lay}; colour scale {s.color}.",
        "query_row": f"The attention weights of query {row} in layer {s.layer}, {head}: one bar per key, "
                     "coloured by segment (user, history, candidate).",
        "anatomy_qk": f"Step 1 for query {row} (layer {s.layer}, {head}): the query vector and every key "
                      "vector after the rotary position embedding, one row each, one column per dimension.",
        "anatomy_steps": f"Steps 2–6 for query {row}: the dot product q·k per key, times the attention "
                         f"{'scale √128/key size' if s.family == 'xrex' else 'multiplier'} {s.attn_scale:.4g}, after the {s.cap_method} cap, with masked keys removed, and after the "
                         "softmax: the attention weights.",
        "anatomy_sum": f"Step 7 for query {row}: each key's value vector times its attention weight, and their "
                       "sum (last row), the head's output.",
        "isolation": f"How far the residual stream moves, per layer and position, when candidate {s.candidate} is "
                     f"perturbed ({s.perturbation}): under the '{s.mask_kind}' mask only its own column changes; "
                     "under a causal mask the change reaches later candidates.",
        "isolation_logits": f"The largest change in each candidate's action logits after perturbing candidate "
                            f"{s.candidate}, for the '{s.mask_kind}' mask and the causal mask.",
        "invariance": f"Each kept candidate's score change after '{s.operation}' on the candidate set, for each RoPE "
                      "position mode: zero means the score does not depend on the other candidates or its slot.",
        "rope_angles": f"The rotary embedding's angle (mod 2π) for each dimension pair and position (base "
                       f"{s.rope_base:g}, offset {s.rope_offset}): low pairs turn fast, high pairs slowly.",
        "rope_qk": "q·k for q = k = 1 after rotation, against the distance between the two positions: it depends "
                   "only on the distance, not on the absolute positions.",
        "variant": f"Attention weights of the '{s.variant}' variant from the course notebooks, trained on "
                   "associative recall; ticks are the tokens of one held-out example, the queried pair outlined.",
        "variant_loss": "Training loss of every attention variant on associative recall; the legend gives "
                        "each one's held-out accuracy.",
        "bug_zoo": f"Layer-0, head-0 attention weights of the {'production' if s.family == 'xrex' else 'grok.py'} trunk "
                   f"with the bug '{s.bug}' planted.",
        "timing": "Time per attention call, median with min-max bars over the repeats. ",
        "timing_memory": "Peak memory of one attention call above its inputs. ",
        "timing_speedup": "Speed-up of each backend over naive attention at the same T in the same run. ",
    }[name] + (timing.recorded_view(s)[3] if name.startswith("timing") else "")


def figure(s: Settings, name: str) -> go.Figure:
    if not isinstance(name, str) or name not in FIGURES:      # a list from an API client is unhashable
        raise ValidationError("figure", name, ", ".join(FIGURES))
    fn, index = FIGURES[name]
    return fn(s)[index]


def all_figures(s: Settings) -> dict[str, tuple[go.Figure, str]]:
    """name -> (figure, caption) for every view that draws from the model; each view runs once."""
    outputs = {}
    for name, (fn, index) in FIGURES.items():
        if fn not in outputs:
            outputs[fn] = fn(s)
    return {name: (outputs[fn][index], caption(s, name)) for name, (fn, index) in FIGURES.items()}


@functools.lru_cache(maxsize=None)
def _browser_found() -> bool:
    """kaleido's own search; without a browser its server thread dies and the export would hang."""
    from choreographer.browsers.chromium import Chromium
    path = Chromium.find_browser(skip_local=False)
    return bool(path) and os.access(path, os.X_OK)


def _kaleido_server() -> None:
    """Keep one headless chromium for every export: kaleido otherwise starts one per image (~5 s)."""
    import kaleido
    if hasattr(kaleido, "start_sync_server"):
        kaleido.start_sync_server(silence_warnings=True)


def check_aspect(aspect) -> None:
    if not isinstance(aspect, str) or aspect not in ASPECTS:
        raise ValidationError("aspect", aspect, ", ".join(ASPECTS))


def slide_figure(fig: go.Figure, aspect: str = "16:9") -> go.Figure:
    """The lecture theme at the slide's size, every tick label at least MIN_TICK_PX."""
    check_aspect(aspect)
    fig = lecture_theme(fig)
    size = ASPECTS[aspect]
    if size is not None:
        fig.update_layout(width=size[0], height=size[1])
    for key in list(fig.layout.to_plotly_json()):
        if key.startswith(("xaxis", "yaxis")):
            axis = fig.layout[key]
            axis.tickfont.size = max(axis.tickfont.size or 0, MIN_TICK_PX)
    for trace in fig.data:
        if getattr(trace, "colorbar", None) is not None and trace.type == "heatmap":
            trace.colorbar.tickfont.size = max(trace.colorbar.tickfont.size or 0, MIN_TICK_PX)
    return fig


def figure_bytes(fig: go.Figure, fmt: str, scale: float = 3, aspect: str = "16:9") -> bytes:
    check_format(fmt)
    check_aspect(aspect)
    if not _browser_found():
        raise ValueError("export: PNG/SVG export renders through kaleido, which needs a Chromium browser and "
                         "found none; install Debian's `chromium` (packages.txt does this on Spaces)")
    _kaleido_server()
    fig = slide_figure(fig, aspect)
    width = 1400 if fig.layout.width is None else fig.layout.width
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)    # "kopts ignored if using a server": expected
        return fig.to_image(format=fmt, scale=scale if fmt == "png" else 1, width=width,
                            height=fig.layout.height or 600)


def check_format(fmt) -> None:
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValidationError("format", fmt, ", ".join(FORMATS))


# Exports without an out_dir go to one folder per export under one root per process; making a new
# one removes all but the newest KEEP_EXPORTS. The app returns each file to Gradio, which copies it
# into its own cache (emptied by delete_cache) before the next export starts — exports run one at a
# time — so a few folders are always enough, and the disk holds a few exports, not every one.
KEEP_EXPORTS = 4
_export_lock = threading.Lock()
_export_count = itertools.count()


def export_root() -> Path:
    return Path(tempfile.gettempdir()) / f"explorer-exports-{os.getpid()}"


def new_export_folder() -> Path:
    root = export_root()
    with _export_lock:
        if not root.is_dir():
            root.mkdir()
            atexit.register(shutil.rmtree, root, True)
        older = sorted(root.iterdir())              # named by a counter: oldest first
        for folder in older[:max(0, len(older) - KEEP_EXPORTS + 1)]:
            shutil.rmtree(folder, ignore_errors=True)
        return Path(tempfile.mkdtemp(dir=root, prefix=f"{next(_export_count):012d}-"))


def export_figure(s: Settings, name: str, fmt: str, out_dir: str | None = None, aspect: str = "16:9") -> str:
    check_format(fmt)                   # before the figure's forward runs
    check_aspect(aspect)
    fig = figure(s, name)
    out = Path(out_dir) if out_dir else new_export_folder()
    path = out / f"{name}.{fmt}"
    path.write_bytes(figure_bytes(fig, fmt, aspect=aspect))
    return str(path)


def lecture_pack(s: Settings, out_dir: str | None = None, aspect: str = "16:9") -> str:
    """A zip: every figure as PNG and SVG, config.json (settings + URL query), captions.md."""
    check_aspect(aspect)
    figs = all_figures(s)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        captions = [f"# Attention explorer — lecture pack\n\nConfiguration: `?{to_query(s)}`\n"]
        for name, (fig, caption) in figs.items():
            for f in FORMATS:
                z.writestr(f"figures/{name}.{f}", figure_bytes(fig, f, aspect=aspect))
            captions.append(f"- **{name}**: {caption}")
        z.writestr("config.json", json.dumps({"settings": s.to_dict(), "query": to_query(s)}, indent=2))
        z.writestr("captions.md", "\n".join(captions) + "\n")
    out = Path(out_dir) if out_dir else new_export_folder()
    path = out / "lecture-pack.zip"
    path.write_bytes(buf.getvalue())
    return str(path)
