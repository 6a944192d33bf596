"""The measurement library: one shape timed on every backend, a sweep over a grid of shapes, results files read.

The benchmark CLI (``python -m benchmarks.attention``) and the app's timing tab both measure through
``measure_shape`` (one shape, every backend) and ``sweep`` (a generator of records over a ``Grid``: a
preset's attention shapes, models.presets, or the sidebar's).
Per shape: the backends are warmed up (compilation and mask caches never timed), then timed
interleaved (A B C, A B C, ...) for at least 5 repeats, each repeat a block of calls lasting ~10-20 ms
(CUDA events on GPU; perf_counter on CPU, where every op is synchronous). Each record keeps repeats,
median / min / max ms, peak memory above the inputs (torch.cuda.max_memory_allocated / sampled RSS on
CPU), TFLOP/s counting only unmasked (useful) FLOPs, max |error| vs naive on the same inputs, and a
``Status`` (ok / oom / skipped / error / not reached) and, for all but ok, a ``reason``. A ``Run`` (its own stop flag and deadline) is checked
before every timed block.
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import json
import math
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from models.attention import BACKENDS, attend, unavailable_reason
from models.masks import KERNEL_TILINGS, AttentionMask, model_mask_kind
from models.presets import PRESETS
from models.runinfo import RESULTS_DIR, device_name

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# backends that hold [B, H, T, T] scores in memory (on CPU, a point that cannot fit is skipped, not tried:
# running out of RAM kills the process rather than raising)
MATERIALISING = {"naive": 16, "structured": 16, "sdpa": 12}    # bytes per score element, roughly
CPU_SCORES_LIMIT = 3 << 30    # the CPU machines here are shared: no point may hold more than 3 GiB of scores


@dataclass(frozen=True)
class Grid:
    """The attention shapes one sweep times: batch, heads, head dim and candidate slots at each length,
    under each mask, cap and padding."""
    B: int
    Hq: int
    Hkv: int
    head_dim: int
    dtype: str
    seq_lens: tuple
    num_candidates: int
    masks: tuple = ("recsys",)
    cap_methods: tuple = ("tanh", "none")     # grok.py's tanh cap, and off (where SDPA can run)
    cap: float = 30.0
    paddings: tuple = (False,)                # True: key padding in the history (padded_valid), timed too
    model_preset: Optional[str] = None        # the preset (models.presets) whose attention it is; None: the sidebar's


def preset_grid(name: str, B: int, dtype: str = "bfloat16", seq_lens: tuple = (), **options) -> Grid:
    """Preset `name`'s attention: its query and KV heads, key size and candidate slots, at its own sequence
    length unless `seq_lens` are given."""
    g, layout = PRESETS[name].geometry, PRESETS[name].layout
    return Grid(B=B, Hq=g.num_q_heads, Hkv=g.num_kv_heads, head_dim=g.key_size, dtype=dtype,
                seq_lens=seq_lens or (layout.seq_len,), num_candidates=layout.num_candidates, model_preset=name,
                **options)


# The benchmark's grids by name (a results record's "preset"): batch 32, or production's 256 per H100 (FACTS.md
# §3); the lecture's history and phoenix-prod's grown to longer sequences.
GRIDS: dict[str, Grid] = {
    "lecture": preset_grid("lecture", B=8, dtype="float32",
                           seq_lens=(PRESETS["lecture"].layout.seq_len, 64, 256, 1024),
                           masks=("recsys", "recsys-bidirectional")),
    "phoenix-prod": preset_grid("phoenix-prod", B=32, masks=("recsys", "recsys-bidirectional"),
                                paddings=(False, True)),
    "phoenix-prod-b256": preset_grid("phoenix-prod", B=256, masks=("recsys", "recsys-bidirectional")),
    # qk_norm and no cap; 64 candidates in 128 slots (PRODUCTION.md §1, §6)
    "phoenix-2026": preset_grid("phoenix-2026", B=32, masks=("recsys-bidirectional",), cap_methods=("none",),
                                paddings=(False, True)),
    "long": preset_grid("phoenix-prod", B=1, seq_lens=(512, 1024, 2048, 4096, 8192, 16384, 32768)),
}

# On CPU the GPU grids would take hours on two cores: same geometry, smaller batch and T, fp32
# (CPU bf16 matmuls are emulated). Records carry the sizes actually run.
# Each new (T, mask, cap) is a fresh FlexAttention compile (~10-30 s on CPU), so CPU runs keep one mask.
CPU_REDUCTIONS = {
    "lecture": dict(masks=("recsys",)),
    "phoenix-prod": dict(B=1, dtype="float32", masks=("recsys",), paddings=(False,)),
    "phoenix-prod-b256": dict(B=2, dtype="float32", masks=("recsys",)),
    "phoenix-2026": dict(B=1, dtype="float32", paddings=(False,)),
    "long": dict(dtype="float32", seq_lens=(512, 1024, 2048, 4096)),   # naive stops at 2048 (scores limit)
}


def grid_for(name: str, device: str) -> Grid:
    if name not in GRIDS:
        raise ValueError(f"preset: got {name!r}; allowed: {', '.join(GRIDS)}")
    g = GRIDS[name]
    return replace(g, **CPU_REDUCTIONS[name]) if device == "cpu" else g


# --- counting ---------------------------------------------------------------------------

def useful_pairs(kind: str, T: int, candidate_start_offset: int) -> int:
    """(query, key) pairs the mask allows, per batch row and head (no padding): the mask's own count."""
    return AttentionMask(kind, T, candidate_start_offset).useful_pairs()


def useful_flops(kind, B, Hq, head_dim, T, num_candidates) -> int:
    """QK^T and PV: 2 multiply-adds of head_dim per allowed pair -> 4 * head_dim FLOPs."""
    return 4 * B * Hq * head_dim * useful_pairs(kind, T, T - num_candidates)


def padded_valid(B: int, T: int, candidate_start_offset: int, device=None) -> torch.Tensor:
    """[B, T] bool key padding for a padded point, built on `device`: row b's history ends with
    ((b % 4) + 1) / 8 of the prefix padded (1/8 ... 1/2, as histories of different lengths are), at
    least one slot; candidates and the first token stay valid."""
    off = candidate_start_offset
    pad = torch.clamp((torch.arange(B, device=device) % 4 + 1) * off // 8, min=1, max=max(0, off - 1))   # [B]
    idx = torch.arange(T, device=device)[None, :]
    return ~((idx >= off - pad[:, None]) & (idx < off))


TILING = KERNEL_TILINGS["fa4"]       # the 128 x 128 tiles a record's tile counts refer to


def tile_counts(mask: AttentionMask, device) -> dict:
    """Batch row 0's tiles under the 128 x 128 block-sparse tiling: full / partial / empty (skipped)."""
    return TILING.tiles(mask, device).counts(0)


def mask_flops(mask: AttentionMask, B: int, Hq: int, head_dim: int, num_candidates: int, device) -> int:
    """Useful FLOPs of one call: the structure's count, or with padding every row's allowed pairs
    (read from the tile map, outside any timed call)."""
    if not mask.padded:
        return useful_flops(mask.kind, B, Hq, head_dim, mask.seq_len, num_candidates)
    return 4 * Hq * head_dim * int(TILING.tiles(mask, device).allowed.sum())


# --- timing and memory ------------------------------------------------------------------

def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


class Run:
    """One run's stop conditions: a flag of its own (Stop sets it; the next run makes a new Run, so no
    later run can clear it) and a deadline. Checked before every timed block, so a run ends within one
    block (or one backend's warm-up) of either."""

    def __init__(self, budget_s: Optional[float] = None, compile_allowance_s: float = 0.0):
        self.flag = threading.Event()
        self.deadline = None if budget_s is None else time.perf_counter() + budget_s
        self.compile_left = compile_allowance_s      # warm-up time (compiles) that does not spend the budget

    def cancel(self) -> None:
        self.flag.set()

    def warmed_up(self, seconds: float) -> None:
        """A backend's warm-up took `seconds` (a FlexAttention compile: ~20-40 s on a CPU): up to the
        run's compile allowance, the deadline moves by as much, so a first compile does not use up
        the budget of the measurements themselves."""
        extra = min(max(seconds, 0.0), self.compile_left)
        self.compile_left -= extra
        if self.deadline is not None:
            self.deadline += extra

    def stopped(self) -> Optional[str]:
        """None while the run may go on, else why it ends: 'cancelled' or 'time budget spent'."""
        if self.flag.is_set():
            return "cancelled"
        if self.deadline is not None and time.perf_counter() > self.deadline:
            return "time budget spent"
        return None


def time_block_ms(fn: Callable[[], object], device: str, number: int = 1) -> float:
    """Time per call of `number` back-to-back calls: CUDA events on GPU; perf_counter on CPU, where
    every op is synchronous."""
    if device == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / number
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) * 1e3 / number


def calls_per_block(one_call_ms: float, min_block_ms: float) -> int:
    """Calls per timed block so that a block lasts about min_block_ms: sub-millisecond calls are timed
    in groups (a single one is mostly timer and scheduler noise), long ones one at a time."""
    return max(1, min(1000, math.ceil(min_block_ms / max(one_call_ms, 1e-3))))


def spread(times_ms: list[float]) -> dict:
    """The record fields for a list of per-call times, one per repeat."""
    return dict(repeats=len(times_ms), median_ms=statistics.median(times_ms), min_ms=min(times_ms),
                max_ms=max(times_ms))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _release_free_heap():
    """Hand freed heap pages back to the OS so the next RSS delta sees fresh allocations (glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _RssPeak:
    """Peak resident memory above the level at entry, sampled every millisecond in a thread."""

    def __enter__(self):
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        self.bytes = self.peak - self.base


def peak_memory_bytes(fn: Callable[[], object], device: str) -> int:
    """Memory one call needs beyond what was allocated before it."""
    if device == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        _sync(device)
        return torch.cuda.max_memory_allocated() - base
    _release_free_heap()
    with _RssPeak() as rss:
        fn()
    return rss.bytes


def _available_ram_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def _ram_shortfall(backend, device, B, Hq, T) -> Optional[str]:
    """On CPU, why a materialising backend is not tried at this size (None when it fits)."""
    need = MATERIALISING.get(backend, 0) * B * Hq * T * T
    if device == "cpu" and need > min(CPU_SCORES_LIMIT, 0.4 * _available_ram_bytes()):
        return f"would need ~{need / 2**30:.1f} GiB of RAM for the [B, H, T, T] scores"
    return None


def matmul_tflops(device: str, dtype: Optional[str] = None, n: Optional[int] = None, repeats: int = 5) -> float:
    """Dense matmul throughput, the yardstick for TFLOP/s: bf16 8192^3 on GPU, fp32 2048^3 on CPU
    (median of `repeats` after a warm-up call)."""
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    n = n or (8192 if device == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    b = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
    fn = lambda: a @ b  # noqa: E731
    fn()
    _sync(device)
    ms = statistics.median(time_block_ms(fn, device, 3 if device == "cuda" else 1) for _ in range(repeats))
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


# --- one shape, every backend interleaved ----------------------------------------------------

def make_inputs(B, Hq, Hkv, head_dim, T, dtype, device, seed=0):
    """q [B, T, Hq, K], k/v [B, T, Hkv, K], unit normal (generated on CPU: same numbers on any device)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, T, Hq, head_dim), (B, T, Hkv, head_dim), (B, T, Hkv, head_dim)]
    return [torch.randn(s, generator=g).to(device=device, dtype=DTYPES[dtype]) for s in shapes]


WRONG = "wrong result"              # the reason's start when a backend's output is off naive's beyond rounding


def max_abs_err_bound(dtype: str, n: int, v_max: float) -> float:
    """The largest max |out - naive| rounding explains at one point, by tests/tolerances.py's rule: fp32
    reductions of at most n terms, 4 deep (q.k, the softmax sum, probs @ v, merging a backend's pieces), plus
    for bf16 / fp16 three roundings to that dtype (logits, probabilities, output), each once on each side;
    all at the scale of max|v|, since an attention output is a weighted average of v rows."""
    def two_orderings(u, terms, depth):              # depth * 2 * gamma_terms (Higham §3.1)
        return depth * 2 * terms * u / (1 - terms * u)
    u32 = torch.finfo(torch.float32).eps / 2
    storage = 0.0 if dtype == "float32" else two_orderings(torch.finfo(DTYPES[dtype]).eps / 2, 1, 3)
    return v_max * (two_orderings(u32, n, 4) + storage)


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


class Status(str, Enum):
    """What became of one point; the record's `reason` says why for every status but OK."""
    OK = "ok"
    OOM = "oom"                         # out of memory (reason: the backend's error)
    SKIPPED = "skipped"                 # the backend does not run this point (reason: why not)
    ERROR = "error"                     # it raised, or its output is wrong (reason: the error / WRONG ...)
    NOT_REACHED = "not reached"         # the run stopped first (reason: Run.stopped(): cancelled / budget)

    def __str__(self) -> str:           # json.dumps and f-strings write the plain value
        return self.value


def _failure(e: BaseException) -> dict:
    """The status and reason fields of a record whose backend raised."""
    text = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return dict(status=Status.OOM if _is_oom(e) else Status.ERROR, reason=text)


def _free(device):
    if device == "cuda":
        torch.cuda.empty_cache()


def empty_record(backend: str, **point) -> dict:
    """A record of the results file's schema with nothing measured yet."""
    return dict(backend=backend, **point, repeats=0, median_ms=None, min_ms=None, max_ms=None,
                peak_mem_bytes=None, tflops=None, max_abs_err=None, status=Status.OK, reason="")


def measure_shape(backends: list[str], *, mask: str = "recsys", B: int = 1, Hq: int = 4, Hkv: int = 2,
                  head_dim: int = 16, T: int = 64, num_candidates: int = 3, dtype: str = "float32",
                  device: str = "cpu", cap: float = 30.0, cap_method: str = "tanh", preset: str = "custom",
                  repeats: int = 5, min_block_ms: Optional[float] = None, run: Optional[Run] = None,
                  skip: Optional[dict] = None, seed: int = 0, padded: bool = False) -> list[dict]:
    """Time every backend on the same inputs -> one record per backend, naive first (the reference).

    Each backend is first warmed up (FlexAttention compiles, masks are built and cached: none of it
    timed), its output compared with naive's (max_abs_err) and its peak memory measured in a call of
    its own. Then `repeats` rounds time the backends interleaved (A B C, A B C, ...), so a slow spell of
    a shared machine falls on all of them alike; each record keeps repeats, median, min and max ms.
    `run` is checked before every warm-up and every timed block. `skip`: backend -> why not to run it.
    `padded`: the history carries key padding (padded_valid), so backends run their padded paths.
    Each record carries the point's 128 x 128 tile counts (full / partial / empty) beside its times.
    A failure (out of memory, an error) is the record's status, never an exception; so is an output off
    naive's (over the valid query rows) by more than max_abs_err_bound: status error, reason WRONG ..., not timed."""
    run = run or Run()
    names = ["naive"] + [b for b in backends if b != "naive"]
    valid = padded_valid(B, T, T - num_candidates, device) if padded else None
    attn_mask = AttentionMask(mask, T, T - num_candidates, valid)
    point = dict(preset=preset, mask=mask, dtype=dtype, B=B, Hq=Hq, Hkv=Hkv, head_dim=head_dim, T=T,
                 num_candidates=num_candidates, cap_method=cap_method, padded=padded,
                 tiles=tile_counts(attn_mask, device))
    records = {b: empty_record(b, **point) for b in names}
    min_block_ms = min_block_ms if min_block_ms is not None else (10.0 if device == "cuda" else 20.0)
    ready: dict[str, tuple[Callable[[], torch.Tensor], int]] = {}    # backend -> (call, calls per block)
    times: dict[str, list[float]] = {}
    try:
        with torch.no_grad():
            inputs, reference = None, None
            for b in names:
                if run.stopped():
                    records[b].update(status=Status.NOT_REACHED, reason=run.stopped())
                    continue
                why = ((skip or {}).get(b)
                       or unavailable_reason(b, device=device, dtype=dtype, cap=cap, cap_method=cap_method,
                                             mask_kind=mask, padding=padded, head_dim=head_dim)
                       or _ram_shortfall(b, device, B, Hq, T))
                if why:
                    records[b].update(status=Status.SKIPPED, reason=why)
                    continue
                try:
                    if inputs is None:
                        inputs = make_inputs(B, Hq, Hkv, head_dim, T, dtype, device, seed=seed)
                    call = functools.partial(_call, b, *inputs, attn_mask, head_dim ** -0.5, cap, cap_method)
                    warm = time.perf_counter()
                    out = call()                  # warm-up: compilation and mask caches happen here
                    _sync(device)
                    run.warmed_up(time.perf_counter() - warm)
                    t0 = time.perf_counter()
                    peak = peak_memory_bytes(call, device)
                    one_call_ms = (time.perf_counter() - t0) * 1e3
                except Exception as e:  # noqa: BLE001 — every failure becomes a recorded status
                    records[b].update(_failure(e))
                    _free(device)
                    continue
                if b == "naive":
                    reference = out
                err = None
                if reference is not None:             # padded query rows mean nothing (flash kernels zero them)
                    diff = (out.float() - reference.float()).abs()
                    err = float((diff if valid is None else diff[valid]).max())     # a NaN stays NaN
                    del diff                          # a full-size fp32 tensor: not held through the next warm-up
                records[b].update(peak_mem_bytes=int(peak), max_abs_err=err)
                del out
                bound = None if err is None else max_abs_err_bound(dtype, max(T, head_dim), v_max(inputs))
                if err is not None and not err <= bound:          # NaN fails too
                    records[b].update(status=Status.ERROR, reason=f"{WRONG}: max |out - naive| = {err:.3g} over "
                                      f"the valid rows, above the rounding bound {bound:.3g}")
                    continue
                ready[b] = (call, calls_per_block(one_call_ms, min_block_ms))
            del reference
            times.update({b: [] for b in ready})
            for _ in range(repeats):
                for b, (call, number) in list(ready.items()):
                    if run.stopped():
                        break
                    try:
                        times[b].append(time_block_ms(call, device, number))
                    except Exception as e:  # noqa: BLE001
                        records[b].update(_failure(e))
                        ready.pop(b)
                        _free(device)
                if run.stopped():
                    break
    finally:
        ready.clear()
        _free(device)
    flops = mask_flops(attn_mask, B, Hq, head_dim, num_candidates, device)
    for b, ts in times.items():
        r = records[b]
        if ts and r["status"] == "ok":
            r.update(spread(ts), tflops=flops / (statistics.median(ts) * 1e-3) / 1e12)
        elif r["status"] == "ok":         # warmed up, then stopped before its first timed block
            r.update(peak_mem_bytes=None, max_abs_err=None, status=Status.NOT_REACHED,
                     reason=run.stopped() or "not timed")
    return [records[b] for b in names]


def v_max(inputs) -> float:
    """max |v| of make_inputs' (q, k, v): the scale of every attention output."""
    return float(inputs[2].abs().max())


def _call(backend, q, k, v, mask, multiplier, cap, cap_method) -> torch.Tensor:
    return attend(q, k, v, mask, backend=backend, multiplier=multiplier, cap=cap, cap_method=cap_method).out


# --- a sweep ------------------------------------------------------------------------------

def sweep(grid: "str | Grid" = "lecture", device: str = "cpu", *, budget_s: Optional[float] = None,
          backends: Optional[list[str]] = None, run: Optional[Run] = None,
          seq_lens: Optional[list[int]] = None, repeats: int = 5,
          min_block_ms: Optional[float] = None) -> Iterator[dict]:
    """Yield one record per (T, mask, cap, padding, backend), naive first at each shape (the error reference).

    Once the run stops (its budget spent, or cancelled), the remaining points are yielded (cheaply)
    as Status.NOT_REACHED with the reason, so every result file lists the whole grid.
    A backend out of memory at some T is skipped at every longer T; the others go on."""
    # a name from GRIDS (reduced on CPU), or the app's own Grid(...), run as given
    p, name = (grid, "custom") if isinstance(grid, Grid) else (grid_for(grid, device), grid)
    names = [b for b in (backends or list(BACKENDS)) if b in BACKENDS]
    run = run or Run(budget_s)
    oom_at: dict[str, int] = {}
    for T in sorted(seq_lens or p.seq_lens):
        for mask in p.masks:
            for cap_method, padded in itertools.product(p.cap_methods, p.paddings):
                skip = {b: f"ran out of memory at T = {t}" for b, t in oom_at.items()}
                for r in measure_shape(names, mask=mask, B=p.B, Hq=p.Hq, Hkv=p.Hkv, head_dim=p.head_dim, T=T,
                                       num_candidates=p.num_candidates, dtype=p.dtype, device=device, cap=p.cap,
                                       cap_method=cap_method, preset=name, repeats=repeats,
                                       min_block_ms=min_block_ms, run=run, skip=skip, padded=padded):
                    if r["status"] == Status.OOM:
                        oom_at.setdefault(r["backend"], T)
                    yield r



# --- the results file -------------------------------------------------------------------------

def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48]


def load_results(results_dir: Path = RESULTS_DIR) -> list[tuple[str, dict]]:
    """(file name, data) for every attention results file there; other JSON files (training, app latency,
    load test) are skipped. The README tables and the app's "recorded" list both read through this. Read
    again only when a file changed (the timing tab asks on every opening); the data is shared: do not change it."""
    paths = sorted(Path(results_dir).glob("*.json"))
    stamps = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        stamps.append((str(path), stat.st_mtime_ns, stat.st_size))
    return _read_results(tuple(stamps))


@functools.lru_cache(maxsize=4)
def _read_results(stamps: tuple) -> list[tuple[str, dict]]:
    out = []
    for path, _, _ in stamps:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("records"), list) and "device_name" in data:
            data["records"] = [with_status(r) for r in data["records"]]
            out.append((Path(path).name, data))
    return out


# --- the whole trunk's forward, per backend ----------------------------------------------------

# one record of a results file's optional "trunk" list: the whole forward of a preset's trunk on one backend
TRUNK_FIELDS = ("preset", "B", "T", "dtype", "cap_method", "mask", "backend", "status", "reason", "repeats",
                "median_ms", "min_ms", "max_ms", "attention_ms", "rel_err")
# A GPU session's probe (benchmarks/results/gpu-run-<date>/probe.py) timed the trunk before results files had a
# "trunk" list: its bf16 model, inputs padded in two rows, grok.py's prefix-causal mask, CUDA events
PROBE_TRUNK = dict(dtype="bfloat16", mask=model_mask_kind("causal"), repeats=7,
                   method="median of 7 calls after 2 warm-ups, one backend after another (not interleaved; "
                          "no min / max kept), CUDA events")
_PROBE_KEY = re.compile(r"(?P<preset>\S+) B(?P<B>\d+) cap (?P<cap_method>\S+) (?P<backend>\S+)")


@dataclass(frozen=True)
class TrunkTimings:
    """The whole trunk's forward per backend as one run recorded it: TRUNK_FIELDS records, where they
    were read and how they were measured, in words."""
    records: tuple
    source: str
    method: str


def trunk_timings(name: str, data: dict, results_dir: Path = RESULTS_DIR) -> Optional[TrunkTimings]:
    """The trunk timings of results file `name` (`data`, as load_results reads it): its own "trunk" list,
    else the probe.json of its GPU session's folder (gpu-run-<date>/, the same device); None when neither."""
    if data.get("trunk"):
        records = tuple(with_status(dict({k: None for k in TRUNK_FIELDS}, **r)) for r in data["trunk"])
        repeats = sorted({r["repeats"] for r in records if r["repeats"]})
        return TrunkTimings(records, name, f"timed by the benchmark: median (min–max) of "
                                           f"{'/'.join(map(str, repeats)) or 'its'} repeats per backend")
    probe = Path(results_dir) / f"gpu-run-{data.get('date')}" / "probe.json"
    try:
        found = json.loads(probe.read_text())
    except (OSError, ValueError):
        return None
    if found.get("device") != data.get("device_name") or not isinstance(found.get("trunk"), dict):
        return None
    records = []
    for key, got in found["trunk"].items():
        m = _PROBE_KEY.fullmatch(key)
        if not m or m["preset"] not in PRESETS:
            continue
        status = Status.OK if "ms" in got else Status.SKIPPED if "skipped" in got else Status.ERROR
        records.append(dict(preset=m["preset"], B=int(m["B"]), T=PRESETS[m["preset"]].layout.seq_len,
                            dtype=PROBE_TRUNK["dtype"], cap_method=m["cap_method"], mask=PROBE_TRUNK["mask"],
                            backend=m["backend"], status=status, reason=got.get("skipped") or got.get("error") or "",
                            repeats=PROBE_TRUNK["repeats"] if "ms" in got else 0, median_ms=got.get("ms"),
                            min_ms=None, max_ms=None, attention_ms=None, rel_err=got.get("rel_err")))
    return TrunkTimings(tuple(records), f"{probe.parent.name}/{probe.name}", PROBE_TRUNK["method"])


_LEGACY = {"skipped: time budget spent": (Status.NOT_REACHED, "time budget spent"),
           "skipped: cancelled": (Status.NOT_REACHED, "cancelled")}


def with_status(r: dict) -> dict:
    """A record as read from a file, its status a Status and its reason apart. Files written before
    statuses had reasons held one string ('skipped: <why>', 'error: <what>'): split here, once."""
    raw = str(r.get("status", ""))
    if raw in _LEGACY:
        status, reason = _LEGACY[raw]
    else:
        head, _, rest = raw.partition(": ")
        if head in Status._value2member_map_:
            status, reason = Status(head), r.get("reason") or rest or ("out of memory" if head == "oom" else "")
        else:
            status, reason = Status.ERROR, r.get("reason") or raw
    return dict(r, status=status, reason=reason)


def on_gpu(data: dict) -> bool:
    return data.get("cuda") is not None and not str(data["device_name"]).startswith("CPU")


def results_path(device: str, date: str, out_dir: Path = RESULTS_DIR) -> Path:
    return out_dir / f"{slug(device_name(device))}-{date}.json"


def point_key(r: dict) -> tuple:
    return tuple(r.get(k) for k in ("preset", "backend", "mask", "cap_method", "dtype", "B", "Hq", "Hkv",
                                    "head_dim", "T", "num_candidates")) + (bool(r.get("padded")),)
