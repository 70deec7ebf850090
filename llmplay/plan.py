"""From a playbook to concrete configurations: the baseline, and each step applied to a configuration."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from llmplay.engines import get_engine
from llmplay.engines.base import Engine
from llmplay.spec import ChangeEffect, Config, EngineSpec, Playbook, Step, apply_step


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
    """One shell line; arguments already quoted for display (`"device=0,1"`) stay as they are."""
    return " ".join(a if a.startswith('"') else shlex.quote(a) for a in argv)
