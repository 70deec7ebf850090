"""The output-comparison statistics of the quality guard: each probe's answer on both sides compared token by token,
the quality.* figures with confidence intervals over probes, and their say in a step's verdict."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from llmplay.catalog import QUALITY_METRICS, fmt_full, label_of
from llmplay.loadgen.probes import ProbeResult
from llmplay.outcomes import INCONCLUSIVE, KEPT, REJECTED, MetricDelta
from llmplay.spec import Guard
from llmplay.stats.decide import Decision
from llmplay.stats.guards import BEYOND, HOLDS, guard_outcome
from llmplay.stats.intervals import t_mean_interval, wilson_interval

# Why the logprob shift can be missing, in the words the verdict and the report use.
NO_LOGPROBS = "the engine returned no log-probabilities for the probes"
NO_PROBES = "no probe result on one side (its trials failed, or the engine answered no probe)"


# ---------------------------------------------------------------------------------------------- per probe
@dataclass(frozen=True)
class ProbeComparison:
    """One probe on both sides: same answer?, the share of the baseline's tokens reproduced before the first
    divergence, and the mean |Δ logprob| over that agreed prefix (None where a side has no log-probabilities)."""

    index: int
    prompt: str
    baseline: str
    candidate: str
    exact: bool
    agreement: float
    split_token: int | None  # index of the first differing token; None when they agree throughout
    logprob_shift: float | None


def compare_probe(index: int, a: ProbeResult, b: ProbeResult) -> ProbeComparison:
    n = 0
    for ta, tb in zip(a.tokens, b.tokens, strict=False):
        if ta != tb:
            break
        n += 1
    same = a.text == b.text and a.tokens == b.tokens
    agreement = 1.0 if not a.tokens else n / len(a.tokens)
    split = None if same else n
    shift = None
    if a.logprobs is not None and b.logprobs is not None:
        # Up to the split both sides scored the same tokens, so their log-probabilities compare one to one; at
        # least the first token is always shared context (the same prompt), so a shift exists for every probe.
        k = max(1, min(n + (0 if same else 1), len(a.logprobs), len(b.logprobs)))
        if len(a.logprobs) and len(b.logprobs):
            shift = float(np.mean(np.abs(np.array(a.logprobs[:k]) - np.array(b.logprobs[:k]))))
    return ProbeComparison(index, a.prompt, a.text, b.text, same, agreement, split, shift)


def compare_probes(baseline: Sequence[ProbeResult], candidate: Sequence[ProbeResult]) -> list[ProbeComparison]:
    """Probe by probe, in order; probes that errored on either side are left out (they say nothing of outputs)."""
    return [
        compare_probe(i, a, b)
        for i, (a, b) in enumerate(zip(baseline, candidate, strict=False))
        if a.error is None and b.error is None
    ]


# ---------------------------------------------------------------------------------------------- over probes
@dataclass(frozen=True)
class QualityFigure:
    """A quality.* figure of a candidate against its baseline: the value, its CI over probes, or why it is absent."""

    metric: str
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n_probes: int
    absent: str | None = None


def t_interval(values: Sequence[float], confidence: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """Student-t interval of a mean over probes (the probes are the experimental unit), clipped to `bounds`."""
    low, high = t_mean_interval(values, confidence)
    return max(bounds[0], low), min(bounds[1], high)


def quality_figures(comparisons: Sequence[ProbeComparison], confidence: float = 0.95) -> dict[str, QualityFigure]:
    """quality.exact_match (Wilson), quality.token_agreement and quality.logprob_shift (t over probes)."""
    n = len(comparisons)
    if n == 0:
        return {m: QualityFigure(m, None, None, None, 0, NO_PROBES) for m in QUALITY_METRICS}
    hits = sum(c.exact for c in comparisons)
    lo, hi = wilson_interval(hits, n, confidence)
    out = {"quality.exact_match": QualityFigure("quality.exact_match", hits / n, lo, hi, n)}
    agreement = [c.agreement for c in comparisons]
    lo, hi = t_interval(agreement, confidence, (0.0, 1.0))
    out["quality.token_agreement"] = QualityFigure("quality.token_agreement", float(np.mean(agreement)), lo, hi, n)
    shifts = [c.logprob_shift for c in comparisons if c.logprob_shift is not None]
    if len(shifts) < n:
        out["quality.logprob_shift"] = QualityFigure("quality.logprob_shift", None, None, None, n, NO_LOGPROBS)
    else:
        lo, hi = t_interval(shifts, confidence, (0.0, math.inf))
        out["quality.logprob_shift"] = QualityFigure("quality.logprob_shift", float(np.mean(shifts)), lo, hi, n)
    return out


# The baseline compared with itself: every probe identical, no shift. The guard's reference point.
_SELF = {"quality.exact_match": 1.0, "quality.token_agreement": 1.0, "quality.logprob_shift": 0.0}


def quality_delta(figure: QualityFigure) -> MetricDelta:
    """A quality figure as the MetricDelta guards and the archive take. The baseline side is the baseline against
    itself (100% match, no shift); the change is absolute, in the metric's own unit (a share, or nats for the
    shift), since a relative change from 0 nats means nothing. Its CI is the figure's CI over probes."""
    base = _SELF[figure.metric]
    if figure.value is None:
        return MetricDelta(figure.metric, base, None, None, None, None, n_baseline=figure.n_probes)
    lo = None if figure.ci_low is None else figure.ci_low - base
    hi = None if figure.ci_high is None else figure.ci_high - base
    change = figure.value - base
    better = None if change == 0 else change < 0 if figure.metric == "quality.logprob_shift" else change > 0
    return MetricDelta(
        figure.metric,
        base,
        figure.value,
        change,
        lo,
        hi,
        better=better,
        n_baseline=figure.n_probes,
        n_candidate=figure.n_probes,
    )


def describe_quality(delta: MetricDelta) -> str:
    """The candidate's figure with its CI over probes, e.g. "... 62.0% [48.1%, 75.9%]"."""
    text = f"{label_of(delta.metric)} {fmt_full(delta.metric, delta.candidate)}"
    if delta.ci_low is None or delta.ci_high is None or delta.baseline is None:
        return text
    low, high = (fmt_full(delta.metric, bound + delta.baseline) for bound in (delta.ci_low, delta.ci_high))
    return f"{text} [{low}, {high}]"


def apply_quality_guards(
    decision: Decision,
    quality_deltas: Mapping[str, MetricDelta],
    guards: Sequence[Guard],
    *,
    by_default: bool = False,
    absent: Mapping[str, str] | None = None,
) -> Decision:
    """The step decision with its quality guards applied: a quality regression beyond tolerance rejects the step
    and is named as the reason; a quality guard that is not measured keeps the step from being kept (nobody saw
    the outputs stay the same). Tolerances are absolute, in the metric's unit (5% agreement, 0.05 nats)."""
    checked = [quality_deltas[g.metric] for g in guards if g.metric in quality_deltas]
    deltas = (*decision.deltas, *(d for d in quality_deltas.values() if d not in decision.deltas))
    out = replace(decision, guards=(*decision.guards, *checked), deltas=deltas)
    if decision.verdict not in (KEPT, INCONCLUSIVE, REJECTED) or not guards:
        return out
    note = " (quality guard added by default: the knob can change outputs)" if by_default else ""
    beyond, missing = [], []
    for g in guards:
        delta = quality_deltas.get(g.metric)
        lower = g.metric == "quality.logprob_shift"
        # guard_outcome takes relative changes; ours are absolute, so hand it the absolute change as "relative".
        outcome = None if delta is None else guard_outcome(delta, lower, g.tolerance)
        if outcome == BEYOND:
            beyond.append(f"{describe_quality(delta)} beyond its {g.tolerance:g} tolerance")  # type: ignore[arg-type]
        elif outcome is None:
            missing.append(f"{label_of(g.metric)} not measured ({(absent or {}).get(g.metric, NO_PROBES)})")
        elif outcome != HOLDS and decision.verdict == KEPT:
            missing.append(f"{describe_quality(delta)} not yet within its {g.tolerance:g} tolerance")  # type: ignore[arg-type]
    if beyond:
        return replace(out, verdict=REJECTED, reason=f"quality regressed: {'; '.join(beyond)}{note}; {decision.reason}")
    if missing and decision.verdict == KEPT:
        return replace(out, verdict=INCONCLUSIVE, reason=f"quality guard unsettled: {'; '.join(missing)}{note}")
    if note:
        return replace(out, reason=decision.reason + note)
    return out
