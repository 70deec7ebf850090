"""The playbook document as the JSON Schema (schemas/playbook.v1.json) has checked it: one TypedDict per mapping
the converters read, so a key they read has the type the schema allows it.

yaml.safe_load gives an untyped document; the loader states it is a `PlaybookDoc` once, after `schema_problems`
found nothing, and the converters take the sections from there. A key the schema makes optional is optional here
(total=False); the converters apply the defaults.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from llmplay.spec import Scalar

Duration = str | int | float  # "500ms", "2m", or seconds
Fraction = str | int | float  # "5%", or a share


class MetadataDoc(TypedDict, total=False):
    name: str
    version: str | int | float
    owner: str
    description: str
    tags: list[str]


class GateDoc(TypedDict):
    metric: str
    op: str
    value: str | int | float


class ObjectiveDoc(TypedDict, total=False):
    minimize: str
    maximize: str
    min_effect: Fraction


class GuardDoc(TypedDict, total=False):
    metric: str
    tolerance: Fraction


class FromWorkloadDoc(TypedDict, total=False):
    seed: int


class QualityDoc(TypedDict, total=False):
    probes: str
    from_workload: FromWorkloadDoc
    num_prompts: int
    max_tokens: int
    checks: list[str]
    tolerance: Fraction


class CapacityDoc(TypedDict, total=False):
    search: str
    bounds: list[int | float]
    attainment: Fraction
    precision: Fraction
    probe: Duration
    settle: Duration
    max_engine_time: Duration
    replicates: int
    confidence: float
    engine: str


class GoalsDoc(TypedDict, total=False):
    gates: list[str | GateDoc]
    objective: ObjectiveDoc
    guards: list[GuardDoc]
    slo: dict[str, Duration]
    quality: QualityDoc
    capacity: CapacityDoc


class LengthParams(TypedDict, total=False):
    """The parameters of one length distribution: `choice` has values (and weights), the others a range or a mean."""

    values: list[int]
    weights: list[int | float]
    min: int
    max: int
    mean: int | float
    std: int | float
    sigma: int | float


LengthDoc = int | dict[str, int | LengthParams]  # a fixed length, or one {kind: params}


class ThinkParams(TypedDict, total=False):
    """A think-time distribution's parameters: durations, and lognormal's sigma."""

    min: Duration
    max: Duration
    mean: Duration
    sigma: float


ThinkTimeDoc = Duration | dict[str, Duration | ThinkParams]  # a duration, or one {kind: params} ({fixed: duration})


class TraceDoc(TypedDict, total=False):
    file: str
    format: str
    start: Duration
    duration: Duration
    time_scale: float
    input_scale: float
    output_scale: float
    max_input_tokens: int
    max_output_tokens: int
    block_tokens: int


class WorkloadDoc(TypedDict, total=False):
    api: str
    input: LengthDoc
    output: LengthDoc
    dataset: str
    prefix_tokens: int
    prefix_groups: int
    turns: int
    think_time: ThinkTimeDoc
    session_header: str
    concurrency: int
    rate: float
    arrival: str
    burst: int
    sweep: list[float]
    streaming_fraction: float
    max_tokens: int
    ignore_eos: bool
    temperature: float
    seed: int
    warmup: Duration
    warmup_requests: int
    duration: Duration
    num_requests: int
    request_timeout: Duration
    trace: TraceDoc


class HealthDoc(TypedDict, total=False):
    path: str
    timeout: Duration


class EngineDoc(TypedDict, total=False):
    kind: str
    model: str
    image: str
    model_dir: str
    served_model_name: str
    gpus: int | list[str | int]
    args: dict[str, Scalar]
    extra_args: list[str]
    env: dict[str, str | int | float | bool]
    port: int
    health: HealthDoc
    shm_size: str
    ipc: str
    network: str
    executable: str


# `set` is a builtin's name, so the functional form.
class StepDoc(TypedDict, total=False):
    name: str
    set: dict[str, object]
    search: dict[str, object]
    bundle: bool
    carry: str
    description: str
    max_candidates: int


class TrialsDoc(TypedDict, total=False):
    repeats: int
    interleave: bool
    sequential: bool
    max_repeats: int | Literal["auto"]
    budget: Duration
    confidence: float
    pool_noise: bool
    noise: str
    on_failure: str
    cooldown: Duration


class RuntimeDoc(TypedDict, total=False):
    kind: str
    url: str
    docker_host: str
    address: str
    inner: str
    accelerator_type: str
    cpus_per_trial: float


class TuneBudgetDoc(TypedDict, total=False):
    engine_time: Duration
    steps: int


class TuneDoc(TypedDict, total=False):
    budget: TuneBudgetDoc
    allow: list[str]
    deny: list[str]
    values: dict[str, list[Scalar]]
    retry_rejected: bool
    race: int


class PlaybookDoc(TypedDict, total=False):
    apiVersion: str
    kind: str
    extends: str | list[str]
    metadata: MetadataDoc
    goals: GoalsDoc
    workload: WorkloadDoc
    engine: EngineDoc
    steps: list[StepDoc]
    trials: TrialsDoc
    cost: dict[str, Fraction]
    runtime: str | RuntimeDoc
    tune: TuneDoc
