"""Raced steps (`carry: race`) measured at once: each step runs as it always does, through the step loop and its
kind, but every step's asks for trials are gathered and handed to the run's scheduler as one call, so on a cluster
their pairs run at the same time on separate nodes (each pair still pinned to one node).

Each raced step runs in its own thread, and exactly one of them runs at a time (a baton passed by the driver, in the
steps' order): a step runs until it asks for trials or ends; once every step still measuring has asked, their groups
go to the scheduler in one call (interleaved, so the first pairs of every step start first), and each step resumes
in turn with its trials taken. Nothing runs concurrently in the driver, so the step loop, the kinds and the archive
need no locks, and the order of everything the steps write is the same on every run (and on --resume). The trials
themselves are taken (counted, archived) in the driver's thread, as without a race.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Generic, TypeVar

from llmplay.archive.model import TrialRecord
from llmplay.archive.run_facts import RunEnvironment
from llmplay.spec import Config
from llmplay.stats.decide import TrialSample
from llmplay.tuning.book import TrialBook, TrialSlot
from llmplay.tuning.schedule.base import Take, TrialScheduler
from llmplay.tuning.trial import MeasureTrial

T = TypeVar("T")
Groups = Sequence[Sequence[TrialSlot]]


@dataclass
class _Lane(Generic[T]):
    """One raced step: its thread, its pending ask for trials, and how it ended."""

    run: Callable[[], T]
    asked: tuple[Groups, Take] | None = None
    reply: BaseException | None = None  # raised in the step where it waits: the race is stopping
    result: T | None = None
    error: BaseException | None = None
    done: bool = False


class RacingScheduler(Generic[T]):
    """The scheduler the raced steps see (a TrialScheduler): `race` runs them and returns each one's result."""

    def __init__(self, inner: TrialScheduler):
        self.inner = inner
        self._cond = threading.Condition()
        self._turn: _Lane[T] | None = None  # None: the driver's turn
        self._lanes: list[_Lane[T]] = []

    # ------------------------------------------------------------------ the TrialScheduler seam, for the steps
    def join(self) -> None:
        self.inner.join()

    def environment(self, here: RunEnvironment) -> RunEnvironment:
        return self.inner.environment(here)

    def begin(self, book: TrialBook, measure: MeasureTrial, *, resumed: bool) -> None:
        self.inner.begin(book, measure, resumed=resumed)

    def close(self) -> None:
        self.inner.close()

    def batch(self, configs: Sequence[Config]) -> int:
        """A step's share of the pairs worth running at once: the cluster's room, split among the steps measuring."""
        measuring = max(1, sum(not lane.done for lane in self._lanes))
        return max(1, self.inner.batch(configs) // measuring)

    def run(self, groups: Groups, take: Take) -> None:
        """Called by the step that holds the baton: its ask waits for the others', then its trials are taken."""
        with self._cond:
            lane = self._turn
            assert lane is not None, "run() is called by a raced step, in its turn"
            lane.asked = (groups, take)
            self._turn = None
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._turn is lane)
            reply, lane.reply = lane.reply, None
        if reply is not None:
            raise reply

    # ------------------------------------------------------------------ the race, for the step loop
    def race(self, runs: Sequence[Callable[[], T]]) -> list[T]:
        """Run every step (each `run` measures one through this scheduler); their results in order. A step that
        raises, or a stop while measuring (an interrupt, on_failure: stop), stops the others where they wait (each
        unwinds as a stopped step does, archiving what it must) and is raised here."""
        lanes = [_Lane(run) for run in runs]
        self._lanes = lanes
        for number, lane in enumerate(lanes, start=1):
            threading.Thread(target=self._lane_main, args=(lane,), name=f"llmplay-race-{number}", daemon=True).start()
        try:
            while True:
                for lane in lanes:
                    if not lane.done:
                        self._pass_baton(lane)
                failed = next((lane.error for lane in lanes if lane.error is not None), None)
                if failed is not None:
                    raise failed
                asking = [lane for lane in lanes if not lane.done]
                if not asking:
                    return [lane.result for lane in lanes]  # type: ignore[misc]  # done without error: a result
                self._measure(asking)
        except BaseException as stop:
            self._stop_all(lanes, stop)
            raise

    def _lane_main(self, lane: _Lane[T]) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._turn is lane)
            stopped, lane.reply = lane.reply, None
        try:
            if stopped is not None:
                raise stopped
            lane.result = lane.run()
        except BaseException as exc:  # handed to the driver, which raises it
            lane.error = exc
        finally:
            with self._cond:
                lane.done = True
                self._turn = None
                self._cond.notify_all()

    def _pass_baton(self, lane: _Lane[T]) -> None:
        """Let one step run until it asks for trials or ends. A signal in the driver meanwhile (Ctrl-C) is raised once
        the step has given the baton back: the step is never left half-way through what it writes."""
        interrupted: BaseException | None = None
        with self._cond:
            self._turn = lane
            self._cond.notify_all()
            while self._turn is lane:
                try:
                    self._cond.wait()
                except BaseException as exc:
                    interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    def _measure(self, asking: Sequence[_Lane[T]]) -> None:
        """Every waiting step's groups as one call: interleaved (each step's first group, then each one's second),
        so the steps' first pairs take the free nodes first; each trial handed to the step that asked for it."""
        takes: dict[tuple[str, str, int, str], Take] = {}
        per_lane: list[Groups] = []
        for lane in asking:
            assert lane.asked is not None, "a step still measuring has asked for trials"
            groups, take = lane.asked
            lane.asked = None
            per_lane.append(groups)
            for group in groups:
                for slot in group:
                    takes[slot.key] = take
        merged = [group for row in zip_longest(*per_lane) for group in row if group is not None]

        def take_for(slot: TrialSlot, trial: TrialRecord, sample: TrialSample | None) -> None:
            takes[slot.key](slot, trial, sample)

        self.inner.run(merged, take_for)

    def _stop_all(self, lanes: Sequence[_Lane[T]], stop: BaseException) -> None:
        """Every step not yet ended gets the stop where it waits and unwinds, one at a time."""
        for lane in lanes:
            if lane.done:
                continue
            lane.reply = stop
            lane.asked = None
            try:
                self._pass_baton(lane)
            except BaseException:  # a second signal while stopping: the first stop is the one raised
                continue
