"""Decisions from measurements: gates, and per-step A/B verdicts with bootstrap confidence intervals.

Effects are relative changes of the candidate against the configuration it is compared with. Their
intervals come from a two-level bootstrap: trials are resampled (machine drift, engine restarts), and
requests are resampled inside each trial (load noise), so both sources of spread widen the interval.
A guard is a non-inferiority claim (guard_outcome), the one rule steps and `compare` share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmplay.archive.model import FAILED, INCONCLUSIVE, KEPT, REJECTED, GateResult, MetricDelta
from llmplay.catalog import (
    METRICS,
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
from llmplay.spec import Gate, Goals, Trials

PER_REQUEST = ("ttft", "tpot", "itl", "e2el", "ttft_nonstream", "queue_wait")

_WINDOWED = {
    "throughput.output_tok_s": ("output_tokens", "window_output_tokens"),
    "throughput.total_tok_s": ("total_tokens", "window_total_tokens"),
    "throughput.req_s": ("count", "window_requests"),
    "goodput.req_s": ("good", "window_good"),
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


def sample_from_records(
    records: Any, duration_s: float, summary: Mapping[str, float], slo_s: Mapping[str, float], price_usd_per_hour: float
) -> TrialSample:
    measured = records[~records["is_warmup"].astype(bool)] if "is_warmup" in records else records
    ok = measured[measured["error_kind"].isna()] if "error_kind" in measured else measured
    arrays = {k: np.asarray(v, dtype=float) for k, v in per_request_arrays(measured).items()}
    out_tokens = ok["output_tokens"].to_numpy(dtype=float)
    in_tokens = ok["input_tokens"].to_numpy(dtype=float)
    arrays["output_tokens"] = out_tokens
    arrays["total_tokens"] = out_tokens + in_tokens
    arrays["good"] = good_mask(ok, slo_s)  # the same rule as the summary's goodput
    arrays.update(_windows(measured, ok, arrays, duration_s))
    return TrialSample(
        duration_s=duration_s,
        values=arrays,
        n_requests=len(measured),
        n_errors=len(measured) - len(ok),
        scalars=dict(summary),
        price_usd_per_hour=price_usd_per_hour,
    )


THROUGHPUT_WINDOWS = 10


def _windows(measured: Any, ok: Any, arrays: Mapping[str, np.ndarray], duration_s: float) -> dict[str, np.ndarray]:
    """Per time window of the measured span: tokens, requests and good requests completed in it."""
    if not len(ok) or duration_s <= 0:
        return {}
    start_ns = float(measured["sent_ns"].min())
    done_s = (ok["end_ns"].to_numpy(dtype=float) - start_ns) / 1e9
    edges = np.linspace(0.0, max(duration_s, float(np.nanmax(done_s))), THROUGHPUT_WINDOWS + 1)
    which = np.clip(np.searchsorted(edges, done_s, side="right") - 1, 0, THROUGHPUT_WINDOWS - 1)

    def per_window(weights: np.ndarray) -> np.ndarray:
        return np.bincount(which, weights=weights, minlength=THROUGHPUT_WINDOWS).astype(float)

    return {
        "window_output_tokens": per_window(arrays["output_tokens"]),
        "window_total_tokens": per_window(arrays["total_tokens"]),
        "window_requests": per_window(np.ones(len(ok))),
        "window_good": per_window(arrays["good"]),
    }


def _stat(values: np.ndarray, stat: str) -> float | None:
    if values.size == 0:
        return None
    if stat == "mean":
        return float(np.mean(values))
    if stat == "std":
        return float(np.std(values))
    return float(np.percentile(values, float(stat[1:]), method="linear"))


def _value(samples: Sequence[TrialSample], metric: str, pick: Callable[[TrialSample, str], np.ndarray]) -> float | None:
    """The metric over pooled trials; `pick` returns a (possibly resampled) per-request array."""
    head, _, stat = metric.partition(".")
    if head in PER_REQUEST:
        pooled = np.concatenate([pick(s, head) for s in samples]) if samples else np.array([])
        return _stat(pooled, stat)
    duration = sum(s.duration_s for s in samples)
    if duration <= 0:
        return None
    if metric in _WINDOWED:
        per_request, per_window = _WINDOWED[metric]
        # Time windows resample throughput inside a trial (requests alone would not: with fixed output
        # lengths every resample has the same token sum); trials without windows fall back to requests.
        total = 0.0
        for s in samples:
            if per_window in s.values and s.values[per_window].size:
                total += float(pick(s, per_window).sum())
            elif per_request == "count":
                total += float(pick(s, "output_tokens").size)
            else:
                total += float(pick(s, per_request).sum())
        return total / duration
    if metric == "errors.rate":
        total = sum(s.n_requests for s in samples)
        return float(sum(s.n_errors for s in samples) / total) if total else None
    if metric == "cost.usd_per_1m_tokens":
        price = float(np.mean([s.price_usd_per_hour for s in samples]))
        cost = usd_per_1m_tokens(price, _value(samples, "throughput.output_tok_s", pick))
        return None if cost is None else float(cost)
    observed = [s.scalars[metric] for s in samples if metric in s.scalars]
    return float(np.mean(observed)) if observed else None


def _as_is(sample: TrialSample, name: str) -> np.ndarray:
    return sample.values.get(name, np.array([]))


def metric_value(samples: Sequence[TrialSample], metric: str) -> float | None:
    return _value(samples, metric, _as_is)


# Families whose per-request arrays hold one value per request, so the pooled array's size is the count its
# percentiles rest on; ITL pools chunk gaps, so its request count comes from the trials' summaries.
_COUNTED_BY_ARRAY = frozenset({"ttft", "tpot", "e2el", "ttft_nonstream", "ttfo"})


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


def _bootstrap(
    a: Sequence[TrialSample], b: Sequence[TrialSample], metric: str, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Relative change b vs a under two-level resampling; NaN where undefined."""
    out = np.full(n_boot, np.nan)

    def resampled(group: Sequence[TrialSample]) -> list[TrialSample]:
        return [group[i] for i in rng.integers(0, len(group), len(group))]

    def pick(sample: TrialSample, name: str) -> np.ndarray:
        arr = sample.values.get(name, np.array([]))
        return arr[rng.integers(0, arr.size, arr.size)] if arr.size else arr

    for i in range(n_boot):
        va, vb = _value(resampled(a), metric, pick), _value(resampled(b), metric, pick)
        if va is not None and vb is not None and va != 0:
            out[i] = (vb - va) / abs(va)
        elif va == 0 and vb == 0:
            out[i] = 0.0
    return out


def compare_metric(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    metric: str,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> MetricDelta:
    info = metric_info(metric)
    lower_better = info.lower_is_better if info else True
    va, vb = metric_value(a, metric), metric_value(b, metric)
    na, nb = _count_for(a, metric), _count_for(b, metric)
    if va is None or vb is None:
        return MetricDelta(metric, va, vb, None, None, None, better=None, n_baseline=na, n_candidate=nb)
    rel = (vb - va) / abs(va) if va != 0 else (0.0 if vb == 0 else math.inf)
    boots = _bootstrap(a, b, metric, n_boot, np.random.default_rng(seed))
    boots = boots[np.isfinite(boots)]
    alpha = (1 - confidence) / 2
    lo, hi = (float(np.quantile(boots, alpha)), float(np.quantile(boots, 1 - alpha))) if boots.size else (None, None)
    better = (rel < 0) if lower_better else (rel > 0)
    return MetricDelta(
        metric,
        va,
        vb,
        rel if math.isfinite(rel) else None,
        lo,
        hi,
        better=better if rel != 0 else None,
        n_baseline=na,
        n_candidate=nb,
    )


def _improvement(delta: MetricDelta, lower_better: bool) -> tuple[float, float, float]:
    """(point, low, high) of the change in the good direction: positive = better."""
    sign = -1.0 if lower_better else 1.0
    point, lo, hi = sign * delta.rel_change, sign * delta.ci_low, sign * delta.ci_high  # type: ignore[operator]
    return point, min(lo, hi), max(lo, hi)


def describe_delta(delta: MetricDelta) -> str:
    label = label_of(delta.metric)
    if delta.rel_change is None:
        return f"{label} not comparable"
    ci = f" [{fmt_pct(delta.ci_low)}, {fmt_pct(delta.ci_high)}]" if delta.ci_low is not None else ""
    return f"{label} {fmt_pct(delta.rel_change)}{ci}"


# What a guard's comparison shows: the candidate is within its tolerance (the CI's worse bound is), beyond it (the
# point estimate is), or neither yet.
HOLDS, BEYOND, UNSETTLED = "holds", "beyond", "unsettled"
# Past this many more trials per side an estimate is no advice: the sentence says the step is not decidable.
MORE_TRIALS_CAP = 50


def _worse_by(delta: MetricDelta, lower_is_better: bool) -> tuple[float, float | None]:
    """(point, worse bound) of the change in the bad direction: positive = worse. Needs a relative change."""
    sign = 1.0 if lower_is_better else -1.0
    point = sign * delta.rel_change  # type: ignore[operator]
    if delta.ci_low is None or delta.ci_high is None:
        return point, None
    return point, max(sign * delta.ci_low, sign * delta.ci_high)


def guard_outcome(delta: MetricDelta, lower_is_better: bool, tolerance: float) -> str | None:
    """The guard rule, a non-inferiority claim: it holds only when the CI's worse bound is within `tolerance`
    (relative); a point estimate beyond it fails; anything between is unsettled. From a baseline of exactly 0 a
    relative tolerance cannot apply: any worsening fails. None when a side is not measured."""
    a, b = delta.baseline, delta.candidate
    if a is None or b is None:
        return None
    if delta.rel_change is None:
        return BEYOND if ((b > a) if lower_is_better else (b < a)) else HOLDS
    point, worst = _worse_by(delta, lower_is_better)
    if point > tolerance:
        return BEYOND
    return HOLDS if worst is not None and worst <= tolerance else UNSETTLED


def regressed_beyond(delta: MetricDelta, lower_is_better: bool, tolerance: float) -> bool:
    """A regression by the guard rule (guard_outcome): the point estimate is worse than `tolerance`."""
    return guard_outcome(delta, lower_is_better, tolerance) == BEYOND


def _more_trials(n: int, half: float, distance: float, cap: int) -> int | None:
    """More trials per side until the CI's half-width `half` (shrinking like 1/sqrt(n)) falls within `distance`,
    the gap from the point estimate to the threshold that decides; None when that is more than `cap`."""
    if distance <= 0:
        return None
    total = n * (half / distance) ** 2
    if not math.isfinite(total) or total > n + cap:
        return None
    return max(1, math.ceil(total - 1e-9) - n)  # the tolerance absorbs float noise: 12.000000001 is 12


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


def decide_step(
    a: Sequence[TrialSample],
    b: Sequence[TrialSample],
    goals: Goals,
    trials: Trials,
    *,
    failed_candidate_trials: int = 0,
    seed: int = 0,
) -> Decision:
    """kept / rejected / inconclusive / failed, with the one-sentence reason the report shows.

    The sentence says when the objective or a guard is not measured (and why), and when a percentile it rests
    on comes from fewer requests than it needs (catalog.MIN_SAMPLES, counted per side over the pooled trials:
    the bootstrap resamples that pool, so its size is what the estimate rests on). A thin sample does not
    change the verdict; an unmeasured guard keeps a step from being kept, since nobody saw it not regress."""
    objective = goals.objective
    if not b:
        return Decision(
            FAILED, f"every candidate trial failed ({failed_candidate_trials}); nothing to compare", None, (), (), None
        )
    if not a:
        return Decision(FAILED, "every trial of the configuration it is compared with failed", None, (), (), None)
    n_boot = trials.bootstrap_samples
    obj = compare_metric(a, b, objective.metric, n_boot=n_boot, confidence=trials.confidence, seed=seed)
    guard_deltas = tuple(
        compare_metric(a, b, g.metric, n_boot=max(200, n_boot // 4), confidence=trials.confidence, seed=seed + 1 + i)
        for i, g in enumerate(goals.guards)
    )
    record = tuple(
        compare_metric(a, b, m, n_boot=200, confidence=trials.confidence, seed=seed + 99) for m in RECORD_METRICS
    )
    unmeasured_guards = [note for d in guard_deltas if (note := _unmeasured(d, "guard "))]
    thin = "".join(f"; {note}" for note in _thin_notes((obj, *guard_deltas)))

    def decision(verdict: str, reason: str, more: int | None = None) -> Decision:
        return Decision(verdict, reason + thin, obj, guard_deltas, record, more)

    if obj.rel_change is None or obj.ci_low is None:
        missing = _unmeasured(obj, "the objective ")
        why = missing or (
            f"{describe_delta(obj)}: the objective has no relative change or interval (a zero baseline, or too few "
            "values)"
        )
        return decision(INCONCLUSIVE, why)
    lower_better = objective.direction == "minimize"
    point, lo, hi = _improvement(obj, lower_better)
    if min(len(a), len(b)) < MIN_TRIALS_TO_DECIDE:
        return decision(
            INCONCLUSIVE,
            f"{describe_delta(obj)} from {len(a)} vs {len(b)} trial(s); a single run "
            f"misleads, so at least {MIN_TRIALS_TO_DECIDE} per side are needed to decide"
            + "".join(f"; {note}" for note in unmeasured_guards),
            MIN_TRIALS_TO_DECIDE - min(len(a), len(b)),
        )

    n, cap = len(b), max(MORE_TRIALS_CAP, trials.max_repeats)
    regressed: list[str] = []
    unsettled: list[str] = []
    pending: list[int | None] = []  # more trials per side each unsettled part needs (None: not decidable)
    for guard, delta in zip(goals.guards, guard_deltas, strict=True):
        lower = guard.direction == "minimize"
        outcome = guard_outcome(delta, lower, guard.tolerance)
        if outcome == BEYOND:
            change = (
                describe_delta(delta)
                if delta.rel_change is not None
                else f"{label_of(delta.metric)} from 0 to {fmt_full(delta.metric, delta.candidate)},"
            )
            regressed.append(f"{change} beyond its {guard.tolerance:.0%} tolerance")
        elif outcome == UNSETTLED:
            worse, worst = _worse_by(delta, lower)
            more = None if worst is None else _more_trials(n, worst - worse, guard.tolerance - worse, cap)
            pending.append(more)
            bound = "no interval" if worst is None else f"its worse bound {fmt_pct(worst if lower else -worst)}"
            unsettled.append(
                f"guard {describe_delta(delta)} not shown within its {guard.tolerance:.0%} tolerance ({bound}), "
                + _settle_text(more, cap, "settle")
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
    if point < objective.min_effect:
        more = _more_trials(n, hi - point, objective.min_effect - point, cap)
    else:
        more = _more_trials(n, point - lo, point, cap)
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
