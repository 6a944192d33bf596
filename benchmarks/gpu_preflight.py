"""The GPU session's first check: what the device runs, and whether everything the GPU path uses is there.

    python -m benchmarks.gpu_preflight [--json PATH]

The device has torch 2.11 and this repo is developed on 2.13, so before any test it prints the versions and
looks up every torch API the GPU path calls (``TORCH_APIS``), FlashAttention-4's call (``FA4_APIS``, when
installed), that the image's packages meet the carried wheels' requirements (benchmarks/gpu-wheels.txt),
torch's own DLPack exchange API (why torch-c-dlpack-ext is not carried) and the compile caches' settings.
Exits 1 when something the GPU path needs is missing; the session goes on, and the tests say what fails.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import inspect
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Optional

LOCK = Path(__file__).resolve().parent / "gpu-wheels.txt"
# dotted name, and the keywords the GPU path passes to it (checked on Python-level signatures)
TORCH_APIS = [
    ("torch.compile", ("fullgraph", "dynamic")),
    ("torch._dynamo.config.patch", ()),
    ("torch._dynamo.config.recompile_limit", ()),
    ("torch.nn.attention.flex_attention.flex_attention", ("score_mod", "block_mask", "scale", "enable_gqa")),
    ("torch.nn.attention.flex_attention.create_block_mask", ("device",)),
    ("torch.nn.attention.sdpa_kernel", ()),
    ("torch.nn.attention.SDPBackend.MATH", ()),
    ("torch.nn.attention.SDPBackend.FLASH_ATTENTION", ()),
    ("torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION", ()),
    ("torch.nn.attention.SDPBackend.CUDNN_ATTENTION", ()),
    ("torch.nn.functional.scaled_dot_product_attention", ()),
    ("torch.cuda.set_sync_debug_mode", ()),
    ("torch.cuda.get_device_capability", ()),
    ("torch.cuda.Event", ()),
    ("torch.cuda.reset_peak_memory_stats", ()),
    ("torch.cuda.max_memory_allocated", ()),
    ("torch.cuda.OutOfMemoryError", ()),
    ("torch.utils._python_dispatch.TorchDispatchMode", ()),
    ("torch.utils._pytree.tree_leaves", ()),
]
FA4_APIS = [
    ("flash_attn.cute.flash_attn_func", ("softmax_scale", "causal", "softcap", "pack_gqa", "mask_mod", "aux_tensors",
                                         "block_sparse_tensors", "return_lse")),
    ("flash_attn.cute.block_sparsity.BlockSparseTensorsTorch", ("mask_block_cnt", "mask_block_idx", "full_block_cnt",
                                                                 "full_block_idx", "block_size")),
    ("flash_attn.cute.utils.scalar_to_ssa", ()),
]
# the compile caches benchmarks/gpu_session.sh keeps under its parked folder (read by FA4, CuTe DSL, inductor,
# Triton and tvm-ffi), so a second process on a warm machine loads kernels instead of compiling them
CACHE_ENV = ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "CUTE_DSL_CACHE_DIR",
             "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TVM_FFI_CACHE_DIR")


def resolve(dotted: str):
    """The object at `dotted` (the longest importable module prefix, then attributes); AttributeError or
    ImportError when it is not there."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            if cut == 1:
                raise
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def missing_apis(apis) -> list[str]:
    """One line per API in `apis` that is absent, or whose signature lacks a keyword the GPU path passes."""
    problems = []
    for dotted, keywords in apis:
        try:
            obj = resolve(dotted)
        except (ImportError, AttributeError) as e:
            problems.append(f"{dotted}: missing ({type(e).__name__}: {e})")
            continue
        if not keywords:
            continue
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):          # a builtin without a signature: its presence is what we know
            continue
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            lacking = [k for k in keywords if k not in params]
            if lacking:
                problems.append(f"{dotted}: takes no {', '.join(lacking)}")
    return problems


def lock_lines(lock: Path = LOCK) -> tuple[list[str], dict[str, str]]:
    """(the carried requirements, their inline comments dropped; {name: why} for the wheels the resolver adds
    that are not carried)."""
    carried, omitted = [], {}
    for line in lock.read_text().splitlines():
        line = line.strip()
        if line.startswith("# not carried:"):
            name, _, why = line.removeprefix("# not carried:").strip().partition(" ")
            omitted[canonical(name)] = why.strip("() ")
        elif line and not line.startswith("#"):
            carried.append(line.split(" #", 1)[0].strip())
    return carried, omitted


def lock_roots(lock: Path = LOCK) -> list[str]:
    """The carried requirements the session itself needs (marked "# root:"), each with its own pin: what a fresh
    resolve starts from (pip adds the rest)."""
    return [line.split(" #", 1)[0].strip() for line in lock.read_text().splitlines()
            if not line.startswith("#") and "# root:" in line]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unmet_requirements(lock: Path = LOCK, extras=("", "cu13")) -> list[str]:
    """The carried wheels were installed with --no-deps: one line per requirement of theirs (markers taken
    with each of `extras`) that nothing installed here meets, the lock's "not carried" wheels excepted."""
    from packaging.requirements import Requirement
    carried, omitted = lock_lines(lock)
    problems = []
    for line in carried:
        name = canonical(Requirement(line).name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed")
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
                continue
            need = canonical(req.name)
            if need in omitted:
                continue
            try:
                have = metadata.version(need)
            except metadata.PackageNotFoundError:
                problems.append(f"{name} needs {req}: not installed")
                continue
            if not req.specifier.contains(have, prereleases=True):
                problems.append(f"{name} needs {req}: {have} is installed")
    return problems


def gpu() -> Optional[dict]:
    import torch
    if not torch.cuda.is_available():
        return None
    return dict(name=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()))


def report() -> dict:
    """Everything the preflight found; `failures` lists what the GPU path needs and does not have."""
    import torch
    versions = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for dist in ("triton", "flash-attn-4", "nvidia-cutlass-dsl", "apache-tvm-ffi", "cuda-bindings", "einops",
                 "plotly", "narwhals"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    failures = missing_apis(TORCH_APIS)
    if not (hasattr(torch.Tensor, "__dlpack_c_exchange_api__") or hasattr(torch.Tensor, "__c_dlpack_exchange_api__")):
        failures.append("torch has no DLPack exchange API of its own: tvm-ffi needs torch-c-dlpack-ext, not carried")
    fa4 = None
    if versions["flash-attn-4"] is not None:
        fa4 = missing_apis(FA4_APIS)
        failures += fa4 + unmet_requirements()
    return dict(versions=versions, gpu=gpu(), failures=failures,
                fa4="not installed" if fa4 is None else ("ok" if not fa4 else "API differs"),
                caches={k: os.environ.get(k) for k in CACHE_ENV}, executable=sys.executable)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the report here")
    found = report()
    path = ap.parse_args(argv).json
    if path:
        path.write_text(json.dumps(found, indent=1) + "\n")
    print("preflight:", json.dumps({k: v for k, v in found.items() if k != "failures"}))
    for line in found["failures"]:
        print("PREFLIGHT FAILS:", line)
    return 1 if found["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
