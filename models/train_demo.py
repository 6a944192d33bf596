"""Train the lecture-sized Phoenix ranker on the synthetic world; write the app's demo weights.

    python -m models.train_demo                 # -> models/demo/lecture.safetensors
    python -m models.train_demo --steps 50 --out /tmp/w.safetensors

CPU, one thread, deterministic (seeded data and init, deterministic algorithms): the same command
writes the same bytes. Each step draws a fresh batch of world users with a history length and
candidate count from TRAIN_LAYOUTS, so the ranker works on the app's layouts, not one shape.
"""
from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from .demo import (DEMO_WEIGHTS, DEMO_WORLD, HELD_OUT_SEED, XREX_DEMO_WEIGHTS, XREX_HEADS, demo_config, evaluate,
                   load_demo_model, load_xrex_demo_model, xrex_demo_model)
from .grok import init_params
from .world import WORLD_ACTIONS
from .recsys import RecsysModel, SequenceLayout, init_recsys
from .runinfo import RESULTS_DIR, device_name, git_commit

TRAIN_LAYOUTS = tuple(SequenceLayout(1, s, c, hp, cp) for s, c, hp, cp in
                      ((5, 3, 0, 0), (8, 4, 0, 0), (6, 3, 1, 0), (10, 4, 2, 1), (4, 2, 0, 0), (12, 6, 0, 0)))


EVAL_LAYOUTS = (SequenceLayout(1, 5, 3), SequenceLayout(1, 8, 4))
REPORT = RESULTS_DIR / "demo-training.json"
XREX_REPORT = RESULTS_DIR / "demo-training-xrex.json"
FAMILIES = ("grok", "xrex")


def save_fp16(model: RecsysModel, path: Path) -> None:
    """float16 keeps the shipped file small; load_weights reads it back into an fp32 model."""
    from .weights import save_weights
    path.parent.mkdir(parents=True, exist_ok=True)
    save_weights(model, path, dtype="float16")


def run_info() -> dict:
    """Where and when a result was measured (for benchmarks/results/*.json)."""
    return {"device": device_name("cpu"), "torch": torch.__version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit()}


def train(steps: int = 700, batch: int = 128, lr: float = 3e-3, seed: int = 0, log_every: int = 100,
          verbose: bool = True, family: str = "grok") -> tuple[RecsysModel, list[dict]]:
    """-> (trained model, [{"step", "loss"}] every `log_every` steps). family xrex: production's trunk,
    trained on the world's actions that production's heads name (demo.XREX_HEADS)."""
    if family not in FAMILIES:
        raise ValueError(f"family: got {family!r}; allowed: {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _train(steps, batch, lr, seed, log_every, verbose, family)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


def _train(steps, batch, lr, seed, log_every, verbose, family="grok"):
    if family == "xrex":
        model = init_params(xrex_demo_model(), "random", seed)
        heads = torch.tensor(list(XREX_HEADS.values()))                               # logit columns trained
        targets = torch.tensor([WORLD_ACTIONS.index(a) for a in XREX_HEADS])            # their label columns
    else:
        model = init_recsys(RecsysModel(demo_config()), "random", seed)
        heads = targets = torch.arange(len(WORLD_ACTIONS))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    curve = []
    for step in range(steps):
        layout = TRAIN_LAYOUTS[step % len(TRAIN_LAYOUTS)]
        inputs, labels = DEMO_WORLD.sample(layout, batch, seed * HELD_OUT_SEED // 100 + step)
        assert seed * HELD_OUT_SEED // 100 + step < HELD_OUT_SEED, "training must not reach held-out seeds"
        logits = model(inputs).logits[..., heads]                                  # [B, C, A]
        valid = (labels.candidate_topics >= 0)[..., None].float()                  # padded candidates out
        loss = (F.binary_cross_entropy_with_logits(logits, labels.actions[..., targets], reduction="none")
                * valid).sum() \
            / (valid.sum() * logits.shape[-1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            curve.append({"step": step, "loss": round(loss.item(), 5)})
            if verbose:
                print(f"step {step:5d}  loss {loss.item():.4f}", flush=True)
    return model.eval(), curve


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, help="default 700; 1200 for xrex (its loss leaves the base rate later)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family", choices=FAMILIES, default="grok")
    p.add_argument("--out", type=Path)
    p.add_argument("--report", type=Path)
    args = p.parse_args(argv)
    xrex = args.family == "xrex"
    args.steps = args.steps or (1200 if xrex else 700)
    args.out = args.out or (XREX_DEMO_WEIGHTS if xrex else DEMO_WEIGHTS)
    args.report = args.report or (XREX_REPORT if xrex else REPORT)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, curve = train(args.steps, args.batch, args.lr, args.seed, family=args.family)
    seconds = time.perf_counter() - t0
    if xrex:       # its own names (the app's loader reads grok.py's): state dict keys, fp16, one metadata entry
        from safetensors.torch import save_file
        args.out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().half().contiguous() for k, v in sorted(model.state_dict().items())},
                  str(args.out), metadata={"family": "xrex"})
    else:
        save_fp16(model, args.out)
    load = load_xrex_demo_model if xrex else load_demo_model
    # measured on what ships: the fp16 file loaded back into an fp32 model
    report = {"train_seconds": round(seconds, 1), "steps": args.steps, "batch": args.batch,
              "weights": args.out.name, "bytes": args.out.stat().st_size, **run_info(),
              "family": args.family,
              "held_out": [evaluate(load(args.out), layout) for layout in EVAL_LAYOUTS],
              "loss_curve": curve}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "loss_curve"}, indent=1))


if __name__ == "__main__":
    main()
