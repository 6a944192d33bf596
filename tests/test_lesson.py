"""The guided lesson: every step opens as a link of the app, and every claim about numbers holds against
the model's (or the mask's) own outputs at that step's settings — and fails where the claim would be false."""
from dataclasses import replace
from urllib.parse import parse_qsl

import pytest

from explorer import lesson, views
from explorer.controls import from_link
from explorer.lesson import LESSON, STORIES
from explorer.views import VIEWS, Plot

TABS = tuple(VIEWS)


@pytest.mark.parametrize("index", range(len(LESSON)), ids=[st.title for st in LESSON])
def test_every_step_is_a_link_the_app_opens_and_its_claim_holds(index):
    st = LESSON[index]
    params = dict(parse_qsl(st.link(index).lstrip("?")))
    assert params["tab"] == st.tab in TABS and params["lesson"] == str(index + 1) and st.story in STORIES
    s, problems = from_link(params)
    assert problems == {} and s == st.settings()
    plots = [o.elem_id for o in VIEWS[st.tab].outputs if isinstance(o, Plot)]
    assert st.figure in plots                                               # a figure of the step's own tab
    assert len(st.claim) <= 150 and "\n" not in st.claim                    # one line under the figure
    assert st.check is not None and st.check(s), st.claim


def figure_text(fig) -> str:
    """Every word and number a figure writes: its title and subtitle, panel titles and notes, legend entries, axis
    titles, tick labels and the values printed on it."""
    layout = fig.layout.to_plotly_json()
    title = layout.get("title", {})
    parts = [str(title.get("text", "")), str(title.get("subtitle", {}).get("text", ""))]
    parts += [str(a.get("text", "")) for a in layout.get("annotations", [])]
    for key, axis in layout.items():
        if key.startswith(("xaxis", "yaxis")):
            parts += [str((axis.get("title") or {}).get("text", ""))] + [str(t) for t in axis.get("ticktext") or []]
    for trace in fig.data:
        if trace.visible is not False:
            parts.append(str(trace.name or ""))
            text = trace.text if trace.text is not None else []
            parts += [str(t) for t in (text if isinstance(text, (list, tuple)) else [text])]
    return "\n".join(parts)


def step_figure(st):
    """The figure the step presents, drawn by its tab's view at the step's settings."""
    return st.draw()


@pytest.mark.parametrize("index", range(len(LESSON)), ids=[st.title for st in LESSON])
def test_every_step_names_its_figure_and_the_figure_shows_what_the_claim_is_about(index):
    """Each step presents its own figure (a step never falls back to its tab's first one: 'Its anatomy' once
    showed q and k after RoPE under a claim about −∞ and exact zeros), and what the claim names — its words
    and its numbers — is written on that figure."""
    st = LESSON[index]
    assert st.figure and st.shows, st.title
    text = figure_text(step_figure(st))
    missing = [phrase for phrase in st.shows if phrase not in text]
    assert not missing, (st.title, missing, text[:2000])


def test_the_anatomy_step_shows_the_mask_and_the_exact_zeros():
    """Step 3's figure: −∞ where each other candidate's logit was, and a weight of exactly 0 printed there."""
    st = next(st for st in LESSON if st.title == "Its anatomy")
    fig = step_figure(st)
    s = st.settings()
    labels = s.layout.token_labels()
    others = {labels[c] for c in range(s.candidate_start_offset, s.seq_len) if c != s.query_position}
    infinities = {a.x for a in fig.layout.annotations if a.text == "−∞"}
    assert others <= infinities
    weights = fig.data[4]                                           # the softmax's panel
    assert all(t == "0" for x, t in zip(weights.x, weights.text) if x in others)


def test_both_stories_in_their_order():
    assert [st.story for st in LESSON] == ["isolation"] * 5 + ["flash"] * 5
    assert [st.tab for st in LESSON if st.story == "isolation"] == ["mask", "attention", "anatomy", "isolation",
                                                                    "invariance"]
    assert [st.figure for st in LESSON if st.story == "flash"] == ["mask-plot", "kernel-plot", "kernel-plot",
                                                                   "flash-plot", "trunk-plot"]


def test_the_checks_fail_where_their_claims_would_be_false():
    """The same checks at settings where the claim is untrue: a history row (it is no candidate), the last
    candidate (under the causal mask no candidate follows it to leak into), the lecture layout's tiles, a
    single candidate (nothing to reorder)."""
    by_title = {st.title: st for st in LESSON}
    row = by_title["A candidate's row"].settings()
    assert not lesson.zero_weight_on_other_candidates(replace(row, query=2))
    verdict = by_title["The isolation verdict"].settings()
    assert not lesson.isolated_exactly_and_leaks_without_the_mask(replace(verdict, candidate=2))   # nothing after C2
    assert not lesson.fa4_tile_counts(row) and not lesson.masked_share_of_pairs(row)
    invariance = by_title["Invariance"].settings()
    assert not lesson.invariant_with_shared_or_no_positions(replace(invariance, candidate=0, num_candidates=1)
                                                            .with_view({views.invariance_rope.OPERATION: "add"}))


def test_the_page_gets_every_step_and_the_index_links_them_all_numbered_as_on_screen():
    data = lesson.as_data()
    assert [d["link"] for d in data] == [st.link(i) for i, st in enumerate(LESSON)]
    assert [d["figure"] for d in data] == [st.figure for st in LESSON]
    strip = lesson.strip_markdown()
    assert all(f"[{i + 1} {st.title}]({st.link(i)})" in strip and st.link(i).endswith(f"&lesson={i + 1}")
               for i, st in enumerate(LESSON))
    assert f"]({LESSON[0].link(0)}&present=1)" in strip


def test_the_gpu_steps_rest_on_the_committed_run_and_their_checks_read_their_own_figure():
    """The flash story ends on the recorded GPU run: each claim's numbers are printed on its own figure, and on
    the other one they are not (a claim checked against the wrong figure fails)."""
    from explorer import gpu_results
    run = lesson.GPU_RUN
    assert run is not None and run.name.startswith("nvidia-")
    kernels, forward = gpu_results.kernel_claim(run), gpu_results.trunk_claim(run)
    assert lesson.drawn_on(kernels, gpu_results.flash_figure(run))
    assert lesson.drawn_on(forward, gpu_results.trunk_figure(run))
    assert not lesson.drawn_on(kernels, gpu_results.trunk_figure(run))
    assert not lesson.drawn_on(forward, gpu_results.flash_figure(run))
