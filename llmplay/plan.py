"""From a playbook to concrete configurations: the baseline, and each step applied to a configuration."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any

from llmplay.engines import get_engine
from llmplay.engines.base import Engine
from llmplay.errors import PlaybookError
from llmplay.spec import Change, EngineSpec, Playbook, Step, Workload, frozen_map


@dataclass(frozen=True)
class Config:
    """One thing to measure: an engine configuration under a workload."""

    label: str  # "baseline" or the step name that produced it
    engine: EngineSpec
    workload: Workload


@dataclass(frozen=True)
class ChangeEffect:
    target: str
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.target}: {_show(self.old)} -> {_show(self.new)}"


@dataclass(frozen=True)
class PlannedStep:
    index: int  # 1-based
    step: Step
    effects: tuple[ChangeEffect, ...]
    # The configuration if every earlier step were kept; the runner re-applies to the real best.
    cumulative: Config


@dataclass(frozen=True)
class Plan:
    playbook: Playbook
    engine: Engine
    baseline: Config
    steps: tuple[PlannedStep, ...]


def _show(value: Any) -> str:
    return "(engine default)" if value is None else repr(value)


def current_value(config: Config, target: str) -> Any:
    if target.startswith("args."):
        return config.engine.args.get(target[5:])
    if target.startswith("env."):
        return config.engine.env.get(target[4:])
    if target.startswith("workload."):
        return getattr(config.workload, target[9:])
    return getattr(config.engine, target)


def apply_change(config: Config, change: Change) -> Config:
    engine, workload, target = config.engine, config.workload, change.target
    if target.startswith("args."):
        engine = engine.with_knob(target[5:], change.value)
    elif target.startswith("env."):
        env = dict(engine.env)
        env[target[4:]] = str(change.value)
        engine = replace(engine, env=frozen_map(env))
    elif target.startswith("workload."):
        workload = replace(workload, **{target[9:]: change.value})
    elif target == "gpus":
        engine = replace(engine, gpus=tuple(map(str, change.value)) if isinstance(change.value, list) else change.value)
    elif target == "extra_args":
        engine = replace(engine, extra_args=tuple(map(str, change.value)))
    else:
        engine = replace(engine, **{target: change.value})
    return Config(config.label, engine, workload)


def apply_step(config: Config, step: Step) -> tuple[Config, tuple[ChangeEffect, ...]]:
    """A new configuration; `config` is left as it was."""
    effects = []
    for change in step.changes:
        effects.append(ChangeEffect(change.target, current_value(config, change.target), change.value))
        config = apply_change(config, change)
    return Config(step.name, config.engine, config.workload), tuple(effects)


def check_playbook_knobs(playbook: Playbook, sources: Any = None) -> None:
    """Knob names are checked against the engine adapter; messages carry the step's line."""
    from llmplay.playbook import Problems, SourceMap, _hint, _display

    problems = Problems(sources or SourceMap(), _display(playbook.path))
    try:
        engine = get_engine(playbook.engine.kind)
    except PlaybookError as exc:
        problems.add(("engine", "kind"), str(exc))
        problems.raise_if_any()
        raise
    known = engine.known_knobs()
    for knob in playbook.engine.args:
        if knob not in engine.knobs:
            problems.add(("engine", "args", knob), f"engine '{engine.kind}' has no knob '{knob}'{_hint(knob, known)}; "
                                                   f"known knobs: {', '.join(known)}")
    for i, step in enumerate(playbook.steps):
        for change in step.changes:
            key = change.target[5:] if change.target.startswith("args.") else None
            if key is not None and key not in engine.knobs:
                written = key if ("steps", i, "set", key) in problems.sources.entries else change.target
                problems.add(("steps", i, "set", written),
                             f"engine '{engine.kind}' has no knob '{key}'{_hint(key, known)}; known knobs: {', '.join(known)}")
            if playbook.runtime.kind == "endpoint" and not change.target.startswith("workload."):
                problems.add(("steps", i, "set"), f"step '{step.name}' changes {change.target}, but runtime endpoint "
                                                  "cannot restart the engine; expected only workload.* steps, or runtime docker/process")
    problems.raise_if_any()
    # A step that sets what is already in effect measures nothing.
    config = Config("baseline", playbook.engine, playbook.workload)
    for i, step in enumerate(playbook.steps):
        new_config, effects = apply_step(config, step)
        for effect in effects:
            if effect.old == effect.new:
                problems.add(("steps", i, "set"), f"step '{step.name}' sets {effect.target} to {_show(effect.new)}, "
                                                  "which is already in effect; expected a change")
        config = new_config
    problems.raise_if_any()


def build_plan(playbook: Playbook) -> Plan:
    engine = get_engine(playbook.engine.kind)
    baseline = Config("baseline", playbook.engine, playbook.workload)
    steps, config = [], baseline
    for index, step in enumerate(playbook.steps, start=1):
        config, effects = apply_step(config, step)
        steps.append(PlannedStep(index, step, effects, config))
    return Plan(playbook, engine, baseline, tuple(steps))


def image_of(spec: EngineSpec, engine: Engine) -> str:
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
        argv += ["--gpus", f"\"device={','.join(spec.gpus)}\""]
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
    return argv + [image_of(spec, engine)] + engine.command(spec, port)


def format_argv(argv: list[str]) -> str:
    return " ".join(a if a.startswith('"') else shlex.quote(a) for a in argv)
