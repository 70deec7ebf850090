"""The tuning run: baseline and steps, interleaved fresh-engine trials, verdicts, gates, all archived as it goes."""
from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from llmplay.archive.store import RunArchive
from llmplay.tuning.environment import describe_environment
from llmplay.tuning.decide import RECORD_METRICS, TrialSample, decide_step, evaluate_gates, pooled_summary, sample_from_records
from llmplay.engines import get_engine
from llmplay.engines.base import Engine
from llmplay.errors import EngineStartError, InfrastructureError, LlmplayError, PlaybookError
from llmplay.plan import docker_run_argv, format_argv
from llmplay.archive.model import (
    FAILED, KEPT, TRIAL_FAILED, TRIAL_INTERRUPTED, TRIAL_OK, ConfigRecord, GateResult, StepVerdict, TrialRecord, to_plain,
)
from llmplay.redaction import redact, redact_text, referenced_values, resolve_env, secret_values
from llmplay.spec import Config, Playbook, Step, apply_step

EXIT_OK, EXIT_INFRA, EXIT_PLAYBOOK, EXIT_GATES, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


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
    bootstrap_samples: int | None = None

    def overrides(self) -> dict[str, Any]:
        out = {k: v for k, v in (("repeats", self.repeats), ("duration_s", self.duration_s),
                                 ("warmup_s", self.warmup_s), ("only", list(self.only) or None),
                                 ("image", self.image), ("bootstrap_samples", self.bootstrap_samples)) if v is not None}
        return out


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    exit_code: int
    status: str
    final_config_id: str
    gates: tuple[GateResult, ...]
    verdicts: tuple[StepVerdict, ...]
    tuning_record: tuple[Mapping[str, Any], ...]
    findings: tuple[Mapping[str, Any], ...] = ()
    diagnosis: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class _Measured:
    """Samples of one configuration gathered during the run (ok trials only)."""

    config: Config
    samples: list[TrialSample] = field(default_factory=list)
    trial_ids: list[str] = field(default_factory=list)
    failed: int = 0


Reporter = Callable[[str], None]


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def apply_overrides(playbook: Playbook, options: RunOptions) -> Playbook:
    workload, trials, engine = playbook.workload, playbook.trials, playbook.engine
    if options.duration_s is not None:
        workload = replace(workload, duration_s=options.duration_s, num_requests=None)
    if options.warmup_s is not None:
        workload = replace(workload, warmup_s=options.warmup_s)
    if options.repeats is not None:
        trials = replace(trials, repeats=options.repeats, max_repeats=max(options.repeats, trials.max_repeats))
    if options.bootstrap_samples is not None:
        trials = replace(trials, bootstrap_samples=options.bootstrap_samples)
    if options.image is not None:
        engine = replace(engine, image=options.image)
    steps = playbook.steps
    if options.only:
        unknown = set(options.only) - {s.name for s in steps}
        if unknown:
            raise PlaybookError(f"--only {', '.join(sorted(unknown))}: no such step; expected one of: "
                                f"{', '.join(s.name for s in steps)}")
        steps = tuple(s for s in steps if s.name in options.only)
    return replace(playbook, workload=workload, trials=trials, engine=engine, steps=steps)


def price_per_hour(playbook: Playbook, config: Config) -> float:
    gpus = config.engine.gpus
    n_gpus = len(gpus) if isinstance(gpus, tuple) else int(gpus or 0)
    return playbook.cost.gpu_usd_per_hour * n_gpus + playbook.cost.host_usd_per_hour


class _Signals:
    """First SIGINT/SIGTERM unwinds (engines stop in their finally); a second forces it.

    The first signal's KeyboardInterrupt lands wherever the main thread happens to be; should a library
    swallow it there, a watchdog stops every engine and exits anyway, so a signal can never leave an
    engine holding GPUs.
    """

    FORCE_AFTER_S = 30.0

    def __init__(self, stop_all: Callable[[], None]):
        self.stop_all, self.count, self.previous = stop_all, 0, {}

    def _force(self) -> None:
        self.stop_all()
        os._exit(EXIT_INTERRUPTED)

    def _handle(self, signum, frame):  # noqa: ARG002
        import asyncio
        import threading

        self.count += 1
        if self.count > 1:
            self._force()
        watchdog = threading.Timer(self.FORCE_AFTER_S, self._force)
        watchdog.daemon = True
        watchdog.start()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            raise KeyboardInterrupt(f"signal {signum}")
        # Inside the load generator's event loop an exception raised here would land in some protocol
        # callback, which the loop logs and swallows; cancelling its tasks unwinds it the asyncio way.
        for task in asyncio.all_tasks(loop):
            task.cancel()

    def check(self) -> None:
        """Between trials: an interrupt that was swallowed somewhere still ends the run here."""
        if self.count:
            raise KeyboardInterrupt("signal received earlier")

    def __enter__(self):
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may install handlers; the embedding program owns signals then
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class TuningRun:
    """One execution of a playbook. Trials are keyed by (step, role, repeat) so --resume can skip finished ones."""

    def __init__(self, playbook: Playbook, options: RunOptions, *, runtime_factory: Callable[..., Any] | None = None,
                 report: Reporter = print):
        self.playbook = apply_overrides(playbook, options)
        self.options = options
        self.engine: Engine = get_engine(self.playbook.engine.kind)
        self.secrets = secret_values(_try_resolve(self.playbook.engine.env)) + referenced_values(
            [self.playbook.text, dict(self.playbook.engine.env),
             [str(change.value) for step in self.playbook.steps for change in step.changes]])
        # Console lines carry engine errors (a log line may echo an env value): redacted like the archive.
        self.report = lambda line: report(redact_text(line, self.secrets))
        if runtime_factory is None:
            from llmplay.runtime import make_runtime
            runtime_factory = make_runtime
        self.runtime_factory = runtime_factory
        self.archive: RunArchive | None = None
        self.done: dict[tuple[str, str, int], TrialRecord] = {}
        self.trial_counter = 0
        self.verdicts: list[StepVerdict] = []
        self._signals: _Signals | None = None

    # ---------------------------------------------------------------- archive plumbing
    def _open_archive(self) -> RunArchive:
        if self.options.resume:
            archive = RunArchive.open(self.options.resume, secrets=self.secrets)
            for trial in archive.trials():
                if trial.status != TRIAL_INTERRUPTED:  # an interrupted trial is measured again
                    self.done[(trial.step or "", trial.role, trial.repeat)] = trial
                self.trial_counter = max(self.trial_counter, int(trial.trial_id.lstrip("t") or 0))
            self.report(f"resuming {archive.run_dir}: {len(self.done)} trial(s) already archived")
            return archive
        env = describe_environment(self.playbook, started_utc=_utc_now())
        archive = RunArchive.create(self.options.archive_root, self.playbook, overrides=self.options.overrides(),
                                    environment=env, secrets=self.secrets)
        self.report(f"archive: {archive.run_dir}")
        return archive

    def _config_record(self, config: Config) -> ConfigRecord:
        spec = config.engine
        return ConfigRecord(config_id=config.label, engine=redact(to_plain(spec), self.secrets),
                            workload=to_plain(config.workload),
                            command=tuple(self.engine.command(spec)),
                            docker_command=format_argv(docker_run_argv(spec, self.engine)))

    # ---------------------------------------------------------------- trials
    def _trial(self, config: Config, step: str | None, role: str, repeat: int) -> tuple[TrialRecord, TrialSample | None]:
        key = (step or "", role, repeat)
        if key in self.done:
            trial = self.done[key]
            return trial, self._sample_of(trial, config)
        if self._signals is not None:
            self._signals.check()
        self.trial_counter += 1
        trial_id = f"t{self.trial_counter:03d}"
        try:
            trial, records, telemetry, log = run_trial(self.playbook, config, self.engine, self.runtime_factory,
                                                       trial_id=trial_id, step=step, role=role, repeat=repeat,
                                                       run_id=self.archive.run_id, progress=self.options.progress)
        except TrialInterrupted as stopped:
            self.archive.write_trial(stopped.trial, stopped.records, None, stopped.log)
            raise KeyboardInterrupt("interrupted mid-trial") from None
        self.archive.write_trial(trial, records, telemetry, log)
        self.report(_trial_line(trial))
        if self.playbook.trials.cooldown_s:
            time.sleep(self.playbook.trials.cooldown_s)
        return trial, (self._sample(trial, records, config) if trial.status == TRIAL_OK else None)

    def _sample_of(self, trial: TrialRecord, config: Config) -> TrialSample | None:
        if trial.status != TRIAL_OK:
            return None
        return self._sample(trial, self.archive.load_records(trial.trial_id), config)

    def _sample(self, trial: TrialRecord, records: pd.DataFrame | None, config: Config) -> TrialSample | None:
        if records is None or not len(records):
            return None
        return sample_from_records(records, trial.summary.get("duration_s", 0.0), trial.summary,
                                   self.playbook.goals.slo_s, price_per_hour(self.playbook, config))

    def _run_into(self, target: _Measured, step: str | None, role: str, repeat: int) -> None:
        trial, sample = self._trial(target.config, step, role, repeat)
        target.trial_ids.append(trial.trial_id)
        if sample is None:
            target.failed += 1
        else:
            target.samples.append(sample)
        if trial.status == TRIAL_FAILED and self.playbook.trials.on_failure == "stop":
            raise _StopRun(f"trial {trial.trial_id} failed and on_failure is stop: {trial.error}")

    def _measure_pair(self, reference: _Measured, cand: _Measured, step: Step) -> None:
        """A B A B ... (or A A B B); in sequential mode, more pairs until the verdict is no longer inconclusive."""
        trials = self.playbook.trials
        pairs = [(reference, "baseline"), (cand, "candidate")]
        if trials.interleave:
            schedule = [(m, role, r) for r in range(trials.repeats) for m, role in pairs]
        else:
            schedule = [(m, role, r) for m, role in pairs for r in range(trials.repeats)]
        for measured, role, rep in schedule:
            self._run_into(measured, step.name, role, rep)
        rep = trials.repeats
        while trials.sequential and rep < trials.max_repeats:
            decision = decide_step(reference.samples, cand.samples, self.playbook.goals, trials,
                                   seed=self.playbook.workload.seed)
            if decision.verdict != "inconclusive":
                break
            for measured, role in pairs:
                self._run_into(measured, step.name, role, rep)
            rep += 1

    def _baseline_only(self, best: _Measured) -> None:
        for rep in range(self.playbook.trials.repeats):
            self._run_into(best, None, "baseline", rep)

    def _collect_orphans(self) -> None:
        """Containers whose llmplay process died (kill -9, a crashed host session) would hold GPUs forever."""
        if self.playbook.runtime.kind != "docker":
            return
        try:
            from llmplay.runtime.docker import gc
            removed = gc(orphans_only=True)
        except LlmplayError as exc:
            self.report(f"could not look for orphaned containers: {exc}")
            return
        for name in removed:
            self.report(f"removed orphaned container {name} left by an earlier llmplay run that died")

    # ---------------------------------------------------------------- the run
    def execute(self) -> RunOutcome:
        from llmplay.runtime import stop_all

        self.archive = self._open_archive()
        pb = self.playbook
        self._collect_orphans()
        best = _Measured(Config("baseline", pb.engine, pb.workload))
        self.archive.write_config(self._config_record(best.config))
        record_rows: list[dict[str, Any]] = []
        status, exit_code = "complete", EXIT_OK
        crash: Exception | None = None
        final = best
        try:
            with _Signals(stop_all) as self._signals:
                if not pb.steps:
                    self._baseline_only(best)
                    record_rows.append(_record_row(best, None))
                for index, step in enumerate(pb.steps, start=1):
                    cand_config, effects = apply_step(best.config, step)
                    cand_config = Config(step.name, cand_config.engine, cand_config.workload)
                    self.archive.write_config(self._config_record(cand_config))
                    cand = _Measured(cand_config)
                    reference = _Measured(best.config)
                    self.report(f"step {index}/{len(pb.steps)} {step.name}: "
                                + "; ".join(e.describe() for e in effects))
                    self._measure_pair(reference, cand, step)
                    decision = decide_step(reference.samples, cand.samples, pb.goals, pb.trials,
                                           failed_candidate_trials=cand.failed, seed=pb.workload.seed + index)
                    carried = (step.carry == "always" and decision.verdict != FAILED) or \
                              (step.carry == "if_kept" and decision.verdict == KEPT)
                    verdict = StepVerdict(
                        step=step.name, index=index, verdict=decision.verdict, reason=decision.reason,
                        changes=tuple(e.describe() for e in effects), bundle=step.bundle,
                        baseline_config=reference.config.label, candidate_config=cand_config.label,
                        objective=decision.objective, guards=decision.guards, deltas=decision.deltas,
                        trials_baseline=tuple(reference.trial_ids), trials_candidate=tuple(cand.trial_ids),
                        more_trials_needed=decision.more_trials_needed, carried=carried)
                    self.archive.write_verdict(verdict)
                    self.verdicts.append(verdict)
                    self.report(f"  -> {decision.verdict}: {decision.reason}")
                    if index == 1:
                        record_rows.append(_record_row(reference, None))
                    record_rows.append(_record_row(cand, verdict))
                    best = cand if carried else reference
                final = best
        except (KeyboardInterrupt, asyncio.CancelledError):
            status, exit_code = "interrupted", EXIT_INTERRUPTED
            self.report("interrupted: engines stopped; archive kept, continue with --resume")
        except _StopRun as exc:
            status, exit_code = "failed", EXIT_INFRA
            self.report(f"stopped: {exc}")
        except LlmplayError as exc:
            status, exit_code = "failed", exc.exit_code
            self.report(f"error: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug anywhere: engines are already stopped (their finally);
            # the archive must still say "failed", then the CLI prints its one line (traceback with --debug).
            status, exit_code, crash = "failed", EXIT_INFRA, exc
        final_summary = pooled_summary(final.samples)
        findings, diagnosis = _diagnose(pb, final, final_summary)
        kv_share = diagnosis.get("memory", {}).get("kv_share")
        if kv_share is not None:
            final_summary["memory.kv_share"] = kv_share
        gates = evaluate_gates(pb.goals.gates, final_summary)
        if status == "complete":
            exit_code = EXIT_OK if all(g.met for g in gates) else EXIT_GATES
        self.archive.finish(status=status, exit_code=exit_code, final_config_id=final.config.label, gates=gates,
                            findings=findings, diagnosis=diagnosis, tuning_record=record_rows)
        if crash is not None:
            raise crash
        return RunOutcome(self.archive.run_dir, exit_code, status, final.config.label, tuple(gates),
                          tuple(self.verdicts), tuple(record_rows), tuple(findings), diagnosis)


class _StopRun(Exception):
    pass


class TrialInterrupted(BaseException):
    """Carries a trial cut short by a signal out of the engine's context (which stops the engine) to the archive."""

    def __init__(self, trial: TrialRecord, records: pd.DataFrame | None, log: str):
        super().__init__(trial.error)
        self.trial, self.records, self.log = trial, records, log


def _try_resolve(env: Mapping[str, str]) -> dict[str, str]:
    try:
        return resolve_env(env)
    except LlmplayError:
        return dict(env)


def _record_row(measured: _Measured, verdict: StepVerdict | None) -> dict[str, Any]:
    summary = pooled_summary(measured.samples)
    row: dict[str, Any] = {"config_id": measured.config.label, "trials": list(measured.trial_ids),
                           "failed_trials": measured.failed,
                           "metrics": {m: summary[m] for m in RECORD_METRICS if m in summary}}
    if verdict is not None:
        row.update(step=verdict.step, verdict=verdict.verdict, reason=verdict.reason,
                   compared_with=verdict.baseline_config, changes=list(verdict.changes))
    return row


def _trial_line(trial: TrialRecord) -> str:
    role = f"{trial.step or 'baseline'}/{trial.role} #{trial.repeat + 1}"
    if trial.status != TRIAL_OK:
        return f"  trial {trial.trial_id} {role}: FAILED: {trial.error}"
    s = trial.summary
    return (f"  trial {trial.trial_id} {role}: {s.get('throughput.output_tok_s', 0):.1f} output tok/s, "
            f"TTFT p95 {s.get('ttft.p95', float('nan')) * 1000:.1f} ms, TPOT p95 "
            f"{s.get('tpot.p95', float('nan')) * 1000:.2f} ms, errors {s.get('errors.rate', 0):.1%}")


def telemetry_sources(runtime: Any, endpoint: Any, engine: Engine, spec: Any) -> list[Any]:
    """What can be sampled for this engine: its /metrics, its container or process, and its GPUs."""
    from llmplay.telemetry.nvml import NvmlSource
    from llmplay.telemetry.proc import DockerStatsSource, ProcessSource
    from llmplay.telemetry.prom import PrometheusSource

    sources: list[Any] = [PrometheusSource(endpoint.base_url, engine.metric_names)]
    container = getattr(runtime, "container", None)
    pid = getattr(runtime, "pid", None)
    if container is not None:
        sources.append(DockerStatsSource(container))
    elif pid:
        sources.append(ProcessSource(pid))
    if isinstance(spec.gpus, tuple):
        sources.append(NvmlSource([int(g) for g in spec.gpus if str(g).isdigit()] or None))
    elif spec.gpus:
        sources.append(NvmlSource(list(range(spec.gpus))))
    return sources


_MEMORY_CAUSE = re.compile(r"out of memory|insufficient memory|failed to allocate|cannot allocate|bad_alloc|"
                           r"\bOOM\b|OutOfMemory", re.I)
_ERROR_LINE = re.compile(r"(^|\s)(E|ERROR|FATAL|CRITICAL)\s|error|exception|fatal", re.I)
_LOG_STAMP = re.compile(r"^[\d.:T\-Z\[\]]+\s+")


def start_failure_cause(exc: EngineStartError) -> str:
    """One line for a trial that never became healthy: what happened plus the engine's own reason, taken from
    its log (the first out-of-memory line, else the last error line), so the cause is in the tuning record."""
    head = re.sub(r";?\s*last \d+ log lines:\s*$", "", str(exc).splitlines()[0])
    lines = [line.strip() for line in (exc.log_tail or "").splitlines() if line.strip()]
    cause = next((line for line in lines if _MEMORY_CAUSE.search(line)), None)
    if cause is None:
        cause = next((line for line in reversed(lines) if _ERROR_LINE.search(line)), None)
    return f"{head}: {_LOG_STAMP.sub('', cause)[:300]}" if cause else head


def run_trial(playbook: Playbook, config: Config, engine: Engine, runtime_factory: Callable[..., Any], *,
              trial_id: str, step: str | None, role: str, repeat: int, run_id: str, progress: bool = False
              ) -> tuple[TrialRecord, pd.DataFrame | None, pd.DataFrame | None, str]:
    """One fresh engine start, warm-up, measured load, telemetry; failures become a failed TrialRecord."""
    from llmplay.loadgen.send import LoadInterrupted, run_load_sync
    from llmplay.metrics import summarize
    from llmplay.telemetry.sampler import TelemetrySampler
    from llmplay.loadgen.tokenizer import make_tokenizer
    from llmplay.loadgen.workload import iter_requests

    started, t0 = _utc_now(), time.perf_counter()
    labels = {"llmplay.run": run_id, "llmplay.trial": trial_id, "llmplay.config": config.label}
    runtime = runtime_factory(playbook.runtime)
    spec = replace(config.engine, env=resolve_env(config.engine.env))
    base = dict(trial_id=trial_id, config_id=config.label, step=step, role=role, repeat=repeat, started_utc=started)
    log = ""
    try:
        with runtime.start(spec, engine, labels) as endpoint:
            try:
                sources = telemetry_sources(runtime, endpoint, engine, spec)
                with TelemetrySampler(sources) as sampler:
                    sampler_origin_ns = time.perf_counter_ns() - int(sampler.elapsed_s() * 1e9)
                    tokenizer = make_tokenizer("auto", endpoint.base_url, model_dir=spec.model_dir)
                    try:
                        requests = iter_requests(config.workload, tokenizer, endpoint.model)
                        if config.workload.num_requests is not None:
                            requests = tuple(requests)  # bounded: every prompt built before the clock starts
                        load = run_load_sync(endpoint.base_url, config.workload, requests, progress=progress,
                                             tokenizer=tokenizer)
                    finally:
                        getattr(tokenizer, "close", lambda: None)()
            except LoadInterrupted as exc:
                # A signal mid-load: keep what finished (and the engine's log, while the container exists),
                # then let the interrupt go on unwinding; --resume runs this trial again.
                partial = exc.partial
                measured = partial.measured()
                summary = dict(summarize(partial.records, partial.duration_s, playbook.goals.slo_s).as_dict())
                trial = TrialRecord(**base, status=TRIAL_INTERRUPTED, wall_s=time.perf_counter() - t0,
                                    summary=summary, engine_describe=dict(runtime.describe()),
                                    error=f"interrupted by a signal; {sum(r.ok for r in measured)} finished "
                                          "request(s) kept, requests in flight were not recorded")
                raise TrialInterrupted(trial, partial.to_dataframe(), runtime.logs()) from None
            except InfrastructureError as exc:
                # The engine was healthy, then failed us (e.g. froze while its tokenizer was asked): this
                # trial failed, the run goes on. Not EngineStartError's path: the container is still ours here.
                return (TrialRecord(**base, status=TRIAL_FAILED, wall_s=time.perf_counter() - t0, summary={},
                                    error=f"the engine failed during the trial: {str(exc).splitlines()[0]}",
                                    engine_describe=dict(runtime.describe())), None, None, runtime.logs())
            telemetry = sampler.result()
            describe = dict(runtime.describe())
            alive = getattr(runtime, "alive", lambda: True)()
            log = runtime.logs()
    except EngineStartError as exc:
        return (TrialRecord(**base, status=TRIAL_FAILED, wall_s=time.perf_counter() - t0, summary={},
                            error=start_failure_cause(exc), engine_describe={}), None, None,
                exc.log_tail or log)
    records = load.to_dataframe()
    summary = summarize(load.records, load.duration_s, playbook.goals.slo_s).as_dict()
    summary["duration_s"] = load.duration_s
    # Telemetry of the measured window only, like the load metrics: warm-up and engine start excluded.
    summary.update(telemetry.summary(start_s=max(0.0, (load.start_ns - sampler_origin_ns) / 1e9)))
    price = price_per_hour(playbook, config)
    if price > 0 and summary.get("throughput.output_tok_s"):
        summary["cost.usd_per_1m_tokens"] = price / (summary["throughput.output_tok_s"] * 3600) * 1e6
    notes = tuple(telemetry.notes) + (f"tokenizer: {load.tokenizer}",)
    error = None
    status = TRIAL_OK
    if not alive:
        status, error = TRIAL_FAILED, "the engine exited during the load"
    elif summary.get("requests.completed", 0) == 0:
        status, error = TRIAL_FAILED, f"no request completed ({summary.get('errors.count', 0):.0f} errors)"
    trial = TrialRecord(**base, status=status, wall_s=time.perf_counter() - t0, summary=summary,
                        engine_describe=describe, error=error, notes=notes)
    return trial, records, telemetry.to_frame(), log


def _diagnose(playbook: Playbook, final: _Measured, summary: Mapping[str, float]) -> tuple[list, dict]:
    try:
        from llmplay.tuning.diagnose.from_trials import diagnose_run
    except ImportError:
        return [], {}
    return diagnose_run(playbook, final.config, final.samples, summary)


def run_playbook(playbook: Playbook, options: RunOptions, *, publish: Callable[[Path], Any] | None = None,
                 **kwargs: Any) -> RunOutcome:
    """Run the playbook; `publish` (the report renderer, passed in by the command) runs on the finished archive."""
    outcome = TuningRun(playbook, options, **kwargs).execute()
    if publish is not None:
        publish(outcome.run_dir)
    return outcome
