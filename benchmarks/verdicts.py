"""Verdicts with guards, rates and borrowed noise: simulated steps decided by `decide_step`, as the runner reaches them.

Each simulated step is A (the incumbent) against B (the candidate) in interleaved pairs: 3 pairs (fixed) or 3, then
one more per inconclusive look up to 6 (sequential), exactly as `tuning/run.py` loops. Every trial carries one value
per metric, drawn on the log scale: the trial's P95 TTFT (the objective), its output tokens/s and P95 TPOT (guards),
each with per-trial log-SD sigma (the project's own real A/A on llama.cpp shows a median of 0.155), and a count of
failed requests out of 600 (binomial at the scenario's error rate). Optional: AR(1) correlation of consecutive trials
in the order they ran, a bimodal server (a fifth of trials 40 % slower), and a run of several steps whose noise is
borrowed (trials.pool_noise) with the later steps seeing the earlier ones' noise, as the runner hands it on.

Pair order is the runner's (`candidate_first`, drawn per pair) or the old alternating A B | B A, for the AR(1) rows.

Reported per row: the share of steps kept, rejected, rejected through a guard, and A/A false decisions (the objective's
interval excludes 0), with the pairs used. With 2,000 steps a rate near 5 % is known to about +-1 point.

    PYTHONPATH=. .venv/bin/python benchmarks/verdicts.py               # the table (about 4 minutes, 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/verdicts.py --reps 300    # quicker, noisier
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmplay.archive.model import KEPT, REJECTED
from llmplay.spec import Goals, Guard, Objective, Trials
from llmplay.stats.decide import TrialSample, decide_step
from llmplay.stats.intervals import Noise
from llmplay.stats.power import t_power, z_power
from llmplay.tuning.steps import candidate_first

FIXED = Trials(repeats=3, interleave=True, sequential=False, max_repeats=3)
SEQUENTIAL = Trials(repeats=3, interleave=True, sequential=True, max_repeats=6)
REQUESTS = 600  # per trial
DURATION = 20.0

THROUGHPUT_15 = Guard("throughput.output_tok_s", 0.15, "maximize")
TPOT_15 = Guard("tpot.p95", 0.15, "minimize")
ERRORS_1PP = Guard("errors.rate", 0.01, "minimize", absolute=True)
ERRORS_05PP = Guard("errors.rate", 0.005, "minimize", absolute=True)
ERRORS_2PP = Guard("errors.rate", 0.02, "minimize", absolute=True)
# The rule before this change, for the "before" column: a relative 0 % tolerance on the error rate.
ERRORS_0PCT = Guard("errors.rate", 0.0, "minimize")


@dataclass(frozen=True)
class Row:
    label: str
    guards: tuple[Guard, ...] = ()
    sigma: float = 0.15  # per-trial log-SD of the objective and the guards
    objective_effect: float = 0.0  # true relative change of P95 TTFT (-0.3: 30 % faster)
    guard_effect: float = 0.0  # true relative change of every guard metric in its worse direction (0.075: 7.5 % worse)
    error_rate: float = 0.0  # per request, both sides
    ar1: float = 0.0  # correlation of consecutive trials in run order
    alternate: bool = False  # the old A B | B A order instead of the runner's draw
    bimodal: bool = False  # a fifth of trials 40 % slower on every latency
    min_effect: float = 0.02
    steps: int = 1  # a run of this many steps (the last decides the row when `pool`)
    pool: bool = False  # trials.pool_noise
    sigmas: tuple[float, ...] = ()  # per step of the run, overriding sigma
    modes: tuple[str, ...] = ("fixed", "sequential")
    confidence: float = 0.95
    requests: int = REQUESTS  # per trial
    guard_sigma: float | None = None  # the guards' per-trial log-SD when it is not the objective's
    max_repeats: int = 6  # sequential mode's last look
    # trials.noise: history: the archive's earlier comparable steps, this many degrees of freedom of paired noise
    # (each metric's estimate drawn per run from its chi-square law), at this per-trial log-SD (None: today's)
    history_df: int = 0
    history_sigma: float | None = None
    # Each trial's measured requests drawn from these (a real run's), where `requests` is every trial's otherwise: a
    # rate guard's count interval rests on the requests both sides really had (benchmarks/twice.py).
    requests_drawn: tuple[int, ...] = ()
    note: str = field(default="", compare=False)


def _trial_values(rng: np.random.Generator, row: Row, sigma: float, n_trials: int) -> np.ndarray:
    """(n_trials, 3) log noise of P95 TTFT, output tok/s, P95 TPOT, in run order."""
    z = rng.standard_normal((n_trials, 3))
    if row.ar1:
        e = np.empty_like(z)
        e[0] = z[0]
        for t in range(1, n_trials):
            e[t] = row.ar1 * e[t - 1] + np.sqrt(1 - row.ar1**2) * z[t]
        z = e
    noise = sigma * z
    if row.guard_sigma is not None:
        noise[:, 1:] *= row.guard_sigma / sigma
    if row.bimodal:
        slow = rng.random(n_trials) < 0.2
        noise[slow, 0] += np.log(1.4)
        noise[slow, 2] += np.log(1.4)
        noise[slow, 1] -= np.log(1.4)
    return noise


def _sample(
    log_noise: np.ndarray, candidate: bool, row: Row, errors: int, repeat: int, requests: int | None = None
) -> TrialSample:
    n = requests if requests is not None else row.requests
    obj = np.log1p(row.objective_effect) if candidate else 0.0
    worse = np.log1p(row.guard_effect) if candidate else 0.0
    ttft = 0.1 * np.exp(obj + log_noise[0])
    tok_s = 1000.0 * np.exp(-worse + log_noise[1])
    tpot = 0.02 * np.exp(worse + log_noise[2])
    ok = n - errors
    return TrialSample(
        duration_s=DURATION,
        values={
            "ttft": np.full(8, ttft),
            "tpot": np.full(8, tpot),
            "output_tokens": np.full(ok, tok_s * DURATION / ok),
            "total_tokens": np.full(ok, 2 * tok_s * DURATION / ok),
        },
        n_requests=n,
        n_errors=errors,
        repeat=repeat,
    )


@dataclass
class StepOutcome:
    verdict: str
    through_guard: bool
    objective_excludes_zero: bool
    pairs: int
    methods: tuple[str, ...] = ()  # the final look's paired intervals, objective then guards: what noise they used
    reason: str = ""


def run_step(
    rng: np.random.Generator,
    row: Row,
    trials: Trials,
    goals: Goals,
    sigma: float,
    borrowed: dict[str, list[Noise]],
    history: dict[str, Noise] | None = None,
) -> tuple[StepOutcome, dict[str, Noise]]:
    """One step decided as `tuning/steps.py` drives it: `repeats` pairs, then (sequential) one more pair per
    inconclusive look up to max_repeats; its outcome and its own noise per metric."""
    most = trials.max_repeats if trials.sequential else trials.repeats
    noise = _trial_values(rng, row, sigma, 2 * most)
    counts = rng.choice(row.requests_drawn, 2 * most) if row.requests_drawn else None
    n_requests = row.requests if counts is None else counts
    errors = rng.binomial(n_requests, row.error_rate, 2 * most) if row.error_rate else np.zeros(2 * most, dtype=int)
    a: list[TrialSample] = []
    b: list[TrialSample] = []
    for pair in range(most):
        first_candidate = (pair % 2 == 1) if row.alternate else candidate_first("sim", "step", int(rng.integers(1e9)))
        for slot in range(2):
            t = 2 * pair + slot
            is_candidate = (slot == 0) == first_candidate
            requests = None if counts is None else int(counts[t])
            (b if is_candidate else a).append(_sample(noise[t], is_candidate, row, int(errors[t]), pair, requests))
    n = trials.repeats
    while True:
        d = decide_step(a[:n], b[:n], goals, trials, borrowed=borrowed, history=history)
        if not (trials.sequential and d.verdict == "inconclusive" and n < trials.max_repeats):
            break
        n += 1
    obj = d.objective
    excludes = bool(obj and obj.ci_low is not None and obj.ci_high is not None and (obj.ci_low > 0 or obj.ci_high < 0))
    guard_reject = d.verdict == REJECTED and " tolerance" in d.reason and "beyond its" in d.reason
    methods = tuple(delta.method or "" for delta in (obj, *d.guards) if delta is not None)
    return StepOutcome(d.verdict, guard_reject, excludes, n, methods, d.reason), dict(d.noise)


def _history(rng: np.random.Generator, row: Row) -> dict[str, Noise] | None:
    """The history's paired noise per metric as an archive of earlier steps would give it: a pair's log ratio has
    variance 2 sigma^2, estimated with history_df degrees of freedom."""
    if not row.history_df:
        return None
    sigma = row.history_sigma if row.history_sigma is not None else row.sigma
    guard = row.guard_sigma if row.guard_sigma is not None else sigma
    if row.history_sigma is not None and row.guard_sigma is not None:
        guard = row.guard_sigma * row.history_sigma / row.sigma
    out = {}
    for metric, s in (("ttft.p95", sigma), ("throughput.output_tok_s", guard), ("tpot.p95", guard)):
        out[metric] = Noise(2 * s * s * float(rng.chisquare(row.history_df)) / row.history_df, row.history_df)
    return out


def design_df(row: Row) -> int:
    """The degrees of freedom the fixed design's objective interval can have: its own 2, the run's other steps' when
    borrowed, the history's."""
    pooled = row.pool or row.history_df
    return FIXED.repeats - 1 + ((row.steps - 1) * (FIXED.repeats - 1) if pooled else 0) + row.history_df


def oracle(row: Row) -> tuple[float, float]:
    """(t test power at the design's degrees of freedom, known-variance power) of the fixed design's objective
    interval excluding 0 for the row's true effect (in A/A, the level's 5 %)."""
    se = row.sigma * np.sqrt(2.0 / FIXED.repeats)
    gap = abs(float(np.log1p(row.objective_effect)))
    df = design_df(row)
    t = t_power(gap, se, df, row.confidence) + t_power(-gap, se, df, row.confidence)
    z = z_power(gap, se, row.confidence) + z_power(-gap, se, row.confidence)
    return t, z


def run_row(row: Row, reps: int, seed: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    goals = Goals(objective=Objective("minimize", "ttft.p95", row.min_effect), guards=row.guards)
    for mode in row.modes:
        base = FIXED if mode == "fixed" else SEQUENTIAL
        trials = Trials(
            repeats=base.repeats,
            interleave=True,
            sequential=base.sequential,
            max_repeats=row.max_repeats if base.sequential else base.max_repeats,
            confidence=row.confidence,
            pool_noise=row.pool or bool(row.history_df),
            noise="history" if row.history_df else ("run" if row.pool else "step"),
        )
        rng = np.random.default_rng(seed)
        outcomes: list[StepOutcome] = []
        per_step: list[list[StepOutcome]] = [[] for _ in range(row.steps)]
        for _ in range(reps):
            borrowed: dict[str, list[Noise]] = {}
            history = _history(rng, row)
            for step in range(row.steps):
                sigma = row.sigmas[step] if row.sigmas else row.sigma
                outcome, noise = run_step(rng, row, trials, goals, sigma, borrowed, history)
                per_step[step].append(outcome)
                for metric, n in noise.items():
                    borrowed.setdefault(metric, []).append(n)
            outcomes.extend(per_step[-1][-1:] if row.steps > 1 else per_step[0][-1:])
        every = [o for step in per_step for o in step]

        def rate(items: Sequence[StepOutcome], what: Callable[[StepOutcome], bool]) -> float:
            return float(np.mean([what(o) for o in items]))

        out[mode] = {
            "kept": rate(outcomes, lambda o: o.verdict == KEPT),
            "rejected": rate(outcomes, lambda o: o.verdict == REJECTED),
            "via_guard": rate(outcomes, lambda o: o.through_guard),
            "aa_false": rate(outcomes, lambda o: o.objective_excludes_zero),
            "pairs": float(np.mean([o.pairs for o in outcomes])),
            "run_kept": rate(every, lambda o: o.verdict == KEPT),
            "run_aa_false": rate(every, lambda o: o.objective_excludes_zero),
            "run_via_guard": rate(every, lambda o: o.through_guard),
        }
    return out


SHIPPED = (THROUGHPUT_15, ERRORS_1PP)
# cpu-tiny as shipped: P95 TTFT with a 10% minimum effect, throughput within 25%, errors within 2 points, about 160
# requests a trial, 3 pairs then up to 5.
CPU_TINY = (Guard("throughput.output_tok_s", 0.25, "maximize"), ERRORS_2PP)
# Throughput over a trial is an average over thousands of tokens: its per-trial log-SD is about 0.045 in the real run
# the README prints (-12.5% [-22.2%, -1.5%] over 5 pairs), where P95 TTFT's is about 0.155.
CPU_TINY_ROW = {"min_effect": 0.10, "requests": 160, "max_repeats": 5, "sigma": 0.155, "guard_sigma": 0.045}
ROWS: tuple[Row, ...] = (
    Row("A/A, throughput 15% + errors 1pp, 1e-3 errors", SHIPPED, error_rate=1e-3),
    Row(
        "A/A, throughput 15% + errors 0% (the old rule's playbooks), 1e-3 errors",
        (THROUGHPUT_15, ERRORS_0PCT),
        error_rate=1e-3,
    ),
    Row("A/A, 2 guards (throughput, TPOT 15%)", (THROUGHPUT_15, TPOT_15)),
    Row("cpu-tiny goals, A/A, sigma .155, 1e-3 errors", CPU_TINY, error_rate=1e-3, **CPU_TINY_ROW),  # type: ignore[arg-type]
    Row(
        "cpu-tiny goals, parallel-4-like: TTFT -55%, throughput -12%",
        CPU_TINY,
        objective_effect=-0.55,
        guard_effect=0.12,
        **CPU_TINY_ROW,  # type: ignore[arg-type]
    ),
    Row(
        "A/A, 3 guards (throughput, TPOT 15%, errors 0.5pp), 1e-3 errors",
        (THROUGHPUT_15, TPOT_15, ERRORS_05PP),
        error_rate=1e-3,
    ),
    Row("A/A, 2 guards, sigma 0.3", (THROUGHPUT_15, TPOT_15), sigma=0.3),
    Row("A/A, 2 guards, sigma 0.05", (THROUGHPUT_15, TPOT_15), sigma=0.05),
    Row("A/A, errors 0.5pp alone, 1e-2 errors", (ERRORS_05PP,), error_rate=1e-2),
    Row("A/A, errors 1pp alone, 1e-4 errors", (ERRORS_1PP,), error_rate=1e-4),
    Row(
        "-30% gain, guard moved half its tolerance (-7.5%)", (THROUGHPUT_15,), objective_effect=-0.3, guard_effect=0.075
    ),
    Row("-30% gain, guard exactly at its tolerance (-15%)", (THROUGHPUT_15,), objective_effect=-0.3, guard_effect=0.15),
    Row("-30% gain, guard did not move", (THROUGHPUT_15,), objective_effect=-0.3),
    Row("-30% gain, 1e-3 errors, errors 1pp", (ERRORS_1PP,), objective_effect=-0.3, error_rate=1e-3),
    Row("-30% gain, 1e-3 errors, errors 0% (old rule)", (ERRORS_0PCT,), objective_effect=-0.3, error_rate=1e-3),
    Row("-30% gain, 1e-3 errors, throughput 15% + errors 1pp", SHIPPED, objective_effect=-0.3, error_rate=1e-3),
    Row("A/A, AR(1) rho .5, A B, B A order (old)", (), ar1=0.5, alternate=True),
    Row("A/A, AR(1) rho .5, order drawn per pair", (), ar1=0.5),
    Row("A/A, bimodal server, 2 guards", (THROUGHPUT_15, TPOT_15), bimodal=True),
    Row("power: -10%, sigma .05, one step", (), sigma=0.05, objective_effect=-0.1, modes=("fixed",)),
    Row(
        "power: -10%, sigma .05, 5th of 5 steps, pool_noise",
        (),
        sigma=0.05,
        objective_effect=-0.1,
        steps=5,
        pool=True,
        modes=("fixed",),
    ),
    Row("A/A, sigma .05, 5th of 5 steps, pool_noise", (), sigma=0.05, steps=5, pool=True, modes=("fixed",)),
    Row(
        "A/A, 5 steps, pool_noise, 5th step's variance 3x",
        (),
        steps=5,
        pool=True,
        sigmas=(0.05, 0.05, 0.05, 0.05, 0.05 * 3**0.5),
        modes=("fixed",),
    ),
    Row(
        "A/A, 5 steps, pool_noise, 5th step's sigma 3x",
        (),
        steps=5,
        pool=True,
        sigmas=(0.05, 0.05, 0.05, 0.05, 0.15),
        modes=("fixed",),
    ),
    Row(
        "power: -10%, sigma .05, one step, history of 30 df (45 pairs)",
        (),
        sigma=0.05,
        objective_effect=-0.1,
        history_df=30,
        modes=("fixed",),
    ),
    Row(
        "power: -10%, sigma .05, one step, history of 10 df (15 pairs)",
        (),
        sigma=0.05,
        objective_effect=-0.1,
        history_df=10,
        modes=("fixed",),
    ),
    Row(
        "power: -10%, sigma .05, 5th of 5 steps, history of 30 df",
        (),
        sigma=0.05,
        objective_effect=-0.1,
        steps=5,
        history_df=30,
        modes=("fixed",),
    ),
    Row("A/A, sigma .05, history of 30 df, noise unchanged", (), sigma=0.05, history_df=30, modes=("fixed",)),
    Row(
        "A/A, sigma .05, history of 30 df whose sigma is half today's",
        (),
        sigma=0.05,
        history_df=30,
        history_sigma=0.025,
        modes=("fixed",),
    ),
    Row(
        "A/A, 5 steps, history of 30 df whose sigma is half today's (5th step)",
        (),
        sigma=0.05,
        steps=5,
        history_df=30,
        history_sigma=0.025,
        modes=("fixed",),
    ),
    Row(
        "A/A, 5 steps, history of 30 df, 5th step's sigma 3x",
        (),
        steps=5,
        history_df=30,
        sigma=0.05,
        sigmas=(0.05, 0.05, 0.05, 0.05, 0.15),
        modes=("fixed",),
    ),
    Row("A/A, AR(1) rho .5, history of 30 df", (), ar1=0.5, history_df=30),
    Row("A/A, shipped guards (throughput 15% + errors 1pp), history of 30 df", SHIPPED, error_rate=1e-3, history_df=30),
    Row(
        "A/A, 5 steps, no pooling, 5th step's sigma 3x",
        (),
        steps=5,
        sigmas=(0.05, 0.05, 0.05, 0.05, 0.15),
        modes=("fixed",),
    ),
)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def table(results: Sequence[tuple[Row, dict[str, dict[str, float]]]]) -> str:
    lines = [
        "| scenario | mode | kept | rejected | rejected through a guard | A/A false (objective CI excludes 0) "
        "| pairs | whole run: kept / A/A false / through a guard | oracle: t at the design's df / known variance |",
        "|" + "---|" * 9,
    ]
    for row, modes in results:
        for mode, r in modes.items():
            run = (
                f"{_pct(r['run_kept'])} / {_pct(r['run_aa_false'])} / {_pct(r['run_via_guard'])}"
                if row.steps > 1
                else ""
            )
            t, z = oracle(row)
            oracles = f"{_pct(t)} (df {design_df(row)}) / {_pct(z)}" if mode == "fixed" else ""
            lines.append(
                f"| {row.label} | {mode} | {_pct(r['kept'])} | {_pct(r['rejected'])} | {_pct(r['via_guard'])} "
                f"| {_pct(r['aa_false'])} | {r['pairs']:.2f} | {run} | {oracles} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2000, help="simulated steps (or runs) per row and mode")
    parser.add_argument("--seed", type=int, default=20261205)
    parser.add_argument("--only", default=None, help="the rows whose label contains this text")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    results = []
    for i, row in enumerate(ROWS):
        if args.only is not None and args.only not in row.label:
            continue
        reps = max(1, args.reps // 2) if row.steps > 1 else args.reps
        results.append((row, run_row(row, reps, args.seed + i)))
        say(f"# {row.label}: done at {time.perf_counter() - t0:.0f} s")
    say(table(results))
    say(
        f"\n{args.reps} steps per row and mode ({args.reps // 2} runs for the rows of several steps, the row's figures "
        f"from their last step); {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
