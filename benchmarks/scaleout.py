"""Scale-out on a Ray cluster: the wall time of one fixed playbook on 1, 2 and 4 worker nodes of a local cluster,
against the ideal, and what the driver's scheduling costs per trial.

The trials are simulated (each holds its node for a fixed time and returns fixed requests, llmplay_testing's
FixedTrials), so the figures measure llmplay's scheduling (Ray tasks, pinning pairs, archiving on the driver,
deciding) and not the 2-core machine's contention between engines. Everything else is the real run: TuningRun,
the archive, the decisions, a real multi-node Ray cluster.

    .venv/bin/python benchmarks/scaleout.py                 # about 2 minutes
    .venv/bin/python benchmarks/scaleout.py --trial-s 3 --repeats 4 --steps 2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmplay.playbook.load import load_playbook  # noqa: E402
from llmplay.tuning.run import RunOptions, TuningRun  # noqa: E402
from llmplay_testing.ray_cluster import FixedTrials, local_cluster  # noqa: E402

TARGET = 0.90  # of the ideal speed-up at 4 nodes


def playbook_file(tmp: Path, repeats: int, steps: int) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["trials"] = {"repeats": repeats, "max_repeats": repeats}
    doc["steps"] = [{"name": f"noop-{i}", "set": {f"env.LLMPLAY_NOOP_{i}": "1"}} for i in range(steps)]
    doc["runtime"] = {"kind": "ray", "address": "auto"}
    path = tmp / "scaleout.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def warm_up(nodes: int) -> None:
    """One task per node first: each node's worker process starts and imports llmplay once, before the clock."""
    import ray  # deferred: Ray is an optional install

    @ray.remote(num_cpus=1)
    def ready() -> str:
        import llmplay.tuning.run  # noqa: F401  # deferred: the import a trial's worker pays once

        time.sleep(0.5)
        return str(ray.get_runtime_context().get_node_id())

    seen: set[str] = set()
    while len(seen) < nodes:
        seen.update(ray.get([ready.remote() for _ in range(nodes)]))


@dataclass(frozen=True)
class Timing:
    run_s: float  # execute(), start to finish: joining, archive, steps, the diagnosis at the end
    steps_s: float  # first step's header line to last verdict line: the trials and their decisions
    trials: int


def measure(nodes: int, path: Path, trial_s: float, archive: Path) -> Timing:
    """How long the run took on `nodes` worker nodes, and how many trials it ran."""
    pb = load_playbook(path)
    marks: list[float] = []

    def report(line: str) -> None:
        if line.startswith("step ") or line.lstrip().startswith("-> "):
            marks.append(time.perf_counter())

    with local_cluster(workers=nodes, cpus=1, gpus=1):
        warm_up(nodes)
        t0 = time.perf_counter()
        outcome = TuningRun(
            pb, RunOptions(archive_root=archive), report=report, measure_trial=FixedTrials(pb, trial_s)
        ).execute()
        wall = time.perf_counter() - t0
    if outcome.status != "complete":
        raise SystemExit(f"the run on {nodes} node(s) ended {outcome.status}")
    trials = sum(len(v.trials_baseline) + len(v.trials_candidate) for v in outcome.verdicts)
    return Timing(wall, marks[-1] - marks[0], trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial-s", type=float, default=3.0, help="how long each simulated trial holds its node")
    parser.add_argument("--repeats", type=int, default=4, help="A/B pairs per step (4: one per node at 4 nodes)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--nodes", default="1,2,4")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    with tempfile.TemporaryDirectory(prefix="llmplay-scaleout-") as tmp:
        path = playbook_file(Path(tmp), args.repeats, args.steps)
        results = {n: measure(n, path, args.trial_s, Path(tmp) / f"r{n}") for n in counts}
    base = results[counts[0]]
    base_nodes = counts[0]
    import ray  # deferred: for its version in the caption only

    print(
        f"{base.trials} trials of {args.trial_s:g} s ({args.steps} steps x {args.repeats} pairs; steps one after the other, "
        f"the pairs of a step at once); Ray {ray.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| worker nodes | run wall s | steps wall s | ideal s | speed-up (run) | speed-up (steps) | ideal speed-up "
        "| of ideal (run) | of ideal (steps) | scheduling overhead per trial ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    verdict = None
    for n in counts:
        t = results[n]
        # Steps are sequential; within a step the pairs spread over the nodes, a pair's two trials one after other.
        ideal = args.steps * -(-args.repeats // n) * 2 * args.trial_s
        ideal_speedup = (args.steps * -(-args.repeats // base_nodes) * 2 * args.trial_s) / ideal
        run_speedup, steps_speedup = base.run_s / t.run_s, base.steps_s / t.steps_s
        # The steps' time beyond the ideal, over the trials each node ran one after another.
        per_trial_ms = (t.steps_s - ideal) / (t.trials / min(n, args.repeats)) * 1000
        print(
            f"| {n} | {t.run_s:.2f} | {t.steps_s:.2f} | {ideal:.2f} | {run_speedup:.2f}x | {steps_speedup:.2f}x | "
            f"{ideal_speedup:.2f}x | {run_speedup / ideal_speedup:.1%} | {steps_speedup / ideal_speedup:.1%} | "
            f"{per_trial_ms:.0f} |"
        )
        if n == 4:
            verdict = run_speedup / ideal_speedup
    if verdict is not None:
        met = "met" if verdict >= TARGET else "NOT met"
        print(f"\ntarget: >= {TARGET:.0%} of the ideal speed-up at 4 nodes (whole run): {met} ({verdict:.1%})")


if __name__ == "__main__":
    main()
