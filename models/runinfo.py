"""Where and when a result was measured: what every results file records.

``RESULTS_DIR`` (benchmarks/results/, where every committed measurement lives), ``device_name``,
``cpu_model`` and ``git_commit`` (one "dirty" rule for every report). On the lowest floor that writes results
(the training scripts), so every floor above can read it; what only the benchmarks use is harness.reports.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
# a result is "+dirty" when the code that produced it differs from its commit here
CODE_PATHS = ("app.py", "server", "benchmarks", "explorer", "models", "scripts", "harness", "static")


def cpu_model() -> str:
    """The processor's marketing name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: str = "cpu") -> str:
    """'NVIDIA H100 80GB HBM3' on CUDA; 'CPU <model> (<n> threads)' on CPU (the thread count matters
    there). Results files and the app's labels both start CPU names with 'CPU'."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(0)
    return f"CPU {cpu_model()} ({torch.get_num_threads()} threads)"


def git_commit() -> str:
    """Short commit of the checkout, '+dirty' when tracked code under CODE_PATHS differs from it;
    'unknown' outside a git checkout. EXPLORER_COMMIT, where set, is the answer: a GPU machine gets a copy of the
    working tree over a git folder of another commit (the second H100 run recorded '801f962+dirty' for 8151754)."""
    if os.environ.get("EXPLORER_COMMIT"):
        return os.environ["EXPLORER_COMMIT"]

    def git(*args) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, timeout=10,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + ("+dirty" if dirty else "")
