"""Whether this tree draws the same bytes as another commit: every drawn view's outputs (each figure's JSON,
each text) over many configurations, both versions in a fresh process of their own.

    python scripts/same_figures.py --before REF [--quick] [--keep DIR]

A change meant to make the views faster (pooling on the device, cached axes, shared weights) must leave
what a visitor receives as it was: the configurations cover every preset a CPU draws (lecture, phoenix-nano,
phoenix-2026-nano), the zooms, value kinds and colour scales, one head and the grid, query rows, batch rows,
the masks, every bug and variant, the probes' options. Exit 1 and the cases that differ where any does;
`--keep DIR` writes both versions' outputs of those cases there to diff.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.reports import checkout  # noqa: E402

PRESETS = ("lecture", "phoenix-nano", "phoenix-2026-nano")
HEATMAP_VIEWS = ("attention", "anatomy", "mask", "variants")     # the views of _panel and pool


def configurations(quick: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """(link, the drawn views to call at it): every view at each preset's main settings, the heatmap views
    over the display options, each probe's and the zoo's options on their own view."""
    from explorer.views import VIEWS
    from models.bugzoo import bug_names
    from models.masks import MASK_KINDS
    from models.probes import PERTURBATIONS
    from models.variants import VARIANTS
    from explorer.settings import COLOR_SCALES, INVARIANCE_OPS, VALUE_KINDS, ZOOMS
    from models.grok import ROPE_MODES
    every = tuple(name for name, v in VIEWS.items() if v.parts)         # the timing tab's recorded runs too
    presets = PRESETS[:1] if quick else PRESETS
    out = []
    for p in presets:
        family = "xrex" if p.startswith("phoenix-2026") else "grok"
        base = f"preset={p}"
        for extra in ("", "&head=0", "&batch_size=2&row=1&layer=1&head=1", "&prefix=bidirectional",
                      "&weights=zeros", "&seed=3&query=0"):
            out.append((base + extra, every))
        shown = itertools.product(("-1", "0", "3"), ZOOMS, VALUE_KINDS, COLOR_SCALES)
        for head, zoom, values, color in shown:
            if quick and (head == "3" or color == "quantile"):
                continue
            out.append((f"{base}&head={head}&zoom={zoom}&values={values}&color={color}", HEATMAP_VIEWS))
        for query, zoom in itertools.product(("0", "2", "-1"), ("query row", "all")):
            out.append((f"{base}&head=0&query={query}&zoom={zoom}&prefix=bidirectional", HEATMAP_VIEWS))
        out += [(f"{base}&compare={kind}", ("mask",)) for kind in MASK_KINDS]
        out += [(f"{base}&bug={bug}&zoom={zoom}", ("variants",))
                for bug in bug_names(family) for zoom in ("all", "candidates")]
        out += [(f"{base}&perturbation={how}&candidate=1", ("isolation",)) for how in PERTURBATIONS]
        out += [(f"{base}&operation={op}", ("invariance",)) for op in INVARIANCE_OPS]
        if family == "grok" and not quick:          # production's trunk has its one RoPE mode
            out += [(f"{base}&rope_mode={mode}", ("invariance",)) for mode in ROPE_MODES if mode != "sequential"]
    out += [(f"preset=lecture&variant={v}&head=0", ("variants",)) for v in VARIANTS]
    return out


# run in the version's own folder: each case's outputs, hashed (and kept where asked)
ONE_VERSION = """
import hashlib, json, sys
import torch
torch.set_num_threads(1)                              # as the server (server.memory.configure_threads)
from explorer import views
from explorer.query_string import parse_query
cases, keep = json.loads(sys.argv[1]), sys.argv[2]
out = {}
for link, names in cases:
    for name in names:
        try:
            s = parse_query(link)
            texts = [o.to_json() if hasattr(o, "to_json") else str(o)
                     for part in views.VIEWS[name].parts for o in part.draw(s)]
        except Exception as e:                        # a refusal is an output too: its message must match
            texts = [f"refused: {type(e).__name__}: {e}"]
        key = f"{name} @ {link}"
        out[key] = [t if t.startswith("refused: ") else hashlib.sha256(t.encode()).hexdigest() for t in texts]
        if keep:
            with open(f"{keep}/{hashlib.sha256(key.encode()).hexdigest()[:16]}.json", "w") as f:
                json.dump(dict(case=key, outputs=texts), f)
print(json.dumps(out))
"""


def run_version(root: Path, cases: list, keep: str = "") -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", ONE_VERSION, json.dumps(cases), keep], cwd=root, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{root}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the commit whose bytes this tree must draw (e.g. main)")
    ap.add_argument("--quick", action="store_true", help="lecture only, fewer display options")
    ap.add_argument("--keep", default=None, help="a folder for both versions' outputs of the cases that differ")
    a = ap.parse_args(argv)
    cases = configurations(a.quick)
    with checkout(a.before) as before_root:
        before = run_version(before_root, cases)
    after = run_version(ROOT, cases)
    differ = [k for k in after if before.get(k) != after[k]]
    calls = len(after)
    refused = sum(v[0].startswith("refused: ") for v in after.values())
    print(f"{calls} view calls over {len(cases)} configurations ({refused} of them refused, as a visitor would "
          f"be): {calls - len(differ)} drew the same bytes as {a.before}, {len(differ)} did not")
    for k in differ:
        print("  differs:", k)
    if differ and a.keep:
        wanted = [(link, (name,)) for name, link in (k.split(" @ ", 1) for k in differ)]
        for version in ("before", "after"):
            folder = Path(a.keep) / version
            folder.mkdir(parents=True, exist_ok=True)
            with (checkout(a.before) if version == "before" else contextlib.nullcontext(ROOT)) as root:
                run_version(Path(root), wanted, str(folder.resolve()))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
