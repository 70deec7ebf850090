"""The typed, frozen form of a validated playbook: what every later stage trusts.

Units crossing module boundaries are SI and named: seconds (`_s`), tokens,
requests per second, US dollars. Nothing here parses or validates; that is
the playbook package's job at the edge. A step applied to a configuration is a pure function of
these values, so it lives here too: the loader checks steps with it and the plan builds with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol, TypeVar, cast

Scalar = str | int | float | bool | None
V = TypeVar("V")


def frozen_map(d: Mapping[str, V] | None = None) -> Mapping[str, V]:
    """A read-only copy, so a frozen dataclass holding it stays frozen."""
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class Metadata:
    name: str
    version: str = "0"
    owner: str = ""
    description: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Gate:
    """`metric op value`, e.g. ttft.p95 < 0.5 (seconds)."""

    metric: str  # e.g. "ttft.p95", "throughput.output_tok_s"
    op: str  # one of < <= > >=
    value: float  # SI units: seconds, tok/s, req/s, USD, fraction
    text: str  # as written in the playbook, for reports

    def holds(self, observed: float | None) -> bool | None:
        if observed is None:
            return None
        return {
            "<": observed < self.value,
            "<=": observed <= self.value,
            ">": observed > self.value,
            ">=": observed >= self.value,
        }[self.op]


@dataclass(frozen=True)
class Objective:
    direction: str  # "minimize" | "maximize"
    metric: str
    min_effect: float = 0.02  # relative change that counts as real


@dataclass(frozen=True)
class Guard:
    """A metric that must not regress by more than `tolerance`: relative, or in points of a rate when `absolute`."""

    metric: str
    tolerance: float  # 0.05 == 5 % worse allowed; absolute: 0.005 == half a percentage point
    direction: str  # "minimize" (lower is better) | "maximize"
    absolute: bool = False

    @property
    def tolerance_text(self) -> str:
        return f"{self.tolerance * 100:g}pp" if self.absolute else f"{self.tolerance:.0%}"


@dataclass(frozen=True)
class QualitySpec:
    """goals.quality: the greedy probes each configuration answers after its timed load, and the default guards a
    step whose knob risks accuracy is judged by (tolerances absolute: 0.1 == ten points of exact match)."""

    prompts: tuple[str, ...]
    source: str  # where the prompts came from, for the report ("probes.jsonl", "workload prompts, seed 7")
    max_tokens: int = 32
    checks: tuple[str, ...] = ("quality.exact_match", "quality.token_agreement", "quality.logprob_shift")
    default_guards: tuple[Guard, ...] = ()


@dataclass(frozen=True)
class CapacitySpec:
    """goals.capacity: the most load one replica takes while `attainment` of its requests meet every goals.slo.

    The search probes `search` (rate: open loop, req/s; concurrency: closed loop, users) between `low` and `high`,
    each probe `probe_s` long, until the feasible maximum and the infeasible minimum are within `precision`
    (relative) of each other, or `max_engine_s` of load has been spent."""

    search: str  # "rate" | "concurrency"
    low: float
    high: float
    attainment: float = 0.95  # share of requests meeting every SLO, in (0, 1]
    precision: float = 0.05  # relative width of the final bracket
    probe_s: float = 10.0
    settle_s: float = 1.0  # idle time between probes on one engine, so one probe's backlog does not leak into the next
    max_engine_s: float = 600.0  # cap on the load time (probes and settles) of one search
    replicates: int = 3  # most runs of one load, spent only while its attainment CI straddles the target
    confidence: float = 0.95  # of each probe's attainment interval
    engine: str = "shared"  # "shared": one engine start serves the whole search | "fresh": one per probe


@dataclass(frozen=True)
class Goals:
    gates: tuple[Gate, ...] = ()
    objective: Objective = Objective("minimize", "ttft.p95")
    guards: tuple[Guard, ...] = ()
    # per-request SLOs used for goodput, seconds: {"ttft": 0.5, "tpot": 0.03, "e2el": ...}
    slo_s: Mapping[str, float] = field(default_factory=frozen_map)
    quality: QualitySpec | None = None
    capacity: CapacitySpec | None = None


@dataclass(frozen=True)
class LengthDist:
    """Token-length distribution. kind: fixed|uniform|normal|lognormal|choice."""

    kind: str
    value: int | None = None  # fixed
    min: int | None = None  # uniform / clip bounds
    max: int | None = None
    mean: float | None = None  # normal / lognormal (mean of the lengths)
    std: float | None = None  # normal std; lognormal sigma of log-lengths
    values: tuple[int, ...] = ()  # choice
    weights: tuple[float, ...] = ()  # choice


@dataclass(frozen=True)
class TraceFacts:
    """What the playbook loader measured on a trace's window, scaled as the workload says: the plan prints it and
    the context check uses it without reading the file again. Lengths in tokens, times in trace seconds."""

    requests: int  # rows in the window (warm-up included)
    span_s: float  # trace time from the window's first request to its last
    input_mean_tokens: float
    output_mean_tokens: float
    longest_input_tokens: int
    longest_output_tokens: int
    longest_line: int  # the line of the request with the most input + output tokens
    longest_tokens: int  # that request's input + output tokens
    prefix_reuse: float  # share of input tokens that repeat an earlier request's prefix (the hash ids say which)


@dataclass(frozen=True)
class TraceSpec:
    """workload.trace: a request trace replayed open loop at its (scaled) timestamps."""

    file: str  # absolute path
    format: str  # "mooncake" | "azure" | "burstgpt"
    start_s: float = 0.0  # window start, trace seconds after the trace's first request
    duration_s: float | None = None  # window length in trace seconds; None: to the end (or num_requests)
    time_scale: float = 1.0  # multiplies every gap: 0.5 replays twice as fast (workload.rate sets it from a mean)
    input_scale: float = 1.0
    output_scale: float = 1.0
    max_input_tokens: int | None = None  # cap after scaling, so long prompts fit the model's context
    max_output_tokens: int | None = None
    block_tokens: int = 512  # tokens per hash id in the trace; scaled with input_scale
    facts: TraceFacts | None = None


@dataclass(frozen=True)
class ThinkTime:
    """A user's pause between a reply and their next turn, in seconds. kind: fixed|uniform|exponential|lognormal."""

    kind: str = "fixed"
    value_s: float = 0.0  # fixed
    min_s: float | None = None  # uniform / clip bounds
    max_s: float | None = None
    mean_s: float | None = None  # exponential / lognormal (mean of the pauses)
    sigma: float | None = None  # lognormal: sigma of the log-pauses


@dataclass(frozen=True)
class Workload:
    api: str = "completions"  # "completions" | "chat"
    input: LengthDist = LengthDist("fixed", value=128)
    output: LengthDist = LengthDist("fixed", value=64)
    dataset: str | None = None  # absolute path to JSONL ({prompt, output_tokens} or ShareGPT)
    prefix_tokens: int = 0
    prefix_groups: int = 1
    turns: int = 1
    think_time: ThinkTime = ThinkTime()  # between a turn's reply and the conversation's next turn
    # An affinity header every request of a conversation carries (x-session-id), for routers that pin sessions.
    session_header: str | None = None
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, req/s
    arrival: str = "poisson"  # "poisson" | "constant"
    burst: int = 1  # requests sent together at each arrival
    sweep: tuple[float, ...] = ()  # concurrency or rate values
    streaming_fraction: float = 1.0
    max_tokens: int | None = None  # None: taken from the output distribution
    ignore_eos: bool = True
    temperature: float = 0.0  # greedy by default
    seed: int = 0
    warmup_s: float = 0.0
    warmup_requests: int = 0
    duration_s: float | None = None
    num_requests: int | None = None
    request_timeout_s: float = 120.0
    trace: TraceSpec | None = None  # replay a trace: it gives each request's send time and lengths


def gpu_count(gpus: int | Sequence[str] | None) -> int:
    """How many GPUs an engine's `gpus` asks for: a count, or explicit device ids (a tuple here, a list once
    read back from an archive's JSON)."""
    if isinstance(gpus, (list, tuple)):
        return len(gpus)
    return max(int(gpus or 0), 0) if isinstance(gpus, int) else 0


@dataclass(frozen=True)
class EngineSpec:
    kind: str  # vllm | sglang | tgi | trtllm | llamacpp
    model: str
    image: str | None = None
    model_dir: str | None = None  # host directory mounted read-only
    served_model_name: str | None = None
    gpus: int | tuple[str, ...] = 0  # count, or explicit device ids
    args: Mapping[str, Scalar] = field(default_factory=frozen_map)  # engine-neutral knobs
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=frozen_map)
    port: int | None = None  # None: the adapter's default
    health_path: str | None = None  # None: the adapter's default
    health_timeout_s: float = 600.0
    shm_size: str | None = None
    ipc_mode: str | None = None
    network_mode: str | None = None  # "host" or None (publish port)
    executable: str | None = None  # process runtime: path of the server binary

    def with_knob(self, knob: str, value: Scalar) -> EngineSpec:
        """A copy with one knob set (None: back to the engine default)."""
        args = dict(self.args)
        args[knob] = value
        return replace(self, args=frozen_map(args))


@dataclass(frozen=True)
class Change:
    """One knob changed by a step. target is a dotted path:
    `args.<knob>`, `image`, `gpus`, `env.<NAME>`, `workload.<field>`, `extra_args`."""

    target: str
    value: object  # as the playbook wrote it, checked by the loader against its key's schema entry

    @property
    def knob_value(self) -> Scalar:
        """The value of an `args.` change: a scalar, as the loader checked every knob value is."""
        return cast(Scalar, self.value)


class StepChoice(Protocol):
    """How a step comes to its candidate, carried on the Step for the stages that check or show it before it runs:
    the kind's name (its YAML key and its registry key: "set", "search", ...), every change it may measure beyond
    the step's fixed `changes` (what the knob and flag checks see), and the line the plan prints. Running a kind is
    tuning's (tuning.step_kinds), reading it from YAML the playbook's (playbook.step_forms)."""

    @property
    def kind(self) -> str: ...

    def tried(self) -> tuple[Change, ...]: ...

    def describe(self) -> str | None: ...


@dataclass(frozen=True)
class FixedChange:
    """A step whose `changes` are its candidate: `set:`."""

    @property
    def kind(self) -> str:
        return "set"

    def tried(self) -> tuple[Change, ...]:
        return ()

    def describe(self) -> str | None:
        return None


FIXED = FixedChange()


@dataclass(frozen=True)
class SearchSpace:
    """A search step's one knob (a Change target) and its candidate values, in the order written (a range: rising).
    `ordered`: numbers, whose order a search may use (bracketing); otherwise the values are unordered choices."""

    target: str
    values: tuple[Scalar, ...]
    ordered: bool

    @property
    def kind(self) -> str:
        return "search"

    def tried(self) -> tuple[Change, ...]:
        return tuple(Change(self.target, value) for value in self.values)

    def describe(self) -> str | None:
        values = ", ".join(show_value(v) for v in self.values)
        return f"searches {self.target} over {values} (the configuration below is the incumbent)"


@dataclass(frozen=True)
class Step:
    name: str
    changes: tuple[Change, ...]  # empty for a step whose kind chooses its value (a search)
    bundle: bool = False
    carry: str = "if_kept"  # always | if_kept | never | race (consecutive race steps: the first kept is carried)
    description: str = ""
    line: int = 0
    choice: StepChoice = FIXED


@dataclass(frozen=True)
class Trials:
    repeats: int = 3
    interleave: bool = True
    sequential: bool = False  # stop early once the CI decides
    max_repeats: int = 6
    confidence: float = 0.95
    # Moderate each step's paired variance toward the run's other steps (stats.intervals.moderate); off by default:
    # with three pairs a step's own spread cannot show that its noise differs from the others'.
    pool_noise: bool = False
    # Where a step's paired noise comes from: its own pairs (step), the run's steps pooled (run, as pool_noise), or
    # also earlier comparable runs in the archive (history), used only while this run's own noise agrees with it.
    noise: str = "step"
    # max_repeats: auto: each step's most pairs sized for 80% power (stats.power.auto_pairs) within budget_s of engine
    # time a step (0: no budget); max_repeats then holds the size used while no noise is known yet.
    max_repeats_auto: bool = False
    budget_s: float = 0.0
    on_failure: str = "continue"  # continue | stop
    cooldown_s: float = 0.0


@dataclass(frozen=True)
class Cost:
    gpu_usd_per_hour: float = 0.0
    # CPU-only runs price the host instead, so $/1M tokens is still meaningful.
    host_usd_per_hour: float = 0.0


@dataclass(frozen=True)
class RuntimeSpec:
    kind: str = "docker"  # docker | process | endpoint | ray
    url: str | None = None  # endpoint runtime
    docker_host: str | None = None
    allow_host_mounts: bool = False
    # ray: the cluster to join ("HOST:PORT" of its head, "auto", or "ray://HOST:PORT"), the runtime each node starts
    # its engine with, the accelerator type both sides of a comparison must run on, and the CPUs a trial holds
    address: str | None = None
    inner: str = "docker"  # docker | process
    accelerator_type: str | None = None  # e.g. "H100", as the nodes declare it (ray start --resources / labels)
    cpus_per_trial: float = 1.0

    def on_node(self) -> RuntimeSpec:
        """The runtime a cluster node starts its engine with: its own dockerd, or the engine in its own image."""
        return RuntimeSpec(kind=self.inner, docker_host=self.docker_host, allow_host_mounts=self.allow_host_mounts)


@dataclass(frozen=True)
class TuneSpec:
    """The playbook's `tune:` section: how far `llmplay tune` may go and what it may touch (names are engine knobs
    or checklist remedies, engines.knobs.Remedy values)."""

    engine_budget_s: float | None = None  # wall time of engine work after which no further step starts
    max_steps: int | None = None  # most steps the tuner chooses
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    values: Mapping[str, tuple[Scalar, ...]] = field(default_factory=frozen_map)
    retry_rejected: bool = False
    race: int = 1  # on Ray, the most candidates one round races on separate nodes (1: one per round)


@dataclass(frozen=True)
class Playbook:
    path: str  # absolute path of the file as given
    text: str  # the top-level file's text, archived as run
    sha256: str
    api_version: str
    metadata: Metadata
    goals: Goals
    workload: Workload
    engine: EngineSpec
    steps: tuple[Step, ...]
    trials: Trials
    cost: Cost
    runtime: RuntimeSpec
    resolved: Mapping[str, object]  # the merged document after `extends:`, for the archive
    # YAML path (as `format_path` writes it) -> `FILE:LINE` for the engine's keys and each step's `set:`
    # entries, so checks after loading (the image preflight) can point at the line.
    sites: Mapping[str, str] = field(default_factory=frozen_map)
    tune: TuneSpec | None = None  # `llmplay tune`'s budget and policy; None: not written


@dataclass(frozen=True)
class Config:
    """One thing to measure: an engine configuration under a workload."""

    label: str  # "baseline" or the step name that produced it
    engine: EngineSpec
    workload: Workload


@dataclass(frozen=True)
class ChangeEffect:
    """What one change did: the value in effect before and the one after."""

    target: str
    old: object
    new: object

    def describe(self) -> str:
        return f"{self.target}: {show_value(self.old)} -> {show_value(self.new)}"


def show_value(value: object) -> str:
    """A value as plans and messages show it; None is the engine's default."""
    return "(engine default)" if value is None else repr(value)


def current_value(config: Config, target: str) -> object:
    """The value `target` (a Change's dotted path) has in `config`."""
    if target.startswith("args."):
        return config.engine.args.get(target[5:])
    if target.startswith("env."):
        return config.engine.env.get(target[4:])
    if target.startswith("workload."):
        return getattr(config.workload, target[9:])
    return getattr(config.engine, target)


def apply_change(config: Config, change: Change) -> Config:
    """A new configuration with one change applied; `config` is left as it was."""
    engine, workload, target = config.engine, config.workload, change.target
    if target.startswith("args."):
        engine = engine.with_knob(target[5:], change.knob_value)
    elif target.startswith("env."):
        env = dict(engine.env)
        env[target[4:]] = str(change.value)
        engine = replace(engine, env=frozen_map(env))
    elif target.startswith("workload."):
        workload = _replaced(workload, target[9:], change.value)
    elif target == "gpus":
        gpus = change.value
        engine = replace(
            engine, gpus=tuple(map(str, gpus)) if isinstance(gpus, list) else cast(int | tuple[str, ...], gpus)
        )
    elif target == "extra_args":
        engine = replace(engine, extra_args=tuple(map(str, cast(list[object], change.value))))
    else:
        engine = _replaced(engine, target, change.value)
    return Config(config.label, engine, workload)


D = TypeVar("D", EngineSpec, Workload)


def _replaced(record: D, name: str, value: object) -> D:
    """`record` with the field a step names (at run time) set to the value the loader checked for it."""
    return replace(record, **{name: value})  # type: ignore[arg-type]  # the field is named at run time


def apply_step(config: Config, step: Step) -> tuple[Config, tuple[ChangeEffect, ...]]:
    """A new configuration; `config` is left as it was."""
    effects = []
    for change in step.changes:
        effects.append(ChangeEffect(change.target, current_value(config, change.target), change.value))
        config = apply_change(config, change)
    return Config(step.name, config.engine, config.workload), tuple(effects)
