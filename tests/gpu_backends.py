"""What the device tests must show ran: every backend whose package loads in this process on that device, and on
CUDA every backend the GPU session names in ATTN_REQUIRE_BACKENDS (benchmarks/gpu_session.sh sets it for the
wheels it installed), so a kernel that silently fails to import, or imports and is never exercised, fails the run.
"Loads" is for the cases the tests run (bf16 with key padding): a CPU whose flex build fails on those
(models.attention.flex_cpu_known_failure) has it refused by name, not unexercised."""
import os
from typing import Iterable

from models.attention import BACKENDS

REQUIRE_ENV = "ATTN_REQUIRE_BACKENDS"


def required() -> list[str]:
    return [b for b in os.environ.get(REQUIRE_ENV, "").split(",") if b.strip()]


def unexercised(ran: Iterable[str], device: str = "cuda", dtype: str = "bfloat16", padding: bool = True) -> list[str]:
    """Why the tests on `device` proved less than they should, one line per backend; [] when all is well."""
    ran = set(ran)
    problems = [f"{b}: {REQUIRE_ENV} names no such backend" for b in required() if b not in BACKENDS]
    for name, backend in BACKENDS.items():
        if device not in backend.devices:
            continue
        here = backend.on(device)
        why = here.available() or here.known_failure(dtype, padding)
        if why and device == "cuda" and name in required():
            problems.append(f"{name} is required ({REQUIRE_ENV}) but does not load: {why}")
        elif why is None and name not in ran:
            problems.append(f"{name} loads here but no test on {device} ran it")
    return problems
