"""What the device tests must show ran: every backend whose package loads in this process on that device, and on
CUDA every backend the GPU session names in ATTN_REQUIRE_BACKENDS (benchmarks/gpu_session.sh sets it for the
wheels it installed), so a kernel that silently fails to import, or imports and is never exercised, fails the run.
`refused(name)`: why the caller's cases cannot run a backend that loads (the trunk's bf16 recsys masks with key
padding take no sdpa-flash on CUDA, nor flex on a CPU whose AVX2 build fails on them), so it is not counted as
unexercised; the backends the GPU session requires are counted whatever the cases refuse."""
import os
from typing import Callable, Iterable, Optional

from models.attention import BACKENDS

REQUIRE_ENV = "ATTN_REQUIRE_BACKENDS"


def required() -> list[str]:
    return [b for b in os.environ.get(REQUIRE_ENV, "").split(",") if b.strip()]


def unexercised(ran: Iterable[str], device: str = "cuda",
                refused: Callable[[str], Optional[str]] = lambda name: None) -> list[str]:
    """Why the tests on `device` proved less than they should, one line per backend; [] when all is well."""
    ran = set(ran)
    problems = [f"{b}: {REQUIRE_ENV} names no such backend" for b in required() if b not in BACKENDS]
    for name, backend in BACKENDS.items():
        if device not in backend.devices:
            continue
        why = backend.on(device).available() or (None if name in required() else refused(name))
        if why and device == "cuda" and name in required():
            problems.append(f"{name} is required ({REQUIRE_ENV}) but does not load: {why}")
        elif why is None and name not in ran:
            problems.append(f"{name} loads here but no test on {device} ran it")
    return problems
