"""The associative recall task and the shipped trained variants (models/demo/variants.safetensors)."""
import json

import pytest
import torch

from models.recall import (TRAINED_WEIGHTS, RecallModel, RecallTask, load_trained_variant, recall_example,
                           save_trained)
from models.train_variants import RESULTS
from models.variants import VARIANTS, VariantConfig
from tolerances import assert_bit_exact

TASK = RecallTask()
shipped = pytest.mark.skipif(not (TRAINED_WEIGHTS.is_file() and RESULTS.is_file()),
                             reason="run python -m models.train_variants")


def test_the_query_key_occurs_once_among_the_pairs_and_labels_name_every_token():
    tokens, target = TASK.batch(256, torch.Generator().manual_seed(0))
    keys, values = tokens[:, :-1:2], tokens[:, 1:-1:2]
    assert (keys < TASK.num_keys).all() and (values >= TASK.num_keys).all()
    match = keys == tokens[:, -1:]
    assert (match.sum(1) == 1).all()
    assert torch.equal(values[match] - TASK.num_keys, target)        # the target is the queried pair's value
    labels = TASK.token_labels(tokens[0])
    assert labels[-1] == "?" + labels[2 * int(match[0].nonzero())]
    assert [lab[0] for lab in labels[:-1]] == ["k", "v"] * TASK.num_pairs


@pytest.mark.parametrize("name", ["mha", "encoder-decoder", "din-target-attention"])
def test_attention_axes_follow_the_recorded_maps_and_point_at_the_queried_pair(name):
    model = RecallModel(name, VariantConfig(emb_size=16, num_heads=2, num_kv_heads=1, latent_dim=4), TASK)
    tokens, target, labels = recall_example(3, TASK)
    queries, keys, answer = model.attention_axes(tokens)
    probs = model.body(**model.body_inputs(tokens), record=True).layers[0].probs     # [1, H, Tq, Tk]
    assert probs.shape[-2:] == (len(queries), len(keys))
    assert queries[-1] == labels[-1] and keys[answer[0]].startswith(labels[-1][1:])     # "?k3" -> "k3", "k3 v5"
    assert keys[answer[-1]].endswith(f"v{int(target)}")


def test_saved_weights_round_trip_in_fp16_and_the_same_models_write_the_same_bytes(tmp_path):
    models = {n: RecallModel(n, VariantConfig(emb_size=16, num_heads=2, num_kv_heads=1, latent_dim=4), TASK, seed=1)
              for n in ("gqa", "din-target-attention")}
    save_trained(models, tmp_path / "a.safetensors")
    save_trained(models, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    loaded = load_trained_variant("gqa", tmp_path / "a.safetensors")
    assert loaded.config == models["gqa"].config and loaded.task == TASK
    for (k, v), (k2, v2) in zip(models["gqa"].state_dict().items(), loaded.state_dict().items()):
        assert k == k2
        assert_bit_exact(v2, v.half().float(), "no rounding")       # the same fp16 values, widened
    assert load_trained_variant("mla", tmp_path / "a.safetensors") is None            # not in the file
    assert load_trained_variant("mha", tmp_path / "missing.safetensors") is None
    with pytest.raises(ValueError, match="variant: got 'nope'"):
        load_trained_variant("nope", tmp_path / "a.safetensors")


@shipped
def test_shipped_weights_reproduce_the_reported_held_out_accuracy():
    report = json.loads(RESULTS.read_text())
    assert set(report["variants"]) == set(VARIANTS)
    assert TRAINED_WEIGHTS.stat().st_size < 2.5e6                    # small enough to ship in the repo
    held_out = TASK.held_out()
    for name, r in report["variants"].items():
        model = load_trained_variant(name)
        assert model.task == TASK and model.config == VariantConfig(**report["config"])
        # fp16 storage may flip a borderline example or two out of 1024
        assert model.accuracy(*held_out) == pytest.approx(r["held_out_accuracy"], abs=0.01), name


@shipped
def test_trained_mha_looks_up_the_queried_pair_on_fresh_examples():
    """What the Variants view shows: the query row's weight lands on the pair it asks for."""
    model = load_trained_variant("mha")
    tokens, target = TASK.batch(256, torch.Generator().manual_seed(123))
    assert model.accuracy(tokens, target) > 0.9
    with torch.no_grad():
        last = model.body(**model.body_inputs(tokens), record=True).layers[-1].probs[:, :, -1]  # [B, H, T]
    pair = (tokens[:, :-1:2] == tokens[:, -1:]).float().argmax(1)                              # [B]
    on_pair = last.gather(2, torch.stack((2 * pair, 2 * pair + 1), 1)[:, None].expand(-1, last.shape[1], -1))
    assert on_pair.sum(-1).mean() > 0.5                  # chance would be 2 of 9 positions
