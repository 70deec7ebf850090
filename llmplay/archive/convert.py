"""Manifest JSON -> the archive's typed records (archive.model), once, at the reader's boundary.

Every older shape of the manifest is handled here, so nothing after the reader asks whether a key is there: a figure
an older llmplay did not record is None (or the record's documented default), a field it did not know takes the
value its behaviour then had (spec's defaults), and a p-value it kept is read and dropped (MetricDelta).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import fields
from typing import Any  # json.loads' values, copied into records as archived (see _as_archived)

from llmplay.archive.capacity import FOUND, UNITS, CapacityResult, ProbeVerdict
from llmplay.archive.layout import PLAYBOOK_FILE
from llmplay.archive.model import (
    Candidate,
    ConfigRecord,
    Diagnosis,
    EngineDescription,
    Environment,
    Finding,
    GateResult,
    GpuInfo,
    MemoryFacts,
    MetricDelta,
    PlaybookAsRun,
    PlaybookRef,
    RooflineFacts,
    RuleChecked,
    RunInfo,
    Scalar,
    SearchRecord,
    SearchValue,
    StepVerdict,
    TrialRecord,
    TrialsAsRun,
    TuningRow,
)
from llmplay.engines.knobs import Direction, Remedy
from llmplay.jsonvalue import as_list as _items
from llmplay.jsonvalue import as_mapping as mapping
from llmplay.jsonvalue import as_number as _number
from llmplay.jsonvalue import as_text as _text
from llmplay.spec import (
    CapacitySpec,
    EngineSpec,
    LengthDist,
    Objective,
    ThinkTime,
    TraceFacts,
    TraceSpec,
    Trials,
    Workload,
)
from llmplay.units import parse_fraction


# ---------------------------------------------------------------------------------------------- JSON values
def _whole(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _scalars(value: object) -> dict[str, Scalar]:
    """Facts by name, without the ones not given (null), which are left out rather than shown as "None"."""
    return {
        str(k): v if isinstance(v, (str, int, float, bool)) else str(v)
        for k, v in mapping(value).items()
        if v is not None
    }


def _figures(value: object) -> dict[str, float]:
    return {str(k): number for k, v in mapping(value).items() if (number := _number(v)) is not None}


def _as_archived(values: Mapping[str, object]) -> dict[str, Any]:  # Any: json.loads' values, checked by the schema
    """Fields copied as archived: the manifest schema (verify) checked their JSON types, so a record's constructor
    takes them as they are."""
    return dict(values)


def _known(cls: type, d: Mapping[str, object]) -> dict[str, Any]:  # Any: as _as_archived
    """The keys of `d` that are fields of the dataclass `cls` (a newer llmplay's extra keys are ignored)."""
    return {f.name: d[f.name] for f in fields(cls) if f.name in d}


# ---------------------------------------------------------------------------------------------- trials and steps
def delta_from(d: object) -> MetricDelta | None:
    if d is None:
        return None
    values = {k: mapping(d).get(k) for k in MetricDelta.__dataclass_fields__}
    return MetricDelta(**_as_archived(values))


def trial_from(d: Mapping[str, object]) -> TrialRecord:
    kw = _known(TrialRecord, d)
    kw["summary"] = {k: v for k, v in mapping(d.get("summary")).items() if v is not None}
    kw["notes"] = tuple(_items(d.get("notes")))
    kw["files"] = dict(mapping(d.get("files")))
    kw["engine_describe"] = engine_description_from(mapping(d.get("engine_describe")))
    kw["node"] = dict(mapping(d.get("node")))
    if d.get("shared_with") is not None:
        kw["shared_with"] = tuple(mapping(o) for o in _items(d.get("shared_with")))
    return TrialRecord(**kw)


def _given(value: object) -> str | None:
    """A fact as text; None when it is not given (absent, null, empty)."""
    return str(value) if value else None


def _labels(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in mapping(value).items()}


def engine_description_from(d: Mapping[str, object]) -> EngineDescription | None:
    """A trial's engine as archived; None when it was never described (`{}`). Older archives named the version
    `version` and the digest `digest` or `repo_digest`: read into the same facts."""
    if not d:
        return None
    gpus, command = d.get("gpus"), d.get("command")
    return EngineDescription(
        runtime=_text(d.get("runtime")),
        engine=_text(d.get("engine")),
        engine_version=_given(d.get("version") or d.get("engine_version")),
        image=_given(d.get("image")),
        image_id=_given(d.get("image_id")),
        image_digest=_given(d.get("image_digest") or d.get("digest") or d.get("repo_digest")),
        command=None if command is None else tuple(str(a) for a in _items(command)),
        command_line=_text(d.get("command_line")),
        container_id=_text(d.get("container_id")),
        container_name=_text(d.get("container_name")),
        host_port=_whole(d.get("host_port")),
        container_port=_whole(d.get("container_port")),
        labels=_labels(d.get("labels")),
        gpus=gpus if isinstance(gpus, int) else tuple(str(g) for g in _items(gpus)) if gpus is not None else None,
        image_labels=_labels(d.get("image_labels")) if d.get("image_labels") is not None else None,
        health_s=_number(d.get("health_s")),
        engine_version_reported=_text(d.get("engine_version_reported")),
        base_url=_text(d.get("base_url")),
        executable=_text(d.get("executable")),
        log_path=_text(d.get("log_path")),
        pid=_whole(d.get("pid")),
    )


def _length_from(value: object, default: LengthDist) -> LengthDist:
    if not isinstance(value, Mapping) or "kind" not in value:
        return default
    kw = _known(LengthDist, value)
    for key in ("values", "weights"):
        kw[key] = tuple(_items(kw.get(key)))
    return LengthDist(**kw)


def engine_from(d: Mapping[str, object]) -> EngineSpec:
    kw = _known(EngineSpec, d)
    kw.setdefault("kind", "")
    kw.setdefault("model", "")
    kw["args"] = dict(mapping(kw.get("args")))
    kw["env"] = dict(mapping(kw.get("env")))
    kw["extra_args"] = tuple(_items(kw.get("extra_args")))
    if isinstance(kw.get("gpus"), list):
        kw["gpus"] = tuple(str(g) for g in kw["gpus"])
    return EngineSpec(**kw)


def _trace_from(value: object) -> TraceSpec | None:
    """workload.trace as archived, its window's facts included; None before traces were replayed, or damaged."""
    d = mapping(value)
    if not isinstance(d.get("file"), str) or not isinstance(d.get("format"), str):
        return None
    kw = _known(TraceSpec, d)
    facts = mapping(d.get("facts"))
    try:
        kw["facts"] = TraceFacts(**_known(TraceFacts, facts)) if facts else None
    except TypeError:  # a facts record missing a field: the trace is still described, its figures not
        kw["facts"] = None
    return TraceSpec(**kw)


def _think_time_from(value: object) -> ThinkTime:
    d = mapping(value)
    return ThinkTime(**_known(ThinkTime, d)) if "kind" in d else ThinkTime()


def workload_from(d: Mapping[str, object]) -> Workload:
    kw = _known(Workload, d)
    kw["input"] = _length_from(kw.get("input"), Workload.input)
    kw["output"] = _length_from(kw.get("output"), Workload.output)
    kw["sweep"] = tuple(_items(kw.get("sweep")))
    kw["trace"] = _trace_from(kw.get("trace"))
    kw["think_time"] = _think_time_from(kw.get("think_time"))
    return Workload(**kw)


def config_from(d: Mapping[str, object]) -> ConfigRecord:
    return ConfigRecord(
        config_id=str(d["config_id"]),
        engine=engine_from(mapping(d.get("engine"))),
        workload=workload_from(mapping(d.get("workload"))),
        command=tuple(str(a) for a in _items(d.get("command"))),
        docker_command=str(d.get("docker_command") or ""),
    )


def verdict_from(d: Mapping[str, object]) -> StepVerdict:
    kw = _known(StepVerdict, d)
    kw["objective"] = delta_from(d.get("objective"))
    kw["guards"] = tuple(delta_from(g) for g in _items(d.get("guards")))
    kw["deltas"] = tuple(delta_from(g) for g in _items(d.get("deltas")))
    for key in ("changes", "trials_baseline", "trials_candidate"):
        kw[key] = tuple(_items(d.get(key)))
    kw["search"] = search_from(mapping(d["search"])) if isinstance(d.get("search"), Mapping) else None
    kw["noise"] = tuple(
        (str(n[0]), float(n[1]), int(n[2]))
        for n in _items(d.get("noise"))
        if isinstance(n, (list, tuple)) and len(n) == 3
    )
    kw["noise_runs"] = tuple(_items(d.get("noise_runs")))
    return StepVerdict(**kw)


def _search_value_from(d: Mapping[str, object]) -> SearchValue:
    kw = _known(SearchValue, d)
    kw["effect"] = delta_from(d.get("effect"))
    kw["trials"] = tuple(_items(d.get("trials")))
    kw["metrics"] = _figures(d.get("metrics"))
    return SearchValue(**kw)


def search_from(d: Mapping[str, object]) -> SearchRecord:
    """A search step's race as archived (absent from archives older than the search step)."""
    kw = _known(SearchRecord, d)
    kw["values"] = tuple(_search_value_from(mapping(v)) for v in _items(d.get("values")))
    kw["incumbent_metrics"] = _figures(d.get("incumbent_metrics"))
    kw["gain"] = delta_from(d.get("gain"))
    return SearchRecord(**kw)


def gate_from(d: Mapping[str, object]) -> GateResult:
    return GateResult(**_as_archived({k: d.get(k) for k in GateResult.__dataclass_fields__}))


def tuning_row_from(d: Mapping[str, object]) -> TuningRow:
    """A tuning-record row; rows archived before request counts were kept have no `samples`."""
    return TuningRow(
        config_id=str(d.get("config_id", "?")),
        trials=tuple(str(t) for t in _items(d.get("trials"))),
        metrics=_figures(d.get("metrics")),
        failed_trials=_whole(d.get("failed_trials")) or 0,
        samples={str(k): int(n) for k, v in mapping(d.get("samples")).items() if (n := _number(v)) is not None},
        step=_text(d.get("step")),
        verdict=_text(d.get("verdict")),
        reason=str(d.get("reason") or ""),
        compared_with=str(d.get("compared_with") or ""),
        changes=tuple(str(c) for c in _items(d.get("changes"))),
    )


# ---------------------------------------------------------------------------------------------- the diagnosis
def finding_from(d: Mapping[str, object]) -> Finding:
    text = {k: str(d.get(k) or "") for k in Finding.__dataclass_fields__ if k != "candidates"}
    return Finding(**text, candidates=tuple(c for raw in _items(d.get("candidates")) if (c := _candidate(raw))))


def _candidate(d: object) -> Candidate | None:
    """An archived candidate step; one naming a remedy or direction this llmplay does not know is left out."""
    if not isinstance(d, Mapping):
        return None
    try:
        remedy, direction = Remedy(str(d.get("remedy"))), Direction(str(d.get("direction")))
    except ValueError:
        return None
    return Candidate(remedy, direction, str(d.get("finding_id") or ""), str(d.get("evidence") or ""))


def _memory_from(d: Mapping[str, object]) -> MemoryFacts | None:
    if not d:
        return None
    kw = {f.name: _number(d.get(f.name)) for f in fields(MemoryFacts) if f.type == "float | None"}
    return MemoryFacts(
        **kw,
        device=str(d.get("device") or MemoryFacts.device),
        notes=tuple(str(n) for n in _items(d.get("notes"))),
    )


def _roofline_from(d: Mapping[str, object]) -> RooflineFacts | None:
    floor = _number(d.get("floor_s"))
    if not floor:  # no bandwidth figure for the GPU: no floor, nothing to draw
        return None
    kw = {f.name: _number(d.get(f.name)) for f in fields(RooflineFacts) if f.type == "float | None"}
    return RooflineFacts(floor_s=floor, **kw, bandwidth_source=str(d.get("bandwidth_source") or ""))


def diagnosis_from(d: Mapping[str, object]) -> Diagnosis:
    """The diagnosis beside the findings; `rules` (the checklist rules evaluated) is absent in older archives."""
    rules = d.get("rules")
    return Diagnosis(
        notes=tuple(str(n) for n in _items(d.get("notes"))),
        model=_scalars(d.get("model")),
        memory=_memory_from(mapping(d.get("memory"))),
        roofline=_roofline_from(mapping(d.get("roofline"))),
        scheduler=_scalars(d.get("scheduler")),
        rules=None
        if rules is None
        else tuple(
            RuleChecked(str(r.get("id", "")), str(r.get("section", "")), str(r.get("title", "")))
            for r in map(mapping, _items(rules))
        ),
    )


# ---------------------------------------------------------------------------------------------- capacity searches
def _probe_from(d: Mapping[str, object]) -> ProbeVerdict:
    """One probed load as capacity.json holds it; a figure an older llmplay did not keep is None (or 0 runs)."""
    return ProbeVerdict(
        load=float(_number(d.get("load")) or 0.0),
        first_run=_whole(d.get("first_run")) or 0,
        runs=_whole(d.get("runs")) or 0,
        n_requests=_whole(d.get("n_requests")) or 0,
        attainment=_number(d.get("attainment")),
        ci_low=_number(d.get("ci_low")),
        ci_high=_number(d.get("ci_high")),
        verdict=str(d.get("verdict") or ""),
        per_slo=_figures(d.get("per_slo")),
        at_quantile_s={str(k): _number(v) for k, v in mapping(d.get("at_quantile_s")).items()},
        output_tok_s=_number(d.get("output_tok_s")),
        req_s=_number(d.get("req_s")),
        engine_s=_number(d.get("engine_s")) or 0.0,
        batches=tuple(n for b in _items(d.get("batches")) if (n := _number(b)) is not None),
    )


def _limits(value: object) -> dict[str, dict[str, float | None]]:
    return {str(k): {str(n): _number(x) for n, x in mapping(v).items()} for k, v in mapping(value).items()}


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def capacity_from(d: Mapping[str, object]) -> CapacityResult:
    """A trial's capacity search (capacity.json) as the one record of a search, older shapes included: a search
    without `search` is named by its unit, one without bounds is bounded by its probes, one without an estimate
    keeps the capacity it archived, and its bracket and binding SLO keep the words it archived."""
    unit = str(d.get("unit") or "")
    search = str(d.get("search") or next((k for k, u in UNITS.items() if u == unit), "rate"))
    probes = tuple(_probe_from(mapping(p)) for p in _items(d.get("probes")))
    loads = [p.load for p in probes] or [0.0]
    bounds = [*_items(d.get("bounds")), None, None][:2]
    band = [*_items(d.get("boundary_ci")), None, None][:2]
    status = str(d["status"])
    estimate = _number(d.get("estimate"))
    if estimate is None and "estimate" not in d and status == FOUND:
        estimate = _number(d.get("capacity"))  # archived before the fitted estimate: its capacity as it said
    return CapacityResult(
        search=search,
        status=status,
        target=float(_number(d["target"]) or 0.0),
        confidence=_number(d.get("confidence")) or CapacitySpec.confidence,
        precision=_number(d.get("precision")) or CapacitySpec.precision,
        low=_or(_number(bounds[0]), min(loads)),
        high=_or(_number(bounds[1]), max(loads)),
        slo_s=_figures(d.get("slo_s")),
        feasible_max=_number(d.get("feasible_max")),
        infeasible_min=_number(d.get("infeasible_min")),
        probes=probes,
        runs=_whole(d.get("runs")) or 0,
        engine_s=_number(d.get("engine_s")) or 0.0,
        binding=_text(d.get("binding")),
        binding_value_s=_number(d.get("binding_value_s")),
        order=str(d.get("order") or ""),
        run_loads=tuple(n for x in _items(d.get("run_loads")) if (n := _number(x)) is not None),
        notes=tuple(str(n) for n in _items(d.get("notes"))),
        per_slo_limits=_limits(d.get("per_slo_limits")),
        estimate=estimate,
        ci=(_number(band[0]), _number(band[1])),
        said_boundary=str(d.get("boundary_text") or ""),
        said_binding=str(d.get("binding_sentence") or ""),
    )


# ---------------------------------------------------------------------------------------------- the run
def _gpu_from(value: object) -> GpuInfo | None:
    if not isinstance(value, Mapping):
        return None
    return GpuInfo(
        name=_text(value.get("name")) or None,
        driver=_text(value.get("driver")),
        cuda=_text(value.get("cuda")),
        count=int(value.get("count") or 1),
        error=_text(value.get("error")),
    )


def environment_from(env: Mapping[str, object]) -> Environment:
    docker = env.get("docker")
    if isinstance(docker, Mapping):  # some llmplay versions kept Docker's whole version document
        docker = docker.get("version") or docker.get("server") or json.dumps(docker)
    return Environment(
        started_utc=str(env.get("started_utc") or ""),
        user=_text(env.get("user")),
        host=_text(env.get("host")),
        platform=str(env.get("platform", "")),
        llmplay_version=_text(env.get("llmplay_version")),
        python=str(env.get("python", "")),
        docker=str(docker) if docker else None,
        seed=seed if isinstance(seed := env.get("seed"), (int, str)) else None,
        gpu=_gpu_from(env.get("gpu")),
    )


def run_info_from(m: Mapping[str, object]) -> RunInfo:
    playbook = mapping(m.get("playbook"))
    overrides = mapping(m.get("overrides"))
    repeats, only = overrides.get("repeats"), overrides.get("only")
    files = mapping(m.get("files"))
    return RunInfo(
        run_id=str(m["run_id"]),
        playbook=PlaybookRef(
            name=str(playbook.get("name") or ""),
            version=str(playbook.get("version") or ""),
            path=str(playbook.get("path") or ""),
            sha256=str(playbook.get("sha256") or ""),
            file=str(playbook.get("file") or PLAYBOOK_FILE),
        ),
        environment=environment_from(mapping(m.get("environment"))),
        status=str(m.get("status") or "?"),
        exit_code=code if isinstance(code := m.get("exit_code"), int) else None,
        final_config_id=_text(m.get("final_config_id")),
        finished_utc=str(m.get("finished_utc", "")),
        overrides=dict(overrides),
        repeats_override=_whole(repeats) or None,
        image_override=_text(overrides.get("image")) or None,
        only_override=(only,) if isinstance(only, str) and only else tuple(str(s) for s in _items(only)),
        capacity_override=bool(overrides.get("capacity")),
        files=len(files),
        file_sha256={str(k): v for k, v in files.items() if isinstance(v, str)},
        manifest_sha256=str(m.get("manifest_sha256", "")),
        report_error=_text(m.get("report_error")),
        redacted=tuple(str(p) for p in _items(m.get("redacted"))),
    )


# ---------------------------------------------------------------------------------------------- the archived playbook
def playbook_as_run(doc: Mapping[str, object]) -> PlaybookAsRun:
    """What the report quotes of the archived playbook's YAML document, tolerant of anything it finds there."""
    goals = mapping(doc.get("goals"))
    objective = mapping(goals.get("objective"))
    min_effect = Objective.min_effect
    if "min_effect" in objective:
        with contextlib.suppress(ValueError):  # not a fraction: the spec's default (the runner refused it anyway)
            min_effect = parse_fraction(objective["min_effect"])
    trials = mapping(doc.get("trials"))
    confidence, repeats = trials.get("confidence", Trials.confidence), trials.get("repeats")
    slo = goals.get("slo")
    return PlaybookAsRun(
        objective=next((f"{k} {v}" for k, v in objective.items() if k in ("minimize", "maximize")), ""),
        min_effect=min_effect,
        guards=tuple(
            f"{g.get('metric')} within {g.get('tolerance')}"
            for g in _items(goals.get("guards"))
            if isinstance(g, Mapping)
        ),
        slo=", ".join(f"{k} {v}" for k, v in slo.items()) if isinstance(slo, Mapping) else "",
        trials=TrialsAsRun(
            repeats=Trials.repeats if (count := _whole(repeats)) is None else count,
            interleave=bool(trials.get("interleave", Trials.interleave)),
            sequential=bool(trials.get("sequential", Trials.sequential)),
            confidence=level if (level := _number(confidence)) is not None else Trials.confidence,
            pool_noise=bool(trials.get("pool_noise", Trials.pool_noise)),
            noise=str(trials.get("noise") or ""),
        ),
        step_descriptions={
            str(s["name"]): str(s.get("description") or "")
            for s in _items(doc.get("steps"))
            if isinstance(s, Mapping) and "name" in s
        },
    )
