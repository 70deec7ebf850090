"""The playbook's `tune:` section -> TuneSpec: the budget, the allow/deny names (engine knobs or checklist remedies)
and per-knob values, each checked against the engine's adapter with the line it is on."""

from __future__ import annotations

from llmplay import units
from llmplay.engines import get_engine
from llmplay.engines.base import BadKnobValue, Engine
from llmplay.engines.knobs import Remedy
from llmplay.errors import PlaybookError
from llmplay.playbook.document import TuneDoc
from llmplay.playbook.problems import Problems, did_you_mean, short_repr
from llmplay.spec import Scalar, TuneSpec, frozen_map

# A weight-quantization step on an engine whose weights are a file (llama.cpp's GGUF) changes the model itself.
MODEL_TARGET = "model"
REMEDIES = tuple(r.value for r in Remedy)


def parse_tune(raw: TuneDoc, engine_kind: str | None, problems: Problems) -> TuneSpec:
    """The `tune:` section (the schema has checked its shape); names and values against the engine's adapter."""
    budget = raw.get("budget", {})
    engine_s: float | None = None
    if "engine_time" in budget:
        try:
            engine_s = units.parse_duration_s(budget["engine_time"])
        except units.UnitError as exc:
            problems.add(("tune", "budget", "engine_time"), str(exc))
    try:
        engine: Engine | None = get_engine(str(engine_kind))
    except PlaybookError:
        engine = None  # engine.kind says why, once
    names: dict[str, tuple[str, ...]] = {}
    for key, listed in (("allow", raw.get("allow", [])), ("deny", raw.get("deny", []))):
        names[key] = tuple(listed)
        for i, name in enumerate(names[key]):
            _check_name(engine, name, ("tune", key, i), problems)
    overlap = sorted(set(names["allow"]) & set(names["deny"]))
    if overlap:
        problems.add(("tune", "deny"), f"{', '.join(overlap)} both allowed and denied; expected each name in one list")
    values: dict[str, tuple[Scalar, ...]] = {}
    for knob, scalars in dict(raw.get("values", {})).items():
        values[knob] = tuple(scalars)
        _check_values(engine, knob, values[knob], problems)
    return TuneSpec(
        engine_budget_s=engine_s,
        max_steps=budget.get("steps"),
        allow=names["allow"],
        deny=names["deny"],
        values=frozen_map(values),
        retry_rejected=bool(raw.get("retry_rejected", False)),
        race=int(raw.get("race", 1)),
    )


def _check_name(engine: Engine | None, name: str, path: tuple[str | int, ...], problems: Problems) -> None:
    if engine is None or name in REMEDIES or name in engine.knobs or name == MODEL_TARGET:
        return
    choices = [*REMEDIES, *engine.known_knobs()]
    problems.add(
        path,
        f"found {name!r}{did_you_mean(name, choices)}; expected a checklist remedy ({', '.join(REMEDIES)}) or a "
        f"knob of engine '{engine.kind}' ({', '.join(engine.known_knobs())})",
    )


def _check_values(engine: Engine | None, knob: str, values: tuple[Scalar, ...], problems: Problems) -> None:
    if engine is None or knob == MODEL_TARGET:
        return
    if knob not in engine.knobs:
        problems.add(
            ("tune", "values", knob),
            f"engine '{engine.kind}' has no knob {knob!r}{did_you_mean(knob, engine.known_knobs())}; "
            f"known knobs: {', '.join(engine.known_knobs())}",
        )
        return
    for i, value in enumerate(values):
        try:
            engine.check_value(knob, value)
        except BadKnobValue as exc:
            problems.add(("tune", "values", knob, i), f"found {short_repr(value)}; expected {exc.expected}")
