"""The guard rule, a non-inferiority claim that steps and `compare` share, and how a step reads its guards.

A guard holds when the interval's worse bound is within its tolerance, is beyond it when the interval's better bound
is past it (the regression is shown), and anything between is unsettled. A step's guard rejections are one family:
Holm at the one-sided level of its intervals, so guards cannot multiply the chance that a null step is rejected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmplay.catalog import fmt_full, fmt_pct, label_of
from llmplay.outcomes import MetricDelta
from llmplay.spec import Guard
from llmplay.stats.comparison import describe_delta, fmt_points, rate_counts
from llmplay.stats.intervals import Effect, holm, newcombe_p_above, t_p_beyond, units_to_reach
from llmplay.stats.samples import TrialSample

# What a guard's comparison shows: the candidate is within its tolerance (the CI's worse bound is), beyond it (the
# CI's better bound is past it: the regression is shown), or neither yet.
HOLDS, BEYOND, UNSETTLED = "holds", "beyond", "unsettled"


def _worse(
    point: float | None, low: float | None, high: float | None, lower_is_better: bool
) -> tuple[float, float | None, float | None]:
    """(point, better bound, worse bound) of a change in the bad direction: positive = worse; the bounds are None
    without an interval."""
    sign = 1.0 if lower_is_better else -1.0
    worse_point = sign * point  # type: ignore[operator]
    if low is None or high is None:
        return worse_point, None, None
    bounds = sorted((sign * low, sign * high))
    return worse_point, bounds[0], bounds[1]


def worse_by(delta: MetricDelta, lower_is_better: bool) -> tuple[float, float | None, float | None]:
    """The relative change in the bad direction (needs one)."""
    return _worse(delta.rel_change, delta.ci_low, delta.ci_high, lower_is_better)


def worse_in_points(delta: MetricDelta, lower_is_better: bool) -> tuple[float, float | None, float | None]:
    """A rate's change in points in the bad direction (needs one)."""
    return _worse(delta.points, delta.points_low, delta.points_high, lower_is_better)


def guard_outcome(delta: MetricDelta, lower_is_better: bool, tolerance: float, absolute: bool = False) -> str | None:
    """The guard rule, a non-inferiority claim: it holds when the CI's worse bound is within `tolerance`, and is
    beyond it only when the CI's better bound is past it (the regression is shown); anything between is unsettled,
    as is a change without an interval. `absolute`: a rate's tolerance in points, judged on its count interval.
    From a baseline of exactly 0 a relative tolerance cannot apply: any worsening is beyond. None when a side is
    not measured."""
    a, b = delta.baseline, delta.candidate
    if a is None or b is None:
        return None
    if absolute and delta.points is not None:
        _, better, worse = worse_in_points(delta, lower_is_better)
    elif delta.rel_change is None:
        return BEYOND if ((b > a) if lower_is_better else (b < a)) else HOLDS
    else:
        _, better, worse = worse_by(delta, lower_is_better)
    if better is not None and better > tolerance:
        return BEYOND
    return HOLDS if worse is not None and worse <= tolerance else UNSETTLED


def regressed_beyond(delta: MetricDelta, lower_is_better: bool, tolerance: float, absolute: bool = False) -> bool:
    """A regression by the guard rule (guard_outcome): the interval's better bound is worse than `tolerance`."""
    return guard_outcome(delta, lower_is_better, tolerance, absolute) == BEYOND


def settle_text(more: int | None, cap: int, what: str) -> str:
    if more is None:
        return f"not decidable within {cap} more trial(s) per side"
    return f"about {more} more trial(s) per side would {what} it"


def _points_units_to_reach(delta: MetricDelta, worse: float, tolerance: float, units: int, cap: int) -> int | None:
    """More pairs until a rate's count interval, whose half-width shrinks like 1/sqrt(requests), brings its worse
    bound within `tolerance`: None when the point itself is past it or that takes more than `cap`."""
    if delta.points is None or worse <= tolerance or units < 1:
        return None
    point = abs(delta.points)
    half, room = worse - point, tolerance - point
    if room <= 0 or half <= 0:
        return None
    more = math.ceil(units * ((half / room) ** 2 - 1))
    return max(1, more) if more <= cap else None


@dataclass(frozen=True)
class _GuardLook:
    """One guard at one look: its outcome by interval, and the one-sided p-value that it is beyond its tolerance."""

    guard: Guard
    delta: MetricDelta
    effect: Effect | None
    outcome: str | None
    p_beyond: float

    @property
    def in_points(self) -> bool:
        return self.guard.absolute and self.delta.points is not None


def _look_at_guard(
    guard: Guard,
    delta: MetricDelta,
    effect: Effect | None,
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    paired: bool,
) -> _GuardLook:
    lower = guard.direction == "minimize"
    outcome = guard_outcome(delta, lower, guard.tolerance, guard.absolute)
    p = 1.0
    if outcome == BEYOND:
        if guard.absolute and delta.points is not None:
            counts = rate_counts(a, b, paired)
            if counts is not None:
                xa, na, xb, nb = counts
                # errors.rate is lower-better: "worse" is up; a higher-better rate is mirrored.
                p = (
                    newcombe_p_above(xa, na, xb, nb, guard.tolerance)
                    if lower
                    else newcombe_p_above(na - xa, na, nb - xb, nb, guard.tolerance)
                )
        elif effect is not None and delta.rel_change is not None:
            limit = guard.tolerance if lower else -guard.tolerance
            p = t_p_beyond(effect, limit, worse_up=lower)
        else:
            p = 0.0  # from a zero baseline any worsening is beyond (guard_outcome), nothing to test
    return _GuardLook(guard, delta, effect, outcome, p)


def _regressed_clause(look: _GuardLook) -> str:
    delta = look.delta
    change = (
        describe_delta(delta, points=look.in_points)
        if (look.in_points or delta.rel_change is not None)
        else f"{label_of(delta.metric)} from 0 to {fmt_full(delta.metric, delta.candidate)},"
    )
    return f"guard {change} beyond its {look.guard.tolerance_text} tolerance"


def _unsettled_clause(look: _GuardLook, units: int, cap: int) -> tuple[str, int | None]:
    """Why the guard is not shown within its tolerance, and the more trials per side that would settle it."""
    guard, delta = look.guard, look.delta
    lower = guard.direction == "minimize"
    if look.in_points:
        _, _, worst = worse_in_points(delta, lower)
        more = None if worst is None else _points_units_to_reach(delta, worst, guard.tolerance, units, cap)
        bound = "no interval" if worst is None else f"its worse bound {fmt_points(worst if lower else -worst)}"
    else:
        _, _, worst = worse_by(delta, lower)
        limit = guard.tolerance if lower else -guard.tolerance  # the tolerance as a relative change
        more = None if look.effect is None else units_to_reach(look.effect, limit, cap)
        bound = "no interval" if worst is None else f"its worse bound {fmt_pct(worst if lower else -worst)}"
    clause = (
        f"guard {describe_delta(delta, points=look.in_points)} not shown within its {guard.tolerance_text} tolerance "
        f"({bound}), " + settle_text(more, cap, "settle")
    )
    return clause, more


@dataclass(frozen=True)
class GuardReading:
    """A step's guards at one look, as the verdict's sentence says them."""

    regressed: tuple[str, ...]  # shown beyond tolerance, the family taken together (Holm)
    unsettled: tuple[str, ...]  # neither shown within nor (with the family) beyond
    pending: tuple[int | None, ...]  # more trials per side each unsettled guard needs (None: not decidable)


def read_guards(
    guards: Sequence[Guard],
    results: Sequence[tuple[MetricDelta, Effect | None]],
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    *,
    paired: bool,
    level: float,
    units: int,
    cap: int,
) -> GuardReading:
    """Each guard's outcome at `level`, its rejection taken with the others' (Holm at the one-sided level)."""
    looks = [_look_at_guard(g, delta, effect, a, b, paired) for g, (delta, effect) in zip(guards, results, strict=True)]
    # One-sided: a guard is beyond when its better bound is past the tolerance, one tail of the two-sided interval.
    shown = holm([look.p_beyond for look in looks], (1.0 - level) / 2)
    regressed: list[str] = []
    unsettled: list[str] = []
    pending: list[int | None] = []
    for look, beyond in zip(looks, shown, strict=True):
        if look.outcome == BEYOND and beyond:
            regressed.append(_regressed_clause(look))
        elif look.outcome == BEYOND:
            unsettled.append(
                f"guard {describe_delta(look.delta, points=look.in_points)} past its {look.guard.tolerance_text} "
                f"tolerance at its own level but not once the step's {len(looks)} guards are taken together (Holm)"
            )
            pending.append(None)
        elif look.outcome == UNSETTLED:
            clause, more = _unsettled_clause(look, units, cap)
            unsettled.append(clause)
            pending.append(more)
    return GuardReading(tuple(regressed), tuple(unsettled), tuple(pending))
