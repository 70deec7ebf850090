"""Knob names and values checked against the engine adapter while the playbook loads, with the step's line."""
from __future__ import annotations

from llmplay.engines import get_engine
from llmplay.engines.base import BadKnobValue, Engine
from llmplay.errors import PlaybookError
from llmplay.playbook.problems import Problems, did_you_mean
from llmplay.playbook.source import SourceMap, YamlPath, display_path
from llmplay.spec import Config, Playbook, Scalar, apply_step, show_value


def check_knobs(playbook: Playbook, sources: SourceMap | None = None) -> None:
    """Knob names and values are checked against the engine adapter; messages carry the step's line."""
    problems = Problems(sources or SourceMap(), display_path(playbook.path))
    try:
        engine = get_engine(playbook.engine.kind)
    except PlaybookError as exc:
        problems.add(("engine", "kind"), str(exc))
        problems.raise_if_any()
        raise
    known = engine.known_knobs()
    for knob in playbook.engine.args:
        if knob not in engine.knobs:
            problems.add(("engine", "args", knob), f"engine '{engine.kind}' has no knob '{knob}'{did_you_mean(knob, known)}; "
                                                   f"known knobs: {', '.join(known)}")
    for i, step in enumerate(playbook.steps):
        for change in step.changes:
            key = change.target[5:] if change.target.startswith("args.") else None
            if key is not None and key not in engine.knobs:
                written = key if ("steps", i, "set", key) in problems.sources.entries else change.target
                problems.add(("steps", i, "set", written),
                             f"engine '{engine.kind}' has no knob '{key}'{did_you_mean(key, known)}; known knobs: {', '.join(known)}")
            if playbook.runtime.kind == "endpoint" and not change.target.startswith("workload."):
                problems.add(("steps", i, "set"), f"step '{step.name}' changes {change.target}, but runtime endpoint "
                                                  "cannot restart the engine; expected only workload.* steps, or runtime docker/process")
    problems.raise_if_any()
    for knob, value in playbook.engine.args.items():
        _check_value(engine, knob, value, ("engine", "args", knob), problems)
    for i, step in enumerate(playbook.steps):
        for change in step.changes:
            if change.target.startswith("args."):
                key = change.target[5:]
                written = key if ("steps", i, "set", key) in problems.sources.entries else change.target
                _check_value(engine, key, change.value, ("steps", i, "set", written), problems)
    problems.raise_if_any()
    # A step that sets what is already in effect measures nothing.
    config = Config("baseline", playbook.engine, playbook.workload)
    for i, step in enumerate(playbook.steps):
        new_config, effects = apply_step(config, step)
        for effect in effects:
            if effect.old == effect.new:
                problems.add(("steps", i, "set"), f"step '{step.name}' sets {effect.target} to {show_value(effect.new)}, "
                                                  "which is already in effect; expected a change")
        config = new_config
    problems.raise_if_any()


def _check_value(engine: Engine, knob: str, value: Scalar, path: YamlPath, problems: Problems) -> None:
    try:
        engine.check_value(knob, value)
    except BadKnobValue as exc:
        problems.add(path, f"found {value!r}; expected {exc.expected} (engine '{engine.kind}' knob '{knob}')")
