"""What a figure tells the page, declared once: the `meta` of a figure's layout and of its traces, which
static/page.js reads to redraw in the browser without asking the server (the colour scale, another query
row, layer, head or value kind of a one-head view, a click on a heatmap cell), and the figure text the page
rewrites as it redraws (FIGURE_TEXT). The figure builders write it (explorer.figures.heatmap_figure,
explorer.views.attention.query_meta, query_row_view); tests/test_page_contract.py checks every drawn view's
figures against it and that the page's scripts read no key it does not declare.

A spec is a dict of key -> type (or a nested spec, or [type] for a list of that type); a key absent from a
figure's meta is allowed (the page then asks the server), a key not declared is not."""
from __future__ import annotations

from typing import Any

OPTIONAL_NUMBER = (int, float, type(None))      # None: the colour scale's own range (plotly's autoscale)

# the colour a figure or one of its panels is drawn in: its title, its colour bar's title, its range
COLOUR = {"title": str, "bar": str, "zmin": OPTIONAL_NUMBER, "zmax": OPTIONAL_NUMBER}

# where the attention figure holds whole query rows and the bars' probabilities (page.js queryRow, layerPick,
# headPick, valuesPick): the bars' panel, the head chosen (-1: every head), the values shown, the first
# candidate's position (query -1) and per query row the keys its mask hides ('1') or not ('0')
QUERY = {"layer": int, "head": int, "selected": int, "values": str, "offset": int, "masked": [str]}

LAYOUT = {"colour": COLOUR, "query": QUERY}

# a heatmap panel: each row's first sequence position (a click picks it), its layer, head and value kind, whether
# the masked pairs are drawn over it, the format of its printed values and, in a one-head view, its own colour.
# A trace drawn over the panels (the masked pairs, page.js keeps them with the panel shown) says so in `overlay`.
TRACE = {"rows": [int], "layer": int, "head": int, "values": str, "masked": bool, "text": str, "colour": COLOUR,
         "overlay": str}


# the fields page.js writes into the link itself after drawing a change on the page (explorer.withParam), left out
# where they hold their default as the server's link leaves them out (explorer.query_string.to_query); app.py
# gives the page these defaults (explorer.query_string.link_defaults: explorer.linkDefaults), so the two links read
# the same
LINK_WRITTEN = ("query", "layer", "head", "values", "color")

# The figure text the page rewrites as it redraws (app.py gives it the page as explorer.figureText; the figure
# builders write it from here): a heatmap's hover shows the value under the pointer by `hover_raw` (z, a linear
# colour) or `hover_customdata` (the raw value kept in customdata, under a log or quantile colour: page.js
# colourUpdate swaps them); a panel's printed values are `cell_text` of its meta.text format; the query row's
# bars are titled `bars_title` (page.js drawQueryRow writes another row's, layer's or head's).
FIGURE_TEXT = {"hover_raw": "%{z:.6g}", "hover_customdata": "%{customdata:.6g}", "cell_text": "%{z:{format}}",
               "bars_title": "Where query {label} attends (layer {layer}, head {head})"}


def fill(template: str, **values) -> str:
    """A FIGURE_TEXT template with its {name}s set (as page.js explorer.fill does; the template's other braces,
    plotly's own, kept)."""
    for name, value in values.items():
        template = template.replace("{" + name + "}", str(value))
    return template


def problems(meta: Any, spec: dict, where: str) -> list[str]:
    """What in `meta` the spec does not allow, each naming where it is ('layout.meta.query.layer: ...')."""
    if not isinstance(meta, dict):
        return [f"{where}: got {type(meta).__name__}, a dict expected"]
    found = []
    for key, value in meta.items():
        at = f"{where}.{key}"
        if key not in spec:
            found.append(f"{at}: not declared in explorer.page_contract")
        elif isinstance(spec[key], dict):
            found += problems(value, spec[key], at)
        elif isinstance(spec[key], list):
            if not isinstance(value, (list, tuple)):
                found.append(f"{at}: got {type(value).__name__}, a list expected")
            else:
                found += [f"{at}[{i}]: got {type(v).__name__}" for i, v in enumerate(value)
                          if not _is(v, spec[key][0])]
        elif not _is(value, spec[key]):
            found.append(f"{at}: got {type(value).__name__} {value!r}")
    return found


def _is(value: Any, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))   # a bool is no int to the page


def figure_problems(fig) -> list[str]:
    """Every problem of a plotly figure's meta, its layout's and each trace's."""
    found = problems(fig.layout.meta, LAYOUT, "layout.meta") if fig.layout.meta is not None else []
    for i, trace in enumerate(fig.data):
        if trace.meta is not None:
            found += problems(trace.meta, TRACE, f"data[{i}].meta")
    return found


def declared_keys() -> set[str]:
    """Every key name the contract declares, at any depth."""
    def keys(spec: dict) -> set[str]:
        return set(spec) | {k for v in spec.values() if isinstance(v, dict) for k in keys(v)}
    return keys(LAYOUT) | keys(TRACE)
