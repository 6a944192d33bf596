"""Associative recall: the synthetic task the variants are trained on, and their trained weights.

The task, generated in code (notebook 002's experiment without the Shakespeare download):
`num_pairs` (key, value) pairs, then one of the keys again; predict its value. Solving it takes
attention — find the earlier copy of the query key, read the value next to it:

    tokens   k3 v7 k1 v2 k5 v0 k6 v2 ?k1   ->  target v2

    task = RecallTask()
    tokens, target, labels = recall_example(seed=0)       # [1, 9], [1], ["k3", "v7", ..., "?k1"]
    model = load_trained_variant("mha")                    # RecallModel | None (no weights file)
    out = model.body(**model.body_inputs(tokens), record=True)
    queries, keys, match = model.attention_axes(tokens)    # tick labels + the columns holding the answer

``python -m models.train_variants`` trains every variant and writes ``models/demo/variants.safetensors``
(fp16, keys ``<variant>/<param>``, the task and VariantConfig as JSON metadata ``recall``).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from .variants import VariantConfig, _check_name, build_variant

TRAINED_WEIGHTS = Path(__file__).parent / "demo" / "variants.safetensors"
HELD_OUT_SEED = 10**6        # the held-out set and recall_example draw from generators seeded here and above


@dataclass(frozen=True)
class RecallTask:
    num_pairs: int = 4
    num_keys: int = 8            # tokens 0 .. num_keys-1 are keys, the next num_values are values
    num_values: int = 8

    @property
    def vocab(self) -> int:
        return self.num_keys + self.num_values

    @property
    def seq_len(self) -> int:
        return 2 * self.num_pairs + 1

    def describe(self) -> str:
        return (f"associative recall: {self.num_pairs} (key, value) pairs then a key; predict its value "
                f"({self.num_keys} keys, {self.num_values} values)")

    def batch(self, batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """-> tokens [B, 2P + 1] (keys 0..num_keys-1, values num_keys..), target [B] (value index)."""
        keys = torch.rand(batch, self.num_keys, generator=g).argsort(-1)[:, :self.num_pairs]   # distinct keys
        values = torch.randint(0, self.num_values, (batch, self.num_pairs), generator=g)
        pick = torch.randint(0, self.num_pairs, (batch, 1), generator=g)
        pairs = torch.stack((keys, values + self.num_keys), dim=-1).flatten(1)                  # [B, 2P]
        tokens = torch.cat((pairs, keys.gather(1, pick)), dim=1)
        return tokens, values.gather(1, pick).squeeze(1)

    def token_labels(self, tokens: torch.Tensor) -> list[str]:
        """tokens [T] -> ["k3", "v7", ..., "?k1"]: what each position is, for tick labels."""
        labels = [f"k{t}" if t < self.num_keys else f"v{t - self.num_keys}" for t in tokens.tolist()]
        return labels[:-1] + ["?" + labels[-1]]

    def held_out(self, batch: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch(batch, torch.Generator().manual_seed(HELD_OUT_SEED))


def recall_example(seed: int = 0, task: RecallTask = RecallTask()) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """One held-out example: tokens [1, T], target [1] (value index), token labels [T]."""
    tokens, target = task.batch(1, torch.Generator().manual_seed(HELD_OUT_SEED + 1 + int(seed)))
    return tokens, target, task.token_labels(tokens[0])


class RecallModel(nn.Module):
    """Token + position embeddings -> a variant -> LayerNorm -> value logits.

    Self-attention variants read the interleaved sequence and predict at the last position; the
    encoder-decoder encodes the pairs and decodes from the query; DIN attends from the query key
    over the pairs (each pair one behaviour: key + value embedding)."""

    def __init__(self, name: str, config: VariantConfig = VariantConfig(), task: RecallTask = RecallTask(),
                 seed: int = 0):
        super().__init__()
        self.name, self.inputs, self.task = name, _check_name(name).inputs, task
        self.tokens = nn.Embedding(task.vocab, config.emb_size)
        self.positions = nn.Embedding(task.seq_len, config.emb_size)
        self.body = build_variant(name, config, seed).train()
        self.norm = nn.LayerNorm(config.emb_size)
        self.head = nn.Linear(config.emb_size, task.num_values)

    @property
    def config(self) -> VariantConfig:
        return self.body.config

    def body_inputs(self, tokens: torch.Tensor) -> dict:
        """tokens [B, T] -> the keyword inputs of ``self.body(..., record=True)``."""
        B, T = tokens.shape
        x = self.tokens(tokens) + self.positions(torch.arange(T, device=tokens.device))      # [B, T, D]
        if self.inputs == "cross":
            return {"embeddings": x[:, -1:], "memory": x[:, :-1]}                            # [B, 1, D], [B, 2P, D]
        if self.inputs == "target":
            pairs = x[:, :-1].reshape(B, (T - 1) // 2, 2, -1).sum(2)                         # [B, P, D] key + value
            return {"embeddings": pairs, "candidates": self.tokens(tokens[:, -1:])}          # [B, 1, D]
        return {"embeddings": x}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> value logits [B, num_values] (read at the last query position)."""
        h = self.body(**self.body_inputs(tokens)).embeddings
        return self.head(self.norm(h[:, -1]))

    def attention_axes(self, tokens: torch.Tensor) -> tuple[list[str], list[str], list[int]]:
        """tokens [T] or [1, T] -> (query labels, key labels, key columns of the queried pair) along the
        body's recorded probs [.., Tq, Tk]: the last query row should land on those columns."""
        tokens = tokens.reshape(-1)
        labels = self.task.token_labels(tokens)
        pair = [int(i) for i in (tokens[:-1:2] == tokens[-1]).nonzero().flatten()][0]       # which pair is asked
        if self.inputs == "cross":
            return labels[-1:], labels[:-1], [2 * pair, 2 * pair + 1]
        if self.inputs == "target":
            return labels[-1:], [f"{k} {v}" for k, v in zip(labels[:-1:2], labels[1:-1:2])], [pair]
        return labels, labels, [2 * pair, 2 * pair + 1]

    @torch.no_grad()
    def accuracy(self, tokens: torch.Tensor, target: torch.Tensor) -> float:
        was_training = self.training
        correct = (self.eval()(tokens).argmax(-1) == target).float().mean().item()
        self.train(was_training)
        return correct


def save_trained(models: dict[str, RecallModel], path: Path | str = TRAINED_WEIGHTS) -> None:
    """fp16 tensors keyed ``<variant>/<param>``; the task and config as JSON metadata. No dates:
    the same training writes the same bytes."""
    from safetensors.torch import save_file
    first = next(iter(models.values()))
    tensors = {f"{name}/{k}": v.detach().to(torch.float16).contiguous()
               for name, m in models.items() for k, v in m.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # one metadata entry: safetensors writes several in hash order, and the bytes would differ per run
    meta = json.dumps({"config": asdict(first.config), "task": asdict(first.task)})
    save_file(tensors, str(path), metadata={"recall": meta})


def load_trained_variant(name: str, path: Path | str | None = None) -> Optional[RecallModel]:
    """The variant as trained on associative recall (fp32, eval mode), or None when the file or the
    variant's entries are missing. ``model.config`` / ``model.task`` are what it was trained with."""
    from safetensors import safe_open
    _check_name(name)
    path = Path(path or TRAINED_WEIGHTS)
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {})["recall"])
        prefix = name + "/"
        state = {k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
    if not state:
        return None
    model = RecallModel(name, VariantConfig(**meta["config"]), RecallTask(**meta["task"]))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()

