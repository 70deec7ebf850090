"""Decisions from measurements: gates, and per-step A/B verdicts with confidence intervals.

Effects are relative changes of the candidate against the configuration it is compared with. The experimental
unit is the trial: each trial gives one value of a metric (its P95 over its own requests, its throughput over its
own window), and the interval comes from those values (tuning.intervals): paired by repeat when the runner
interleaved the two sides, Welch otherwise. Requests are never resampled as if independent: they cluster within a
trial, and an interval that treats them as independent draws is too narrow under drift and too wide without it.
A guard is a non-inferiority claim (guard_outcome), the one rule steps and `compare` share: it holds when the
interval's worse bound is within the tolerance, it is beyond when the interval's better bound is past it (the
regression is shown), and anything between leaves the step undecided. A step's guard rejections are one family
(Holm at the one-sided level of its intervals), so guards cannot multiply the chance that a null step is rejected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from llmplay.archive.model import FAILED, INCONCLUSIVE, KEPT, REJECTED, GateResult, MetricDelta
from llmplay.catalog import (
    CAPACITY_METRICS,
    METRICS,
    RATE_METRICS,
    RECORD_METRICS,
    SAMPLE_COUNT_KEYS,
    absence_reason,
    fmt_full,
    fmt_pct,
    label_of,
    metric_info,
    sample_count_key,
    thin_comparison,
    thin_sample,
)
from llmplay.metrics import good_mask, per_request_arrays, usd_per_1m_tokens
from llmplay.spec import Gate, Goals, Guard, Trials
from llmplay.tuning.intervals import (
    Effect,
    Noise,
    holm,
    newcombe_difference,
    newcombe_p_above,
    paired_effect,
    sequential_level,
    t_p_beyond,
    units_to_reach,
    welch_effect,
)

PER_REQUEST = ("ttft", "tpot", "itl", "e2el", "ttft_nonstream", "ttft_content", "queue_wait")

_THROUGHPUT = {
    "throughput.output_tok_s": "output_tokens",
    "throughput.total_tok_s": "total_tokens",
    "goodput.req_s": "good",
}
MIN_TRIALS_TO_DECIDE = 2


@dataclass(frozen=True)
class TrialSample:
    """One successful trial reduced to what the statistics need."""

    duration_s: float
    values: Mapping[
        str, np.ndarray
    ]  # per request: ttft, tpot, e2el, ... (s); output_tokens, total_tokens; good (0/1); itl pooled
    n_requests: int
    n_errors: int
    scalars: Mapping[str, float] = field(default_factory=dict)  # the trial's summary (telemetry, cost inputs)
    price_usd_per_hour: float = 0.0
    repeat: int | None = None  # which A/B pair it belongs to (its TrialRecord.repeat); None: not paired


def sample_from_records(
    records: Any,
    duration_s: float,
    summary: Mapping[str, float],
    slo_s: Mapping[str, float],
    price_usd_per_hour: float,
    repeat: int | None = None,
) -> TrialSample:
    measured = records[~records["is_warmup"].astype(bool)] if "is_warmup" in records else records
    ok = measured[measured["error_kind"].isna()] if "error_kind" in measured else measured
    arrays = {k: np.asarray(v, dtype=float) for k, v in per_request_arrays(measured).items()}
    out_tokens = ok["output_tokens"].to_numpy(dtype=float)
    in_tokens = ok["input_tokens"].to_numpy(dtype=float)
    arrays["output_tokens"] = out_tokens
    arrays["total_tokens"] = out_tokens + in_tokens
    arrays["good"] = good_mask(ok, slo_s)  # the same rule as the summary's goodput
    return TrialSample(
        duration_s=duration_s,
        values=arrays,
        n_requests=len(measured),
        n_errors=len(measured) - len(ok),
        scalars=dict(summary),
        price_usd_per_hour=price_usd_per_hour,
        repeat=repeat,
    )


def _stat(values: np.ndarray, stat: str) -> float | None:
    if values.size == 0:
        return None
    if stat == "mean":
        return float(np.mean(values))
    if stat == "std":
        return float(np.std(values))
    return float(np.percentile(values, float(stat[1:]), method="linear"))


def metric_value(samples: Sequence[TrialSample], metric: str) -> float | None:
    """The metric over the pooled trials (one trial: that trial's value, the unit the intervals rest on)."""
    head, _, stat = metric.partition(".")
    if head in PER_REQUEST:
        pooled = np.concatenate([s.values.get(head, np.array([])) for s in samples]) if samples else np.array([])
        return _stat(pooled, stat)
    duration = sum(s.duration_s for s in samples)
    if duration <= 0:
        return None
    if metric in _THROUGHPUT:
        return float(sum(float(s.values.get(_THROUGHPUT[metric], np.array([])).sum()) for s in samples)) / duration
    if metric == "throughput.req_s":
        return float(sum(s.values.get("output_tokens", np.array([])).size for s in samples)) / duration
    if metric == "errors.rate":
        total = sum(s.n_requests for s in samples)
        return float(sum(s.n_errors for s in samples) / total) if total else None
    if metric == "cost.usd_per_1m_tokens":
        price = float(np.mean([s.price_usd_per_hour for s in samples]))
        cost = usd_per_1m_tokens(price, metric_value(samples, "throughput.output_tok_s"))
        return None if cost is None else float(cost)
    observed = [s.scalars[metric] for s in samples if metric in s.scalars]
    return float(np.mean(observed)) if observed else None


# Families whose per-request arrays hold one value per request, so the pooled array's size is the count its
# percentiles rest on; ITL pools chunk gaps, so its request count comes from the trials' summaries.
_COUNTED_BY_ARRAY = frozenset({"ttft", "tpot", "e2el", "ttft_nonstream", "ttft_content", "ttfo"})


def pooled_counts(samples: Sequence[TrialSample]) -> dict[str, int]:
    """How many requests the pooled figures rest on: per family and streamed / not, summed over the trials.
    A count some trial cannot tell (a sample without that array or summary key) is left out, never guessed."""
    if not samples:
        return {}
    out = {}
    for key in SAMPLE_COUNT_KEYS:
        family, _, stat = key.partition(".")
        if stat == "n" and family in _COUNTED_BY_ARRAY and all(family in s.values for s in samples):
            out[key] = int(sum(s.values[family].size for s in samples))
        elif all(key in s.scalars for s in samples):
            out[key] = int(sum(s.scalars[key] for s in samples))
    return out


def _count_for(samples: Sequence[TrialSample], metric: str) -> int | None:
    key = sample_count_key(metric)
    return pooled_counts(samples).get(key) if key else None


def _per_trial(samples: Sequence[TrialSample], metric: str) -> list[float] | None:
    """One value per trial; None when some trial lacks it (an interval over the rest would hide why)."""
    values = [metric_value([s], metric) for s in samples]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values if v is not None]


def _pairs(a: Sequence[TrialSample], b: Sequence[TrialSample]) -> tuple[list[TrialSample], list[TrialSample]] | None:
    """The trials of each side that ran as a pair (same repeat), in repeat order; a pair one of whose trials failed
    is left out whole. None when the samples carry no repeat (they were not measured as pairs)."""
    if any(s.repeat is None for s in (*a, *b)):
        return None
    by_a = {s.repeat: s for s in a}
    by_b = {s.repeat: s for s in b}
    common = sorted(set(by_a) & set(by_b), key=lambda r: int(r or 0))
    return [by_a[r] for r in common], [by_b[r] for r in common]


def decision_level(trials: Trials, units: int | None = None) -> float:
    """The nominal level of every interval a step's verdict uses at the look with `units` complete pairs (trials per
    side): the confidence for a fixed number of trials; in sequential mode, that look's level of the boundary that
    keeps the whole sequence of looks (repeats .. max_repeats pairs) at the confidence."""
    if trials.sequential and trials.max_repeats > trials.repeats:
        first = max(trials.repeats, MIN_TRIALS_TO_DECIDE)
        return sequential_level(trials.confidence, first, trials.max_repeats, units if units is not None else first)
    return trials.confidence


def decision_units(a: Sequence[TrialSample], b: Sequence[TrialSample], paired: bool) -> int:
    """The experimental units a comparison rests on: complete pairs, or the smaller side's trials."""
    matched = _pairs(a, b) if paired else None
    return len(matched[0]) if matched is not None else min(len(a), len(b))


def compare_metric(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    *,
    level: float = 0.95,
    paired: bool = False,
) -> MetricDelta:
    return _compare(a, b, metric, level, paired)[0]


def rate_counts(a: Sequence[TrialSample], b: Sequence[TrialSample], paired: bool) -> tuple[int, int, int, int] | None:
    """(errors, requests) of each side over the trials the comparison uses (complete pairs when paired)."""
    matched = _pairs(a, b) if paired else None
    xa, xb = matched if matched is not None else (list(a), list(b))
    if not xa or not xb:
        return None
    return (
        sum(s.n_errors for s in xa),
        sum(s.n_requests for s in xa),
        sum(s.n_errors for s in xb),
        sum(s.n_requests for s in xb),
    )


def _with_points(delta: MetricDelta, a: Sequence[TrialSample], b: Sequence[TrialSample], paired: bool) -> MetricDelta:
    """A rate's change in points with its count interval (catalog.RATE_METRICS), beside the relative one."""
    counts = rate_counts(a, b, paired) if delta.metric in RATE_METRICS else None
    level = delta.confidence
    diff = None if counts is None or level is None else newcombe_difference(*counts, level)
    if diff is None:
        return delta
    return replace(delta, points=diff[0], points_low=diff[1], points_high=diff[2])


def _compare(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    level: float,
    paired: bool,
    borrow: Sequence[Noise] = (),
) -> tuple[MetricDelta, Effect | None]:
    delta, effect = _compare_trials(a, b, metric, level, paired, borrow)
    return _with_points(delta, a, b, paired), effect


def _compare_trials(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    level: float,
    paired: bool,
    borrow: Sequence[Noise],
) -> tuple[MetricDelta, Effect | None]:
    """The candidate's relative change against `a` on `metric`, with its interval at `level` over trials: paired
    by repeat when `paired` (interleaved A/B pairs), else Welch over independent trials.

    baseline / candidate are the pooled figures (every request of every trial); the change and its interval are
    those of the estimator the interval belongs to (the geometric mean of per-pair ratios, paired), so the
    interval always contains the change it is printed beside."""
    info = metric_info(metric)
    lower_better = info.lower_is_better if info else True
    va, vb = metric_value(a, metric), metric_value(b, metric)
    na, nb = _count_for(a, metric), _count_for(b, metric)
    if va is None or vb is None:
        return MetricDelta(
            metric, va, vb, None, None, None, better=None, n_baseline=na, n_candidate=nb, confidence=level
        ), None
    matched = _pairs(a, b) if paired else None
    if matched is not None and metric in CAPACITY_METRICS:
        # A capacity search that pinned no boundary (indeterminate, or outside its bounds) has no value to pair:
        # like a failed trial, its pair is left out whole rather than voiding the others.
        kept = [(x, y) for x, y in zip(*matched, strict=True) if metric in x.scalars and metric in y.scalars]
        matched = ([x for x, _ in kept], [y for _, y in kept])
    effect: Effect | None = None
    if matched is not None and matched[0]:
        xa, xb = _per_trial(matched[0], metric), _per_trial(matched[1], metric)
        if xa is not None and xb is not None:
            effect = paired_effect(xa, xb, level, borrow)
    elif matched is None:
        xa, xb = _per_trial(a, metric), _per_trial(b, metric)
        if xa is not None and xb is not None:
            effect = welch_effect(xa, xb, level)
    if effect is None or effect.rel is None:
        # No per-trial values to rest an interval on (or a zero baseline): the pooled change, without an interval.
        rel = (vb - va) / abs(va) if va != 0 else (0.0 if vb == 0 else math.inf)
        better = (rel < 0) if lower_better else (rel > 0)
        pooled = MetricDelta(
            metric,
            va,
            vb,
            rel if math.isfinite(rel) else None,
            None,
            None,
            better=better if rel not in (0, math.inf) else None,
            n_baseline=na,
            n_candidate=nb,
            units=effect.units if effect else 0,
            method=effect.method if effect else None,
            confidence=level,
        )
        return pooled, None
    rel = effect.rel
    better = (rel < 0) if lower_better else (rel > 0)
    return MetricDelta(
        metric,
        va,
        vb,
        rel,
        effect.low,
        effect.high,
        better=better if rel != 0 else None,
        n_baseline=na,
        n_candidate=nb,
        units=effect.units,
        method=effect.method,
        confidence=level,
    ), effect


def _improvement(delta: MetricDelta, lower_better: bool) -> tuple[float, float, float]:
    """(point, low, high) of the change in the good direction: positive = better."""
    sign = -1.0 if lower_better else 1.0
    point, lo, hi = sign * delta.rel_change, sign * delta.ci_low, sign * delta.ci_high  # type: ignore[operator]
    return point, min(lo, hi), max(lo, hi)


def _fmt_points(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.2g}pp"


def describe_delta(delta: MetricDelta, *, points: bool = False) -> str:
    """The change and its interval; in points (a rate's absolute change) when `points` and it has them."""
    label = label_of(delta.metric)
    if points and delta.points is not None:
        return (
            f"{label} {_fmt_points(delta.points)} [{_fmt_points(delta.points_low)}, {_fmt_points(delta.points_high)}]"
        )
    if delta.rel_change is None:
        return f"{label} not comparable"
    ci = f" [{fmt_pct(delta.ci_low)}, {fmt_pct(delta.ci_high)}]" if delta.ci_low is not None else ""
    return f"{label} {fmt_pct(delta.rel_change)}{ci}"


# What a guard's comparison shows: the candidate is within its tolerance (the CI's worse bound is), beyond it (the
# CI's better bound is past it: the regression is shown), or neither yet.
HOLDS, BEYOND, UNSETTLED = "holds", "beyond", "unsettled"
# Past this many more trials per side an estimate is no advice: the sentence says the step is not decidable.
MORE_TRIALS_CAP = 50


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


def _worse_by(delta: MetricDelta, lower_is_better: bool) -> tuple[float, float | None, float | None]:
    """The relative change in the bad direction (needs one)."""
    return _worse(delta.rel_change, delta.ci_low, delta.ci_high, lower_is_better)


def _worse_in_points(delta: MetricDelta, lower_is_better: bool) -> tuple[float, float | None, float | None]:
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
        _, better, worse = _worse_in_points(delta, lower_is_better)
    elif delta.rel_change is None:
        return BEYOND if ((b > a) if lower_is_better else (b < a)) else HOLDS
    else:
        _, better, worse = _worse_by(delta, lower_is_better)
    if better is not None and better > tolerance:
        return BEYOND
    return HOLDS if worse is not None and worse <= tolerance else UNSETTLED


def regressed_beyond(delta: MetricDelta, lower_is_better: bool, tolerance: float, absolute: bool = False) -> bool:
    """A regression by the guard rule (guard_outcome): the interval's better bound is worse than `tolerance`."""
    return guard_outcome(delta, lower_is_better, tolerance, absolute) == BEYOND


def _settle_text(more: int | None, cap: int, what: str) -> str:
    if more is None:
        return f"not decidable within {cap} more trial(s) per side"
    return f"about {more} more trial(s) per side would {what} it"


@dataclass(frozen=True)
class Decision:
    verdict: str
    reason: str
    objective: MetricDelta | None
    guards: tuple[MetricDelta, ...]
    deltas: tuple[MetricDelta, ...]
    more_trials_needed: int | None
    # The spread of this step's own per-pair log ratios, per metric decided on: what later steps may borrow
    # (trials.pool_noise).
    noise: Mapping[str, Noise] = field(default_factory=dict)


def _unmeasured(delta: MetricDelta, what: str) -> str | None:
    """The clause for a figure absent on a side, with why: guard P95 TPOT not measured on the candidate (no
    streamed request produced more than one output token). None when both sides have it."""
    missing = [side for side, value in (("baseline", delta.baseline), ("candidate", delta.candidate)) if value is None]
    if not missing:
        return None
    where = "either side" if len(missing) == 2 else f"the {missing[0]}"
    return f"{what}{label_of(delta.metric)} not measured on {where} ({absence_reason(delta.metric)})"


def _thin_notes(deltas: Sequence[MetricDelta]) -> list[str]:
    """What the decision's percentiles rest on where that is too few requests to mean much (measured ones only)."""
    notes: list[str] = []
    for delta in deltas:
        if delta.baseline is None or delta.candidate is None:
            continue
        note = thin_comparison(delta.metric, delta.n_baseline, delta.n_candidate)
        if note and note not in notes:
            notes.append(note)
    return notes


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


def decide_step(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    goals: Goals,
    trials: Trials,
    *,
    failed_candidate_trials: int = 0,
    borrowed: Mapping[str, Sequence[Noise]] | None = None,
) -> Decision:
    """kept / rejected / inconclusive / failed, with the one-sentence reason the report shows.

    Every interval is at decision_level(trials) over the trials (pairs when interleaved): the same call decides
    whether sequential mode goes on and what the final verdict is, so the two cannot disagree; guard looks sit inside
    the same sequential boundary as the objective. The guards' rejections are one family: Holm at the interval's
    one-sided level, so a null step is rejected through any of its guards at most that often over all looks.
    `borrowed`: the other steps' noise per metric, moderating this step's paired variances (trials.pool_noise).

    The sentence says when the objective or a guard is not measured (and why), and when a percentile rests on fewer
    requests than it needs (catalog.MIN_SAMPLES, per side over the pooled trials). A thin sample does not change the
    verdict; an unmeasured guard keeps a step from being kept, since nobody saw it not regress."""
    objective = goals.objective
    if not b:
        return Decision(
            FAILED, f"every candidate trial failed ({failed_candidate_trials}); nothing to compare", None, (), (), None
        )
    if not a:
        return Decision(FAILED, "every trial of the configuration it is compared with failed", None, (), (), None)
    paired = trials.interleave
    level = decision_level(trials, decision_units(a, b, paired))
    pool = borrowed if (borrowed and trials.pool_noise and paired) else {}
    obj, obj_effect = _compare(a, b, objective.metric, level, paired, pool.get(objective.metric, ()))
    guard_results = [_compare(a, b, g.metric, level, paired, pool.get(g.metric, ())) for g in goals.guards]
    guard_deltas = tuple(delta for delta, _ in guard_results)
    record = tuple(compare_metric(a, b, m, level=level, paired=paired) for m in RECORD_METRICS)
    noise = {
        delta.metric: effect.noise
        for delta, effect in ((obj, obj_effect), *guard_results)
        if effect is not None and effect.noise is not None
    }
    unmeasured_guards = [note for d in guard_deltas if (note := _unmeasured(d, "guard "))]
    thin = "".join(f"; {note}" for note in _thin_notes((obj, *guard_deltas)))

    def decision(verdict: str, reason: str, more: int | None = None) -> Decision:
        return Decision(verdict, reason + thin, obj, guard_deltas, record, more, noise)

    units = obj.units if obj.units is not None else min(len(a), len(b))
    if obj.rel_change is not None and units < MIN_TRIALS_TO_DECIDE:
        what = "complete pair(s)" if paired else "trial(s) per side"
        return decision(
            INCONCLUSIVE,
            f"{describe_delta(obj)} from {units} {what}; at least {MIN_TRIALS_TO_DECIDE} are needed to decide "
            "(a single one cannot show the noise)" + "".join(f"; {note}" for note in unmeasured_guards),
            MIN_TRIALS_TO_DECIDE - units,
        )
    if obj.rel_change is None or obj.ci_low is None or obj_effect is None:
        missing = _unmeasured(obj, "the objective ")
        why = missing or (
            f"{describe_delta(obj)}: the objective has no relative change or interval (a zero baseline, or a trial "
            "without the figure)"
        )
        return decision(INCONCLUSIVE, why)
    lower_better = objective.direction == "minimize"
    point, lo, hi = _improvement(obj, lower_better)
    cap = max(MORE_TRIALS_CAP, trials.max_repeats)
    looks = [
        _look_at_guard(g, delta, effect, a, b, paired)
        for g, (delta, effect) in zip(goals.guards, guard_results, strict=True)
    ]
    # One-sided: a guard is beyond when its better bound is past the tolerance, one tail of the two-sided interval.
    shown = holm([look.p_beyond for look in looks], (1.0 - level) / 2)
    regressed: list[str] = []
    unsettled: list[str] = []
    pending: list[int | None] = []  # more trials per side each unsettled part needs (None: not decidable)
    for look, beyond in zip(looks, shown, strict=True):
        guard, delta = look.guard, look.delta
        lower = guard.direction == "minimize"
        in_points = guard.absolute and delta.points is not None
        tolerance = guard.tolerance_text
        if look.outcome == BEYOND and beyond:
            change = (
                describe_delta(delta, points=in_points)
                if (in_points or delta.rel_change is not None)
                else f"{label_of(delta.metric)} from 0 to {fmt_full(delta.metric, delta.candidate)},"
            )
            regressed.append(f"guard {change} beyond its {tolerance} tolerance")
        elif look.outcome == BEYOND:
            unsettled.append(
                f"guard {describe_delta(delta, points=in_points)} past its {tolerance} tolerance at its own level "
                f"but not once the step's {len(looks)} guards are taken together (Holm)"
            )
            pending.append(None)
        elif look.outcome == UNSETTLED:
            if in_points:
                _, _, worst = _worse_in_points(delta, lower)
                more = None if worst is None else _points_units_to_reach(delta, worst, guard.tolerance, units, cap)
                bound = "no interval" if worst is None else f"its worse bound {_fmt_points(worst if lower else -worst)}"
            else:
                _, _, worst = _worse_by(delta, lower)
                limit = guard.tolerance if lower else -guard.tolerance  # the tolerance as a relative change
                more = None if look.effect is None else units_to_reach(look.effect, limit, cap)
                bound = "no interval" if worst is None else f"its worse bound {fmt_pct(worst if lower else -worst)}"
            pending.append(more)
            unsettled.append(
                f"guard {describe_delta(delta, points=in_points)} not shown within its {tolerance} tolerance "
                f"({bound}), " + _settle_text(more, cap, "settle")
            )
    guard_text = "; ".join(regressed + unsettled + unmeasured_guards) or "no guard regressed"
    head = f"{describe_delta(obj)}, {guard_text}"

    def most(needs: Sequence[int | None]) -> int | None:
        return None if not needs or None in needs else max(k for k in needs if k is not None)

    if regressed:
        return decision(REJECTED, f"{head}; rejected")
    if lo > 0 and point >= objective.min_effect:
        if unmeasured_guards:
            return decision(INCONCLUSIVE, f"{head}; not kept while a guard is not measured")
        if unsettled:
            return decision(INCONCLUSIVE, f"{head}; not kept while a guard is unsettled", most(pending))
        return decision(KEPT, f"{head}; kept")
    if hi < 0:
        return decision(REJECTED, f"{head}; worse, rejected")
    if hi < objective.min_effect:
        return decision(REJECTED, f"{head}; any gain is below the {objective.min_effect:.0%} minimum effect, rejected")
    # The threshold that decides: below min_effect the step is rejected once the CI's top falls under it; at or
    # above, it is kept once the CI's bottom clears zero.
    sign = -1.0 if lower_better else 1.0
    target = sign * objective.min_effect if point < objective.min_effect else 0.0
    more = units_to_reach(obj_effect, target, cap)
    return decision(INCONCLUSIVE, f"{head}; within noise, " + _settle_text(more, cap, "decide"), most([more, *pending]))


def evaluate_gates(gates: Sequence[Gate], summary: Mapping[str, float]) -> list[GateResult]:
    """Each gate against the summary (a configuration's pooled_summary, whose counts say what each percentile
    rests on). An absent (or non-finite) figure is not met, "not measured", with the reason as its note; a
    percentile from too few requests is judged all the same, and its note says how few."""
    results = []
    for gate in gates:
        observed = summary.get(gate.metric)
        if observed is not None and not math.isfinite(observed):
            observed = None
        met = gate.holds(observed)
        margin = None
        if observed is not None and gate.value != 0:
            headroom = (gate.value - observed) if gate.op in ("<", "<=") else (observed - gate.value)
            margin = headroom / abs(gate.value)
        note = absence_reason(gate.metric) if observed is None else thin_sample(gate.metric, summary)
        results.append(GateResult(gate.text, gate.metric, gate.op, gate.value, observed, met, margin, note))
    return results


def pooled_summary(samples: Sequence[TrialSample]) -> dict[str, float]:
    """Every known metric over the pooled trials: the tuning-record row of a configuration, with the request
    counts (pooled_counts) its percentiles rest on."""
    out: dict[str, float] = dict(pooled_counts(samples))
    for metric in METRICS:
        value = metric_value(samples, metric)
        if value is not None:
            out[metric] = value
    for key in ("memory.peak_bytes", "memory.capacity_bytes", "proc.rss_peak_bytes", "engine.preemptions"):
        vals = [s.scalars[key] for s in samples if key in s.scalars]
        if vals:
            out[key] = float(max(vals)) if key != "engine.preemptions" else float(sum(vals))
    return out
