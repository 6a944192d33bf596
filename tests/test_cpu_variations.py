"""The numerics tests hold on any x86-64 CPU, Intel or AMD, at any thread count: rerun in subprocesses on
other CPU kernel paths than this machine's defaults. These change how fp32 reductions are split, so they
reproduce what another CPU computes (tests/tolerances.py says why the tolerances cover it):

- ATEN_CPU_CAPABILITY picks PyTorch's own vector kernels (default / avx2 / avx512);
- MKL_ENABLE_INSTRUCTIONS picks MKL's GEMM path: AVX2 is the path MKL takes on an AMD EPYC, and there the
  thread count changes the bits of a forward (measured: lecture's layer-0 probabilities with 1 and 2
  threads differ by 2e-7), which it does not on this Intel machine's AVX-512 path;
- the thread count of the test process (OMP_NUM_THREADS) and of the server (EXPLORER_THREADS).

A capability below the CPU's also caps oneDNN's (ONEDNN_MAX_CPU_ISA), as on a CPU that lacks the rest: torch asks
oneDNN whether to pack bf16 for AVX-512/AMX (cpublas::could_pack) but runs the kernel built for the forced
capability, which then fails 'pack_vnni2 is only supported when avx512 is supported' (seen on CI's AMX CPU) — a
machine no CPU is. ATEN_CPU_CAPABILITY=default also turns compiled flex off (torch's CPU flex template needs
AVX2), which the registry reports as flex unavailable there.

Two sets: every non-slow test of a module that compares floats (imports tests/tolerances.py) under four
kernel paths; and the tests that compare the server's numbers with this process's or the page's (marker
served_numbers) with the server on *other* kernels and threads than the test process
(EXPLORER_TEST_SERVER_ENV, read by tests/conftest.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS",
              "EXPLORER_THREADS", "EXPLORER_TEST_SERVER_ENV")
ONEDNN_ISA = {"default": "SSE41", "avx2": "AVX2"}        # oneDNN's cap for a CPU with no more than that


def forced(capability: str) -> dict:
    """ATen's kernels at `capability`, and oneDNN held to the same, as on a CPU with no more than that."""
    return {"ATEN_CPU_CAPABILITY": capability, "ONEDNN_MAX_CPU_ISA": ONEDNN_ISA[capability]}


def numerics_modules() -> list[str]:
    """The test modules that compare floating-point results: those that import tests/tolerances.py."""
    return sorted(f"tests/{p.name}" for p in TESTS.glob("test_*.py")
                  if "from tolerances import" in p.read_text() and p.name != Path(__file__).name)


IN_PROCESS = {                      # name: environment; capabilities above the CPU's fall back to its best
    "default-1thread": {**forced("default"), "OMP_NUM_THREADS": "1"},
    "avx2-2threads": {**forced("avx2"), "OMP_NUM_THREADS": "2"},
    "mkl-avx2-amd-path-1thread": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "1"},
    "mkl-sse42-2threads": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OMP_NUM_THREADS": "2"},
}

SERVED = {                          # name: (the test process's environment, the server's on top of it)
    "tests-amd-path-2threads/server-avx2-1thread": (
        {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "2"},
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX512 EXPLORER_THREADS=1"),
    "tests-default-1thread/server-amd-path-2threads": (
        {**forced("default"), "OMP_NUM_THREADS": "1"},
        "ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX2 EXPLORER_THREADS=2"),
}


def within_this_cpu(server_env: str) -> str:
    """`server_env` ("NAME=value ...") with an ATEN_CPU_CAPABILITY above this CPU's best lowered to it: torch does
    not lower it itself, and a server forced to AVX-512 on a CPU without it dies of an illegal instruction (seen on
    an AMD EPYC without AVX-512: exit 132 at the first request)."""
    import torch
    order = ["default", "avx2", "avx512"]
    best = torch.backends.cpu.get_cpu_capability().lower()
    best = best if best in order else "default"
    parts = []
    for part in server_env.split():
        name, _, value = part.partition("=")
        if name == "ATEN_CPU_CAPABILITY" and value in order and order.index(value) > order.index(best):
            value = best
        parts.append(f"{name}={value}")
    return " ".join(parts)


def rerun(env_changes: dict, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1200)


def test_every_forced_capability_caps_onednn_to_match():
    forced = [env for env in IN_PROCESS.values()] + [{**t, **dict(x.split("=") for x in srv.split())}
                                                      for t, srv in SERVED.values()]
    for env in forced:
        cap = env.get("ATEN_CPU_CAPABILITY")
        assert cap not in ONEDNN_ISA or env.get("ONEDNN_MAX_CPU_ISA") == ONEDNN_ISA[cap], env


def test_the_numerics_modules_are_found():
    found = numerics_modules()
    assert {"tests/test_grok.py", "tests/test_xrex.py", "tests/test_explorer_views.py"} <= set(found), found


@pytest.mark.slow
@pytest.mark.parametrize("name", list(IN_PROCESS))
def test_numerics_hold_on_every_cpu_kernel_path(name):
    done = rerun(IN_PROCESS[name], "-m", "not slow and not gpu", *numerics_modules())
    assert done.returncode == 0, f"{name}: {IN_PROCESS[name]}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SERVED))
def test_served_numbers_hold_with_the_server_on_other_kernels_and_threads(name):
    tests_env, server_env = SERVED[name]
    server_env = within_this_cpu(server_env)
    done = rerun({**tests_env, "EXPLORER_TEST_SERVER_ENV": server_env}, "-m", "served_numbers and not gpu",
                 "tests/test_app.py", "tests/test_browser.py")
    assert done.returncode == 0, f"{name}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    assert " passed" in done.stdout and " deselected" in done.stdout, done.stdout[-2000:]


def test_the_server_environment_is_read_by_name(monkeypatch):
    from conftest import SERVER_ENV, server_env
    monkeypatch.setenv(SERVER_ENV, "EXPLORER_THREADS=2 ATEN_CPU_CAPABILITY=avx2")
    assert server_env() == {"EXPLORER_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2"}
    monkeypatch.setenv(SERVER_ENV, "EXPLORER_THREADS")
    with pytest.raises(ValueError, match=r"EXPLORER_TEST_SERVER_ENV: got 'EXPLORER_THREADS'; allowed: NAME=value"):
        server_env()
