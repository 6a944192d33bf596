"""The Export tab's record: its title and the README's line. The app builds and wires the tab itself
(explorer.export draws what it offers from every other record's exports).
"""
from __future__ import annotations

from .records import View


VIEW = View(
    "export", "7 · Export",
    look_for="Look for: figures redrawn in the lecture theme at 16:9, with captions describing each one.",
    teaches="Any figure, previewed as its slide, as PNG (3×) or SVG in a lecture theme (large fonts, tick "
            "labels ≥ 16 px, colour-blind-safe palette, white background) at a slide shape (16:9 by default, "
            "4:3, or the figure's own), or a lecture pack: every figure this device can draw at the settings as "
            "PNG, SVG and the numbers drawn (`data/*.npz`), named for the preset, layer, head and row shown; "
            "captions generated from each figure's own settings; what was left out and why (a production model "
            "on a CPU); the configuration; and `lesson.html`, the lesson — both stories, each step's claim over "
            "the figure that shows it — then every figure at the settings, interactive in one file that needs "
            "no network (plotly.js inlined, ~6 MB at lecture).")
