"""The run's trials on disk: the ids handed out, the trials an earlier attempt archived (what --resume skips),
and each new trial archived before anything reads it, then shown. Every scheduler writes through it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from llmplay.archive.model import TRIAL_INTERRUPTED, TRIAL_OK, TrialRecord
from llmplay.archive.writer import RunArchive
from llmplay.errors import ArchiveError
from llmplay.loadgen.probes import ProbeResult
from llmplay.spec import Config, Playbook
from llmplay.stats.decide import TrialSample
from llmplay.tuning.progress import Narrator, describe_trial
from llmplay.tuning.signals import SignalGuard, TrialInterrupted
from llmplay.tuning.trial import TrialResult, trial_sample


@dataclass
class ConfigTrials:
    """One configuration and what the run has measured of it so far: samples of its ok trials, every trial id."""

    config: Config
    samples: list[TrialSample] = field(default_factory=list)
    trial_ids: list[str] = field(default_factory=list)
    failed: int = 0
    nodes: dict[int, str] = field(default_factory=dict)  # repeat -> the cluster node its trial ran on
    probes: tuple[ProbeResult, ...] | None = None  # goals.quality's answers from its first ok trial


@dataclass(frozen=True)
class TrialSlot:
    """One trial the step loop asks for: which configuration, and its key (step, role, repeat)."""

    config: Config
    step: str | None
    role: str
    repeat: int

    @property
    def key(self) -> tuple[str, str, int, str]:
        return slot_key(self.step, self.role, self.repeat, self.config.label)


def slot_key(step: str | None, role: str, repeat: int, config_id: str) -> tuple[str, str, int, str]:
    """What matches a trial an earlier attempt archived to the slot asking for it. A search step's round holds
    several candidates (one per value, each its own configuration) under one repeat, so a candidate is told apart
    by its configuration; a baseline's configuration is whatever the run carried, so it is matched without it."""
    return (step or "", role, repeat, config_id if role == "candidate" else "")


def trial_number(trial_id: object, run_dir: Path) -> int:
    """The number in a trial id as llmplay writes it (t001); ArchiveError for any other (`tabc` was edited in)."""
    found = re.fullmatch(r"t(\d{1,9})", trial_id) if isinstance(trial_id, str) else None
    if found is None:
        raise ArchiveError(
            f"{run_dir}: manifest.json trials: trial_id {trial_id!r}; expected t followed by digits, like t001, as "
            "llmplay writes them (the manifest was edited; cannot resume it)"
        )
    return int(found.group(1))


@dataclass
class TrialBook:
    """One run's trials: read back on --resume, numbered, archived, shown; one per run, shared by its scheduler."""

    archive: RunArchive
    playbook: Playbook
    narrator: Narrator
    signals: SignalGuard | None = None
    done: dict[tuple[str, str, int, str], TrialRecord] = field(default_factory=dict)  # archived by an earlier attempt
    counter: int = 0
    began: bool = False  # a trial was handed to its measurement (an engine may have started)

    def read_earlier(self) -> int:
        """The trials an earlier attempt of this run archived; how many count as done. An interrupted trial is
        measured again, and so is a pair whose node was lost (superseded)."""
        for trial in self.archive.trials():
            if trial.status != TRIAL_INTERRUPTED and trial.superseded is None:
                self.done[slot_key(trial.step, trial.role, trial.repeat, trial.config_id)] = trial
            self.counter = max(self.counter, trial_number(trial.trial_id, self.archive.run_dir))
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
            capacity=result.capacity,
        )
        if result.probes is not None:
            self.archive.write_probes(trial_id, result.probes)
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
