"""What a tuning run produces, as plain frozen values: trials, comparisons, verdicts, the diagnosis, the run.

These are the contract between the runner (which makes them) and the archive (which stores them as
JSON in manifest.json); archive.convert turns the JSON back into them once, older archive versions included, and
the report, compare and the console read nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, overload

import numpy as np

from llmplay.engines.knobs import Direction, Remedy
from llmplay.outcomes import FAILED as FAILED
from llmplay.outcomes import INCONCLUSIVE as INCONCLUSIVE
from llmplay.outcomes import KEPT as KEPT
from llmplay.outcomes import REJECTED as REJECTED
from llmplay.outcomes import GateResult as GateResult
from llmplay.outcomes import MetricDelta as MetricDelta
from llmplay.runtime.base import EngineDescription as EngineDescription
from llmplay.spec import EngineSpec, Workload
from llmplay.spec import Scalar as KnobValue  # a knob's value: None is the engine default

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

TRIAL_OK, TRIAL_FAILED, TRIAL_INTERRUPTED = "ok", "failed", "interrupted"


@dataclass(frozen=True)
class ConfigRecord:
    """One measured configuration as the archive keeps it."""

    config_id: str  # "baseline", or the step name whose change produced it
    engine: EngineSpec  # secrets redacted once archived
    workload: Workload
    command: tuple[str, ...]  # the engine's argv inside the container
    docker_command: str  # the equivalent `docker run` line for humans


@dataclass(frozen=True)
class SharedRun:
    """Another llmplay run that was live on the same host during a trial."""

    run_id: str
    playbook: str  # "?" when it did not say
    pid: str


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
    engine_describe: EngineDescription | None = None  # version, image digest, command; None: never described
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
    shared_with: tuple[Mapping[str, object], ...] | None = None

    @property
    def sharing(self) -> tuple[SharedRun, ...]:
        """The other runs live on the host during the trial, as records (empty when none, or not looked for)."""
        return tuple(
            SharedRun(str(o.get("run_id")), str(o.get("playbook") or "?"), str(o.get("pid", "?")))
            for o in self.shared_with or ()
        )

    @property
    def node_label(self) -> str:
        """The cluster node as people name it, "10.0.0.5 (3f2a9c1b)"; "" on one machine."""
        if not self.node.get("id"):
            return ""
        return f"{self.node.get('address') or self.node.get('hostname', '')} ({self.node['id'][:8]})"


@dataclass(frozen=True)
class SearchValue:
    """One value a search step raced: its configuration, its objective change against the incumbent over every
    pair it ran (at the run's confidence, not corrected for selection), what became of it, and its pooled figures
    (what the report's value and Pareto charts plot)."""

    value: KnobValue
    config_id: str  # "<step>=<value>"
    pairs: int
    effect: MetricDelta | None
    status: str  # winner | beats the incumbent | rejected against the incumbent | shown worse than the leader | ...
    left_at_round: int | None = None
    reason: str = ""
    trials: tuple[str, ...] = ()
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchRecord:
    """How a search step chose its value (stats.search): every value raced against the incumbent in rounds that
    share one request sequence, the winner's gain re-estimated from pairs that did not select it, and the engine
    time the race cost against a full grid."""

    target: str  # the knob, a Change target: "args.parallel"
    incumbent_value: KnobValue
    incumbent_config: str
    incumbent_metrics: Mapping[str, float]
    values: tuple[SearchValue, ...]
    chosen: KnobValue  # the winner when kept, else the value shown as the candidate (the leader)
    seed: int  # the arms' order within each round is drawn from it
    rounds: int
    trials: int
    first_rounds: int
    max_rounds: int
    confirm_rounds: int
    gain: MetricDelta | None  # the winner's gain (see gain_method); None without a winner
    gain_method: str
    engine_s: float
    grid_engine_s: float  # every value and the incumbent measured as often as the most-measured value
    grid_max_rounds_engine_s: float  # ... as often as the design allows one value
    unimodal: bool | None
    familywise: str
    finished: bool = True  # False: the run stopped mid-search; the record holds what was measured


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
    search: SearchRecord | None = None  # a search step's race (None: a step of fixed changes, or an older archive)
    # The step's own paired noise per metric decided on: (metric, variance of per-pair log ratios, degrees of
    # freedom), what later runs borrow (trials.noise: history); empty in older archives and unpaired steps.
    noise: tuple[tuple[str, float, int], ...] = ()
    noise_runs: tuple[str, ...] = ()  # the earlier runs whose noise its intervals pooled


@dataclass(frozen=True)
class Candidate:
    """A step a finding calls for, typed: which checklist remedy, which way, and why (the finding and its numbers).
    Which knob implements it is the engine's business (its adapter's knob map)."""

    remedy: Remedy
    direction: Direction
    finding_id: str
    evidence: str


@dataclass(frozen=True)
class Finding:
    """A diagnosis finding: what the checklist rules of diagnose produce and the archive keeps."""

    id: str
    severity: str  # info | warn | critical
    title: str
    evidence: str  # the numbers that triggered it
    suggestion: str  # next step(s), cheapest first (CHECKLIST §7)
    checklist_ref: str  # "§4", "§5", "§6"
    candidates: tuple[Candidate, ...] = ()  # the suggestion's engine remedies, cheapest first


Scalar = str | int | float | bool


@dataclass(frozen=True)
class MemoryFacts:
    """Where the final configuration's peak memory went (diagnose.memory.MemoryBreakdown as archived); a
    figure the run could not get is None. Peak and capacity are GPU memory, or host RSS and RAM when `device` is
    "cpu"."""

    weights_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    tokens_in_flight: float | None = None
    kv_bytes: float | None = None
    other_bytes: float | None = None
    peak_bytes: float | None = None
    capacity_bytes: float | None = None
    kv_share: float | None = None
    peak_frac: float | None = None
    device: str = "gpu"  # archives from before CPU runs were diagnosed measured GPUs only
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RooflineFacts:
    """The decode roofline of the final configuration (diagnose.roofline.Roofline as archived)."""

    floor_s: float  # the best TPOT the memory bandwidth allows
    bytes_per_step: float | None = None
    bandwidth_bytes_s: float | None = None
    achieved_tpot_s: float | None = None
    achieved_over_floor: float | None = None
    bandwidth_util: float | None = None
    achieved_bandwidth_bytes_s: float | None = None
    bandwidth_source: str = ""


@dataclass(frozen=True)
class RuleChecked:
    """One checklist rule the diagnosis evaluated (listed so a missing finding reads as "checked, fine")."""

    id: str
    section: str  # "§4"
    title: str


@dataclass(frozen=True)
class Diagnosis:
    """The final configuration's diagnosis beside its findings: model facts, memory, roofline, scheduler, notes."""

    notes: tuple[str, ...] = ()
    model: Mapping[str, Scalar] = field(default_factory=dict)  # facts the engine or model file gave, by name
    memory: MemoryFacts | None = None
    roofline: RooflineFacts | None = None
    scheduler: Mapping[str, Scalar | None] = field(default_factory=dict)  # None: not known for this engine
    rules: tuple[RuleChecked, ...] | None = None  # None: an archive from before the rules were listed


@dataclass(frozen=True)
class TuningRow:
    """One row of the tuning record: a configuration's pooled figures and, for a step's candidate, its verdict."""

    config_id: str
    trials: tuple[str, ...]
    metrics: Mapping[str, float]  # pooled over its ok trials; absent = not measured
    failed_trials: int = 0
    # Request counts its percentiles rest on; empty in archives from before they were kept.
    samples: Mapping[str, int] = field(default_factory=dict)
    step: str | None = None  # None: the baseline row
    verdict: str | None = None
    reason: str = ""
    compared_with: str = ""
    changes: tuple[str, ...] = ()
    rebuilt: bool = False  # not archived (an interrupted run): rebuilt by the reader from its trials' summaries


@dataclass(frozen=True)
class TrialRequests:
    """One trial's measured requests as the charts need them (computed by llmplay.metrics in the reader)."""

    latency_s: Mapping[str, np.ndarray]  # per_request_arrays: ttft, tpot, itl (pooled), e2el, ... seconds
    timeline: Mapping[str, np.ndarray]  # request_timeline: done_s, ttft, input/output tokens; send_gap_s


@dataclass(frozen=True)
class EngineFacts:
    """The final configuration's engine as archived: the trials' own description of it (the last of a trial of
    the final configuration, else of any trial), and the configuration's spec where the trials did not say."""

    kind: str
    model: str
    image: str | None  # as the trial described it, else as configured
    version: str | None  # None: the engine did not report one
    digest: str | None
    images: tuple[str, ...]  # every image some trial ran (several after a retest on a new image)

    @property
    def label(self) -> str:
        """As people name it: image and version ("llmplay/llamacpp-cpu:local b4567")."""
        image = self.image or self.kind or "?"
        return f"{image} {self.version}" if self.version else image


@dataclass(frozen=True)
class GpuInfo:
    name: str | None = None
    driver: str | None = None
    cuda: str | None = None
    count: int = 1
    error: str | None = None  # why NVML could not say


@dataclass(frozen=True)
class Environment:
    """Where the run ran, as the runner described it; None where it did not say."""

    started_utc: str = ""
    user: str | None = None
    host: str | None = None
    platform: str = ""
    llmplay_version: str | None = None
    python: str = ""
    docker: str | None = None  # its version as text
    seed: int | str | None = None
    gpu: GpuInfo | None = None

    @property
    def gpu_label(self) -> str:
        gpu = self.gpu
        if gpu is None or not gpu.name:
            return "CPU only"
        return f"{gpu.count}x {gpu.name}" if gpu.count > 1 else gpu.name


@dataclass(frozen=True)
class PlaybookRef:
    """The playbook the run was made from: its name and version, where it was, its hash, its copy in the run."""

    name: str
    version: str = ""
    path: str = ""
    sha256: str = ""
    file: str = "playbook.yaml"  # layout.PLAYBOOK_FILE


@dataclass(frozen=True)
class RunInfo:
    """The head of an archived run's manifest: what it was, where, and how it ended."""

    run_id: str
    playbook: PlaybookRef
    environment: Environment
    status: str
    exit_code: int | None = None
    final_config_id: str | None = None
    finished_utc: str = ""
    overrides: Mapping[str, object] = field(default_factory=dict)  # command-line overrides as given (JSON values)
    repeats_override: int | None = None  # overrides' "repeats", when it is a number
    image_override: str | None = None  # overrides' "image": the run re-tested the playbook on another engine image
    only_override: tuple[str, ...] = ()  # overrides' "only": the steps run alone
    capacity_override: bool = False  # overrides' "capacity": `llmplay capacity`, every trial a capacity search
    files: int = 0  # how many files the manifest hashes
    file_sha256: Mapping[str, str] = field(default_factory=dict)  # relative path -> the hash the manifest records
    manifest_sha256: str = ""
    report_error: str | None = None
    redacted: tuple[str, ...] = ()  # where values were blanked as secrets (paths and files, never the values)


@dataclass(frozen=True)
class TrialsAsRun:
    """The archived playbook's `trials:` as written; spec.Trials' defaults where it is silent."""

    repeats: int
    interleave: bool
    sequential: bool
    confidence: float
    pool_noise: bool
    noise: str = ""  # trials.noise as written ("" when not: step, or run with pool_noise)


@dataclass(frozen=True)
class PlaybookAsRun:
    """What the report quotes of the archived playbook, as its text says it (not as today's loader would parse it,
    so a playbook an older llmplay accepted still reads)."""

    objective: str  # "maximize throughput.output_tok_s"; "" when none is written
    min_effect: float
    guards: tuple[str, ...]  # "ttft.p95 within 50%"
    slo: str  # "ttft 2s, tpot 200ms"
    trials: TrialsAsRun
    step_descriptions: Mapping[str, str]


@overload
def to_plain(obj: DataclassInstance | Mapping[str, object]) -> dict[str, object]: ...
@overload
def to_plain(obj: list[object] | tuple[object, ...]) -> list[object]: ...
@overload
def to_plain(obj: object) -> object: ...
def to_plain(obj: object) -> object:
    """Dataclasses, mappings and tuples -> JSON-ready values."""
    if is_dataclass(obj):
        # Not dataclasses.asdict: it deep-copies, and the frozen mappings (mappingproxy) cannot be copied.
        return {f.name: to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj
