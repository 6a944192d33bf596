"""The page's contract with the figures (explorer.page_contract), checked from both sides in the default run
with no browser: every drawn view's figures write only what it declares, in the types and shapes the page
reads; the page's scripts read no key it does not declare, and every key it declares is read."""
import re
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from explorer import page_contract
from explorer.query_string import parse_query
from explorer.settings import VALUE_KINDS
from explorer.views import drawn_views

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
