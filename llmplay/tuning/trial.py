"""One trial: a fresh engine start, warm-up, measured load and telemetry, reduced to a record and a sample."""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pandas as pd

from llmplay.archive.model import TRIAL_FAILED, TRIAL_INTERRUPTED, TRIAL_OK, TrialRecord
from llmplay.catalog import CAPACITY_METRICS, absence_reason, fmt_full, label_of, sample_count_key, thin_sample
from llmplay.engines.base import Engine
from llmplay.errors import EngineStartError, InfrastructureError
from llmplay.loadgen.records import LoadResult
from llmplay.loadgen.runner import LoadInterrupted, run_load_sync
from llmplay.loadgen.tokenizer import make_tokenizer
from llmplay.loadgen.workload import iter_requests
from llmplay.metrics import (
    engine_prefix_reuse,
    per_request_frame,
    prefix_reuse_text,
    slo_attainment,
    summarize,
    usd_per_1m_tokens,
)
from llmplay.redaction import resolve_args, resolve_env
from llmplay.runtime.base import Runtime
from llmplay.runtime.labels import LABEL_CONFIG, LABEL_RUN, LABEL_TRIAL
from llmplay.spec import CapacitySpec, Config, EngineSpec, Playbook, gpu_count
from llmplay.telemetry.nvml import NvmlSource
from llmplay.telemetry.proc import DockerStatsSource, ProcessSource
from llmplay.telemetry.prom import PrometheusSource
from llmplay.telemetry.sampler import Source, TelemetrySampler
from llmplay.tuning.capacity import (
    CapacityResult,
    ProbeRun,
    boundary_run,
    capacity_summary,
    probe_workload,
    search_capacity,
)
from llmplay.tuning.decide import TrialSample, sample_from_records
from llmplay.tuning.quality import ProbeResult, run_probes
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


def telemetry_sources(runtime: Any, endpoint: Any, engine: Engine, spec: EngineSpec) -> list[Source]:
    """What can be sampled for this engine: its /metrics, its container or process, and its GPUs."""
    sources: list[Source] = [PrometheusSource(endpoint.base_url, engine.metric_names)]
    container = getattr(runtime, "container", None)
    pid = getattr(runtime, "pid", None)
    if container is not None:
        sources.append(DockerStatsSource(container))
    elif pid:
        sources.append(ProcessSource(pid))
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


def run_trial(
    playbook: Playbook,
    config: Config,
    engine: Engine,
    runtime_factory: Callable[..., Runtime],
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

    With `capacity`, the measured load is a capacity search on this one engine start (tuning.capacity); the
    trial's records and summary are then those of its boundary probe, with the capacity.* figures added.
    A signal mid-load raises TrialInterrupted carrying what finished, after the engine has stopped."""
    started, t0 = utc_now(), time.perf_counter()
    # Common random numbers: both trials of A/B pair `repeat` send the same request sequence (lengths, prompts,
    # arrival times), so the workload's own randomness cancels in the pair's ratio, while each pair draws a new
    # sequence and the verdict does not hinge on one sample of requests.
    config = replace(config, workload=replace(config.workload, seed=config.workload.seed + repeat))
    labels = {LABEL_RUN: run_id, LABEL_TRIAL: trial_id, LABEL_CONFIG: config.label}
    runtime = runtime_factory(playbook.runtime)
    spec = replace(config.engine, env=resolve_env(config.engine.env), extra_args=resolve_args(config.engine.extra_args))
    base: dict[str, Any] = {
        "trial_id": trial_id,
        "config_id": config.label,
        "step": step,
        "role": role,
        "repeat": repeat,
        "started_utc": started,
    }
    log = ""
    if capacity is not None and capacity.engine == "fresh":
        return _fresh_engine_search(playbook, config, engine, runtime_factory, spec, labels, base, capacity, t0)
    try:
        with runtime.start(spec, engine, labels) as endpoint:
            try:
                # The metric names of the release that answered, not of the one the adapter was written for.
                version = endpoint.describe.get("engine_version")
                sources = telemetry_sources(runtime, endpoint, engine.at(str(version) if version else None), spec)
                with TelemetrySampler(sources) as sampler:
                    sampler_origin_ns = time.perf_counter_ns() - int(sampler.elapsed_s() * 1e9)
                    tokenizer = make_tokenizer("auto", endpoint.base_url, model_dir=spec.model_dir)
                    try:
                        search: CapacityResult | None = None
                        if capacity is not None:
                            load, search = capacity_search(
                                endpoint.base_url,
                                endpoint.model,
                                config.workload,
                                capacity,
                                playbook.goals.slo_s,
                                tokenizer,
                                progress=progress,
                            )
                        else:
                            requests: Any = iter_requests(config.workload, tokenizer, endpoint.model)
                            if config.workload.num_requests is not None:
                                requests = tuple(requests)  # bounded: every prompt built before the clock starts
                            load = run_load_sync(
                                endpoint.base_url, config.workload, requests, progress=progress, tokenizer=tokenizer
                            )
                    finally:
                        tokenizer.close()
                # After the timed window, before the engine stops: the probes cost seconds and no latency figure.
                probes = _answer_probes(playbook, config, endpoint)
            except LoadInterrupted as exc:
                # A signal mid-load: keep what finished (and the engine's log, while the container exists),
                # then let the interrupt go on unwinding; --resume runs this trial again.
                partial = exc.partial
                measured = partial.measured()
                partial_summary: dict[str, Any] = summarize(
                    partial.records, partial.duration_s, playbook.goals.slo_s
                ).as_dict()
                trial = TrialRecord(
                    **base,
                    status=TRIAL_INTERRUPTED,
                    wall_s=time.perf_counter() - t0,
                    summary=partial_summary,
                    engine_describe=dict(runtime.describe()),
                    error=f"interrupted by a signal; {sum(r.ok for r in measured)} finished "
                    "request(s) kept, requests in flight were not recorded",
                )
                raise TrialInterrupted(trial, per_request_frame(partial.records), runtime.logs()) from None
            except InfrastructureError as exc:
                # The engine was healthy, then failed us (e.g. froze while its tokenizer was asked): this
                # trial failed, the run goes on. Not EngineStartError's path: the container is still ours here.
                failed = TrialRecord(
                    **base,
                    status=TRIAL_FAILED,
                    wall_s=time.perf_counter() - t0,
                    summary={},
                    error=f"the engine failed during the trial: {str(exc).splitlines()[0]}",
                    engine_describe=dict(runtime.describe()),
                )
                return TrialResult(failed, engine_log=runtime.logs())
            telemetry = sampler.result()
            describe = dict(runtime.describe())
            alive = runtime.alive()
            log = runtime.logs()
    except EngineStartError as exc:
        never_started = TrialRecord(
            **base,
            status=TRIAL_FAILED,
            wall_s=time.perf_counter() - t0,
            summary={},
            error=start_failure_cause(exc),
            engine_describe={},
        )
        return TrialResult(never_started, engine_log=exc.log_tail or log)
    records = per_request_frame(load.records)
    summary: dict[str, Any] = summarize(load.records, load.duration_s, playbook.goals.slo_s).as_dict()
    summary["duration_s"] = load.duration_s
    # Telemetry of the measured window only, like the load metrics: warm-up and engine start excluded.
    notes = [
        *telemetry.notes,
        f"tokenizer: {load.tokenizer}",
        "workload seed: the playbook's plus the trial's repeat (both trials of an A/B pair send the same requests)",
    ]
    telemetry_frame: pd.DataFrame | None = None
    try:
        summary.update(telemetry.summary(start_s=max(0.0, (load.start_ns - sampler_origin_ns) / 1e9)))
        summary.update(engine_prefix_reuse(summary))
        telemetry_frame = telemetry.to_frame()
    except Exception as exc:  # a bug in telemetry must not cost the measured load: the trial keeps its requests
        notes.append(f"telemetry not summarised ({type(exc).__name__}: {exc}); its figures are not measured")
    cost = usd_per_1m_tokens(price_per_hour(playbook, config), summary.get("throughput.output_tok_s"))
    if cost is not None:
        summary["cost.usd_per_1m_tokens"] = cost
    if search is not None:
        summary.update(capacity_summary(search, price_per_hour(playbook, config)))
        notes.append(
            f"capacity search: {search.boundary_text()}; {search.runs} probe run(s), {search.engine_s:.0f} s of load; "
            "the trial's requests and figures are its boundary probe's"
        )
    error = None
    status = TRIAL_OK
    if not alive:
        status, error = TRIAL_FAILED, "the engine exited during the load"
    elif summary.get("requests.completed", 0) == 0:
        status, error = TRIAL_FAILED, f"no request completed ({summary.get('errors.count', 0):.0f} errors)"
    trial = TrialRecord(
        **base,
        status=status,
        wall_s=time.perf_counter() - t0,
        summary=summary,
        engine_describe=describe,
        error=error,
        notes=tuple(notes),
    )
    return TrialResult(
        trial,
        records,
        telemetry_frame,
        log,
        trial_sample(playbook, config, trial, records),
        probes=probes,
        capacity=search,
    )


def _fresh_engine_search(
    playbook: Playbook,
    config: Config,
    engine: Engine,
    runtime_factory: Callable[..., Runtime],
    spec: EngineSpec,
    labels: Mapping[str, str],
    base: Mapping[str, Any],
    capacity: CapacitySpec,
    t0: float,
) -> TrialResult:
    """goals.capacity.engine: fresh: a capacity search whose every probe has an engine start of its own (no
    telemetry: no sampler outlives one probe). The engine-seconds count load only, not the starts."""
    last: dict[str, Any] = {"describe": {}, "log": ""}

    def measure(load_value: float, replicate: int) -> ProbeRun:
        runtime = runtime_factory(playbook.runtime)
        with runtime.start(spec, engine, dict(labels)) as endpoint:
            tokenizer = make_tokenizer("auto", endpoint.base_url, model_dir=spec.model_dir)
            try:
                probe = probe_workload(config.workload, capacity, load_value, replicate)
                started = time.perf_counter()
                result = run_load_sync(
                    endpoint.base_url, probe, iter_requests(probe, tokenizer, endpoint.model), tokenizer=tokenizer
                )
                engine_s = time.perf_counter() - started
            finally:
                tokenizer.close()
            last.update(describe=dict(runtime.describe()), log=runtime.logs())
        attainment = slo_attainment(result.records, result.duration_s, playbook.goals.slo_s, capacity.attainment)
        return ProbeRun(load_value, replicate, attainment, result.duration_s, engine_s, result)

    try:
        search, runs = search_capacity(capacity, playbook.goals.slo_s, measure)
    except (EngineStartError, InfrastructureError) as exc:
        failed = TrialRecord(
            **base,
            status=TRIAL_FAILED,
            wall_s=time.perf_counter() - t0,
            summary={},
            error=start_failure_cause(exc) if isinstance(exc, EngineStartError) else str(exc).splitlines()[0],
            engine_describe=last["describe"],
        )
        return TrialResult(failed, engine_log=getattr(exc, "log_tail", None) or last["log"])
    boundary = boundary_run(search, runs)
    assert boundary is not None  # the first probe always runs
    load = boundary.load_result
    summary: dict[str, Any] = summarize(load.records, load.duration_s, playbook.goals.slo_s).as_dict()
    summary["duration_s"] = load.duration_s
    price = price_per_hour(playbook, config)
    cost = usd_per_1m_tokens(price, summary.get("throughput.output_tok_s"))
    if cost is not None:
        summary["cost.usd_per_1m_tokens"] = cost
    summary.update(capacity_summary(search, price))
    ok = summary.get("requests.completed", 0) > 0
    trial = TrialRecord(
        **base,
        status=TRIAL_OK if ok else TRIAL_FAILED,
        wall_s=time.perf_counter() - t0,
        summary=summary,
        engine_describe=last["describe"],
        error=None if ok else "no request completed at the boundary probe",
        notes=(
            f"capacity search with a fresh engine start per probe: {search.boundary_text()}; {search.runs} probe "
            f"run(s), {search.engine_s:.0f} s of load; no telemetry",
        ),
    )
    records = per_request_frame(load.records)
    return TrialResult(
        trial, records, None, last["log"], trial_sample(playbook, config, trial, records), capacity=search
    )


def capacity_search(
    url: str,
    model: str,
    workload: Any,
    spec: CapacitySpec,
    slo_s: Mapping[str, float],
    tokenizer: Any,
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


def _answer_probes(playbook: Playbook, config: Config, endpoint: Any) -> tuple[ProbeResult, ...] | None:
    quality = playbook.goals.quality
    if quality is None:
        return None
    api = "chat" if config.workload.api == "chat" else "completions"
    timeout = httpx.Timeout(config.workload.request_timeout_s or 60.0)
    with httpx.Client(base_url=endpoint.base_url, timeout=timeout) as client:
        return tuple(run_probes(client, api, endpoint.model, quality.prompts, quality.max_tokens))


def measured(value: object) -> float | None:
    """A summary value as a number, or None when it is absent (None, NaN, inf, or not a number at all)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def figure(metric: str, summary: Mapping[str, Any]) -> str:
    """One figure as the console shows it: "12.0 ms", or "not measured (why)" when the summary lacks it."""
    value = measured(summary.get(metric))
    if value is None:
        return f"not measured ({absence_reason(metric)})"
    return fmt_full(metric, value)


def thin_warning(metric: str, summary: Mapping[str, Any]) -> str | None:
    """The catalog's warning when a measured percentile rests on too few requests; None otherwise."""
    key = sample_count_key(metric)
    count = measured(summary.get(key)) if key else None
    if key is None or count is None or measured(summary.get(metric)) is None:
        return None  # an absent figure already says why; an unknown count warns of nothing
    return thin_sample(metric, {key: count})


def describe_trial(trial: TrialRecord) -> str:
    """The console line of a finished trial: its headline figures (an absent one says why), or why it failed;
    percentiles resting on too few requests are named at the end of the line."""
    role = f"{trial.step or 'baseline'}/{trial.role} #{trial.repeat + 1}"
    if trial.status != TRIAL_OK:
        return f"  trial {trial.trial_id} {role}: FAILED: {trial.error or 'no reason recorded'}"
    s: Mapping[str, Any] = trial.summary
    shown = ("ttft.p95", "tpot.p95", "errors.rate")
    figures = [f"output {figure('throughput.output_tok_s', s)}", *(f"{label_of(m)} {figure(m, s)}" for m in shown)]
    head = ""
    if "capacity.runs" in s:  # a capacity search: its boundary first, the figures after are its boundary probe's
        found = [f"{label_of(m)} {figure(m, s)}" for m in CAPACITY_METRICS if measured(s.get(m)) is not None]
        head = ", ".join(found or ["capacity not measured (indeterminate, or outside its bounds)"])
        head += "; at the boundary probe: "
    if (reuse := prefix_reuse_text(s)) is not None:
        figures.append(reuse)
    thin = [warning for m in shown if (warning := thin_warning(m, s)) is not None]
    return f"  trial {trial.trial_id} {role}: {head}{', '.join(figures)}" + (f" — {'; '.join(thin)}" if thin else "")
