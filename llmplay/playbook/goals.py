"""Checked YAML -> the playbook's goals: gates, the objective, guards (relative or in points), SLOs, quality probes and
the capacity search, with the rules the schema cannot say."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import numpy as np

from llmplay import units
from llmplay.catalog import CAPACITY_METRICS, METRICS, RATE_METRICS, metric_info
from llmplay.files import display_path
from llmplay.playbook.convert import PromptFiles, parse_duration, prompt_file, prompt_rows
from llmplay.playbook.document import CapacityDoc, GateDoc, GoalsDoc, GuardDoc, QualityDoc
from llmplay.playbook.problems import Problems, did_you_mean
from llmplay.playbook.source import YamlPath
from llmplay.spec import CapacitySpec, Gate, Goals, Guard, Objective, QualitySpec, frozen_map


def parse_gate(raw: str | GateDoc, path: YamlPath, problems: Problems) -> Gate | None:
    """`ttft.p95 < 500ms` (or its mapping form) with the value in SI units; None after a problem."""
    if isinstance(raw, str):
        m = re.match(r"^\s*([a-z_0-9]+\.[a-z_0-9]+)\s*(<=|>=|<|>)\s*(\S+)\s*$", raw)
        if not m:
            problems.add(path, f"found {raw!r}; expected 'metric op value' like 'ttft.p95 < 500ms'")
            return None
        metric, op, value_text = m.groups()
        text = raw.strip()
    else:
        metric, op, value_text = raw["metric"], raw["op"], raw["value"]
        text = f"{metric} {op} {value_text}"
    info = metric_info(metric)
    if info is None:
        problems.add(
            path,
            f"unknown metric '{metric}'{did_you_mean(metric, METRICS)}; expected one of: "
            "ttft.p95, tpot.p95, itl.p99, e2el.p95, throughput.output_tok_s, throughput.req_s, "
            "goodput.req_s, cost.usd_per_1m_tokens, memory.peak_frac, errors.rate (and other stats)",
        )
        return None
    try:
        value = info.parse_value(value_text)
    except units.UnitError as exc:
        problems.add(path, f"{metric}: found {exc.found!r}, expected {exc.expected}")
        return None
    if not math.isfinite(value):
        problems.add(path, f"{metric}: found {value_text!r}; expected a finite threshold")
        return None
    if info.unit == "fraction" and not 0 <= value <= 1:
        # A share cannot pass 100%: `errors.rate < 150%` would hold always, `> 150%` never; neither is a gate.
        problems.add(path, f"{metric}: found {value_text!r}; expected a share from 0 to 100% (0 to 1)")
        return None
    return Gate(metric, op, value, text)


def parse_quality(
    raw: QualityDoc | None,
    base_dir: Path,
    dataset: str | None,
    problems: Problems,
    files: PromptFiles | None = None,
) -> QualitySpec | None:
    """goals.quality: the probe prompts (a JSONL file, or the workload's dataset drawn with a seed) and the default
    guards for steps whose knob risks accuracy."""
    if raw is None:
        return None
    path: YamlPath = ("goals", "quality")
    files = files if files is not None else PromptFiles(None)
    before = len(problems.lines)
    n = raw.get("num_prompts", 8)
    if ("probes" in raw) == ("from_workload" in raw):
        problems.add(
            path,
            "found "
            + ("both probes and from_workload" if "probes" in raw else "neither probes nor from_workload")
            + "; expected exactly one source of probe prompts",
        )
        return None
    if "probes" in raw:
        file = prompt_file(raw["probes"], "probes", base_dir, files, (*path, "probes"), problems)
        if file is None:
            return None
        prompts = [row.prompt for row in prompt_rows(file, (*path, "probes"), problems, files)][:n]
        source = display_path(str(file))
    else:
        if dataset is None:
            problems.add(
                (*path, "from_workload"),
                "found a workload without a dataset; expected workload.dataset, "
                "or goals.quality.probes with a probe file",
            )
            return None
        seed = raw["from_workload"].get("seed", 0)
        if Path(dataset) not in files.rows:
            return None  # refused (outside the tree) or missing: workload.dataset's own problem says why
        pool = [row.prompt for row in prompt_rows(Path(dataset), (*path, "from_workload"), problems, files)]
        order = [int(i) for i in np.random.default_rng(seed).permutation(len(pool))]
        prompts = [pool[i] for i in order[:n]]
        source = f"{display_path(dataset)}, {len(prompts)} drawn with seed {seed}"
    if not prompts and len(problems.lines) == before:
        problems.add(path, f"found an empty probe set in {source}; expected at least one prompt")
        return None
    checks = tuple(raw.get("checks", QualitySpec.checks))
    tol = 0.10
    if "tolerance" in raw:
        try:
            tol = units.parse_fraction(raw["tolerance"])
        except units.UnitError as exc:
            problems.add((*path, "tolerance"), str(exc))
    # The continuous shift gets the same number, in nats: 0.1 nats is a small but real change of confidence.
    guards = tuple(
        Guard(m, tol, "minimize" if m == "quality.logprob_shift" else "maximize")
        for m in checks
        if m in ("quality.token_agreement", "quality.logprob_shift")
    ) or tuple(Guard(m, tol, "maximize") for m in checks)
    return QualitySpec(tuple(prompts), source, raw.get("max_tokens", 32), checks, guards)


def parse_capacity(
    raw: CapacityDoc | None, slo: Mapping[str, float], problems: Problems, *, slo_told: bool = False
) -> CapacitySpec | None:
    """goals.capacity, with the rules the schema cannot say: an attainment in (0, 1], bounds low < high, SLOs to
    attain, whole users for a concurrency search."""
    if raw is None:
        return None
    path: YamlPath = ("goals", "capacity")
    before = len(problems.lines)
    d = CapacitySpec(search="rate", low=1.0, high=2.0)

    def fraction(key: Literal["attainment", "precision"], default: float) -> float:
        if key not in raw:
            return default
        try:
            return units.parse_fraction(raw[key])
        except units.UnitError as exc:
            problems.add((*path, key), str(exc))
            return default

    attainment = fraction("attainment", d.attainment)
    if not 0 < attainment <= 1:
        problems.add(
            (*path, "attainment"),
            f"found {raw['attainment']!r}; expected a share of requests in (0, 1], e.g. 95% or 0.95",
        )
    precision = fraction("precision", d.precision)
    if not 0 < precision < 1:
        problems.add((*path, "precision"), f"found {raw['precision']!r}; expected a relative width in (0, 1), e.g. 5%")
    low, high = (float(v) for v in raw["bounds"])
    if not (math.isfinite(low) and math.isfinite(high)):
        problems.add((*path, "bounds"), f"found {raw['bounds']}; expected finite loads [low, high]")
    elif low >= high:
        problems.add(
            (*path, "bounds"),
            f"found [{raw['bounds'][0]}, {raw['bounds'][1]}]; expected [low, high] with low < high",
        )
    finite = math.isfinite(low) and math.isfinite(high)
    if raw["search"] == "concurrency" and finite and not all(float(v).is_integer() for v in raw["bounds"]):
        problems.add(
            (*path, "bounds"), f"found {raw['bounds']}; expected whole numbers of users for a concurrency search"
        )
    if not slo and not slo_told:
        problems.add(
            path,
            "found no goals.slo; expected the per-request SLOs the capacity is attained under, e.g. slo: {ttft: 500ms}",
        )
    probe_s = parse_duration(raw, "probe", path, problems, d.probe_s)
    probe_s = d.probe_s if probe_s is None else probe_s
    if probe_s <= 0:
        problems.add((*path, "probe"), "found 0; expected a probe length above zero, e.g. 10s")
    max_engine_s = parse_duration(raw, "max_engine_time", path, problems, d.max_engine_s) or d.max_engine_s
    if max_engine_s < probe_s:
        problems.add(
            (*path, "max_engine_time"),
            f"found {max_engine_s:g}s, shorter than one {probe_s:g}s probe; expected at least a few probes' worth",
        )
    if len(problems.lines) > before:
        return None
    return CapacitySpec(
        search=raw["search"],
        low=low,
        high=high,
        attainment=attainment,
        precision=precision,
        probe_s=probe_s,
        settle_s=parse_duration(raw, "settle", path, problems, d.settle_s) or 0.0,
        max_engine_s=max_engine_s,
        replicates=raw.get("replicates", d.replicates),
        confidence=raw.get("confidence", d.confidence),
        engine=raw.get("engine", d.engine),
    )


def _check_capacity_goals(goals: Goals, raw: GoalsDoc, problems: Problems) -> None:
    """A goal on a capacity metric needs SLOs to attain and a goals.capacity to search with: one line at the goal."""
    named: list[tuple[YamlPath, str]] = []
    direction = goals.objective.direction
    if goals.objective.metric in CAPACITY_METRICS and direction in raw.get("objective", {}):
        named.append((("goals", "objective", direction), goals.objective.metric))
    named += [(("goals", "gates", i), g.metric) for i, g in enumerate(goals.gates) if g.metric in CAPACITY_METRICS]
    named += [(("goals", "guards", i), g.metric) for i, g in enumerate(goals.guards) if g.metric in CAPACITY_METRICS]
    for path, metric in named:
        if not goals.slo_s:
            problems.add(
                path,
                f"{metric} is measured under SLOs, found no goals.slo; expected e.g. slo: {{ttft: 500ms, tpot: 50ms}}",
            )
        elif "capacity" not in raw:
            problems.add(
                path,
                f"{metric} needs a capacity search, found no goals.capacity; expected e.g. "
                "capacity: {search: rate, bounds: [0.5, 16]}",
            )
        elif metric == "capacity.rate" and raw["capacity"].get("search") == "concurrency":
            problems.add(
                path, "capacity.rate with search: concurrency; expected capacity.concurrency (or search: rate)"
            )
        elif metric == "capacity.concurrency" and raw["capacity"].get("search") == "rate":
            problems.add(
                path, "capacity.concurrency with search: rate; expected capacity.rate (or search: concurrency)"
            )


def parse_guard(raw: GuardDoc, path: YamlPath, problems: Problems, archived: bool = False) -> Guard | None:
    """A guard's tolerance: relative (15%), or in percentage points (0.5pp) for a rate of requests, whose baseline
    can be 0 and whose changes are counts (stats.decide decides those with a count interval). An archived playbook
    written before points existed keeps its relative rate tolerance, so its run is compared by the rule it ran with."""
    metric = raw["metric"]
    info = metric_info(metric)
    direction = "minimize" if (info is None or info.lower_is_better) else "maximize"
    tolerance = raw.get("tolerance", "0.5pp" if metric in RATE_METRICS else 0.05)
    points = units.parse_points(tolerance)
    if metric in RATE_METRICS:
        if points is None and archived:
            try:
                return Guard(metric, units.parse_fraction(tolerance), direction)
            except units.UnitError:
                pass
        if points is None:
            problems.add(
                (*path, "tolerance"),
                f"found {tolerance!r}, a relative tolerance on {metric}, a rate that can be 0 (from 0 no relative "
                f"change can hold, and one failed request in 600 would reject); expected percentage points, e.g. "
                f"tolerance: 0.5pp",
            )
            return None
        return Guard(metric, points, direction, absolute=True)
    if points is not None:
        problems.add(
            (*path, "tolerance"),
            f"found {tolerance!r}; percentage points apply to rates of requests ({', '.join(RATE_METRICS)}), "
            f"expected a relative tolerance for {metric} like 5%",
        )
        return None
    try:
        return Guard(metric, units.parse_fraction(tolerance), direction)
    except units.UnitError as exc:
        problems.add((*path, "tolerance"), str(exc))
        return None


def parse_goals(
    raw: GoalsDoc,
    problems: Problems,
    base_dir: Path | None = None,
    dataset: str | None = None,
    files: PromptFiles | None = None,
    *,
    archived: bool = False,
) -> Goals:
    """Gates, the objective (optimized the right way for its metric), guards and SLOs."""
    path: YamlPath = ("goals",)
    gates = tuple(g for i, r in enumerate(raw.get("gates", ())) if (g := parse_gate(r, (*path, "gates", i), problems)))
    obj_raw = raw.get("objective", {"minimize": "ttft.p95"})
    directions = [d for d in ("minimize", "maximize") if d in obj_raw]
    if len(directions) != 1:
        problems.add(
            (*path, "objective"), f"found {len(directions)} directions; expected exactly one of minimize or maximize"
        )
        directions = directions or ["minimize"]
    direction: Literal["minimize", "maximize"] = "maximize" if directions[0] == "maximize" else "minimize"
    metric = obj_raw.get(direction, "ttft.p95")
    min_effect = 0.02
    if "min_effect" in obj_raw:
        try:
            min_effect = units.parse_fraction(obj_raw["min_effect"])
        except units.UnitError as exc:
            problems.add((*path, "objective", "min_effect"), str(exc))
    info = metric_info(metric)
    if info and (direction == "minimize") != info.lower_is_better:
        problems.add(
            (*path, "objective", direction),
            f"{direction} {metric} optimizes the wrong way; expected "
            f"{'minimize' if info.lower_is_better else 'maximize'} for {metric}",
        )
    guards = [
        guard
        for i, r in enumerate(raw.get("guards", ()))
        if (guard := parse_guard(r, (*path, "guards", i), problems, archived))
    ]
    slo = {}
    for key, value in raw.get("slo", {}).items():
        slo[key] = units.parse_duration_s(value)
    quality = parse_quality(raw.get("quality"), base_dir or Path("."), dataset, problems, files)
    # A capacity goal without SLOs gets its one line at the goal, not a second one at goals.capacity.
    names_capacity = metric in CAPACITY_METRICS or any(
        m in CAPACITY_METRICS for m in (*(g.metric for g in gates), *(g.metric for g in guards))
    )
    capacity = parse_capacity(raw.get("capacity"), slo, problems, slo_told=names_capacity)
    goals = Goals(
        gates=gates,
        objective=Objective(direction, metric, min_effect),
        guards=tuple(guards),
        slo_s=frozen_map(slo),
        quality=quality,
        capacity=capacity,
    )
    _check_capacity_goals(goals, raw, problems)
    return goals
