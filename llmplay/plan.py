"""From a playbook to concrete configurations: the baseline, and each step applied to a configuration; and how many
requests the workload as written will measure for the percentiles its goals use."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from llmplay.catalog import NONSTREAMED_ONLY, STREAMED_ONLY, min_samples
from llmplay.engines import get_engine
from llmplay.engines.base import Engine
from llmplay.spec import ChangeEffect, Config, EngineSpec, Goals, Playbook, Step, Trials, Workload, apply_step


@dataclass(frozen=True)
class PlannedStep:
    """A step with what it changes and the configuration it leads to."""

    index: int  # 1-based
    step: Step
    effects: tuple[ChangeEffect, ...]
    # The configuration if every earlier step were kept; the runner re-applies to the real best.
    cumulative: Config


@dataclass(frozen=True)
class Plan:
    """What a run will measure, in order: the baseline, then each step."""

    playbook: Playbook
    engine: Engine
    baseline: Config
    steps: tuple[PlannedStep, ...]


def build_plan(playbook: Playbook) -> Plan:
    """The baseline and every step applied in order; the loader has already checked each step applies."""
    engine = get_engine(playbook.engine.kind)
    baseline = Config("baseline", playbook.engine, playbook.workload)
    steps, config = [], baseline
    for index, step in enumerate(playbook.steps, start=1):
        config, effects = apply_step(config, step)
        steps.append(PlannedStep(index, step, effects, config))
    return Plan(playbook, engine, baseline, tuple(steps))


def image_of(spec: EngineSpec, engine: Engine) -> str:
    """The playbook's image, or the adapter's default."""
    return spec.image or engine.default_image


def docker_run_argv(spec: EngineSpec, engine: Engine) -> list[str]:
    """The `docker run` a human would type for this configuration (the runtime uses the SDK equivalent)."""
    port = spec.port or engine.default_port
    argv = ["docker", "run", "--rm", "-d", "--label", "llmplay.run=<id>"]
    if spec.network_mode == "host":
        argv += ["--network", "host"]
    else:
        argv += ["-p", f"127.0.0.1:{port}:{port}"]
    if isinstance(spec.gpus, tuple):
        argv += ["--gpus", f'"device={",".join(spec.gpus)}"']
    elif spec.gpus:
        argv += ["--gpus", str(spec.gpus)]
    if spec.shm_size:
        argv += ["--shm-size", spec.shm_size]
    if spec.ipc_mode:
        argv += ["--ipc", spec.ipc_mode]
    if spec.model_dir:
        argv += ["-v", f"{spec.model_dir}:{engine.model_path_in_container}:ro"]
    for name, value in spec.env.items():
        argv += ["-e", f"{name}={value}"]
    return [*argv, image_of(spec, engine), *engine.command(spec, port)]


def format_argv(argv: list[str]) -> str:
    """One shell line, every argument quoted for the shell: a value from the playbook (a GPU id, an extra arg) is
    text a reader may paste, never shell syntax (`--gpus '"device=0,1"'` is Docker's own documented form)."""
    return shlex.join(argv)


# ---------------------------------------------------------------------------------------------- sample size
@dataclass(frozen=True)
class ExpectedRequests:
    """How many requests one trial of a workload measures, as far as the playbook alone can tell."""

    count: float | None  # None: a closed loop bounded by time, where the count depends on the engine's latency
    bound: str  # "about" (an open-loop window), "at most" (a request budget: failures count against it)
    basis: str  # how it was worked out: "rate 0.3 req/s × 12 s"
    busy_s: float = 0.0  # closed loop: concurrency × duration, the request-seconds shared out among requests
    at_least: float = 0.0  # closed loop: no request outlasts its timeout, so at least busy_s ÷ timeout


def expected_requests(w: Workload) -> ExpectedRequests:
    """rate × duration (open loop), num_requests when given (the smaller of the two when both bound the trial),
    or, for a closed loop over a time window, concurrency × duration ÷ mean latency, which is not known before
    the run (only its floor, concurrency × duration ÷ request timeout)."""
    budget = w.num_requests
    if w.rate is not None and w.duration_s:
        windowed = w.rate * w.duration_s
        if budget is None or windowed <= budget:
            return ExpectedRequests(windowed, "about", f"rate {w.rate:g} req/s × {w.duration_s:g} s")
    if budget is not None:
        return ExpectedRequests(float(budget), "at most", f"num_requests {budget}")
    concurrency, duration = w.concurrency or 1, w.duration_s or 0.0
    busy = concurrency * duration
    floor = busy / w.request_timeout_s if w.request_timeout_s > 0 else 0.0
    return ExpectedRequests(None, "about", f"concurrency {concurrency} × {duration:g} s ÷ mean latency", busy, floor)


def request_share(metric: str, w: Workload) -> tuple[float, str]:
    """The share of requests `metric` is measured on, and what they are: TTFT, TPOT and ITL come from streamed
    requests only, TTFT (non-streamed) from the others, E2E latency from every request."""
    family = metric.partition(".")[0]
    if family in STREAMED_ONLY:
        return w.streaming_fraction, "streamed"
    if family in NONSTREAMED_ONLY:
        return 1.0 - w.streaming_fraction, "non-streamed"
    return 1.0, ""


@dataclass(frozen=True)
class SampleShortfall:
    """A percentile the goals use that the workload will probably measure on too few requests."""

    metric: str
    roles: tuple[str, ...]  # "gate", "objective", "guard"
    need: int  # catalog.MIN_SAMPLES
    expected: ExpectedRequests  # per trial, all requests
    share: float  # of those, the ones the metric is measured on
    kind: str  # "streamed", "non-streamed" or ""
    trials: int  # how many trials a decision (and the final configuration's gates) pools, at the least
    latency_s: float | None = None  # closed loop: the mean latency under which the pooled count reaches `need`

    @property
    def per_trial(self) -> float | None:
        return None if self.expected.count is None else self.expected.count * self.share

    @property
    def pooled(self) -> float | None:
        per_trial = self.per_trial
        return None if per_trial is None else per_trial * self.trials


def goal_percentiles(goals: Goals) -> dict[str, tuple[str, ...]]:
    """The tail percentiles (those with a MIN_SAMPLES) the gates, objective and guards use, with their roles."""
    roles: dict[str, list[str]] = {}
    uses = [(g.metric, "gate") for g in goals.gates] + [(goals.objective.metric, "objective")]
    uses += [(g.metric, "guard") for g in goals.guards]
    for metric, role in uses:
        if min_samples(metric) is not None and role not in roles.setdefault(metric, []):
            roles[metric].append(role)
    return {metric: tuple(r) for metric, r in roles.items()}


def sample_shortfalls(workload: Workload, goals: Goals, trials: Trials) -> list[SampleShortfall]:
    """Every goal percentile that the pooled trials of one configuration will (or may) measure on fewer requests
    than it needs. Decisions and gates pool a configuration's trials, so the pooled count is what counts."""
    expected = expected_requests(workload)
    repeats = max(1, trials.repeats)
    out = []
    for metric, roles in goal_percentiles(goals).items():
        need = min_samples(metric) or 0
        share, kind = request_share(metric, workload)
        shortfall = SampleShortfall(metric, roles, need, expected, share, kind, repeats)
        pooled = shortfall.pooled
        if pooled is not None:
            if pooled < need:
                out.append(shortfall)
            continue
        if expected.at_least * share * repeats >= need:
            continue  # even requests as slow as their timeout would be enough
        # pooled = busy_s × share × trials ÷ latency, so it reaches `need` while latency stays under this
        latency = expected.busy_s * share * repeats / need if share > 0 else None
        out.append(SampleShortfall(metric, roles, need, expected, share, kind, repeats, latency))
    return out


# Knobs whose only effect is reusing computed prompt prefixes: a step on one has nothing to gain without reuse.
# (TGI switches prefix caching with an environment variable, not a flag.)
PREFIX_CACHE_TARGETS = frozenset({"args.prefix_caching", "args.cache_reuse", "env.PREFIX_CACHING"})


def reuses_prefixes(w: Workload) -> bool:
    """Whether the workload's prompts can repeat an earlier prompt's start: a shared prefix among several requests,
    conversations resending their history, a dataset (whose prompts may repeat), or a trace whose window shares
    hash ids. Synthetic prompts otherwise are fresh random text each."""
    trace_reuse = w.trace is not None and (w.trace.facts is None or w.trace.facts.prefix_reuse > 0)
    return (w.prefix_tokens > 0 and (w.num_requests or 2) > 1) or w.turns > 1 or w.dataset is not None or trace_reuse


def prefix_cache_notes(plan: Plan) -> dict[int, str]:
    """Per step index: a note when the step changes a prefix-caching knob while its workload reuses no prefix."""
    notes = {}
    for planned in plan.steps:
        if {e.target for e in planned.effects} & PREFIX_CACHE_TARGETS and not reuses_prefixes(
            planned.cumulative.workload
        ):
            notes[planned.index] = (
                "note: a prefix-caching step on a workload with no prefix reuse (no shared prefix, one turn per "
                "conversation, no dataset): expect no effect beyond noise"
            )
    return notes
