"""Figures for lectures: every current figure as PNG (3x scale) or SVG through kaleido, and a lecture
pack (a zip of all figures, the configuration as JSON and a captions file).

Figures are rebuilt from the settings (views are deterministic for a configuration and seed), so an
export is the same picture the page shows, in the lecture theme.
"""
from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import plotly.graph_objects as go

from . import views
from .figures import lecture_theme
from .settings import Settings, to_query

FORMATS = ("png", "svg")


def all_figures(s: Settings) -> dict[str, tuple[go.Figure, str]]:
    """name -> (figure, caption) for every view that draws from the model."""
    mask, mask_text = views.mask_view(s)
    attn, row_bars, _ = views.attention_view(s)
    iso, iso_bars, iso_text = views.isolation_view(s)
    inv, _ = views.invariance_view(s)
    angle, qk, _ = views.rope_view(s)
    first_verdict = iso_text.split("\n\n")[0].strip("*")
    return {
        "mask": (mask, f"Attention mask '{views.own_mask_kind(s)}' beside '{s.compare}' (T = {s.seq_len}). "
                       "Blue: the query (row) may attend to the key (column)."),
        "attention": (attn, f"Attention {s.values} from the model's own forward ({s.weights} weights)."),
        "query_row": (row_bars, "Where one query's attention goes, coloured by segment."),
        "isolation": (iso, "Change in the residual stream after perturbing one candidate, "
                           "isolation mask vs causal mask."),
        "isolation_logits": (iso_bars, first_verdict),
        "invariance": (inv, f"Score change per candidate after '{s.operation}', for each RoPE mode."),
        "rope_angles": (angle, f"RoPE angle per dimension pair vs position (base {s.rope_base:g})."),
        "rope_qk": (qk, "q·k against relative distance under RoPE."),
    }


def figure_bytes(fig: go.Figure, fmt: str, scale: float = 3) -> bytes:
    if fmt not in FORMATS:
        raise ValueError(f"format: got {fmt!r}; allowed: {', '.join(FORMATS)}")
    fig = lecture_theme(fig)
    width = 1400 if fig.layout.width is None else fig.layout.width
    return fig.to_image(format=fmt, scale=scale if fmt == "png" else 1, width=width,
                        height=fig.layout.height or 600)


def export_figure(s: Settings, name: str, fmt: str, out_dir: str | None = None) -> str:
    figs = all_figures(s)
    if name not in figs:
        raise ValueError(f"figure: got {name!r}; allowed: {', '.join(figs)}")
    out = Path(out_dir or tempfile.mkdtemp(prefix="explorer-"))
    path = out / f"{name}.{fmt}"
    path.write_bytes(figure_bytes(figs[name][0], fmt))
    return str(path)


def lecture_pack(s: Settings, out_dir: str | None = None, fmt: str = "png") -> str:
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
    out = Path(out_dir or tempfile.mkdtemp(prefix="explorer-"))
    path = out / "lecture-pack.zip"
    path.write_bytes(buf.getvalue())
    return str(path)
