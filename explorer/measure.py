"""The measurement library: one shape timed on every backend, a sweep over a grid of shapes, results files read.

The benchmark CLI (``python -m benchmarks.attention``) and the app's timing tab both measure through
``measure_shape`` (one shape, every backend) and ``sweep`` (a generator of records over a ``Grid``: a
preset's attention shapes, models.presets, or the sidebar's).
Per shape: the backends are warmed up (compilation and mask caches never timed), then timed
interleaved (A B C, A B C, ...) for at least 5 repeats, each repeat a block of calls lasting ~10-20 ms
(CUDA events on GPU; perf_counter on CPU, where every op is synchronous). Each record keeps repeats,
median / min / max ms, peak memory above the inputs (torch.cuda.max_memory_allocated / sampled RSS on
CPU), TFLOP/s counting only unmasked (useful) FLOPs, max |error| and relative error against grok.py's
attention in fp32 on the same inputs (computed in pieces, so every point is checked, whether naive fits or
not), and a ``Status`` (ok / oom / skipped / error / not reached) and, for all but ok, a ``reason``. A
``Run`` (its own stop flag and deadline) is checked before every timed block.
"""
from __future__ import annotations

import copy
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

from models import attention as A
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


# The benchmark's grids by name (a results record's "preset"): batch 32, or production's 256 per H100
# (docs/originals.md §3); the lecture's history and phoenix-prod's grown to longer sequences.
GRIDS: dict[str, Grid] = {
    "lecture": preset_grid("lecture", B=8, dtype="float32",
                           seq_lens=(PRESETS["lecture"].layout.seq_len, 64, 256, 1024),
                           masks=("recsys", "recsys-bidirectional")),
    "phoenix-prod": preset_grid("phoenix-prod", B=32, masks=("recsys", "recsys-bidirectional"),
                                paddings=(False, True)),
    "phoenix-prod-b256": preset_grid("phoenix-prod", B=256, masks=("recsys", "recsys-bidirectional")),
    # qk_norm and no cap; 64 candidates in 128 slots (docs/originals.md §3, §7)
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

def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


YIELDED = "turn over: other runs wait"


class Run:
    """One run's stop conditions: a flag of its own (Stop sets it; the next run makes a new Run, so no
    later run can clear it) and a deadline. Checked before every timed block, so a run ends within one
    block (or one backend's warm-up) of either."""

    def __init__(self, budget_s: Optional[float] = None, compile_allowance_s: float = 0.0,
                 yield_to: Optional[Callable[[], int]] = None, turn_s: float = 0.0):
        self.flag = threading.Event()
        self.started = time.perf_counter()
        self.deadline = None if budget_s is None else self.started + budget_s
        self.compile_left = compile_allowance_s      # warm-up time (compiles) that does not spend the budget
        # a run that shares its device with others': past `turn_s` (compiles included) it ends while
        # yield_to() says how many other runs wait
        self.yield_to, self.turn_s, self.yielded = yield_to, turn_s, False

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
        """None while the run may go on, else why it ends: 'cancelled', 'time budget spent' or, its turn
        over while others wait, YIELDED."""
        if self.yielded:                    # it stays stopped, whatever the others do meanwhile
            return YIELDED
        if self.flag.is_set():
            return "cancelled"
        now = time.perf_counter()
        if self.deadline is not None and now > self.deadline:
            return "time budget spent"
        if self.yield_to is not None and now - self.started >= self.turn_s and self.yield_to() > 0:
            self.yielded = True
            return YIELDED
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
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        sync(device)
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
    sync(device)
    ms = statistics.median(time_block_ms(fn, device, 3 if device == "cuda" else 1) for _ in range(repeats))
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


# --- one shape, every backend interleaved ----------------------------------------------------

def make_inputs(B, Hq, Hkv, head_dim, T, dtype, device, seed=0):
    """q [B, T, Hq, K], k/v [B, T, Hkv, K], unit normal (generated on CPU: same numbers on any device)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, T, Hq, head_dim), (B, T, Hkv, head_dim), (B, T, Hkv, head_dim)]
    return [torch.randn(s, generator=g).to(device=device, dtype=DTYPES[dtype]) for s in shapes]


WRONG = "wrong result"        # the reason's start when a backend's output is off the reference beyond rounding


@dataclass
class Reference:
    """grok.py's attention in fp32 on one point's inputs, and what its rounding bound reads."""
    out: torch.Tensor         # [B, T, Hq, K] fp32
    scale: torch.Tensor       # [B, T, Hq, K] fp32: the same weights applied to |v|, each output's own scale
    logit_max: float          # max |logit| entering the softmax (after the cap) over the allowed pairs
    dot_max: float            # multiplier * max |q_i| * max |k_j| (2-norms): bounds every sum_d |q_d k_d| term


# bytes of fp32 scores one reference piece may hold (SCORE_COPIES [rows, T] tensors at once: logits, the
# masked copy, the probabilities, exp's temporary), so the reference fits wherever the backends do
REFERENCE_PIECE_BYTES = {"cuda": 1 << 30, "cpu": 64 << 20}
SCORE_COPIES = 4


def reference_attention(q, k, v, mask: AttentionMask, *, multiplier: float, cap: float, cap_method: str,
                        piece_bytes: int) -> Reference:
    """naive's function in fp32 computed in pieces — one KV head's query group, a slice of the batch and of
    the query rows at a time, each piece's mask rows built for it — so no piece holds more than
    `piece_bytes` of scores, at any B and T. The error reference of every timed point."""
    B, T, Hq, K = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    row_bytes = G * k.shape[1] * 4 * SCORE_COPIES                   # one query row of one group, one batch row
    batch = max(1, min(B, piece_bytes // (row_bytes * T)))
    rows = max(1, min(T, piece_bytes // (row_bytes * batch)))
    out = torch.empty(B, T, Hq, K, dtype=torch.float32, device=q.device)
    scale = torch.empty_like(out)
    logit_max = torch.zeros((), dtype=torch.float32, device=q.device)
    for r0 in range(0, T, rows):
        r1 = min(T, r0 + rows)
        allowed = mask.dense_rows(r0, r1, q.device)                                     # [B|1, 1, rows, T]
        for b0 in range(0, B, batch):
            b1 = min(B, b0 + batch)
            allow = allowed if allowed.shape[0] == 1 else allowed[b0:b1]
            for h in range(Hkv):
                qg = q[b0:b1, r0:r1, h * G:(h + 1) * G].float()                       # [b, rows, G, K]
                kh, vh = (x[b0:b1, :, h:h + 1].float() for x in (k, v))               # [b, T, 1, K]
                o, probs, logits, _ = A.grouped_attention(qg, kh, vh, multiplier=multiplier, cap=cap,
                                                          cap_method=cap_method, allowed=allow)
                out[b0:b1, r0:r1, h * G:(h + 1) * G] = o
                scale[b0:b1, r0:r1, h * G:(h + 1) * G] = torch.einsum("bgts,bsd->btgd", probs, vh[:, :, 0].abs())
                logit_max = torch.maximum(logit_max, logits.masked_fill(~allow, 0.0).abs().amax())
                del o, probs, logits
    norm = lambda x: float(x.float().norm(dim=-1).max())  # noqa: E731
    return Reference(out, scale, float(logit_max), multiplier * norm(q) * norm(k))


def attention_error_bound(dtype: str, keys: int, head_dim: int, logit_max: float, dot_max: float) -> float:
    """C with |out - reference| <= C * reference.scale element by element: tests/tolerances.py's
    attention_bound (derived there): the logits rounded to bf16 / fp16 once and the fp32 dot products move every
    softmax weight by expm1(2 (u max|s| + 2 gamma_K dot_max)) relative — the softmax's condition number is its
    logits' size —, the probabilities, a piece's and the merged output rounded once each (3u), and fp32 sums
    over the keys on both sides and the merge (6 gamma_keys)."""
    def gamma(n, u):                                 # Higham §3.1: n terms in any order
        return n * u / (1 - n * u)
    u32 = torch.finfo(torch.float32).eps / 2
    u = 0.0 if dtype == "float32" else torch.finfo(DTYPES[dtype]).eps / 2
    return math.expm1(2 * (u * logit_max + 2 * gamma(head_dim, u32) * dot_max)) + 3 * u + 6 * gamma(keys, u32)


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
                peak_mem_bytes=None, tflops=None, max_abs_err=None, rel_err=None, status=Status.OK, reason="")


def measure_shape(backends: list[str], *, mask: str = "recsys", B: int = 1, Hq: int = 4, Hkv: int = 2,
                  head_dim: int = 16, T: int = 64, num_candidates: int = 3, dtype: str = "float32",
                  device: str = "cpu", cap: float = 30.0, cap_method: str = "tanh", preset: str = "custom",
                  repeats: int = 5, min_block_ms: Optional[float] = None, run: Optional[Run] = None,
                  skip: Optional[dict] = None, seed: int = 0, padded: bool = False) -> list[dict]:
    """Time every backend on the same inputs -> one record per backend, naive first.

    Each backend is first warmed up (FlexAttention compiles, masks are built and cached: none of it
    timed), its output compared with the fp32 reference (reference_attention, in pieces, so at every size
    and whether naive fits or not: max_abs_err and rel_err over the valid rows) and its peak memory
    measured in a call of its own. Then `repeats` rounds time the backends interleaved (A B C, A B C, ...), so a slow spell of
    a shared machine falls on all of them alike; each record keeps repeats, median, min and max ms.
    `run` is checked before every warm-up and every timed block. `skip`: backend -> why not to run it.
    `padded`: the history carries key padding (padded_valid), so backends run their padded paths.
    Each record carries the point's 128 x 128 tile counts (full / partial / empty) beside its times.
    A failure (out of memory, an error) is the record's status, never an exception; so is an output off the
    reference (over the valid query rows) by more than attention_error_bound x its scale anywhere: status
    error, reason WRONG ..., not timed."""
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
            inputs, reference, bound = None, None, None
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
                        reference = reference_attention(
                            *inputs, attn_mask, multiplier=head_dim ** -0.5, cap=cap, cap_method=cap_method,
                            piece_bytes=REFERENCE_PIECE_BYTES[device])
                        bound = attention_error_bound(dtype, T, head_dim, reference.logit_max, reference.dot_max)
                    call = functools.partial(_call, b, *inputs, attn_mask, head_dim ** -0.5, cap, cap_method)
                    warm = time.perf_counter()
                    out = call()                  # warm-up: compilation and mask caches happen here
                    sync(device)
                    run.warmed_up(time.perf_counter() - warm)
                    t0 = time.perf_counter()
                    peak = peak_memory_bytes(call, device)
                    one_call_ms = (time.perf_counter() - t0) * 1e3
                except Exception as e:  # noqa: BLE001 — every failure becomes a recorded status
                    records[b].update(_failure(e))
                    _free(device)
                    continue
                check = compare(out, reference, bound, valid)
                del out
                records[b].update(peak_mem_bytes=int(peak), max_abs_err=check["max_abs_err"],
                                  rel_err=check["rel_err"], err_vs=ERR_VS)
                if check["over"]:
                    records[b].update(status=Status.ERROR, reason=f"{WRONG}: |out - fp32 reference| is above the "
                                      f"rounding bound ({bound:.3g} x P|v|) at {check['over']} valid elements, "
                                      f"worst {check['ratio']:.3g} x it; max |out - reference| = "
                                      f"{check['max_abs_err']:.3g}")
                    continue
                ready[b] = (call, calls_per_block(one_call_ms, min_block_ms))
            del reference
            _free(device)
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
            r.update(peak_mem_bytes=None, max_abs_err=None, rel_err=None, status=Status.NOT_REACHED,
                     reason=run.stopped() or "not timed")
    return [records[b] for b in names]


ERR_VS = "fp32"      # a record's errors are against reference_attention (older files: against naive)


def compare(out: torch.Tensor, ref: Reference, bound: float, valid: Optional[torch.Tensor]) -> dict:
    """One backend's output against the reference over the valid query rows (padded rows mean nothing: the
    flash kernels zero them): max |out - ref|, relative error (/ max |ref|), how many elements lie above
    bound x ref.scale (a NaN counts) and the worst ratio to it."""
    diff = (out.float() - ref.out).abs()
    over = ~(diff <= bound * ref.scale)                          # NaN is over
    ratio = diff / (bound * ref.scale).clamp_min(torch.finfo(torch.float32).tiny)
    want = ref.out.abs()
    if valid is not None:
        diff, over, ratio, want = (x[valid] for x in (diff, over, ratio, want))
    max_err = float(diff.max())                                  # a NaN stays NaN
    scale = float(want.max())
    return dict(max_abs_err=max_err, rel_err=max_err / scale if scale > 0 else max_err,
                over=int(over.sum()), ratio=float(ratio.nan_to_num(float("inf")).max()))


def _call(backend, q, k, v, mask, multiplier, cap, cap_method) -> torch.Tensor:
    return attend(q, k, v, mask, backend=backend, multiplier=multiplier, cap=cap, cap_method=cap_method).out


# --- a sweep ------------------------------------------------------------------------------

def sweep(grid: "str | Grid" = "lecture", device: str = "cpu", *, budget_s: Optional[float] = None,
          backends: Optional[list[str]] = None, run: Optional[Run] = None,
          seq_lens: Optional[list[int]] = None, repeats: int = 5,
          min_block_ms: Optional[float] = None) -> Iterator[dict]:
    """Yield one record per (T, mask, cap, padding, backend), naive first at each shape.

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



# --- the whole trunk: what flash buys the model ---------------------------------------------------------

@dataclass(frozen=True)
class TrunkGrid:
    """The trunk forward a benchmark grid times beside its attention: a preset's model (its family's trunk,
    random weights) on a key-padded batch of B in `dtype`, under each cap (a grok trunk's tanh 30 or none;
    an xrex trunk likewise, its own being none)."""
    model_preset: str
    B: int
    dtype: str
    cap_methods: tuple = ("tanh", "none")


# keyed by the attention grid they sit beside (GRIDS); the GPU session times phoenix-prod and phoenix-2026
TRUNK_GRIDS: dict[str, TrunkGrid] = {
    "lecture": TrunkGrid("lecture", B=8, dtype="float32"),
    "phoenix-prod": TrunkGrid("phoenix-prod", B=32, dtype="bfloat16"),
    "phoenix-2026": TrunkGrid("phoenix-2026", B=32, dtype="bfloat16", cap_methods=("none",)),
}
# on CPU: the nano trunk of the same family, fp32 (CPU bf16 matmuls are emulated), two batch rows
CPU_TRUNK_REDUCTIONS = {"phoenix-prod": dict(model_preset="phoenix-nano", B=2, dtype="float32"),
                        "phoenix-2026": dict(model_preset="phoenix-2026-nano", B=2, dtype="float32")}
# a results file's optional "trunk" and "views" lists: one dict per record with exactly these keys (the
# first 7 / 2 name the point). attention_ms: the median time attention took inside one forward (AttentionClock);
# rel_err: max |out - fp32 reference| / max |reference| over the valid rows. cold_ms: a view's first call in
# the process, warm_ms: the median of `repeats` calls after it; both with the JSON of every figure it returns.
TRUNK_KEYS = ("preset", "B", "T", "dtype", "cap_method", "mask", "backend", "status", "reason", "repeats",
              "median_ms", "min_ms", "max_ms", "attention_ms", "rel_err")
TRUNK_STATUSES = ("ok", "skipped", "error", "wrong")
VIEW_KEYS = ("preset", "view", "cold_ms", "warm_ms", "repeats")


def trunk_grid_for(name: str, device: str) -> Optional[TrunkGrid]:
    g = TRUNK_GRIDS.get(name)
    return replace(g, **CPU_TRUNK_REDUCTIONS.get(name, {})) if g is not None and device == "cpu" else g


class AttentionClock:
    """Inside `model` (any module whose layers call self.attention_fn, the hook the bug zoo plants into),
    every attention call bracketed by CUDA events (perf_counter on CPU), so the forward it sits in is timed as
    a whole and its attention apart, in the same forward. attention_ms() after the forward: their sum."""

    def __init__(self, model: torch.nn.Module, device: str):
        self.layers = [m for m in model.modules() if hasattr(m, "attention_fn")]
        self.device, self.spans = device, []

    def _mark(self):
        if self.device != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __enter__(self):
        def timed(fn):
            def call(*args, **kwargs):
                start = self._mark()
                out = fn(*args, **kwargs)
                self.spans.append((start, self._mark()))
                return out
            return call
        self.originals = [m.attention_fn for m in self.layers]
        for m in self.layers:
            m.attention_fn = timed(m.attention_fn)
        return self

    def __exit__(self, *exc):
        for m, fn in zip(self.layers, self.originals):
            m.attention_fn = fn

    def attention_ms(self) -> float:
        sync(self.device)
        if self.device == "cuda":
            total = sum(a.elapsed_time(b) for a, b in self.spans)
        else:
            total = sum(b - a for a, b in self.spans) * 1e3
        self.spans = []
        return total


class Trunk:
    """A preset's trunk (random weights, seed 1) on `device` with a key-padded batch (padded_valid, seed 3):
    forward(backend) in `dtype`; reference() the same weights in fp32 with reference_attention in every layer
    (in pieces: it fits wherever the timed forward does) -> (embeddings, max |logit| of any layer)."""

    def __init__(self, preset: str, B: int, dtype: str, cap_method: str, device: str):
        from models.grok import Transformer, init_params
        from models.xrex import XrexTrunk
        p = PRESETS[preset]
        T, self.offset = p.layout.seq_len, p.layout.candidate_start_offset
        self.family, self.dtype, self.device = p.family, dtype, device
        if p.family == "grok":
            self.config = p.transformer.replace(cap_method=cap_method)
            self.ref_model = init_params(Transformer(self.config), "random", seed=1).to(device).eval()
            self.kind = self.ref_model.attention_mask(None, self.offset, seq_len=T).kind
        else:                        # xrex: numerics="bf16" reads parameters in bf16 (already so: no cast per call)
            self.config = p.xrex_config().replace(attn_logit_cap=30.0 if cap_method != "none" else -1.0,
                                                  attn_logit_cap_method=cap_method if cap_method != "none" else "tanh")
            self.ref_model = init_params(XrexTrunk(self.config), "random", seed=1).to(device).eval()
            self.kind = self.ref_model.ranker.attention_mask(None, seq_len=T).kind
        self.model = copy.deepcopy(self.ref_model).to(DTYPES[dtype])
        self.cap_method = cap_method
        self.emb = torch.randn(B, T, self.config.emb_size, generator=torch.Generator().manual_seed(3)).to(device)
        self.emb_low = self.emb.to(DTYPES[dtype])
        self.valid = padded_valid(B, T, self.offset, device)

    @property
    def cap(self) -> float:
        return self.config.logit_cap if self.family == "grok" else self.config.attn_logit_cap

    def unavailable(self, backend: str) -> Optional[str]:
        return unavailable_reason(backend, device=self.device, dtype=self.dtype, cap=self.cap,
                                  cap_method=self.cap_method, mask_kind=self.kind, padding=True,
                                  head_dim=self.config.key_size)

    def _run(self, model, backend: str, low: bool) -> torch.Tensor:
        emb = self.emb_low if low else self.emb
        if self.family == "grok":
            return model(emb, self.valid, self.offset, backend=backend).embeddings
        numerics = "bf16" if low and self.dtype == "bfloat16" else "fp32"
        return model(emb, self.valid, backend=backend, numerics=numerics).embeddings

    def forward(self, backend: str) -> torch.Tensor:
        return self._run(self.model, backend, low=True)

    def reference(self, piece_bytes: int) -> tuple[torch.Tensor, float]:
        logit_max = []

        def reference_fn(q, k, v, mask, *, multiplier, cap, cap_method, backend=None, need_weights=False):
            ref = reference_attention(q, k, v, mask, multiplier=multiplier, cap=cap, cap_method=cap_method,
                                      piece_bytes=piece_bytes)
            logit_max.append(ref.logit_max)
            return A.AttentionOutput(ref.out.to(q.dtype))
        layers = [m for m in self.ref_model.modules() if hasattr(m, "attention_fn")]
        originals = [m.attention_fn for m in layers]
        try:
            for m in layers:
                m.attention_fn = reference_fn
            out = self._run(self.ref_model, "naive", low=False).float()
        finally:
            for m, fn in zip(layers, originals):
                m.attention_fn = fn
        return out, max(logit_max)

    def error_bound(self, logit_max: float) -> float:
        """rel_err above which a backend's forward is wrong: tests/tolerances.py's storage_forward_bound (fp32
        reductions 6 per layer + 1 deep, each stage rounded to `dtype` once per side, each layer's softmax moved
        by its logits' rounding); fp32 forwards use a float32 rounding of every stage instead."""
        c = self.config
        n = max(c.emb_size, c.ffn_hidden, self.emb.shape[1])
        depth = 6 * c.num_layers + 1
        u32 = torch.finfo(torch.float32).eps / 2
        u = torch.finfo(DTYPES[self.dtype]).eps / 2
        stored = 0.0 if self.dtype == "float32" else depth * 2 * u / (1 - u)
        return depth * 2 * n * u32 / (1 - n * u32) + stored + c.num_layers * math.expm1(2 * u * logit_max)


def trunk_record(preset: str, backend: str, **fields) -> dict:
    """A record of the results file's "trunk" list (TRUNK_KEYS) with nothing measured yet."""
    return {**dict.fromkeys(TRUNK_KEYS), "status": "ok", "reason": "", "repeats": 0, **fields,
            "preset": preset, "backend": backend}


def measure_trunk(grid: TrunkGrid, cap_method: str, device: str, *, backends: Optional[list[str]] = None,
                  repeats: int = 5, min_block_ms: Optional[float] = None, run: Optional[Run] = None) -> list[dict]:
    """The whole trunk forward on every backend, naive first: warmed up, checked against the fp32 reference
    (rel_err over the valid rows; past Trunk.error_bound the status is "wrong", untimed), then timed
    interleaved for `repeats` rounds; attention_ms is the median time its attention calls took inside the
    same forwards (AttentionClock). A failure is a status ("error", "skipped"), never an exception."""
    run = run or Run()
    names = ["naive"] + [b for b in (backends or list(BACKENDS)) if b != "naive" and b in BACKENDS]
    trunk = Trunk(grid.model_preset, grid.B, grid.dtype, cap_method, device)
    point = dict(B=grid.B, T=trunk.emb.shape[1], dtype=grid.dtype, cap_method=cap_method, mask=trunk.kind)
    records = {b: trunk_record(grid.model_preset, b, **point) for b in names}
    min_block_ms = min_block_ms if min_block_ms is not None else (10.0 if device == "cuda" else 20.0)
    ready: dict[str, tuple[Callable[[], torch.Tensor], int]] = {}
    times: dict[str, list[tuple[float, float]]] = {}
    clock = AttentionClock(trunk.model, device)
    try:
        with torch.no_grad():
            ref, logit_max = trunk.reference(REFERENCE_PIECE_BYTES[device])
            bound = trunk.error_bound(logit_max)
            valid, scale = trunk.valid, float(ref[trunk.valid].abs().max())
            for b in names:
                why = run.stopped() or trunk.unavailable(b)
                if why:
                    records[b].update(status="skipped", reason=why)
                    continue
                call = functools.partial(trunk.forward, b)
                try:
                    warm = time.perf_counter()
                    out = call()                              # warm-up: compiles, masks, caches
                    sync(device)
                    run.warmed_up(time.perf_counter() - warm)
                    t0 = time.perf_counter()
                    call()
                    sync(device)
                    one_call_ms = (time.perf_counter() - t0) * 1e3
                except Exception as e:  # noqa: BLE001 — a failure is the record's status
                    records[b].update(status="error", reason=_failure(e)["reason"])
                    _free(device)
                    continue
                err = float((out.float() - ref)[valid].abs().max()) / scale
                del out
                records[b].update(rel_err=err)
                if not err <= bound:                          # NaN is wrong too
                    records[b].update(status="wrong", reason=f"{WRONG}: relative error {err:.3g} against the fp32 "
                                                             f"reference, above the rounding bound {bound:.3g}")
                    continue
                ready[b] = (call, calls_per_block(one_call_ms, min_block_ms))
            del ref
            times.update({b: [] for b in ready})
            with clock:
                for _ in range(repeats):
                    for b, (call, number) in list(ready.items()):
                        if run.stopped():
                            break
                        clock.attention_ms()                  # drop spans of an earlier block
                        ms = time_block_ms(call, device, number)
                        times[b].append((ms, clock.attention_ms() / number))
                    if run.stopped():
                        break
    finally:
        ready.clear()
        _free(device)
    for b, ts in times.items():
        if ts:
            records[b].update(spread([t for t, _ in ts]), attention_ms=statistics.median(a for _, a in ts))
        else:
            records[b].update(status="skipped", reason=run.stopped() or "not timed")
    return [records[b] for b in names]


def sweep_trunks(names: list[str], device: str, *, budget_s: Optional[float] = None,
                 backends: Optional[list[str]] = None, repeats: int = 5, run: Optional[Run] = None) -> Iterator[dict]:
    """measure_trunk for each named grid's trunk (TRUNK_GRIDS; names without one are passed over) and cap."""
    run = run or Run(budget_s)
    for name in names:
        grid = trunk_grid_for(name, device)
        for cap_method in grid.cap_methods if grid else ():
            yield from measure_trunk(grid, cap_method, device, backends=backends, repeats=repeats, run=run)


# --- the results file -------------------------------------------------------------------------

def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48]


def load_results(results_dir: Path = RESULTS_DIR) -> list[tuple[str, dict]]:
    """(file name, data) for every attention results file there; other JSON files (training, app latency,
    load test) are skipped. The README tables and the app's "recorded" list both read through this. Read
    again only when a file changed (the timing tab asks on every opening); the data is shared: do not change it."""
    return _read_results(file_stamps(sorted(Path(results_dir).glob("*.json"))))


def file_stamps(paths) -> tuple:
    """(path, mtime, size) of each of `paths` still there, in order: what a reader of committed files is cached
    by, so a file committed or changed while the server runs is read again."""
    stamps = []
    for path in paths:
        try:
            stat = Path(path).stat()
        except OSError:
            continue
        stamps.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


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


def load_model_timings(results_dir: Path = RESULTS_DIR, tab_of: Optional[dict] = None) -> list[tuple[str, dict]]:
    """(file name, data) for every results file (load_results) with a "trunk" or "views" list: the file's
    device_name, date, commit, torch, cuda, matmul_tflops and trunk_matmul_tflops (None in files written before
    2026-11-27: trunk_peak), "source" (what was read), and "trunk" / "views"
    (both always there) whose records hold exactly TRUNK_KEYS / VIEW_KEYS (an absent key is None); a trunk
    record whose status is not one of TRUNK_STATUSES reads as "error" with that status as its reason. The first
    GPU run timed them apart (probe.py, gpu-run-<date>/probe.json beside a results file of the same device and
    date): read as the same schema (_probe_timings). A fresh copy: change it freely."""
    out = []
    for name, data in load_results(results_dir):
        source = name
        if not (data.get("trunk") or data.get("views")):
            probe = Path(results_dir) / f"gpu-run-{data.get('date')}" / "probe.json"
            data, source = _probe_timings(probe, data, tab_of), f"{name} + {probe.parent.name}/{probe.name}"
            if data is None:
                continue
        trunk = [{k: r.get(k) for k in TRUNK_KEYS} for r in data.get("trunk") or [] if isinstance(r, dict)]
        for r in trunk:
            if r["status"] not in TRUNK_STATUSES:
                r.update(status="error", reason=r["reason"] or f"status {r['status']!r}")
        views = [{k: r.get(k) for k in VIEW_KEYS} for r in data.get("views") or [] if isinstance(r, dict)]
        head = {k: data.get(k) for k in ("device_name", "date", "commit", "torch", "cuda", "matmul_tflops",
                                         "trunk_matmul_tflops")}
        out.append((name, dict(head, source=source, trunk=trunk, views=views)))
    return out


PROBE_TRUNK = re.compile(r"(?P<preset>\S+) B(?P<B>\d+) cap (?P<cap>\S+) (?P<backend>\S+)$")


def _probe_timings(path: Path, data: dict, tab_of: Optional[dict] = None) -> Optional[dict]:
    """The first GPU run's probe.json (benchmarks/results/gpu-run-2026-11-26/probe.py: its views and the grok
    trunk, B 32, bf16, prefix causal, padded, CUDA events, median of 7 after 2 warm-ups; rel_err against naive in
    bf16) as `data` with "trunk" and "views" in this module's schema: min / max and attention_ms were not
    measured (None); probe.py timed each view function: `tab_of` (function name -> tab, from explorer.views,
    which imports this module) sums them by tab, else each is its own row; None when there is no probe of this
    file's device."""
    try:
        probe = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if probe.get("device") != data.get("device_name"):
        return None
    trunk = []
    for key, r in probe.get("trunk", {}).items():
        m = PROBE_TRUNK.match(key)
        if not m or m["preset"] not in PRESETS:
            continue
        status = "ok" if "ms" in r else "skipped" if "skipped" in r else "error"
        trunk.append(trunk_record(m["preset"], m["backend"], B=int(m["B"]), T=PRESETS[m["preset"]].layout.seq_len,
                                  dtype="bfloat16", cap_method=m["cap"], mask=model_mask_kind("causal"), status=status,
                                  reason=r.get("skipped") or r.get("error") or "", repeats=7 if "ms" in r else 0,
                                  median_ms=r.get("ms"), rel_err=r.get("rel_err")))
    views: dict[tuple, dict] = {}
    for key, r in probe.get("views", {}).items():
        preset, _, fn = key.partition(" ")
        tab = tab_of.get(fn) if tab_of is not None else fn
        if tab is None:
            continue
        v = views.setdefault((preset, tab), dict(preset=preset, view=tab, cold_ms=0.0, warm_ms=0.0, repeats=3))
        if "cold_ms" in r and v["cold_ms"] is not None:
            v["cold_ms"] += r["cold_ms"]
            v["warm_ms"] += r["warm_ms"]
        else:                                           # a part failed: the tab has no time
            v.update(cold_ms=None, warm_ms=None, repeats=0)
    return dict(data, trunk=trunk, views=list(views.values()))


# How the first GPU run's probe (gpu-run-<date>/probe.py) timed the trunk, before results files had a "trunk" list
PROBE_METHOD = ("median of 7 calls after 2 warm-ups, one backend after another (not interleaved; no min / max "
                "kept), CUDA events")


@dataclass(frozen=True)
class TrunkTimings:
    """The whole trunk's forward per backend as one run recorded it: TRUNK_KEYS records, where they were read
    and how they were measured, in words."""
    records: tuple
    source: str
    method: str
    peak: Optional[float] = None        # the matmul TFLOP/s of the run that timed them: their shares' yardstick


def trunk_peak(data: dict) -> Optional[float]:
    """The matmul TFLOP/s of the call that timed a results file's trunk: its own where the file keeps it (a
    session's trunk step is a call of its own), else the file's one peak (files written before 2026-11-27)."""
    return data.get("trunk_matmul_tflops") or data.get("matmul_tflops")


def day_order(name: str) -> tuple:
    """Newest last, by name: <what>-<date>[-<n>][.json] by its date, then its number that day (the first has none,
    the second is -2; by name alone "-27-2.json" sorts before "-27.json"); ("", 0) without a date."""
    m = re.search(r"(\d{4}-\d{2}-\d{2})(?:-(\d+))?(?:\.json)?$", name)
    return (m.group(1), int(m.group(2) or 1)) if m else ("", 0)


def run_order(name: str, data: dict) -> tuple:
    """Newest last: by date, then by the run's number that day (<device>-<date>.json is the first run,
    <device>-<date>-2.json the second): day_order of its name, which carries its date."""
    return day_order(name)


def _trunk_timed(data: dict) -> bool:
    return any(isinstance(r, dict) and r.get("status") == Status.OK.value for r in data.get("trunk") or ())


def trunk_timings(name: str, data: dict, results_dir: Path = RESULTS_DIR) -> Optional[TrunkTimings]:
    """The trunk timings of results file `name` (`data`, as load_results reads it): its own "trunk" list where
    it timed the trunk; else the newest file of the same commit on the same device that did (a GPU session's
    calls can split the parts: one times the kernels with the trunk's budget spent, the next the trunk); else
    its own list as it is (nothing timed, each record's reason); else the probe.json of its GPU session's
    folder (gpu-run-<date>/, the same device); None when none of them."""
    if not _trunk_timed(data):
        same = sorted(((n, d) for n, d in load_results(results_dir) if _trunk_timed(d) and on_gpu(d)
                       and (d.get("commit"), d.get("device_name")) == (data.get("commit"), data.get("device_name"))),
                      key=lambda f: run_order(*f))
        if same:
            name, data = same[-1]
    if data.get("trunk"):
        records = tuple(with_status({**dict.fromkeys(TRUNK_KEYS), **r}) for r in data["trunk"] if isinstance(r, dict))
        repeats = sorted({r["repeats"] for r in records if r["repeats"]})
        return TrunkTimings(records, name, f"timed by the benchmark: median (min–max) of "
                                           f"{'/'.join(map(str, repeats)) or 'its'} repeats per backend, backends interleaved",
                            trunk_peak(data))
    probe = Path(results_dir) / f"gpu-run-{data.get('date')}" / "probe.json"
    found = _probe_timings(probe, data)
    if not found or not found["trunk"]:
        return None
    return TrunkTimings(tuple(with_status(r) for r in found["trunk"]), f"{probe.parent.name}/{probe.name}",
                        PROBE_METHOD, trunk_peak(data))     # the probe ran in the session that measured it


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
