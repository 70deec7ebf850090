"""Decisions from measurements: gates, and per-step A/B verdicts with confidence intervals.

Effects are relative changes of the candidate against the configuration it is compared with. The experimental
unit is the trial: each trial gives one value of a metric (its P95 over its own requests, its throughput over its
own window), and the interval comes from those values (stats.intervals): paired by repeat when the runner
interleaved the two sides, Welch otherwise. Requests are never resampled as if independent: they cluster within a
trial, and an interval that treats them as independent draws is too narrow under drift and too wide without it.
A guard is a non-inferiority claim (guard_outcome), the one rule steps and `compare` share: it holds when the
interval's worse bound is within the tolerance, it is beyond when the interval's better bound is past it (the
regression is shown), and anything between leaves the step undecided. A step's guard rejections are one family
(Holm at the one-sided level of its intervals), so guards cannot multiply the chance that a null step is rejected.

The parts live beside it: stats.samples (a trial's sample, pooled figures and counts), stats.comparison (one
metric's change and interval), stats.guards (the guard rule); their names callers use are importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmplay.catalog import (
    RECORD_METRICS,
    absence_reason,
    label_of,
    thin_comparison,
    thin_sample,
)
from llmplay.outcomes import FAILED, INCONCLUSIVE, KEPT, REJECTED, GateResult, MetricDelta
from llmplay.spec import Gate, Goals, Trials
from llmplay.stats.comparison import compare_metric, compare_trials, decision_units, describe_delta, unpinned_pairs
from llmplay.stats.guards import BEYOND, HOLDS, UNSETTLED, guard_outcome, read_guards, regressed_beyond, settle_text
from llmplay.stats.intervals import Effect, Noise, sequential_level, units_to_reach
from llmplay.stats.power import hidden_effect
from llmplay.stats.samples import (
    TrialSample,
    metric_value,
    pooled_counts,
    pooled_summary,
    sample_from_records,
    summed_counts,
)

__all__ = [
    "BEYOND",
    "HOLDS",
    "MIN_TRIALS_TO_DECIDE",
    "MORE_TRIALS_CAP",
    "UNSETTLED",
    "Decision",
    "TrialSample",
    "compare_metric",
    "decide_step",
    "decision_level",
    "describe_delta",
    "evaluate_gates",
    "guard_outcome",
    "metric_value",
    "pooled_counts",
    "pooled_summary",
    "regressed_beyond",
    "sample_from_records",
    "summed_counts",
]

MIN_TRIALS_TO_DECIDE = 2
# Past this many more trials per side an estimate is no advice: the sentence says the step is not decidable.
MORE_TRIALS_CAP = 50


def decision_level(trials: Trials, units: int | None = None) -> float:
    """The nominal level of every interval a step's verdict uses at the look with `units` complete pairs (trials per
    side): the confidence for a fixed number of trials; in sequential mode, that look's level of the boundary that
    keeps the whole sequence of looks (repeats .. max_repeats pairs) at the confidence."""
    if trials.sequential and trials.max_repeats > trials.repeats:
        first = max(trials.repeats, MIN_TRIALS_TO_DECIDE)
        return sequential_level(trials.confidence, first, trials.max_repeats, units if units is not None else first)
    return trials.confidence


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


def _improvement(delta: MetricDelta, lower_better: bool) -> tuple[float, float, float]:
    """(point, low, high) of the change in the good direction: positive = better."""
    sign = -1.0 if lower_better else 1.0
    point, lo, hi = sign * delta.rel_change, sign * delta.ci_low, sign * delta.ci_high  # type: ignore[operator]
    return point, min(lo, hi), max(lo, hi)


@dataclass(frozen=True)
class _StepComparisons:
    """Everything a step's verdict compares, at one look's level: the objective, each guard, the record's metrics."""

    level: float
    paired: bool
    objective: MetricDelta
    objective_effect: Effect | None
    guards: tuple[tuple[MetricDelta, Effect | None], ...]
    record: tuple[MetricDelta, ...]

    @property
    def guard_deltas(self) -> tuple[MetricDelta, ...]:
        return tuple(delta for delta, _ in self.guards)

    def noise(self) -> dict[str, Noise]:
        return {
            delta.metric: effect.noise
            for delta, effect in ((self.objective, self.objective_effect), *self.guards)
            if effect is not None and effect.noise is not None
        }


def _compare_step(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    goals: Goals,
    trials: Trials,
    borrowed: Mapping[str, Sequence[Noise]] | None,
    history: Mapping[str, Noise] | None,
) -> _StepComparisons:
    paired = trials.interleave
    level = decision_level(trials, decision_units(a, b, paired))
    pool = borrowed if (borrowed and trials.pool_noise and paired) else {}
    past = history if (history and trials.noise == "history" and paired) else {}

    def compare(metric: str) -> tuple[MetricDelta, Effect | None]:
        return compare_trials(a, b, metric, level, paired, pool.get(metric, ()), past.get(metric))

    objective, objective_effect = compare(goals.objective.metric)
    guards = tuple(compare(g.metric) for g in goals.guards)
    record = tuple(compare_trials(a, b, m, level, paired)[0] for m in RECORD_METRICS)
    return _StepComparisons(level, paired, objective, objective_effect, guards, record)


def _most(needs: Sequence[int | None]) -> int | None:
    """The more trials per side that settle every open part; None when one of them is not decidable."""
    return None if not needs or None in needs else max(k for k in needs if k is not None)


def decide_step(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    goals: Goals,
    trials: Trials,
    *,
    failed_candidate_trials: int = 0,
    borrowed: Mapping[str, Sequence[Noise]] | None = None,
    history: Mapping[str, Noise] | None = None,
) -> Decision:
    """kept / rejected / inconclusive / failed, with the one-sentence reason the report shows.

    Every interval is at decision_level(trials) over the trials (pairs when interleaved): the same call decides
    whether sequential mode goes on and what the final verdict is, so the two cannot disagree; guard looks sit inside
    the same sequential boundary as the objective. The guards' rejections are one family: Holm at the interval's
    one-sided level, so a null step is rejected through any of its guards at most that often over all looks.
    `borrowed`: the other steps' noise per metric, moderating this step's paired variances (trials.pool_noise);
    `history`: earlier comparable runs' paired noise per metric, pooled with this run's while they agree
    (trials.noise: history; stats.intervals.with_history).

    The sentence says when the objective or a guard is not measured (and why), and when a percentile rests on fewer
    requests than it needs (catalog.MIN_SAMPLES, per side over the pooled trials). A thin sample does not change the
    verdict; an unmeasured guard keeps a step from being kept, since nobody saw it not regress."""
    if not b:
        return Decision(
            FAILED, f"every candidate trial failed ({failed_candidate_trials}); nothing to compare", None, (), (), None
        )
    if not a:
        return Decision(FAILED, "every trial of the configuration it is compared with failed", None, (), (), None)
    step = _compare_step(a, b, goals, trials, borrowed, history)
    obj, obj_effect, guard_deltas = step.objective, step.objective_effect, step.guard_deltas
    unmeasured_guards = [note for d in guard_deltas if (note := _unmeasured(d, "guard "))]
    left_out = unpinned_pairs(a, b, obj.metric) if step.paired else None
    thin = "".join(f"; {note}" for note in (*_thin_notes((obj, *guard_deltas)), *([left_out] if left_out else [])))

    def decision(verdict: str, reason: str, more: int | None = None) -> Decision:
        return Decision(verdict, reason + thin, obj, guard_deltas, step.record, more, step.noise())

    units = obj.units if obj.units is not None else min(len(a), len(b))
    if obj.rel_change is not None and units < MIN_TRIALS_TO_DECIDE:
        what = "complete pair(s)" if step.paired else "trial(s) per side"
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
    objective = goals.objective
    lower_better = objective.direction == "minimize"
    point, lo, hi = _improvement(obj, lower_better)
    cap = max(MORE_TRIALS_CAP, trials.max_repeats)
    read = read_guards(goals.guards, step.guards, a, b, paired=step.paired, level=step.level, units=units, cap=cap)
    guard_text = "; ".join([*read.regressed, *read.unsettled, *unmeasured_guards]) or "no guard regressed"
    head = f"{describe_delta(obj)}, {guard_text}"
    if read.regressed:
        return decision(REJECTED, f"{head}; rejected")
    if lo > 0 and point >= objective.min_effect:
        if unmeasured_guards:
            return decision(INCONCLUSIVE, f"{head}; not kept while a guard is not measured")
        if read.unsettled:
            return decision(INCONCLUSIVE, f"{head}; not kept while a guard is unsettled", _most(read.pending))
        return decision(KEPT, f"{head}; kept")
    if hi < 0:
        return decision(REJECTED, f"{head}; worse, rejected")
    if hi < objective.min_effect:
        return decision(REJECTED, f"{head}; any gain is below the {objective.min_effect:.0%} minimum effect, rejected")
    # The threshold that decides: below min_effect the step is rejected once the CI's top falls under it; at or
    # above, it is kept once the CI's bottom clears zero.
    target = (-1.0 if lower_better else 1.0) * objective.min_effect if point < objective.min_effect else 0.0
    more = units_to_reach(obj_effect, target, cap)
    hidden = hidden_effect(obj_effect, objective.min_effect, lower_better, trials.confidence)
    return decision(
        INCONCLUSIVE,
        f"{head}; within noise, " + settle_text(more, cap, "decide") + (f"; {hidden}" if hidden else ""),
        _most([more, *read.pending]),
    )


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
