"""A/B pairs on a Ray cluster: each pair pinned to one node, its trials one after the other there, as many pairs
at once as the cluster has free slots.

The run stays on the driver (one writer of the archive, one place that decides); each trial is one Ray task asking
for the engine's GPUs (and the playbook's accelerator type) and the CPUs the playbook gives a trial. The pair's first
trial goes to a node with a free slot and the rest of the pair is pinned there, so both sides of a comparison meet
the same machine and a node's speed cancels in the pair's ratio. A trial whose node is lost is archived as failed
with the cause and its whole pair is measured again on another node (at most MAX_PAIR_RERUNS times), so no pair
mixes two machines.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from llmplay.archive.model import TRIAL_FAILED, TrialRecord
from llmplay.archive.run_facts import RunEnvironment
from llmplay.errors import LlmplayError
from llmplay.runtime import make_runtime
from llmplay.runtime.gpus import gpu_inventory
from llmplay.runtime.ray import (
    Needs,
    NodeLost,
    RayCluster,
    TaskCrashed,
    collect_orphans_here,
    granted_gpus,
    here,
    needs_of,
    pair_needs,
)
from llmplay.runtime.reaper import watched
from llmplay.spec import Config, Playbook, apply_step
from llmplay.stats.decide import TrialSample
from llmplay.tuning.book import TrialBook, TrialSlot
from llmplay.tuning.schedule.base import MeasurementCrashed, Take
from llmplay.tuning.signals import StopRun
from llmplay.tuning.trial import FreshEngineTrial, MeasureTrial, TrialResult, utc_now

# A pair whose node is lost is measured again on another node; a cluster that keeps losing nodes ends it as failed.
MAX_PAIR_RERUNS = 2


@dataclass(frozen=True)
class TrialJob:
    """One trial as the driver hands it to a node."""

    slot: TrialSlot
    trial_id: str


@dataclass(frozen=True)
class NodeTrial:
    """What a node runs for one trial: the run's trial function with the node's own runtime (its dockerd, or the
    engine installed in its image), the load generator beside it on loopback, a watchdog that removes the engine
    should the node's worker die mid-trial. Picklable: Ray ships it to the node."""

    trial: FreshEngineTrial

    @classmethod
    def of(cls, trial: FreshEngineTrial) -> NodeTrial:
        on_node = replace(trial.playbook, runtime=trial.playbook.runtime.on_node())
        # A handed-in runtime factory stays on the driver: a node starts engines with its own runtime.
        return cls(replace(trial, playbook=on_node, runtime_factory=make_runtime, progress=False))

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult:
        gpu_ids = granted_gpus()
        if gpu_ids and config.engine.gpus:
            # The GPUs Ray granted this task, not "the first N": trials sharing a node must not share a device.
            config = replace(config, engine=replace(config.engine, gpus=gpu_ids))
        runtime = self.trial.playbook.runtime
        docker_host = runtime.docker_host if runtime.kind == "docker" else None
        if runtime.kind == "docker":
            collect_orphans_here(self.trial.run_id, docker_host)
        with watched(self.trial.run_id, docker_host):
            return self.trial(config, trial_id=trial_id, step=step, role=role, repeat=repeat)


@dataclass(frozen=True)
class OnNode:
    """The Ray task: one trial, its record stamped with the node that measured it."""

    measure: MeasureTrial

    def __call__(self, job: TrialJob) -> TrialResult:
        slot = job.slot
        result = self.measure(slot.config, trial_id=job.trial_id, step=slot.step, role=slot.role, repeat=slot.repeat)
        return replace(result, trial=replace(result.trial, node=here()))


@dataclass
class _PairRun:
    """One A/B pair (or one baseline-only trial) on its way through a cluster: which of its trials have come back in
    this attempt, the node it is pinned to, and how often a lost node made it start over."""

    slots: Sequence[TrialSlot]
    needs: Needs
    results: dict[int, tuple[TrialRecord, TrialSample | None]] = field(default_factory=dict)
    node: str | None = None
    inflight: str | None = None  # trial id
    reruns: int = 0
    started: tuple[str, float] = ("", 0.0)

    @property
    def complete(self) -> bool:
        return len(self.results) == len(self.slots)

    @property
    def next_index(self) -> int:
        return next(i for i in range(len(self.slots)) if i not in self.results)


class RayScheduler:
    def __init__(self, playbook: Playbook):
        self.playbook = playbook
        self.cluster: RayCluster[TrialJob] = RayCluster(playbook.runtime)
        self._book: TrialBook | None = None
        self._task: OnNode | None = None
        self._pending: dict[str, TrialResult] = {}  # came back from a node, archived after the next submissions

    @property
    def book(self) -> TrialBook:
        assert self._book is not None, "begin() hands the scheduler its book"
        return self._book

    def join(self) -> None:
        """Join the cluster and refuse, before any archive is made, configurations no node can host."""
        self.cluster.connect()
        pb = self.playbook
        baseline = Config("baseline", pb.engine, pb.workload)
        self.cluster.check_placeable(needs_of(baseline, pb.runtime), "the baseline")
        for step in pb.steps:
            candidate, _ = apply_step(baseline, step)
            self.cluster.check_placeable(pair_needs([baseline, candidate], pb.runtime), f"step {step.name}")

    def environment(self, here: RunEnvironment) -> RunEnvironment:
        # The trials' GPUs are the nodes', not the driver's: the header names those of a node that runs them.
        pb = self.playbook
        needs = needs_of(Config("baseline", pb.engine, pb.workload), pb.runtime)
        cluster = self.cluster.describe()  # the nodes as known before a node is asked (asking may refresh them)
        return replace(here, gpu=self.cluster.ask_node(needs, gpu_inventory), cluster=cluster)

    def begin(self, book: TrialBook, measure: MeasureTrial, *, resumed: bool) -> None:
        # The run's own trial function runs on the node with the node's runtime; a handed-in one is shipped as it is.
        self._book = book
        self._task = OnNode(NodeTrial.of(measure) if isinstance(measure, FreshEngineTrial) else measure)
        if resumed:
            self.cluster.collect_orphans(book.archive.run_id, self.playbook.runtime.docker_host)

    def batch(self, configs: Sequence[Config]) -> int:
        return max(1, self.cluster.slots(pair_needs(configs, self.playbook.runtime)))

    def close(self) -> None:
        self.cluster.close()

    def run(self, groups: Sequence[Sequence[TrialSlot]], take: Take) -> None:
        """Each group runs on one node, its trials one after the other; the groups run at once on as many nodes as
        have a free slot. Every trial is archived as it comes back."""
        cluster, book = self.cluster, self.book
        step = groups[0][0].step if groups and groups[0] else None
        what = f"the trials of {step or 'the baseline'}"
        runs = [_PairRun(g, pair_needs([s.config for s in g], self.playbook.runtime)) for g in groups]
        for needs in {run.needs for run in runs}:
            cluster.check_placeable(needs, what)
        for run in runs:
            self._resume_pair(run)
        by_trial: dict[str, tuple[_PairRun, int]] = {}
        try:
            while True:
                busy = cluster.busy()
                for run in runs:
                    if run.complete or run.inflight is not None:
                        continue
                    node = self._node_for(run, busy)
                    if node is None:
                        continue
                    by_trial[self._submit(run, node)] = (run, run.next_index)
                    busy[node] = busy.get(node, 0) + 1
                # Archived once the next trials are out: a node does not wait on the driver's disk between the two
                # trials of its pair, and every trial is on disk before anything reads it.
                self._archive_pending()
                if all(run.complete for run in runs):
                    break
                book.check_signals()
                if not cluster.busy():
                    # Nothing could be placed: every node that could host these trials is gone.
                    cluster.check_placeable(runs[0].needs, what)
                for job, node_id, outcome in cluster.wait():
                    run, index = by_trial.pop(job.trial_id)
                    self._settle(run, index, job, node_id, outcome)
        except BaseException:
            cluster.cancel_all()
            with contextlib.suppress(Exception):  # what came back is kept for --resume, whatever stops the run
                self._archive_pending()
            raise
        for run in runs:
            for index, slot in enumerate(run.slots):
                trial, sample = run.results[index]
                take(slot, trial, sample)

    def _resume_pair(self, run: _PairRun) -> None:
        """Trials of this pair an earlier, interrupted run archived: kept, and the rest pinned to their node."""
        for index, slot in enumerate(run.slots):
            earlier = self.book.earlier(slot)
            if earlier is not None:
                run.results[index] = earlier
        nodes = {trial.node.get("id") for trial, _ in run.results.values()}
        if len(nodes) == 1 and not run.complete:
            run.node = nodes.pop() or None

    def _node_for(self, run: _PairRun, busy: Mapping[str, int]) -> str | None:
        """The node the pair's next trial runs on: the pair's own node, or (for its first trial) a free one."""
        cluster = self.cluster
        if run.node is not None:
            node = cluster.node(run.node) if cluster.alive(run.node) else None
            if node is not None:
                return node.id if node.slots(run.needs) > busy.get(node.id, 0) else None
            self._measure_pair_again(run, f"its pair's node {run.node[:8]} is gone; the pair is measured again")
        free = cluster.free_node(run.needs, busy)
        return free.id if free is not None else None

    def _archive_pending(self) -> None:
        while self._pending:
            _, result = self._pending.popitem()
            self.book.write(result)

    def _measure_pair_again(self, run: _PairRun, reason: str) -> None:
        for trial, _ in run.results.values():
            pending = self._pending.get(trial.trial_id)
            if pending is not None:
                self._pending[trial.trial_id] = replace(pending, trial=replace(pending.trial, superseded=reason))
            else:
                self.book.supersede(trial.trial_id, reason)
        run.results.clear()
        run.node = None
        run.reruns += 1

    def _submit(self, run: _PairRun, node_id: str) -> str:
        assert self._task is not None
        trial_id = self.book.next_id()
        job = TrialJob(run.slots[run.next_index], trial_id)
        self.cluster.submit(self._task, job, name=f"llmplay-{trial_id}", node_id=node_id, needs=run.needs)
        run.inflight = trial_id
        run.started = (utc_now(), time.perf_counter())
        return trial_id

    def _settle(self, run: _PairRun, index: int, job: TrialJob, node_id: str, outcome: object) -> None:
        run.inflight = None
        if isinstance(outcome, TrialResult):
            result = outcome
            if not result.trial.node:
                result = replace(result, trial=replace(result.trial, node=self.cluster.label(node_id)))
            self._pending[result.trial.trial_id] = result
            run.results[index] = (result.trial, result.sample)
            run.node = result.trial.node.get("id") or node_id
            return
        if isinstance(outcome, TaskCrashed):
            error = outcome.error
            if isinstance(error, (KeyboardInterrupt, LlmplayError, StopRun)):
                raise error
            raise MeasurementCrashed(error if isinstance(error, Exception) else RuntimeError(repr(error)))
        cause = outcome.cause if isinstance(outcome, NodeLost) else f"the node returned {type(outcome).__name__}"
        lost = self._lost(run, job, node_id, cause)
        self.book.write_lost(lost)
        if lost.superseded is not None:
            self._measure_pair_again(run, f"its pair's node {node_id[:8]} was lost; the pair was measured again")
        else:
            # The re-runs are spent: the loss stands as this trial's failure (its pair is then left out of the
            # paired decision whole), and the rest of the pair may run on any node.
            run.results[index] = (lost, None)
            run.node = None

    def _lost(self, run: _PairRun, job: TrialJob, node_id: str, cause: str) -> TrialRecord:
        again = run.reruns < MAX_PAIR_RERUNS
        return TrialRecord(
            trial_id=job.trial_id,
            config_id=job.slot.config.label,
            step=job.slot.step,
            role=job.slot.role,
            repeat=job.slot.repeat,
            status=TRIAL_FAILED,
            started_utc=run.started[0],
            wall_s=time.perf_counter() - run.started[1],
            summary={},
            error=cause + ("; its pair is measured again on another node" if again else ""),
            node=self.cluster.label(node_id),
            superseded="its node was lost mid-trial; the pair was measured again" if again else None,
        )
