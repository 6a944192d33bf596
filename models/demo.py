"""The app's default weights and inputs: the lecture-sized ranker trained on the synthetic world.

    model = load_demo_model()                       # RecsysModel with models/demo/lecture.safetensors
    batch = demo_batch(SequenceLayout(1, 5, 3), seed=0)
    report = evaluate(model, SequenceLayout(1, 5, 3))  # {"auc": ..., "same_topic_mass": ..., ...}

Regenerate the weights with ``python -m models.train_demo`` (CPU, deterministic, < 3 minutes).
"""
from __future__ import annotations

from pathlib import Path

import torch

from .presets import get_preset
from .recsys import RecsysBatch, RecsysConfig, RecsysModel, SequenceLayout
from .world import ENGAGED_ACTION, WORLD_ACTIONS, World, WorldLabels

DEMO_WEIGHTS = Path(__file__).parent / "demo" / "lecture.safetensors"
DEMO_WORLD = World(seed=0)
DEMO_PRESET = "lecture"
HELD_OUT_SEED = 10_000_000   # training draws seeds below this, evaluation at and above it


def demo_config() -> RecsysConfig:
    return DEMO_WORLD.recsys_config(get_preset(DEMO_PRESET).transformer)


# --- the production-shaped demo ranker (models.xrex.XrexRecsys) on the same world ------------------

XREX_DEMO_WEIGHTS = Path(__file__).parent / "demo" / "xrex-lecture.safetensors"
# the world's actions that production's heads name (docs/originals.md §5: head i = recsys.proto ActionName i);
# the demo ranker is trained on these heads only
XREX_HEADS = {"favorite_score": 1, "reply_score": 4, "repost_score": 6, "click_score": 29, "share_score": 37}


def xrex_demo_config():
    """Production's trunk at the lecture geometry and layout: one prefix token (the world has one user token)."""
    return get_preset(DEMO_PRESET).xrex_config()


# the world's vocabularies, for models.xrex.ProjectThenSum
XREX_DEMO_INPUTS = dict(hash_vocab_size=DEMO_WORLD.hash_vocab_size, num_history_actions=len(WORLD_ACTIONS),
                        num_product_surfaces=DEMO_WORLD.num_product_surfaces)


def xrex_demo_model(config=None):
    """An untrained XrexRecsys sized for the world's vocabularies (`config`: another XrexConfig of the
    demo geometry, e.g. with a logit cap)."""
    from .xrex import XrexRecsys
    return XrexRecsys(config or xrex_demo_config(), **XREX_DEMO_INPUTS)


def load_xrex_demo_model(path: Path | str = XREX_DEMO_WEIGHTS, config=None):
    """The trained production-shaped demo ranker in eval mode (fp32)."""
    from safetensors.torch import load_file
    model = xrex_demo_model(config)
    model.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()})
    return model.float().eval()


def load_demo_model(path: Path | str = DEMO_WEIGHTS) -> RecsysModel:
    """The trained lecture ranker in eval mode (fp32)."""
    from .weights import load_weights
    model = RecsysModel(demo_config())
    load_weights(model, path)
    return model.float().eval()


def demo_batch(layout: SequenceLayout, seed: int = 0, batch: int = 1) -> RecsysBatch:
    """World-generated inputs (held out from training) for the demo model."""
    return DEMO_WORLD.sample(layout, batch, HELD_OUT_SEED + int(seed))[0]


def demo_example(layout: SequenceLayout, seed: int = 0, batch: int = 1) -> tuple[RecsysBatch, WorldLabels]:
    """demo_batch plus what the world knows: topics of every item and the true engagement."""
    return DEMO_WORLD.sample(layout, batch, HELD_OUT_SEED + int(seed))


def engagement_scores(logits: torch.Tensor, head: int = WORLD_ACTIONS.index(ENGAGED_ACTION)) -> torch.Tensor:
    """[B, C, A] logits -> [B, C]: the logit of the action that marks engagement (`head`: its index;
    production's ranker predicts it on its FAV head, XREX_HEADS)."""
    return logits[..., head]


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney, ties count half). scores, labels: [N]."""
    scores, labels = scores.double().flatten(), labels.bool().flatten()
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("labels: need both engaged and not-engaged candidates for an AUC")
    greater = (pos[:, None] > neg[None, :]).double().mean()
    ties = (pos[:, None] == neg[None, :]).double().mean()
    return float(greater + 0.5 * ties)


def topic_attention_mass(probs: list[torch.Tensor], labels: WorldLabels, layout: SequenceLayout) -> dict:
    """Where candidates look in the history, by topic.

    probs: per layer [B, H, T, T] (the trunk's recorded probs). For each valid candidate whose
    history holds both same-topic and other-topic items: the mean attention weight per same-topic
    history item and per other-topic item, averaged over heads, then over candidates.
    -> {"same_topic_mass", "other_topic_mass", "per_layer": [{"same", "other"}], "candidates"}.
    """
    U, S, off = layout.num_user, layout.num_history, layout.candidate_start_offset
    ht, ct = labels.history_topics, labels.candidate_topics                    # [B, S], [B, C]
    same = (ht[:, None, :] == ct[:, :, None]) & (ct[:, :, None] >= 0) & (ht[:, None, :] >= 0)  # [B, C, S]
    other = (ht[:, None, :] != ct[:, :, None]) & (ct[:, :, None] >= 0) & (ht[:, None, :] >= 0)
    usable = same.any(-1) & other.any(-1)                                      # [B, C]
    per_layer = []
    for p in probs:
        rows = p.float().mean(1)[:, off:, U:U + S]                             # [B, C, S] head mean
        same_mean = (rows * same).sum(-1) / same.sum(-1).clamp_min(1)
        other_mean = (rows * other).sum(-1) / other.sum(-1).clamp_min(1)
        per_layer.append({"same": float(same_mean[usable].mean()), "other": float(other_mean[usable].mean())})
    return {"same_topic_mass": sum(d["same"] for d in per_layer) / len(per_layer),
            "other_topic_mass": sum(d["other"] for d in per_layer) / len(per_layer),
            "per_layer": per_layer, "candidates": int(usable.sum())}


@torch.no_grad()
def evaluate(model: RecsysModel, layout: SequenceLayout = SequenceLayout(1, 5, 3), batch: int = 512,
             seed: int = 0) -> dict:
    """Held-out AUC (engaged vs not) and the topic attention masses on `batch` world users."""
    inputs, labels = demo_example(layout, seed, batch)
    out = model(inputs, record=True)
    valid = labels.candidate_topics >= 0
    head = WORLD_ACTIONS.index(ENGAGED_ACTION) if isinstance(model, RecsysModel) else XREX_HEADS[ENGAGED_ACTION]
    report = {"auc": auc(engagement_scores(out.logits, head)[valid], labels.engaged[valid]),
              "layout": layout.__dict__, "users": batch}
    report.update(topic_attention_mass([t.probs for t in out.trunk.layers], labels, layout))
    return report
