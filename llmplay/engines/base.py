"""The one shape every engine adapter has: knobs to flags, health, version, metric names."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable, Mapping

from llmplay.spec import EngineSpec, Scalar


class UnknownKnob(ValueError):
    def __init__(self, engine: str, knob: str, known: list[str]):
        self.engine, self.knob, self.known = engine, knob, known
        super().__init__(f"engine '{engine}' has no knob '{knob}'; known knobs: {', '.join(known)}")


# A knob renders its value to a list of CLI flags (empty list: engine default).
KnobRenderer = Callable[[Scalar], list[str]]


@dataclass(frozen=True)
class MetricNames:
    """Prometheus metric names an engine exposes on /metrics (None: not exposed)."""

    kv_cache_usage: str | None = None  # fraction 0..1
    running: str | None = None
    waiting: str | None = None
    preemptions: str | None = None  # counter
    prefix_cache_hits: str | None = None  # counter (tokens or queries)
    prefix_cache_queries: str | None = None
    prompt_tokens: str | None = None
    generation_tokens: str | None = None


@dataclass(frozen=True)
class Engine:
    kind: str
    default_image: str
    default_port: int
    health_path: str
    version_path: str | None  # HTTP path whose JSON tells the version, if any
    knobs: Mapping[str, KnobRenderer]
    base_command: Callable[[EngineSpec, int], list[str]]  # model/port/host flags
    metric_names: MetricNames = field(default_factory=MetricNames)
    model_path_in_container: str = "/models"
    # Program run before the flags when the image's own ENTRYPOINT does not start the server
    # (SGLang's and TensorRT-LLM's images); empty when it does (vLLM, TGI, the llama.cpp images).
    entrypoint: tuple[str, ...] = ()
    # What the process runtime runs when the playbook names no `executable`.
    default_executable: tuple[str, ...] = ()
    version_field: str = "version"  # key of the version in version_path's JSON
    # Regex whose group 1 is the version, searched in the engine's log when no API tells it.
    version_log_pattern: str | None = None

    def known_knobs(self) -> list[str]:
        return sorted(self.knobs)

    def check_knob(self, knob: str) -> None:
        if knob not in self.knobs:
            raise UnknownKnob(self.kind, knob, self.known_knobs())

    def check_value(self, knob: str, value: Scalar) -> None:
        """Raises BadKnobValue when the adapter cannot render `value`, so the loader refuses it up front."""
        self.check_knob(knob)
        self.knobs[knob](value)

    def server_args(self, spec: EngineSpec, port: int | None = None) -> list[str]:
        """The server's flags: model/port/host, then each knob in playbook order, then extra_args."""
        argv = self.base_command(spec, port or spec.port or self.default_port)
        for knob, value in spec.args.items():
            self.check_knob(knob)
            argv += self.knobs[knob](value)
        return argv + list(spec.extra_args)

    def command(self, spec: EngineSpec, port: int | None = None) -> list[str]:
        """Full argv after the image name in `docker run` (entrypoint, if the image needs one, then flags)."""
        return list(self.entrypoint) + self.server_args(spec, port)

    def process_argv(self, spec: EngineSpec, port: int | None = None) -> list[str]:
        """argv for the process runtime: the playbook's executable (or the engine's usual program), then flags."""
        program = shlex.split(spec.executable) if spec.executable else list(self.default_executable or self.entrypoint)
        return program + self.server_args(spec, port)

    def served_model(self, spec: EngineSpec) -> str:
        """The model name clients put in requests."""
        return spec.served_model_name or spec.model


class BadKnobValue(ValueError):
    def __init__(self, engine: str, knob: str, value: Scalar, expected: str):
        self.engine, self.knob, self.value, self.expected = engine, knob, value, expected
        super().__init__(f"engine '{engine}' knob '{knob}': found {value!r}, expected {expected}")


def _text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def valued(flag: str) -> KnobRenderer:
    """`flag VALUE`; None leaves the engine default."""

    def render(value: Scalar) -> list[str]:
        return [] if value is None else [flag, _text(value)]

    return render


def switch(engine: str, knob: str, on: list[str], off: list[str]) -> KnobRenderer:
    """A boolean knob: True renders `on`, False renders `off`, None the engine default."""

    def render(value: Scalar) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, bool):
            raise BadKnobValue(engine, knob, value, "true or false")
        return list(on if value else off)

    return render
