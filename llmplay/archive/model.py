"""What a tuning run produces, as plain frozen values: trials, comparisons, verdicts, the run.

These are the contract between the runner (which makes them) and the archive (which stores them as
JSON in manifest.json); the report reads them back from the archive only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field, fields
from typing import Any

TRIAL_OK, TRIAL_FAILED, TRIAL_INTERRUPTED = "ok", "failed", "interrupted"
KEPT, REJECTED, INCONCLUSIVE, FAILED = "kept", "rejected", "inconclusive", "failed"


@dataclass(frozen=True)
class ConfigRecord:
    """One measured configuration as the archive keeps it."""

    config_id: str  # "baseline", or the step name whose change produced it
    engine: Mapping[str, Any]  # EngineSpec as a dict (secrets redacted)
    workload: Mapping[str, Any]  # Workload as a dict
    command: tuple[str, ...]  # the engine's argv inside the container
    docker_command: str  # the equivalent `docker run` line for humans


@dataclass(frozen=True)
class TrialRecord:
    trial_id: str  # "t003"
    config_id: str
    step: str | None  # the step this trial was measured for (None: baseline-only run)
    role: str  # "baseline" | "candidate"
    repeat: int  # 0-based repeat within its role for this step
    status: str  # ok | failed | interrupted (a signal; finished requests kept, resume re-runs it)
    started_utc: str
    wall_s: float
    summary: Mapping[str, float]  # flat metric paths -> value (load + telemetry + cost); absent = not measured
    engine_describe: Mapping[str, Any] = field(default_factory=dict)  # version, image digest, command, container id
    error: str | None = None  # failure cause, one line
    files: Mapping[str, str] = field(default_factory=dict)  # role -> relative path: records, telemetry, log
    notes: tuple[str, ...] = ()  # e.g. "no NVML: ...", "output tokens counted, not from usage"
    # The cluster node that ran it (runtime ray): id, address, hostname; empty on one machine.
    node: Mapping[str, str] = field(default_factory=dict)
    # Why its figures are not used: its node was lost before its A/B pair finished, so the whole pair was measured
    # again on one other node (the decision then pairs the two trials of the re-run). None: used as measured.
    superseded: str | None = None
    # Other llmplay runs live on this host at some time during the trial (run_id, playbook, pid, host): they
    # competed for its CPUs and GPUs, so its figures may be slower and noisier than on a quiet machine.
    # Empty: none; None: not looked for (a cluster trial, a host registry that could not be read).
    shared_with: tuple[Mapping[str, Any], ...] | None = None


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
    # method (tuning.intervals) and its nominal two-sided level (below the confidence in sequential mode, where
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
class StepVerdict:
    step: str
    index: int
    verdict: str  # kept | rejected | inconclusive | failed
    reason: str  # one sentence, e.g. "P95 TTFT −31% [−36%, −25%], no guard regressed; kept"
    changes: tuple[str, ...]  # "args.parallel: 1 -> 4"
    bundle: bool
    baseline_config: str
    candidate_config: str
    objective: MetricDelta | None
    guards: tuple[MetricDelta, ...]
    deltas: tuple[MetricDelta, ...]  # every tuning-record metric, for the full regression view
    trials_baseline: tuple[str, ...]
    trials_candidate: tuple[str, ...]
    more_trials_needed: int | None = None  # inconclusive: estimate to decide
    carried: bool = False  # did this step's config become the new best


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


@dataclass(frozen=True)
class Finding:
    """A diagnosis finding: what the checklist rules of tuning.diagnose produce and the archive keeps."""

    id: str
    severity: str  # info | warn | critical
    title: str
    evidence: str  # the numbers that triggered it
    suggestion: str  # next step(s), cheapest first (CHECKLIST §7)
    checklist_ref: str  # "§4", "§5", "§6"


def to_plain(obj: Any) -> Any:
    """Dataclasses, mappings and tuples -> JSON-ready values."""
    if hasattr(obj, "__dataclass_fields__"):
        # Not dataclasses.asdict: it deep-copies, and the frozen mappings (mappingproxy) cannot be copied.
        return {f.name: to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj
