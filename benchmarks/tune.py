"""How well `llmplay tune` chooses: simulated engines with known response surfaces, tuned by the real loop
(`tune.loop.TuneLoop` over `run_playbook`: the real statistics, guards, diagnosis, ranking and archive; only
the engine is simulated, through the run's `measure_trial` seam, `llmplay_testing.simulated`).

Scenarios (each a playbook whose baseline has one problem, and a surface saying what every knob setting truly does):
- queueing: llama.cpp, one slot for four users; more slots cure it (4 is best, 2 halfway)
- kv_pressure: vLLM preempting at 64 sequences with 90% of memory for the KV cache; 95% cures it (92% is not enough;
  a concurrency cap stops the preemptions but queues the users)
- shared_prefix: vLLM with prefix caching off on a workload repeating half its prompt tokens; turning it on cures it
- guard_breaker: llama.cpp, one slot for four users; 2 slots help within the throughput guard, 4 or more help TTFT
  more but cost 40% of the throughput (the guard allows 25%): the best reachable is 2
- no_effect: llama.cpp, one slot for four users, but the slot count changes nothing (the diagnosis still calls for
  it): the best reachable is the baseline, any kept step is a false keep

Reported per scenario, over --reps tunes with different seeds:
- best: share of tunes ending at the best reachable configuration (its true P95 TTFT within the objective's min_effect
  of the best one's, every guard truly held)
- engine: mean engine time of the tune (the probe of one request alone included), in trials
- /grid: that over a one-factor-at-a-time grid over the same knobs (every value of every knob the engine's map offers
  to the tuner, each an A/B step of `repeats` pairs against the baseline, no sequential extension)
- TPE best: share of Optuna TPE studies (a benchmark extra) ending at the best reachable configuration at the same
  budget in trials (each trial one measured configuration over the same knob space, a broken guard scored as a loss)
- false keep: kept steps that are truly no better (true P95 TTFT not lower, or a guard truly broken), over all kept

    PYTHONPATH=.:/path/to/optuna .venv/bin/python benchmarks/tune.py --reps 10
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llmplay.engines import get_engine
from llmplay.engines.knobs import Risk
from llmplay.playbook.load import load_playbook
from llmplay.spec import Scalar
from llmplay.tune.loop import TuneLoop
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
from llmplay_testing.simulated import Response, SimulatedEngine, slots_of
from llmplay_testing.tune_sessions import one_slot_chat

MIN_EFFECT = 0.10
GUARD = 0.25
REPEATS = 3


# llama.cpp-like, one slot for four users (the tests' surface: llmplay_testing.tune_sessions)
queueing = one_slot_chat


def guard_breaker(args: Mapping[str, Scalar], users: int) -> Response:
    base = queueing(args, users)
    slots = slots_of(args)
    cost = 1.0 if slots == 1 else 0.9 if slots == 2 else 0.6
    return Response(**{**base.__dict__, "output_tok_s": 100.0 * cost})


def no_effect(args: Mapping[str, Scalar], users: int) -> Response:
    slots = slots_of(args)
    return Response(
        ttft_s=0.3 if users > 1 else 0.1,
        output_tok_s=100.0,
        waiting_frac=0.9 if slots < users else 0.0,
        waiting_mean=float(max(users - slots, 0)),
        reuse_expected=0.4,
        reuse_achieved=0.39,
    )


def kv_pressure(args: Mapping[str, Scalar], users: int) -> Response:
    seqs = int(args.get("max_num_seqs") or 256)  # type: ignore[arg-type]
    memory = float(args.get("gpu_memory_utilization") or 0.9)  # type: ignore[arg-type]
    capacity = 48 + (memory - 0.9) * 400  # sequences whose KV fits: 48 at 90%, 56 at 92%, 68 at 95%
    active = min(seqs, users)
    preempting = active > capacity
    queue = max(0.0, users / seqs - 1)
    return Response(
        ttft_s=0.2 * (2.0 if preempting else 1.0) * (1 + 0.5 * queue),
        output_tok_s=500.0 * (0.7 if preempting else active / users),
        preemptions=50.0 if preempting else 0.0,
        kv_usage_max=1.0 if preempting else active / capacity,
        waiting_frac=0.9 if seqs < users else 0.0,
        waiting_mean=float(max(users - seqs, 0)),
    )


def shared_prefix(args: Mapping[str, Scalar], users: int) -> Response:
    on = args.get("prefix_caching") is not False
    return Response(
        ttft_s=(0.18 if on else 0.3) * (1 if users > 1 else 0.5),
        output_tok_s=200.0 * (1.05 if on else 1.0),
        reuse_expected=0.5,
        reuse_achieved=0.45 if on else 0.0,
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    args: Mapping[str, Scalar]
    users: int
    surface: Callable[[Mapping[str, Scalar], int], Response]
    extra: Mapping[str, Any] = field(default_factory=dict)


SCENARIOS = (
    Scenario("queueing", "llamacpp", {"parallel": 1, "ctx_size": 4096, "threads": 1}, 4, queueing),
    Scenario("kv_pressure", "vllm", {"max_num_seqs": 256, "gpu_memory_utilization": 0.9}, 64, kv_pressure),
    Scenario("shared_prefix", "vllm", {"prefix_caching": False}, 8, shared_prefix),
    Scenario("guard_breaker", "llamacpp", {"parallel": 1, "ctx_size": 4096, "threads": 1}, 4, guard_breaker),
    Scenario("no_effect", "llamacpp", {"parallel": 1, "ctx_size": 4096, "threads": 1}, 4, no_effect),
)


def playbook_doc(s: Scenario, seed: int) -> dict[str, Any]:
    return {
        "apiVersion": "llmplay/v1",
        "kind": "Playbook",
        "metadata": {"name": f"bench-tune-{s.name}"},
        "goals": {
            "objective": {"minimize": "ttft.p95", "min_effect": MIN_EFFECT},
            "guards": [{"metric": "throughput.output_tok_s", "tolerance": GUARD}],
        },
        "workload": {"concurrency": s.users, "duration": "8s", "seed": seed, "output": {"fixed": 32}},
        "trials": {"repeats": REPEATS, "max_repeats": 5, "sequential": True},
        "runtime": "process",
        "engine": {"kind": s.kind, "model": "/models/m", "args": dict(s.args)},
        "tune": {"budget": {"steps": 4}},
    }


def grid(s: Scenario) -> list[tuple[str, Scalar]]:
    """Every (knob, value) the engine's map offers the tuner (no hardware, no quality risk): the OFAT grid."""
    seen: dict[tuple[str, Scalar], None] = {}
    for spec in get_engine(s.kind).knob_map:
        if spec.risk in (Risk.HARDWARE, Risk.QUALITY) or spec.knob == "model":
            continue
        for value in spec.values:
            if s.args.get(spec.knob) != value:
                seen[(spec.knob, value)] = None
    return list(seen)


def true_ttft(s: Scenario, args: Mapping[str, Scalar]) -> float:
    return s.surface(args, s.users).ttft_s


def holds_guard(s: Scenario, args: Mapping[str, Scalar]) -> bool:
    return s.surface(args, s.users).output_tok_s >= (1 - GUARD) * s.surface(s.args, s.users).output_tok_s


def best_reachable(s: Scenario) -> float:
    """The lowest true TTFT over the baseline and every single-knob change of the grid that holds the guard, and
    over pairs of them (the tuner may keep two steps)."""
    configs = [dict(s.args)] + [{**s.args, k: v} for k, v in grid(s)]
    configs += [{**a, **b} for a in configs[1:] for b in configs[1:]]
    return min(true_ttft(s, c) for c in configs if holds_guard(s, c))


def at_best(s: Scenario, args: Mapping[str, Scalar]) -> bool:
    return holds_guard(s, args) and true_ttft(s, args) <= best_reachable(s) * (1 + MIN_EFFECT)


@dataclass
class Tally:
    best: int = 0
    tpe_best: int = 0
    trials: int = 0
    kept: int = 0
    false_kept: int = 0
    tunes: int = 0
    stops: dict[str, int] = field(default_factory=dict)


def tune_once(s: Scenario, seed: int, root: Path, tally: Tally, noise: float = 0.03) -> int:
    path = root / f"{s.name}-{seed}.yaml"
    path.write_text(yaml.safe_dump(playbook_doc(s, seed), sort_keys=False))
    playbook = load_playbook(path)
    engine = SimulatedEngine(s.surface, seed=seed, trial_s=1.0, noise=noise)

    def run(pb: Any, options: RunOptions) -> RunOutcome:
        return run_playbook(pb, options, report=lambda _l: None, measure_trial=engine)

    outcome = TuneLoop(playbook, root / f"tune-{s.name}-{seed}", run, lambda _l: None).execute()
    rounds = outcome.trail.rounds
    final = dict(rounds[-1].kept_args) if rounds else dict(s.args)
    tally.tunes += 1
    tally.trials += engine.trials
    tally.best += at_best(s, final)
    stop = outcome.trail.stop.split(":")[0]
    tally.stops[stop] = tally.stops.get(stop, 0) + 1
    for r in rounds:
        if r.verdict == "kept":
            tally.kept += 1
            better = true_ttft(s, r.kept_args) < true_ttft(s, r.incumbent)
            tally.false_kept += not (better and holds_guard(s, r.kept_args))
    return engine.trials


def tpe_once(s: Scenario, seed: int, budget_trials: int, noise: float = 0.03) -> bool:
    """Optuna TPE over the same knobs (each knob unset or one of its values), `budget_trials` measured trials."""
    import optuna  # a benchmark extra

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space: dict[str, list[Scalar]] = {}
    for knob, value in grid(s):
        space.setdefault(knob, [s.args.get(knob)]).append(value)
    engine = SimulatedEngine(s.surface, seed=seed + 10_000, trial_s=1.0, noise=noise)
    from llmplay.spec import Config, EngineSpec, Workload, frozen_map

    def measure(args: Mapping[str, Scalar]) -> tuple[float, float]:
        config = Config("t", EngineSpec(s.kind, "m", args=frozen_map(args)), Workload(concurrency=s.users))
        result = engine(config, trial_id="t", step=None, role="baseline", repeat=engine.trials)
        return result.trial.summary["ttft.p95"], result.trial.summary["throughput.output_tok_s"]

    _, base_tok_s = measure(s.args)

    def objective(trial: optuna.Trial) -> float:
        args = dict(s.args)
        for knob, values in space.items():
            index = trial.suggest_categorical(knob, list(range(len(values))))
            if values[index] is not None:
                args[knob] = values[index]
        ttft, tok_s = measure(args)
        return ttft if tok_s >= (1 - GUARD) * base_tok_s else math.inf

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    study.optimize(objective, n_trials=max(budget_trials - 1, 1))
    args = dict(s.args)
    for knob, index in study.best_params.items():
        if space[knob][index] is not None:
            args[knob] = space[knob][index]
    return at_best(s, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--noise", type=float, default=0.03, help="per-round log drift sd (per trial: half of it)")
    ns = parser.parse_args()
    rows = []
    total = Tally()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for s in SCENARIOS:
            if ns.only and s.name not in ns.only:
                continue
            tally = Tally()
            for seed in range(ns.reps):
                used = tune_once(s, seed, Path(tmp), tally, ns.noise)
                tally.tpe_best += tpe_once(s, seed, used, ns.noise)
            grid_trials = len(grid(s)) * 2 * REPEATS
            rows.append((s.name, tally, grid_trials))
            for name in ("best", "tpe_best", "trials", "kept", "false_kept", "tunes"):
                setattr(total, name, getattr(total, name) + getattr(tally, name))
            print(f"{s.name}: done ({time.perf_counter() - started:.0f} s)", flush=True)
    print()
    print(
        "| scenario | tunes | best | TPE best (same budget) | engine (trials) | OFAT grid (trials) | /grid | kept | false keep | stops |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, t, g in rows:
        mean = t.trials / t.tunes
        stops = ", ".join(f"{k} {v}" for k, v in sorted(t.stops.items()))
        print(
            f"| {name} | {t.tunes} | {t.best / t.tunes:.0%} | {t.tpe_best / t.tunes:.0%} | {mean:.1f} | {g} | "
            f"{mean / g:.0%} | {t.kept} | {t.false_kept} | {stops} |"
        )
    grid_mean = sum(g * t.tunes for _, t, g in rows) / max(total.tunes, 1)
    print(
        f"| all | {total.tunes} | {total.best / total.tunes:.0%} | {total.tpe_best / total.tunes:.0%} | "
        f"{total.trials / total.tunes:.1f} | {grid_mean:.0f} | {total.trials / total.tunes / grid_mean:.0%} | "
        f"{total.kept} | {total.false_kept / max(total.kept, 1):.0%} | |"
    )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
