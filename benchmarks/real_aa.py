"""A real A/A on the CPU engine: steps that change nothing the engine reads (an environment variable llama.cpp
never looks at), each decided exactly as `llmplay run` decides a step. With nothing to find, every verdict should
be inconclusive; at 95% confidence a kept or rejected objective is expected in about 1 step in 20 (2.5% each way)
and more often if the interval under-covers. Prints one row per A/A step and the tally.

    .venv/bin/python benchmarks/real_aa.py                 # 10 A/A steps, 3 pairs each (about 8 minutes on 2 cores)
    .venv/bin/python benchmarks/real_aa.py --steps 4 --repeats 3 --duration 3s

Each step is an independent A/A: it runs its own fresh-engine pairs (baseline and candidate interleaved A B B A,
same request sequence on both sides of a pair), so one run of N steps is N A/A decisions. Needs dockerd and the
CPU engine image (`llmplay engine build-cpu`).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

from llmplay.playbook.load import load_playbook
from llmplay.stats.decide import describe_delta
from llmplay.tuning.run import RunOptions, run_playbook
from llmplay_testing.cpu_runs import tiny_playbook


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="A/A steps (independent decisions)")
    parser.add_argument("--repeats", type=int, default=3, help="A/B pairs per step")
    parser.add_argument("--duration", default="4s")
    parser.add_argument("--warmup", default="1s")
    parser.add_argument("--objective-only", action="store_true", help="drop cpu-tiny's guards (the objective alone)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="llmplay-real-aa-") as tmp:
        root = Path(tmp)
        steps = [
            {"name": f"aa-{i}", "description": "an env var the engine never reads", "set": {"env.LLMPLAY_NOOP": str(i)}}
            for i in range(1, args.steps + 1)
        ]
        path = tiny_playbook(
            root, name="real-aa", duration=args.duration, warmup=args.warmup, repeats=args.repeats, steps=steps
        )
        # cpu-tiny's own guards (throughput, the error rate in points) decide too: a null step rejected through a
        # guard is the error this counts beside the objective's.
        if args.objective_only:
            doc = yaml.safe_load(path.read_text())
            doc["goals"]["guards"] = []
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
        started = time.perf_counter()
        outcome = run_playbook(load_playbook(path), RunOptions(archive_root=root / "reports"), report=lambda _: None)
        elapsed = time.perf_counter() - started

    print(f"real A/A on llama.cpp (cpu-tiny engine): {args.steps} steps x {args.repeats} pairs, {elapsed:.0f} s\n")
    print("| step | verdict | objective | change | interval | units | guards | method |")
    print("|---|---|---|---|---|---|---|---|")
    for verdict in outcome.verdicts:
        obj = verdict.objective
        if obj is None:
            print(f"| {verdict.step} | {verdict.verdict} | not measured | | | | | |")
            continue
        guards = "; ".join(describe_delta(g, points=g.points is not None) for g in verdict.guards)
        print(
            f"| {verdict.step} | {verdict.verdict} | {obj.metric} | {_pct(obj.rel_change)} "
            f"| [{_pct(obj.ci_low)}, {_pct(obj.ci_high)}] | {obj.units} | {guards} | {obj.method} |"
        )
    tally = Counter(v.verdict for v in outcome.verdicts)
    through_guard = sum(v.verdict == "rejected" and "beyond its" in v.reason for v in outcome.verdicts)
    print(
        f"\nverdicts: {dict(tally)}; rejected through a guard: {through_guard} of {len(outcome.verdicts)}; "
        f"run status {outcome.status}, exit {outcome.exit_code}"
    )


if __name__ == "__main__":
    main()
