"""The link codec: Settings as a URL query string and back. ``to_query`` writes only what differs from the
preset's values (the preset always first), so links stay short, and ``parse_query(to_query(s)) == s``;
``parse_query`` reads a link through explorer.settings' one validation layer. ``retired_note`` names the
fields an old link still carries, which parsing ignores.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Optional
from urllib.parse import parse_qsl, unquote_plus, urlencode

from .families import defaults, preset_family
from .limits import check_model_fits, limits_device
from .page_contract import LINK_WRITTEN
from .schema import Settings, ValidationError
from .settings import RETIRED_FIELDS, all_values, parse_settings


def retired_note(keys) -> str:
    """What an old link's retired fields were, and why they are ignored ('' when it has none)."""
    return "; ".join(f"{k}: ignored ({RETIRED_FIELDS[k]})" for k in sorted(set(keys) & RETIRED_FIELDS.keys()))


def to_query(s: Settings) -> str:
    """Only what differs from the preset, so links stay short; the preset always comes first, the views' own
    controls last (explorer.settings.view_controls)."""
    base = {**all_values(Settings()), **defaults(s.preset, s.family), "family": preset_family(s.preset)}
    diff = {k: val for k, val in all_values(s).items() if k != "preset" and val != base[k]}
    return urlencode({"preset": s.preset, **{k: link_value(val) for k, val in diff.items()}})


def link_value(val: Any) -> str:
    """A field's value as a link writes it."""
    return repr(val) if isinstance(val, float) else str(val)


def link_defaults() -> dict[str, str]:
    """{field: its default as a link writes it} for the fields the page writes into links itself
    (explorer.page_contract.LINK_WRITTEN; no preset sets these: tests/test_page_contract.py)."""
    return {f: link_value(getattr(Settings(), f)) for f in LINK_WRITTEN}


def parse_query(query: str, *, uploaded: Optional[Mapping[str, Mapping[str, Any]]] = None,
                need_model: bool = True) -> Settings:
    if not isinstance(query, str):
        raise ValidationError("query string", query, "text like 'preset=lecture&num_candidates=4'")
    if len(query) > 4000:
        raise ValidationError("query string", query, "at most 4000 characters")
    if "upload" in unquote_plus(query).lower():     # weights=upload:<name>: valid by this visitor's uploads
        return _parsed(query, uploaded, need_model)
    s = _parsed_before(query, limits_device())
    if need_model:
        check_model_fits(s)                 # each time: the model's limits are read when asked (max_params)
    return s


def _parsed(query: str, uploaded: Optional[Mapping[str, Mapping[str, Any]]], need_model: bool) -> Settings:
    pairs = parse_qsl(query.lstrip("?"), keep_blank_values=True)
    return parse_settings(dict(pairs), uploaded=uploaded, need_model=need_model)


# A query is read twice per event on a server (its admission estimates the view, then the view reads it), and
# the same lecture links again and again: ~0.5 ms each under load (py-spy, a kept lecture /mask: 6.9 ms of the
# server's CPU per event). Settings is frozen, so one reading serves every ask; its layout's bounds are the
# device's (`device`, a key: limits_of may set another); refusals are not kept (each is raised anew).
# PARSED_KEPT entries of at most 4,000 characters and a Settings each (a few MB at most).
PARSED_KEPT = 512


@functools.lru_cache(maxsize=PARSED_KEPT)
def _parsed_before(query: str, device: str) -> Settings:
    return _parsed(query, None, need_model=False)
