"""What a step kind is to the run: how a step of it is measured, decided and archived inside the step loop, and the
part of the loop it may use. The kinds are registered in tuning.kinds; the loop (tuning.steps) runs each step by
its kind and names none."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from llmplay.archive.model import StepVerdict, TrialRecord
from llmplay.playbook.step_forms import StepForm
from llmplay.spec import ChangeEffect, Config, Playbook, Step
from llmplay.stats.decide import TrialSample
from llmplay.stats.intervals import Noise
from llmplay.tuning.book import ConfigTrials, TrialBook
from llmplay.tuning.schedule import TrialScheduler


class Loop(Protocol):
    """What a step kind uses of the step loop (tuning.steps.StepLoop) that runs it."""

    playbook: Playbook
    book: TrialBook
    scheduler: TrialScheduler
    write_config: Callable[[Config], None]
    verdicts: list[StepVerdict]
    noise: dict[str, list[Noise]]

    def count(self, target: ConfigTrials, trial: TrialRecord, sample: TrialSample | None) -> None: ...

    def add_record_rows(
        self, index: int, reference: ConfigTrials, cand: ConfigTrials | None, verdict: StepVerdict
    ) -> None: ...

    def measure_candidate(
        self, index: int, step: Step, best: ConfigTrials, candidate: Config, effects: Sequence[ChangeEffect]
    ) -> ConfigTrials:
        """`candidate` against `best` in A/B pairs, decided, its verdict archived; the configuration carried on."""
        ...


class StepKind(Protocol):
    """One kind of step: how the playbook reads it (its form, with its YAML key and schema entry) and how it runs."""

    @property
    def form(self) -> StepForm: ...

    def run(self, loop: Loop, index: int, step: Step, best: ConfigTrials) -> ConfigTrials:
        """Measure step `index` against `best` (the configuration so far) and archive its verdict; return the
        configuration carried to the next step. A stop (StopRun, an interrupt) propagates after the kind has
        archived what it must; --resume runs the step again, its archived trials read back, not measured."""
        ...
