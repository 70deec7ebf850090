"""The one shape every engine adapter has: knobs to flags, health, version, metric names."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from llmplay.engines.knobs import KnobSpec, Remedy
from llmplay.spec import EngineSpec, Scalar


class UnknownKnob(ValueError):
    """A knob the engine's adapter does not know."""

    def __init__(self, engine: str, knob: str, known: list[str]):
        self.engine, self.knob, self.known = engine, knob, known
        super().__init__(f"engine '{engine}' has no knob '{knob}'; known knobs: {', '.join(known)}")


class BadKnobValue(ValueError):
    """A value the engine would refuse (or misread) for this knob; `expected` names what it accepts."""

    def __init__(self, engine: str, knob: str, value: Scalar, expected: str):
        self.engine, self.knob, self.value, self.expected = engine, knob, value, expected
        super().__init__(f"engine '{engine}' knob '{knob}': found {value!r}, expected {expected}")


class RefusedValue(ValueError):
    """Raised by a knob renderer; the Engine turns it into a BadKnobValue naming itself and the knob."""

    def __init__(self, expected: str):
        self.expected = expected
        super().__init__(f"expected {expected}")


# Image label carrying the engine's own release, set on every image llmplay builds (official images may
# carry org.opencontainers.image.version instead).
VERSION_LABEL = "llmplay.engine.version"
IMAGE_VERSION_LABELS = (VERSION_LABEL, "org.opencontainers.image.version")


def version_key(version: str) -> tuple[int, ...]:
    """`0.32.0`, `v0.10.1.post2`, `0.9.0rc1` -> (0, 32, 0): the release numbers, enough to order engine releases."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(part) for part in m.group(1).split(".")) if m else ()


# A knob renders its value to a list of CLI flags (empty list: engine default), or raises RefusedValue.
KnobRenderer = Callable[[Scalar], list[str]]
# Passes a value the engine accepts; raises RefusedValue naming what it accepts otherwise.
ValueCheck = Callable[[Scalar], None]


@dataclass(frozen=True)
class ContextLimit:
    """What one request may hold, and the knobs that say so (for the message)."""

    tokens: int
    because: str  # e.g. "max_model_len 2048", "ctx_size 4096 over 4 slots"


def max_model_len(args: Mapping[str, Scalar]) -> ContextLimit | None:
    """The engine-neutral `max_model_len` knob, where the engine maps it to its per-request context."""
    value = args.get("max_model_len")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return ContextLimit(value, f"max_model_len {value}")
    return None


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
class VersionRange:
    """What changes from `since` (inclusive) up to `until` (exclusive): knobs renamed, metrics renamed."""

    since: str | None = None
    until: str | None = None
    knobs: Mapping[str, KnobRenderer] = field(default_factory=dict)
    metric_names: MetricNames | None = None
    note: str = ""  # what changed, for the preflight's report

    def covers(self, version: str) -> bool:
        key = version_key(version)
        if not key:
            return False
        return (self.since is None or key >= version_key(self.since)) and (
            self.until is None or key < version_key(self.until)
        )


@dataclass(frozen=True)
class Engine:
    """One engine's adapter: its image and port, its knobs (name -> renderer), and how to start and probe it."""

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
    # Arguments after the entrypoint that make the server print every flag it accepts and exit.
    help_args: tuple[str, ...] = ("--help",)
    # Releases whose flags or metric names differ from the ones above (which are the current release's).
    versions: tuple[VersionRange, ...] = ()
    version: str | None = None  # the release this adapter was specialised to by at(), None: the current one
    # The most tokens (prompt and output) one request may hold under these knobs, None when the knobs do not say
    # (the model's own limit applies); the loader checks the workload's longest request against it.
    context_tokens: Callable[[Mapping[str, Scalar]], ContextLimit | None] = field(default=lambda _args: None)
    # Which knob implements which checklist remedy (engines.knobs), in order of preference within a remedy.
    knob_map: tuple[KnobSpec, ...] = ()
    # Remedies always in effect on this engine, with no knob to turn (vLLM V1's continuous batching).
    built_in: frozenset[Remedy] = frozenset()
    # The engine reserves its KV pool up front (this share of GPU memory unless gpu_memory_utilization says),
    # so a ~90% memory peak is by design, not pressure; None: it allocates as it goes.
    kv_preallocated_frac: float | None = None
    # The model lives in the CPU image llmplay builds (its GGUF is in the host's cache too, for the diagnosis).
    model_in_cpu_image: bool = False

    def at(self, version: str | None) -> Engine:
        """This adapter with the flag and metric names of `version` (unknown or None: the current release's)."""
        if not version:
            return self
        knobs, names = dict(self.knobs), self.metric_names
        for rng in self.versions:
            if rng.covers(version):
                knobs.update(rng.knobs)
                names = rng.metric_names or names
        return replace(self, knobs=knobs, metric_names=names, version=version)

    def known_knobs(self) -> list[str]:
        return sorted(self.knobs)

    def check_knob(self, knob: str) -> None:
        if knob not in self.knobs:
            raise UnknownKnob(self.kind, knob, self.known_knobs())

    def render_knob(self, knob: str, value: Scalar) -> list[str]:
        """The flags for one knob; UnknownKnob or BadKnobValue when the engine would not take them."""
        self.check_knob(knob)
        try:
            return self.knobs[knob](value)
        except RefusedValue as exc:
            raise BadKnobValue(self.kind, knob, value, exc.expected) from None

    def check_value(self, knob: str, value: Scalar) -> None:
        """Raises BadKnobValue when the engine would refuse `value`, so the loader refuses it up front."""
        self.render_knob(knob, value)

    def server_args(self, spec: EngineSpec, port: int | None = None) -> list[str]:
        """The server's flags: model/port/host, then each knob in playbook order, then extra_args."""
        argv = self.base_command(spec, port or spec.port or self.default_port)
        for knob, value in spec.args.items():
            argv += self.render_knob(knob, value)
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


def _text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def any_value(value: Scalar) -> None:
    """A single value of whatever kind: knobs whose accepted words change with each engine release (vLLM's quantization)."""
    if not isinstance(value, str | int | float):  # a step's `set:` may hold a list or mapping
        raise RefusedValue("a single value (text or a number)")


def integer(minimum: int | None = None, *, auto: int | None = None) -> ValueCheck:
    """Only whole numbers (a YAML `4.0` or `"4"` is refused), at least `minimum` when given; `auto` is the one
    value below it the engine reads as "choose for me" (llama.cpp's -1 slots or threads)."""
    expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    if auto is not None:
        expected += f", or {auto} for the engine's automatic choice"

    def check(value: Scalar) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise RefusedValue(expected)
        if minimum is not None and value < minimum and value != auto:
            raise RefusedValue(expected)

    return check


def fraction(value: Scalar) -> None:
    """A share of memory: a number above 0 and at most 1."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise RefusedValue("a number > 0 and <= 1")


def one_of(*choices: str) -> ValueCheck:
    """One of a fixed set of words, compared exactly as the engine's argument parser does."""
    expected = "one of " + ", ".join(choices)

    def check(value: Scalar) -> None:
        if not isinstance(value, str) or value not in choices:
            raise RefusedValue(expected)

    return check


def flag_with_value(flag: str, accepts: ValueCheck = any_value) -> KnobRenderer:
    """`flag VALUE` once `accepts` passes the value; None leaves the engine default."""

    def render(value: Scalar) -> list[str]:
        if value is None:
            return []
        accepts(value)
        return [flag, _text(value)]

    return render


def boolean_flag(on: list[str], off: list[str]) -> KnobRenderer:
    """A boolean knob: True renders `on`, False renders `off`, None the engine default."""

    def render(value: Scalar) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, bool):
            raise RefusedValue("true or false")
        return list(on if value else off)

    return render
