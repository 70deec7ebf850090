"""The one shape every engine adapter has: knobs to flags, health, version, metric names."""
from __future__ import annotations

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

    def known_knobs(self) -> list[str]:
        return sorted(self.knobs)

    def check_knob(self, knob: str) -> None:
        if knob not in self.knobs:
            raise UnknownKnob(self.kind, knob, self.known_knobs())

    def command(self, spec: EngineSpec, port: int | None = None) -> list[str]:
        """Full argv inside the container (or for the process runtime)."""
        argv = self.base_command(spec, port or spec.port or self.default_port)
        for knob, value in spec.args.items():
            self.check_knob(knob)
            argv += self.knobs[knob](value)
        return argv + list(spec.extra_args)
