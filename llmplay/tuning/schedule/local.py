"""Trials on this machine, one at a time: A/B pairs interleaved (A B, B A ... in the order each pair drew), or
all of one side then the other (trials.interleave off)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from llmplay.archive.model import TrialRecord
from llmplay.archive.run_facts import RunEnvironment
from llmplay.errors import LlmplayError
from llmplay.runtime.docker import gc as remove_containers
from llmplay.spec import Config, Playbook
from llmplay.stats.decide import TrialSample
from llmplay.tuning.book import TrialBook, TrialSlot
from llmplay.tuning.schedule.base import MeasurementCrashed, Take
from llmplay.tuning.sharing import HostSharing
from llmplay.tuning.signals import StopRun, TrialInterrupted
from llmplay.tuning.trial import MeasureTrial


class LocalScheduler:
    def __init__(self, playbook: Playbook, sharing: HostSharing):
        self.playbook = playbook
        self.sharing = sharing
        self._book: TrialBook | None = None
        self._measure: MeasureTrial | None = None

    def join(self) -> None:
        return None  # this machine: the preflight checks its images and flags

    def environment(self, here: RunEnvironment) -> RunEnvironment:
        return here

    def begin(self, book: TrialBook, measure: MeasureTrial, *, resumed: bool) -> None:
        self._book, self._measure = book, measure
        self._collect_orphans()

    def batch(self, configs: Sequence[Config]) -> int:
        return 1

    def close(self) -> None:
        return None

    def run(self, groups: Sequence[Sequence[TrialSlot]], take: Take) -> None:
        # Not interleaved: every group's first trial, then every group's second (A A B B).
        order = (
            [slot for group in groups for slot in group]
            if self.playbook.trials.interleave
            else [group[i] for i in range(max(map(len, groups), default=0)) for group in groups if i < len(group)]
        )
        for slot in order:
            trial, sample = self._trial(slot)
            take(slot, trial, sample)

    def _trial(self, slot: TrialSlot) -> tuple[TrialRecord, TrialSample | None]:
        book, measure = self._book, self._measure
        assert book is not None and measure is not None, "begin() hands the scheduler its book"
        earlier = book.earlier(slot)
        if earlier is not None:
            return earlier
        book.check_signals()
        trial_id = book.next_id()
        overlap = self.sharing.begin()
        try:
            result = measure(slot.config, trial_id=trial_id, step=slot.step, role=slot.role, repeat=slot.repeat)
        except TrialInterrupted as stopped:
            stopped.trial = self.sharing.stamp(stopped.trial, overlap)
            book.write_interrupted(stopped)
            raise KeyboardInterrupt("interrupted mid-trial") from None
        except (LlmplayError, StopRun):
            raise
        except Exception as exc:  # inside the measurement: nothing of this trial is on disk to resume from
            raise MeasurementCrashed(exc) from exc
        result = replace(result, trial=self.sharing.stamp(result.trial, overlap))
        book.write(result)
        if self.playbook.trials.cooldown_s:
            time.sleep(self.playbook.trials.cooldown_s)
        return result.trial, result.sample

    def _collect_orphans(self) -> None:
        """Containers whose llmplay process died (kill -9, a crashed host session) would hold GPUs forever."""
        if self.playbook.runtime.kind != "docker":
            return
        assert self._book is not None
        report = self._book.narrator.report
        try:
            removed = remove_containers().removed_names()
        except LlmplayError as exc:
            report(f"could not look for orphaned containers: {exc}")
            return
        for name in removed:
            report(f"removed orphaned container {name} left by an earlier llmplay run that died")
