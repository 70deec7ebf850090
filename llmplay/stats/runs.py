"""One run's figure against earlier runs of the same configuration: the noise a run-level comparison carries, taken
from the history of comparable runs rather than from the few trials of the two runs compared.

Each run gives a handful of trials; its figure is their mean on the log scale. Two kinds of noise move it:
- within a run, trial to trial (sigma^2): pooled over every earlier run, with their trials' degrees of freedom;
- between runs, day to day (tau^2): what the runs' means spread beyond sigma^2 / n, estimated by moments from the
  runs' means (0 when they spread no more than their trials explain, or with a single run: then assumed 0, and
  said so).
A new run is compared with the mean of the earlier runs: var = tau^2 + sigma^2 / n_new for tonight's mean and the
spread of the earlier runs' means over K for theirs, with Satterthwaite's degrees of freedom. With many earlier runs
a single trial tonight is judged against sigma and tau known to many degrees of freedom; with none the comparison is
Welch's over the two runs' trials, as `compare` makes it.

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

    within_var: float  # trial to trial, pooled within runs
    within_df: int
    runs: int
    run_means: tuple[float, ...]
    mean_inverse_trials: float  # mean over the runs of 1 / trials

    @property
    def between_var(self) -> float:
        """Day to day beyond what the trials explain (tau^2, by moments); 0 with fewer than two runs."""
        if self.runs < 2:
            return 0.0
        return max(0.0, self.spread_of_means - self.within_var * self.mean_inverse_trials)

    @property
    def spread_of_means(self) -> float:
        m = self.run_means
        centre = math.fsum(m) / len(m)
        return math.fsum((x - centre) ** 2 for x in m) / (len(m) - 1) if len(m) > 1 else 0.0


def _logs(values: Sequence[float]) -> list[float] | None:
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        return None
    return [math.log(v) for v in values]


def run_noise(runs: Sequence[Sequence[float]]) -> RunNoise | None:
    """The noise of the earlier runs' figures (each run: its trials' values); None without two trials in a run
    (no trial-to-trial spread to pool) or with a value a log cannot take."""
    logs = [_logs(r) for r in runs if r]
    if not logs or any(x is None for x in logs):
        return None
    per_run = [x for x in logs if x is not None]
    squares, df = 0.0, 0
    for x in per_run:
        if len(x) > 1:
            centre = math.fsum(x) / len(x)
            squares += math.fsum((v - centre) ** 2 for v in x)
            df += len(x) - 1
    if df == 0:
        return None
    means = tuple(math.fsum(x) / len(x) for x in per_run)
    inverse = math.fsum(1.0 / len(x) for x in per_run) / len(per_run)
    return RunNoise(squares / df, df, len(per_run), means, inverse)


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of variance estimates (each: its contribution and its degrees of freedom)."""
    total = math.fsum(v for v, _ in parts)
    denominator = math.fsum(v * v / df for v, df in parts if df > 0 and v > 0)
    return total * total / denominator if denominator > 0 else math.inf


def _t(level: float, df: float) -> float:
    return float(special.stdtrit(df, 0.5 + level / 2)) if math.isfinite(df) else float(special.ndtri(0.5 + level / 2))


def against_history(noise: RunNoise, newest: Sequence[float], level: float) -> Effect | None:
    """Tonight's figure against the mean of the earlier runs, with the history's noise: the relative change and its
    interval at `level`. None when tonight has no value a log can take."""
    logs = _logs(newest)
    if logs is None:
        return None
    n = len(logs)
    diff = math.fsum(logs) / n - math.fsum(noise.run_means) / noise.runs
    within = noise.within_var / n
    if noise.runs >= 2:
        tau2 = noise.between_var
        # The earlier runs' mean carries their spread over K; tonight's, tau^2 and its own trials' noise.
        parts = [(noise.spread_of_means / noise.runs, noise.runs - 1.0), (within, float(noise.within_df))]
        if tau2 > 0:
            parts.append((tau2, noise.runs - 1.0))
    else:
        parts = [(noise.within_var * (noise.mean_inverse_trials + 1.0 / n), float(noise.within_df))]
    var = math.fsum(v for v, _ in parts)
    df = _satterthwaite(parts)
    se = math.sqrt(var)
    half = _t(level, df) * se
    method = f"{HISTORY_T} ({noise.runs} run(s), {noise.within_df} trial df, between-run spread {'estimated' if noise.runs >= 2 else 'assumed 0'})"
    return Effect(math.expm1(diff), math.expm1(diff - half), math.expm1(diff + half), n, method, level, se, df)


def level_interval(noise: RunNoise | None, values: Sequence[float], level: float) -> tuple[float, float, float] | None:
    """A run's own level (geometric mean of its trials) with its interval at `level`: from the history's noise
    (tau^2 + sigma^2 / n) when given, else from its own trials (None with fewer than two)."""
    logs = _logs(values)
    if logs is None:
        return None
    n = len(logs)
    centre = math.fsum(logs) / n
    if noise is not None:
        parts = [(noise.within_var / n, float(noise.within_df))]
        if noise.between_var > 0:
            parts.append((noise.between_var, noise.runs - 1.0))
        var, df = math.fsum(v for v, _ in parts), _satterthwaite(parts)
    elif n >= 2:
        var = math.fsum((x - centre) ** 2 for x in logs) / (n - 1) / n
        df = n - 1.0
    else:
        return None
    half = _t(level, df) * math.sqrt(var)
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def own_noise_agrees(noise: RunNoise, values: Sequence[float]) -> bool | None:
    """Whether tonight's own trial-to-trial spread is within what the history's allows (one-sided F test at
    AGREEMENT_LEVEL: a spread larger than chance explains disagrees). None with fewer than two trials: nothing to
    check it with."""
    logs = _logs(values)
    if logs is None or len(logs) < 2 or noise.within_var <= 0:
        return None
    centre = math.fsum(logs) / len(logs)
    own = math.fsum((x - centre) ** 2 for x in logs) / (len(logs) - 1)
    p_larger = float(special.fdtrc(len(logs) - 1, noise.within_df, own / noise.within_var))
    return p_larger >= AGREEMENT_LEVEL
