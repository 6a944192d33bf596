"""The course notebooks' real mistakes, as switches on the real trunk.

``with_bug(model, name)`` returns a copy of a ``Transformer`` or ``RecsysModel`` (or, for
production's serving-kernel quirks, a ``models.xrex`` ranker or trunk) — the same weights (shared), same parameter
names, same ``record=True`` traces — with one bug planted through the model's own extension points: an
attention function (``attention_fn``), a flag (RoPE's ``interleaved``, ``residual_from_input``,
``gelu_approximate``, ``attention_padding``). No forward is copied, so a change to the model reaches
every bug. The same probes (models/probes.py) then run on the buggy and the correct
model; ``BUGS[name].probe`` names the one that catches it.

    buggy = with_bug(model, "unmasked-decoder")
    run_probe(BUGS["unmasked-decoder"].probe, buggy, x, mask, offset)   # flagged
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionOutput, attend, grouped_attention, upcast
from .grok import DecoderLayer, DenseBlock, MultiHeadAttention
from .masks import AttentionMask
from .probes import PROBES, run_probe
from .xrex import MultiHeadAttention as XrexAttention
from .xrex import XrexRanker


def _each(model: nn.Module, cls: type, plant: Callable[[nn.Module], None]) -> None:
    for module in list(model.modules()):
        if isinstance(module, cls):
            plant(module)


# --- 000: the decoder layer never passes its attention mask ---------------------------------

def unmasked_attention(q, k, v, mask: AttentionMask, **kw) -> AttentionOutput:
    """Notebook 000's DecoderLayer calls ``self.attn(h, key_padding_mask=...)`` and drops
    ``attention_mask``: padding still applies, the causal / recsys structure never arrives."""
    return attend(q, k, v, AttentionMask("full", mask.seq_len, valid=mask.valid), **kw)


def unmasked_decoder(model: nn.Module) -> None:
    _each(model, MultiHeadAttention, lambda mha: setattr(mha, "attention_fn", unmasked_attention))


# --- 000: RoPE over interleaved pairs -------------------------------------------------------

def rope_interleaved(model: nn.Module) -> None:
    """RoPE rotating pairs (x0, x1), (x2, x3), ... (GPT-J / notebook 000) where grok.py rotates
    (x_i, x_{i+K/2}). Still a rotation by position, still relative — just not grok.py's numbers."""
    _each(model, MultiHeadAttention, lambda mha: setattr(mha.rotary, "interleaved", True))


# --- 000: the second residual from the layer input ------------------------------------------

def residual_from_input(model: nn.Module) -> None:
    """Notebook 000 writes ``h = h + x`` after the FFN, x the layer's input: the attention
    sub-layer's contribution is dropped from the residual stream (it only feeds the FFN)."""
    _each(model, DecoderLayer, lambda layer: setattr(layer, "residual_from_input", True))


# --- 001: flash_attn_func fed [B, H, T, D], mask dropped ------------------------------------

def flash_attn_func_cpu(q, k, v, softmax_scale: Optional[float] = None, causal: bool = False):
    """flash_attn_func's contract, on CPU: q [B, S, H, D], k / v [B, Sk, Hk, D] -> [B, S, H, D].
    No mask argument: only `causal`. (SDPA wants [B, H, S, D], hence the transposes.)"""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         scale=softmax_scale, is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def flash_layout_attention(q, k, v, mask: AttentionMask, *, multiplier: float, need_weights: bool = False,
                           **kw) -> AttentionOutput:
    """Notebook 001 transposes to [B, H, T, D] for its regular path and hands the same tensors to
    flash_attn_func, which reads [B, T, H, D]: attention runs over the heads of each token, not
    over tokens, and the mask is never passed. Every token then reads only itself — recorded as
    the identity map, which is what the heatmap shows."""
    B, T, Hq, _ = q.shape
    out = flash_attn_func_cpu(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),       # [B, H, T, D]
                              softmax_scale=multiplier).transpose(1, 2)                     # -> [B, T, H, D]
    if not need_weights:
        return AttentionOutput(out)
    eye = torch.eye(T, dtype=q.dtype, device=q.device).expand(B, Hq, T, T)
    return AttentionOutput(out, eye, torch.zeros_like(eye))


def flash_layout(model: nn.Module) -> None:
    _each(model, MultiHeadAttention, lambda mha: setattr(mha, "attention_fn", flash_layout_attention))


# --- 003: exact GELU where grok.py uses the tanh approximation ------------------------------

def exact_gelu(model: nn.Module) -> None:
    _each(model, DenseBlock, lambda dense: setattr(dense, "gelu_approximate", "none"))


# --- production (2026) quirks: the serving kernel, recsys_attention.py PallasRankerAttentionInference --

def serving_kernel_counts(seq_len: int, candidate_start_offset: int, block_kv: Optional[int] = 128,
                          device=None) -> torch.Tensor:
    """[T, T] how many times production's H100 inference kernel (pallas ranker_attention_fa3
    _attention_forward_inference, bound (0, P+L, P+L, T)) adds key j into query i's softmax.

    It first runs the history key blocks 0 .. cdiv(P+L, block_kv)-1 with no mask at all (padded slots
    included), then each candidate's own block with only the diagonal (q == k, both candidates).
    When P+L is a multiple of block_kv the history blocks end exactly at P+L; otherwise they run on
    into the first candidates, which then see each other and count their own key twice.
    block_kv None: the history blocks end at P+L whatever it is (production's aligned case)."""
    off = candidate_start_offset
    history_end = off if block_kv is None else -(-off // block_kv) * block_kv
    i = torch.arange(seq_len, device=device)[:, None]
    j = torch.arange(seq_len, device=device)[None, :]
    return (j < history_end).long() + ((i == j) & (i >= off)).long()                 # [T, T]


def serving_kernel_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                             block_kv: Optional[int] = 128, need_weights: bool = False, **kw) -> AttentionOutput:
    """The serving kernel's softmax, element by element: each key weighted by how often the kernel adds
    it (a key counted twice gets logit + log 2); the padding mask is never consulted."""
    counts = serving_kernel_counts(q.shape[1], mask.candidate_start_offset, block_kv, q.device)
    out, probs, logits, _ = grouped_attention(q, k, v, multiplier=multiplier, cap=cap, cap_method=cap_method,
                                              bias=torch.log(upcast(counts.to(q.dtype))))  # log 0 = -inf: never seen
    return AttentionOutput(out, probs, logits) if need_weights else AttentionOutput(out)


def serving_padding(model: nn.Module) -> None:
    """Production's serving kernels take only the bound (0, P+L, P+L, T): the ranker's own
    attention_padding="serving-kernel" (models.xrex), so padded history is attended."""
    _each(model, XrexRanker, lambda ranker: setattr(ranker, "config",
                                                    ranker.config.replace(attention_padding="serving-kernel")))


def serving_block_rounding(model: nn.Module) -> None:
    """The serving kernel's history key blocks of 128 run past P+L when it is not a multiple of 128."""
    _each(model, XrexAttention, lambda mha: setattr(mha, "attention_fn", serving_kernel_attention))


# --- registry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bug:
    patch: Callable[[nn.Module], None]     # plants the bug in a (copied) model: sets an attention_fn or a flag
    notebook: str
    probe: str                             # the models.probes.PROBES entry that catches it
    symptom: str
    family: str = "grok"                   # the model it lives in: grok (2025 open source) | xrex (2026 production)


BUGS: dict[str, Bug] = {
    "unmasked-decoder": Bug(unmasked_decoder, "000", "isolation",
                            "the layer never passes its attention mask: candidates see each other, "
                            "the past sees the future"),
    "rope-interleaved": Bug(rope_interleaved, "000", "parity",
                            "RoPE over interleaved pairs: plausible outputs, relative positions intact, "
                            "parity with grok.py fails"),
    "residual-from-input": Bug(residual_from_input, "000", "parity",
                               "second residual from the layer input: the attention output never "
                               "reaches the residual stream"),
    "flash-layout": Bug(flash_layout, "001", "parity",
                        "flash_attn_func fed [B, H, T, D] with the mask dropped: attention over heads, "
                        "each token reads only itself (isolation and causality pass!)"),
    "exact-gelu": Bug(exact_gelu, "003", "parity",
                      "exact GELU where grok.py uses tanh: a small but measurable parity error"),
    # production's own, in its serving kernel (docs/originals.md §7); "notebook" names where it lives
    "serving-padding": Bug(serving_padding, "xrex serving kernel", "parity",
                           "the serving kernel masks no padded history slot: whatever sits in padding is "
                           "attended, so outputs move with it (exact when the history has no padding; "
                           "isolation passes)", family="xrex"),
    "serving-block-rounding": Bug(serving_block_rounding, "xrex serving kernel", "isolation",
                                  "history key blocks of 128 run unmasked past P+L when it is not a multiple of "
                                  "128 (the bench default 130; production's 1024 is): the first candidates see "
                                  "each other and count themselves twice", family="xrex"),
}


def model_family(model: nn.Module) -> str:
    return "xrex" if any(isinstance(m, XrexAttention) for m in model.modules()) else "grok"


def bug_names(family: str = "grok") -> list[str]:
    """The bugs that can be planted in a model of `family` (grok | xrex)."""
    return [name for name, bug in BUGS.items() if bug.family == family]


def with_bug(model: nn.Module, bug: Optional[str]) -> nn.Module:
    """A copy of `model` (Transformer or RecsysModel) with the named bug, its modules copied and its
    parameters shared (a bug rewires, never changes a weight: no copy of a production trunk's 1.3 GB);
    None or "none" returns the model itself, unchanged."""
    if bug in (None, "none"):
        return model
    family = model_family(model)
    if bug not in bug_names(family):
        raise ValueError(f"bug: got {bug!r}; allowed: none, {', '.join(bug_names(family))} (the bugs a {family} "
                         f"model can carry)")
    buggy = _module_copy(model)
    BUGS[bug].patch(buggy)
    return buggy


def _module_copy(module: nn.Module) -> nn.Module:
    """`module` and its submodules copied, every other attribute shared: each module a new object whose
    attribute containers (its parameters, buffers and hooks dicts among them) are new, over the same tensors
    and values. A bug's patch sets attributes of the copy's modules (Bug.patch), so the original never
    changes. A seventh of copy.deepcopy's time (which walks every attribute's values): six copies a report."""
    new = object.__new__(type(module))
    new.__dict__.update({name: value.copy() if isinstance(value, (dict, list, set)) else value
                         for name, value in vars(module).items()})
    for name, child in module._modules.items():
        new._modules[name] = None if child is None else _module_copy(child)
    return new


class _OnTheInputOnce:
    """`model` as the probes call a trunk, its output on the report's own input (these very tensors, unperturbed)
    computed once: isolation's unperturbed pass and parity's pass of the same model are one forward, and parity's
    reference (the correct trunk) is the faithful row's — 24 forwards of a grok report instead of 36, the same
    numbers (the same model on the same tensors; scripts/same_figures.py: every case the same bytes). A lecture
    report, median of 5, two interleaved pairs on a shared machine: 105 -> 76 and 70 -> 54 ms (demo weights),
    148 -> 117 and 93 -> 70 ms (random, 30 history). Any other input (a perturbed copy, a capped layout) runs."""

    def __init__(self, model: nn.Module, embeddings, mask, candidate_start_offset):
        self.model, self.input = model, (embeddings, mask, candidate_start_offset)
        self.output = None

    def __call__(self, embeddings, mask, candidate_start_offset=None):
        x, m, offset = self.input
        if embeddings is x and mask is m and candidate_start_offset == offset:
            if self.output is None:
                self.output = self.model(embeddings, mask, candidate_start_offset)
            return self.output
        return self.model(embeddings, mask, candidate_start_offset)


def bug_report(model: nn.Module, embeddings, mask, candidate_start_offset=None,
               planted: Optional[Callable[[str], nn.Module]] = None) -> list[dict]:
    """Every probe on the correct trunk and on each bug: one row per model, probe values and
    whether each is flagged — the table a lecturer shows (and the README's). Probes with a position
    cap (causality) look at a capped layout of long inputs; ``probe_positions`` says how long.
    `planted(bug)`: `model` with the bug, where the caller keeps its copies (explorer.runs.bugged_trunk);
    by default a fresh ``with_bug`` each."""
    planted = planted or (lambda bug: with_bug(model, bug))
    rows = []
    correct = _OnTheInputOnce(model, embeddings, mask, candidate_start_offset)
    for bug in ("none", *bug_names(model_family(model))):
        # one copy per bug, shared by every probe; the reference for parity is `model` itself, the correct
        # trunk: built once, its pass on the input run once (the faithful row's)
        buggy = correct if bug == "none" else _OnTheInputOnce(planted(bug), embeddings, mask,
                                                              candidate_start_offset)
        results = [run_probe(p, buggy, embeddings, mask, candidate_start_offset,
                             **({"reference": correct} if p == "parity" else {})) for p in PROBES]
        rows.append({"bug": bug, "notebook": BUGS[bug].notebook if bug in BUGS else "",
                     "caught_by": BUGS[bug].probe if bug in BUGS else "",
                     **{r.probe: r.value for r in results}, "flagged": [r.probe for r in results if r.flagged],
                     "probe_positions": {r.probe: r.positions for r in results}})
    return rows
