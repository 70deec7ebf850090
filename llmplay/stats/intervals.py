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

A run's steps share the engine, the host and the workload, so the noise of their per-pair log ratios is often
alike. `moderate` borrows it (empirical Bayes, as limma moderates a gene's variance toward all genes'): each step's
variance is shrunk toward the run's pooled one with prior degrees of freedom estimated from how much the steps'
variances differ, and never claims more degrees of freedom than all the steps have together. It is opt-in
(trials.pool_noise): three pairs cannot show that one step's noise is larger than the others', and a step whose noise
is three times the rest's is then judged too narrowly (benchmarks/decisions.py measures both sides).

A rate of requests (errors.rate) is a proportion whose baseline is often 0: its change is an absolute difference of
two proportions over the pooled requests, with Newcombe's hybrid score interval (`newcombe_difference`).

Sequential mode looks at the data after every added pair, and each look is another chance of a false decision.
`sequential_levels` calibrates one nominal level per look (an O'Brien-Fleming-shaped boundary for the t statistic)
so the chance of any false decision over all looks stays at 1 - confidence; the stopping check and the final
verdict use the level of the same look, so they cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# The t and normal quantiles and tails straight from scipy.special: what scipy.stats' t and norm compute them with,
# without importing scipy.stats, most of a second of `llmplay history`.
from scipy import special

PAIRED_LOG = "paired t on log ratios"
PAIRED_DIFF = "paired t on differences"
WELCH_LOG = "Welch t on logs"
WELCH_DIFF = "Welch t on differences"


@dataclass(frozen=True)
class Noise:
    """The spread of one comparison's units: the sample variance of its per-pair log ratios and its degrees of
    freedom (pairs - 1)."""

    var: float
    df: int


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
    noise: Noise | None = None  # its own units' spread (paired, log scale), what later steps may borrow


# Past this a log ratio's bound is no longer a number expm1 can return; a bound that far out means "anything".
_MAX_LOG = 700.0


def _rel(log_ratio: float) -> float:
    """exp(x) - 1 for a bound on the log scale; a sequential look's extreme level with few units can put it past
    what a float holds, where the bound is capped instead of raising."""
    return math.expm1(min(log_ratio, _MAX_LOG))


@lru_cache(maxsize=4096)  # a history over thousands of runs asks for the same few (level, df) again and again
def _t(level: float, df: float) -> float:
    return float(special.stdtrit(df, 0.5 + level / 2))


def _positive(*arrays: np.ndarray) -> bool:
    return all(arr.size and bool(np.all(np.isfinite(arr))) and bool(np.all(arr > 0)) for arr in arrays)


def paired_effect(
    a: Sequence[float],
    b: Sequence[float],
    level: float,
    borrow: Sequence[Noise] = (),
    history: Noise | None = None,
) -> Effect:
    """Trial r of `a` paired with trial r of `b`; with `borrow` (other steps' noise), the variance moderated; with
    `history` (earlier comparable runs' noise), the variance pooled with it and the run's steps while the run's own
    noise agrees with it (`with_history`), else its own alone."""
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
        own = Noise(float(d.var(ddof=1)), n - 1)
        var, df, method = float(own.var), float(own.df), PAIRED_LOG
        if history is not None:
            var, df, method = with_history(own, borrow, history)
        elif borrow:
            var, df = moderate(own, borrow)
            method = f"{PAIRED_LOG}, variance moderated over {len(borrow) + 1} steps (df {df:.3g})"
        se = math.sqrt(var / n)
        half = _t(level, df) * se
        return Effect(math.expm1(mean), _rel(mean - half), _rel(mean + half), n, method, level, se, df, noise=own)
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
        return Effect(math.expm1(diff), _rel(diff - half), _rel(diff + half), units, WELCH_LOG, level, se, df)
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


# ------------------------------------------------------------------------------------------- borrowed noise
def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x, by Newton's method from limma's starting point (Smyth 2004)."""
    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1.0 - tri / x) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def moderate(own: Noise, others: Sequence[Noise]) -> tuple[float, float]:
    """(variance, degrees of freedom) of `own` moderated toward the steps' common variance.

    The prior (s0², d0) is fitted to all the steps' log variances by moments (limma's fitFDist): when they differ
    no more than sampling explains, d0 is infinite and every step takes the pooled variance; when they differ, d0
    is small and a step keeps mostly its own. The degrees of freedom never exceed all the steps' together."""
    noises = [n for n in (*others, own) if n.df >= 1 and n.var > 0]
    if own not in noises or len(noises) < 2:
        return own.var, float(own.df)
    var = np.array([n.var for n in noises])
    df = np.array([float(n.df) for n in noises])
    e = np.log(var) - special.digamma(df / 2) + np.log(df / 2)
    e_mean = float(e.mean())
    e_var = float(((e - e_mean) ** 2).sum() / (len(e) - 1) - special.polygamma(1, df / 2).mean())
    pooled_df = float(df.sum())
    if e_var <= 0:
        return float(math.exp(e_mean)), pooled_df
    d0 = 2.0 * _trigamma_inverse(e_var)
    s0 = math.exp(e_mean + float(special.digamma(d0 / 2)) - math.log(d0 / 2))
    return (d0 * s0 + own.df * own.var) / (d0 + own.df), min(d0 + own.df, pooled_df)


# The one-sided level at which a run's own paired noise is called larger than the history's: liberal, because
# believing a history quieter than today narrows every interval, while refusing a right one only costs power.
HISTORY_AGREEMENT_ALPHA = 0.10


def pooled_noise(noises: Sequence[Noise]) -> Noise | None:
    """Several estimates of one variance pooled by their degrees of freedom."""
    usable = [n for n in noises if n.df >= 1]
    df = sum(n.df for n in usable)
    return Noise(sum(n.var * n.df for n in usable) / df, df) if df else None


def history_agrees(run: Noise, history: Noise) -> bool:
    """Whether the run's own noise (its steps pooled) is within what the history's allows: one-sided F test at
    HISTORY_AGREEMENT_ALPHA (a run noisier than the history beyond chance disagrees)."""
    if history.var <= 0 or run.df < 1:
        return run.var <= 0
    return float(special.fdtrc(run.df, history.df, run.var / history.var)) >= HISTORY_AGREEMENT_ALPHA


def with_history(own: Noise, run: Sequence[Noise], history: Noise) -> tuple[float, float, str]:
    """(variance, degrees of freedom, method) of a step's paired interval with the history's noise: pooled with the
    run's steps and its own when the run's noise (its steps and this one pooled) agrees with the history's; its own
    alone when it does not, with the method saying why."""
    mine = pooled_noise([*run, own]) or own
    if not history_agrees(mine, history):
        why = f"{PAIRED_LOG}; history noise not used: this run's is larger beyond chance (F test)"
        return own.var, float(own.df), why
    both = pooled_noise([history, *run, own]) or own
    method = f"{PAIRED_LOG}, variance pooled with the history's ({history.df} df) and this run's (df {both.df})"
    return both.var, float(both.df), method


# ------------------------------------------------------------------------------------------- rates of requests
def _wilson(count: int, total: int, z: float) -> tuple[float, float]:
    p = count / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(
    count_a: int, total_a: int, count_b: int, total_b: int, level: float
) -> tuple[float, float, float] | None:
    """p_b - p_a with Newcombe's hybrid score interval (his method 10): Wilson intervals of each side combined. It
    stays inside [-1, 1] and is not degenerate at 0 errors on both sides, where a Wald interval is [0, 0]. None
    when a side has no requests."""
    if total_a <= 0 or total_b <= 0:
        return None
    z = _z(level)
    pa, pb = count_a / total_a, count_b / total_b
    la, ua = _wilson(count_a, total_a, z)
    lb, ub = _wilson(count_b, total_b, z)
    diff = pb - pa
    low = diff - math.sqrt((pb - lb) ** 2 + (ua - pa) ** 2)
    high = diff + math.sqrt((ub - pb) ** 2 + (pa - la) ** 2)
    return diff, low, high


def newcombe_p_above(count_a: int, total_a: int, count_b: int, total_b: int, limit: float) -> float:
    """One-sided p-value that p_b - p_a exceeds `limit`: half the complement of the highest level whose interval's
    lower bound is still above it (1 when the point is not above it)."""
    point = newcombe_difference(count_a, total_a, count_b, total_b, 0.5)
    if point is None or point[0] <= limit:
        return 1.0
    lo, hi = 1e-9, 1.0 - 1e-12  # levels: at `lo` the bound is the point (> limit)
    for _ in range(60):
        mid = (lo + hi) / 2
        bounds = newcombe_difference(count_a, total_a, count_b, total_b, mid)
        if bounds is not None and bounds[1] > limit:
            lo = mid
        else:
            hi = mid
    return (1.0 - lo) / 2


def t_p_beyond(effect: Effect, limit: float, worse_up: bool) -> float:
    """One-sided p-value that the true change is past `limit` (a relative change) in the worse direction (up when
    `worse_up`), from the interval's own t: how surprising the estimate is if the change is exactly at the limit."""
    if effect.rel is None or effect.se is None or effect.df is None:
        return 1.0
    if effect.log_scale:
        if effect.rel <= -1 or limit <= -1:
            return 1.0
        gap = math.log1p(effect.rel) - math.log1p(limit)
    else:
        gap = effect.rel - limit
    if not worse_up:
        gap = -gap
    if effect.se == 0:
        return 0.0 if gap > 0 else 1.0
    return float(special.stdtr(effect.df, -(gap / effect.se)))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Which of the hypotheses Holm's step-down rejects at family-wise error `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


# ------------------------------------------------------------------------------------------- sequential looks
_CALIBRATION_PATHS = 40_000


@lru_cache(maxsize=64)
def sequential_levels(confidence: float, first: int, last: int) -> tuple[float, ...]:
    """The nominal level of each look n = first, first+1, ..., last (units), so that with no effect the chance that
    any look's interval excludes zero is 1 - confidence.

    The boundary has O'Brien and Fleming's shape (z_n = c * sqrt(last / n)): strict at the first looks, close to the
    fixed-design level at the last. A constant (Pocock) level spends as much of the error rate at three pairs as at
    six, where most real effects are decided, and loses about a tenth of the power there (benchmarks/RESULTS.md,
    "Verdicts"); clear effects still stop early. c is calibrated by simulating the looks' t statistics of normal
    pair differences (their law under no effect does not depend on the spread), with a fixed seed: the same design
    always gets the same levels."""
    if last <= first:
        return (confidence,)
    alpha = 1.0 - confidence
    rng = np.random.default_rng(20261203)
    draws = rng.standard_normal((_CALIBRATION_PATHS, last))
    looks = np.arange(first, last + 1)
    csum, csq = np.cumsum(draws, axis=1), np.cumsum(draws**2, axis=1)
    n = looks.astype(float)
    mean = csum[:, looks - 1] / n
    var = (csq[:, looks - 1] - n * mean**2) / (n - 1)
    t_abs = np.abs(mean) / np.sqrt(np.maximum(var, 1e-300) / n)
    p_values = 2 * special.stdtr(looks - 1, -t_abs)
    shape = np.sqrt(last / n)

    def nominal(c: float) -> np.ndarray:
        return np.asarray(2 * special.ndtr(-(c * shape)))

    low, high = 0.0, 10.0  # the crossing rate falls as c rises
    for _ in range(60):
        c = (low + high) / 2
        if float((p_values <= nominal(c)).any(axis=1).mean()) > alpha:
            low = c
        else:
            high = c
    return tuple(float(1.0 - a) for a in nominal(high))


def sequential_level(confidence: float, first: int, last: int, units: int) -> float:
    """The level of the look at `units` (clipped to the design's first and last looks)."""
    levels = sequential_levels(confidence, first, last)
    return levels[min(max(units, first), last) - first] if last > first else confidence


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


# ------------------------------------------------------------------------------- one proportion, one mean
def wilson_interval(count: int, total: int, level: float) -> tuple[float, float]:
    """Wilson score interval of the proportion count / total at `level`: sane at 0% and 100%, where the normal
    interval collapses to a point. total must be positive."""
    return _wilson(count, total, _z(level))


@lru_cache(maxsize=64)
def _z(level: float) -> float:
    return float(special.ndtri(0.5 + level / 2))


def t_mean_interval(values: Sequence[float] | np.ndarray, level: float) -> tuple[float, float]:
    """Student-t interval of the mean of `values` at `level` (each value one experimental unit); the point itself
    when fewer than two values or no spread leave nothing to estimate it from."""
    # Plain floats, not numpy: a history asks this of a few trials thousands of times, where numpy's per-call
    # overhead is most of the cost.
    xs = [float(v) for v in values]
    n = len(xs)
    mean = math.fsum(xs) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    if sd == 0.0:
        return mean, mean
    half = _t(level, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half
