"""The Variants tab: the course notebooks' attention variants (MHA, MQA, GQA, MLA, talking heads, encoders,
encoder–decoder, DIN) through the same heatmaps, trained on associative recall, with every variant's
training loss; and the bug zoo: each notebook bug planted in the current trunk, every probe's verdict, and
the chosen bug's layer-0 attention. Its functions, its cost, its exports' captions and its record.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch

from models.bugzoo import BUGS, bug_names, bug_report
from models.probes import PROBES, capped_layout
from models.recall import load_trained_variant, recall_example
from models.runinfo import RESULTS_DIR
from models.variants import VARIANTS, VariantConfig, build_variant, variant_inputs

from .. import budget, runs
from ..figures import Panel, heatmap_figure, line_figure
from ..limits import Cost, forward_cost, model_bytes, recorded_bytes
from ..families import FAMILIES
from ..schema import Control, ModelSettings, Settings, ValidationError
from .panels import GRID_MAX_CELLS, SINGLE_MAX_CELLS, layout_panel, mask_dense
from .records import Export, Part, Plot, Text, View, recorded_cost


def _check_bug(value, parsed) -> str:
    """A bug of the family parsed (or none); one of the other family's is refused with the family to switch to."""
    family = parsed["family"]
    bug = value.strip() if isinstance(value, str) else value
    if bug not in ("none", *bug_names(family)):
        other = [f for f in FAMILIES if f != family and bug in bug_names(f)]
        elsewhere = (f" with the {FAMILIES[family]} family; it is a bug of {FAMILIES[other[0]]}: switch the model "
                     "family to plant it") if other else ""
        raise ValidationError("bug", value, ", ".join(("none", *bug_names(family))) + elsewhere,
                              also=("family",) if other else ())
    return bug


def _bug_menu() -> list[tuple[str, str]]:
    """Every family's bugs, each under its family's name: a seed notebook's (grok.py) or a serving-kernel
    quirk (production); picking one of the other family's marks the menu with the family to switch to."""
    return [("none", "none")] + [(f"{FAMILIES[family].split(' (')[0]} · {name}", name)
                                 for family in FAMILIES for name in bug_names(family)]


# the tab's own controls: the variant drawn, and the bug planted in the trunk (models.bugzoo.BUGS, or none)
VARIANT = Control("variant", "gqa", "attention variant (course notebooks)", choices=tuple(VARIANTS), menu=True)
BUG = Control("bug", "none", "plant a bug (grok.py: a seed notebook's; production: a serving-kernel quirk)",
              check=_check_bug, menu=True, page_choices=_bug_menu)

# The bug zoo (bug_zoo_view) probes six models on a capped layout of at most this many positions;
# causality perturbs each of at most 16 of them (models.probes.PROBES["causality"].max_positions).
BUG_ZOO_MAX_POSITIONS = 128


@dataclass(frozen=True)
class VariantRun:
    """One recorded forward of a variant, with what its axes are."""
    out: object                    # TransformerOutput: layers[i].probs [1, H, Tq, Tk]
    queries: tuple                 # tick labels of the query rows ...
    keys: tuple                    # ... and of the key columns
    answer: tuple = ()             # key columns of the queried (key, value) pair; () for random inputs
    prediction: str = ""           # the trained model's answer, e.g. "v5" ...
    target: str = ""               # ... and the right one
    trained: bool = False


@budget.ByteCache                            # 10 variants x a few examples; each run is a few kB
def _variant_run(name: str, seed: int) -> VariantRun:
    """The variant trained on associative recall over held-out example `seed`; without the weights
    file, seeded random weights on random embeddings."""
    with torch.no_grad():
        model = load_trained_variant(name)
        if model is not None:
            tokens, target, _ = recall_example(seed, model.task)
            out = model.body(**model.body_inputs(tokens), record=True)
            queries, keys, answer = model.attention_axes(tokens)
            prediction = f"v{int(model(tokens).argmax(-1))}"                     # value tokens print as v<index>
            return VariantRun(out, tuple(queries), tuple(keys), tuple(answer), prediction, f"v{int(target)}",
                              trained=True)
        config = VariantConfig()
        inputs = variant_inputs(name, config, seed)
        out = build_variant(name, config, seed)(**inputs, record=True)
    T, (Tq, Tk) = inputs["embeddings"].shape[1], out.layers[0].probs.shape[-2:]
    rows = [f"t{i}" for i in range(T)]
    cols = [f"s{i}" for i in range(Tk)] if Tk != Tq else rows
    queries = [f"c{i}" for i in range(Tq)] if "candidates" in inputs else rows
    return VariantRun(out, tuple(queries), tuple(cols))


def variant_training_report() -> dict | None:
    """benchmarks/results/variants-training.json (python -m models.train_variants), or None."""
    text = _training_report_text()
    return None if text is None else json.loads(text)


def _training_report_text() -> str | None:
    path = RESULTS_DIR / "variants-training.json"
    return path.read_text() if path.is_file() else None


def _distinct(labels) -> list[str]:
    """Category axes merge equal labels (two pairs may share value v2): repeats get zero-width spaces,
    invisible on the slide."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        out.append(label + "\u200b" * seen.get(label, 0))
        seen[label] = seen.get(label, 0) + 1
    return out


# variant_view's outputs, frozen, by (variant, seed, the training report's digest, the run's id) -> (the run, outputs):
# they depend on nothing else, and a lecture visitor's head, layer, mask or model change asks for them again
# (~30 ms of plotly a call, holding the GIL: every loss curve and layer x head rebuilt). The run is in the key, and
# the value holds it so that no other run takes its id while the entry lives: a run made again (its cache cleared,
# e.g. the weights file replaced) is drawn again.
_VARIANT_DRAWN = budget.ByteCache()


def variant_view(s: Settings) -> tuple[go.Figure, go.Figure, str]:
    """One attention variant from the course notebooks, drawn by the same heatmap builder: every
    layer x head of the variant trained on associative recall (ticks are the task's tokens), and
    every variant's training loss."""
    variant, text = VARIANT.of(s), _training_report_text()
    run = _variant_run(variant, s.seed)
    digest = None if text is None else hashlib.sha256(text.encode()).hexdigest()

    def draw() -> tuple:
        fig, loss, caption = _draw_variant(variant, run, None if text is None else json.loads(text))
        return run, (fig.freeze(), loss.freeze(), caption)
    return _VARIANT_DRAWN.get((variant, s.seed, digest, id(run)), draw)[1]


def _draw_variant(variant: str, run: VariantRun, report: dict | None) -> tuple[go.Figure, go.Figure, str]:
    v = VARIANTS[variant]
    queries, keys = _distinct(run.queries), _distinct(run.keys)
    panels = []
    for layer, trace in enumerate(run.out.layers):
        probs = trace.probs[0].float().numpy()                       # [H, Tq, Tk]
        masked = (probs == 0).all(0)             # exactly 0 in every head: the variant's mask hides the pair
        panels += [Panel(probs[h], queries, keys, f"L{layer} · head {h}", masked=masked)
                   for h in range(probs.shape[0])]
    heads = len(panels) // len(run.out.layers)
    what = "trained on associative recall" if run.trained else "seeded random weights"
    fig = heatmap_figure(panels, cols=heads, title=f"'{variant}' (notebook {v.notebook}), {what}: "
                         "every layer × head", value_name="weight", zmin=0,
                         max_cells=GRID_MAX_CELLS, height=None if len(queries) > 1 else 300 + 60 * len(run.out.layers))
    if run.answer:
        _outline_answer(fig, len(panels), len(queries) - 1, run.answer)
    return fig, variant_loss_figure(report, variant), f"**{variant}** — {v.teaches}.\n\n" + _recall_caption(
        variant, run, report)


def _outline_answer(fig: go.Figure, panels: int, row: int, columns: tuple) -> None:
    """A box around the cells the query row should look at, in every panel."""
    box = [dict(type="rect", xref=f"x{'' if k == 1 else k}", yref=f"y{'' if k == 1 else k}",
                x0=min(columns) - 0.5, x1=max(columns) + 0.5, y0=row - 0.5, y1=row + 0.5,
                line=dict(color="#D55E00", width=3)) for k in range(1, panels + 1)]
    fig.update_layout(shapes=list(fig.layout.shapes) + box)


def _recall_caption(name: str, run: VariantRun, report: dict | None) -> str:
    if not run.trained:
        return ("No trained weights (`models/demo/variants.safetensors` is missing; `python -m "
                "models.train_variants` writes it): these are seeded random weights on random inputs, so the "
                "maps have no structure to explain.")
    # the share of the query row's weight (head mean) on the queried pair, per layer; |.| because
    # talking heads mix the probabilities after the softmax, so its rows need not sum to one
    rows = [t.probs[0, :, -1].float().abs() for t in run.out.layers]                 # [H, Tk] each
    mass = [float((r[:, list(run.answer)].sum(-1) / r.sum(-1)).mean()) for r in rows]
    layer = int(np.argmax(mass))
    query, pair = run.queries[-1], " ".join(run.keys[c] for c in run.answer)
    example = f"Ticks: one held-out example, `{' '.join(run.keys)}` + `{query}`" if len(run.queries) == 1 else \
        f"Ticks: one held-out example, `{' '.join(run.queries)}`"
    verdict = "right" if run.prediction == run.target else f"wrong, the value is `{run.target}`"
    text = f"{example}; the model answers `{run.prediction}` ({verdict}). "
    r = (report or {}).get("variants", {}).get(name)
    if r is None:
        return text + f"The `{query}` row puts {mass[layer]:.0%} of its weight on `{pair}` (layer {layer}, outlined)."
    steps, acc, chance = report["steps"], r["held_out_accuracy"], r["chance_accuracy"]
    if acc >= 0.9:
        return text + (f"Trained {steps} steps: held-out accuracy {acc:.0%} (chance {chance:.0%}). Look at the "
                       f"last row, `{query}`: in layer {layer} the heads put {mass[layer]:.0%} of its weight on "
                       f"`{pair}`, the pair it asks for (outlined) — that lookup is how it answers."
                       + _previous_token_note(run))
    solved = [n for n, x in report["variants"].items() if x["held_out_accuracy"] >= 0.9]
    return text + (f"It did **not** learn the task in {steps} steps: held-out accuracy {acc:.0%} (chance "
                   f"{chance:.0%}), and the `{query}` row puts at most {mass[layer]:.0%} of its weight on "
                   f"`{pair}` (layer {layer}, outlined)" + (f" — compare `{solved[0]}`, which did." if solved else "."))


def _previous_token_note(run: VariantRun) -> str:
    """Self-attention over k v k v ...: a layer-0 head whose value rows look one back at their key
    copies the key into the value's position — what the query then finds (an induction head)."""
    if len(run.out.layers) < 2 or len(run.queries) == 1:
        return ""
    probs = run.out.layers[0].probs[0].float().abs()                                 # [H, T, T]
    values = torch.arange(1, probs.shape[-1] - 1, 2)                                 # v rows; their key is one back
    share = (probs[:, values, values - 1] / probs[:, values].sum(-1)).mean(-1)      # [H]
    head = int(share.argmax())
    if share[head] < 0.5:
        return ""
    return (f" Layer 0, head {head}: each `v` row looks one back at its own key ({float(share[head]):.0%} of its "
            "weight), copying the key into the value's position — which is what the query row then finds.")


def variant_loss_figure(report: dict | None, selected: str = "") -> go.Figure:
    """Every variant's training loss from variants-training.json, the selected one drawn thicker."""
    if report is None:
        return line_figure({}, title="No training curves yet: python -m models.train_variants writes "
                           "benchmarks/results/variants-training.json", x_title="step", y_title="loss")
    series = {f"{name} · {r['held_out_accuracy']:.0%}": ([step for step, _ in r["loss"]],
                                                          [loss for _, loss in r["loss"]])
              for name, r in report["variants"].items()}
    chance = next(iter(report["variants"].values()))["chance_accuracy"]
    fig = line_figure(series, title=f"Training loss, {report['task'].split(':')[0]} · {report['steps']} steps, "
                      f"batch {report['batch']} · {report['device']}, {report['date'][:10]}<br><sup>legend: "
                      f"variant · held-out accuracy (chance {chance:.0%})</sup>", x_title="step",
                      y_title="cross-entropy loss (log)", log_y=True, markers=False, height=480)
    for trace in fig.data:
        trace.line.width = 4 if trace.name.split(" · ")[0] == selected else 1.5
    fig.update_layout(legend=dict(orientation="v", y=1, yanchor="top", x=1.02, xanchor="left"),
                      margin=dict(r=210))
    return fig


def bug_zoo_view(s: Settings) -> tuple[go.Figure, str]:
    """The seed notebooks' bugs planted in the current trunk, each probe's verdict, and the chosen
    bug's layer-0 attention through the heatmap builder."""
    bug = BUG.of(s)
    rows = _bug_report(s.model, s.row)
    probs = _bug_attention(s.model, bug, s.row)
    # masked: what the model's mask hides and the bug left at exactly 0 (a pair it lets through shows its weight)
    masked = ~mask_dense(s, s.mask_kind) & (probs == 0)
    fig = heatmap_figure([layout_panel(s, probs, "", masked=masked)], title=f"Layer 0, head 0 with bug '{bug}'",
                         value_name="weight", zmin=0, max_cells=SINGLE_MAX_CELLS)
    probes = list(PROBES)
    lines = ["| bug | notebook | " + " | ".join(probes) + " | flagged |", "|---|---|" + "---|" * (len(probes) + 1)]
    for r in rows:
        lines.append(f"| {'**' + r['bug'] + '**' if r['bug'] == bug else r['bug']} | {r['notebook']} | "
                     + " | ".join(f"{r[p]:.3g}" for p in probes) + f" | {', '.join(r['flagged']) or '—'} |")
    symptom = BUGS[bug].symptom if bug in BUGS else "the faithful port: every probe passes" + (
        " but causality, which flags the bidirectional prefix by design" if s.mask_kind == "recsys-bidirectional"
        else "")
    return fig, f"**{bug}**: {symptom}.\n\n" + "\n".join(lines) + _capped_note(s, rows[0]["probe_positions"])


def _capped_note(s: Settings, positions: dict) -> str:
    """Say which probes looked at a shorter layout than the one shown, and why."""
    capped = {p: n for p, n in positions.items() if n < s.seq_len}
    if not capped:
        return ""
    by_length: dict[int, list] = {}
    for p, n in capped.items():
        by_length.setdefault(n, []).append(p)
    parts = [f"{' and '.join(ps)} on {n}" for n, ps in sorted(by_length.items(), reverse=True)]
    return (f"\n\nBounded work: each probe runs six models (the faithful trunk and five bugs), and the causality "
            f"probe perturbs every position in turn, so on this {s.seq_len}-position sequence they run on a "
            f"capped layout — the first prefix positions and the first candidates, same weights: "
            + ", ".join(parts) + " positions. Isolation, causality and parity are properties of the wiring, "
            "not of the length; the heatmap above is the full sequence.")


@budget.ByteCache
def _bug_attention(m: ModelSettings, bug: str, row: int) -> np.ndarray:
    """[T, T] layer 0, head 0 of the trunk with `bug` on batch row `row`: the same for every zoom, head or query a
    visitor picks (a recorded forward a request, else)."""
    s = Settings(m)
    base, r = runs.forward(s), slice(row, row + 1)
    with torch.no_grad():
        trace = runs.bugged_trunk(s, bug)(base.embeddings[r], base.valid[r], base.candidate_start_offset,
                                          record=True).layers[0]
    probs = trace.probs[0, 0].float().cpu().numpy()
    probs.setflags(write=False)                      # shared by every request: a change in place would raise
    return probs


@budget.ByteCache
def _bug_report(m: ModelSettings, row: int):
    s = Settings(m)
    base, r = runs.forward(s), slice(row, row + 1)
    capped = capped_layout(base.embeddings[r], base.valid[r], base.candidate_start_offset, BUG_ZOO_MAX_POSITIONS)
    return bug_report(runs.build_model(s).transformer, *capped, planted=lambda bug: runs.bugged_trunk(s, bug))


def _bug_zoo_cost(s: Settings) -> Cost:
    """Six models probed on a capped layout, and the chosen bug's recorded trace beside the forward."""
    models = 1 + len(bug_names("grok"))
    T = min(s.seq_len, BUG_ZOO_MAX_POSITIONS)
    Tc = min(T, PROBES["causality"].max_positions)
    per_model = (forward_cost(s, 2, T)                       # isolation: before and after
                 + forward_cost(s, 2, T)                     # parity: the model and the correct trunk
                 + forward_cost(s, 2 * max(1, min(Tc - 1, 16)), Tc))   # causality: perturbed + unperturbed rows
    total = Cost(per_model.forwards * models, per_model.flops * models, per_model.peak_bytes,
                 per_model.device_bytes)
    layer0 = forward_cost(s, 1, record=True)                  # the chosen bug's recorded trace, full length
    return (total + layer0).holding(2 * model_bytes(s), on_device=True)     # a bugged copy beside the model


def _variants_cost(s: Settings) -> Cost:
    return recorded_cost(s) + _bug_zoo_cost(s).holding(recorded_bytes(s, s.batch_size), on_device=True)


EXPORT_VARIANT = (
    Export("variant", lambda s, f, chosen: (
        f"Attention weights of the {f.get('variant')} variant from the course notebooks, trained on associative "
        "recall; ticks are the tokens of one held-out example, the queried pair outlined."),
        facts=lambda s: dict(variant=f"'{VARIANT.of(s)}'")),
    Export("variant_loss", lambda s, f, chosen: (
        "Training loss of every attention variant on associative recall; the legend gives each one's held-out "
        "accuracy.")))
EXPORT_BUG_ZOO = Export("bug_zoo", lambda s, f, chosen: (
    f"Attention weights in layer 0, head 0 of the {'production' if s.family == 'xrex' else 'grok.py'} trunk "
    + (f"with the {f.get('bug')} planted." if BUG.of(s) != "none" else
       f"with {f.get('bug')}: the port as it is, no bug planted (the bug zoo's first row; plant one to see what it "
       "breaks).")),
    facts=lambda s: dict(layer="layer 0", head="head 0", bug=f"bug '{BUG.of(s)}'"))


VIEW = View(
    "variants", "5 · Variants",
    look_for="Look for: in the trained model's last row, the weight on the queried key/value pair (outlined).",
    teaches="MHA / MQA / GQA / MLA / talking heads / encoders / encoder–decoder / DIN through the same "
            "heatmaps; each course-notebook bug planted in the trunk, and which probe catches it.",
    parts=(Part(variant_view, (Plot("variant attention", "variants-plot", exports=EXPORT_VARIANT[:1]),
                               Plot("training loss of every variant", "variants-loss-plot",
                                    exports=EXPORT_VARIANT[1:]), Text())),
           Part(bug_zoo_view, (Plot("attention with the bug", exports=(EXPORT_BUG_ZOO,)),
                               Text(lead=True)), model=True)),
    cost=_variants_cost, controls=(VARIANT, BUG))
