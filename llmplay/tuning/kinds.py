"""The registry of step kinds the run knows: a fixed change (`set:`) and a value search (`search:`) built in, more
registered by register_step_kind. A new kind is one module: its spec.StepChoice (what the plan and the checks read),
its playbook.step_forms.StepForm (YAML key, schema entry, parsing, knob values) and its step_kind.StepKind (the run),
registered here, which registers its form with the playbook's reader too."""

from __future__ import annotations

from llmplay.errors import LlmplayError
from llmplay.playbook.set_step import SET_FORM
from llmplay.playbook.step_forms import StepForm, register_step_form, unregister_step_form
from llmplay.spec import Step, apply_step
from llmplay.tuning.book import ConfigTrials
from llmplay.tuning.search_step import SEARCH_KIND
from llmplay.tuning.step_kind import Loop, StepKind


class FixedKind:
    """`set:`: the step's changes applied to the configuration so far are its candidate."""

    @property
    def form(self) -> StepForm:
        return SET_FORM

    def run(self, loop: Loop, index: int, step: Step, best: ConfigTrials) -> ConfigTrials:
        candidate, effects = apply_step(best.config, step)
        return loop.measure_candidate(index, step, best, candidate, effects)


FIXED_KIND = FixedKind()
_BUILT_IN: tuple[StepKind, ...] = (FIXED_KIND, SEARCH_KIND)
_KINDS: dict[str, StepKind] = {kind.form.key: kind for kind in _BUILT_IN}


def register_step_kind(kind: StepKind) -> None:
    """Make a kind readable in playbooks and runnable; registering the same kind again changes nothing."""
    taken = _KINDS.get(kind.form.key)
    if taken is not None and taken is not kind:
        raise ValueError(f"step kind '{kind.form.key}' is registered already")
    register_step_form(kind.form)
    _KINDS[kind.form.key] = kind


def unregister_step_kind(key: str) -> None:
    """Forget a registered kind (a test's own, after the test); the built-in kinds stay."""
    if all(kind.form.key != key for kind in _BUILT_IN):
        _KINDS.pop(key, None)
        unregister_step_form(key)


def kind_of(step: Step) -> StepKind:
    try:
        return _KINDS[step.choice.kind]
    except KeyError:
        raise LlmplayError(
            f"step '{step.name}' is of kind '{step.choice.kind}', which no module registered to run"
        ) from None
