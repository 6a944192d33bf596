"""Train every variant on associative recall and write their loss curves and weights (notebook 002's
experiment, without the Shakespeare download).

    python -m models.train_variants     # -> benchmarks/results/variants-training.json, models/demo/variants.safetensors
    python -m models.train_variants --steps 50 --variants mha mqa --out /tmp/r.json --weights /tmp/w.safetensors

The task (models.recall): `num_pairs` (key, value) pairs, then one of the keys again; predict its
value. Solving it takes attention — find the earlier copy of the query key, read the token after
it — so the curves compare how fast each attention system learns to do that:

    tokens   k3 v7 k1 v2 k5 v0 ... k1   ->  target v2
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .recall import TRAINED_WEIGHTS, RecallModel, RecallTask, save_trained
from .runinfo import RESULTS_DIR
from .train_demo import run_info
from .variants import VARIANTS, VariantConfig, parameter_count

RESULTS = RESULTS_DIR / "variants-training.json"


def train_variant(name: str, steps: int = 400, batch: int = 64, lr: float = 3e-3, seed: int = 0,
                  config: VariantConfig = VariantConfig(), task: RecallTask = RecallTask(),
                  log_every: int = 10) -> tuple[RecallModel, dict]:
    torch.manual_seed(seed)
    model = RecallModel(name, config, task, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    curve = []
    for step in range(steps):
        tokens, target = task.batch(batch, g)
        loss = F.cross_entropy(model(tokens), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            curve.append([step, round(loss.item(), 4)])
    accuracy = model.accuracy(*task.held_out())
    return model.eval(), {"parameters": parameter_count(model.body), "loss": curve,
                          "held_out_accuracy": round(accuracy, 4), "chance_accuracy": round(1 / task.num_values, 4)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--weights", type=Path, default=TRAINED_WEIGHTS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    config, task = VariantConfig(), RecallTask()
    results, models, t0 = {}, {}, time.perf_counter()
    for name in args.variants:
        t = time.perf_counter()
        models[name], results[name] = train_variant(name, args.steps, args.batch, seed=args.seed, config=config,
                                                    task=task)
        results[name]["seconds"] = round(time.perf_counter() - t, 1)
        r = results[name]
        print(f"{name:22s} params {r['parameters']:7d}  loss {r['loss'][0][1]:.3f} -> {r['loss'][-1][1]:.3f}  "
              f"accuracy {r['held_out_accuracy']:.3f}  {r['seconds']:.1f} s", flush=True)
    report = {**run_info(), "task": task.describe(), "task_config": task.__dict__, "steps": args.steps,
              "batch": args.batch, "config": config.__dict__, "weights": args.weights.name,
              "total_seconds": round(time.perf_counter() - t0, 1), "variants": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    save_trained(models, args.weights)
    print(f"wrote {args.out} ({report['total_seconds']} s) and {args.weights} "
          f"({args.weights.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
