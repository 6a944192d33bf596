"""The wheel set benchmarks/gpu_session.sh carries to the GPU resolves for the device's Python (3.12) with
nothing missing: pip's own resolver, asked for the list's pins with the device image's torch as given,
may add nothing the list lacks (beyond what the image has) and must pick every pin as written."""
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

LOCK = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu-wheels.txt"
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                    "manylinux_2_17_x86_64", "manylinux2014_x86_64") for arg in ("--platform", tag)]
# what the device image has before anything is carried: torch and what torch itself requires
IMAGE = {"torch", "triton", "numpy", "typing-extensions", "filelock", "fsspec", "jinja2", "markupsafe", "mpmath",
         "networkx", "sympy", "setuptools"}
IMAGE_TORCH = "2.11.0+deviceimage"     # a metadata-only stand-in: the image's torch is not downloaded
OFFLINE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
           "Network is unreachable", "Max retries exceeded", "ConnectTimeout", "ReadTimeout")


def name_of(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[=<>! ;]", requirement, 1)[0]).lower()


def pins() -> dict[str, str]:
    lines = [ln.strip() for ln in LOCK.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return {name_of(ln): ln.split("==", 1)[1] for ln in lines}


def stand_in_wheel(directory: Path, name: str, version: str) -> Path:
    """A wheel with only metadata (no dependencies): pip resolves against it as if installed."""
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda text: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()  # noqa: E731
    files[f"{info}/RECORD"] = "".join(f"{p},sha256={digest(c)},{len(c)}\n" for p, c in files.items()) + f"{info}/RECORD,,\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, c in files.items():
            z.writestr(p, c)
    return path


def test_lock_lists_each_wheel_once_with_a_pin():
    lines = [ln for ln in LOCK.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert all("==" in ln for ln in lines), lines
    assert len(pins()) == len(lines) and not set(pins()) & IMAGE


@pytest.mark.slow
def test_wheel_set_resolves_for_python_312_with_nothing_missing(tmp_path):
    stand_in_wheel(tmp_path, "torch", IMAGE_TORCH)
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "--ignore-installed",
           "--timeout", "30", "--retries", "1", "--target", str(tmp_path / "target"), "--find-links", str(tmp_path),
           *PLATFORM, "-r", str(LOCK), f"torch=={IMAGE_TORCH}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and any(s in done.stderr for s in OFFLINE):
        pytest.skip("the package registry is unreachable from here: " + done.stderr.strip().splitlines()[-1][:200])
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = {name_of(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(done.stdout)["install"]}
    missing = {n: v for n, v in resolved.items() if n not in pins() and n not in IMAGE}
    assert not missing, f"pip needs wheels benchmarks/gpu-wheels.txt lacks: {missing}"
    differ = {n: (pins()[n], resolved.get(n)) for n in pins() if resolved.get(n) != pins()[n]}
    assert not differ, f"pinned vs resolved: {differ}"


@pytest.mark.slow
def test_gpu_session_writes_its_results_to_out_as_it_goes(tmp_path):
    """The device call, run here without a GPU (a stand-in nvidia-smi): it says why fa4 is not installed,
    runs the GPU tests (skipped here) and leaves its log, the test log and the JUnit file in $OUT, within
    the call's budget."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'no GPU: a test stand-in'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')      # this interpreter
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "CALL_BUDGET_S": "240",
           "GPU_SESSION_DIR": str(tmp_path / "park")}
    done = subprocess.run(["bash", str(LOCK.parent / "gpu_session.sh"), "tests"], cwd=LOCK.parent.parent, env=env,
                          capture_output=True, text=True, timeout=300)
    log = (out / "session.log").read_text()
    assert "NOT INSTALLED" in log and "fa4: " in log and "== done in" in log, log[-2000:]
    assert (out / "gpu-tests.log").stat().st_size > 0 and "<testsuite" in (out / "gpu-tests.xml").read_text()
    assert done.returncode == 0, done.stderr[-2000:]
