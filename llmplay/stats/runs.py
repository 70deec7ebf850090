"""One run's figure against earlier runs of the same configuration: the noise a run-level comparison carries, taken
from the history of comparable runs rather than from the few trials of the two runs compared.

Each run gives a handful of trials; its figure is their mean on the log scale. Two kinds of noise move it:
- within a run, trial to trial (sigma^2): pooled over every earlier run, with their trials' degrees of freedom;
- between runs, day to day (tau^2): what the means of runs of one engine image spread beyond sigma^2 / n, by
  moments (0 when they spread no more than their trials explain; assumed 0, and said so, when no image has two
  runs). Engine images differ in level, so levels are compared within an image only; their noise is pooled.
A new run is compared with the mean of the baseline runs (the reference and the runs of its image): var = tau^2 +
sigma^2 / n_new for tonight's mean, (tau^2 + sigma^2 / n_i) / K for the baseline's, with Satterthwaite's degrees
of freedom. With many earlier runs a single trial tonight is judged against sigma and tau known to many degrees of
freedom; without them the comparison is Welch's over the two runs' trials, as `compare` makes it.

The history's noise is an assumption about tonight (its engine may be noisier): `own_noise_agrees` checks it against
tonight's own spread when tonight has two trials or more, and a caller does not use the history when they disagree
beyond chance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import special

from llmplay.stats.intervals import Effect

HISTORY_T = "t against comparable runs"
# The one-sided level at which tonight's own spread is called larger than the history's.
AGREEMENT_LEVEL = 0.05


@dataclass(frozen=True)
class RunNoise:
    """The noise of a run's figure (log scale) from earlier runs of the same configuration."""

    within_var: float  # trial to trial (sigma^2), pooled within runs
    within_df: int
    between_var: float  # run to run beyond what the trials explain (tau^2, by moments; 0 when not estimable)
    between_df: int  # runs of one engine image beyond the first, summed over images; 0: tau^2 assumed 0
    runs: int


def _logs(values: Sequence[float]) -> list[float] | None:
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        return None
    return [math.log(v) for v in values]


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _var(xs: Sequence[float]) -> float:
    centre = _mean(xs)
    return math.fsum((x - centre) ** 2 for x in xs) / (len(xs) - 1)


def run_noise(groups: Sequence[Sequence[Sequence[float]]]) -> RunNoise | None:
    """The noise of earlier runs' figures: `groups` holds the runs of each engine image (each run: its trials'
    values). Trial-to-trial noise pools every run with two trials or more; run-to-run noise is the spread of the
    runs' means within an image beyond their trials' share (levels differ between images, noise need not). None
    without a run of two trials, or with a value a log cannot take."""
    per_group: list[list[list[float]]] = []
    for runs in groups:
        logs = [_logs(r) for r in runs if r]
        if any(x is None for x in logs):
            return None
        per_group.append([x for x in logs if x is not None])
    every = [x for g in per_group for x in g]
    df = sum(len(x) - 1 for x in every)
    if df == 0:
        return None
    sigma2 = math.fsum(_var(x) * (len(x) - 1) for x in every if len(x) > 1) / df
    excess, between_df = 0.0, 0
    for runs in per_group:
        if len(runs) > 1:
            means = [_mean(x) for x in runs]
            share = sigma2 * _mean([1.0 / len(x) for x in runs])
            excess += (len(runs) - 1) * (_var(means) - share)
            between_df += len(runs) - 1
    tau2 = max(0.0, excess / between_df) if between_df else 0.0
    return RunNoise(sigma2, df, tau2, between_df, len(every))


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of variance estimates (each: its contribution and its degrees of freedom)."""
    total = math.fsum(v for v, _ in parts)
    denominator = math.fsum(v * v / df for v, df in parts if df > 0 and v > 0)
    return total * total / denominator if denominator > 0 else math.inf


def _t(level: float, df: float) -> float:
    return float(special.stdtrit(df, 0.5 + level / 2)) if math.isfinite(df) else float(special.ndtri(0.5 + level / 2))


def _interval(centre: float, parts: Sequence[tuple[float, float]], level: float) -> tuple[float, float, float]:
    """(half-width, standard error, degrees of freedom) of a log-scale estimate whose variance is `parts`."""
    var = math.fsum(v for v, _ in parts)
    df = _satterthwaite(parts)
    se = math.sqrt(var)
    return _t(level, df) * se, se, df


def against_history(
    noise: RunNoise, baseline: Sequence[Sequence[float]], newest: Sequence[float], level: float
) -> Effect | None:
    """Tonight's figure against the mean of the `baseline` runs (the reference's image), with the history's noise:
    the relative change and its interval at `level`. None when a value cannot take a log."""
    logs = _logs(newest)
    runs = [x for x in (_logs(r) for r in baseline if r) if x is not None]
    if logs is None or not runs:
        return None
    k = len(runs)
    diff = _mean(logs) - _mean([_mean(x) for x in runs])
    trials_share = _mean([1.0 / len(x) for x in runs]) / k + 1.0 / len(logs)
    parts = [(noise.within_var * trials_share, float(noise.within_df))]
    if noise.between_var > 0:
        parts.append((noise.between_var * (1.0 + 1.0 / k), float(noise.between_df)))
    half, se, df = _interval(diff, parts, level)
    spread = "estimated" if noise.between_df else "assumed 0 (no image with two runs)"
    method = (
        f"{HISTORY_T}: {k} baseline run(s), noise from {noise.runs} run(s) ({noise.within_df} trial df, "
        f"run-to-run spread {spread})"
    )
    return Effect(math.expm1(diff), math.expm1(diff - half), math.expm1(diff + half), len(logs), method, level, se, df)


def level_interval(noise: RunNoise | None, values: Sequence[float], level: float) -> tuple[float, float, float] | None:
    """A run's own level (geometric mean of its trials) with its interval at `level`: from the history's noise
    (tau^2 + sigma^2 / n: the level a run of this configuration shows on any day) when given, else from its own
    trials (None with fewer than two)."""
    logs = _logs(values)
    if logs is None:
        return None
    n, centre = len(logs), _mean(logs)
    if noise is not None:
        parts = [(noise.within_var / n, float(noise.within_df))]
        if noise.between_var > 0:
            parts.append((noise.between_var, float(noise.between_df)))
    elif n >= 2:
        parts = [(_var(logs) / n, n - 1.0)]
    else:
        return None
    half, _, _ = _interval(centre, parts, level)
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def own_noise_agrees(noise: RunNoise, values: Sequence[float]) -> bool | None:
    """Whether tonight's own trial-to-trial spread is within what the history's allows (one-sided F test at
    AGREEMENT_LEVEL: a spread larger than chance explains disagrees). None with fewer than two trials: nothing to
    check it with."""
    logs = _logs(values)
    if logs is None or len(logs) < 2 or noise.within_var <= 0:
        return None
    p_larger = float(special.fdtrc(len(logs) - 1, noise.within_df, _var(logs) / noise.within_var))
    return p_larger >= AGREEMENT_LEVEL
