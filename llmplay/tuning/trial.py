"""One trial: a fresh engine start, warm-up, measured load (or capacity search) and telemetry, reduced to a record
and a sample. The one trial function of runs, capacity searches and cluster nodes."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypedDict, cast

import httpx
import pandas as pd

from llmplay.archive.capacity import CapacityResult
from llmplay.archive.model import TRIAL_FAILED, TRIAL_INTERRUPTED, TRIAL_OK, TrialRecord
from llmplay.engines.base import Engine
from llmplay.errors import EngineStartError, InfrastructureError
from llmplay.loadgen.probes import ProbeResult, run_probes
from llmplay.loadgen.records import LoadResult
from llmplay.loadgen.runner import LoadInterrupted, run_load_sync
from llmplay.loadgen.tokenizer import Tokenizer, make_tokenizer
from llmplay.loadgen.workload import PlannedRequest, iter_requests
from llmplay.metrics import (
    engine_prefix_reuse,
    per_request_frame,
    slo_attainment,
    summarize,
    usd_per_1m_tokens,
)
from llmplay.redaction import resolve_args, resolve_env
from llmplay.runtime import RuntimeFactory, make_runtime
from llmplay.runtime.base import Endpoint, EngineDescription, Runtime
from llmplay.runtime.labels import LABEL_CONFIG, LABEL_RUN, LABEL_TRIAL
from llmplay.spec import CapacitySpec, Config, EngineSpec, Playbook, Workload, gpu_count
from llmplay.stats.decide import TrialSample, sample_from_records
from llmplay.telemetry.nvml import NvmlSource
from llmplay.telemetry.proc import DockerStatsSource, ProcessSource
from llmplay.telemetry.prom import PrometheusSource
from llmplay.telemetry.sampler import Source, TelemetrySampler, TelemetrySeries
from llmplay.tuning.capacity import (
    ProbeRun,
    boundary_run,
    capacity_summary,
    probe_workload,
    search_capacity,
)
from llmplay.tuning.signals import TrialInterrupted


@dataclass(frozen=True)
class TrialResult:
    """What one trial leaves: its record, the raw data the archive keeps, and the sample decisions use."""

    trial: TrialRecord
    records: pd.DataFrame | None = None  # one row per request; None when no load ran
    telemetry: pd.DataFrame | None = None  # the sampler's readings; None when none were taken
    engine_log: str = ""
    sample: TrialSample | None = None  # None unless the trial is ok and measured at least one request
    probes: tuple[ProbeResult, ...] | None = None  # goals.quality's greedy answers, taken after the timed load
    capacity: CapacityResult | None = None  # the trial's capacity search (capacity trials only)


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def price_per_hour(playbook: Playbook, config: Config) -> float:
    """The playbook's price of this configuration: its GPUs plus the host, in USD per hour."""
    return playbook.cost.gpu_usd_per_hour * gpu_count(config.engine.gpus) + playbook.cost.host_usd_per_hour


def trial_sample(
    playbook: Playbook, config: Config, trial: TrialRecord, records: pd.DataFrame | None
) -> TrialSample | None:
    """The sample decisions use, from an ok trial's request records (fresh, or read back from the archive)."""
    if trial.status != TRIAL_OK or records is None or not len(records):
        return None
    return sample_from_records(
        records,
        trial.summary.get("duration_s", 0.0),
        trial.summary,
        playbook.goals.slo_s,
        price_per_hour(playbook, config),
        repeat=trial.repeat,
    )


def telemetry_sources(runtime: Runtime, endpoint: Endpoint, engine: Engine, spec: EngineSpec) -> list[Source]:
    """What can be sampled for this engine: its /metrics, its container or process, and its GPUs."""
    sources: list[Source] = [PrometheusSource(endpoint.base_url, engine.metric_names)]
    if runtime.container is not None:
        sources.append(DockerStatsSource(runtime.container))
    elif runtime.pid:
        sources.append(ProcessSource(runtime.pid))
    if isinstance(spec.gpus, tuple):
        sources.append(NvmlSource([int(g) for g in spec.gpus if str(g).isdigit()] or None))
    elif spec.gpus:
        sources.append(NvmlSource(list(range(spec.gpus))))
    return sources


_MEMORY_CAUSE = re.compile(
    r"out of memory|insufficient memory|failed to allocate|cannot allocate|bad_alloc|"
    r"\bOOM\b|OutOfMemory",
    re.I,
)
_ERROR_LINE = re.compile(r"(^|\s)(E|ERROR|FATAL|CRITICAL)\s|error|exception|fatal", re.I)
_LOG_STAMP = re.compile(r"^[\d.:T\-Z\[\]]+\s+")


def start_failure_cause(exc: EngineStartError) -> str:
    """One line for a trial that never became healthy: what happened plus the engine's own reason, taken from
    its log (the first out-of-memory line, else the last error line), so the cause is in the tuning record."""
    head = re.sub(r";?\s*last \d+ log lines:\s*$", "", str(exc).splitlines()[0])
    lines = [line.strip() for line in (exc.log_tail or "").splitlines() if line.strip()]
    cause = next((line for line in lines if _MEMORY_CAUSE.search(line)), None)
    if cause is None:
        cause = next((line for line in reversed(lines) if _ERROR_LINE.search(line)), None)
    return f"{head}: {_LOG_STAMP.sub('', cause)[:300]}" if cause else head


class MeasureTrial(Protocol):
    """The seam to one trial: measure `config` once under this trial's id and key. A run's trials go through
    FreshEngineTrial unless a test hands in trials with known effects; a scheduler runs either the same way."""

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult: ...


@dataclass(frozen=True)
class FreshEngineTrial:
    """run_trial bound to one run: each call one fresh engine start and its measured load (or capacity search).
    Picklable, so a cluster node runs the very same function (with its own runtime, see tuning.schedule.ray)."""

    playbook: Playbook
    engine: Engine
    run_id: str
    runtime_factory: RuntimeFactory = make_runtime
    progress: bool = False
    capacity: CapacitySpec | None = None

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult:
        return run_trial(
            self.playbook,
            config,
            self.engine,
            self.runtime_factory,
            trial_id=trial_id,
            step=step,
            role=role,
            repeat=repeat,
            run_id=self.run_id,
            progress=self.progress,
            capacity=self.capacity,
        )


@dataclass(frozen=True)
class _Started:
    """One trial's key and clock: what every way of ending it (measured, failed, interrupted) writes first."""

    trial_id: str
    config_id: str
    step: str | None
    role: str
    repeat: int
    started_utc: str = field(default_factory=utc_now)
    t0: float = field(default_factory=time.perf_counter)

    def record(
        self,
        status: str,
        *,
        summary: Mapping[str, float | None] | None = None,
        error: str | None = None,
        engine_describe: EngineDescription | None = None,
        notes: tuple[str, ...] = (),
    ) -> TrialRecord:
        return TrialRecord(
            trial_id=self.trial_id,
            config_id=self.config_id,
            step=self.step,
            role=self.role,
            repeat=self.repeat,
            started_utc=self.started_utc,
            status=status,
            wall_s=time.perf_counter() - self.t0,
            # A figure not measured stays null in the manifest, as it always has; archive.convert drops it on reading.
            summary=cast(dict[str, float], dict(summary or {})),
            engine_describe=engine_describe,
            error=error,
            notes=notes,
        )


@dataclass(frozen=True)
class _Measured:
    """What a trial's load left on the driver, before it is reduced to a record: the same for a plain load, a
    capacity search on one engine start, and a search with an engine start per probe."""

    load: LoadResult  # the measured load (a search's boundary probe)
    engine_describe: EngineDescription | None
    engine_log: str
    search: CapacityResult | None = None
    alive: bool = True
    telemetry: TelemetrySeries | None = None
    telemetry_start_s: float = 0.0  # where the measured window starts on the telemetry's clock
    probes: tuple[ProbeResult, ...] | None = None
    notes: tuple[str, ...] = ()


def run_trial(
    playbook: Playbook,
    config: Config,
    engine: Engine,
    runtime_factory: RuntimeFactory,
    *,
    trial_id: str,
    step: str | None,
    role: str,
    repeat: int,
    run_id: str,
    progress: bool = False,
    capacity: CapacitySpec | None = None,
) -> TrialResult:
    """One fresh engine start, warm-up, measured load, telemetry; failures become a failed TrialRecord.

    With `capacity`, the measured load is a capacity search (tuning.capacity), on this one engine start or, with
    goals.capacity.engine fresh, on an engine start per probe; the trial's records and summary are then those of
    its boundary probe, with the capacity.* figures added. A signal mid-load raises TrialInterrupted carrying what
    finished, after the engine has stopped."""
    started = _Started(trial_id, config.label, step, role, repeat)
    # Common random numbers: both trials of A/B pair `repeat` send the same request sequence (lengths, prompts,
    # arrival times), so the workload's own randomness cancels in the pair's ratio, while each pair draws a new
    # sequence and the verdict does not hinge on one sample of requests.
    config = replace(config, workload=replace(config.workload, seed=config.workload.seed + repeat))
    labels = {LABEL_RUN: run_id, LABEL_TRIAL: trial_id, LABEL_CONFIG: config.label}
    spec = replace(config.engine, env=resolve_env(config.engine.env), extra_args=resolve_args(config.engine.extra_args))
    if capacity is not None and capacity.engine == "fresh":
        measured = _search_fresh_engines(playbook, config, engine, runtime_factory, spec, labels, capacity, started)
    else:
        measured = _on_one_engine(
            playbook, config, engine, runtime_factory(playbook.runtime), spec, labels, capacity, progress, started
        )
    if isinstance(measured, TrialResult):
        return measured  # failed before it measured anything
    return _conclude(playbook, config, started, measured)


def _on_one_engine(
    playbook: Playbook,
    config: Config,
    engine: Engine,
    runtime: Runtime,
    spec: EngineSpec,
    labels: Mapping[str, str],
    capacity: CapacitySpec | None,
    progress: bool,
    started: _Started,
) -> _Measured | TrialResult:
    """The trial's load (or capacity search) on one engine start, with telemetry, then the quality probes."""
    try:
        with runtime.start(spec, engine, labels) as endpoint:
            try:
                # The metric names of the release that answered, not of the one the adapter was written for.
                version = endpoint.describe.engine_version
                sources = telemetry_sources(runtime, endpoint, engine.at(version or None), spec)
                with TelemetrySampler(sources) as sampler:
                    sampler_origin_ns = time.perf_counter_ns() - int(sampler.elapsed_s() * 1e9)
                    load, search = _load(playbook, config, endpoint, spec, capacity, progress)
                # After the timed window, before the engine stops: the probes cost seconds and no latency figure.
                probes = _answer_probes(playbook, config, endpoint)
            except LoadInterrupted as exc:
                # A signal mid-load: keep what finished (and the engine's log, while the container exists),
                # then let the interrupt go on unwinding; --resume runs this trial again.
                raise _interrupted(playbook, started, exc.partial, runtime) from None
            except InfrastructureError as exc:
                # The engine was healthy, then failed us (e.g. froze while its tokenizer was asked): this
                # trial failed, the run goes on. Not EngineStartError's path: the container is still ours here.
                failed = started.record(TRIAL_FAILED, error=_failed_during(exc), engine_describe=runtime.describe())
                return TrialResult(failed, engine_log=runtime.logs())
            # Read while the engine still exists: its description, whether it outlived the load, its log.
            return _Measured(
                load,
                runtime.describe(),
                runtime.logs(),
                search=search,
                alive=runtime.alive(),
                telemetry=sampler.result(),
                telemetry_start_s=max(0.0, (load.start_ns - sampler_origin_ns) / 1e9),
                probes=probes,
                notes=(
                    f"tokenizer: {load.tokenizer}",
                    "workload seed: the playbook's plus the trial's repeat (both trials of an A/B pair send the "
                    "same requests)",
                ),
            )
    except EngineStartError as exc:
        return TrialResult(started.record(TRIAL_FAILED, error=start_failure_cause(exc)), engine_log=exc.log_tail)


def _load(
    playbook: Playbook,
    config: Config,
    endpoint: Endpoint,
    spec: EngineSpec,
    capacity: CapacitySpec | None,
    progress: bool,
) -> tuple[LoadResult, CapacityResult | None]:
    """The measured load against a running engine: the workload, or a capacity search of it."""
    tokenizer = make_tokenizer("auto", endpoint.base_url, model_dir=spec.model_dir)
    try:
        if capacity is not None:
            return capacity_search(
                endpoint.base_url,
                endpoint.model,
                config.workload,
                capacity,
                playbook.goals.slo_s,
                tokenizer,
                progress=progress,
            )
        requests: Iterable[PlannedRequest] = iter_requests(config.workload, tokenizer, endpoint.model)
        if config.workload.num_requests is not None:
            requests = tuple(requests)  # bounded: every prompt built before the clock starts
        load = run_load_sync(endpoint.base_url, config.workload, requests, progress=progress, tokenizer=tokenizer)
        return load, None
    finally:
        tokenizer.close()


def _interrupted(playbook: Playbook, started: _Started, partial: LoadResult, runtime: Runtime) -> TrialInterrupted:
    summary = summarize(partial.records, partial.duration_s, playbook.goals.slo_s).as_dict()
    finished = sum(r.ok for r in partial.measured())
    trial = started.record(
        TRIAL_INTERRUPTED,
        summary=summary,
        engine_describe=runtime.describe(),
        error=f"interrupted by a signal; {finished} finished request(s) kept, requests in flight were not recorded",
    )
    return TrialInterrupted(trial, per_request_frame(partial.records), runtime.logs())


def _failed_during(exc: InfrastructureError) -> str:
    return f"the engine failed during the trial: {str(exc).splitlines()[0]}"


class _LastStart(TypedDict):
    """The last engine start of a fresh-engine search: its description and log, for a failure's record."""

    describe: EngineDescription | None
    log: str


def _search_fresh_engines(
    playbook: Playbook,
    config: Config,
    engine: Engine,
    runtime_factory: RuntimeFactory,
    spec: EngineSpec,
    labels: Mapping[str, str],
    capacity: CapacitySpec,
    started: _Started,
) -> _Measured | TrialResult:
    """goals.capacity.engine: fresh: a capacity search whose every probe has an engine start of its own (no
    telemetry: no sampler outlives one probe). The engine-seconds count load only, not the starts."""
    last: _LastStart = {"describe": None, "log": ""}

    def measure(load_value: float, replicate: int) -> ProbeRun:
        runtime = runtime_factory(playbook.runtime)
        with runtime.start(spec, engine, dict(labels)) as endpoint:
            tokenizer = make_tokenizer("auto", endpoint.base_url, model_dir=spec.model_dir)
            try:
                probe = probe_workload(config.workload, capacity, load_value, replicate)
                t0 = time.perf_counter()
                result = run_load_sync(
                    endpoint.base_url, probe, iter_requests(probe, tokenizer, endpoint.model), tokenizer=tokenizer
                )
                engine_s = time.perf_counter() - t0
            finally:
                tokenizer.close()
            last["describe"], last["log"] = runtime.describe(), runtime.logs()
        attainment = slo_attainment(result.records, result.duration_s, playbook.goals.slo_s, capacity.attainment)
        return ProbeRun(load_value, replicate, attainment, result.duration_s, engine_s, result)

    try:
        search, runs = search_capacity(capacity, playbook.goals.slo_s, measure)
    except EngineStartError as exc:
        failed = started.record(TRIAL_FAILED, error=start_failure_cause(exc), engine_describe=last["describe"])
        return TrialResult(failed, engine_log=exc.log_tail or last["log"])
    except InfrastructureError as exc:
        failed = started.record(TRIAL_FAILED, error=_failed_during(exc), engine_describe=last["describe"])
        return TrialResult(failed, engine_log=last["log"])
    boundary = boundary_run(search, runs)
    assert boundary is not None  # the first probe always runs
    return _Measured(
        boundary.load_result,
        last["describe"],
        last["log"],
        search=search,
        notes=("a fresh engine start per probe: no telemetry",),
    )


def _conclude(playbook: Playbook, config: Config, started: _Started, measured: _Measured) -> TrialResult:
    """A measured trial reduced to its record and sample: the summary of its load, its telemetry over the
    measured window, its cost, its capacity figures, and whether it counts (ok) or failed."""
    load, search = measured.load, measured.search
    summary: dict[str, float | None] = summarize(load.records, load.duration_s, playbook.goals.slo_s).as_dict()
    summary["duration_s"] = load.duration_s
    notes = [*(measured.telemetry.notes if measured.telemetry is not None else ()), *measured.notes]
    telemetry_frame: pd.DataFrame | None = None
    if measured.telemetry is not None:
        try:
            # Telemetry of the measured window only, like the load metrics: warm-up and engine start excluded.
            summary.update(measured.telemetry.summary(start_s=measured.telemetry_start_s))
            summary.update(engine_prefix_reuse(summary))
            telemetry_frame = measured.telemetry.to_frame()
        except Exception as exc:  # a bug in telemetry must not cost the measured load: the trial keeps its requests
            notes.append(f"telemetry not summarised ({type(exc).__name__}: {exc}); its figures are not measured")
    price = price_per_hour(playbook, config)
    cost = usd_per_1m_tokens(price, summary.get("throughput.output_tok_s"))
    if cost is not None:
        summary["cost.usd_per_1m_tokens"] = cost
    if search is not None:
        summary.update(capacity_summary(search, price))
        notes.append(
            f"capacity search: {search.boundary_text()}; {search.runs} probe run(s), {search.engine_s:.0f} s of load; "
            "the trial's requests and figures are its boundary probe's"
        )
    status, error = TRIAL_OK, None
    if not measured.alive:
        status, error = TRIAL_FAILED, "the engine exited during the load"
    elif summary.get("requests.completed", 0) == 0:
        where = " at the boundary probe" if search is not None else ""
        status, error = TRIAL_FAILED, f"no request completed{where} ({summary.get('errors.count', 0):.0f} errors)"
    trial = started.record(
        status, summary=summary, engine_describe=measured.engine_describe, error=error, notes=tuple(notes)
    )
    records = per_request_frame(load.records)
    return TrialResult(
        trial,
        records,
        telemetry_frame,
        measured.engine_log,
        trial_sample(playbook, config, trial, records),
        probes=measured.probes,
        capacity=search,
    )


def capacity_search(
    url: str,
    model: str,
    workload: Workload,
    spec: CapacitySpec,
    slo_s: Mapping[str, float],
    tokenizer: Tokenizer,
    *,
    progress: bool = False,
) -> tuple[LoadResult, CapacityResult]:
    """A capacity search against a running endpoint: each probe a load run of the workload at the probe's load.
    Returns the boundary probe's load run (the records that stand for the configuration) and the search."""

    def measure(load_value: float, replicate: int) -> ProbeRun:
        probe = probe_workload(workload, spec, load_value, replicate)
        t0 = time.perf_counter()
        result = run_load_sync(
            url, probe, iter_requests(probe, tokenizer, model), progress=progress, tokenizer=tokenizer
        )
        attainment = slo_attainment(result.records, result.duration_s, slo_s, spec.attainment)
        return ProbeRun(load_value, replicate, attainment, result.duration_s, time.perf_counter() - t0, result)

    search, runs = search_capacity(spec, slo_s, measure)
    boundary = boundary_run(search, runs)
    assert boundary is not None  # a search runs at least its lower bound, or its time cap is below one probe
    return boundary.load_result, search


def _answer_probes(playbook: Playbook, config: Config, endpoint: Endpoint) -> tuple[ProbeResult, ...] | None:
    quality = playbook.goals.quality
    if quality is None:
        return None
    api = "chat" if config.workload.api == "chat" else "completions"
    timeout = httpx.Timeout(config.workload.request_timeout_s or 60.0)
    with httpx.Client(base_url=endpoint.base_url, timeout=timeout) as client:
        return tuple(run_probes(client, api, endpoint.model, quality.prompts, quality.max_tokens))
