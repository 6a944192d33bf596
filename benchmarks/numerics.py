"""How far each backend's bf16 / fp16 attention lies from grok.py's function in fp32 on the same inputs.

    python -m benchmarks.numerics [--presets lecture,phoenix-prod] [--seeds 5]
                                  [--recorded benchmarks/results/<gpu-file>.json]

grok.py's q.k einsum returns the input dtype, so in bf16 naive (and structured, built from the same einsum)
rounds every logit before the fp32 softmax; the fused kernels (sdpa, flex, fa4) keep logits in fp32. For each
preset's attention shape (its benchmark grid on this device, at the preset's own T), dtype, cap, input scale
(q and k times 1 or 2: logits of std 1 or 4) and seeds 0 .. N-1 (explorer.measure.make_inputs), every backend
that runs here is compared with reference_attention: relative error (max |out - ref| / max |ref|) and the
worst ratio to the rounding bound (tests/tolerances.py: attention_bound), min / median / max over the seeds.
`--recorded`: for the GPU file's unpadded bf16 fa4 points of phoenix-prod, naive's error against fp32 at the
same inputs (seed 0), computed here, beside the recorded |fa4 - naive| (that file measured errors against
naive). Writes benchmarks/results/numerics-<device>-<date>.json. An entry point: nothing imports it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

import torch

from explorer.measure import (attention_error_bound, compare, grid_for, make_inputs, reference_attention,
                              slug)
from models.attention import attend, unavailable_reason
from models.masks import AttentionMask
from models.runinfo import RESULTS_DIR, device_name, git_commit

DTYPES = ("bfloat16", "float16")
SCALES = (1.0, 2.0)           # q and k times this: logits of std 1 (the benchmark's inputs) or 4 (the tests')
CAPS = ("tanh", "none")


def spread(values: list[float]) -> dict:
    return dict(min=min(values), median=statistics.median(values), max=max(values))


def errors(q, k, v, mask, backends, *, cap, cap_method, device) -> dict:
    """{backend: (rel_err, ratio to the rounding bound)} for every backend that runs these inputs here."""
    kw = dict(multiplier=q.shape[-1] ** -0.5, cap=cap, cap_method=cap_method)
    ref = reference_attention(q, k, v, mask, piece_bytes=1 << 28, **kw)
    dtype = str(q.dtype).removeprefix("torch.")
    bound = attention_error_bound(dtype, q.shape[1], q.shape[-1], ref.logit_max, ref.dot_max)
    out = {}
    for b in backends:
        if unavailable_reason(b, device=device, dtype=dtype, cap=cap, cap_method=cap_method, mask_kind=mask.kind,
                              head_dim=q.shape[-1]):
            continue
        check = compare(attend(q, k, v, mask, backend=b, **kw).out, ref, bound, None)
        out[b] = (check["rel_err"], check["ratio"])
    return out


def measure(preset: str, device: str, seeds: int, backends: list[str]) -> list[dict]:
    g = grid_for(preset, device)
    T = g.seq_lens[0] if preset != "lecture" else 9                # the preset's own length
    rows = []
    for dtype in DTYPES:
        for cap_method in CAPS:
            for scale in SCALES:
                seen: dict = {}
                for seed in range(seeds):
                    q, k, v = make_inputs(g.B, g.Hq, g.Hkv, g.head_dim, T, dtype, device, seed=seed)
                    q, k = q * scale, k * scale
                    mask = AttentionMask(g.masks[0], T, T - g.num_candidates)
                    for b, e in errors(q, k, v, mask, backends, cap=g.cap, cap_method=cap_method, device=device).items():
                        seen.setdefault(b, []).append(e)
                for b, es in seen.items():
                    rows.append(dict(preset=preset, B=g.B, T=T, Hq=g.Hq, Hkv=g.Hkv, head_dim=g.head_dim, dtype=dtype,
                                     mask=g.masks[0], cap_method=cap_method, qk_scale=scale, backend=b,
                                     seeds=len(es), rel_err=spread([e[0] for e in es]),
                                     bound_ratio=spread([e[1] for e in es])))
                    print(f"{preset:>12} {dtype:>8} cap {cap_method:>4} x{scale:g} {b:>11}: rel err median "
                          f"{rows[-1]['rel_err']['median']:.2e} [{rows[-1]['rel_err']['min']:.2e}-"
                          f"{rows[-1]['rel_err']['max']:.2e}], bound ratio max {rows[-1]['bound_ratio']['max']:.3f}",
                          flush=True)
    return rows


def recorded_rows(path: Path, device: str) -> list[dict]:
    """The GPU file's unpadded bf16 fa4 points of phoenix-prod: their recorded |fa4 - naive|, and naive's
    |naive - fp32| at the same inputs (make_inputs, seed 0), computed here."""
    data = json.loads(path.read_text())
    rows = []
    for r in data["records"]:
        if (r["backend"], r["preset"], r["dtype"], r["padded"], r["status"]) != ("fa4", "phoenix-prod", "bfloat16",
                                                                                 False, "ok"):
            continue
        q, k, v = make_inputs(r["B"], r["Hq"], r["Hkv"], r["head_dim"], r["T"], r["dtype"], device, seed=0)
        mask = AttentionMask(r["mask"], r["T"], r["T"] - r["num_candidates"])
        kw = dict(multiplier=r["head_dim"] ** -0.5, cap=30.0, cap_method=r["cap_method"])
        ref = reference_attention(q, k, v, mask, piece_bytes=1 << 28, **kw)
        naive = compare(attend(q, k, v, mask, **kw).out, ref, 1.0, None)
        rows.append(dict(file=path.name, device_name=data["device_name"], commit=data["commit"], mask=r["mask"],
                         cap_method=r["cap_method"], B=r["B"], T=r["T"], fa4_vs_naive_max_abs_err=r["max_abs_err"],
                         naive_vs_fp32_max_abs_err=naive["max_abs_err"], naive_vs_fp32_rel_err=naive["rel_err"],
                         reference_max_abs=float(ref.out.abs().max())))
        print(f"recorded {r['mask']} cap {r['cap_method']}: |fa4 - naive| {r['max_abs_err']:.3g} on "
              f"{data['device_name']}; |naive - fp32| here {naive['max_abs_err']:.3g}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="lecture,phoenix-prod")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--backends", default="naive,structured,sdpa,sdpa-flash,flex")
    ap.add_argument("--recorded", type=Path, default=None, help="a GPU results file whose fa4 rows to set beside")
    ap.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--note", default="")
    a = ap.parse_args(argv)
    if a.seeds < 5:
        ap.error(f"--seeds: got {a.seeds}; allowed: 5 or more (min / median / max need several)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    commit = git_commit()                              # the code this process loaded, before anything runs
    rows = [r for p in a.presets.split(",") for r in measure(p, device, a.seeds, a.backends.split(","))]
    data = dict(device_name=device_name(device), torch=torch.__version__, commit=commit,
                date=dt.date.today().isoformat(), note=a.note, seeds=a.seeds,
                what="relative error max |out - ref| / max |ref| of each backend on bf16 / fp16 inputs against "
                     "reference_attention (grok.py's function in fp32 on the same inputs), min / median / max over "
                     "the seeds; bound_ratio: the worst |out - ref| / (attention_bound x P|v|), <= 1 within rounding",
                rows=rows, recorded=recorded_rows(a.recorded, device) if a.recorded else [])
    path = a.out_dir / f"numerics-{slug(data['device_name'])}-{data['date']}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
