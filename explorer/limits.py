"""What this device allows and what a request costs: the longest layout, the largest model and recorded
attention, the memory ceiling and per-request budget (CPU or GPU values), and the cost model that estimates a
model's parameters and a view's work and memory from its Settings alone, before anything runs.
``check_model_fits`` and ``check_budget`` refuse by naming the field to turn down (``ValidationError``).
"""
from __future__ import annotations

import functools
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch

from models.weights import recsys_spec
from models.xrex import XrexConfig, param_spec as xrex_spec, project_then_sum_params

from .schema import Settings, ValidationError

# The longest layout any view draws (the mask view builds no model: two [T, T] masks and tile maps):
# production's padded sequence (2 + 1022 + 128 = 1152) and more. What a model view may run is bounded by
# its memory and work instead (check_model_fits, check_budget), which name the field to turn down.
CPU_MAX_SEQ_LEN = 2048
GPU_MAX_SEQ_LEN = 4096
# ... and on a CPU a model of about phoenix-nano's size.
CPU_MAX_PARAMS = 40_000_000
GPU_MAX_PARAMS = 1_500_000_000
# The recorded forward keeps every layer's attention weights and capped logits ([Hq, T, T] fp32 each)
# and runs.forward caches 8 of them: phoenix-nano needs 144 MiB; 64 heads x 16 layers at T 1087 9 GiB.
CPU_MAX_TRACE_BYTES = 512 * 2**20
GPU_MAX_TRACE_BYTES = 8 * 2**30
MAX_BATCH = 8                       # rows of inputs per forward; the views show one of them
MAX_SWEEP_SECONDS_CPU = 30.0
MAX_SWEEP_SECONDS_GPU = 120.0
# What one request may cost, estimated from the settings before it runs (explorer.views.View.estimate):
# floating-point work of every forward it runs (probe passes included) — a 2-core CPU Space does
# ~20-40 GFLOP/s per thread, so 600 GFLOP is well under a minute — and the memory it holds while it runs.
CPU_MAX_REQUEST_FLOPS = 600e9
GPU_MAX_REQUEST_FLOPS = 200e12
# Everything the explorer keeps (cached models, recorded forwards, probe results) plus what running
# requests hold stays under this many bytes (explorer.budget admits requests and evicts caches against
# it). 4 GiB leaves a free 16 GB Space (and the process's own ~1 GB) plenty of headroom.
MEMORY_CEILING_ENV = "EXPLORER_MEMORY_BYTES"
DEFAULT_MEMORY_CEILING = 4 * 2**30
# On a GPU the models, their weights and recorded attention live in the GPU's own memory: a second account
# (explorer.budget.MEMORY) of that many bytes, by default this share of the GPU's total memory — the rest for
# the CUDA context, kernels' workspaces and what the caching allocator keeps apart — and the ceiling above
# is the host's alone (figures on their way out, masks, uploads). An 80 GB H100: ~63 GiB, every view at the
# production presets allowed; a 16 GB T4: ~12 GiB.
DEVICE_MEMORY_ENV = "EXPLORER_DEVICE_MEMORY_BYTES"
DEVICE_MEMORY_SHARE = 0.8
STAND_IN_GPU_MEMORY = 80 * 10**9    # limits_of("cuda") on a machine without one: the H100 the targets are set on
# What a view sends back is bounded before it runs: heatmap cells per figure (a zoomed grid is pooled
# past it), each ~6 bytes on the wire (float32 as base64 plus the JSON around it), held about three
# times over while it is serialised (figure, JSON, response) — counted in every view's peak bytes.
MAX_FIGURE_CELLS = 2_200_000
FIGURE_PEAK_BYTES = 3 * 6 * MAX_FIGURE_CELLS
# The timing tab's sequence lengths: memory-bound backends are refused per point by the benchmark's RAM
# guard, and the sweep by its time budget; on a GPU flash goes on to 32k where naive runs out of memory.
TIMING_MAX_LEN_CPU = 2048
TIMING_MAX_LEN_GPU = 32768


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# A benchmark or test may hold the model views to another device's limits (limits_of): nothing a request
# or the environment sends sets it, so what a CPU Space allows stays the CPU's.
_limits_of: Optional[str] = None
_stand_in_memory: Optional[int] = None


@contextmanager
def limits_of(dev: str, device_memory: Optional[int] = None):
    """Within the block, the layout, model and per-request limits are those of `dev` ("cpu" or "cuda"),
    whatever this machine is: a GPU's on a CPU runs the production presets' views here, to measure their
    CPU-side work (benchmarks/view_cost.py). The models still run on this machine's device(). A GPU's
    memory is `device_memory` bytes in all (default: this machine's GPU's, else STAND_IN_GPU_MEMORY)."""
    global _limits_of, _stand_in_memory
    if dev not in ("cpu", "cuda"):
        raise ValueError(f"limits_of: got {dev!r}; allowed: cpu, cuda")
    before = _limits_of, _stand_in_memory
    _limits_of, _stand_in_memory = dev, device_memory
    try:
        yield
    finally:
        _limits_of, _stand_in_memory = before


def limits_device() -> str:
    """The device whose limits apply: this one, unless a benchmark set another (limits_of)."""
    return _limits_of or device()


def max_seq_len() -> int:
    return GPU_MAX_SEQ_LEN if limits_device() == "cuda" else CPU_MAX_SEQ_LEN


def max_params() -> int:
    return GPU_MAX_PARAMS if limits_device() == "cuda" else CPU_MAX_PARAMS


def max_trace_bytes() -> int:
    return GPU_MAX_TRACE_BYTES if limits_device() == "cuda" else CPU_MAX_TRACE_BYTES


def timing_max_len() -> int:
    return TIMING_MAX_LEN_GPU if device() == "cuda" else TIMING_MAX_LEN_CPU


def sweep_budget_s() -> float:
    return MAX_SWEEP_SECONDS_GPU if device() == "cuda" else MAX_SWEEP_SECONDS_CPU


# A live sweep's turn while other visitors' sweeps wait (compiles included): one runs at a time, and the whole
# budget with its compile allowance is two minutes a sweep on a CPU (the soak: honest sweeps waited 77 s behind
# one, and a class's sixteenth was refused)
SWEEP_TURN_S = {"cpu": 10.0, "cuda": 20.0}


def sweep_turn_s() -> float:
    return SWEEP_TURN_S["cuda" if device() == "cuda" else "cpu"]


def memory_ceiling() -> int:
    """Bytes the explorer's caches and running requests may hold together (env EXPLORER_MEMORY_BYTES); on
    a GPU, in host memory beside the GPU's own (device_memory_ceiling)."""
    return bytes_from_env(MEMORY_CEILING_ENV, DEFAULT_MEMORY_CEILING)


def bytes_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(float(raw)) if raw.strip() else default
    except ValueError:
        raise ValidationError(name, raw, "a number of bytes, e.g. 4e9") from None
    if value < 2**28:
        raise ValidationError(name, raw, "at least 268435456 (256 MiB)")
    return value


def max_request_bytes() -> int:
    """One request may hold at most half the ceiling, so two of the largest can run side by side."""
    return memory_ceiling() // 2


def device_memory_apart() -> bool:
    """Whether the models' memory is a GPU's own, budgeted apart from the host's (on a CPU they are one)."""
    return limits_device() == "cuda"


def device_total_memory() -> int:
    """The GPU's total memory in bytes (a stand-in's under limits_of; 0 where there is none)."""
    if _stand_in_memory is not None:
        return _stand_in_memory
    if torch.cuda.is_available():       # on ZeroGPU, outside a GPU call, the figure `spaces` reports
        return _cuda_total_memory()
    return STAND_IN_GPU_MEMORY if _limits_of == "cuda" else 0


@functools.cache
def _cuda_total_memory() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def device_memory_ceiling() -> int:
    """Bytes the explorer's caches and running requests may hold in the GPU's memory together (env
    EXPLORER_DEVICE_MEMORY_BYTES; default DEVICE_MEMORY_SHARE of its total)."""
    return bytes_from_env(DEVICE_MEMORY_ENV, max(2**28, int(DEVICE_MEMORY_SHARE * device_total_memory())))


def request_bytes(cost: "Cost") -> tuple[int, int]:
    """(host, device) bytes a request of `cost` holds: on a CPU all of its peak in the one memory."""
    return (cost.host_bytes, cost.device_bytes) if device_memory_apart() else (cost.peak_bytes, 0)


# A request estimated above this is large: it runs at a lower CPU priority (explorer.budget) in the server's heavy
# lane, one at a time (server.admission). Lecture views are < 0.3 GFLOP; phoenix-nano's 26-150; a mask view
# of T 2048, 2.
LARGE_REQUEST_FLOPS = 1e9


def max_request_flops() -> float:
    return GPU_MAX_REQUEST_FLOPS if limits_device() == "cuda" else CPU_MAX_REQUEST_FLOPS


def estimate_params(s: Settings) -> int:
    """The ranking model's parameter count, from its own shapes: grok.py's (models.weights.recsys_spec:
    the embedding tables, the user / history / candidate projections and the trunk), or production's
    (its trunk and head, models.xrex.param_spec, and the input layer's tables and projections)."""
    if s.family == "xrex":
        return _xrex_params(s.xrex_config())
    return sum(math.prod(shape) for _, shape, _ in recsys_spec(s.recsys_config()).values())


def _xrex_params(config: XrexConfig) -> int:
    """models.xrex.XrexRecsys's parameters from its shapes: the trunk and head (param_spec) and the input
    layer (project_then_sum_params); no module is built (a visitor may send a new geometry per request)."""
    return (sum(math.prod(shape) for _, shape, _ in xrex_spec(config).values())
            + project_then_sum_params(config))


def trunk_params(s: Settings) -> int:
    """The parameters every token passes through: the trunk's layers (no embedding tables or head)."""
    spec = xrex_spec(s.xrex_config()) if s.family == "xrex" else recsys_spec(s.recsys_config())
    return sum(math.prod(shape) for key, (_, shape, _) in spec.items() if key.startswith("transformer/"))


def check_model_fits(s: Settings) -> None:
    """The model and its recorded attention fit this device, or ValidationError naming the field."""
    n = estimate_params(s)
    if n > max_params():
        raise ValidationError("emb_size", s.emb_size,
                              f"a model of at most {max_params() / 1e6:.0f}M parameters on {limits_device().upper()} "
                              f"(this one has about {n / 1e6:.0f}M: it needs a GPU, as phoenix-prod, phoenix-2026 and "
                              f"phoenix-2026-seqpack do)")
    if trace_bytes(s) > max_trace_bytes() and trace_bytes(replace(s, batch_size=1)) <= max_trace_bytes():
        raise ValidationError("batch_size", s.batch_size,
                              f"a batch whose recorded attention fits in {max_trace_bytes() / 2**20:.0f} MiB on "
                              f"{limits_device().upper()} (here {trace_bytes(s) / 2**20:.0f} MiB): fewer rows")
    if trace_bytes(s) > max_trace_bytes():
        raise ValidationError("num_layers", s.num_layers,
                              f"layers x query heads x T^2 within {max_trace_bytes() / 2**20:.0f} MiB of recorded "
                              f"attention on {limits_device().upper()} (here {s.num_layers} x {s.num_q_heads} x "
                              f"{s.seq_len}^2 needs {trace_bytes(s) / 2**20:.0f} MiB): fewer layers, heads or tokens")


def trace_bytes(s: Settings, rows: Optional[int] = None) -> int:
    """Memory of one recorded forward's attention: probabilities and logits, fp32 [B, Hq, T, T] per layer."""
    return 2 * 4 * (s.batch_size if rows is None else rows) * s.num_layers * s.num_q_heads * s.seq_len ** 2


# --- what a request costs, estimated before it starts ------------------------------------------

@dataclass(frozen=True)
class Cost:
    """Work and memory of one view's request, from the settings alone. `a + b`: one after the other (the
    work adds up, each memory's peak is the larger)."""
    forwards: int = 0          # passes through the trunk, each counted once per batch row
    flops: float = 0.0         # their floating-point work: matmuls on every token + attention's T^2
    peak_bytes: int = 0        # what it holds while it runs: recorded traces, probe passes, model copies
    device_bytes: int = 0      # of which where the model runs (its weights, passes and traces): a GPU's own memory
    host_bytes: Optional[int] = None     # ... and beside it in host memory (masks, figures); default the rest

    def __post_init__(self):
        if self.host_bytes is None:
            object.__setattr__(self, "host_bytes", self.peak_bytes - self.device_bytes)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.forwards + other.forwards, self.flops + other.flops,
                    max(self.peak_bytes, other.peak_bytes), max(self.device_bytes, other.device_bytes),
                    max(self.host_bytes, other.host_bytes))

    def holding(self, extra_bytes: int, on_device: bool = False) -> "Cost":
        """The same work holding `extra_bytes` more throughout: where the model runs, or on the host."""
        return replace(self, peak_bytes=self.peak_bytes + extra_bytes,
                       device_bytes=self.device_bytes + extra_bytes * on_device,
                       host_bytes=self.host_bytes + extra_bytes * (not on_device))


def forward_cost(s: Settings, rows: int = 1, seq_len: Optional[int] = None, record: bool = False) -> Cost:
    """One trunk pass over `rows` sequences of `seq_len` (default the layout's) tokens: 2 x trunk
    parameters per token, plus q.k and p.v (4 x T^2 x key_size per query head) per layer. Memory: one
    layer's [rows, Hq, T, T] logits, capped logits and probabilities while it runs, the residual
    stream, and with `record` every layer's traces."""
    T = s.seq_len if seq_len is None else seq_len
    flops = rows * (2 * T * trunk_params(s) + s.num_layers * 4 * s.num_q_heads * T * T * s.key_size)
    ffn = s.xrex_config().ffn_hidden if s.family == "xrex" else s.transformer_config().ffn_hidden
    held = 3 * 4 * rows * s.num_q_heads * T * T + 4 * 4 * rows * T * max(s.emb_size, ffn)
    held += recorded_bytes(s, rows, T) if record else 0
    return Cost(rows, float(flops), held, device_bytes=held)


def recorded_bytes(s: Settings, rows: int, seq_len: Optional[int] = None) -> int:
    """What a recorded forward keeps after it ran: every layer's probabilities and logits
    [rows, Hq, T, T] and its two residual streams [rows, T, D], fp32."""
    T = s.seq_len if seq_len is None else seq_len
    return 2 * 4 * rows * s.num_layers * T * (s.num_q_heads * T + s.emb_size)


def model_bytes(s: Settings) -> int:
    return 4 * estimate_params(s)


# the fields a visitor can turn down to make a request cheaper, in the order they are suggested
_COST_FIELDS = ("batch_size", "num_history", "num_candidates", "num_layers", "num_q_heads", "emb_size")


def check_budget(s: Settings, view: str, estimate: Callable[[Settings], Cost]) -> Cost:
    """Refuse, by name, a request of the `view` view whose estimated work or memory (`estimate`, e.g.
    explorer.views.VIEWS[view].estimate) exceeds this device's budget. The field named is the one whose
    halving saves the most. -> the cost, when it fits."""
    cost = estimate(s)
    flops, held = max_request_flops(), max_request_bytes()
    held_device = device_memory_ceiling() // 2 if device_memory_apart() else 0

    def over(c: Cost) -> float:
        host, dev = request_bytes(c)
        return max(c.flops / flops, host / held, dev / held_device if held_device else 0.0)
    if over(cost) <= 1:
        return cost

    def after_halving(name):
        lo = 1 if name != "num_history" else 0
        half = max(lo, getattr(s, name) // 2)
        if name == "num_q_heads":
            half = max(s.num_kv_heads, half - half % s.num_kv_heads)
        t = replace(s, **{name: half}, **({"candidate_padding": 0} if name == "num_candidates" else {}),
                    **({"history_padding": 0} if name == "num_history" else {}), row=0)
        return over(estimate(t))
    field = min((f for f in _COST_FIELDS if getattr(s, f) > 1), key=after_halving, default="num_history")
    if held_device:
        holding = (f"{cost.device_bytes / 2**20:,.0f} MiB of GPU memory and {cost.host_bytes / 2**20:,.0f} MiB of "
                   "host memory")
        budget = f"{held_device / 2**20:,.0f} MiB of GPU memory and {held / 2**20:,.0f} MiB of host memory"
    else:
        holding, budget = f"{cost.peak_bytes / 2**20:,.0f} MiB", f"{held / 2**20:,.0f} MiB"
    raise ValidationError(field, getattr(s, field),
                          f"a smaller value: the {view} view would run {cost.forwards} trunk passes "
                          f"({cost.flops / 1e9:,.0f} GFLOP) holding {holding}, {over(cost):.1f}x this "
                          f"{limits_device().upper()}'s budget per request of {flops / 1e9:,.0f} GFLOP and {budget}")
