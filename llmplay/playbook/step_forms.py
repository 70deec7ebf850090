"""The step kinds as the playbook reads them: each kind's YAML key, its schema entry, its parsing and the knob values
it asks the engine to check, in one registry. The loader, the schema check and the knob checks ask the registry and
name no kind; a kind registered by tuning.step_kinds.register_step_kind is read like the built-in `set:` and
`search:`.

A step is written with exactly one kind's key. With several, the kind registered last parses it and says what is
wrong (a search refuses a `set:` beside it), so a refusal names the kind the step reads as.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Protocol

from llmplay.playbook.problems import Problems
from llmplay.playbook.search import SEARCH_FORM
from llmplay.playbook.set_step import SET_FORM
from llmplay.playbook.source import SourceMap, YamlPath
from llmplay.spec import Scalar, Step


class StepForm(Protocol):
    """One step kind as the playbook reads it."""

    @property
    def key(self) -> str:
        """The YAML key a step of this kind is written with, and the kind's name (spec.StepChoice.kind)."""
        ...

    @property
    def schema(self) -> Mapping[str, object]:
        """JSON Schema of the step properties the kind adds to playbook.v1.json's (empty for the built-in kinds,
        whose entries ship in that file)."""
        ...

    def parse(
        self, item: Mapping[str, object], path: YamlPath, workload_fields: Collection[str], problems: Problems
    ) -> Step: ...

    def knobs(self, index: int, step: Step, sources: SourceMap) -> Iterator[tuple[YamlPath, str, Scalar]]:
        """(YAML path, knob, value) of every engine knob value the kind may try beyond the step's `changes`."""
        ...


_FORMS: dict[str, StepForm] = {form.key: form for form in (SET_FORM, SEARCH_FORM)}


def register_step_form(form: StepForm) -> None:
    """Make a kind readable; registering the same form again changes nothing, another form under a taken key is a
    bug."""
    taken = _FORMS.get(form.key)
    if taken is not None and taken is not form:
        raise ValueError(f"step kind '{form.key}' is registered already")
    _FORMS[form.key] = form


def unregister_step_form(key: str) -> None:
    """Forget a registered kind (a test's own kind, after the test); the built-in kinds stay."""
    if _FORMS.get(key) not in (SET_FORM, SEARCH_FORM):
        _FORMS.pop(key, None)


def form_of(step: Step) -> StepForm:
    return _FORMS[step.choice.kind]


def step_properties() -> dict[str, object]:
    """The step properties registered kinds add to the shipped schema."""
    return {name: rule for form in _FORMS.values() for name, rule in form.schema.items()}


def parse_step(
    item: Mapping[str, object], path: YamlPath, workload_fields: Collection[str], problems: Problems
) -> Step:
    """A step by the kind whose key it is written with; one written with none is refused."""
    present = [form for form in _FORMS.values() if form.key in item]
    if present:
        return present[-1].parse(item, path, workload_fields, problems)
    keys = [f"{key}:" for key in _FORMS]
    named = f"{', '.join(keys[:-1])} nor {keys[-1]}"
    problems.add(path, f"the step has neither {named}; expected one, e.g. set: {{prefix_caching: true}}")
    return Step(name=str(item["name"]), changes=(), line=problems.sources.locate(path).line)
