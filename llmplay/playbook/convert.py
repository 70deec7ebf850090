"""Checked YAML -> frozen spec values: lengths, durations, prompt files, workload, engine, steps, trials, cost,
runtime (the goals are playbook.goals)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from llmplay import units
from llmplay.errors import PlaybookError
from llmplay.files import display_path
from llmplay.playbook.credentials import check_args, check_env, check_knob_value
from llmplay.playbook.dataset import DatasetProblems, DatasetRow, read_dataset
from llmplay.playbook.document import (
    EngineDoc,
    Fraction,
    LengthDoc,
    RuntimeDoc,
    StepDoc,
    ThinkTimeDoc,
    TrialsDoc,
    WorkloadDoc,
)
from llmplay.playbook.mounts import host_path
from llmplay.playbook.problems import Problems
from llmplay.playbook.schema import option_problem
from llmplay.playbook.source import YamlPath
from llmplay.playbook.step_forms import parse_step
from llmplay.playbook.trace import EXPECTED, apply_trace
from llmplay.spec import (
    Cost,
    EngineSpec,
    LengthDist,
    RuntimeSpec,
    Step,
    ThinkTime,
    Trials,
    Workload,
    frozen_map,
)

# The workload fields a step may set or search.
WORKLOAD_FIELDS = {
    "concurrency",
    "rate",
    "max_tokens",
    "streaming_fraction",
    "prefix_tokens",
    "prefix_groups",
    "turns",
    "arrival",
    "burst",
    "temperature",
    "api",
}


def parse_length(raw: LengthDoc, path: YamlPath, problems: Problems) -> LengthDist:
    """A token-length distribution: an integer, or one `{kind: params}` mapping."""
    if isinstance(raw, int):
        return LengthDist("fixed", value=raw)
    ((kind, written),) = raw.items()
    if isinstance(written, int):  # {fixed: N}
        return LengthDist("fixed", value=written)
    params = written
    if kind == "choice":
        values, weights = tuple(params["values"]), tuple(params.get("weights", ()))
        if weights and len(weights) != len(values):
            problems.add(
                (*path, "choice", "weights"),
                f"found {len(weights)} weights for {len(values)} values; expected one weight per value",
            )
        if weights and sum(weights) <= 0:
            problems.add((*path, "choice", "weights"), "weights sum to 0; expected a positive sum")
        return LengthDist("choice", values=values, weights=weights)
    lo, hi = params.get("min"), params.get("max")
    if lo is not None and hi is not None and lo > hi:
        problems.add((*path, kind, "min"), f"min {lo} is greater than max {hi}; expected min <= max")
    return LengthDist(kind, min=lo, max=hi, mean=params.get("mean"), std=params.get("std", params.get("sigma")))


def parse_think_time(raw: ThinkTimeDoc, path: YamlPath, problems: Problems) -> ThinkTime:
    """A think-time distribution: a duration, or one `{kind: params}` mapping with durations inside."""
    if not isinstance(raw, Mapping):
        return ThinkTime(
            "fixed", value_s=parse_duration({"think_time": raw}, "think_time", path[:-1], problems, 0.0) or 0.0
        )
    ((kind, written),) = raw.items()
    if kind == "fixed" or not isinstance(written, Mapping):
        return ThinkTime("fixed", value_s=parse_duration(raw, "fixed", path, problems, 0.0) or 0.0)
    params = written
    where = (*path, kind)
    lo = parse_duration(params, "min", where, problems, None)
    hi = parse_duration(params, "max", where, problems, None)
    if lo is not None and hi is not None and lo > hi:
        problems.add((*where, "min"), f"min {lo:g}s is greater than max {hi:g}s; expected min <= max")
    return ThinkTime(
        kind,
        min_s=lo,
        max_s=hi,
        mean_s=parse_duration(params, "mean", where, problems, None),
        sigma=params.get("sigma"),
    )


# The longest phase a playbook (or --duration/--warmup) may ask for: past these a value is a slip (1000h for 1000s)
# that would hold an engine for weeks before anyone noticed. A longer measurement is more repeats, not a longer trial.
MAX_PHASE_S = {"duration": 24 * 3600.0, "warmup": 3600.0, "cooldown": 3600.0}
_PHASE_NAME = {
    "duration": "a trial's measured window (llmplay's limit: measure longer with more repeats)",
    "warmup": "a warm-up (llmplay's limit: an engine is warm within minutes)",
    "cooldown": "a cool-down between trials (llmplay's limit)",
}


def phase_too_long(key: str, written: object, seconds: float) -> str | None:
    """Why `seconds` (written as `written`) is too long for the phase `key`; None when it is not."""
    limit = MAX_PHASE_S[key]
    if seconds <= limit:
        return None
    shown = f"{limit / 3600:g}h"
    return f"found {written} ({seconds:g} s); expected at most {shown} for {_PHASE_NAME[key]}"


def check_image_option(image: str) -> None:
    """`--image` (or a recorded override of it) held to the rule engine.image obeys: never read as a docker option."""
    if why := option_problem(image, "#/$defs/engine/properties/image"):
        raise PlaybookError(f"--image: {why}")


def parse_duration(
    section: Mapping[str, object], key: str, path: YamlPath, problems: Problems, default: float | None
) -> float | None:
    """`section[key]` in seconds, or `default` when absent or wrong (the problem is recorded)."""
    if key not in section:
        return default
    try:
        return units.parse_duration_s(section[key])
    except units.UnitError as exc:
        problems.add((*path, key), str(exc))
        return default


def parse_phase(section: Mapping[str, object], key: str, path: YamlPath, problems: Problems) -> float | None:
    """A warm-up, measured window or cool-down (`key`) in seconds, within MAX_PHASE_S; None when absent or wrong."""
    seconds = parse_duration(section, key, path, problems, None)
    if seconds is not None and (why := phase_too_long(key, section[key], seconds)):
        problems.add((*path, key), why)
        return None
    return seconds


class PromptFiles:
    """The prompt files one playbook names (dataset, probes): where they may be, and each one's rows once read."""

    def __init__(self, tree: Path | None):
        self.tree = tree  # None: anywhere (--allow-outside-tree, or a bare workload file)
        self.rows: dict[Path, tuple[DatasetRow, ...]] = {}


def prompt_file(
    written: str,
    what: str,
    base_dir: Path,
    files: PromptFiles,
    path: YamlPath,
    problems: Problems,
    expected: str = "a JSONL file",
) -> Path | None:
    """The file a playbook names, relative to it; like `extends:`, it must stay inside the playbook's directory
    tree, so a shared playbook cannot send /etc/shadow (or ../../secrets) to an engine as prompts."""
    resolved = (base_dir / os.path.expanduser(written)).resolve()
    if files.tree is not None and not resolved.is_relative_to(files.tree):
        problems.add(
            path,
            f"{what} '{written}' points outside {display_path(str(files.tree))}; expected a file inside the "
            "playbook's directory tree (pass --allow-outside-tree to permit it)",
        )
        return None
    if not resolved.exists():
        problems.add(
            path, f"{what} '{written}' not found (looked for {display_path(str(resolved))}); expected {expected}"
        )
        return None
    return resolved


def prompt_rows(file: Path, path: YamlPath, problems: Problems, files: PromptFiles) -> tuple[DatasetRow, ...]:
    """The file's rows, read (bounded) and parsed once per load; each bad line is a problem at FILE:LINE."""
    if file not in files.rows:
        try:
            files.rows[file] = read_dataset(file)
        except DatasetProblems as exc:
            problems.lines.extend(exc.lines)
            files.rows[file] = ()
        except PlaybookError as exc:
            problems.add(path, str(exc))
            files.rows[file] = ()
    return files.rows[file]


def parse_workload(
    raw: WorkloadDoc, base_dir: Path, path: YamlPath, problems: Problems, files: PromptFiles | None = None
) -> Workload:
    """The workload, with the rules the schema cannot say (one load kind, a length, a dataset that exists inside the
    playbook's tree and parses, line by line)."""
    files = files if files is not None else PromptFiles(None)
    traced = "trace" in raw  # a trace brings its own arrivals and length (playbook/trace.py checks what it owns)
    if raw.get("concurrency") is not None and raw.get("rate") is not None:
        problems.add(
            (*path, "rate"),
            "both concurrency and rate are set; expected one: concurrency (closed loop) or rate (open loop, req/s)",
        )
    if raw.get("concurrency") is None and raw.get("rate") is None and not traced:
        problems.add(path, "no load given; expected concurrency: N (closed loop) or rate: R req/s (open loop)")
    if raw.get("duration") is None and raw.get("num_requests") is None and not traced:
        problems.add(path, "no length given; expected duration: 60s or num_requests: N")
    if "arrival" in raw and raw.get("rate") is None and not traced:
        problems.add((*path, "arrival"), "arrival applies to open-loop load; expected rate: R alongside it")
    dataset = raw.get("dataset")
    if dataset is not None:
        resolved = prompt_file(dataset, "dataset", base_dir, files, (*path, "dataset"), problems)
        before = len(problems.lines)
        rows = prompt_rows(resolved, (*path, "dataset"), problems, files) if resolved is not None else None
        if rows == () and len(problems.lines) == before:
            problems.add(
                (*path, "dataset"),
                f"found no usable row in {display_path(str(resolved))}; expected at least one prompt",
            )
        dataset = str(resolved or (base_dir / dataset).resolve())
    defaults = Workload()
    workload = Workload(
        api=raw.get("api", defaults.api),
        input=parse_length(raw["input"], (*path, "input"), problems) if "input" in raw else defaults.input,
        output=parse_length(raw["output"], (*path, "output"), problems) if "output" in raw else defaults.output,
        dataset=dataset,
        prefix_tokens=raw.get("prefix_tokens", 0),
        prefix_groups=raw.get("prefix_groups", 1),
        turns=raw.get("turns", 1),
        think_time=parse_think_time(raw["think_time"], (*path, "think_time"), problems)
        if "think_time" in raw
        else defaults.think_time,
        session_header=raw.get("session_header"),
        concurrency=raw.get("concurrency"),
        rate=raw.get("rate"),
        arrival=raw.get("arrival", "poisson"),
        burst=raw.get("burst", 1),
        sweep=tuple(raw.get("sweep", ())),
        streaming_fraction=raw.get("streaming_fraction", 1.0),
        max_tokens=raw.get("max_tokens"),
        ignore_eos=raw.get("ignore_eos", True),
        temperature=raw.get("temperature", 0.0),
        seed=raw.get("seed", 0),
        warmup_s=parse_phase(raw, "warmup", path, problems) or 0.0,
        warmup_requests=raw.get("warmup_requests", 0),
        duration_s=parse_phase(raw, "duration", path, problems),
        num_requests=raw.get("num_requests"),
        request_timeout_s=parse_duration(raw, "request_timeout", path, problems, 120.0) or 120.0,
    )
    if traced:
        fpath = (*path, "trace", "file")
        file = prompt_file(
            raw["trace"]["file"], "trace", base_dir, files, fpath, problems, EXPECTED[raw["trace"]["format"]]
        )
        workload = apply_trace(workload, raw, file, path, problems)
    return workload


def parse_engine(raw: EngineDoc, base_dir: Path, path: YamlPath, problems: Problems) -> EngineSpec:
    """The engine; a secret written literally into env, extra_args or a knob is refused (a ${env:NAME} reference
    is expected)."""
    check_env(raw.get("env", {}), (*path, "env"), problems)
    check_args(raw.get("extra_args", ()), (*path, "extra_args"), problems)
    for knob, value in raw.get("args", {}).items():
        check_knob_value(value, (*path, "args", str(knob)), problems)
    env = {str(k): str(v) if not isinstance(v, bool) else str(v).lower() for k, v in raw.get("env", {}).items()}
    gpus_raw = raw.get("gpus", 0)
    gpus: int | tuple[str, ...] = tuple(str(g) for g in gpus_raw) if isinstance(gpus_raw, list) else gpus_raw
    health = raw.get("health", {})
    model_dir = raw.get("model_dir")
    if model_dir is not None:
        model_dir = str((base_dir / host_path(model_dir)).resolve())
    return EngineSpec(
        kind=raw["kind"],
        model=raw["model"],
        image=raw.get("image"),
        model_dir=model_dir,
        served_model_name=raw.get("served_model_name"),
        gpus=gpus,
        args=frozen_map(raw.get("args", {})),
        extra_args=tuple(raw.get("extra_args", ())),
        env=frozen_map(env),
        port=raw.get("port"),
        health_path=health.get("path"),
        health_timeout_s=parse_duration(health, "timeout", (*path, "health"), problems, 600.0) or 600.0,
        shm_size=raw.get("shm_size"),
        ipc_mode=raw.get("ipc"),
        network_mode=raw.get("network") if raw.get("network") == "host" else None,
        executable=raw.get("executable"),
    )


def parse_steps(raw: list[StepDoc], path: YamlPath, problems: Problems) -> tuple[Step, ...]:
    """Steps with unique names, each changing one thing (several only with bundle: true); bare keys are knobs."""
    steps, names = [], set()
    for i, item in enumerate(raw):
        spath = (*path, i)
        if item["name"] in names:
            problems.add((*spath, "name"), f"step name '{item['name']}' is used twice; expected unique names")
        names.add(item["name"])
        steps.append(parse_step(item, spath, WORKLOAD_FIELDS, problems))
    return tuple(steps)


def parse_trials(raw: TrialsDoc, problems: Problems) -> Trials:
    """Repeats and their policy, with defaults from Trials."""
    d = Trials()
    written_max = raw.get("max_repeats", d.max_repeats)
    t = Trials(
        repeats=raw.get("repeats", d.repeats),
        interleave=raw.get("interleave", d.interleave),
        sequential=raw.get("sequential", d.sequential),
        max_repeats=written_max if isinstance(written_max, int) else max(raw.get("repeats", d.repeats), d.max_repeats),
        max_repeats_auto=raw.get("max_repeats") == "auto",
        budget_s=parse_duration(raw, "budget", ("trials",), problems, 0.0) or 0.0,
        confidence=raw.get("confidence", d.confidence),
        pool_noise=raw.get("pool_noise", d.pool_noise) or raw.get("noise") in ("run", "history"),
        noise=raw.get("noise", "run" if raw.get("pool_noise") else d.noise),
        on_failure=raw.get("on_failure", d.on_failure),
        cooldown_s=parse_phase(raw, "cooldown", ("trials",), problems) or 0.0,
    )
    if raw.get("max_repeats") == "auto" and not raw.get("sequential"):
        problems.add(("trials", "max_repeats"), "max_repeats: auto without sequential: true; expected sequential: true")
    if "budget" in raw and raw.get("max_repeats") != "auto":
        problems.add(("trials", "budget"), "budget without max_repeats: auto; expected max_repeats: auto")
    if raw.get("pool_noise") and raw.get("noise") == "step":
        problems.add(("trials", "noise"), "noise: step with pool_noise: true; expected noise: run (or no pool_noise)")
    if t.max_repeats < t.repeats:
        problems.add(
            ("trials", "max_repeats"),
            f"max_repeats {t.max_repeats} < repeats {t.repeats}; expected max_repeats >= repeats",
        )
    return t


def parse_cost(raw: Mapping[str, Fraction], problems: Problems) -> Cost:
    """Hourly prices in US dollars."""
    values = {}
    for key in ("gpu_usd_per_hour", "host_usd_per_hour"):
        if key in raw:
            try:
                values[key] = units.parse_money_usd(raw[key])
            except units.UnitError as exc:
                problems.add(("cost", key), str(exc))
    return Cost(**values)


def parse_runtime(raw: str | RuntimeDoc | None, problems: Problems) -> RuntimeSpec:
    """`runtime: docker` or its mapping form; docker when absent."""
    if raw is None:
        return RuntimeSpec()
    if isinstance(raw, str):
        raw = {"kind": raw}
    kind = raw["kind"]
    if kind == "endpoint" and not raw.get("url"):
        problems.add(("runtime",), "runtime endpoint needs url: http://HOST:PORT of the running engine")
    if kind == "ray" and not raw.get("address"):
        problems.add(
            ("runtime",),
            "runtime ray needs address: the cluster's head (HOST:PORT, ray://HOST:PORT, or auto for the cluster "
            "this host has joined); or keep runtime docker and pass llmplay run --ray ADDRESS",
        )
    for key in ("address", "inner", "accelerator_type", "cpus_per_trial"):
        if key in raw and kind != "ray":
            problems.add(("runtime", key), f"{key} applies to runtime ray only; found kind {kind}")
    defaults = RuntimeSpec()
    return RuntimeSpec(
        kind=kind,
        url=raw.get("url"),
        docker_host=raw.get("docker_host"),
        address=raw.get("address"),
        inner=raw.get("inner", defaults.inner),
        accelerator_type=raw.get("accelerator_type"),
        cpus_per_trial=float(raw.get("cpus_per_trial", defaults.cpus_per_trial)),
    )
