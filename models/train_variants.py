"""Train every variant on associative recall and write their loss curves (notebook 002's experiment,
without the Shakespeare download).

    python -m models.train_variants            # -> benchmarks/results/variants-training.json
    python -m models.train_variants --steps 50 --variants mha mqa

The task, generated in code: `num_pairs` (key, value) pairs, then one of the keys again; predict
its value. Solving it takes attention — find the earlier copy of the query key, read the token
after it — so the curves compare how fast each attention system learns to do that:

    tokens   k3 v7 k1 v2 k5 v0 ... k1   ->  target v2

Self-attention variants read the interleaved sequence and predict at the last position; the
encoder-decoder encodes the pairs and decodes from the query; DIN attends from the query key
over the pairs (each pair one behaviour: key + value embedding).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .train_demo import run_info
from .variants import VARIANTS, VariantConfig, build_variant, parameter_count

RESULTS = Path(__file__).parent.parent / "benchmarks" / "results" / "variants-training.json"


def recall_batch(batch: int, num_pairs: int, num_keys: int, num_values: int, g: torch.Generator):
    """-> tokens [B, 2P + 1] (keys 0..num_keys-1, values num_keys..), target [B] (value index)."""
    keys = torch.rand(batch, num_keys, generator=g).argsort(-1)[:, :num_pairs]        # distinct keys
    values = torch.randint(0, num_values, (batch, num_pairs), generator=g)
    pick = torch.randint(0, num_pairs, (batch, 1), generator=g)
    pairs = torch.stack((keys, values + num_keys), dim=-1).flatten(1)                 # [B, 2P]
    tokens = torch.cat((pairs, keys.gather(1, pick)), dim=1)
    return tokens, values.gather(1, pick).squeeze(1)


class RecallModel(nn.Module):
    """Token + position embeddings -> a variant -> LayerNorm -> value logits."""

    def __init__(self, name: str, config: VariantConfig, vocab: int, num_values: int, seq_len: int, seed: int):
        super().__init__()
        self.name, self.inputs = name, VARIANTS[name].inputs
        self.tokens = nn.Embedding(vocab, config.emb_size)
        self.positions = nn.Embedding(seq_len, config.emb_size)
        self.body = build_variant(name, config, seed).train()
        self.norm = nn.LayerNorm(config.emb_size)
        self.head = nn.Linear(config.emb_size, num_values)

    def forward(self, tokens):
        B, T = tokens.shape
        x = self.tokens(tokens) + self.positions(torch.arange(T))                     # [B, T, D]
        if self.inputs == "cross":
            h = self.body(x[:, -1:], memory=x[:, :-1]).embeddings                     # [B, 1, D]
        elif self.inputs == "target":
            pairs = x[:, :-1].reshape(B, (T - 1) // 2, 2, -1).sum(2)                  # [B, P, D] key + value
            h = self.body(pairs, candidates=self.tokens(tokens[:, -1:])).embeddings   # [B, 1, D]
        else:
            h = self.body(x).embeddings
        return self.head(self.norm(h[:, -1]))                                         # [B, num_values]


def train_variant(name: str, steps: int = 400, batch: int = 64, lr: float = 3e-3, seed: int = 0,
                  config: VariantConfig = VariantConfig(), num_pairs: int = 4, num_keys: int = 8,
                  num_values: int = 8, log_every: int = 10) -> dict:
    torch.manual_seed(seed)
    model = RecallModel(name, config, num_keys + num_values, num_values, 2 * num_pairs + 1, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    curve = []
    for step in range(steps):
        tokens, target = recall_batch(batch, num_pairs, num_keys, num_values, g)
        loss = F.cross_entropy(model(tokens), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            curve.append([step, round(loss.item(), 4)])
    with torch.no_grad():
        tokens, target = recall_batch(1024, num_pairs, num_keys, num_values, torch.Generator().manual_seed(10**6))
        accuracy = (model.eval()(tokens).argmax(-1) == target).float().mean().item()
    return {"parameters": parameter_count(model.body), "loss": curve, "held_out_accuracy": round(accuracy, 4),
            "chance_accuracy": round(1 / num_values, 4)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    config = VariantConfig()
    results, t0 = {}, time.perf_counter()
    for name in args.variants:
        t = time.perf_counter()
        results[name] = train_variant(name, args.steps, args.batch, seed=args.seed, config=config)
        results[name]["seconds"] = round(time.perf_counter() - t, 1)
        r = results[name]
        print(f"{name:22s} params {r['parameters']:7d}  loss {r['loss'][0][1]:.3f} -> {r['loss'][-1][1]:.3f}  "
              f"accuracy {r['held_out_accuracy']:.3f}  {r['seconds']:.1f} s", flush=True)
    report = {**run_info(), "task": "associative recall: 4 (key, value) pairs then a key; predict its value "
              "(8 keys, 8 values)", "steps": args.steps, "batch": args.batch, "config": config.__dict__,
              "total_seconds": round(time.perf_counter() - t0, 1), "variants": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} ({report['total_seconds']} s)")


if __name__ == "__main__":
    main()
