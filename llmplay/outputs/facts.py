"""What the CI outputs say, read from archived runs only: a run's gates, verdicts and final configuration, and a
comparison's judged metrics, as one `Section` per JUnit test suite, summary heading and labelled metric set."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmplay.archive.layout import REPORT_FILE
from llmplay.archive.model import TRIAL_OK, ConfigRecord, EngineFacts, GateResult, StepVerdict, TrialRecord, TuningRow
from llmplay.archive.reader import ArchivedRun
from llmplay.compare import Comparison


@dataclass(frozen=True)
class RunFacts:
    """One archived run as the CI outputs quote it."""

    run_dir: Path
    run_id: str
    playbook: str
    playbook_version: str
    status: str
    started_utc: str
    host: str
    hardware: str  # "CPU only" or the GPU
    llmplay_version: str
    engine: EngineFacts
    final_config: str
    config: ConfigRecord | None  # the final configuration's engine and command (None: not archived)
    figures: Mapping[str, float]  # the final configuration's pooled figures, as its tuning-record row shows them
    per_trial: Mapping[str, tuple[float, ...]]  # each of those figures trial by trial, over the row's trials
    # Each figure trial by trial over the trials the gates were judged on: the final configuration's last
    # measurement (the last step's candidate when it was kept, else the configuration it was compared with).
    gate_per_trial: Mapping[str, tuple[float, ...]]
    gates: tuple[GateResult, ...]
    verdicts: tuple[StepVerdict, ...]
    confidence: float  # trials.confidence: the level of every interval of the run
    report: Path | None  # report.html, when it was rendered

    @property
    def kept(self) -> tuple[StepVerdict, ...]:
        return tuple(v for v in self.verdicts if v.carried)


@dataclass(frozen=True)
class Section:
    """What one command judged: a run's gates and steps (`run`), or a run against an earlier one (`retest`,
    `compare`, `history --check`), with the exit code the command gives for it."""

    command: str  # "run" | "retest" | "compare" | "history --check"
    run: RunFacts  # the run whose figures are reported: the run itself, or the newer one of a comparison
    exit_code: int
    comparison: Comparison | None = None
    reference: RunFacts | None = None  # the earlier run (A) of a comparison
    # Failures the comparison's table does not hold, as (test name, message): changed greedy outputs on a retest.
    failures: tuple[tuple[str, str], ...] = ()
    # Why nothing could be judged (an infrastructure outcome, exit 1): the newest run measured none of a goal.
    error: str | None = None
    # `history --check` with no run newer than the reference: what it said (nothing judged, nothing failed).
    nothing_newer: str | None = None
    extra_links: tuple[tuple[str, Path], ...] = ()  # (what, path): a comparison's HTML page

    @property
    def suite_name(self) -> str:
        return f"llmplay {self.command} {self.run.playbook}"


def _final_row(archive: ArchivedRun, final: str) -> TuningRow | None:
    rows = archive.tuning_record() or archive.rebuilt_record()
    return next((r for r in rows if r.config_id == final), None)


def _per_trial(trials: Sequence[TrialRecord], ids: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Each figure of the ok trials among `ids`, trial by trial."""
    chosen = [t for t in trials if t.trial_id in set(ids) and t.status == TRIAL_OK]
    metrics = dict.fromkeys(m for t in chosen for m in t.summary)
    return {m: tuple(float(t.summary[m]) for t in chosen if m in t.summary) for m in metrics}


def _gate_trials(verdicts: Sequence[StepVerdict], row: TuningRow | None, final: Sequence[TrialRecord]) -> list[str]:
    last = verdicts[-1] if verdicts else None
    if last is not None:
        return list(last.trials_candidate if last.carried else last.trials_baseline)
    return list(row.trials) if row is not None else [t.trial_id for t in final]


def run_facts(run_dir: Path) -> RunFacts:
    """The archived run at `run_dir`, read through the archive reader (as the report reads it)."""
    archive = ArchivedRun.open(run_dir)
    info = archive.info
    final, final_trials = archive.final_trials()
    row = _final_row(archive, final)
    trials, verdicts = archive.trials(), archive.verdicts()
    report = Path(run_dir) / REPORT_FILE
    return RunFacts(
        run_dir=Path(run_dir),
        run_id=info.run_id,
        playbook=info.playbook.name,
        playbook_version=info.playbook.version,
        status=info.status,
        started_utc=info.environment.started_utc,
        host=info.environment.host or "",
        hardware=info.environment.gpu_label,
        llmplay_version=info.environment.llmplay_version or "",
        engine=archive.engine_facts(),
        final_config=final,
        config=next((c for c in archive.configs() if c.config_id == final), None),
        figures=dict(row.metrics) if row is not None else {},
        per_trial=_per_trial(trials, row.trials if row is not None else [t.trial_id for t in final_trials]),
        gate_per_trial=_per_trial(trials, _gate_trials(verdicts, row, final_trials)),
        gates=tuple(archive.gates()),
        verdicts=tuple(verdicts),
        confidence=archive.playbook_as_run().trials.confidence,
        report=report if report.is_file() else None,
    )


def run_section(run_dir: Path, exit_code: int, command: str = "run") -> Section:
    """`llmplay run` (or a retest that did not complete): the run's gates and step verdicts."""
    return Section(command, run_facts(run_dir), exit_code)


def comparison_section(
    command: str,
    comparison: Comparison,
    exit_code: int,
    *,
    failures: tuple[tuple[str, str], ...] = (),
    error: str | None = None,
    html: Path | None = None,
) -> Section:
    """`retest`, `compare` or `history --check`: run B judged against run A by A's playbook."""
    return Section(
        command,
        run_facts(Path(comparison.b.run_dir)),
        exit_code,
        comparison=comparison,
        reference=run_facts(Path(comparison.a.run_dir)),
        failures=failures,
        error=error,
        extra_links=(("comparison", html),) if html is not None else (),
    )
