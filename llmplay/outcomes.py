"""What a decision says, as the archive keeps it: the verdict names, one metric's change with its interval, and one
gate against a configuration's figures. stats makes them and archive stores them (archive.model re-exports them), so
they live below both and import nothing of llmplay.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass

KEPT, REJECTED, INCONCLUSIVE, FAILED = "kept", "rejected", "inconclusive", "failed"


@dataclass(frozen=True)
class MetricDelta:
    metric: str
    baseline: float | None
    candidate: float | None
    rel_change: float | None  # (candidate - baseline) / baseline
    ci_low: float | None  # CI of rel_change at `confidence`, over `units` trials or pairs (see `method`)
    ci_high: float | None
    # Runs archived before it was dropped carry a Mann-Whitney p-value here: it ignored that requests cluster within
    # trials and tested whole distributions, not the percentile decided on. Accepted so they load, never kept.
    p_value: InitVar[float | None] = None
    better: bool | None = None  # direction-aware: is the candidate better?
    # How many requests each side's figure rests on, pooled over its trials (None: no per-request metric, or unknown).
    n_baseline: int | None = None
    n_candidate: int | None = None
    # What the interval rests on: its experimental units (complete A/B pairs, or the smaller side's trials), the
    # method (stats.intervals) and its nominal two-sided level (below the confidence in sequential mode, where
    # every look spends part of the error rate). None in archives written before they were recorded.
    units: int | None = None
    method: str | None = None
    confidence: float | None = None
    # A rate of requests (catalog.RATE_METRICS): the change in points (candidate - baseline, 0.01 == 1pp) with its
    # interval over the pooled requests at `confidence`; what a guard in points is judged on. None elsewhere.
    points: float | None = None
    points_low: float | None = None
    points_high: float | None = None

    def __post_init__(self, p_value: float | None) -> None:
        del p_value  # read from old archives, ignored (see above)


@dataclass(frozen=True)
class GateResult:
    gate: str  # as written
    metric: str
    op: str
    threshold: float
    observed: float | None
    met: bool | None  # None: not measured
    margin: float | None  # relative headroom: positive = met with room
    # Why it is not measured (catalog.absence_reason), or that its percentile rests on too few requests.
    note: str | None = None
