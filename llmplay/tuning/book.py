"""The run's trials on disk: the ids handed out, the trials an earlier attempt archived (what --resume skips),
and each new trial archived before anything reads it, then shown. Every scheduler writes through it."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmplay.archive.model import TRIAL_INTERRUPTED, TRIAL_OK, TrialRecord
from llmplay.archive.writer import RunArchive
from llmplay.spec import Config, Playbook
from llmplay.tuning.decide import TrialSample
from llmplay.tuning.progress import Narrator, describe_trial
from llmplay.tuning.signals import SignalGuard, TrialInterrupted
from llmplay.tuning.trial import TrialResult, trial_sample


@dataclass(frozen=True)
class TrialSlot:
    """One trial the step loop asks for: which configuration, and its key (step, role, repeat)."""

    config: Config
    step: str | None
    role: str
    repeat: int

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.step or "", self.role, self.repeat)


@dataclass
class TrialBook:
    """One run's trials: read back on --resume, numbered, archived, shown; one per run, shared by its scheduler."""

    archive: RunArchive
    playbook: Playbook
    narrator: Narrator
    signals: SignalGuard | None = None
    done: dict[tuple[str, str, int], TrialRecord] = field(default_factory=dict)  # archived by an earlier attempt
    counter: int = 0
    began: bool = False  # a trial was handed to its measurement (an engine may have started)

    def read_earlier(self) -> int:
        """The trials an earlier attempt of this run archived; how many count as done. An interrupted trial is
        measured again, and so is a pair whose node was lost (superseded)."""
        for trial in self.archive.trials():
            if trial.status != TRIAL_INTERRUPTED and trial.superseded is None:
                self.done[(trial.step or "", trial.role, trial.repeat)] = trial
            self.counter = max(self.counter, int(trial.trial_id.lstrip("t") or 0))
        return len(self.done)

    def earlier(self, slot: TrialSlot) -> tuple[TrialRecord, TrialSample | None] | None:
        """The slot's trial as an earlier attempt archived it, with its sample read back; None to measure it."""
        trial = self.done.get(slot.key)
        if trial is None:
            return None
        records = self.archive.load_records(trial.trial_id) if trial.status == TRIAL_OK else None
        return trial, trial_sample(self.playbook, slot.config, trial, records)

    def check_signals(self) -> None:
        if self.signals is not None:
            self.signals.check()

    def next_id(self) -> str:
        self.counter += 1
        self.began = True
        return f"t{self.counter:03d}"

    def write(self, result: TrialResult) -> None:
        # Archived first: whatever fails from here on (a console line, a decision, the diagnosis), --resume
        # finds this trial on disk and does not measure it again.
        trial_id = result.trial.trial_id
        self.archive.write_trial(
            result.trial,
            result.records,
            result.telemetry,
            result.engine_log,
            capacity=result.capacity.as_dict() if result.capacity is not None else None,
        )
        if result.probes is not None:
            self.archive.write_probes(trial_id, [p.as_dict() for p in result.probes])
        self.show(result.trial)

    def write_interrupted(self, stopped: TrialInterrupted) -> None:
        self.archive.write_trial(stopped.trial, stopped.records, None, stopped.log)

    def write_lost(self, trial: TrialRecord) -> None:
        """A trial that never came back (its node was lost): its record, nothing measured."""
        self.archive.write_trial(trial, None, None, "")
        self.show(trial)

    def supersede(self, trial_id: str, reason: str) -> None:
        self.archive.mark_superseded(trial_id, reason)

    def show(self, trial: TrialRecord) -> None:
        self.narrator.say(f"the progress line of trial {trial.trial_id}", lambda: describe_trial(trial))
