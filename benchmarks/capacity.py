"""The capacity search against a known truth: the instrument server's virtual M/M/c queue, whose capacity under a
TTFT SLO is the Erlang C boundary (llmplay_testing.queueing), searched by llmplay's search and priced against a
plain grid of the same precision.

    .venv/bin/python benchmarks/capacity.py                    # the RESULTS.md table (about 5 minutes per seed)
    .venv/bin/python benchmarks/capacity.py --seeds 1 --probe 6 --json out.json

For each seed: the boundary the search found, its interval, its error against the truth, the probe runs and the
engine-seconds of load they took. The grid sweeps every load from the lower to the upper bound in steps of the
precision (low x (1 + precision)^k), one probe each: its engine time is fixed by construction (points x (warm-up +
probe)), so it is counted, not run; the figure beside it is the cheapest grid that stops at its first failure,
which still has to walk every step from the lower bound up to the boundary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from llmplay.loadgen.tokenizer import make_tokenizer
from llmplay.spec import CapacitySpec, LengthDist, Workload
from llmplay.tuning.trial import capacity_search
from llmplay_testing.instrument import InstrumentServer
from llmplay_testing.queueing import mmc_capacity

SERVERS, SERVICE_S, TTFT_S, WAIT_S = 4, 0.100, 0.010, 0.200


def grid_points(low: float, high: float, precision: float) -> list[float]:
    points, x = [], low
    while x < high * (1 + 1e-9):
        points.append(x)
        x *= 1 + precision
    return points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--precision", type=float, default=0.10)
    parser.add_argument("--probe", type=float, default=8.0, help="seconds of measured load per probe")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up at each probe's load")
    parser.add_argument("--cap", type=float, default=600.0, help="engine-seconds cap of one search")
    parser.add_argument("--low", type=float, default=2.0)
    parser.add_argument("--high", type=float, default=128.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    truth = mmc_capacity(SERVERS, SERVICE_S, WAIT_S, args.target)
    spec = CapacitySpec(
        "rate",
        args.low,
        args.high,
        attainment=args.target,
        precision=args.precision,
        probe_s=args.probe,
        settle_s=0.5,
        max_engine_s=args.cap,
        replicates=3,
    )
    workload = Workload(
        input=LengthDist("fixed", value=8),
        output=LengthDist("fixed", value=4),
        rate=1.0,
        duration_s=1.0,
        warmup_s=args.warmup,
    )
    grid = grid_points(args.low, args.high, args.precision)
    per_point_s = args.probe + args.warmup
    grid_early = [x for x in grid if x <= truth * (1 + args.precision)]
    rows = []
    with InstrumentServer(process=True) as server:
        for seed in range(args.seeds):
            url = server.url_for(
                ttft_ms=TTFT_S * 1000, itl_ms=2, tokens=4, servers=SERVERS, service_ms=SERVICE_S * 1000, qseed=seed
            )
            t0 = time.perf_counter()
            _, result = capacity_search(
                url,
                "instrument",
                replace(workload, seed=seed),
                spec,
                {"ttft": TTFT_S + WAIT_S},
                make_tokenizer("word"),
            )
            found = result.capacity if result.capacity is not None else result.estimate
            row = {
                "seed": seed,
                "status": result.status,
                "capacity": result.capacity,
                "estimate": result.estimate,
                "ci": list(result.ci),
                "bracket": [result.feasible_max, result.infeasible_min],
                "error": None if found is None else found / truth - 1,
                "truth_in_ci": result.ci[0] is not None and result.ci[0] <= truth <= result.ci[1],
                "runs": result.runs,
                "engine_s": result.engine_s,
                "wall_s": time.perf_counter() - t0,
                "order": list(result.run_loads),
                "binding": result.binding_sentence(),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {
        "truth_req_s": truth,
        "scenario": f"M/M/{SERVERS}, mean service {SERVICE_S * 1000:g} ms, TTFT = wait + {TTFT_S * 1000:g} ms, "
        f"SLO TTFT <= {(TTFT_S + WAIT_S) * 1000:g} ms for {args.target:.0%} of requests, Poisson arrivals",
        "spec": {k: getattr(spec, k) for k in ("low", "high", "attainment", "precision", "probe_s", "max_engine_s")},
        "warmup_s": args.warmup,
        "grid_points": len(grid),
        "grid_engine_s": len(grid) * per_point_s,
        "grid_early_stop_points": len(grid_early) + 1,
        "grid_early_stop_engine_s": (len(grid_early) + 1) * per_point_s,
        "searches": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "searches"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    met_accuracy = bool(errors) and max(errors) <= 0.05 and all(r["status"] == "found" for r in rows)
    met_cost = max(r["engine_s"] for r in rows) <= summary["grid_engine_s"] / 2
    print(
        f"within 5% of the truth: {'met' if met_accuracy else 'NOT met'}; "
        f"at most half the grid's engine time: {'met' if met_cost else 'NOT met'}"
    )
    return 0 if math.isfinite(truth) else 1


if __name__ == "__main__":
    sys.exit(main())
