"""Other llmplay runs on this host: this run in the host's registry of live runs while it measures, and each trial
stamped with the runs that were live beside it (their load was in its figures)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from llmplay.archive.model import TrialRecord
from llmplay.runtime import live_runs
from llmplay.tuning.progress import Narrator


@dataclass(frozen=True)
class Overlap:
    """When a trial began and which runs were live then: what `stamp` compares the end with."""

    since: float
    live_before: set[str]


class HostSharing:
    def __init__(self, playbook_name: str, narrator: Narrator):
        self.playbook_name = playbook_name
        self.narrator = narrator
        self.run_id: str | None = None  # set while registered
        self._told: set[str] = set()

    @contextlib.contextmanager
    def registered(self, run_id: str) -> Iterator[None]:
        """This run in the host's registry of live runs while it measures. A second process continuing the same run
        is refused (live_runs.RunTaken) before it writes anything; a cache directory that cannot be written costs
        only the record of which runs shared the host (one warning), never the run."""
        try:
            entry = live_runs.LiveRun(run_id, self.playbook_name).__enter__()
        except OSError as exc:
            self.narrator.warn(
                f"warning: cannot register this run in {live_runs.registry_dir()} ({exc.strerror or exc}); other "
                "llmplay runs sharing this host will not be recorded"
            )
            yield
            return
        self.run_id = run_id
        try:
            yield
        finally:
            self.run_id = None
            entry.__exit__(None, None, None)

    def begin(self) -> Overlap:
        live: set[str] = set()
        if self.run_id is not None:
            with contextlib.suppress(OSError):
                live = live_runs.live_ids(self.run_id)
        return Overlap(time.time(), live)

    def stamp(self, trial: TrialRecord, overlap: Overlap) -> TrialRecord:
        """The trial with the other llmplay runs live on this host while it ran."""
        if self.run_id is None:
            return trial
        try:
            others = live_runs.others_during(self.run_id, overlap.since, overlap.live_before)
        except OSError:
            return trial
        for other in others:
            if other.run_id not in self._told:
                self._told.add(other.run_id)
                self.narrator.report(
                    f"warning: llmplay run {other.run_id} ({other.playbook}, {other.owner.describe()}) shares this "
                    "host; its load is in this run's figures too (recorded with each trial it overlapped)"
                )
        return replace(trial, shared_with=tuple(o.as_shared() for o in others))
