"""Intervals for a relative change, with the trial (or the A/B pair of trials) as the experimental unit.

Requests inside one trial share its engine start, its page cache and the machine's state at that minute, so they
are not independent draws: a percentile of one trial is one observation. The intervals here rest on one number per
trial (the metric computed over that trial's requests) and on Student's t, whose coverage is right for a handful of
units where a bootstrap over three trials cannot be (it sees at most ten distinct resamples).

- Paired (the runner interleaves A and B, so trial r of each side ran side by side, with the same request
  sequence): the per-pair log ratio log(b_r / a_r), a one-sample t interval on its mean, back to a relative change.
  Drift that moves both trials of a pair cancels in the ratio.
- Unpaired (two archived runs, or trials run in blocks): Welch's t on the logs (unequal variances).
- A metric that can be 0 or negative (an error rate, a queue wait) cannot take a log: the difference of means,
  relative to the baseline's mean.

Sequential mode looks at the data after every added pair, and each look is another chance of a false decision.
`sequential_level` calibrates one nominal level used at every look (a Pocock boundary for the t statistic) so the
chance of any false decision over all looks stays at 1 - confidence; the stopping check and the final verdict use
the same level, so they cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

PAIRED_LOG = "paired t on log ratios"
PAIRED_DIFF = "paired t on differences"
WELCH_LOG = "Welch t on logs"
WELCH_DIFF = "Welch t on differences"


@dataclass(frozen=True)
class Effect:
    """A relative change (b vs a, b - a over |a|) with its interval at `level`, from `units` experimental units."""

    rel: float | None
    low: float | None
    high: float | None
    units: int  # pairs (paired) or the smaller side's trials (unpaired)
    method: str
    level: float  # the nominal two-sided level of this interval (lower than the confidence when sequential)
    # The standard error and degrees of freedom the interval used, on its own scale, for sample-size advice.
    se: float | None = None
    df: float | None = None
    log_scale: bool = True


def _t(level: float, df: float) -> float:
    return float(stats.t.ppf(0.5 + level / 2, df))


def _positive(*arrays: np.ndarray) -> bool:
    return all(arr.size and bool(np.all(np.isfinite(arr))) and bool(np.all(arr > 0)) for arr in arrays)


def paired_effect(a: Sequence[float], b: Sequence[float], level: float) -> Effect:
    """Trial r of `a` paired with trial r of `b`."""
    va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = int(min(va.size, vb.size))
    va, vb = va[:n], vb[:n]
    if n == 0:
        return Effect(None, None, None, 0, PAIRED_LOG, level)
    if _positive(va, vb):
        d = np.log(vb / va)
        mean = float(d.mean())
        if n < 2:
            return Effect(math.expm1(mean), None, None, n, PAIRED_LOG, level)
        se = float(d.std(ddof=1)) / math.sqrt(n)
        half = _t(level, n - 1) * se
        return Effect(
            math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half), n, PAIRED_LOG, level, se, n - 1
        )
    return _difference(vb - va, float(va.mean()), n, PAIRED_DIFF, level, n - 1)


def welch_effect(a: Sequence[float], b: Sequence[float], level: float) -> Effect:
    """Independent trials on each side."""
    va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    units = int(min(va.size, vb.size))
    if units == 0:
        return Effect(None, None, None, 0, WELCH_LOG, level)
    log = _positive(va, vb)
    xa, xb = (np.log(va), np.log(vb)) if log else (va, vb)
    diff = float(xb.mean() - xa.mean())
    if units < 2:
        rel = math.expm1(diff) if log else _relative(diff, float(va.mean()))
        return Effect(rel, None, None, units, WELCH_LOG if log else WELCH_DIFF, level, log_scale=log)
    qa, qb = float(xa.var(ddof=1)) / xa.size, float(xb.var(ddof=1)) / xb.size
    se = math.sqrt(qa + qb)
    # Welch-Satterthwaite; with no spread on either side the interval is the point itself.
    df = (qa + qb) ** 2 / (qa**2 / (xa.size - 1) + qb**2 / (xb.size - 1)) if se > 0 else float(xa.size + xb.size - 2)
    if log:
        half = _t(level, df) * se
        return Effect(
            math.expm1(diff), math.expm1(diff - half), math.expm1(diff + half), units, WELCH_LOG, level, se, df
        )
    return _scaled(diff, se, float(va.mean()), units, WELCH_DIFF, level, df)


def _relative(diff: float, base: float) -> float | None:
    if base != 0:
        return diff / abs(base)
    return 0.0 if diff == 0 else None


def _difference(d: np.ndarray, base: float, n: int, method: str, level: float, df: float) -> Effect:
    mean = float(d.mean())
    se = float(d.std(ddof=1)) / math.sqrt(n) if n >= 2 else None
    if se is None:
        return Effect(_relative(mean, base), None, None, n, method, level, log_scale=False)
    return _scaled(mean, se, base, n, method, level, df)


def _scaled(diff: float, se: float, base: float, units: int, method: str, level: float, df: float) -> Effect:
    """A difference and its interval, relative to |base| (the baseline's mean, taken as known)."""
    if base == 0:
        if diff == 0 and se == 0:
            return Effect(0.0, 0.0, 0.0, units, method, level, 0.0, df, log_scale=False)
        return Effect(None, None, None, units, method, level, log_scale=False)
    half = _t(level, df) * se
    scale = abs(base)
    return Effect(
        diff / scale, (diff - half) / scale, (diff + half) / scale, units, method, level, se / scale, df, False
    )


# ------------------------------------------------------------------------------------------- sequential looks
_CALIBRATION_PATHS = 40_000


@lru_cache(maxsize=64)
def sequential_level(confidence: float, first: int, last: int) -> float:
    """The nominal level to use at every look n = first, first+1, ..., last (units) so that, with no effect, the
    chance that any look's interval excludes zero is 1 - confidence (a Pocock boundary for the t statistic).

    Calibrated by simulating the looks of normal pair differences (the t statistic's law under no effect does not
    depend on their spread), with a fixed seed: the same design always gets the same level."""
    if last <= first:
        return confidence
    alpha = 1.0 - confidence
    rng = np.random.default_rng(20261203)
    draws = rng.standard_normal((_CALIBRATION_PATHS, last))
    looks = np.arange(first, last + 1)
    csum, csq = np.cumsum(draws, axis=1), np.cumsum(draws**2, axis=1)
    n = looks.astype(float)
    mean = csum[:, looks - 1] / n
    var = (csq[:, looks - 1] - n * mean**2) / (n - 1)
    t_abs = np.abs(mean) / np.sqrt(np.maximum(var, 1e-300) / n)
    # Each path's most extreme look in p-value terms: the smallest nominal alpha at which it would cross.
    p_min = (2 * stats.t.sf(t_abs, looks - 1)).min(axis=1)
    return float(1.0 - np.quantile(p_min, alpha))


def units_to_reach(effect: Effect, target: float, cap: int) -> int | None:
    """More units until the interval's half-width (on its own scale, at its level) shrinks to the gap between the
    point estimate and `target`, the relative change whose side decides; None when that takes more than `cap` more
    units or cannot happen. Assumes the spread per unit stays what it is; the half-width shrinks like t / sqrt(n)."""
    if effect.rel is None or effect.se is None or effect.df is None or effect.units < 2:
        return None
    if effect.log_scale:
        if effect.rel <= -1 or target <= -1:
            return None
        reach = abs(math.log1p(target) - math.log1p(effect.rel))
    else:
        reach = abs(target - effect.rel)
    if reach <= 0:
        return None
    if effect.se == 0:
        return 1
    sd_unit = effect.se * math.sqrt(effect.units)
    for more in range(1, cap + 1):
        if _t(effect.level, effect.df + more) * sd_unit / math.sqrt(effect.units + more) <= reach:
            return more
    return None
