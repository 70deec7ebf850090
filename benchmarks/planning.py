"""Steps sized by `trials.max_repeats: auto` (stats.power.auto_pairs): do they reach the power they were sized for?

Each simulated step is sequential, as the runner runs it: 3 pairs, then one more per inconclusive look up to the
size auto chose from the noise known before the step (a history of 30 degrees of freedom at the true noise, its
estimate drawn per step in the guard row; the grid rows take the size the true noise gives, one a row, since each
size needs its own sequential boundary). The objective's true change is exactly min_effect (P95 TTFT down by it), the per-trial
log-SD sigma. Reported: the share of steps whose objective interval shows the improvement (excludes 0 on the good
side) when the step stops, against the 80% the size was chosen for; 75-85% is the target.

The grid (sigma .05/.15/.3 x min_effect 5/10/20%) is simulated vectorised with the decision's own rule (the paired t
interval on log ratios at each look's level from stats.intervals.sequential_levels; a look stops the step when it
keeps, or rejects: the interval below 0 or below min_effect), since sizes reach hundreds of pairs; the row of a
-30% gain with a guard that moved half its tolerance runs through `decide_step` itself, look by look.

    PYTHONPATH=. .venv/bin/python benchmarks/planning.py    # about 7 minutes on 2 loaded cores (the guard row most)
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import special

from llmplay.spec import Goals, Guard, Objective, Trials
from llmplay.stats.decide import TrialSample, decide_step
from llmplay.stats.intervals import Noise, sequential_levels
from llmplay.stats.power import auto_pairs

FIRST = 3
HISTORY_DF = 30


def _size(goals: Goals, sigma: float, guard_sigma: float, rng: np.random.Generator | None) -> int:
    """The size auto chooses from a history of HISTORY_DF degrees of freedom (its estimate drawn with `rng`, else
    exactly the true noise)."""
    trials = Trials(repeats=FIRST, sequential=True, max_repeats=6, max_repeats_auto=True)
    noise = {}
    for metric, s in (("ttft.p95", sigma), ("throughput.output_tok_s", guard_sigma)):
        draw = float(rng.chisquare(HISTORY_DF)) / HISTORY_DF if rng is not None else 1.0
        noise[metric] = Noise(2 * s * s * draw, HISTORY_DF)
    return auto_pairs(goals, trials, noise, 0.0)[0]


def grid_row(sigma: float, min_effect: float, reps: int, seed: int) -> tuple[float, float, float]:
    """(share shown, mean size chosen, mean pairs used), vectorised over steps of one size at a time."""
    rng = np.random.default_rng(seed)
    goals = Goals(objective=Objective("minimize", "ttft.p95", min_effect))
    # One size a row, from the history's expected noise: each distinct size needs its own sequential boundary.
    sizes = np.full(reps, _size(goals, sigma, sigma, None))
    shown, used = np.zeros(reps, dtype=bool), np.zeros(reps)
    true = math.log1p(-min_effect)
    gain_needed = -math.log1p(-min_effect)  # the improvement min_effect is, on the log scale
    for size in np.unique(sizes):
        idx = np.flatnonzero(sizes == size)
        d = true + sigma * math.sqrt(2) * rng.standard_normal((idx.size, int(size)))
        levels = sequential_levels(0.95, FIRST, int(size)) if size > FIRST else (0.95,)
        open_ = np.ones(idx.size, dtype=bool)
        for k, n in enumerate(range(FIRST, int(size) + 1)):
            x = d[:, :n]
            mean, sd = x.mean(axis=1), x.std(axis=1, ddof=1)
            half = float(special.stdtrit(n - 1, 0.5 + levels[k] / 2)) * sd / math.sqrt(n)
            good_low, good_high = -(mean + half), -(mean - half)  # the improvement's interval
            kept = (good_low > 0) & (-mean >= gain_needed)
            rejected = (good_high < 0) | (good_high < gain_needed)
            stop = open_ & (kept | rejected | (n == size))
            shown[idx[stop]] = good_low[stop] > 0
            used[idx[stop]] = n
            open_ &= ~stop
    return float(shown.mean()), float(sizes.mean()), float(used.mean())


def guard_row(reps: int, seed: int, cap: int) -> tuple[float, float, float]:
    """-30% P95 TTFT at sigma .15 with throughput 7.5% lower against a 15% guard: (kept, size, pairs used)."""
    rng = np.random.default_rng(seed)
    goals = Goals(
        objective=Objective("minimize", "ttft.p95", 0.10), guards=(Guard("throughput.output_tok_s", 0.15, "maximize"),)
    )
    kept, sizes, used = 0, [], []
    for _ in range(reps):
        size = min(_size(goals, 0.15, 0.15, rng), cap)
        trials = Trials(repeats=FIRST, sequential=True, max_repeats=size)
        z = 0.15 * rng.standard_normal((size, 2, 2))
        a = [_sample(0.1 * math.exp(z[r, 0, 0]), 1000 * math.exp(z[r, 0, 1]), r) for r in range(size)]
        b = [_sample(0.07 * math.exp(z[r, 1, 0]), 925 * math.exp(z[r, 1, 1]), r) for r in range(size)]
        n = FIRST
        while True:
            verdict = decide_step(a[:n], b[:n], goals, trials).verdict
            if verdict != "inconclusive" or n >= size:
                break
            n += 1
        kept += verdict == "kept"
        sizes.append(size)
        used.append(n)
    return kept / reps, float(np.mean(sizes)), float(np.mean(used))


def _sample(ttft: float, tok_s: float, repeat: int) -> TrialSample:
    return TrialSample(
        duration_s=1.0,
        values={"ttft": np.array([ttft]), "output_tokens": np.array([tok_s])},
        n_requests=1,
        n_errors=0,
        repeat=repeat,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=2000, help="steps a grid row")
    parser.add_argument("--guard-reps", type=int, default=100, help="steps of the guard row (through decide_step)")
    parser.add_argument("--seed", type=int, default=38)
    args = parser.parse_args()
    started = time.perf_counter()
    print(
        f"max_repeats: auto, sized from a history of {HISTORY_DF} df; true change = min_effect; {args.reps} steps a row"
    )
    print(f"{'sigma':>5} {'min effect':>10} {'shown':>6} {'size':>6} {'pairs used':>10}")
    for sigma in (0.05, 0.15, 0.3):
        for min_effect in (0.05, 0.10, 0.20):
            shown, size, used = grid_row(sigma, min_effect, args.reps, args.seed + int(sigma * 100 + min_effect * 10))
            print(f"{sigma:>5.2f} {min_effect:>10.0%} {shown:>6.1%} {size:>6.1f} {used:>10.1f}", flush=True)
    kept, size, used = guard_row(args.guard_reps, args.seed, 500)
    print(
        f"-30% P95 TTFT, throughput guard 15% moved 7.5%, sigma .15 (decide_step, {args.guard_reps} steps): kept "
        f"{kept:.1%}, size {size:.1f}, pairs used {used:.1f}"
    )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
