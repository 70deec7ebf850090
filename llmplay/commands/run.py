"""`llmplay run`: load the playbook, run it (or print its plan), print the tuning record, gates and diagnosis."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llmplay.archive.listing import archive_root
from llmplay.archive.model import Diagnosis, Finding, GateResult, TuningRow
from llmplay.archive.signing import public_key_from
from llmplay.archive.verdicts import error_rates_text
from llmplay.catalog import (
    CAPACITY_METRICS,
    TUNING_RECORD_METRICS,
    absence_reason,
    figure,
    fmt_bytes,
    fmt_full,
    label_of,
    measured,
    thin_warning,
)
from llmplay.commands.plan import render_plan
from llmplay.errors import ExitCode, PlaybookError
from llmplay.history.site import publish_run
from llmplay.jsonvalue import as_list, as_text
from llmplay.outputs.files import NO_OUTPUTS, OutputFiles
from llmplay.plan import build_plan
from llmplay.playbook.convert import phase_too_long
from llmplay.playbook.load import load_playbook
from llmplay.tuning.resume import resumed_overrides, resumed_playbook
from llmplay.tuning.run import RunOptions, RunOutcome, apply_overrides, run_playbook
from llmplay.units import UnitError, parse_duration_s


def stdout_console() -> Console:
    """The console commands print to: soft-wrapped, and wide enough for the tables in pipes and CI logs."""
    return Console(stderr=False, highlight=False, soft_wrap=True, width=160 if not sys.stdout.isatty() else None)


def duration_option_s(name: str, value: str | None) -> float | None:
    """A --duration/--warmup value ("10s", "2m", or bare seconds) in seconds; None when not given."""
    if value is None:
        return None
    try:
        seconds = parse_duration_s(float(value) if value.replace(".", "", 1).isdigit() else value)
    except UnitError as exc:
        raise PlaybookError(f"--{name}: {exc}") from None
    if name == "duration" and seconds <= 0:  # the rule workload.duration obeys: a window of 0 s measures nothing
        raise PlaybookError(f"--duration: found {value!r}; expected a length above zero, like 10s")
    if why := phase_too_long(name, repr(value), seconds):  # and the limit workload.duration and warmup obey
        raise PlaybookError(f"--{name}: {why}")
    return seconds


def run_command(
    file: Path | None,
    *,
    archive_dir: str | None,
    resume: Path | None,
    dry_run: bool,
    only: Sequence[str],
    repeats: int | None,
    duration: str | None,
    warmup: str | None,
    allow_outside_extends: bool = False,
    image: str | None = None,
    ray_address: str | None = None,
    outputs: OutputFiles = NO_OUTPUTS,
    unverified: bool = False,
    public_key: Path | None = None,
) -> int:
    """Run the playbook (or, with dry_run, print its plan) and print the outcome; the run's exit code. `outputs`:
    the CI files to write from the finished archive (a dry run writes none). A resumed archive must verify first
    (with `public_key`, or $LLMPLAY_PUBLIC_KEY, when configured), unless `unverified`."""
    console = stdout_console()
    overrides: dict[str, object] = {
        "repeats": repeats,
        "duration_s": duration_option_s("duration", duration),
        "warmup_s": duration_option_s("warmup", warmup),
        "only": list(only) or None,
        "image": image,
        "ray": ray_address,
    }
    resume_signs = True
    if resume is not None:
        # The run goes on as it was archived, once it verifies: its playbook copy and overrides, never a file edited
        # since, and signed only when its earlier trials were signed by the same key (archive.trust).
        resumed = resumed_playbook(
            resume,
            file,
            allow_outside_extends=allow_outside_extends,
            allow_unverified=unverified,
            public_key=public_key_from(public_key),
        )
        if resumed.trust is not None and resumed.trust.warning:
            console.print(resumed.trust.warning, markup=False)
        resume_signs = resumed.trust is None or resumed.trust.sign
        if resumed.note:
            console.print(resumed.note, markup=False)
        playbook, overrides = resumed.playbook, resumed_overrides(resume, resumed.overrides, overrides)
    elif unverified or public_key is not None:
        raise PlaybookError("--unverified and --public-key: only with --resume RUN_DIR (a new run is measured here)")
    elif file is None:
        raise PlaybookError("llmplay run: expected a playbook FILE (or --resume RUN_DIR)")
    else:
        # A dry run starts nothing, and a --ray run mounts the nodes' model_dir: neither needs this host's.
        on_this_host = not dry_run and ray_address is None
        playbook = load_playbook(
            file,
            allow_outside_extends=allow_outside_extends,
            on_this_host=on_this_host,
            archive_root=archive_root(archive_dir),
        )
    # Built (and so checked) before --dry-run returns: a dry run refuses a bad --duration, --warmup or --only
    # exactly as the run would, and prints the plan the run would follow.
    options = RunOptions(
        archive_root=archive_root(archive_dir),
        repeats=_whole(overrides["repeats"]),
        duration_s=_number(overrides["duration_s"]),
        warmup_s=_number(overrides["warmup_s"]),
        only=tuple(str(step) for step in as_list(overrides["only"])),
        resume=resume,
        progress=sys.stderr.isatty(),
        image=as_text(overrides["image"]),
        ray_address=as_text(overrides["ray"]),
        capacity=bool(overrides.get("capacity")),
        resume_signs=resume_signs,
    )
    if dry_run:
        console.print(render_plan(build_plan(apply_overrides(playbook, options))), markup=False)
        return ExitCode.OK
    outcome = run_playbook(
        playbook, options, publish=publish_run, report=lambda line: console.print(line, markup=False)
    )
    print_summary_guarded(console, outcome)
    from llmplay.commands.ci_outputs import write_guarded  # deferred: the outputs read the archive with pandas
    from llmplay.outputs.facts import run_section

    return write_guarded(outputs, lambda: [run_section(outcome.run_dir, outcome.exit_code)], outcome.exit_code)


def print_summary_guarded(console: Console, outcome: RunOutcome) -> None:
    """print_outcome, for a finished archive: a bug in printing costs the summary, never the run's exit code."""
    try:
        print_outcome(console, outcome)
    except Exception as exc:
        sys.stderr.write(
            f"warning: the run's summary could not be printed ({type(exc).__name__}: {exc}); the archive is "
            f"finished, see `llmplay report {outcome.run_dir}`\n"
        )


def print_outcome(console: Console, outcome: RunOutcome) -> None:
    """The tuning record, each step's verdict, the gates and the diagnosis, as the run's last lines."""
    table = Table(title="Tuning record", show_lines=False)
    table.add_column("configuration")
    table.add_column("verdict")
    # A run of capacity searches shows their figures too (capacity, throughput and cost at the SLO).
    shown = [
        *TUNING_RECORD_METRICS,
        *(m for m in CAPACITY_METRICS if any(m in row.metrics for row in outcome.tuning_record)),
    ]
    for metric in shown:
        table.add_column(label_of(metric), justify="right")
    notes: list[str] = []
    for row in outcome.tuning_record:
        figures = record_figures(row)
        cells = []
        for metric in shown:
            value = measured(figures.get(metric))
            thin = thin_warning(metric, figures)
            cells.append("not measured" if value is None else fmt_full(metric, value) + (" *" if thin else ""))
        table.add_row(row.config_id, row.verdict or "baseline", *cells)
        notes.extend(record_notes(row, figures))
    console.print(table)
    for note in notes:
        console.print(note, markup=False)
    for verdict in outcome.verdicts:
        console.print(
            f"step {verdict.index} {verdict.step} [{', '.join(verdict.changes)}]: {verdict.verdict} — {verdict.reason}",
            markup=False,
        )
    if outcome.verdicts:
        trials = outcome.trials
        console.print(
            "verdicts: "
            + error_rates_text([v.verdict for v in outcome.verdicts], trials.confidence, trials.sequential),
            markup=False,
        )
    console.print(f"final configuration: {outcome.final_config_id}", markup=False)
    print_gates(console, outcome.gates)
    print_diagnosis(console, outcome.diagnosis, outcome.findings)
    console.print(f"status {outcome.status}, exit {outcome.exit_code}; archive {outcome.run_dir}", markup=False)
    console.print(f"report: {outcome.run_dir / 'report.html'}", markup=False)


def _number(value: object) -> float | None:
    """An override's number as given or archived (JSON): a duration in seconds, a count."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def record_figures(row: TuningRow) -> dict[str, float]:
    """A tuning-record row's figures with the request counts its percentiles rest on."""
    return {**row.samples, **row.metrics}


def record_notes(row: TuningRow, figures: Mapping[str, float]) -> list[str]:
    """The lines under the tuning record for one row: why its absent figures are absent, and which of its
    percentiles (marked *) rest on too few requests."""
    config = row.config_id
    absent = [m for m in TUNING_RECORD_METRICS if measured(figures.get(m)) is None]
    trials, failed = len(row.trials), row.failed_trials
    lines = []
    if absent and len(absent) == len(TUNING_RECORD_METRICS) and trials and failed >= trials:
        lines.append(f"  {config}: not measured (all {trials} trial(s) failed)")
    elif absent:
        by_reason: dict[str, list[str]] = {}
        for metric in absent:
            by_reason.setdefault(absence_reason(metric), []).append(label_of(metric))
        lines.append(
            f"  {config}: "
            + "; ".join(f"{', '.join(labels)} not measured ({reason})" for reason, labels in by_reason.items())
        )
    thin = [warning for m in TUNING_RECORD_METRICS if (warning := thin_warning(m, figures)) is not None]
    if thin:
        lines.append(f"  {config}: * {'; '.join(thin)}")
    return lines


def _bytes(value: object) -> str:
    number = measured(value)
    return "not measured" if number is None else fmt_bytes(number)


def _peak_absence(device: object) -> str:
    return absence_reason("memory.peak_bytes") if device != "cpu" else "the engine's process memory was not sampled"


def print_diagnosis(console: Console, diagnosis: Diagnosis, findings: Sequence[Finding]) -> None:
    """The checklist's memory breakdown, decode roofline and findings for the final configuration; a figure the
    diagnosis lacks is "not measured", never a crash."""
    memory = diagnosis.memory
    if memory is not None:
        share, tokens, per_token = memory.kv_share, memory.tokens_in_flight, memory.kv_bytes_per_token
        in_flight = (
            f" ({tokens:.0f} tokens in flight x {per_token:.0f} B)"
            if tokens is not None and per_token is not None
            else ""
        )
        console.print(
            f"memory ({memory.device}): weights {_bytes(memory.weights_bytes)}, "
            f"KV cache {_bytes(memory.kv_bytes)}{in_flight}, other {_bytes(memory.other_bytes)}, "
            f"peak {_bytes(memory.peak_bytes)}"
            + (f" ({_peak_absence(memory.device)})" if memory.peak_bytes is None else "")
            + f", KV share {'not measured' if share is None else f'{share:.0%}'}",
            markup=False,
        )
    roofline = diagnosis.roofline
    if roofline is not None:
        achieved, ratio = roofline.achieved_tpot_s, roofline.achieved_over_floor
        result = (
            f"achieved {achieved * 1000:.2f} ms = {ratio:.1f}x the floor"
            if achieved is not None and ratio is not None
            else f"achieved not measured ({absence_reason('tpot.p50')})"
        )
        console.print(
            f"decode roofline: floor {roofline.floor_s * 1000:.2f} ms/token "
            f"({roofline.bandwidth_source or 'bandwidth source unknown'}), {result}",
            markup=False,
        )
    for note in diagnosis.notes:
        console.print(f"note: {note}", markup=False)
    for finding in findings:
        suggestion = f" -> {finding.suggestion}" if finding.suggestion else ""
        console.print(
            f"finding [{finding.severity or '?'}] {finding.checklist_ref} "
            f"{finding.title}: {finding.evidence or 'no evidence recorded'}{suggestion}",
            markup=False,
        )


def gate_line(gate: GateResult) -> str:
    """One gate: what was observed, met / FAILED / not met (not measured), and how thin its sample was."""
    observed = measured(gate.observed)
    if observed is None:
        # The gate's own note when the run gave one (why this run did not measure it), else the metric's reason.
        seen = f"not measured ({gate.note})" if gate.note else figure(gate.metric, {})
        return f"gate {gate.gate}: observed {seen} -> not met (not measured)"
    margin = measured(gate.margin)
    state = ("met" if gate.met else "FAILED") + (f" (margin {margin:+.0%})" if margin is not None else "")
    note = f" — {gate.note}" if gate.note else ""
    return f"gate {gate.gate}: observed {fmt_full(gate.metric, observed)} -> {state}{note}"


def print_gates(console: Console, gates: Sequence[GateResult]) -> None:
    if not gates:
        console.print("gates: none declared")
        return
    for gate in gates:
        console.print(gate_line(gate), markup=False)
