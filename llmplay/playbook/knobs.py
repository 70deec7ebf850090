"""Knob names and values checked against the engine adapter while the playbook loads, with the line they are on."""

from __future__ import annotations

from collections.abc import Iterator

from llmplay.engines import get_engine
from llmplay.engines.base import BadKnobValue, Engine
from llmplay.errors import PlaybookError
from llmplay.files import display_path
from llmplay.playbook.problems import Problems, did_you_mean, short_repr
from llmplay.playbook.source import SourceMap, YamlPath, format_path
from llmplay.playbook.step_forms import form_of
from llmplay.spec import Change, Config, Playbook, Scalar, apply_step, show_value


def check_knobs(playbook: Playbook, sources: SourceMap) -> None:
    """Every knob under engine.args and steps[i].set is one the engine has, with a value it accepts."""
    problems = Problems(sources, display_path(playbook.path))
    try:
        engine = get_engine(playbook.engine.kind)
    except PlaybookError as exc:
        problems.add(("engine", "kind"), str(exc))
        problems.raise_if_any()
        raise
    known = engine.known_knobs()
    knobs = list(_knobs_written(playbook, sources))
    for path, knob, _ in knobs:
        if knob not in engine.knobs:
            problems.add(
                path,
                f"engine '{engine.kind}' has no knob '{knob}'{did_you_mean(knob, known)}; "
                f"known knobs: {', '.join(known)}",
            )
    if playbook.runtime.kind == "endpoint":
        for i, step in enumerate(playbook.steps):
            for change in step.changes:
                if not change.target.startswith("workload."):
                    problems.add(
                        ("steps", i, "set"),
                        f"step '{step.name}' changes {change.target}, but runtime "
                        "endpoint cannot restart the engine; expected only workload.* "
                        "steps, or runtime docker/process",
                    )
    problems.raise_if_any()
    for path, knob, value in knobs:
        _check_value(engine, knob, value, path, problems)
    problems.raise_if_any()
    _check_steps_change_something(playbook, problems)
    problems.raise_if_any()


def _knobs_written(playbook: Playbook, sources: SourceMap) -> Iterator[tuple[YamlPath, str, Scalar]]:
    """(YAML path, knob, value) for engine.args, then for each step's `set:` entries that name an engine knob."""
    for knob, value in playbook.engine.args.items():
        yield ("engine", "args", knob), knob, value
    for i, step in enumerate(playbook.steps):
        for change in step.changes:
            if change.target.startswith("args."):
                yield _step_path(i, change, sources), change.target.removeprefix("args."), change.knob_value
        yield from form_of(step).knobs(i, step, sources)


def _step_path(index: int, change: Change, sources: SourceMap) -> YamlPath:
    # A step may write `flash_attn: true` or `args.flash_attn: true`; point at the key as written.
    knob = change.target.removeprefix("args.")
    written = knob if ("steps", index, "set", knob) in sources.entries else change.target
    return ("steps", index, "set", written)


def _check_value(engine: Engine, knob: str, value: Scalar, path: YamlPath, problems: Problems) -> None:
    try:
        engine.check_value(knob, value)
    except BadKnobValue as exc:
        problems.add(path, f"found {short_repr(value)}; expected {exc.expected} (engine '{engine.kind}' knob '{knob}')")


def _check_steps_change_something(playbook: Playbook, problems: Problems) -> None:
    # A step that sets what is already in effect measures nothing.
    config = Config("baseline", playbook.engine, playbook.workload)
    for i, step in enumerate(playbook.steps):
        new_config, effects = apply_step(config, step)
        for effect in effects:
            if effect.old == effect.new:
                problems.add(
                    ("steps", i, "set"),
                    f"step '{step.name}' sets {effect.target} to {show_value(effect.new)}, "
                    "which is already in effect; expected a change",
                )
        config = new_config


def knob_sites(playbook: Playbook, sources: SourceMap) -> dict[str, str]:
    """`FILE:LINE` of the engine block, its args, env, extra_args and image, and of every step and its `set:` keys."""
    paths: list[YamlPath] = [("engine",), ("engine", "image"), ("engine", "args"), ("engine", "extra_args")]
    paths += [("engine", "args", knob) for knob in playbook.engine.args]
    paths += [("engine", "env", name) for name in playbook.engine.env]
    paths += [("engine", "extra_args", i) for i in range(len(playbook.engine.extra_args))]
    for i, step in enumerate(playbook.steps):
        paths.append(("steps", i))
        paths += [_step_path(i, change, sources) for change in step.changes]
    sites = {}
    for path in paths:
        where = sources.locate(path)
        if where.file != "?":
            sites[format_path(path)] = f"{display_path(where.file)}:{where.line}"
    return sites
