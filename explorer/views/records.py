"""What a view is, as the registry (explorer.views.VIEWS) records it: a ``View`` (a tab: its title, the
README's line, its controls, its parts and their outputs, its cost), each ``Part`` (a function of the settings
and what it returns), each output (``Plot``, ``Text``) and each ``Export`` a Plot gives the Export tab and the
lecture pack. ``View.draw`` runs a view's parts within this device's budget (explorer.budget). Also what
several views share in their records: the recorded forward's cost and the words their captions use.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

from .. import budget
from ..figures import Figure
from ..limits import FIGURE_PEAK_BYTES, Cost, check_budget, forward_cost, model_bytes
from ..schema import Settings

# Everything that lists views reads VIEWS: the page's tabs and their outputs (app.py), the API's
# endpoints and the admission's cost estimates (server/), the exported figures (explorer/export.py), the
# lesson's and presentation mode's main figure (explorer/lesson.py), the README's view table
# (scripts/readme_tables.py). Adding a view: a module of its own in explorer/views/ holding its function,
# its record and its own controls (each a Control in its record's `controls`: parsed, linked, labelled, built on
# its tab and kept out of the model's cache key from that record alone), named in explorer/views/__init__.py.

def _same(s: Settings) -> Settings:
    return s


@dataclass(frozen=True)
class Export:
    """A figure the Export tab and the lecture pack draw from a Plot: its name; what it shows of the
    settings (`facts`, each in the words its title uses: 'layer 0', 'query head 1', 'query C2'; file
    names and captions are made of them); its caption, a sentence or two a slide can carry, from
    (the settings drawn, their facts, the settings chosen); and the settings it is drawn with (`adjust`:
    e.g. the bug zoo plants a bug when none is chosen)."""
    name: str
    caption: Callable[[Settings, dict, Settings], str]
    facts: Callable[[Settings], dict] = lambda s: {}
    adjust: Callable[[Settings], Settings] = _same
    title: str = ""             # what a lecturer calls it, where its Plot's label does not say (a zoom)


@dataclass(frozen=True)
class Plot:
    """A figure a view returns: its label on the page, its element id (the page's scripts and the lesson
    find it by this), and the exports drawn from it."""
    label: str
    elem_id: str | None = None
    exports: tuple[Export, ...] = ()
    show_label: bool = False    # the figure's own title names it: a label badge would sit over that title


@dataclass(frozen=True)
class Text:
    """A Markdown text a view returns; `lead`: shown above its part's figures."""
    elem_id: str | None = None
    lead: bool = False


@dataclass(frozen=True)
class Part:
    """One function of the view's settings and the outputs it returns, in order. `model`: it runs the
    sidebar's ranking model (so an export of it needs the model to fit this device)."""
    draw: Callable[[Settings], tuple]
    outputs: tuple
    model: bool = False


@dataclass(frozen=True)
class View:
    """A tab of the page. A drawn view (`cost` given) is also an API endpoint (/<name>) taking the
    configuration as a query string and returning every part's outputs in order; the app builds its tab
    from `controls` (in a row: the view's own, each a Control declared in its module, and shared Settings
    fields by name) and `outputs`. A tab without `cost` (timing, export) is
    built and wired by the app itself; its parts, if any, are what its exports draw."""
    name: str                   # the tab's id, the endpoint's api_name, the link's tab=
    title: str                  # the tab's title
    look_for: str               # the line under the title
    teaches: str                # the README's line: what it shows
    parts: tuple = ()
    cost: Optional[Callable[[Settings], Cost]] = None   # its estimated work and memory, figures excluded
    controls: tuple = ()        # the tab's controls: its own (explorer.schema.Control), shared fields' names
    needs_model: bool = True    # False: drawn for any layout, building no model (the mask)
    gpu: bool = False           # borrows a ZeroGPU device for each call

    @property
    def outputs(self) -> tuple:
        return tuple(o for p in self.parts for o in p.outputs)

    @property
    def drawn(self) -> bool:
        return self.cost is not None

    @property
    def main(self) -> Optional[str]:
        """The figure presentation mode and the lesson show first (its elem_id)."""
        return next((o.elem_id for o in self.outputs if isinstance(o, Plot)), None)

    def estimate(self, s: Settings) -> Cost:
        """What one request costs: the parts' work and memory, every figure on its way out, the model."""
        return _estimated(self, s)

    def draw(self, s: Settings, cost: Optional[Cost] = None, elsewhere: Optional[Callable[[], tuple]] = None) -> tuple:
        """Every output, refused by name past this device's budget and run once its memory fits. `cost`:
        this view's estimate for `s` where the caller made it already (the server's admission), not made
        again. A view is a function of its settings: drawn once per settings while memory allows (DRAWN),
        its figures frozen and shared — a class on one lecture step asks for the same views again and
        again, and thirty asking at once wait for one drawing. `elsewhere()`: the outputs drawn, frozen,
        by another process (server.drawing), kept here the same way."""
        checked = check_budget(s, self.name, self._estimate(s, cost))
        return DRAWN.get((self, s), elsewhere or (lambda: _frozen(budget.within_budget(
            checked, lambda: tuple(out for p in self.parts for out in p.draw(s))))), keep=_shareable)

    def kept(self, s: Settings, max_bytes: Optional[int] = None) -> Optional[tuple]:
        """Every output as drawn for `s` and kept (draw() answers from them) in at most `max_bytes`, else None:
        nothing is drawn."""
        return DRAWN.peek((self, s), max_bytes)

    def draw_part(self, index: int, s: Settings) -> tuple:
        """One part's outputs (an export), within the whole view's budget where the part is what that
        budget is for (the model's parts; every part of a view without a model)."""
        part = self.parts[index]
        if not (self.drawn and (part.model or not self.needs_model)):
            return part.draw(s)
        return self._within_budget(s, lambda: part.draw(s))

    def _within_budget(self, s: Settings, fn: Callable[[], tuple]) -> tuple:
        return budget.within_budget(check_budget(s, self.name, self._estimate(s)), fn)

    def _estimate(self, s: Settings, cost: Optional[Cost] = None) -> Callable[[Settings], Cost]:
        return self.estimate if cost is None else (lambda t: cost if t is s else self.estimate(t))


# Drawn views by (view record, settings), counted in explorer.budget.MEMORY with the models and forwards (the
# record, not its name: a test may stand another record in under a view's name)
DRAWN = budget.ByteCache()


def _frozen(outputs: tuple) -> tuple:
    return tuple(o.freeze() if isinstance(o, Figure) else o for o in outputs)


def _shareable(outputs: tuple) -> bool:
    """Whether drawn outputs may be kept for everyone: frozen figures and texts (what the cache can count)."""
    return all(isinstance(o, (Figure, str)) for o in outputs)


# A server estimates each event's view at its admission (on the event loop) and again where it is drawn: 0.1-0.4 ms
# each for a lecture view (variants, isolation the most). The estimate is a function of the view and its settings
# alone (both frozen, Cost too), so one serves every ask; ESTIMATES_KEPT of them.
ESTIMATES_KEPT = 1024


@functools.lru_cache(maxsize=ESTIMATES_KEPT)
def _estimated(view: View, s: Settings) -> Cost:
    plots = sum(isinstance(o, Plot) for o in view.outputs)
    cost = view.cost(s).holding(plots * FIGURE_PEAK_BYTES)
    return cost.holding(model_bytes(s), on_device=True) if view.needs_model else cost


def recorded_cost(s: Settings) -> Cost:
    return forward_cost(s, s.batch_size, record=True)        # runs.forward: the one recorded forward


# --- the words captions share (each fact in the words its figure's title uses) -------------------------------

def caption_query(s: Settings) -> str:
    return f"query {s.layout.token_labels()[s.query_position]}"


def caption_layout(s: Settings) -> str:
    return (f"{s.num_user} user token(s), {s.num_history} history items and {s.num_candidates} candidates "
            f"(T = {s.seq_len})")


def caption_where(f: dict) -> str:
    return ", ".join(v for k, v in f.items() if k in ("layer", "head")).replace(", and head", " and head")
