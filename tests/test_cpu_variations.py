"""The numerics tests hold on any x86-64 CPU: rerun in subprocesses on each of PyTorch's CPU kernel paths
(ATEN_CPU_CAPABILITY), MKL's SSE4.2 path and 1 or 2 threads. These change how fp32 reductions are split, so
they reproduce what another CPU (an AMD EPYC, an older Xeon) computes; tests/tolerances.py says why the
tolerances cover it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the tests that compare two roundings of the same real numbers: another order, batch, kernel or a float64
# reference (bit-exact ones hold on any path by construction)
NUMERICS = ["tests/test_xrex.py", "tests/test_recsys.py", "tests/test_grok.py", "tests/test_variants.py",
            "tests/test_attention.py::test_backend_matches_naive",
            "tests/test_attention.py::test_whole_model_matches_naive"]
SELECT = "not slow and not gpu"

VARIATIONS = {                      # name: environment; capabilities above the CPU's fall back to its best
    "default-1thread": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"},
    "avx2-2threads": {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2"},
    "avx512-1thread": {"ATEN_CPU_CAPABILITY": "avx512", "OMP_NUM_THREADS": "1"},
    "mkl-sse42-2threads": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OMP_NUM_THREADS": "2"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIATIONS))
def test_numerics_hold_on_every_cpu_kernel_path(name):
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    env.update(VARIATIONS[name])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", SELECT,
                           *NUMERICS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name}: {VARIATIONS[name]}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
