"""How well a value search finds a knob's best value: simulated response curves with known optima, raced by
`stats.search.ValueSearch` itself, driven round by round exactly as the runner drives it.

Each simulated search is one `search:` step. The incumbent (the configuration so far) has objective 1; value i of
the knob has exp(mu_i), a throughput to maximise with min_effect 2 % and confidence 95 %. Every trial's objective is
exp(mu + drift_round + sigma * z): sigma is the per-trial log noise (a pair's log ratio has sd sigma * sqrt 2), and
drift_round (sd 0.05) moves every trial of a round alike, as a machine's state that minute would; pairing cancels
it. Each trial costs one engine unit.

Shapes (mu over the knob's ordered values, index i of k):
- unimodal: 0.10 - c (i - p)^2, the peak p at 7/10 of the range (k 5: -0.35 -0.10 0.05 0.10 0.05)
- flat: every value equals the incumbent (any winner is a false keep)
- plateau: -0.10 rising to +0.10 by the middle, then flat with fixed wobbles of +-0.01 (any top value is right)

Reported per scenario:
- right: share of searches whose declared winner is the true best or within min_effect of it (flat: share with
  no winner, the procedure's right answer)
- false kept: share of flat searches that declare a winner
- bias: mean of (reported gain - true gain) of the winner, in points, with its standard error, for the gain the
  result reports (re-estimated from the confirmation pairs), and beside it (sel. bias) for the gain over every pair
  of the winner, race included: what selection does to an estimate
- kept: share of searches that declare a winner at all
- engine/grid: engine time relative to a grid giving every value and the incumbent as many trials as the search
  gave its most-measured value (the same trials per value); /max grid: relative to a grid of max_rounds rounds
  (plus the confirmation pairs when there is a winner)

With guards (`--guards`): the objective is P95 TTFT (minimised, min_effect 2 %) and output tokens/s is a guard with
a 25 % tolerance; each value moves both (log noise sigma each, the round's drift shared). On "guard-broken" the
TTFT gain grows with the knob (-4 -8 -12 -17 -25 %) while the last value costs 35 % of the throughput, so the best
value that holds its guards is the fourth (-17 %, throughput -10 %); "two values" is a race of -17 % (guards
holding) against -18 % with throughput -27 %. Reported per row:
- right: the declared winner holds its guards (true change within tolerance) and is within min_effect of the best
  value that does
- rejected while shown: searches that end "rejected" although some value was shown to beat the incumbent with its
  guards holding (its decision kept it at some look); not kept while shown: those that end without a winner at all

    PYTHONPATH=. .venv/bin/python benchmarks/search.py              # the table (250 searches a row, 2.5 min CPU)
    PYTHONPATH=. .venv/bin/python benchmarks/search.py --reps 100   # quicker, noisier
    PYTHONPATH=. .venv/bin/python benchmarks/search.py --guards     # the guard rows (1,000 searches at sigma .05)
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np

from llmplay.archive.model import KEPT, REJECTED
from llmplay.spec import Goals, Guard, Objective
from llmplay.stats.decide import TrialSample
from llmplay.stats.search import SearchDesign, ValueSearch

GOALS = Goals(objective=Objective("maximize", "throughput.output_tok_s", 0.02))
DESIGN = SearchDesign(first_rounds=3, max_rounds=12, confirm_rounds=3, confidence=0.95)
ROUND_DRIFT = 0.05
GUARDED = Goals(
    objective=Objective("minimize", "ttft.p95", 0.02), guards=(Guard("throughput.output_tok_s", 0.25, "maximize"),)
)
# name: (P95 TTFT change, throughput change) per value, in the knob's order
GUARDED_CURVES = {
    "guard-broken": ((-0.04, -0.08, -0.12, -0.17, -0.25), (0.0, -0.03, -0.06, -0.10, -0.35)),
    "two values": ((-0.17, -0.18), (0.0, -0.27)),
}


def curve(shape: str, k: int) -> np.ndarray:
    i = np.arange(k, dtype=float)
    if shape == "unimodal":
        # The same curve over the knob's range whatever k: 0.05 per (range / 4) squared away from the peak.
        peak = round(0.7 * (k - 1))
        return 0.10 - 0.05 * ((i - peak) * 4 / (k - 1)) ** 2
    if shape == "flat":
        return np.zeros(k)
    if shape == "plateau":
        mid = (k - 1) // 2
        rise = -0.10 + 0.20 * np.minimum(1.0, i / mid)
        wobble = 0.01 * np.sin(2.0 * i)
        return rise + np.where(i >= mid, wobble, 0.0)
    raise ValueError(shape)


def _trial(level: float) -> TrialSample:
    return TrialSample(duration_s=1.0, values={"output_tokens": np.array([level])}, n_requests=1, n_errors=0)


@dataclass
class Outcome:
    winner: int | None
    gain: float | None  # reported (re-estimated)
    gain_all: float | None  # over every pair of the winner
    engine_ratio: float
    engine_ratio_max: float
    rounds: int


def one_search(
    mu: np.ndarray, sigma: float, rng: np.random.Generator, seed: int, design: SearchDesign = DESIGN
) -> Outcome:
    values = [int(8 * 2**i) if len(mu) <= 5 else int(8 * (i + 1)) for i in range(len(mu))]
    search = ValueSearch(values, GOALS, design, ordered=True, seed=seed)
    while (rnd := search.next_round()) is not None:
        drift = ROUND_DRIFT * rng.standard_normal()
        for arm in rnd.arms:
            m = 0.0 if arm.incumbent else float(mu[values.index(arm.value)])  # type: ignore[arg-type]
            search.record(rnd.number, arm, _trial(1000.0 * math.exp(m + drift + sigma * rng.standard_normal())))
    result = search.result()
    ratios = (result.engine_s / result.grid_engine_s, result.engine_s / result.grid_max_rounds_engine_s)
    if result.verdict != KEPT or result.winner is None:
        return Outcome(None, None, None, *ratios, result.rounds)
    index = values.index(result.winner.value)  # type: ignore[arg-type]
    outcome = next(v for v in result.values if v.value == result.winner.value)
    return Outcome(
        index,
        result.gain.rel if result.gain else None,
        outcome.effect.rel_change if outcome.effect else None,
        *ratios,
        result.rounds,
    )


def scenario(shape: str, k: int, sigma: float, reps: int, seed: int, design: SearchDesign = DESIGN) -> dict[str, float]:
    mu = curve(shape, k)
    rng = np.random.default_rng(seed)
    outs = [one_search(mu, sigma, rng, seed * 100_000 + r, design) for r in range(reps)]
    best = float(mu.max())
    won = [o for o in outs if o.winner is not None]
    if shape == "flat":
        right = sum(o.winner is None for o in outs) / reps
    else:
        right = sum(o.winner is not None and best - mu[o.winner] <= GOALS.objective.min_effect for o in outs) / reps
    bias = [o.gain - math.expm1(mu[o.winner]) for o in won if o.gain is not None and o.winner is not None]
    bias_all = [o.gain_all - math.expm1(mu[o.winner]) for o in won if o.gain_all is not None and o.winner is not None]
    return {
        "right": right,
        "kept": len(won) / reps,
        "bias": float(np.mean(bias)) if bias else math.nan,
        "bias_se": float(np.std(bias) / math.sqrt(len(bias))) if len(bias) > 1 else math.nan,
        "bias_all": float(np.mean(bias_all)) if bias_all else math.nan,
        "engine": float(np.mean([o.engine_ratio for o in outs])),
        "engine_max": float(np.mean([o.engine_ratio_max for o in outs])),
        "rounds": float(np.mean([o.rounds for o in outs])),
    }


def _guarded_trial(ttft: float, tok_s: float) -> TrialSample:
    return TrialSample(
        duration_s=1.0, values={"ttft": np.array([ttft]), "output_tokens": np.array([tok_s])}, n_requests=1, n_errors=0
    )


@dataclass
class GuardedOutcome:
    winner: int | None
    rejected: bool
    shown: bool  # some value was shown to beat the incumbent with its guards holding
    rounds: int


def one_guarded_search(
    objective: np.ndarray, guard: np.ndarray, sigma: float, rng: np.random.Generator, seed: int
) -> GuardedOutcome:
    values = list(range(1, len(objective) + 1))
    search = ValueSearch(values, GUARDED, DESIGN, ordered=True, seed=seed)
    while (rnd := search.next_round()) is not None:
        drift = ROUND_DRIFT * rng.standard_normal()
        for arm in rnd.arms:
            i = None if arm.incumbent else values.index(arm.value)  # type: ignore[arg-type]
            obj, tok = (0.0, 0.0) if i is None else (float(objective[i]), float(guard[i]))
            noise = sigma * rng.standard_normal(2)
            search.record(
                rnd.number, arm, _guarded_trial(0.1 * math.exp(obj + drift + noise[0]), 1000 * math.exp(tok + noise[1]))
            )
    result = search.result()
    shown = any(v.beat_at_round is not None for v in result.values)
    winner = values.index(result.winner.value) if result.verdict == KEPT and result.winner else None  # type: ignore[arg-type]
    return GuardedOutcome(winner, result.verdict == REJECTED, shown, result.rounds)


def guarded_scenario(name: str, sigma: float, reps: int, seed: int) -> dict[str, float]:
    change, guard_change = GUARDED_CURVES[name]
    objective, guard = np.log1p(np.array(change)), np.log1p(np.array(guard_change))
    tolerance = GUARDED.guards[0].tolerance
    holds = guard >= math.log1p(-tolerance)
    best = float(objective[holds].min())
    right = holds & (objective - best <= GUARDED.objective.min_effect)
    rng = np.random.default_rng(seed)
    outs = [one_guarded_search(objective, guard, sigma, rng, seed * 100_000 + r) for r in range(reps)]
    return {
        "right": sum(o.winner is not None and bool(right[o.winner]) for o in outs) / reps,
        "kept": sum(o.winner is not None for o in outs) / reps,
        "rejected_shown": sum(o.rejected and o.shown for o in outs),
        "lost_shown": sum(o.winner is None and o.shown for o in outs),
        "rejected": sum(o.rejected for o in outs) / reps,
        "rounds": float(np.mean([o.rounds for o in outs])),
    }


def guarded_table(reps: int, seed: int) -> None:
    print(
        f"with a throughput guard (25 %): objective P95 TTFT, min_effect {GUARDED.objective.min_effect:.0%}; "
        f"{reps} searches a row at sigma <= .05, {max(reps // 4, 1)} at .15"
    )
    print(
        f"{'curve':<13} {'sigma':>5} {'searches':>8} {'right':>6} {'kept':>6} {'rejected':>8} "
        f"{'rejected while shown':>20} {'not kept while shown':>20} {'rounds':>6}"
    )
    started = time.perf_counter()
    for name, sigma in (("guard-broken", 0.05), ("guard-broken", 0.15), ("two values", 0.02), ("two values", 0.05)):
        n = reps if sigma <= 0.05 else max(reps // 4, 1)
        row = guarded_scenario(name, sigma, n, seed + int(sigma * 100) + len(name))
        print(
            f"{name:<13} {sigma:>5.2f} {n:>8} {row['right']:>6.1%} {row['kept']:>6.1%} {row['rejected']:>8.1%} "
            f"{int(row['rejected_shown']):>20} {int(row['lost_shown']):>20} {row['rounds']:>6.1f}",
            flush=True,
        )
    print(f"({time.perf_counter() - started:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=250)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--guards", action="store_true", help="only the rows with a guard")
    parser.add_argument("--guard-reps", type=int, default=1000, help="searches a guard row at sigma <= .05")
    args = parser.parse_args()
    if args.guards:
        guarded_table(args.guard_reps, args.seed)
        return
    d = DESIGN
    print(
        f"value search: {args.reps} searches per row; rounds {d.first_rounds}..{d.max_rounds} + {d.confirm_rounds} "
        f"confirmation pairs; min_effect {GOALS.objective.min_effect:.0%}, confidence {d.confidence:.0%}; "
        f"round drift sd {ROUND_DRIFT}"
    )
    print(
        f"{'shape':<9} {'k':>3} {'sigma':>6} {'right':>6} {'kept':>6} {'bias (pts)':>15} {'sel. bias':>9} "
        f"{'engine/grid':>11} {'/max grid':>9} {'rounds':>6}"
    )
    started = time.perf_counter()
    for k in (5, 10):
        for sigma in (0.05, 0.15):
            for shape in ("unimodal", "flat", "plateau"):
                row = scenario(shape, k, sigma, args.reps, args.seed + k * 10 + int(sigma * 100))
                bias = f"{row['bias'] * 100:+.1f} ± {row['bias_se'] * 100:.1f}" if not math.isnan(row["bias"]) else "—"
                sel = f"{row['bias_all'] * 100:+.1f}" if not math.isnan(row["bias_all"]) else "—"
                print(
                    f"{shape:<9} {k:>3} {sigma:>6.2f} {row['right']:>6.1%} {row['kept']:>6.1%} {bias:>15} {sel:>9} "
                    f"{row['engine']:>11.0%} {row['engine_max']:>9.0%} {row['rounds']:>6.1f}",
                    flush=True,
                )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
