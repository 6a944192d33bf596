"""Figures for lectures: every current figure as PNG (3x scale) or SVG through kaleido, and a lecture
pack (a zip of all figures, the configuration as JSON and a captions file).

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


# figure name -> (view function, index of the figure in what it returns)
FIGURES = {
    "mask": (views.mask_view, 0),
    "kernels": (views.kernel_view, 0),
    "attention": (views.attention_view, 0),
    "query_row": (views.attention_view, 1),
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
    return {
        "mask": f"Attention mask '{s.mask_kind}' beside '{s.compare}' (T = {s.seq_len}). "
                "Blue: the query (row) may attend to the key (column).",
        "kernels": f"The work production's attention kernels do over this layout (T = {s.seq_len}): tiles run in "
                   "full, run with a mask, skipped, and pairs computed that the mask hides.",
        "attention": f"Attention {s.values} from the model's own forward ({s.weights} weights).",
        "query_row": "Where one query's attention goes, coloured by segment.",
        "isolation": "Change in the residual stream after perturbing one candidate, isolation mask vs causal mask.",
        "isolation_logits": views.verdict(views.isolation_probe(s)),
        "invariance": f"Score change per candidate after '{s.operation}', for each RoPE mode.",
        "rope_angles": f"RoPE angle per dimension pair vs position (base {s.rope_base:g}).",
        "rope_qk": "q·k against relative distance under RoPE.",
        "variant": f"Attention weights of the '{s.variant}' variant from the course notebooks, trained on "
                   "associative recall; ticks are the tokens of one held-out example.",
        "variant_loss": "Training loss of every attention variant on associative recall; the legend gives "
                        "each one's held-out accuracy.",
        "bug_zoo": f"Layer-0 attention of the {'production' if s.family == 'xrex' else 'grok.py'} trunk with the "
                   f"bug '{s.bug}' planted.",
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


def figure_bytes(fig: go.Figure, fmt: str, scale: float = 3) -> bytes:
    check_format(fmt)
    if not _browser_found():
        raise ValueError("export: PNG/SVG export renders through kaleido, which needs a Chromium browser and "
                         "found none; install Debian's `chromium` (packages.txt does this on Spaces)")
    _kaleido_server()
    fig = lecture_theme(fig)
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


def export_figure(s: Settings, name: str, fmt: str, out_dir: str | None = None) -> str:
    check_format(fmt)                   # before the figure's forward runs
    fig = figure(s, name)
    out = Path(out_dir) if out_dir else new_export_folder()
    path = out / f"{name}.{fmt}"
    path.write_bytes(figure_bytes(fig, fmt))
    return str(path)


def lecture_pack(s: Settings, out_dir: str | None = None) -> str:
    """A zip: every figure as PNG and SVG, config.json (settings + URL query), captions.md."""
    figs = all_figures(s)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        captions = [f"# Attention explorer — lecture pack\n\nConfiguration: `?{to_query(s)}`\n"]
        for name, (fig, caption) in figs.items():
            for f in FORMATS:
                z.writestr(f"figures/{name}.{f}", figure_bytes(fig, f))
            captions.append(f"- **{name}**: {caption}")
        z.writestr("config.json", json.dumps({"settings": s.to_dict(), "query": to_query(s)}, indent=2))
        z.writestr("captions.md", "\n".join(captions) + "\n")
    out = Path(out_dir) if out_dir else new_export_folder()
    path = out / "lecture-pack.zip"
    path.write_bytes(buf.getvalue())
    return str(path)
