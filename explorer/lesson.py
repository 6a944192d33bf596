"""The guided lesson: the app's two stories as an ordered list of views, each a link of the app's own
query string and tab, the figure that shows its claim, and a one-line claim shown under that figure.

Steps are numbered from 1, on screen and in links (`lesson=3`); links of the old 0-based `step=2` open the
same step (static/present.js). A claim about numbers has a check: a function of the step's settings that
reads the model's (or the mask's) own outputs and says whether the claim holds; what the claim names is
on its figure (`shows`). tests/test_lesson.py runs every check and draws every step's figure.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np
import plotly.graph_objects as go

from explorer import gpu_results, runs, views
from explorer.query_string import parse_query
from explorer.schema import Settings
from models.masks import KERNEL_TILINGS, kernel_work

STORIES = {"isolation": "Candidates never see each other", "flash": "What flash attention skips"}
# the figure each tab shows first (its elem_id): what presentation mode fills the screen with off the lesson
MAIN_FIGURE = {v.name: v.main for v in views.VIEWS.values() if v.main}


@dataclass(frozen=True)
class Step:
    story: str                  # a key of STORIES
    title: str
    query: str                  # the app's query string (explorer.query_string.to_query's form: URL-encoded)
    tab: str
    claim: str                  # one line, shown under the figure
    figure: str                 # elem_id of the figure that shows the claim (a Plot of the tab's view)
    shows: tuple[str, ...]      # what the claim is about, as the figure writes it: words and numbers on it
    check: Optional[Callable[[Settings], bool]] = None    # True when the claim's numbers hold

    def settings(self) -> Settings:
        return parse_query(self.query)

    def link(self, index: int) -> str:
        """The step's link: its settings, tab and number (from 1, as on screen)."""
        return f"?{self.query}&tab={self.tab}&lesson={index + 1}"

    def draw(self) -> go.Figure:
        """The step's figure at its settings, as its tab draws it (refused by name past this device's
        budget, as the tab would be)."""
        view = views.VIEWS[self.tab]
        for p, part in enumerate(view.parts):
            ids = [getattr(out, "elem_id", None) for out in part.outputs]
            if self.figure in ids:
                return view.draw_part(p, self.settings())[ids.index(self.figure)]
        raise ValueError(f"lesson step {self.title!r}: the {self.tab} tab draws no figure {self.figure!r}")


# --- the checks: each reads the outputs the step's figure is drawn from --------------------------------

def _candidate_rows(s: Settings) -> range:
    return range(s.candidate_start_offset, s.seq_len - s.candidate_padding)


def only_itself_among_candidates(s: Settings) -> bool:
    """The model's mask: each candidate row allows itself and no other candidate; the causal mask lets
    every later candidate see the earlier ones."""
    ours, causal, off = views.mask_dense(s, s.mask_kind), views.mask_dense(s, "causal"), s.candidate_start_offset
    rows = _candidate_rows(s)
    own = all(set(np.flatnonzero(ours[i, off:]) + off) == {i} for i in rows)
    leaks = all(causal[i, off:i].all() for i in rows)
    return own and leaks and len(rows) > 1


def zero_weight_on_other_candidates(s: Settings) -> bool:
    """In the recorded forward, the query row's softmax weight on every other candidate is exactly 0, in
    every layer and head."""
    others = [c for c in _candidate_rows(s) if c != s.query_position]
    probs = [t.probs[s.row, :, s.query_position, others] for t in runs.forward(s).trunk.layers]
    return s.query_position in _candidate_rows(s) and bool(others) and all(bool((p == 0).all()) for p in probs)


def masked_logits_become_exact_zeros(s: Settings) -> bool:
    """The anatomy row: every masked key (the other candidates among them) gets weight exactly 0 and the
    allowed keys' weights sum to 1."""
    a = views.row_anatomy(s)
    others = [c for c in _candidate_rows(s) if c != s.query_position]
    return (not a.allowed[others].any() and bool((a.probs[~a.allowed] == 0).all())
            and abs(float(a.probs[a.allowed].sum()) - 1) < 1e-5)


def isolated_exactly_and_leaks_without_the_mask(s: Settings) -> bool:
    """Perturbing candidate j: no other candidate's output moves at all under the model's mask; under the
    causal mask C2's logits move by 0.13."""
    ours, causal = views.isolation_reading(s), views.isolation_reading(s, "causal")
    return ours.isolated and causal.logits.where == "C2" and f"{causal.logits.value:.2g}" == "0.13"


def invariant_with_shared_or_no_positions(s: Settings) -> bool:
    """Reversing the candidates: scores move with sequential RoPE positions, stay within fp32 rounding
    with shared or no positions."""
    def largest(mode):
        before, after, _ = views.invariance(replace(s, rope_mode=mode))
        return float(np.abs(after - before).max())
    return (largest("sequential") > views.FP32_TOLERANCE
            and largest("shared") <= views.FP32_TOLERANCE and largest("none") <= views.FP32_TOLERANCE)


def masked_share_of_pairs(s: Settings) -> bool:
    """11.1% of production's 1152 x 1152 pairs are masked: the history sees no candidate, a candidate no other."""
    dense, off, T = views.mask_dense(s, s.mask_kind), s.candidate_start_offset, s.seq_len
    stats = views.mask_stats(views.layout_mask(s, s.mask_kind))
    block = dense[off:, off:]
    return (T == 1152 and f"{stats['skip_elements']:.1%}" == "11.1%" and not dense[:off, off:].any()
            and not (block & ~np.eye(T - off, dtype=bool)).any())


def fa4_tile_counts(s: Settings) -> bool:
    """FA4's 128 x 128 tiles over the model's mask: 72 run in full, 1 with a mask, 8 skipped."""
    w = kernel_work(KERNEL_TILINGS["fa4"], views.layout_mask(s, s.mask_kind))
    return (w["full"], w["partial"], w["empty"]) == (72, 1, 8)


def skipped_work_share(s: Settings) -> bool:
    """The skipped tiles are 9.9% of the work against 11.1% of pairs masked: the candidate tile computes
    its hidden pairs and masks them."""
    mask = views.layout_mask(s, s.mask_kind)
    w = kernel_work(KERNEL_TILINGS["fa4"], mask)
    return (f"{w['skip_elements']:.1%}", f"{views.mask_stats(mask)['skip_elements']:.1%}") == ("9.9%", "11.1%")


def numbers(text: str) -> tuple[str, ...]:
    """The numbers written in a text, in order ('30.6×', '39%', '303 → 115 ms': 30.6, 39, 303, 115); digits
    inside a name ('H100', 'fa4', 'B32') are part of the name, not a number the claim makes."""
    return tuple(dict.fromkeys(re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)", text)))


def figure_text(fig) -> str:
    """Every word a figure prints: its title and subtitle, annotations and the text beside its bars."""
    layout = fig.layout
    parts = [layout.title.text or "", layout.title.subtitle.text or ""] + [a.text or "" for a in layout.annotations]
    parts += [str(t) for trace in fig.data for t in (getattr(trace, "text", None) or ())]
    return " ".join(parts)


def drawn_on(claim: str, fig) -> bool:
    """Every number of the claim is printed on the figure, read from the same committed file."""
    return set(numbers(claim)) <= set(numbers(figure_text(fig)))


GPU_RUN = gpu_results.gpu_run()     # the committed GPU results the last steps rest on (None: none committed)
KERNEL_CLAIM, TRUNK_CLAIM = gpu_results.kernel_claim(GPU_RUN), gpu_results.trunk_claim(GPU_RUN)


def recorded_kernels_drawn(s: Settings) -> bool:
    """The kernels' claim (× naive, share of the matmul peak, the cap's cost) is on the recorded figure."""
    return GPU_RUN is not None and drawn_on(KERNEL_CLAIM, gpu_results.flash_figure(GPU_RUN))


def recorded_forward_drawn(s: Settings) -> bool:
    """The whole forward's claim (its gain, attention before and after, the rest) is on its figure."""
    return GPU_RUN is not None and drawn_on(TRUNK_CLAIM, gpu_results.trunk_figure(GPU_RUN))


NANO = "preset=phoenix-2026-nano"
LESSON: tuple[Step, ...] = (
    Step("isolation", "The mask pair", "preset=lecture&compare=causal", "mask",
         "Each candidate sees the user, the history and itself — no other candidate; under the causal mask "
         "beside it later candidates see earlier ones.", "mask-plot", ("recsys", "causal", "masked"),
         check=only_itself_among_candidates),
    Step("isolation", "A candidate's row", "preset=lecture&layer=1&head=3&query=7", "attention",
         "Candidate C1's row (layer 1, head 3) puts exactly 0 weight on C0 and C2 — in every layer and head.",
         "attention-plot", ("layer 1, query head 3", "weight exactly 0"), check=zero_weight_on_other_candidates),
    Step("isolation", "Its anatomy", "preset=lecture&layer=1&head=3&query=7", "anatomy",
         "The other candidates' logits are set to −∞ before the softmax: their weight is exactly 0, not small.",
         "anatomy-steps-plot", ("query C1", "−∞", "exactly 0 where −∞"), check=masked_logits_become_exact_zeros),
    Step("isolation", "The isolation verdict", "preset=lecture&candidate=1", "isolation",
         "Perturbing C1 moves no other candidate's logits, not by one bit (0); under the causal mask C2's move "
         "by 0.13.", "isolation-logits-plot",
         ("recsys mask (largest on another candidate: 0)", "causal mask (largest on another candidate: 0.13"),
         check=isolated_exactly_and_leaks_without_the_mask),
    Step("isolation", "Invariance", "preset=lecture&operation=permute", "invariance",
         "Reversing the candidates moves their scores with sequential RoPE positions; with shared or no positions "
         "they stay put (at most fp32 rounding).", "invariance-plot",
         ("RoPE sequential", "RoPE shared", "RoPE none", "within fp32 rounding"),
         check=invariant_with_shared_or_no_positions),
    Step("flash", "The element mask", NANO, "mask",
         "At production's 1152 positions 11.1% of the query–key pairs are masked: the history sees no candidate, "
         "a candidate no other candidate.", "mask-plot", ("T = 1152", "11.1% of the pairs masked"),
         check=masked_share_of_pairs),
    Step("flash", "The kernel's tile map", NANO, "mask",
         "FA4 works in 128 × 128 tiles: 72 run in full, the candidate tile with its diagonal masked, and the 8 "
         "history-to-candidate tiles (×) are skipped.", "kernel-plot",
         ("FA4 block-sparse · 128×128", "72 full · 1 masked · 8 skipped"), check=fa4_tile_counts),
    Step("flash", "The work skipped", NANO + "&zoom=history+tail", "mask",
         "Skipping is per tile: the 8 skipped tiles are 9.9% of the work against 11.1% of pairs masked — the "
         "candidate tile computes its hidden pairs.", "kernel-plot",
         ("9.9% of the work skipped", "11.1% of the pairs masked"), check=skipped_work_share),
    Step("flash", "On a GPU, and live here", NANO, "timing", KERNEL_CLAIM, "flash-plot", numbers(KERNEL_CLAIM),
         check=recorded_kernels_drawn),
    Step("flash", "What flash buys the model", NANO, "timing", TRUNK_CLAIM, "trunk-plot", numbers(TRUNK_CLAIM),
         check=recorded_forward_drawn),
)


def as_data() -> list[dict]:
    """The lesson for the page's script (static/present.js): one dict per step, in order."""
    return [dict(story=STORIES[st.story], title=st.title, link=st.link(i), claim=st.claim, tab=st.tab,
                 figure=st.figure) for i, st in enumerate(LESSON)]


def strip_markdown() -> str:
    """The lesson on the page's first screen: every step as a link, numbered as on screen, by story, and a
    start in presentation mode (where N and P step on)."""
    stories = [f"*{name}*: " + " · ".join(f"[{i + 1} {st.title}]({st.link(i)})" for i, st in enumerate(LESSON)
                                          if st.story == key) for key, name in STORIES.items()]
    return (f"**The lesson, step by step** — [▶ start, full screen]({LESSON[0].link(0)}&present=1) (N / P step on; "
            "Esc leaves) — " + " — ".join(stories))
