"""How many times an event reads its settings and estimates its view (issue 36, item 1): counters the tests of
the page's control change install (tests/test_server.py, tests/test_app.py)."""
from __future__ import annotations

import sys


def count_reads(monkeypatch) -> dict:
    """Count, from now on, every explorer.settings.parse_settings (however a module imported it), every
    server.endpoints.page_change (the reading of the page's controls and last link) and every
    explorer.views.View.estimate -> the counts, by those names (reset them with `counts.update`)."""
    from explorer import settings
    from explorer.views import records
    from server import endpoints
    counts = {"parse_settings": 0, "page_change": 0, "estimate": 0}

    def counted(name, original):
        def fn(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return fn
    for name, module in (("parse_settings", settings), ("page_change", endpoints)):
        original = getattr(module, name)
        for imported in list(sys.modules.values()):
            if getattr(imported, name, None) is original:
                monkeypatch.setattr(imported, name, counted(name, original))
    monkeypatch.setattr(records.View, "estimate", counted("estimate", records.View.estimate))
    return counts
