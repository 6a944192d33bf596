"""How many times an event reads its settings and estimates its view (issue 36, item 1): counters the tests of
the page's control change install (tests/test_server.py, tests/test_app.py)."""
from __future__ import annotations

import sys


def count_reads(monkeypatch) -> dict:
    """Count, from now on, every explorer.settings.parse_settings and explorer.query_string.parse_query (however a
    module imported them: parse_query answers a link it read before without a parse_settings), every
    server.endpoints.page_change (the reading of the page's controls and last link) and every
    explorer.views.View.estimate -> the counts, by those names (reset them with `counts.update`)."""
    from explorer import query_string, settings
    from explorer.views import records
    from server import endpoints
    counts = {"parse_settings": 0, "parse_query": 0, "page_change": 0, "estimate": 0}
    query_string._parsed_before.cache_clear()   # the counts do not hang on the links other tests read before

    def counted(name, original):
        def fn(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return fn
    for name, module in (("parse_settings", settings), ("parse_query", query_string), ("page_change", endpoints)):
        original = getattr(module, name)
        for imported in list(sys.modules.values()):
            if getattr(imported, name, None) is original:
                monkeypatch.setattr(imported, name, counted(name, original))
    monkeypatch.setattr(records.View, "estimate", counted("estimate", records.View.estimate))
    return counts
