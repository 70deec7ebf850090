"""How often a step's verdict is right: simulated trials with known effects, decided by `decide_step` itself.

Each simulated decision is one step of a tuning run: A (the reference) and B (the candidate) each get 3 trials of
200 requests (sequential mode: up to 6, stopping as `tuning/run.py` does, after each added pair, once the verdict is
no longer inconclusive), interleaved as pairs, with the playbook's default goals (objective min_effect 2 %,
confidence 95 %). The trials are reduced to `TrialSample`s and passed to `decide_step`, so the figures are those of
the code a run uses, not of a re-implementation.

Per request, latency is lognormal with log-SD sigma. Per trial, a drift factor exp(tau * z) scales every request of
that trial (an engine start, the machine's state that minute); with `shared` drift the two trials of a pair share
half of its variance (they ran minutes apart), with `indep` drift none. The candidate's effect scales its latencies
(a 10 % gain: P95 x 0.9), so the true relative change of P95 is known exactly.

Reported per scenario (300 decisions each by default):
- A/A false: share of A/A decisions whose objective interval excludes 0 (kept, or rejected as worse): the error
  rate the confidence promises to hold at 5 %. "Rejected: any gain below the 2 % minimum effect" is right in A/A.
- coverage: share of intervals (A/A and both effects) that contain the true change.
- power 5 % / 10 %: share of decisions that keep a candidate whose true gain is 5 % / 10 %.
- trials/side: pairs used (fixed: always 3; sequential: mean / median at the 10 % effect and in A/A).

    PYTHONPATH=. .venv/bin/python benchmarks/decisions.py              # the table (about 2 minutes on 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/decisions.py --reps 100   # quicker, noisier
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llmplay.archive.model import KEPT
from llmplay.spec import Goals, Objective, Trials
from llmplay.tuning.decide import TrialSample, decide_step

FIXED = Trials(repeats=3, interleave=True, sequential=False, max_repeats=3)
SEQUENTIAL = Trials(repeats=3, interleave=True, sequential=True, max_repeats=6)
MAX_PAIRS = SEQUENTIAL.max_repeats
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

    @property
    def label(self) -> str:
        name = {"ttft.p95": "P95", "itl.p99": "ITL P99", "throughput.output_tok_s": "throughput"}[self.metric]
        long = f", {self.requests} req" if self.requests != 200 else ""
        drift = f" {self.drift}" if self.tau else ""
        return f"{name} s{self.sigma:g} t{self.tau:.0%}{drift}{long}"

    @property
    def lower_is_better(self) -> bool:
        return not self.metric.startswith("throughput")


def drift_factors(rng: np.random.Generator, reps: int, sc: Scenario) -> np.ndarray:
    """(reps, pairs, 2) multiplicative factors, one per trial."""
    share = 0.5 if sc.drift == "shared" else 0.0
    common = rng.standard_normal((reps, MAX_PAIRS, 1))
    own = rng.standard_normal((reps, MAX_PAIRS, 2))
    return np.exp(sc.tau * (np.sqrt(share) * common + np.sqrt(1 - share) * own))


def side_scale(sc: Scenario, effect: float) -> np.ndarray:
    """Latency scale of (A, B): a gain of `effect` makes B's latencies x(1 - effect), or its throughput x(1 + effect)
    by shortening its trials' duration."""
    return np.array([1.0, (1 - effect) if sc.lower_is_better else 1 / (1 + effect)])


def true_change(sc: Scenario, effect: float) -> float:
    return -effect if sc.lower_is_better else effect


def make_samples(rng: np.random.Generator, sc: Scenario, effect: float, drift: np.ndarray) -> list[list[list]]:
    """samples[rep][pair] = (A's TrialSample, B's TrialSample)."""
    reps = drift.shape[0]
    scale = drift * side_scale(sc, effect)  # (reps, pairs, 2)
    out: list[list[list]] = []
    for r in range(reps):
        pairs = []
        for p in range(MAX_PAIRS):
            pair = []
            for s in range(2):
                pair.append(_trial(rng, sc, float(scale[r, p, s]), p))
            pairs.append(pair)
        out.append(pairs)
    return out


def _trial(rng: np.random.Generator, sc: Scenario, scale: float, repeat: int) -> TrialSample:
    n = sc.requests
    if sc.metric == "ttft.p95":
        values = {"ttft": 0.1 * scale * np.exp(sc.sigma * rng.standard_normal(n))}
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
    width: float


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
    return Outcome(d.verdict == KEPT, lo > 0 or hi < 0, lo <= truth <= hi, n, hi - lo)


def run_scenario(sc: Scenario, reps: int, seed: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    direction = "minimize" if sc.lower_is_better else "maximize"
    goals = Goals(objective=Objective(direction, sc.metric, 0.02))
    rows: dict[str, dict[str, float]] = {}
    results: dict[tuple[str, float], list[Outcome]] = {}
    for effect in EFFECTS:
        drift = drift_factors(rng, reps, sc)
        samples = make_samples(rng, sc, effect, drift)
        truth = true_change(sc, effect)
        for mode, trials in (("fixed", FIXED), ("sequential", SEQUENTIAL)):
            # Both modes decide the same simulated trials (common random numbers between the rows).
            results[(mode, effect)] = [decide(pairs, goals, trials, truth) for pairs in samples]
    for mode in ("fixed", "sequential"):
        aa, e5, e10 = (results[(mode, e)] for e in EFFECTS)
        every = aa + e5 + e10
        rows[mode] = {
            "aa_false": float(np.mean([o.excludes_zero for o in aa])),
            "coverage": float(np.mean([o.covers for o in every])),
            "power5": float(np.mean([o.kept for o in e5])),
            "power10": float(np.mean([o.kept for o in e10])),
            "aa_width": float(np.median([o.width for o in aa])),
            "pairs10_mean": float(np.mean([o.pairs for o in e10])),
            "pairs10_median": float(np.median([o.pairs for o in e10])),
            "pairsaa_mean": float(np.mean([o.pairs for o in aa])),
            "pairsaa_median": float(np.median([o.pairs for o in aa])),
        }
    return rows


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
)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def table(results: Sequence[tuple[Scenario, dict[str, dict[str, float]]]]) -> str:
    head = (
        "| scenario | mode | A/A false | coverage | power 5% | power 10% | A/A CI width (median) "
        "| pairs/side at 10% mean / median | pairs/side A/A mean / median |"
    )
    lines = [head, "|" + "---|" * 9]
    for sc, rows in results:
        for mode, r in rows.items():
            lines.append(
                f"| {sc.label} | {mode} | {_pct(r['aa_false'])} | {_pct(r['coverage'])} | {_pct(r['power5'])} "
                f"| {_pct(r['power10'])} | {_pct(r['aa_width'])} "
                f"| {r['pairs10_mean']:.2f} / {r['pairs10_median']:g} | {r['pairsaa_mean']:.2f} / {r['pairsaa_median']:g} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=300, help="simulated decisions per scenario and effect")
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--only", default=None, help="run the scenarios whose label contains this text")
    args = parser.parse_args(argv)
    chosen = [sc for sc in SCENARIOS if args.only is None or args.only in sc.label]
    t0 = time.perf_counter()
    results = []
    for i, sc in enumerate(chosen):
        results.append((sc, run_scenario(sc, args.reps, args.seed + i)))
        say(f"# {sc.label}: done at {time.perf_counter() - t0:.0f} s")
    say(table(results))
    say(f"\n{args.reps} decisions per scenario and effect; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
