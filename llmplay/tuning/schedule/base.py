"""The TrialScheduler seam: what the step loop asks of a scheduler, and what a scheduler hands back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from llmplay.archive.model import TrialRecord
from llmplay.archive.run_facts import RunEnvironment
from llmplay.spec import Config
from llmplay.stats.decide import TrialSample
from llmplay.tuning.book import TrialBook, TrialSlot
from llmplay.tuning.trial import MeasureTrial

Take = Callable[[TrialSlot, TrialRecord, TrialSample | None], None]


class MeasurementCrashed(Exception):
    """An unexpected exception from inside one trial's measurement, told apart from a bug after it: nothing of
    that trial is on disk, so resuming would hit it again."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


class TrialScheduler(Protocol):
    def join(self) -> None:
        """Before any archive is made: reach the machines, and refuse configurations none of them can host."""

    def environment(self, here: RunEnvironment) -> RunEnvironment:
        """The archive header with where the trials run (`here` as it is: this machine, already described)."""

    def begin(self, book: TrialBook, measure: MeasureTrial, *, resumed: bool) -> None:
        """The archive exists: trials are written through `book`, each measured by `measure`."""

    def run(self, groups: Sequence[Sequence[TrialSlot]], take: Take) -> None:
        """Measure every group (each group's trials on one machine, one after the other) and hand each trial to
        `take` (a trial an earlier attempt archived comes back without being measured again)."""

    def batch(self, configs: Sequence[Config]) -> int:
        """How many pairs of these configurations are worth measuring at once before the next look."""

    def close(self) -> None: ...
