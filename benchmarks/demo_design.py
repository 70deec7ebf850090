"""The demo's trial design (playbooks/cpu-tiny.yaml): simulated fresh runs decided by `decide_step`, as the runner does.

The demo must give the same verdicts in 5 of 5 fresh runs (parallel-4 kept, kv-cache-q8 rejected) and answer in about
4 minutes. Which trial length and how many sequential pairs do that is a question of this machine's noise, so the
noise comes from the real archives, not from a guess:

- per run (quiet runs only: no trial archived another llmplay run beside it, `TrialRecord.shared_with`), the spread of
  the per-pair log ratios (candidate / baseline) of P95 TTFT and output tokens/s, pooled over the run's steps (each
  step's own mean taken out): what one run's machine gave, and how much that differs between runs;
- each step's effect (the mean log ratio over every quiet pair; kv-cache-q8's on the configuration it met: parallel-4
  when that was kept, one slot otherwise);
- how the noise shrinks with the trial's length: each trial's first and second half (its requests sent in each half
  of its window, summarized by `llmplay.metrics.summarize`) against the whole. With sd^2(T) = u + c / T, the halves
  give c / T = sd^2(T/2) - sd^2(T) and u = 2 sd^2(T) - sd^2(T/2): the part u that a longer trial cannot shrink (the
  engine's start, the machine's state that minute). `--sqrt` rows use the sqrt rule (u = 0) instead: the optimistic
  bound;
- each trial's engine time (start to next start: engine start and stop, warm-up, window, drain, archiving) per run.

Each simulated fresh run draws one archived quiet run: its noise for both steps (a noisy machine is noisy for the whole
demo) and its time per trial. Both steps are decided by `benchmarks.verdicts.run_step` (`decide_step` with the
runner's loop: `repeats` pairs, then one more per inconclusive look up to `max_repeats`, inside the sequential
boundary) with the shipped playbook's goals and trials, only `max_repeats` and the trial's length changed. kv-cache-q8
is measured against parallel-4 when it was kept, against one slot otherwise, as the run carries a kept step on.

    PYTHONPATH=. .venv/bin/python benchmarks/demo_design.py              # the table: 2,000 fresh runs a design, ~20 min
    PYTHONPATH=. .venv/bin/python benchmarks/demo_design.py --archives /tmp/demo12/cpu-tiny /tmp/fresh-*/reports/cpu-tiny
        # estimate the noise from these archives first (prints the per-run table), then simulate with it
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import yaml

from benchmarks.verdicts import Row, run_step
from llmplay.archive.layout import RESOLVED_FILE
from llmplay.archive.model import KEPT, REJECTED, TRIAL_OK, TrialRecord
from llmplay.archive.reader import ArchivedRun
from llmplay.metrics import measured_requests, summarize
from llmplay.playbook.load import load_playbook
from llmplay.spec import Goals, Trials
from llmplay.units import parse_duration_s

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "playbooks" / "cpu-tiny.yaml"
TTFT, TOK_S = "ttft.p95", "throughput.output_tok_s"
PARALLEL, KV = "parallel-4", "kv-cache-q8"
# The README's first command on a fresh clone (run 4 of its table): 3m54s in all, of which the run's own archive
# (run id to finished) took 177 s; set-up, preflight and the first engine check are the other 57 s.
COMMAND_OVERHEAD_S = 57.0


@dataclass(frozen=True)
class RunNoise:
    """One quiet archived run: the SD of its per-pair log ratios per metric (pooled over its steps), the degrees of
    freedom behind them, and its engine time per trial (start to next start)."""

    run_id: str
    trial_s: float  # the run's window length
    sd_ttft: float
    sd_tok: float
    df: int
    per_trial_s: float


@dataclass(frozen=True)
class Effect:
    """A step's true relative change of P95 TTFT and of output tokens/s (the mean of its quiet pairs' log ratios)."""

    ttft: float
    tok_s: float
    pairs: int


@dataclass(frozen=True)
class Machine:
    runs: tuple[RunNoise, ...]  # the quiet runs at the shipped trial length: the simulation's mixture
    parallel: Effect
    kv_on_parallel: Effect  # kv-cache-q8 measured against parallel-4 (kept)
    kv_on_one_slot: Effect  # kv-cache-q8 measured against one slot (parallel-4 not kept)
    # The share of a pair's log-ratio variance that a longer trial does not shrink, per metric (the halves' estimate)
    fixed_share_ttft: float
    fixed_share_tok: float
    run_tail_s: float  # the run's time after its last trial starts beyond one trial (report, archive)
    requests_per_s: float  # measured requests per second of window (the error-rate guard's counts)


# benchmarks/demo_design.py --archives /tmp/demo12/cpu-tiny /tmp/fresh-1/reports/cpu-tiny /tmp/fresh-2/reports/cpu-tiny
# /tmp/fresh-3/reports/cpu-tiny /tmp/fresh-4/reports/cpu-tiny /tmp/twice*/cpu-tiny-history (2026-12-06, this 2-core
# machine; the 8 s runs of 1.0 shared the host with other runs and are left out)
MEASURED = Machine(
    runs=(
        RunNoise("20261206T211432Z-7babce", 6.0, sd_ttft=0.281, sd_tok=0.117, df=9, per_trial_s=10.74),
        RunNoise("20261206T211859Z-0e699c", 6.0, sd_ttft=0.184, sd_tok=0.131, df=9, per_trial_s=10.91),
        RunNoise("20261206T213314Z-b95f8e", 6.0, sd_ttft=0.184, sd_tok=0.118, df=6, per_trial_s=10.93),
        RunNoise("20261206T213615Z-3f3f48", 6.0, sd_ttft=0.230, sd_tok=0.366, df=6, per_trial_s=11.20),
        RunNoise("20261206T212330Z-93731b", 6.0, sd_ttft=0.116, sd_tok=0.117, df=8, per_trial_s=11.00),
        RunNoise("20261206T212741Z-d9b46e", 6.0, sd_ttft=0.248, sd_tok=0.243, df=9, per_trial_s=11.22),
        RunNoise("20261206T222827Z-143f96", 6.0, sd_ttft=0.151, sd_tok=0.140, df=4, per_trial_s=11.27),
        RunNoise("20261206T223055Z-04aa46", 6.0, sd_ttft=0.294, sd_tok=0.122, df=5, per_trial_s=11.15),
    ),
    parallel=Effect(ttft=-0.588, tok_s=-0.007, pairs=46),
    kv_on_parallel=Effect(ttft=0.400, tok_s=-0.134, pairs=24),
    kv_on_one_slot=Effect(ttft=0.338, tok_s=-0.201, pairs=16),
    fixed_share_ttft=0.641,
    fixed_share_tok=0.505,
    run_tail_s=2.4,
    requests_per_s=10.42,
)


# --- estimating the noise from archives ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pair:
    run_id: str
    step: str
    base: str  # the configuration the candidate met: "parallel-4" or "one slot"
    log_ratio: dict[str, float]  # metric -> log(candidate / baseline); halves as "ttft.p95@h1" ...


def _window_figures(run: ArchivedRun, trial: TrialRecord, window_s: float) -> dict[str, float]:
    """The trial's P95 TTFT and output tok/s over its whole window and over each half (requests sent in it, the
    half's time from its first send to its last request's end), by the product's own summary."""
    records = measured_requests(run.load_records(trial.trial_id))
    start = min(r.sent_ns for r in records)
    middle = start + window_s / 2 * 1e9
    parts = {
        "": records,
        "@h1": [r for r in records if r.sent_ns < middle],
        "@h2": [r for r in records if r.sent_ns >= middle],
    }
    out: dict[str, float] = {}
    for tag, part in parts.items():
        first = min(r.sent_ns for r in part)
        span_s = (max(r.end_ns for r in part if r.end_ns is not None) - first) / 1e9
        figures = summarize(part, span_s)
        out[TTFT + tag], out[TOK_S + tag] = float(figures[TTFT] or "nan"), float(figures[TOK_S] or "nan")
    return out


@dataclass(frozen=True)
class _Run:
    run_id: str
    window_s: float
    quiet: bool  # no trial archived another llmplay run on the host
    pairs: list[_Pair]
    per_trial_s: float  # engine time per trial: first trial's start to last's, over the trials between
    tail_s: float  # from the last trial's start to the run's end, beyond one trial
    requests_per_s: float  # measured requests per second of window


def _read_run(run_dir: Path) -> _Run:
    run = ArchivedRun.open(run_dir)
    window_s = parse_duration_s(yaml.safe_load(run.read_text(RESOLVED_FILE) or "")["workload"]["duration"])
    trials = [t for t in run.trials() if t.status == TRIAL_OK]
    quiet = not any(t.shared_with for t in run.trials())
    kept = {v.step for v in run.verdicts() if v.verdict == KEPT}
    sides: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
    for trial in trials:
        figures = {**_window_figures(run, trial, window_s), "product:" + TTFT: float(trial.summary[TTFT])}
        figures["product:" + TOK_S] = float(trial.summary[TOK_S])
        sides.setdefault((str(trial.step), trial.repeat), {})[trial.role] = figures
    pairs = []
    for (step, _), side in sides.items():
        if {"baseline", "candidate"} <= set(side):
            ratio = {m: math.log(side["candidate"][m] / side["baseline"][m]) for m in side["candidate"]}
            base = "parallel-4" if step != PARALLEL and PARALLEL in kept else "one slot"
            pairs.append(_Pair(run.run_id, step, base, ratio))
    stamps = sorted(_epoch_s(t.started_utc) for t in run.trials())
    per_trial_s = (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)
    tail_s = _epoch_s(run.info.finished_utc) - stamps[-1] - per_trial_s
    rate = float(np.mean([t.summary["requests.total"] / t.summary["duration_s"] for t in trials]))
    return _Run(run.run_id, window_s, quiet, pairs, per_trial_s, tail_s, rate)


def _epoch_s(utc: str) -> float:
    return datetime.strptime(utc[:19], "%Y-%m-%dT%H:%M:%S").timestamp()


def _pooled_sd(pairs: Sequence[_Pair], metric: str) -> tuple[float, int]:
    """The SD of the pairs' log ratios with each step's own mean taken out, and its degrees of freedom."""
    by_step: dict[str, list[float]] = {}
    for p in pairs:
        by_step.setdefault(p.step, []).append(p.log_ratio[metric])
    squares = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in by_step.values())
    df = sum(len(v) - 1 for v in by_step.values())
    return (math.sqrt(squares / df) if df else float("nan")), df


def _effect(pairs: Iterable[_Pair]) -> Effect:
    chosen = list(pairs)
    ttft = float(np.expm1(np.mean([p.log_ratio[TTFT] for p in chosen])))
    return Effect(ttft, float(np.expm1(np.mean([p.log_ratio[TOK_S] for p in chosen]))), len(chosen))


def estimate(dirs: Sequence[Path], say: Callable[[str], None]) -> Machine:
    """The machine's noise, effects and engine time from the archived runs under `dirs` (printed as tables)."""
    runs = [_read_run(m.parent) for m in sorted({m for d in dirs for m in Path(d).glob("**/manifest.json")})]
    say("| run | trial | quiet | pairs (per step) | SD of pair log ratios: P95 TTFT / tok/s (df) | per trial |")
    say("|---|---|---|---|---|---|")
    noise: dict[str, RunNoise] = {}
    for run in runs:
        sd_ttft, df = _pooled_sd(run.pairs, TTFT)
        sd_tok, _ = _pooled_sd(run.pairs, TOK_S)
        noise[run.run_id] = RunNoise(run.run_id, run.window_s, round(sd_ttft, 3), round(sd_tok, 3), df, 0.0)
        noise[run.run_id] = replace(noise[run.run_id], per_trial_s=round(run.per_trial_s, 2))
        steps = ", ".join(
            f"{s} {sum(p.step == s for p in run.pairs)}" for s in dict.fromkeys(p.step for p in run.pairs)
        )
        say(
            f"| {run.run_id} | {run.window_s:g} s | {'yes' if run.quiet else 'no (shared)'} | {len(run.pairs)} ({steps}) "
            f"| {sd_ttft:.3f} / {sd_tok:.3f} ({df}) | {run.per_trial_s:.2f} s |"
        )
    shipped = load_playbook(DEMO).workload.duration_s
    mixture = [run for run in runs if run.quiet and run.window_s == shipped]
    at_shipped = [p for run in mixture for p in run.pairs]
    # Effects do not depend on the window's length: every quiet pair counts.
    quiet = [p for run in runs if run.quiet for p in run.pairs]
    quiet_kv = [p for p in quiet if p.step == KV]
    fixed = {m: _fixed_share(at_shipped, m, say) for m in (TTFT, TOK_S)}
    machine = Machine(
        runs=tuple(noise[run.run_id] for run in mixture),
        parallel=_effect(p for p in quiet if p.step == PARALLEL),
        kv_on_parallel=_effect(p for p in quiet_kv if p.base == "parallel-4"),
        kv_on_one_slot=_effect(p for p in quiet_kv if p.base == "one slot"),
        fixed_share_ttft=round(fixed[TTFT], 3),
        fixed_share_tok=round(fixed[TOK_S], 3),
        run_tail_s=round(float(np.mean([run.tail_s for run in mixture])), 1),
        requests_per_s=round(float(np.mean([run.requests_per_s for run in mixture])), 2),
    )
    for name, e in (
        ("parallel-4", machine.parallel),
        ("kv-cache-q8 on parallel-4", machine.kv_on_parallel),
        ("kv-cache-q8 on one slot", machine.kv_on_one_slot),
    ):
        say(f"{name}: P95 TTFT {e.ttft:+.1%}, output tok/s {e.tok_s:+.1%} over {e.pairs} pairs")
    say(repr(machine))
    return machine


def _fixed_share(pairs: Sequence[_Pair], metric: str, say: Callable[[str], None]) -> float:
    """The share u / sd^2(T) of the whole window's pair variance that halving the window leaves (sd^2 = u + c/T)."""
    whole, _ = _pooled_sd(pairs, metric)
    halves = [_pooled_sd(pairs, metric + tag)[0] for tag in ("@h1", "@h2")]
    product, _ = _pooled_sd(pairs, "product:" + metric)
    half_var = float(np.mean(np.square(halves)))
    share = min(1.0, max(0.0, (2 * whole**2 - half_var) / whole**2))
    say(
        f"{metric}: pair SD over the whole window {whole:.3f} (the archived figures: {product:.3f}), over a half "
        f"{halves[0]:.3f} / {halves[1]:.3f} (sqrt rule: {whole * math.sqrt(2):.3f}); the part a longer trial "
        f"does not shrink: {share:.0%} of the variance"
    )
    return share


# --- simulating fresh runs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Design:
    label: str
    max_repeats: int
    trial_s: float
    sqrt_rule: bool = False  # the noise shrinks as 1 / sqrt(window) (u = 0): the optimistic bound
    homogeneous: bool = False  # every fresh run at the runs' pooled noise instead of one run's own
    parallel_tok_s: float | None = None  # parallel-4's throughput change instead of the measured one
    errors_pp: float | None = None  # the error-rate guard's tolerance in points instead of the playbook's


@dataclass(frozen=True)
class FreshRun:
    parallel: str  # parallel-4's verdict
    kv: str  # kv-cache-q8's
    pairs: tuple[int, int]
    run_s: float  # the run's engine time: its trials and the report after the last


def _noise_factor(machine: Machine, design: Design, shipped_s: float, fixed_share: float) -> float:
    """How a pair's log-ratio SD at the shipped window scales to the design's window."""
    share = 0.0 if design.sqrt_rule else fixed_share
    return math.sqrt(share + (1.0 - share) * shipped_s / design.trial_s)


def _pooled(runs: Sequence[RunNoise]) -> tuple[float, float]:
    df = sum(r.df for r in runs)
    ttft = math.sqrt(sum(r.df * r.sd_ttft**2 for r in runs) / df)
    return ttft, math.sqrt(sum(r.df * r.sd_tok**2 for r in runs) / df)


def _decide(
    rng: np.random.Generator,
    effect: Effect,
    sd_pair: tuple[float, float],
    requests: int,
    goals: Goals,
    trials: Trials,
) -> tuple[str, int]:
    """One step's verdict and pairs used: per-trial log-SD is the pair's over sqrt 2 (two independent trials)."""
    sigma, guard_sigma = sd_pair[0] / math.sqrt(2), sd_pair[1] / math.sqrt(2)
    row = Row(
        "demo step",
        goals.guards,
        sigma=sigma,
        guard_sigma=guard_sigma,
        objective_effect=effect.ttft,
        guard_effect=1.0 / (1.0 + effect.tok_s) - 1.0,  # the guard's change in its worse direction
        min_effect=goals.objective.min_effect,
        requests=requests,
        max_repeats=trials.max_repeats,
    )
    outcome, _ = run_step(rng, row, trials, goals, sigma, {})
    return outcome.verdict, outcome.pairs


def simulate(machine: Machine, design: Design, reps: int, seed: int) -> list[FreshRun]:
    """`reps` fresh runs of the demo under `design`: each one archived quiet run's noise and time per trial."""
    playbook = load_playbook(DEMO)
    goals, shipped_s = playbook.goals, playbook.workload.duration_s
    if design.errors_pp is not None:
        tolerance = design.errors_pp / 100
        guards = tuple(replace(g, tolerance=tolerance) if g.metric == "errors.rate" else g for g in goals.guards)
        goals = replace(goals, guards=guards)
    trials = replace(playbook.trials, max_repeats=design.max_repeats)
    requests = round(machine.requests_per_s * design.trial_s)
    scale = (
        _noise_factor(machine, design, shipped_s, machine.fixed_share_ttft),
        _noise_factor(machine, design, shipped_s, machine.fixed_share_tok),
    )
    pooled = _pooled(machine.runs)
    parallel = machine.parallel
    if design.parallel_tok_s is not None:
        parallel = replace(parallel, tok_s=design.parallel_tok_s)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        run = machine.runs[int(rng.integers(len(machine.runs)))]
        sd = pooled if design.homogeneous else (run.sd_ttft, run.sd_tok)
        sd_pair = (sd[0] * scale[0], sd[1] * scale[1])
        first, first_pairs = _decide(rng, parallel, sd_pair, requests, goals, trials)
        kv_effect = machine.kv_on_parallel if first == KEPT else machine.kv_on_one_slot
        second, second_pairs = _decide(rng, kv_effect, sd_pair, requests, goals, trials)
        per_trial_s = run.per_trial_s + design.trial_s - run.trial_s
        run_s = 2 * (first_pairs + second_pairs) * per_trial_s + machine.run_tail_s
        out.append(FreshRun(first, second, (first_pairs, second_pairs), run_s))
    return out


DESIGNS: tuple[Design, ...] = (
    Design("6 s, 3-4 pairs (1.3 as shipped)", 4, 6.0),
    Design("6 s, 3-5 pairs", 5, 6.0),
    Design("6 s, 3-6 pairs", 6, 6.0),
    Design("8 s, 3-4 pairs", 4, 8.0),
    Design("8 s, 3-5 pairs", 5, 8.0),
    Design("8 s, 3-6 pairs", 6, 8.0),
    Design("8 s, 3-5 pairs, sqrt rule", 5, 8.0, sqrt_rule=True),
    Design("8 s, 3-6 pairs, sqrt rule", 6, 8.0, sqrt_rule=True),
    # What it would take, past the time allowed
    Design("6 s, 3-8 pairs", 8, 6.0),
    Design("8 s, 3-8 pairs", 8, 8.0),
    # The proposal's sensitivity: no mixture, the throughput cost the playbook's comment assumed, the error guard
    Design("6 s, 3-6 pairs, pooled noise (no mixture)", 6, 6.0, homogeneous=True),
    Design("6 s, 3-6 pairs, parallel-4 costing 12.5% throughput", 6, 6.0, parallel_tok_s=-0.125),
    Design("6 s, 3-6 pairs, error-rate guard 3pp", 6, 6.0, errors_pp=3.0),
)


def _minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}m{whole % 60:02d}s"


def summary_row(design: Design, runs: Sequence[FreshRun]) -> str:
    kept = float(np.mean([r.parallel == KEPT for r in runs]))
    rejected = float(np.mean([r.kv == REJECTED for r in runs]))
    both = float(np.mean([r.parallel == KEPT and r.kv == REJECTED for r in runs]))
    se5 = 5 * both**4 * math.sqrt(both * (1 - both) / len(runs))  # the delta method's standard error of P^5
    run_s = np.array([r.run_s for r in runs])
    command_s = run_s + COMMAND_OVERHEAD_S
    pairs = np.array([r.pairs for r in runs])
    return (
        f"| {design.label} | {kept:.1%} | {rejected:.1%} | {both:.1%} | {both**5:.2f} ± {se5:.2f} "
        f"| {pairs[:, 0].mean():.2f} / {pairs[:, 1].mean():.2f} "
        f"| {_minutes(run_s.mean())} / {_minutes(float(np.percentile(run_s, 95)))} "
        f"| {_minutes(command_s.mean())} / {_minutes(float(np.percentile(command_s, 95)))} |"
    )


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2000, help="simulated fresh runs per design")
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--archives", nargs="*", type=Path, default=None, help="estimate the noise from these first")
    parser.add_argument("--only", default=None, help="the designs whose label contains this text")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    machine = estimate(args.archives, say) if args.archives else MEASURED
    lines = [
        "| design | parallel-4 kept | kv-cache-q8 rejected | both | 5 of 5 fresh runs (P^5) | pairs: parallel-4 / "
        "kv-cache-q8 | the run: mean / 95th pct. | whole command: mean / 95th pct. |",
        "|" + "---|" * 8,
    ]
    for design in DESIGNS:
        if args.only is None or args.only in design.label:
            # The same seed for every design: each draws the same archived runs (common random numbers).
            lines.append(summary_row(design, simulate(machine, design, args.reps, args.seed)))
            say(f"# {design.label}: done at {time.perf_counter() - t0:.0f} s")
    say("\n".join(lines))
    say(
        f"\n{args.reps} fresh runs a design over {len(machine.runs)} archived runs' noise; the whole command adds "
        f"{COMMAND_OVERHEAD_S:.0f} s of set-up to the run; {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
