"""How often a step's verdict is right: simulated trials with known effects, decided by `decide_step` itself.

Each simulated decision is one step of a tuning run: A (the reference) and B (the candidate) each get 3 trials of
200 requests (sequential mode: up to 6, stopping as `tuning/run.py` does, after each added pair, once the verdict is
no longer inconclusive), interleaved as pairs, with the playbook's default goals (objective min_effect 2 %,
confidence 95 %). The trials are reduced to `TrialSample`s and passed to `decide_step`, so the figures are those of
the code a run uses, not of a re-implementation.

Per request, latency is lognormal with log-SD sigma. Per trial, a drift factor exp(tau * z) scales every request of
that trial (an engine start, the machine's state that minute); with `shared` drift the two trials of a pair share
half of its variance (they ran minutes apart), with `indep` drift none. The candidate's effect scales its latencies
(a 10 % gain: P95 x 0.9), so the true relative change of P95 is known exactly. The two trials of a pair draw their
requests' noise independently: a real pair shares its request sequence (the workload seed), which makes its trials
more alike than here, so these figures are on the cautious side.

Reported per scenario (300 decisions each by default):
- A/A false: share of A/A decisions whose objective interval excludes 0 (kept, or rejected as worse): the error
  rate the confidence promises to hold at 5 %. "Rejected: any gain below the 2 % minimum effect" is right in A/A.
- coverage: share of intervals (A/A and both effects) that contain the true change.
- power 5 % / 10 %: share of decisions that keep a candidate whose true gain is 5 % / 10 %.
- trials/side: pairs used (fixed: always 3; sequential: mean / median at the 10 % effect and in A/A).

    PYTHONPATH=. .venv/bin/python benchmarks/decisions.py                    # the table (about 3 minutes, 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/decisions.py --reps 100         # quicker, noisier
    PYTHONPATH=. .venv/bin/python benchmarks/decisions.py --designs          # what it takes: pairs, trial length
    PYTHONPATH=. .venv/bin/python benchmarks/decisions.py --aa-precision N   # the fixed design's A/A rate, N reps
    PYTHONPATH=. .venv/bin/python benchmarks/decisions.py --verdicts [--reps N]  # guards, rates, AR(1), pooled noise

The rows with guards (0-3, relative and in points), error rates 1e-4 to 1e-2, sigma 0.05 / 0.15 / 0.3, AR(1)
trials, a bimodal server, runs of several steps with borrowed noise and heterogeneous variances, and the shipped
playbooks' goals live in benchmarks/verdicts.py (`--verdicts` runs it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llmplay.archive.model import KEPT
from llmplay.spec import Goals, Objective, Trials
from llmplay.stats.decide import TrialSample, decide_step
from llmplay.stats.intervals import paired_effect

FIXED = Trials(repeats=3, interleave=True, sequential=False, max_repeats=3)
SEQUENTIAL = Trials(repeats=3, interleave=True, sequential=True, max_repeats=6)
EFFECTS = (0.0, 0.05, 0.10)
OUT_TOKENS = 128  # per request (ignore_eos): throughput varies through the trial's duration only
CONCURRENCY = 16
ITL_GAPS = 32  # chunk gaps per request


@dataclass(frozen=True)
class Scenario:
    metric: str  # "ttft.p95" | "itl.p99" | "throughput.output_tok_s"
    sigma: float  # per-request log-SD
    tau: float  # per-trial drift, log-SD
    drift: str  # "indep" | "shared" (pairs share half the drift variance)
    requests: int = 200
    # Share of a request's log-variance its twin in the other trial of the pair has too (same prompt, same place in
    # the schedule: the shared workload seed); P95 only. 0 in the main rows, the cautious case.
    crn: float = 0.0

    @property
    def label(self) -> str:
        name = {"ttft.p95": "P95", "itl.p99": "ITL P99", "throughput.output_tok_s": "throughput"}[self.metric]
        long = f", {self.requests} req" if self.requests != 200 else ""
        drift = f" {self.drift}" if self.tau else ""
        crn = f", pairs share {self.crn:.0%} of request noise" if self.crn else ""
        return f"{name} s{self.sigma:g} t{self.tau:.0%}{drift}{long}{crn}"

    @property
    def lower_is_better(self) -> bool:
        return not self.metric.startswith("throughput")


def drift_factors(rng: np.random.Generator, reps: int, pairs: int, sc: Scenario) -> np.ndarray:
    """(reps, pairs, 2) multiplicative factors, one per trial."""
    share = 0.5 if sc.drift == "shared" else 0.0
    common = rng.standard_normal((reps, pairs, 1))
    own = rng.standard_normal((reps, pairs, 2))
    return np.exp(sc.tau * (np.sqrt(share) * common + np.sqrt(1 - share) * own))


def side_scale(sc: Scenario, effect: float) -> np.ndarray:
    """Latency scale of (A, B): a gain of `effect` makes B's latencies x(1 - effect), or its throughput x(1 + effect)
    by shortening its trials' duration."""
    return np.array([1.0, (1 - effect) if sc.lower_is_better else 1 / (1 + effect)])


def true_change(sc: Scenario, effect: float) -> float:
    return -effect if sc.lower_is_better else effect


def make_samples(rng: np.random.Generator, sc: Scenario, effect: float, drift: np.ndarray) -> list[list[list]]:
    """samples[rep][pair] = (A's TrialSample, B's TrialSample)."""
    reps, n_pairs = drift.shape[:2]
    scale = drift * side_scale(sc, effect)  # (reps, pairs, 2)
    out: list[list[list]] = []
    for r in range(reps):
        pairs = []
        for p in range(n_pairs):
            twin = rng.standard_normal(sc.requests) if sc.crn else None
            pair = []
            for s in range(2):
                pair.append(_trial(rng, sc, float(scale[r, p, s]), p, twin))
            pairs.append(pair)
        out.append(pairs)
    return out


def _trial(
    rng: np.random.Generator, sc: Scenario, scale: float, repeat: int, twin: np.ndarray | None = None
) -> TrialSample:
    n = sc.requests
    if sc.metric == "ttft.p95":
        z = rng.standard_normal(n)
        if twin is not None:
            z = np.sqrt(sc.crn) * twin + np.sqrt(1 - sc.crn) * z
        values = {"ttft": 0.1 * scale * np.exp(sc.sigma * z)}
        duration = 20.0
    elif sc.metric == "itl.p99":
        # Half the variance per request (a long prompt slows all its gaps), half per gap: gaps of one request are
        # correlated, which is what a request-level resample got wrong.
        per_request = np.repeat(rng.standard_normal(n), ITL_GAPS)
        per_gap = rng.standard_normal(n * ITL_GAPS)
        values = {"itl": 0.02 * scale * np.exp(sc.sigma * np.sqrt(0.5) * (per_request + per_gap))}
        duration = 20.0
    else:
        e2el = 2.0 * scale * np.exp(sc.sigma * rng.standard_normal(n))
        values = {"output_tokens": np.full(n, float(OUT_TOKENS))}
        duration = float(e2el.sum()) / CONCURRENCY  # a closed loop of CONCURRENCY users, kept busy
    return TrialSample(duration_s=duration, values=values, n_requests=n, n_errors=0, repeat=repeat)


@dataclass
class Outcome:
    kept: bool
    excludes_zero: bool
    covers: bool
    pairs: int
    low: float
    high: float


def decide(pairs: Sequence[Sequence[TrialSample]], goals: Goals, trials: Trials, truth: float) -> Outcome:
    """The verdict as `tuning/run.py` reaches it: `repeats` pairs, then (sequential) one more pair per
    inconclusive look up to `max_repeats`."""
    n = trials.repeats
    while True:
        a = [pair[0] for pair in pairs[:n]]
        b = [pair[1] for pair in pairs[:n]]
        d = decide_step(a, b, goals, trials)
        if not (trials.sequential and d.verdict == "inconclusive" and n < trials.max_repeats):
            break
        n += 1
    lo, hi = d.objective.ci_low, d.objective.ci_high
    assert lo is not None and hi is not None
    return Outcome(d.verdict == KEPT, lo > 0 or hi < 0, lo <= truth <= hi, n, lo, hi)


def run_designs(
    sc: Scenario, designs: Sequence[Trials], effects: Sequence[float], reps: int, seed: int
) -> dict[tuple[int, float], list[Outcome]]:
    """Outcomes per (design index, effect); every design decides the same simulated trials (common random numbers
    between the rows)."""
    rng = np.random.default_rng(seed)
    direction = "minimize" if sc.lower_is_better else "maximize"
    goals = Goals(objective=Objective(direction, sc.metric, 0.02))
    pairs = max(t.max_repeats if t.sequential else t.repeats for t in designs)
    results: dict[tuple[int, float], list[Outcome]] = {}
    for effect in effects:
        samples = make_samples(rng, sc, effect, drift_factors(rng, reps, pairs, sc))
        truth = true_change(sc, effect)
        for i, trials in enumerate(designs):
            results[(i, effect)] = [decide(reps_pairs, goals, trials, truth) for reps_pairs in samples]
    return results


def summary(aa: Sequence[Outcome], e5: Sequence[Outcome], e10: Sequence[Outcome]) -> dict[str, float]:
    def rate(outcomes: Sequence[Outcome], what: Callable[[Outcome], bool]) -> float:
        return float(np.mean([what(o) for o in outcomes])) if outcomes else float("nan")

    return {
        "aa_false": rate(aa, lambda o: o.excludes_zero),
        "coverage": rate([*aa, *e5, *e10], lambda o: o.covers),
        "power5": rate(e5, lambda o: o.kept),
        "power10": rate(e10, lambda o: o.kept),
        "aa_low": float(np.median([o.low for o in aa])),
        "aa_high": float(np.median([o.high for o in aa])),
        "pairs10_mean": float(np.mean([o.pairs for o in e10])),
        "pairs10_median": float(np.median([o.pairs for o in e10])),
        "pairsaa_mean": float(np.mean([o.pairs for o in aa])),
        "pairsaa_median": float(np.median([o.pairs for o in aa])),
    }


def run_scenario(sc: Scenario, reps: int, seed: int) -> dict[str, dict[str, float]]:
    res = run_designs(sc, (FIXED, SEQUENTIAL), EFFECTS, reps, seed)
    return {mode: summary(*(res[(i, e)] for e in EFFECTS)) for i, mode in enumerate(("fixed", "sequential"))}


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("ttft.p95", 0.3, 0.0, "indep"),
    Scenario("ttft.p95", 0.3, 0.03, "indep"),
    Scenario("ttft.p95", 0.3, 0.03, "shared"),
    Scenario("ttft.p95", 0.3, 0.05, "indep"),
    Scenario("ttft.p95", 0.5, 0.0, "indep"),
    Scenario("ttft.p95", 0.5, 0.03, "indep"),
    Scenario("ttft.p95", 0.5, 0.05, "indep"),
    Scenario("ttft.p95", 0.3, 0.05, "indep", requests=2000),
    Scenario("itl.p99", 0.3, 0.03, "indep"),
    Scenario("throughput.output_tok_s", 0.3, 0.03, "indep"),
    # Appended last: a scenario's seed is its place in this list, and the rows above keep theirs.
    Scenario("ttft.p95", 0.3, 0.03, "indep", crn=0.5),
)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _spct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def table(results: Sequence[tuple[Scenario, dict[str, dict[str, float]]]]) -> str:
    head = (
        "| scenario | mode | A/A false | coverage | power 5% | power 10% | A/A CI (median bounds) "
        "| pairs/side at 10% mean / median | pairs/side A/A mean / median |"
    )
    lines = [head, "|" + "---|" * 9]
    for sc, rows in results:
        for mode, r in rows.items():
            lines.append(
                f"| {sc.label} | {mode} | {_pct(r['aa_false'])} | {_pct(r['coverage'])} | {_pct(r['power5'])} "
                f"| {_pct(r['power10'])} | [{_spct(r['aa_low'])}, {_spct(r['aa_high'])}] "
                f"| {r['pairs10_mean']:.2f} / {r['pairs10_median']:g} | {r['pairsaa_mean']:.2f} / {r['pairsaa_median']:g} |"
            )
    return "\n".join(lines)


# What it takes to keep a 10 % P95 gain at sigma 0.3, tau 3 %: more pairs, a longer sequence, longer trials.
DESIGN_SCENARIO = Scenario("ttft.p95", 0.3, 0.03, "indep")
DESIGNS: tuple[tuple[str, Trials], ...] = (
    ("fixed 3", FIXED),
    ("fixed 4", Trials(repeats=4, max_repeats=4)),
    ("fixed 6", Trials(repeats=6, max_repeats=6)),
    ("fixed 8", Trials(repeats=8, max_repeats=8)),
    ("sequential 3-6", SEQUENTIAL),
    ("sequential 3-8", Trials(repeats=3, sequential=True, max_repeats=8)),
    ("sequential 4-8", Trials(repeats=4, sequential=True, max_repeats=8)),
)
LONG_TRIALS = (1000,)  # requests per trial, with the fixed 3 and sequential 3-6 designs


def designs_table(reps: int, seed: int, say: Callable[[str], None]) -> str:
    rows: list[tuple[str, dict[str, float]]] = []
    res = run_designs(DESIGN_SCENARIO, [t for _, t in DESIGNS], EFFECTS, reps, seed)
    rows += [(name, summary(*(res[(i, e)] for e in EFFECTS))) for i, (name, _) in enumerate(DESIGNS)]
    say("# designs: done")
    for n in LONG_TRIALS:
        sc = Scenario(DESIGN_SCENARIO.metric, DESIGN_SCENARIO.sigma, DESIGN_SCENARIO.tau, DESIGN_SCENARIO.drift, n)
        res = run_designs(sc, (FIXED, SEQUENTIAL), EFFECTS, reps, seed + n)
        rows += [
            (f"{name}, {n} req", summary(*(res[(i, e)] for e in EFFECTS)))
            for i, name in enumerate(("fixed 3", "sequential 3-6"))
        ]
        say(f"# designs, {n} requests: done")
    lines = [
        f"| design ({DESIGN_SCENARIO.label}) | A/A false | coverage | power 5% | power 10% | A/A CI (median bounds) "
        "| pairs/side at 10% mean / median |",
        "|" + "---|" * 7,
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {_pct(r['aa_false'])} | {_pct(r['coverage'])} | {_pct(r['power5'])} | {_pct(r['power10'])} "
            f"| [{_spct(r['aa_low'])}, {_spct(r['aa_high'])}] | {r['pairs10_mean']:.2f} / {r['pairs10_median']:g} |"
        )
    return "\n".join(lines)


def aa_precision(reps: int, seed: int) -> float:
    """A/A false-decision rate of the fixed design (3 pairs) at sigma 0.3, tau 3 %, to a Monte Carlo error that 300
    decisions cannot give (+-2.5 points): the per-trial P95s vectorised, each replicate's interval from
    `paired_effect`, the function `decide_step` takes its interval from."""
    rng = np.random.default_rng(seed)
    sc, n_pairs = DESIGN_SCENARIO, FIXED.repeats
    p95 = np.empty((reps, n_pairs, 2))
    for start in range(0, reps, 2000):  # in blocks: 2,000 x 6 trials x 200 requests at a time
        stop = min(reps, start + 2000)
        draws = np.exp(sc.sigma * rng.standard_normal((stop - start, n_pairs, 2, sc.requests)))
        p95[start:stop] = np.percentile(draws, 95, axis=3)
    p95 *= drift_factors(rng, reps, n_pairs, sc)
    false = 0
    for r in range(reps):
        e = paired_effect(p95[r, :, 0], p95[r, :, 1], FIXED.confidence)
        false += bool(e.low is not None and e.high is not None and (e.low > 0 or e.high < 0))
    return false / reps


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=300, help="simulated decisions per scenario and effect")
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--only", default=None, help="run the scenarios whose label contains this text")
    parser.add_argument(
        "--designs", action="store_true", help="instead: what it takes at sigma 0.3, tau 3 %% (pairs, trial length)"
    )
    parser.add_argument(
        "--aa-precision",
        type=int,
        default=0,
        metavar="N",
        help="instead: the fixed design's A/A rate over N replicates",
    )
    parser.add_argument("--verdicts", action="store_true", help="instead: the verdict table (benchmarks/verdicts.py)")
    args, rest = parser.parse_known_args(argv)
    t0 = time.perf_counter()
    if args.verdicts:
        from benchmarks import verdicts

        verdicts.main([*rest, "--reps", str(args.reps)] if "--reps" in (argv or []) else rest, say)
        return
    if args.aa_precision:
        rate = aa_precision(args.aa_precision, args.seed)
        say(f"A/A false decisions, fixed 3 pairs, {DESIGN_SCENARIO.label}: {rate:.2%} of {args.aa_precision}")
        say(f"{time.perf_counter() - t0:.0f} s")
        return
    if args.designs:
        say(designs_table(args.reps, args.seed, say))
        say(f"\n{args.reps} decisions per design and effect; {time.perf_counter() - t0:.0f} s")
        return
    chosen = [sc for sc in SCENARIOS if args.only is None or args.only in sc.label]
    results = []
    for i, sc in enumerate(chosen):
        results.append((sc, run_scenario(sc, args.reps, args.seed + i)))
        say(f"# {sc.label}: done at {time.perf_counter() - t0:.0f} s")
    say(table(results))
    say(f"\n{args.reps} decisions per scenario and effect; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
