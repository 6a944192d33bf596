"""The shipped demo weights rank well and attend by topic; the world and the training loop are sound."""
import pytest
import torch

from models.demo import (DEMO_WEIGHTS, DEMO_WORLD, auc, demo_batch, demo_example, evaluate, load_demo_model,
                         topic_attention_mass)
from models.recsys import ACTIONS, SequenceLayout
from models.world import WORLD_ACTIONS
from models.train_demo import train
from models.weights import config_from_weight_file
from tolerances import assert_bit_exact

LECTURE = SequenceLayout(1, 5, 3)


@pytest.fixture(scope="module")
def model():
    return load_demo_model()


def test_weights_ship_small_and_carry_their_config():
    assert DEMO_WEIGHTS.exists() and DEMO_WEIGHTS.stat().st_size < 500_000
    assert config_from_weight_file(DEMO_WEIGHTS) == load_demo_model().config


@pytest.mark.parametrize("layout", [LECTURE, SequenceLayout(1, 8, 4, history_padding=2, candidate_padding=1)])
def test_held_out_auc_and_same_topic_attention(model, layout):
    report = evaluate(model, layout, batch=400, seed=1)
    assert report["auc"] >= 0.85
    assert report["same_topic_mass"] > report["other_topic_mass"]
    assert report["candidates"] > 100


def test_topic_mass_is_computed_from_the_rows_it_claims():
    """A hand-made attention map that puts all candidate weight on same-topic items scores 0 other."""
    batch, labels = demo_example(LECTURE, seed=2, batch=8)
    T, off = LECTURE.seq_len, LECTURE.candidate_start_offset
    probs = torch.zeros(8, 2, T, T)
    same = labels.history_topics[:, None, :] == labels.candidate_topics[:, :, None]        # [B, C, S]
    probs[:, :, off:, 1:off] = same[:, None].float() / same.sum(-1, keepdim=True).clamp_min(1)[:, None]
    mass = topic_attention_mass([probs], labels, LECTURE)
    assert mass["other_topic_mass"] == 0 and mass["same_topic_mass"] > 0


def test_auc_definition():
    labels = torch.tensor([1, 0, 1, 0])
    assert auc(torch.tensor([4.0, 1.0, 3.0, 2.0]), labels) == 1.0
    assert auc(torch.tensor([1.0, 4.0, 2.0, 3.0]), labels) == 0.0
    assert auc(torch.zeros(4), labels) == 0.5
    with pytest.raises(ValueError, match="labels"):
        auc(torch.ones(3), torch.ones(3))


def test_world_is_deterministic_and_padding_is_hash_zero():
    layout = SequenceLayout(1, 6, 4, history_padding=2, candidate_padding=1)
    (a, la), (b, lb) = DEMO_WORLD.sample(layout, 4, seed=5), DEMO_WORLD.sample(layout, 4, seed=5)
    assert torch.equal(a.history_post_hashes, b.history_post_hashes)
    assert_bit_exact(lb.actions, la.actions, "same computation")            # the same seed, the same draws
    assert not torch.equal(a.history_post_hashes, DEMO_WORLD.sample(layout, 4, seed=6)[0].history_post_hashes)
    assert (a.history_post_hashes[:, 4:] == 0).all() and (a.candidate_post_hashes[:, 3:] == 0).all()
    assert (la.history_topics[:, 4:] == -1).all() and not la.engaged[:, 3:].any()
    assert torch.equal(la.engaged, la.actions[..., WORLD_ACTIONS.index("favorite_score")].bool())


def test_world_actions_are_the_originals_in_its_order():
    """The demo world uses 8 of the original's 19 actions (runners.ACTIONS), in the original's order."""
    assert len(ACTIONS) == 19 and ACTIONS[0] == "favorite_score" and ACTIONS[-1] == "dwell_time"
    assert list(WORLD_ACTIONS) == sorted(WORLD_ACTIONS, key=ACTIONS.index) and len(WORLD_ACTIONS) == 8


def test_engagement_follows_the_users_topics():
    """Candidates whose topic the history engaged with are engaged far more often (the signal)."""
    _, labels = demo_example(LECTURE, seed=0, batch=2000)
    liked = labels.history_topics.clone()
    seen = (liked[:, None, :] == labels.candidate_topics[:, :, None]).any(-1)             # [B, C]
    assert labels.engaged[seen].float().mean() > 2 * labels.engaged[~seen].float().mean()


def test_demo_batch_fits_the_demo_model(model):
    out = model(demo_batch(LECTURE, seed=0, batch=2), record=True)
    assert out.logits.shape == (2, 3, len(WORLD_ACTIONS))
    assert model.config.action_names == WORLD_ACTIONS
    assert out.trunk.layers[0].probs.shape == (2, 4, 9, 9)


def test_training_loop_learns_and_is_deterministic():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)            # as the script runs; tiny batches only lose on thread sync
    try:
        _, curve = train(steps=16, batch=32, log_every=15, verbose=False)
        _, again = train(steps=16, batch=32, log_every=15, verbose=False)
    finally:
        torch.set_num_threads(threads)
    assert curve == again
    assert curve[-1]["loss"] < curve[0]["loss"]


# --- the production-shaped demo ranker (models.xrex.XrexRecsys) ------------------------------

def test_production_demo_ranks_by_topic_and_ships_small():
    """The shipped production-shaped ranker (python -m models.train_demo --family xrex) scores held-out
    users by topic, its candidates look more at same-topic history, and the app runs it."""
    from models.demo import XREX_DEMO_WEIGHTS, load_xrex_demo_model
    assert XREX_DEMO_WEIGHTS.stat().st_size < 1_000_000
    model = load_xrex_demo_model()
    for layout in (SequenceLayout(1, 5, 3), SequenceLayout(1, 8, 4)):
        r = evaluate(model, layout, batch=256)
        assert r["auc"] > 0.85 and r["same_topic_mass"] > r["other_topic_mass"], r
    from explorer import runs
    from explorer.query_string import parse_query
    s = parse_query("preset=lecture&family=xrex&weights=demo&history_padding=1")
    with torch.no_grad():
        direct = model(demo_batch(s.layout, s.seed)).logits
    assert_bit_exact(runs.forward(s).logits, direct, "same computation")


def test_production_demo_training_learns_the_trained_heads():
    """A short run on production's trunk moves the heads it trains (XREX_HEADS) and only those."""
    from models.demo import XREX_HEADS, xrex_demo_model
    from models.grok import init_params
    start = init_params(xrex_demo_model(), "random", 0).ranker.unembeddings.detach().clone()
    model, curve = train(steps=3, batch=8, log_every=1, verbose=False, family="xrex")
    assert len(curve) == 3 and all(torch.isfinite(torch.tensor(c["loss"])) for c in curve)
    moved = (model.ranker.unembeddings.detach() != start).any(0)                       # [64] per head
    assert moved.nonzero().flatten().tolist() == sorted(XREX_HEADS.values())
    with pytest.raises(ValueError, match="family: got 'gpt'"):
        train(steps=1, family="gpt")
    assert set(XREX_HEADS) <= set(WORLD_ACTIONS)
