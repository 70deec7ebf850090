"""The tuning run: a playbook's plan carried out and archived as it goes (the baseline and steps through the step
loop, trials through a scheduler), then its conclusion: the final configuration's figures, gates and diagnosis."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from llmplay.archive.model import (
    TRIAL_OK,
    ConfigRecord,
    Diagnosis,
    Finding,
    GateResult,
    StepVerdict,
    TuningRow,
)
from llmplay.archive.run_facts import RunOverrides
from llmplay.archive.writer import RunArchive
from llmplay.diagnose.from_trials import diagnose_run
from llmplay.engines import get_engine
from llmplay.engines.base import Engine
from llmplay.errors import ExitCode, LlmplayError, PlaybookError
from llmplay.plan import docker_run_argv, format_argv
from llmplay.playbook.convert import check_image_option
from llmplay.playbook.credentials import unset_references
from llmplay.playbook.source import located_error
from llmplay.redaction import redact_text, referenced_values, resolve_env, secret_values
from llmplay.runtime import RuntimeFactory, live_runs, make_runtime, stop_all
from llmplay.runtime.docker import connect as connect_docker
from llmplay.runtime.docker import require_images
from llmplay.runtime.image_flags import image_flags
from llmplay.runtime.owner import Owner
from llmplay.spec import CapacitySpec, Config, Playbook, Trials
from llmplay.stats.decide import evaluate_gates, pooled_summary
from llmplay.tuning.book import ConfigTrials, TrialBook
from llmplay.tuning.capacity import capacity_goal
from llmplay.tuning.environment import describe_environment
from llmplay.tuning.history_noise import history_noise
from llmplay.tuning.preflight import preflight, run_images
from llmplay.tuning.progress import Narrator, Reporter, stopped_by_bug
from llmplay.tuning.schedule import MeasurementCrashed, scheduler_for
from llmplay.tuning.sharing import HostSharing
from llmplay.tuning.signals import SignalGuard, StopRun
from llmplay.tuning.steps import StepLoop
from llmplay.tuning.trial import FreshEngineTrial, MeasureTrial, utc_now


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
    # --resume: whether the continued archive is signed ($LLMPLAY_SIGNING_KEY); archive.trust decides it
    resume_signs: bool = True
    # Told a new archive's run directory the moment it exists, before any trial: `llmplay tune` records it so an
    # interrupted round is continued, not measured again.
    on_archive: Callable[[Path], object] | None = None

    def overrides(self) -> RunOverrides:
        return RunOverrides(
            repeats=self.repeats,
            duration_s=self.duration_s,
            warmup_s=self.warmup_s,
            only=self.only,
            image=self.image,
            ray=self.ray_address,
            capacity=self.capacity,
        )


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
    final_summary: Mapping[str, float] = field(default_factory=dict)  # the final configuration's pooled figures
    trials: Trials = field(default_factory=Trials)  # the design the verdicts were decided under


def _stderr_line(line: str) -> None:
    sys.stderr.write(line + "\n")


@dataclass
class _Ending:
    """How the measuring ended: the run's status and exit code, and what stopped it."""

    status: str = "complete"
    exit_code: int = int(ExitCode.OK)
    crash: Exception | None = None  # a bug: raised again once the archive is finished
    stopped: BaseException | None = None  # an interrupt or a known error: the CLI's one line


def apply_overrides(playbook: Playbook, options: RunOptions) -> Playbook:
    workload, trials, engine = playbook.workload, playbook.trials, playbook.engine
    if options.duration_s is not None:
        workload = replace(workload, duration_s=options.duration_s, num_requests=None)
    if options.warmup_s is not None:
        workload = replace(workload, warmup_s=options.warmup_s)
    if options.repeats is not None:
        trials = replace(trials, repeats=options.repeats, max_repeats=max(options.repeats, trials.max_repeats))
    if options.image is not None:
        check_image_option(options.image)
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
    around it (schedule, decisions, archive) stays the real one. `runtime_factory` replaces how this machine's
    trials start their engines."""

    def __init__(
        self,
        playbook: Playbook,
        options: RunOptions,
        *,
        runtime_factory: RuntimeFactory | None = None,
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
        self.narrator = Narrator(
            lambda line: report(redact_text(line, self.secrets)), lambda line: warn(redact_text(line, self.secrets))
        )
        self.runtime_factory = runtime_factory or make_runtime
        self._handed_in = measure_trial  # starts no engine, so there is no image to ask
        self.sharing = HostSharing(self.playbook.metadata.name, self.narrator)
        self.scheduler = scheduler_for(self.playbook, self.sharing)
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
        self._signals: SignalGuard | None = None

    def execute(self) -> RunOutcome:
        try:
            # From the first moment: a Ctrl-C before any engine starts is an interrupt (exit 130) like any other.
            with SignalGuard(stop_all) as self._signals:
                self.scheduler.join()
                return self._execute()
        finally:
            self.scheduler.close()

    # ---------------------------------------------------------------- before the archive
    def _preflight(self) -> None:
        """Every image of the run present (InfrastructureError, exit 1) and every flag checked against its image
        (PlaybookError, exit 2), before any archive is made: a run that cannot start its engines leaves none."""
        pb = self.playbook
        if not (self._handed_in is None and pb.runtime.kind == "docker"):
            return
        client = connect_docker(pb.runtime.docker_host)
        try:
            require_images(client, run_images(pb, self.engine))
            if not self.options.preflight:
                return
            result = preflight(
                pb, self.engine, lambda image: image_flags(client, image, self.engine), self.narrator.report
            )
        finally:
            client.close()
        self.engine = result.engine
        if result.images:
            self.narrator.report(result.describe())

    def _open_book(self) -> TrialBook:
        """The run's archive (a new one, or the one --resume continues, its finished trials read back)."""
        if self.options.resume:
            archive = RunArchive.open(self.options.resume, secrets=self.secrets, sign=self.options.resume_signs)
            book = TrialBook(archive, self.playbook, self.narrator, self._signals)
            done = book.read_earlier()
            self.narrator.report(f"resuming {archive.run_dir}: {done} trial(s) already archived")
            return book
        env = self.scheduler.environment(describe_environment(self.playbook, started_utc=utc_now()))
        archive = RunArchive.create(
            self.options.archive_root,
            self.playbook,
            overrides=self.options.overrides(),
            environment=env,
            secrets=self.secrets,
        )
        self.narrator.report(f"archive: {archive.run_dir}")
        if self.options.on_archive is not None:
            self.options.on_archive(archive.run_dir)
        return TrialBook(archive, self.playbook, self.narrator, self._signals)

    def _config_record(self, config: Config) -> ConfigRecord:
        spec = config.engine
        return ConfigRecord(
            config_id=config.label,
            engine=spec,  # redacted as the archive writes it
            workload=config.workload,
            command=tuple(self.engine.command(spec)),
            docker_command=format_argv(docker_run_argv(spec, self.engine)),
        )

    # ---------------------------------------------------------------- the run
    def _execute(self) -> RunOutcome:
        if unset := unset_references(self.playbook):  # before the archive: a run that cannot start leaves none
            raise PlaybookError("\n".join(unset))
        self._preflight()
        book = self._open_book()
        archive = book.archive
        history = None
        if self.playbook.trials.noise == "history" and self.playbook.steps:
            metrics = [self.playbook.goals.objective.metric, *(g.metric for g in self.playbook.goals.guards)]
            info = archive.info
            history = history_noise(
                self.options.archive_root,
                self.playbook,
                metrics,
                sha256=info.playbook.sha256,
                hardware=info.environment.gpu_label,
                exclude=info.run_id,
            )
            self.narrator.report(history.describe())
        loop = StepLoop(
            self.playbook, book, self.scheduler, lambda c: archive.write_config(self._config_record(c)), history
        )
        final, ending = self._measure(book, loop)
        if ending.stopped is not None and not self.options.resume and not book.began:
            # Stopped before its first trial began (a signal, Docker gone): an archive of nothing would list a
            # "failed" or "interrupted" run that measured nothing; the error itself is the whole story.
            shutil.rmtree(archive.run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                archive.run_dir.parent.rmdir()  # the playbook's folder, when this was its only run
            self.narrator.report(f"no trial started; the archive {archive.run_dir} was removed")
            raise ending.stopped
        if isinstance(ending.stopped, LlmplayError):
            self.narrator.report(f"error: {ending.stopped}")
        elif ending.stopped is not None:
            self.narrator.report("interrupted: engines stopped; archive kept, continue with --resume")
        return self._conclude(archive, final, loop, ending)

    def _measure(self, book: TrialBook, loop: StepLoop) -> tuple[ConfigTrials, _Ending]:
        """The step loop, with how it ended: each way a run stops mapped to its status and exit code."""
        pb, archive, ending = self.playbook, book.archive, _Ending()
        final = best = ConfigTrials(Config("baseline", pb.engine, pb.workload))
        measure = self._handed_in or FreshEngineTrial(
            pb, self.engine, archive.run_id, self.runtime_factory, self.options.progress, self.capacity
        )
        try:
            with self.sharing.registered(archive.run_id):
                archive.set_owner(Owner.current())
                self.scheduler.begin(book, measure, resumed=self.options.resume is not None)
                archive.write_config(self._config_record(best.config))
                final = loop.run(best)
        except live_runs.RunTaken:
            raise  # another process is continuing this run: its archive is not ours to write
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            stopped = exc if isinstance(exc, KeyboardInterrupt) else KeyboardInterrupt("cancelled")
            ending = _Ending("interrupted", ExitCode.INTERRUPTED, stopped=stopped)
        except StopRun as exc:
            ending = _Ending("failed", ExitCode.INFRA)
            self.narrator.report(f"stopped: {exc}")
        except LlmplayError as exc:
            ending = _Ending("failed", exc.exit_code, stopped=exc)
        except MeasurementCrashed as wrapped:
            # A bug while measuring (e.g. a dataset row the load path cannot use): resuming would hit it again.
            ending = _Ending("failed", ExitCode.INFRA, crash=wrapped.cause)
            self.narrator.report(
                f"failed: the trial stopped on an internal error ({type(wrapped.cause).__name__}: "
                f"{wrapped.cause}); engines stopped"
            )
        except Exception as exc:  # a bug: engines are already stopped (their finally), and every trial that
            # finished is archived (before anything else looks at it), so the run stops resumably; the CLI then
            # prints its one line (traceback with --debug).
            ending = _Ending("interrupted", ExitCode.INFRA, crash=exc)
            self.narrator.say("the stop line", partial(stopped_by_bug, exc, archive.run_dir))
        return final, ending

    def _conclude(self, archive: RunArchive, final: ConfigTrials, loop: StepLoop, ending: _Ending) -> RunOutcome:
        """The final configuration's pooled figures, diagnosis and gates, the archive finished, and the outcome."""
        final_summary: dict[str, float] = {}
        findings: list[Finding] = []
        diagnosis = Diagnosis()
        gates: list[GateResult] = []
        try:
            final_summary = pooled_summary(final.samples)
            findings, diagnosis = self._diagnose(final, final_summary)
            kv_share = diagnosis.memory.kv_share if diagnosis.memory is not None else None
            if kv_share is not None:
                final_summary["memory.kv_share"] = kv_share
            gates = evaluate_gates(self.playbook.goals.gates, final_summary)
            if not final.samples and ending.status == "interrupted":
                completed = sum(t.status == TRIAL_OK for t in archive.trials())
                gates = _unmeasured_because_stopped(gates, completed)
        except Exception as exc:  # a bug in the conclusion: the trials are archived, --resume concludes again
            ending.crash = ending.crash or exc
            if ending.status == "complete":
                ending.status, ending.exit_code = "interrupted", ExitCode.INFRA
                self.narrator.say("the stop line", partial(stopped_by_bug, exc, archive.run_dir))
        if self.narrator.unshown:
            unshown = "console lines not shown because of a bug (what they told is archived): "
            diagnosis = replace(diagnosis, notes=(*diagnosis.notes, unshown + "; ".join(self.narrator.unshown)))
        if ending.status == "complete":
            ending.exit_code = ExitCode.OK if all(g.met for g in gates) else ExitCode.GATES
        archive.finish(
            status=ending.status,
            exit_code=ending.exit_code,
            final_config_id=final.config.label,
            gates=gates,
            findings=findings,
            diagnosis=diagnosis,
            tuning_record=loop.record_rows,
        )
        if ending.crash is not None:
            raise ending.crash
        return RunOutcome(
            archive.run_dir,
            ending.exit_code,
            ending.status,
            final.config.label,
            tuple(gates),
            tuple(loop.verdicts),
            tuple(loop.record_rows),
            tuple(findings),
            diagnosis,
            final_summary,
            self.playbook.trials,
        )

    def _diagnose(self, final: ConfigTrials, summary: Mapping[str, float]) -> tuple[list[Finding], Diagnosis]:
        """The diagnosis of the final configuration; a bug in it costs the diagnosis, never the run's verdicts."""
        try:
            return diagnose_run(self.playbook, final.config, final.samples, summary)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.narrator.warn(
                f"warning: the diagnosis could not be made ({error}); the measurements and verdicts are archived"
            )
            return [], Diagnosis(notes=(f"diagnosis not made because of a bug ({error})",))


def _unmeasured_because_stopped(gates: list[GateResult], completed: int) -> list[GateResult]:
    """A run stopped before its final configuration had figures: its gates are not measured because of the stop,
    not because no request was sent (completed trials may well be archived, their step still undecided)."""
    why = (
        f"not judged: the run stopped before its figures were pooled; {completed} completed trial(s) are "
        "archived, continue with --resume"
    )
    return [replace(g, note=why) if g.observed is None else g for g in gates]


def _try_resolve(env: Mapping[str, str]) -> dict[str, str]:
    try:
        return resolve_env(env)
    except LlmplayError:
        return dict(env)


def run_playbook(
    playbook: Playbook,
    options: RunOptions,
    *,
    publish: Callable[[Path], object] | None = None,
    report: Reporter = print,
    warn: Reporter = _stderr_line,
    measure_trial: MeasureTrial | None = None,
    runtime_factory: RuntimeFactory | None = None,
) -> RunOutcome:
    """Run the playbook; `publish` (the report renderer, passed in by the command) runs on the finished archive."""
    run = TuningRun(
        playbook, options, runtime_factory=runtime_factory, report=report, measure_trial=measure_trial, warn=warn
    )
    outcome = run.execute()
    if publish is not None:
        publish(outcome.run_dir)
    return outcome
