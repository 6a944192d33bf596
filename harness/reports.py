"""What the benchmarks' reports share: an earlier commit's files and its short name, for a before/after run
interleaved in one process tree (``checkout``, ``short_commit``), and the nearest-rank ``percentile`` their
latencies are quoted by."""
from __future__ import annotations

import contextlib
import math
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def checkout(ref: str):
    """The files of commit `ref` in a temporary folder (git archive: no worktree registered)."""
    with tempfile.TemporaryDirectory(prefix="explorer-before-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def short_commit(ref: str) -> str:
    """Commit `ref`'s short hash, as a report names the version it measured."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True,
                          text=True).stdout.strip()


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in [0, 100]) of the values, in any order; nan when there are none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
