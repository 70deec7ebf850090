"""What a comparison can detect: the power of the t interval the decisions use, the smallest change it shows at a
given power, and the units (pairs, trials) a change needs.

Every decision here shows a change when an interval's bound clears a margin (0 for "better", a tolerance for "worse
beyond it"). With a unit's standard deviation `sd` (a pair's log ratio, or a trial's log value), n units and the
interval's degrees of freedom `df`, the estimate's standard error is sd / sqrt(n), and the bound clears a margin
`gap` away from the truth with probability P(T' > t_crit) where T' is noncentral t with noncentrality gap / se.
That probability is the power (`t_power`); `detectable` inverts it for the gap, `units_for` for n. The degrees of
freedom are the design's: a step's own pairs n - 1, more when its noise is borrowed, the history's when it comes
from earlier runs; the known-variance figure (`z_power`, df infinite) is what no estimate of the noise can beat.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import lru_cache

from scipy import special

from llmplay.catalog import label_of
from llmplay.spec import Goals, Guard, Trials
from llmplay.stats.intervals import Effect, Noise, sequential_level

POWER = 0.8  # the power planning and the "could still hide" sentences are stated at


@lru_cache(maxsize=4096)
def _t_quantile(p: float, df: float) -> float:
    return float(special.stdtrit(df, p)) if math.isfinite(df) else float(special.ndtri(p))


def t_power(gap: float, se: float, df: float, level: float) -> float:
    """The chance that a two-sided `level` t interval with standard error `se` and `df` degrees of freedom shows a
    true change lying `gap` beyond a margin (on the interval's own scale): its bound on that side clears the margin.
    One tail of the two-sided interval counts, as a step's decisions do."""
    if se <= 0:
        return 1.0 if gap > 0 else 0.0
    crit = _t_quantile(0.5 + level / 2, df)
    if not math.isfinite(df):
        return float(special.ndtr(gap / se - crit))
    return float(1.0 - special.nctdtr(df, gap / se, crit))


def z_power(gap: float, se: float, level: float) -> float:
    """The same with the noise known (no estimate of it): the ceiling any test with estimated noise stays under."""
    return t_power(gap, se, math.inf, level)


def detectable(se: float, df: float, level: float, power: float = POWER) -> float:
    """The smallest gap beyond the margin (on the interval's scale) that `power` of intervals show."""
    if se <= 0:
        return 0.0
    low, high = 0.0, se * 50.0
    for _ in range(60):
        mid = (low + high) / 2
        if t_power(mid, se, df, level) >= power:
            high = mid
        else:
            low = mid
    return high


# The most pairs a plan names: past it an effect is "out of reach" (the budget usually binds far earlier).
MAX_PAIRS = 2000


def _own(n: int) -> float:
    return float(n - 1)


def units_for(
    gap: float,
    sd_unit: float,
    level: float,
    *,
    df_of: Callable[[int], float] = _own,
    power: float = POWER,
    cap: int | None = None,
) -> int | None:
    """The fewest units (pairs, or trials a side) whose interval shows a change `gap` beyond its margin with
    `power`; `df_of(n)` the degrees of freedom n units give (n - 1 for a step's own pairs). None past `cap`."""
    if gap <= 0:
        return None
    if sd_unit <= 0:
        return 2
    for n in range(2, (cap or MAX_PAIRS) + 1):
        if t_power(gap, sd_unit / math.sqrt(n), float(df_of(n)), level) >= power:
            return n
    return None


def nearest_units(gap: float, sd_unit: float, level: float, df_of: Callable[[int], float], least: int) -> int | None:
    """The units (at least `least`) whose power is nearest POWER: the fewest that reach it, or one fewer when that
    one falls short by less than the fewest overshoot. Whole pairs make power jump at small sizes (3 pairs 78 %, 4
    pairs 96 % for 20 % at sigma .05): the nearer one is the honest plan for "80 %"."""
    n = units_for(gap, sd_unit, level, df_of=df_of)
    if n is None or n - 1 < max(least, 2):
        return n
    over = t_power(gap, sd_unit / math.sqrt(n), float(df_of(n)), level) - POWER
    under = POWER - t_power(gap, sd_unit / math.sqrt(n - 1), float(df_of(n - 1)), level)
    return n - 1 if under < over else n


def relative(log_gap: float) -> float:
    """A gap on the log scale as a relative change (0.095 -> +10%)."""
    return math.expm1(log_gap)


def hidden_effect(effect: Effect, min_effect: float, lower_better: bool, confidence: float) -> str | None:
    """What an undecided comparison could still hide, in words: "an effect smaller than 14% could not be told from
    noise with these 5 pairs; 12 pairs would show 10%" (both at POWER, the first at this look's level, the pairs at
    the confidence with the noise as measured). None without a log-scale interval to read the noise from."""
    if effect.se is None or effect.df is None or effect.units < 2 or not effect.log_scale or effect.se <= 0:
        return None
    gap = detectable(effect.se, effect.df, effect.level)
    smallest = -math.expm1(-gap) if lower_better else math.expm1(gap)  # in the good direction
    unit = "pairs" if effect.method.startswith("paired") else "trials a side"
    extra = max(0.0, effect.df - (effect.units - 1))  # degrees of freedom borrowed beyond its own units

    def df_of(n: int) -> float:
        return n - 1 + extra

    target = -math.log1p(-min_effect) if lower_better else math.log1p(min_effect)
    need = units_for(target, effect.se * math.sqrt(effect.units), confidence, df_of=df_of) if min_effect > 0 else None
    text = f"an effect smaller than {smallest:.0%} could not be told from noise with these {effect.units} {unit}"
    if need is not None and need > effect.units:
        text += f"; {need} {unit} would show {min_effect:.0%}"
    elif need is None and min_effect > 0:
        text += f"; more than 500 {unit} would be needed to show {min_effect:.0%}"
    return text


def _plan_df(trials: Trials, noise: Noise) -> Callable[[int], float]:
    """Degrees of freedom n pairs give under the playbook's noise source: its own, or with the borrowed noise's."""
    borrowed = float(noise.df) if trials.noise in ("run", "history") else 0.0

    def df_of(n: int) -> float:
        return n - 1 + borrowed

    return df_of


def _toward(tolerance: float, lower_better: bool) -> float:
    """A relative tolerance in the worse direction as a log-scale distance from no change."""
    return math.log1p(tolerance) if lower_better else -math.log1p(-min(tolerance, 0.999))


def plan_text(goals: Goals, trials: Trials, noise: Mapping[str, Noise], source: str) -> str:
    """The power line of a planned step: the smallest effect on the objective its pairs show 80% of the time, the
    pairs min_effect needs, and the pairs each guard needs to be shown within its tolerance (unchanged), from
    `noise` (per metric, the paired log-ratio variance known before the step, from `source`)."""
    pairs = trials.max_repeats if trials.sequential else trials.repeats
    planned = f"{trials.repeats}..{pairs}" if trials.sequential and pairs > trials.repeats else str(pairs)
    objective = goals.objective
    own = noise.get(objective.metric)
    label = label_of(objective.metric)
    if own is None or own.var <= 0:
        return f"power: no noise of {label} measured yet (this step's pairs measure it)"
    df_of = _plan_df(trials, own)
    sd = math.sqrt(own.var)
    smallest = detectable(sd / math.sqrt(pairs), df_of(pairs), trials.confidence)
    lower = objective.direction == "minimize"
    shown = -math.expm1(-smallest) if lower else math.expm1(smallest)
    parts = [f"with {planned} pair(s) an effect on {label} smaller than {shown:.0%} could not be told from noise"]
    need = units_for(_toward(objective.min_effect, not lower), sd, trials.confidence, df_of=df_of)
    parts.append(
        f"{need} pair(s) would show {objective.min_effect:.0%}"
        if need
        else f"{objective.min_effect:.0%} is out of reach"
    )
    for guard, k in _guard_pairs(goals, trials, noise, trials.confidence):
        parts.append(
            f"guard {label_of(guard.metric)} within {guard.tolerance:.0%} if it moved half of it: "
            f"{k if k else f'> {MAX_PAIRS}'} pair(s)"
        )
    return f"power ({POWER:.0%}, noise from {source}): " + "; ".join(parts)


# Guards are planned as if they moved this share of their tolerance: a step that changes nothing in them needs
# fewer pairs, but one whose throughput truly moved half its tolerance is the common case the plan must cover
# (benchmarks/RESULTS.md, "Verdicts": at sigma .15 such a step is kept 2-8% of the time with 3-6 pairs).
GUARD_PLANNING_SHARE = 0.5


def _guard_pairs(
    goals: Goals, trials: Trials, noise: Mapping[str, Noise], level: float
) -> list[tuple[Guard, int | None]]:
    out = []
    for guard in goals.guards:
        g = noise.get(guard.metric)
        if g is None or g.var <= 0 or guard.absolute:
            continue
        lower = guard.direction == "minimize"
        gap = _toward(guard.tolerance, lower) - _toward(guard.tolerance * GUARD_PLANNING_SHARE, lower)
        out.append((guard, units_for(gap, math.sqrt(g.var), level, df_of=_plan_df(trials, g))))
    return out


def auto_pairs(goals: Goals, trials: Trials, noise: Mapping[str, Noise], trial_s: float) -> tuple[int, str]:
    """max_repeats: auto for one step: the pairs that show min_effect and each guard within its tolerance (moved
    half of it) with POWER at the sequential boundary's last look, capped by trials.budget_s of engine time (two
    trials a pair of `trial_s` each); with the sentence the step prints. The playbook's max_repeats while no noise
    is known yet."""
    first = max(trials.repeats, 2)
    objective = goals.objective
    own = noise.get(objective.metric)
    if own is None or own.var <= 0:
        return trials.max_repeats, f"max_repeats auto: no noise known yet, {trials.max_repeats} pairs at most"
    lower = objective.direction == "minimize"
    gap = _toward(objective.min_effect, not lower)
    n = first
    for _ in range(4):  # the last look's level depends on how many looks there are: settle it
        level = sequential_level(trials.confidence, first, n, n) if n > first else trials.confidence
        needs = [nearest_units(gap, math.sqrt(own.var), level, _plan_df(trials, own), first)]
        needs += [k for _, k in _guard_pairs(goals, trials, noise, level)]
        want = max((k for k in needs if k is not None), default=first) if None not in needs else MAX_PAIRS
        if want <= n:
            break
        n = max(want, first)
    afford = int(trials.budget_s // (2 * trial_s)) if trials.budget_s > 0 and trial_s > 0 else None
    if afford is not None and afford < n:
        size = max(afford, first)
        return size, (
            f"max_repeats auto: {n} pairs would give {POWER:.0%} power; the {trials.budget_s / 60:g} min budget "
            f"affords {size} ({trial_s:.0f} s a trial)"
        )
    level = sequential_level(trials.confidence, first, n, n) if n > first else trials.confidence
    reached = t_power(gap, math.sqrt(own.var / n), _plan_df(trials, own)(n), level)
    return n, f"max_repeats auto: {n} pairs for {reached:.0%} power at the {objective.min_effect:.0%} minimum effect"
