"""App latency through gradio_client on localhost (a benchmark script, not a timed test).

    python -m benchmarks.app_latency [--changes 60]

Measures: cold start (process start -> the default view's figure received), the round trip of a
control change on the `lecture` preset (what the page sends: /control_change validates every control
and redraws the visible tab in one round trip; p50 / p95 over many changes), and phoenix-nano (T = 1087) heatmaps and isolation probe,
first call and repeated. Writes benchmarks/results/app-latency-<date>.json with device, date, commit.
Targets: cold start < 10 s, p95 control change < 150 ms, phoenix-nano < 3 s.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.localhost import running_app  # noqa: E402
from harness.reports import percentile  # noqa: E402
from models.runinfo import RESULTS_DIR, device_name, git_commit  # noqa: E402

TARGETS = dict(cold_start_s=10.0, control_change_p95_ms=150.0, nano_s=3.0)


def control_changes(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(view endpoint, query) pairs a visitor produces by moving one control at a time."""
    rng = random.Random(seed)
    moves = [
        ("/attention", lambda: f"head={rng.choice([-1, 0, 1, 2, 3])}"),
        ("/attention", lambda: f"values={rng.choice(['probabilities', 'capped+logits', 'masked+logits'])}"),
        ("/attention", lambda: f"color={rng.choice(['linear', 'log'])}"),
        ("/attention", lambda: f"query={rng.randrange(-1, 9)}"),
        ("/attention", lambda: f"layer={rng.randrange(2)}"),
        ("/mask", lambda: f"compare={rng.choice(['causal', 'full', 'recsys-bidirectional'])}"),
        ("/mask", lambda: f"num_candidates={rng.randrange(1, 6)}"),
        ("/attention", lambda: f"multiplier={rng.choice([0.25, 0.5, 1.0])}"),
        ("/isolation", lambda: f"candidate={rng.randrange(3)}"),
        ("/attention", lambda: f"rope_mode={rng.choice(['sequential', 'shared', 'none'])}"),
    ]
    out = []
    for _ in range(n):
        api, change = rng.choice(moves)
        out.append((api, "preset=lecture&" + change()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=60)
    ap.add_argument("--out", default=str(RESULTS_DIR))
    ap.add_argument("--settle-s", type=float, default=15.0, help="wait after cold start (background warm-up)")
    args = ap.parse_args(argv)
    from gradio_client import Client
    from explorer.query_string import parse_query
    from explorer.settings import all_values

    t0 = time.perf_counter()
    with running_app() as url:        # returns once the server answers HTTP
        server_up = time.perf_counter() - t0
        client = Client(url, verbose=False)
        default = client.predict(api_name="/load")
        client.predict(default, api_name="/mask")
        cold = time.perf_counter() - t0

        # app.py warms phoenix-nano in a background thread a few seconds after start; measure the
        # steady state a visitor sees after that, not two threads fighting over two cores
        time.sleep(args.settle_s)
        rounds = []
        client.predict(*all_values(parse_query("preset=lecture")).values(), "attention",
                       api_name="/control_change")       # the page opens on lecture: warm its model
        for api, query in control_changes(args.changes):
            s = parse_query(query)
            t = time.perf_counter()
            client.predict(*all_values(s).values(), api.strip("/"), api_name="/control_change")
            rounds.append((time.perf_counter() - t) * 1e3)

        nano = {}
        for label, api, query in (("attention_grid", "/attention", "preset=phoenix-nano"),
                                  ("attention_head", "/attention", "preset=phoenix-nano&head=1&layer=3"),
                                  ("mask", "/mask", "preset=phoenix-nano"),
                                  ("isolation", "/isolation", "preset=phoenix-nano&candidate=5")):
            times = []
            for _ in range(2):            # first call builds the model / runs the probe; second is cached
                t = time.perf_counter()
                client.predict(query, api_name=api)
                times.append(time.perf_counter() - t)
            nano[label] = dict(first_s=times[0], repeat_s=times[1])

    result = dict(
        device=device_name("cpu"), date=dt.date.today().isoformat(), commit=git_commit(),
        cores=os.cpu_count(), targets=TARGETS,
        cold_start=dict(server_up_s=server_up, first_view_s=cold),
        control_change_ms=dict(n=len(rounds), p50=statistics.median(rounds), p95=percentile(rounds, 95),
                               max=max(rounds)),
        phoenix_nano=nano,
        settle_s=args.settle_s,
        note="control change = one /control_change round trip through gradio_client (validation, query "
             "string, the visible tab's figures); other processes shared the machine's 2 cores",
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"app-latency-{result['date']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
