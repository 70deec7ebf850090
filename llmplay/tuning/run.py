"""The tuning run: baseline and steps, interleaved fresh-engine trials, verdicts, gates, all archived as it goes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from llmplay.archive.model import (
    FAILED,
    KEPT,
    TRIAL_FAILED,
    TRIAL_INTERRUPTED,
    TRIAL_OK,
    ConfigRecord,
    Diagnosis,
    Finding,
    GateResult,
    StepVerdict,
    TrialRecord,
    TuningRow,
)
from llmplay.archive.writer import RunArchive
from llmplay.catalog import CAPACITY_METRICS, RECORD_METRICS, SAMPLE_COUNT_KEYS
from llmplay.engines import get_engine
from llmplay.engines.base import Engine
from llmplay.errors import ExitCode, LlmplayError, PlaybookError
from llmplay.plan import docker_run_argv, format_argv
from llmplay.playbook.source import located_error
from llmplay.redaction import redact_text, referenced_values, resolve_env, secret_values
from llmplay.runtime import live_runs, make_runtime, stop_all
from llmplay.runtime.base import Runtime
from llmplay.runtime.docker import connect as connect_docker
from llmplay.runtime.docker import gc as remove_containers
from llmplay.runtime.docker import require_images
from llmplay.runtime.image_flags import image_flags
from llmplay.runtime.owner import Owner
from llmplay.spec import CapacitySpec, Config, Playbook, Step, Trials, apply_step
from llmplay.tuning.capacity import capacity_goal
from llmplay.tuning.cluster import (
    Needs,
    NodeTrial,
    Outcome,
    RayCluster,
    TaskCrashed,
    TrialJob,
    needs_of,
    pair_needs,
)
from llmplay.tuning.decide import Decision, TrialSample, decide_step, evaluate_gates, pooled_summary
from llmplay.tuning.diagnose.from_trials import diagnose_run
from llmplay.tuning.environment import describe_environment
from llmplay.tuning.intervals import Noise
from llmplay.tuning.preflight import preflight, run_images
from llmplay.tuning.quality import ProbeResult, judge_quality, load_probes, speed_goals
from llmplay.tuning.signals import SignalGuard, StopRun, TrialInterrupted
from llmplay.tuning.trial import TrialResult, describe_trial, run_trial, trial_sample, utc_now


@dataclass(frozen=True)
class RunOptions:
    archive_root: Path
    repeats: int | None = None  # override trials.repeats
    duration_s: float | None = None  # override workload duration
    warmup_s: float | None = None
    only: tuple[str, ...] = ()  # run only these steps
    resume: Path | None = None
    progress: bool = False
    image: str | None = None  # retest on another engine image
    # Check every flag against the image's own `--help` before the first trial (docker runtime only).
    preflight: bool = True
    ray_address: str | None = None  # --ray: run the trials on this Ray cluster, whatever the playbook's runtime
    # Every trial a capacity search (goals.capacity), whatever the goals name: `llmplay capacity`.
    capacity: bool = False

    def overrides(self) -> dict[str, Any]:
        out = {
            k: v
            for k, v in (
                ("repeats", self.repeats),
                ("duration_s", self.duration_s),
                ("warmup_s", self.warmup_s),
                ("only", list(self.only) or None),
                ("image", self.image),
                ("ray", self.ray_address),
                ("capacity", self.capacity or None),
            )
            if v is not None
        }
        return out


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    exit_code: int
    status: str
    final_config_id: str
    gates: tuple[GateResult, ...]
    verdicts: tuple[StepVerdict, ...]
    tuning_record: tuple[TuningRow, ...]
    findings: tuple[Finding, ...] = ()
    diagnosis: Diagnosis = field(default_factory=Diagnosis)
    final_summary: Mapping[str, Any] = field(default_factory=dict)  # the final configuration's pooled figures
    trials: Trials = field(default_factory=Trials)  # the design the verdicts were decided under


@dataclass
class ConfigTrials:
    """One configuration and what the run has measured of it so far: samples of its ok trials, every trial id."""

    config: Config
    samples: list[TrialSample] = field(default_factory=list)
    trial_ids: list[str] = field(default_factory=list)
    failed: int = 0
    nodes: dict[int, str] = field(default_factory=dict)  # repeat -> the cluster node its trial ran on
    probes: tuple[ProbeResult, ...] | None = None  # goals.quality's answers from its first ok trial


@dataclass
class _PairRun:
    """One A/B pair (or one baseline-only trial) on its way through a cluster: which of its trials have come back in
    this attempt, the node it is pinned to, and how often a lost node made it start over."""

    items: list[tuple[ConfigTrials, str, int]]
    needs: Needs
    results: dict[int, tuple[TrialRecord, TrialSample | None]] = field(default_factory=dict)
    node: str | None = None
    inflight: str | None = None  # trial id
    reruns: int = 0
    started: tuple[str, float] = ("", 0.0)

    @property
    def complete(self) -> bool:
        return len(self.results) == len(self.items)

    @property
    def next_index(self) -> int:
        return next(i for i in range(len(self.items)) if i not in self.results)


# A pair whose node is lost is measured again on another node; a cluster that keeps losing nodes ends it as failed.
MAX_PAIR_RERUNS = 2

Reporter = Callable[[str], None]


def _stderr_line(line: str) -> None:
    sys.stderr.write(line + "\n")


class MeasureTrial(Protocol):
    """The seam to one trial: measure `config` once under this trial's id and key (a fresh engine by default)."""

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult: ...


def apply_overrides(playbook: Playbook, options: RunOptions) -> Playbook:
    workload, trials, engine = playbook.workload, playbook.trials, playbook.engine
    if options.duration_s is not None:
        workload = replace(workload, duration_s=options.duration_s, num_requests=None)
    if options.warmup_s is not None:
        workload = replace(workload, warmup_s=options.warmup_s)
    if options.repeats is not None:
        trials = replace(trials, repeats=options.repeats, max_repeats=max(options.repeats, trials.max_repeats))
    if options.image is not None:
        engine = replace(engine, image=options.image)
    runtime = playbook.runtime
    if options.ray_address is not None:
        if runtime.kind == "endpoint":
            raise PlaybookError(
                "--ray: runtime endpoint measures one engine that is already running; expected runtime docker or "
                "process, which each cluster node then starts its engines with"
            )
        inner = runtime.inner if runtime.kind == "ray" else runtime.kind
        runtime = replace(runtime, kind="ray", address=options.ray_address, inner=inner)
    steps = playbook.steps
    if options.only:
        unknown = set(options.only) - {s.name for s in steps}
        if unknown:
            raise PlaybookError(
                f"--only {', '.join(sorted(unknown))}: no such step; expected one of: "
                f"{', '.join(s.name for s in steps)}"
            )
        steps = tuple(s for s in steps if s.name in options.only)
    return replace(playbook, workload=workload, trials=trials, engine=engine, steps=steps, runtime=runtime)


class TuningRun:
    """One execution of a playbook. Trials are keyed by (step, role, repeat) so --resume can skip finished ones.

    Each trial is archived before anything else reads it. A console line that fails to render is skipped (one
    warning on stderr, a note in the diagnosis) and the run goes on; any other bug stops the run as
    "interrupted", which --resume continues without measuring an archived trial again.

    `measure_trial` replaces the measuring of one trial (tests hand in trials with known effects); everything
    around it (schedule, decisions, archive) stays the real one."""

    def __init__(
        self,
        playbook: Playbook,
        options: RunOptions,
        *,
        runtime_factory: Callable[..., Runtime] | None = None,
        report: Reporter = print,
        measure_trial: MeasureTrial | None = None,
        warn: Reporter = _stderr_line,
    ):
        self.playbook = apply_overrides(playbook, options)
        self.options = options
        self.engine: Engine = get_engine(self.playbook.engine.kind)
        self.secrets = secret_values(_try_resolve(self.playbook.engine.env)) + referenced_values(
            [
                self.playbook.text,
                self.playbook.resolved,  # a base playbook's references (extends:) are not in the text
                dict(self.playbook.engine.env),
                [str(change.value) for step in self.playbook.steps for change in step.changes],
            ]
        )
        # Console lines carry engine errors (a log line may echo an env value): redacted like the archive.
        self.report: Reporter = lambda line: report(redact_text(line, self.secrets))
        self.warn: Reporter = lambda line: warn(redact_text(line, self.secrets))
        # Console lines a bug kept from being shown: the run went on without them, and the diagnosis lists them.
        self.unshown: list[str] = []
        self.runtime_factory = runtime_factory or make_runtime
        self.measure_trial: MeasureTrial = measure_trial or self._fresh_engine_trial
        # runtime ray: each trial is a task on a cluster node; a handed-in measure_trial is shipped there as it is
        self.cluster = RayCluster(self.playbook.runtime) if self.playbook.runtime.kind == "ray" else None
        self._node_measure = measure_trial
        self._pending: dict[str, TrialResult] = {}  # came back from a node, archived after the next submissions
        # Handed-in trials start no engine, so there is no image to ask.
        self._starts_engines = measure_trial is None
        self._archive: RunArchive | None = None
        # Trials are capacity searches when a goal names a capacity metric (or the capacity command asks): one
        # boundary per trial, so a step's A/B compares boundaries pair by pair like any other per-trial figure.
        goals = self.playbook.goals
        self.capacity: CapacitySpec | None = (
            goals.capacity if goals.capacity is not None and (options.capacity or capacity_goal(goals)) else None
        )
        if options.capacity and self.capacity is None:
            raise located_error(
                self.playbook.path,
                1,
                "goals.capacity: not found; expected goals.capacity (search, bounds, attainment) and goals.slo "
                "to search the capacity under",
            )
        self.done: dict[tuple[str, str, int], TrialRecord] = {}
        self.trial_counter = 0
        self.verdicts: list[StepVerdict] = []
        # Each decided step's own noise per metric, what later steps borrow when trials.pool_noise is on.
        self.noise: dict[str, list[Noise]] = {}
        self._signals: SignalGuard | None = None
        self._registered = False  # in this host's registry of live runs (llmplay.runtime.live_runs)
        self._began = False  # a trial was handed to its measurement (an engine may have started)
        self._sharers_told: set[str] = set()

    @property
    def archive(self) -> RunArchive:
        if self._archive is None:
            raise RuntimeError("the run's archive is opened by execute()")
        return self._archive

    # ---------------------------------------------------------------- archive plumbing
    def _open_archive(self) -> RunArchive:
        if self.options.resume:
            archive = RunArchive.open(self.options.resume, secrets=self.secrets)
            for trial in archive.trials():
                # an interrupted trial is measured again, and so is a pair whose node was lost
                if trial.status != TRIAL_INTERRUPTED and trial.superseded is None:
                    self.done[(trial.step or "", trial.role, trial.repeat)] = trial
                self.trial_counter = max(self.trial_counter, int(trial.trial_id.lstrip("t") or 0))
            self.report(f"resuming {archive.run_dir}: {len(self.done)} trial(s) already archived")
            return archive
        env = describe_environment(self.playbook, started_utc=utc_now())
        if self.cluster is not None:
            # The trials' GPUs are the nodes', not the driver's: the header names those of a node that runs them.
            needs = needs_of(Config("baseline", self.playbook.engine, self.playbook.workload), self.playbook.runtime)
            env = {**env, "cluster": self.cluster.describe(), "gpu": self.cluster.gpu_inventory(needs)}
        archive = RunArchive.create(
            self.options.archive_root,
            self.playbook,
            overrides=self.options.overrides(),
            environment=env,
            secrets=self.secrets,
        )
        self.report(f"archive: {archive.run_dir}")
        return archive

    def _config_record(self, config: Config) -> ConfigRecord:
        spec = config.engine
        return ConfigRecord(
            config_id=config.label,
            engine=spec,  # redacted as the archive writes it
            workload=config.workload,
            command=tuple(self.engine.command(spec)),
            docker_command=format_argv(docker_run_argv(spec, self.engine)),
        )

    # ---------------------------------------------------------------- console
    def _say(self, what: str, render: Callable[..., str], *args: Any) -> None:
        """Show one console line. What it tells is archived before it is shown, so a bug in rendering it costs
        only the line: a warning on stderr (the first time), a note in the diagnosis, and the run goes on."""
        try:
            self.report(render(*args))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if not self.unshown:
                self.warn(
                    f"warning: {what} could not be shown ({error}); the run goes on and archives every trial "
                    "(console lines lost later are listed in the diagnosis notes)"
                )
            self.unshown.append(f"{what} ({error})")

    # ---------------------------------------------------------------- trials
    def _fresh_engine_trial(
        self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int
    ) -> TrialResult:
        return run_trial(
            self.playbook,
            config,
            self.engine,
            self.runtime_factory,
            trial_id=trial_id,
            step=step,
            role=role,
            repeat=repeat,
            run_id=self.archive.run_id,
            progress=self.options.progress,
            capacity=self.capacity,
        )

    def _trial(
        self, config: Config, step: str | None, role: str, repeat: int
    ) -> tuple[TrialRecord, TrialSample | None]:
        key = (step or "", role, repeat)
        if key in self.done:
            trial = self.done[key]
            records = self.archive.load_records(trial.trial_id) if trial.status == TRIAL_OK else None
            return trial, trial_sample(self.playbook, config, trial, records)
        if self._signals is not None:
            self._signals.check()
        self.trial_counter += 1
        trial_id = f"t{self.trial_counter:03d}"
        since, live_before = time.time(), self._other_runs_live()
        self._began = True
        try:
            result = self.measure_trial(config, trial_id=trial_id, step=step, role=role, repeat=repeat)
        except TrialInterrupted as stopped:
            trial = self._with_sharers(stopped.trial, since, live_before)
            self.archive.write_trial(trial, stopped.records, None, stopped.log)
            raise KeyboardInterrupt("interrupted mid-trial") from None
        except (LlmplayError, StopRun):
            raise
        except Exception as exc:  # inside the measurement: nothing of this trial is on disk to resume from
            raise _MeasurementCrashed(exc) from exc
        result = replace(result, trial=self._with_sharers(result.trial, since, live_before))
        self._archive_result(result)
        if self.playbook.trials.cooldown_s:
            time.sleep(self.playbook.trials.cooldown_s)
        return result.trial, result.sample

    # ---------------------------------------------------------------- other runs on this host
    @contextlib.contextmanager
    def _live_on_this_host(self, archive: RunArchive) -> Iterator[None]:
        """This run in the host's registry of live runs while it measures. A second process continuing the same run
        is refused before it writes anything; a cache directory that cannot be written costs only the record of
        which runs shared the host (one warning), never the run."""
        try:
            entry = live_runs.LiveRun(archive.run_id, self.playbook.metadata.name).__enter__()
        except OSError as exc:
            self.warn(
                f"warning: cannot register this run in {live_runs.registry_dir()} ({exc.strerror or exc}); other "
                "llmplay runs sharing this host will not be recorded"
            )
            yield
            return
        self._registered = True
        try:
            yield
        finally:
            self._registered = False
            entry.__exit__(None, None, None)

    def _other_runs_live(self) -> set[str]:
        if not self._registered:
            return set()
        try:
            return live_runs.live_ids(self.archive.run_id)
        except OSError:
            return set()

    def _with_sharers(self, trial: TrialRecord, since: float, live_before: set[str]) -> TrialRecord:
        """The trial with the other llmplay runs live on this host while it ran: their load was in its figures."""
        if not self._registered:
            return trial
        try:
            others = live_runs.others_during(self.archive.run_id, since, live_before)
        except OSError:
            return trial
        for other in others:
            if other.run_id not in self._sharers_told:
                self._sharers_told.add(other.run_id)
                self.report(
                    f"warning: llmplay run {other.run_id} ({other.playbook}, {other.owner.describe()}) shares this "
                    "host; its load is in this run's figures too (recorded with each trial it overlapped)"
                )
        return replace(trial, shared_with=tuple(o.as_record() for o in others))

    def _archive_result(self, result: TrialResult) -> None:
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
        self._say(f"the progress line of trial {trial_id}", describe_trial, result.trial)

    def _run_into(self, target: ConfigTrials, step: str | None, role: str, repeat: int) -> None:
        trial, sample = self._trial(target.config, step, role, repeat)
        self._take(target, trial, sample)

    def _take(self, target: ConfigTrials, trial: TrialRecord, sample: TrialSample | None) -> None:
        """One measured trial counted into its configuration (and the run stopped if the playbook says so)."""
        target.trial_ids.append(trial.trial_id)
        if trial.node.get("id"):
            target.nodes[trial.repeat] = trial.node["id"]
        if target.probes is None and trial.status == TRIAL_OK:
            target.probes = load_probes(self.archive.run_dir, trial.trial_id)
        if sample is None:
            target.failed += 1
        else:
            target.samples.append(sample)
        if trial.status == TRIAL_FAILED and self.playbook.trials.on_failure == "stop":
            raise StopRun(f"trial {trial.trial_id} failed and on_failure is stop: {trial.error}")

    def _measure_pair(self, reference: ConfigTrials, cand: ConfigTrials, step: Step) -> None:
        """A B, B A, B A, A B ... in an order drawn per pair (candidate_first), or A A B B; in sequential mode, more
        pairs until the verdict is no longer inconclusive."""
        trials = self.playbook.trials
        pairs = [(reference, "baseline"), (cand, "candidate")]

        def pair_in_order(rep: int) -> list[tuple[ConfigTrials, str]]:
            return pairs[::-1] if candidate_first(self.archive.run_id, step.name, rep) else pairs

        def pair(r: int) -> list[tuple[ConfigTrials, str, int]]:
            return [(m, role, r) for m, role in (pair_in_order(r) if trials.interleave else pairs)]

        if self.cluster is not None:
            # A pair is the unit a node runs (first side then second, on one node); pairs run on as many nodes
            # as are free, and the decision pairs the two trials of each, so a node's speed cancels in its ratio.
            self._run_on_cluster(step.name, [pair(r) for r in range(trials.repeats)])
        elif trials.interleave:
            for r in range(trials.repeats):
                for measured, role, rep in pair(r):
                    self._run_into(measured, step.name, role, rep)
        else:
            for measured, role in pairs:
                for r in range(trials.repeats):
                    self._run_into(measured, step.name, role, r)
        rep = trials.repeats
        while trials.sequential and rep < trials.max_repeats:
            decision = self._decide(reference, cand)
            if decision.verdict != "inconclusive":
                break
            # One look per batch: a pair per free node on a cluster, one pair on one machine. Looking less often
            # than after every pair only leaves the sequential level (calibrated for every pair) conservative.
            batch = 1
            if self.cluster is not None:
                batch = max(1, self.cluster.slots(pair_needs([reference.config, cand.config], self.playbook.runtime)))
            batch = min(batch, trials.max_repeats - rep)
            if self.cluster is not None:
                self._run_on_cluster(step.name, [pair(r) for r in range(rep, rep + batch)])
            else:
                for measured, role, r in pair(rep):
                    self._run_into(measured, step.name, role, r)
            rep += batch

    def _decide(self, reference: ConfigTrials, cand: ConfigTrials) -> Decision:
        """The verdict from the timed trials: one call for sequential mode's stopping check and the final verdict,
        so the two agree (quality.* guards are judged from the probes afterwards, judge_quality)."""
        decision = decide_step(
            reference.samples,
            cand.samples,
            speed_goals(self.playbook.goals),
            self.playbook.trials,
            failed_candidate_trials=cand.failed,
            borrowed=self.noise,
        )
        return _node_blocks(decision, reference, cand)

    def _baseline_only(self, best: ConfigTrials) -> None:
        if self.cluster is not None:
            self._run_on_cluster(None, [[(best, "baseline", rep)] for rep in range(self.playbook.trials.repeats)])
            return
        for rep in range(self.playbook.trials.repeats):
            self._run_into(best, None, "baseline", rep)

    # ---------------------------------------------------------------- trials on a Ray cluster
    def _run_on_cluster(self, step: str | None, groups: list[list[tuple[ConfigTrials, str, int]]]) -> None:
        """Each group (an A/B pair, or one baseline trial) runs on one node, its trials one after the other; the
        groups run at once on as many nodes as have a free slot. Every trial is archived as it comes back; a trial
        whose node is lost is archived as failed with the cause and its whole pair is measured again on another
        node (at most MAX_PAIR_RERUNS times), so no pair mixes two machines."""
        cluster = self.cluster
        assert cluster is not None
        what = f"the trials of {step or 'the baseline'}"
        runs = [_PairRun(group, pair_needs([m.config for m, _, _ in group], self.playbook.runtime)) for group in groups]
        for needs in {run.needs for run in runs}:
            cluster.check_placeable(needs, what)
        for run in runs:
            self._resume_pair(run, step)
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
                    by_trial[self._submit(run, step, node)] = (run, run.next_index)
                    busy[node] = busy.get(node, 0) + 1
                # Archived once the next trials are out: a node does not wait on the driver's disk between the two
                # trials of its pair, and every trial is on disk before anything reads it.
                self._archive_pending()
                if all(run.complete for run in runs):
                    break
                if self._signals is not None:
                    self._signals.check()
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
            for index, (measured, _, _) in enumerate(run.items):
                trial, sample = run.results[index]
                self._take(measured, trial, sample)

    def _resume_pair(self, run: _PairRun, step: str | None) -> None:
        """Trials of this pair an earlier, interrupted run archived: kept, and the rest pinned to their node."""
        for index, (measured, role, rep) in enumerate(run.items):
            trial = self.done.get((step or "", role, rep))
            if trial is None:
                continue
            records = self.archive.load_records(trial.trial_id) if trial.status == TRIAL_OK else None
            run.results[index] = (trial, trial_sample(self.playbook, measured.config, trial, records))
        nodes = {trial.node.get("id") for trial, _ in run.results.values()}
        if len(nodes) == 1 and not run.complete:
            run.node = nodes.pop() or None

    def _node_for(self, run: _PairRun, busy: Mapping[str, int]) -> str | None:
        """The node the pair's next trial runs on: the pair's own node, or (for its first trial) a free one."""
        cluster = self.cluster
        assert cluster is not None
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
            self._archive_result(result)

    def _measure_pair_again(self, run: _PairRun, reason: str) -> None:
        for trial, _ in run.results.values():
            pending = self._pending.get(trial.trial_id)
            if pending is not None:
                self._pending[trial.trial_id] = replace(pending, trial=replace(pending.trial, superseded=reason))
            else:
                self.archive.mark_superseded(trial.trial_id, reason)
        run.results.clear()
        run.node = None
        run.reruns += 1

    def _submit(self, run: _PairRun, step: str | None, node_id: str) -> str:
        cluster = self.cluster
        assert cluster is not None
        measured, role, rep = run.items[run.next_index]
        self.trial_counter += 1
        trial_id = f"t{self.trial_counter:03d}"
        self._began = True
        cluster.submit(TrialJob(measured.config, trial_id, step, role, rep), node_id, run.needs)
        run.inflight = trial_id
        run.started = (utc_now(), time.perf_counter())
        return trial_id

    def _settle(self, run: _PairRun, index: int, job: TrialJob, node_id: str, outcome: Outcome) -> None:
        cluster = self.cluster
        assert cluster is not None
        run.inflight = None
        if isinstance(outcome, TrialResult):
            result = outcome
            if not result.trial.node:
                known = cluster.node(node_id)
                result = replace(result, trial=replace(result.trial, node=known.label() if known else {"id": node_id}))
            self._pending[result.trial.trial_id] = result
            run.results[index] = (result.trial, result.sample)
            run.node = result.trial.node.get("id") or node_id
            return
        if isinstance(outcome, TaskCrashed):
            error = outcome.error
            if isinstance(error, (KeyboardInterrupt, LlmplayError, StopRun)):
                raise error
            raise _MeasurementCrashed(error if isinstance(error, Exception) else RuntimeError(repr(error)))
        known = cluster.node(node_id)
        again = run.reruns < MAX_PAIR_RERUNS
        lost = TrialRecord(
            trial_id=job.trial_id,
            config_id=job.config.label,
            step=job.step,
            role=job.role,
            repeat=job.repeat,
            status=TRIAL_FAILED,
            started_utc=run.started[0],
            wall_s=time.perf_counter() - run.started[1],
            summary={},
            error=outcome.cause + ("; its pair is measured again on another node" if again else ""),
            node=known.label() if known else {"id": node_id},
            superseded="its node was lost mid-trial; the pair was measured again" if again else None,
        )
        self.archive.write_trial(lost, None, None, "")
        self._say(f"the progress line of trial {job.trial_id}", describe_trial, lost)
        if again:
            self._measure_pair_again(run, f"its pair's node {node_id[:8]} was lost; the pair was measured again")
        else:
            # The re-runs are spent: the loss stands as this trial's failure (its pair is then left out of the
            # paired decision whole), and the rest of the pair may run on any node.
            run.results[index] = (lost, None)
            run.node = None

    def _collect_orphans(self) -> None:
        """Containers whose llmplay process died (kill -9, a crashed host session) would hold GPUs forever."""
        if self.playbook.runtime.kind != "docker":
            return
        try:
            removed = remove_containers().removed_names()
        except LlmplayError as exc:
            self.report(f"could not look for orphaned containers: {exc}")
            return
        for name in removed:
            self.report(f"removed orphaned container {name} left by an earlier llmplay run that died")

    # ---------------------------------------------------------------- the run
    def _join_cluster(self) -> None:
        """runtime ray: join the cluster and refuse, before any archive is made, configurations no node can host."""
        if self.cluster is None:
            return
        self.cluster.connect()
        pb = self.playbook
        baseline = Config("baseline", pb.engine, pb.workload)
        self.cluster.check_placeable(needs_of(baseline, pb.runtime), "the baseline")
        for step in pb.steps:
            candidate, _ = apply_step(baseline, step)
            self.cluster.check_placeable(pair_needs([baseline, candidate], pb.runtime), f"step {step.name}")

    def _preflight(self) -> None:
        """Every image of the run present (InfrastructureError, exit 1) and every flag checked against its image
        (PlaybookError, exit 2), before any archive is made: a run that cannot start its engines leaves none."""
        pb = self.playbook
        if not (self._starts_engines and pb.runtime.kind == "docker"):
            return
        client = connect_docker(pb.runtime.docker_host)
        try:
            require_images(client, run_images(pb, self.engine))
            if not self.options.preflight:
                return
            result = preflight(pb, self.engine, lambda image: image_flags(client, image, self.engine), self.report)
        finally:
            client.close()
        self.engine = result.engine
        if result.images:
            self.report(result.describe())

    def execute(self) -> RunOutcome:
        try:
            # From the first moment: a Ctrl-C before any engine starts is an interrupt (exit 130) like any other.
            with SignalGuard(stop_all) as self._signals:
                self._join_cluster()
                return self._execute()
        finally:
            if self.cluster is not None:
                self.cluster.close()

    def _execute(self) -> RunOutcome:
        self._preflight()
        self._archive = archive = self._open_archive()
        pb = self.playbook
        best = ConfigTrials(Config("baseline", pb.engine, pb.workload))
        record_rows: list[dict[str, Any]] = []
        status, exit_code = "complete", int(ExitCode.OK)
        crash: Exception | None = None
        stopped: BaseException | None = None
        final = best
        try:
            with self._live_on_this_host(archive):
                archive.set_owner(Owner.current().as_dict())
                self._collect_orphans()
                if self.cluster is not None:
                    self.cluster.measure = self._node_measure or NodeTrial(pb, self.engine, archive.run_id)
                    if self.options.resume:
                        self.cluster.collect_orphans(archive.run_id, pb.runtime.docker_host)
                archive.write_config(self._config_record(best.config))
                final = self._steps(best, record_rows)
        except live_runs.RunTaken:
            raise  # another process is continuing this run: its archive is not ours to write
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            stopped = exc if isinstance(exc, KeyboardInterrupt) else KeyboardInterrupt("cancelled")
            status, exit_code = "interrupted", ExitCode.INTERRUPTED
        except StopRun as exc:
            status, exit_code = "failed", ExitCode.INFRA
            self.report(f"stopped: {exc}")
        except LlmplayError as exc:
            stopped, status, exit_code = exc, "failed", exc.exit_code
        except _MeasurementCrashed as wrapped:
            # A bug while measuring (e.g. a dataset row the load path cannot use): resuming would hit it again.
            status, exit_code, crash = "failed", ExitCode.INFRA, wrapped.cause
            self.report(
                f"failed: the trial stopped on an internal error ({type(wrapped.cause).__name__}: "
                f"{wrapped.cause}); engines stopped"
            )
        except Exception as exc:  # a bug: engines are already stopped (their finally), and every trial that
            # finished is archived (before anything else looks at it), so the run stops resumably; the CLI then
            # prints its one line (traceback with --debug).
            status, exit_code, crash = "interrupted", ExitCode.INFRA, exc
            self._say("the stop line", _stopped_by_bug, exc, archive.run_dir)
        if stopped is not None and not self.options.resume and not self._began:
            # Stopped before its first trial began (a signal, Docker gone): an archive of nothing would list a
            # "failed" or "interrupted" run that measured nothing; the error itself is the whole story.
            shutil.rmtree(archive.run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                archive.run_dir.parent.rmdir()  # the playbook's folder, when this was its only run
            self.report(f"no trial started; the archive {archive.run_dir} was removed")
            raise stopped
        if isinstance(stopped, LlmplayError):
            self.report(f"error: {stopped}")
        elif stopped is not None:
            self.report("interrupted: engines stopped; archive kept, continue with --resume")
        final_summary: dict[str, Any] = {}
        findings: list[dict[str, Any]] = []
        diagnosis: dict[str, Any] = {}
        gates: list[GateResult] = []
        try:
            final_summary = pooled_summary(final.samples)
            findings, diagnosis = self._diagnose(final, final_summary)
            kv_share = diagnosis.get("memory", {}).get("kv_share")
            if kv_share is not None:
                final_summary["memory.kv_share"] = kv_share
            gates = evaluate_gates(pb.goals.gates, final_summary)
        except Exception as exc:  # a bug in the conclusion: the trials are archived, --resume concludes again
            crash = crash or exc
            if status == "complete":
                status, exit_code = "interrupted", ExitCode.INFRA
                self._say("the stop line", _stopped_by_bug, exc, archive.run_dir)
        if self.unshown:
            diagnosis.setdefault("notes", []).append(
                "console lines not shown because of a bug (what they told is archived): " + "; ".join(self.unshown)
            )
        if status == "complete":
            exit_code = ExitCode.OK if all(g.met for g in gates) else ExitCode.GATES
        archive.finish(
            status=status,
            exit_code=exit_code,
            final_config_id=final.config.label,
            gates=gates,
            findings=findings,
            diagnosis=diagnosis,
            tuning_record=record_rows,
        )
        if crash is not None:
            raise crash
        return RunOutcome(
            archive.run_dir,
            exit_code,
            status,
            final.config.label,
            tuple(gates),
            tuple(self.verdicts),
            tuple(archive.tuning_record()),  # as archived: read back through the archive's one conversion
            tuple(archive.findings()),
            archive.diagnosis(),
            final_summary,
            pb.trials,
        )

    def _steps(self, best: ConfigTrials, record_rows: list[dict[str, Any]]) -> ConfigTrials:
        """The baseline (alone when there are no steps) and each step's A/B pairs and verdict; the final config."""
        pb, archive = self.playbook, self.archive
        if not pb.steps:
            self._baseline_only(best)
            record_rows.append(_record_row(best, None))
        for index, step in enumerate(pb.steps, start=1):
            cand_config, effects = apply_step(best.config, step)
            cand_config = Config(step.name, cand_config.engine, cand_config.workload)
            archive.write_config(self._config_record(cand_config))
            cand = ConfigTrials(cand_config)
            reference = ConfigTrials(best.config)
            self._say(
                f"the header line of step {step.name}",
                _step_line,
                f"step {index}/{len(pb.steps)} {step.name}",
                effects,
            )
            self._measure_pair(reference, cand, step)
            decision = self._decide(reference, cand)
            decision = judge_quality(decision, pb.goals, reference.probes, cand.probes, effects)
            carried = (step.carry == "always" and decision.verdict != FAILED) or (
                step.carry == "if_kept" and decision.verdict == KEPT
            )
            verdict = StepVerdict(
                step=step.name,
                index=index,
                verdict=decision.verdict,
                reason=decision.reason,
                changes=tuple(e.describe() for e in effects),
                bundle=step.bundle,
                baseline_config=reference.config.label,
                candidate_config=cand_config.label,
                objective=decision.objective,
                guards=decision.guards,
                deltas=decision.deltas,
                trials_baseline=tuple(reference.trial_ids),
                trials_candidate=tuple(cand.trial_ids),
                more_trials_needed=decision.more_trials_needed,
                carried=carried,
            )
            archive.write_verdict(verdict)
            self.verdicts.append(verdict)
            for metric, noise in decision.noise.items():
                self.noise.setdefault(metric, []).append(noise)
            self._say(f"the verdict line of step {step.name}", _verdict_line, decision)
            if index == 1:
                record_rows.append(_record_row(reference, None))
            record_rows.append(_record_row(cand, verdict))
            best = cand if carried else reference
        return best

    def _diagnose(self, final: ConfigTrials, summary: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The diagnosis of the final configuration; a bug in it costs the diagnosis, never the run's verdicts."""
        try:
            return diagnose_run(self.playbook, final.config, final.samples, summary)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.warn(f"warning: the diagnosis could not be made ({error}); the measurements and verdicts are archived")
            return [], {"notes": [f"diagnosis not made because of a bug ({error})"]}


def _node_blocks(decision: Decision, reference: ConfigTrials, cand: ConfigTrials) -> Decision:
    """On a cluster every A/B pair ran on one node, so each pair's log ratio is free of node-to-node differences: the
    node is a block of the paired design. Said in each paired interval's method, for the archive and the report."""
    common = set(reference.nodes) & set(cand.nodes)
    if not common or any(reference.nodes[r] != cand.nodes[r] for r in common):
        return decision

    def blocked(delta: Any) -> Any:
        if delta is None or not (delta.method or "").startswith("paired"):
            return delta
        return replace(delta, method=f"{delta.method}, each pair on one node ({len(set(cand.nodes.values()))} nodes)")

    return replace(
        decision,
        objective=blocked(decision.objective),
        guards=tuple(blocked(d) for d in decision.guards),
        deltas=tuple(blocked(d) for d in decision.deltas),
    )


def candidate_first(run_id: str, step: str, repeat: int) -> bool:
    """Which side of pair `repeat` starts, drawn per pair from the run id (archived): alternating A B | B A puts the
    candidates of consecutive pairs next to each other, so trials that drift together make those pairs alike and
    their spread too small; a random order leaves any advantage of starting second as noise, not as an effect."""
    digest = hashlib.sha256(f"{run_id}\0{step}\0{repeat}".encode()).digest()
    return bool(digest[0] & 1)


def _step_line(head: str, effects: Sequence[Any]) -> str:
    return f"{head}: " + "; ".join(e.describe() for e in effects)


def _verdict_line(decision: Decision) -> str:
    return f"  -> {decision.verdict}: {decision.reason}"


class _MeasurementCrashed(Exception):
    """An unexpected exception from inside one trial's measurement, told apart from a bug after it."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


def _stopped_by_bug(exc: Exception, run_dir: Path) -> str:
    return (
        f"stopped by an internal error ({type(exc).__name__}: {exc}); every finished trial is archived: "
        f"continue with llmplay run --resume {run_dir}"
    )


def _try_resolve(env: Mapping[str, str]) -> dict[str, str]:
    try:
        return resolve_env(env)
    except LlmplayError:
        return dict(env)


def _record_row(measured: ConfigTrials, verdict: StepVerdict | None) -> dict[str, Any]:
    return tuning_record_row(measured.config.label, measured.trial_ids, measured.failed, measured.samples, verdict)


def tuning_record_row(
    config_id: str,
    trial_ids: Sequence[str],
    failed_trials: int,
    samples: Sequence[TrialSample],
    verdict: StepVerdict | None,
) -> dict[str, Any]:
    """One row of the manifest's tuning record: a configuration's pooled figures and, for a step, its verdict."""
    summary = pooled_summary(samples)
    row: dict[str, Any] = {
        "config_id": config_id,
        "trials": list(trial_ids),
        "failed_trials": failed_trials,
        "metrics": {m: summary[m] for m in (*RECORD_METRICS, *CAPACITY_METRICS) if m in summary},
        "samples": {k: int(summary[k]) for k in SAMPLE_COUNT_KEYS if k in summary},  # what the percentiles rest on
    }
    if verdict is not None:
        row.update(
            step=verdict.step,
            verdict=verdict.verdict,
            reason=verdict.reason,
            compared_with=verdict.baseline_config,
            changes=list(verdict.changes),
        )
    return row


def run_playbook(
    playbook: Playbook, options: RunOptions, *, publish: Callable[[Path], Any] | None = None, **kwargs: Any
) -> RunOutcome:
    """Run the playbook; `publish` (the report renderer, passed in by the command) runs on the finished archive."""
    outcome = TuningRun(playbook, options, **kwargs).execute()
    if publish is not None:
        publish(outcome.run_dir)
    return outcome
