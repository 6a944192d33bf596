"""What each view of the explorer shows: plain functions ``Settings -> (figures, text)``, one module per tab,
each holding its functions, its cost estimate, its exports' captions and its ``View`` record together.

They read the one recorded forward (explorer.runs.forward) and draw through explorer.figures; tests call them
without a browser, app.py only wires them to controls. This package gathers the records into ``VIEWS``, the
one list of tabs in tab order, and offers the names other modules use (each view's functions, the records'
types) as ``explorer.views.<name>``. What the views share lives in records.py (what a view is) and panels.py
(the heatmaps' mask, zoom and panels).
"""
from __future__ import annotations

from models.masks import KERNEL_TILINGS

from ..schema import ValidationError
from . import anatomy, attention, export, invariance_rope, isolation, mask, panels, records, timing, variants
# the names other modules and the tests use, each from its view's module
from .anatomy import anatomy_view, row_anatomy
from .attention import GRID_MAX_COLS, HEADS_ON_PAGE_CELLS, attention_values, attention_view, grid_heads
from .invariance_rope import FP32_TOLERANCE, changed_batch, invariance, invariance_view, rope_positions, rope_view
from .isolation import isolation_reading, isolation_view, verdict
from .mask import KERNEL_ORDER, kernel_view, mask_stats, mask_view
from .panels import SINGLE_MAX_CELLS, layout_mask, mask_dense, zoom_region
from .records import Export, Part, Plot, Text, View
from .variants import bug_zoo_view, variant_loss_figure, variant_training_report, variant_view

# the tabs, in the page's order
VIEWS: dict[str, View] = {v.name: v for v in (
    mask.VIEW, attention.VIEW, anatomy.VIEW, isolation.VIEW, invariance_rope.VIEW, variants.VIEW, timing.VIEW,
    export.VIEW)}


def drawn_views() -> list[View]:
    """The views with an endpoint of their own, in tab order."""
    return [v for v in VIEWS.values() if v.drawn]


def check_view(name, field: str = "view") -> View:
    """The record of tab `name`, or a refusal naming `field` (a link's or an event's `tab`, say)."""
    if not isinstance(name, str) or name not in VIEWS:          # a list from an API client is unhashable
        raise ValidationError(field, name, ", ".join(VIEWS))
    return VIEWS[name]
