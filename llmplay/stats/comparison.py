"""One metric compared between two sides' trials: the candidate's relative change, with its interval over trials.

Paired by repeat when the runner interleaved the two sides (the geometric mean of per-pair ratios), Welch over
independent trials otherwise; a rate of requests also gets its change in points with a count interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from llmplay.catalog import CAPACITY_METRICS, RATE_METRICS, fmt_pct, label_of, metric_info, sample_count_key
from llmplay.outcomes import MetricDelta
from llmplay.stats.intervals import Effect, Noise, newcombe_difference, paired_effect, welch_effect
from llmplay.stats.samples import TrialSample, metric_value, per_trial, pooled_counts


def _count_for(samples: Sequence[TrialSample], metric: str) -> int | None:
    key = sample_count_key(metric)
    return pooled_counts(samples).get(key) if key else None


def pairs(a: Sequence[TrialSample], b: Sequence[TrialSample]) -> tuple[list[TrialSample], list[TrialSample]] | None:
    """The trials of each side that ran as a pair (same repeat), in repeat order; a pair one of whose trials failed
    is left out whole. None when the samples carry no repeat (they were not measured as pairs)."""
    if any(s.repeat is None for s in (*a, *b)):
        return None
    by_a = {s.repeat: s for s in a}
    by_b = {s.repeat: s for s in b}
    common = sorted(set(by_a) & set(by_b), key=lambda r: int(r or 0))
    return [by_a[r] for r in common], [by_b[r] for r in common]


def unpinned_pairs(a: Sequence[TrialSample], b: Sequence[TrialSample], metric: str) -> str | None:
    """The clause naming the A/B pairs a capacity comparison leaves out because a side's search pinned no boundary
    (indeterminate in its time cap, or outside its bounds); None when every complete pair has the figure on both
    sides, or the metric is not a capacity figure. Whether a search pins its boundary in time is the machine's noise,
    so the verdict says which pairs it rests on rather than hiding the ones it could not use."""
    matched = pairs(a, b) if metric in CAPACITY_METRICS else None
    if not matched:
        return None
    missing = []
    for x, y in zip(*matched, strict=True):
        sides = [side for side, s in (("baseline", x), ("candidate", y)) if metric not in s.scalars]
        if sides:
            missing.append(f"pair {x.repeat} ({' and '.join(sides)})")
    if not missing:
        return None
    return (
        f"{len(missing)} of {len(matched[0])} pair(s) left out, their capacity search pinned no boundary in its "
        f"time cap: {', '.join(missing)}"
    )


def decision_units(a: Sequence[TrialSample], b: Sequence[TrialSample], paired: bool) -> int:
    """The experimental units a comparison rests on: complete pairs, or the smaller side's trials."""
    matched = pairs(a, b) if paired else None
    return len(matched[0]) if matched is not None else min(len(a), len(b))


def rate_counts(a: Sequence[TrialSample], b: Sequence[TrialSample], paired: bool) -> tuple[int, int, int, int] | None:
    """(errors, requests) of each side over the trials the comparison uses (complete pairs when paired)."""
    matched = pairs(a, b) if paired else None
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


def compare_metric(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    *,
    level: float = 0.95,
    paired: bool = False,
) -> MetricDelta:
    return compare_trials(a, b, metric, level, paired)[0]


def compare_trials(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    level: float,
    paired: bool,
    borrow: Sequence[Noise] = (),
    history: Noise | None = None,
) -> tuple[MetricDelta, Effect | None]:
    """The comparison and the interval it rests on (None without one); a rate's change in points beside it."""
    delta, effect = _compare_trials(a, b, metric, level, paired, borrow, history)
    return _with_points(delta, a, b, paired), effect


def _trial_effect(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    level: float,
    paired: bool,
    borrow: Sequence[Noise],
    history: Noise | None,
) -> Effect | None:
    """The interval over trials: paired over complete pairs when `paired`, Welch otherwise; None when some trial
    lacks the figure."""
    matched = pairs(a, b) if paired else None
    if matched is not None and metric in CAPACITY_METRICS:
        # A capacity search that pinned no boundary (indeterminate, or outside its bounds) has no value to pair:
        # like a failed trial, its pair is left out whole rather than voiding the others.
        kept = [(x, y) for x, y in zip(*matched, strict=True) if metric in x.scalars and metric in y.scalars]
        matched = ([x for x, _ in kept], [y for _, y in kept])
    if matched is not None and matched[0]:
        xa, xb = per_trial(matched[0], metric), per_trial(matched[1], metric)
        if xa is not None and xb is not None:
            return paired_effect(xa, xb, level, borrow, history)
    elif matched is None:
        xa, xb = per_trial(a, metric), per_trial(b, metric)
        if xa is not None and xb is not None:
            return welch_effect(xa, xb, level)
    return None


def _compare_trials(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    level: float,
    paired: bool,
    borrow: Sequence[Noise],
    history: Noise | None = None,
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
    effect = _trial_effect(a, b, metric, level, paired, borrow, history)
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


def fmt_points(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.2g}pp"


def describe_delta(delta: MetricDelta, *, points: bool = False) -> str:
    """The change and its interval; in points (a rate's absolute change) when `points` and it has them."""
    label = label_of(delta.metric)
    if points and delta.points is not None:
        return f"{label} {fmt_points(delta.points)} [{fmt_points(delta.points_low)}, {fmt_points(delta.points_high)}]"
    if delta.rel_change is None:
        return f"{label} not comparable"
    ci = f" [{fmt_pct(delta.ci_low)}, {fmt_pct(delta.ci_high)}]" if delta.ci_low is not None else ""
    return f"{label} {fmt_pct(delta.rel_change)}{ci}"
