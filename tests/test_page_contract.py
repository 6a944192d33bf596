"""The page's contract with the figures (explorer.page_contract), checked from both sides in the default run
with no browser: every drawn view's figures write only what it declares, in the types and shapes the page
reads; the page's scripts read no key it does not declare, and every key it declares is read. And the rules the
page computes itself for speed (static/page.js: Python's number formats, explorer.figures.ColourScale) against
the server's on the same cases, page.js alone in a blank Chromium page (no app)."""
import re
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from explorer import page_contract
from explorer.query_string import parse_query
from explorer.settings import VALUE_KINDS
from explorer.views import VIEWS, drawn_views

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = [ROOT / "static" / "page.js", ROOT / "static" / "present.js"]

LINKS = ["preset=lecture", "preset=lecture&head=1", "preset=lecture&head=2&values=capped+logits&layer=1",
         "preset=lecture&head=1&color=log&query=4", "preset=lecture&zoom=candidates",
         "preset=lecture&head=-1&values=masked+logits", "preset=phoenix-2026-nano&head=3"]


def figures(link: str) -> list:
    s = parse_query(link)
    return [(view.name, s, out) for view in drawn_views() for out in view.draw(s) if isinstance(out, go.Figure)]


@pytest.mark.parametrize("link", LINKS)
def test_every_drawn_figure_writes_only_what_the_page_contract_declares(link):
    for name, s, fig in figures(link):
        assert page_contract.figure_problems(fig) == [], (name, link)
        query = (fig.layout.meta or {}).get("query")
        if query:           # a mask row per sequence position, of a '0' or '1' per key
            assert len(query["masked"]) == s.seq_len and all(len(r) == s.seq_len and set(r) <= {"0", "1"}
                                                             for r in query["masked"]), (name, link)
            assert query["values"] in VALUE_KINDS and -1 <= query["selected"] < s.num_q_heads
            assert 0 <= query["layer"] < s.num_layers and 0 <= query["offset"] < s.seq_len
        for trace in fig.data:
            meta = trace.meta or {}
            if "rows" in meta:  # each row's first sequence position, in order
                assert len(meta["rows"]) == np.asarray(trace.z).shape[0] and meta["rows"] == sorted(meta["rows"])
                assert all(0 <= r < s.seq_len for r in meta["rows"]), (name, link)
            if "values" in meta:
                assert meta["values"] in VALUE_KINDS
            if "overlay" in meta:
                assert meta["overlay"] == "masked"


def test_a_key_the_contract_does_not_declare_is_named_where_it_is():
    fig = go.Figure(go.Heatmap(z=[[1]], meta={"rows": [0], "rowz": [0]}),
                    layout=dict(meta={"query": {"layer": "1", "head": 0}}))
    assert page_contract.figure_problems(fig) == ["layout.meta.query.layer: got str '1'",
                                                  "data[0].meta.rowz: not declared in explorer.page_contract"]
    assert page_contract.problems({"masked": [True]}, page_contract.TRACE, "m") == \
        ["m.masked: got list [True]"]
    assert page_contract.problems({"rows": [0, True]}, page_contract.TRACE, "m") == ["m.rows[1]: got bool"]


def test_the_pages_scripts_read_what_the_contract_declares_and_nothing_else():
    source = "\n".join(p.read_text() for p in SCRIPTS)
    read = set(re.findall(r"\bmeta\.(\w+)", source)) | set(re.findall(r"\bquery\.(\w+)", source))
    assert read - page_contract.declared_keys() == set()
    assert page_contract.declared_keys() - read == set()       # no key declared for nothing


@pytest.mark.parametrize("link", LINKS)
def test_the_figure_text_the_page_rewrites_is_written_as_the_contract_declares(link):
    """page_contract.FIGURE_TEXT, the figure's own text page.js rewrites as it redraws (the hover's value, a panel's
    printed values, the query row's bars' title), against every drawn figure: a heatmap the page may recolour (one
    of a figure whose layout meta holds its colour) shows its value by exactly one of the two hover forms
    (customdata's where it keeps the raw values), its printed values in its meta.text format, and the attention
    view's bars are titled from the template."""
    from dataclasses import replace
    text = page_contract.FIGURE_TEXT
    hovers = (text["hover_raw"], text["hover_customdata"])
    recoloured = [(name, fig) for name, _, fig in figures(link) if "colour" in (fig.layout.meta or {})]
    assert recoloured, link
    for name, fig in recoloured:
        for trace in fig.data:
            meta = trace.meta or {}
            if trace.type != "heatmap" or "rows" not in meta:
                continue
            assert [h for h in hovers if h in trace.hovertemplate] == \
                [hovers[trace.customdata is not None]], (name, link, trace.hovertemplate)
            if meta.get("text") and trace.texttemplate:
                assert trace.texttemplate == page_contract.fill(text["cell_text"], format=meta["text"]), (name, link)
    s = parse_query(link)
    if "query" in (VIEWS["attention"].draw(s)[0].layout.meta or {}):
        head = max(s.head, 0)
        _, bars, _ = VIEWS["attention"].draw(replace(s, head=head) if s.head < 0 else s)
        assert bars.layout.title.text.startswith(page_contract.fill(
            text["bars_title"], label=s.layout.token_labels()[s.query_position], layer=s.layer, head=head)), link


def test_the_pages_scripts_hold_no_copy_of_the_figure_text():
    """The figure text page.js rewrites comes from page_contract.FIGURE_TEXT (app.py: explorer.figureText), not from
    a copy in the scripts: no template's fixed text appears in them. page.js held the hover forms and the bars'
    title as its own regular expressions."""
    source = "\n".join(p.read_text() for p in SCRIPTS)
    for key, template in page_contract.FIGURE_TEXT.items():
        fixed = [part for part in re.split(r"\{\w+\}", template) if len(part) > 3]
        assert not any(part in source for part in fixed), key
    assert ".6g" not in source and "Where query" not in source


# --- the rules the page computes itself, against the server's on the same cases ---------------------------

def page_scripts(playwright):
    """A blank page holding static/page.js alone (no app, no server) and what app.py gives it (the field order,
    the written fields' defaults): its functions to evaluate."""
    import json

    from explorer.controls import CONTROL_FIELDS
    from explorer.query_string import link_defaults
    from harness.localhost import launch_browser
    browser = launch_browser(playwright)
    page = browser.new_page()
    page.set_content("<html><body></body></html>")
    page.add_script_tag(content=f"window.explorer = {{fields: {json.dumps(CONTROL_FIELDS)}, "
                                f"linkDefaults: {json.dumps(link_defaults())}, "
                                f"figureText: {json.dumps(page_contract.FIGURE_TEXT)}}};")
    page.add_script_tag(content=(ROOT / "static" / "page.js").read_text())
    return browser, page


@pytest.mark.browser
def test_the_page_writes_a_link_as_the_server_does():
    """A change the page draws itself moves the link in the browser (explorer.withParam): for every preset and
    links holding other values, each field the page writes (page_contract.LINK_WRITTEN) set to each of several
    values gives explorer.query_string.to_query's link, byte for byte (order, defaults left out); page.js and
    app.py's snippets write no other field."""
    from dataclasses import replace

    from playwright.sync_api import sync_playwright

    import app
    from explorer.query_string import to_query
    from explorer.settings import COLOR_SCALES
    from models.presets import PRESETS
    values = {"query": [-1, 0, 3, 7], "layer": [0, 1], "head": [-1, 0, 2], "values": list(VALUE_KINDS),
              "color": list(COLOR_SCALES)}
    assert set(values) == set(page_contract.LINK_WRITTEN)
    links = [f"preset={p}" for p in PRESETS] + ["preset=lecture&seed=3&num_candidates=5&head=2&color=log&query=4",
                                                "preset=phoenix-2026-nano&layer=1&values=capped+logits"]
    cases = [(to_query(s), f, v, to_query(replace(s, **{f: v})))
             for s in (parse_query(link, need_model=False) for link in links) for f, vs in values.items() for v in vs]
    with sync_playwright() as p:
        browser, page = page_scripts(p)
        try:
            got = page.evaluate("cases => cases.map(([q, f, v]) => explorer.withParam(q, f, String(v)))", cases)
        finally:
            browser.close()
    assert [(q, f, v, want, g) for (q, f, v, want), g in zip(cases, got) if g != want] == []
    scripts = (ROOT / "static" / "page.js").read_text() + "".join(v for v in vars(app).values() if isinstance(v, str))
    written = set(re.findall(r"withParam\(q, '(\w+)'", scripts)) | set(re.findall(r"drawnOrServer\([^;]*?'(\w+)', \w+, q\)", scripts))
    assert written and written <= set(page_contract.LINK_WRITTEN), written


def colour_cases() -> list:
    """Value sets a heatmap holds: probabilities (many zeros, a few large), logits of both signs, a constant
    panel, one with NaN gaps, float32 values printed at ties (1/32), a long skewed one."""
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.full(40, 0.2), size=6).astype(np.float32).ravel()
    logits = (rng.standard_normal(300) * 7).astype(np.float32)
    gaps = logits.copy()
    gaps[::7] = np.nan
    ties = np.array([1 / 32, 3 / 32, 0.125, -0.375, 0.0, 2.5, -1 / 64], np.float32)
    skewed = np.concatenate([rng.exponential(1e-3, 2000), [0.9, 0.5]]).astype(np.float32)
    return [probs, logits, np.full(12, 0.25, np.float32), gaps, ties, skewed]


@pytest.mark.browser
def test_the_pages_number_formats_print_as_pythons_format_does():
    """explorer.fmtG and fmtF (page.js) against format(v, '.Ng') and format(v, '.Nf') on the same values, ties
    of float32 weights among them (Python rounds a tie to the even digit, JS's toFixed away from zero)."""
    from playwright.sync_api import sync_playwright
    rng = np.random.default_rng(11)
    values = [float(v) for v in np.concatenate([
        (rng.standard_normal(200) * 10.0 ** rng.integers(-7, 8, 200)),
        np.float32(rng.standard_normal(100)).astype(np.float64),
        [k / 32 for k in range(-40, 41)], [0.5, 1.5, 2.5, 0.125, 0.0625, 1e-5, 123456.5, 999999.5, 1e16, -0.0005]])]
    cases = [(v, d) for v in values for d in (2, 3, 4, 6)]
    with sync_playwright() as p:
        browser, page = page_scripts(p)
        try:
            g, f = page.evaluate("cases => [cases.map(([v, d]) => explorer.fmtG(v, d)), "
                                 "cases.map(([v, d]) => explorer.fmtF(v, d))]", cases)
        finally:
            browser.close()
    assert [(v, d, s) for (v, d), s in zip(cases, g) if s != format(v, f".{d}g")] == []
    assert [(v, d, s) for (v, d), s in zip(cases, f) if s != format(v, f".{d}f")] == []


@pytest.mark.browser
@pytest.mark.parametrize("kind", ["linear", "log", "quantile"])
def test_the_pages_colour_scale_fits_and_ticks_as_the_servers(kind):
    """explorer.colourScale (page.js, a recolour drawn on the page) against explorer.figures.ColourScale on the
    same values: the range, the colour bar's ticks and their text, the note, and each value's colour coordinate
    (within float32 rounding where the server stores float32 ranks; one libm's log10 against another's: 4 ulp)."""
    from types import SimpleNamespace

    from playwright.sync_api import sync_playwright

    from explorer.figures import ColourScale
    cases = colour_cases()
    with sync_playwright() as p:
        browser, page = page_scripts(p)
        try:
            pages = page.evaluate("""([kind, cases]) => cases.map((vs) => {
                const s = explorer.colourScale(kind, vs.map((v) => (v === null ? NaN : v)), null, null);
                return {lo: s.lo, hi: s.hi, tickvals: s.tickvals || null, ticktext: s.ticktext || null, note: s.note,
                        coords: s.transform ? vs.map((v) => (v === null ? null : s.transform(v))) : null};
            })""", [kind, [[None if np.isnan(v) else float(v) for v in z] for z in cases]])
        finally:
            browser.close()
    for z, got in zip(cases, pages):
        scale = ColourScale.fit([SimpleNamespace(z=z)], kind)
        bar = scale.colorbar("t")
        np.testing.assert_allclose([got["lo"], got["hi"]], [scale.lo, scale.hi], rtol=4e-16 * 4, atol=0)
        assert got["note"] == scale.note()
        assert got["ticktext"] == bar.get("ticktext")
        if bar.get("tickvals") is not None:
            rtol = 2.0 ** -24 if kind == "quantile" else 4e-16 * 4
            np.testing.assert_allclose(got["tickvals"], bar["tickvals"], rtol=rtol, atol=0)
        if scale.kind == "linear":
            assert got["coords"] is None
        else:
            want = scale.transform(z.astype(np.float64))
            coords = np.array([np.nan if c is None else c for c in got["coords"]])
            assert np.array_equal(np.isnan(coords), np.isnan(want))
            rtol = 2.0 ** -24 if kind == "quantile" else 4e-16 * 4
            np.testing.assert_allclose(coords[~np.isnan(coords)], want[~np.isnan(want)], rtol=rtol, atol=0)


QUERY_ROW_LINKS = ["preset=lecture&head=1", "preset=lecture&head=-1", "preset=lecture&head=2&layer=1&seed=3",
                   "preset=lecture&family=xrex&head=1", "preset=lecture&head=0&num_candidates=5&num_history=6"]


@pytest.mark.browser
def test_the_page_draws_a_query_row_as_the_server_does():
    """explorer.drawQueryRow (page.js: a query row picked where the attention figure holds every row) against
    explorer.views.attention.query_row_view at the same settings, from the figures the server sends: the bars'
    weights, their title and the sentence under them (the top three keys, ties in position order, and the weight
    over masked keys), for the first candidate (-1) and positions across user, history and candidates."""
    from dataclasses import replace

    from playwright.sync_api import sync_playwright

    from explorer.views import VIEWS
    from explorer.views.attention import query_row_view
    cases = []
    for link in QUERY_ROW_LINKS:
        s = parse_query(link)
        fig, bars, _ = VIEWS["attention"].draw(s)
        assert (fig.layout.meta or {}).get("query"), link               # the page holds this figure's rows
        bar_head = max(s.head, 0)
        for q in (-1, 0, s.candidate_start_offset - 1, s.seq_len - 1):
            want_bars, want_text = query_row_view(replace(s, query=q), s.layer, bar_head)
            cases.append(dict(link=link, fig=fig.to_json(), bars=bars.to_json(), q=q, y=[float(v) for v in want_bars.data[0].y],
                              title=want_bars.layout.title.text, text=want_text.replace("**", "")))
    with sync_playwright() as p:
        browser, page = page_scripts(p)
        try:
            got = page.evaluate("""(cases) => cases.map((c) => {
                document.body.innerHTML = '<div id="attention-plot"><div class="js-plotly-plot" style="width:9px;height:9px"></div></div>'
                    + '<div id="query-bars-plot"><div class="js-plotly-plot"></div></div><div id="query-text"></div>';
                const gd = document.querySelector('#attention-plot .js-plotly-plot');
                const bars = document.querySelector('#query-bars-plot .js-plotly-plot');
                Object.assign(gd, JSON.parse(c.fig));
                Object.assign(bars, JSON.parse(c.bars));
                let y = null, title = null;
                window.Plotly = {relayout: () => {}, update: (el, data, layout) => {
                    if (el === bars) { y = data.y[0]; title = layout['title.text']; } }};
                const pos = explorer.drawQueryRow(c.q);
                return {pos, y: y && Array.from(y), title, text: document.querySelector('#query-text').textContent};
            })""", cases)
        finally:
            browser.close()
    for c, g in zip(cases, got):
        where = (c["link"], c["q"])
        assert g["pos"] is not None, where
        assert g["y"] == c["y"], where
        assert g["title"] == c["title"] and g["text"] == c["text"], where
