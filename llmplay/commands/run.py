"""`llmplay run`: load the playbook, run it (or print its plan), print the tuning record, gates and diagnosis."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from llmplay.archive.listing import archive_root
from llmplay.archive.model import GateResult
from llmplay.catalog import TUNING_RECORD_METRICS, metric_info
from llmplay.commands.plan import render_plan
from llmplay.errors import ArchiveError, ExitCode, PlaybookError
from llmplay.plan import build_plan
from llmplay.playbook.load import load_playbook
from llmplay.report import publish_report
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
from llmplay.units import UnitError, parse_duration_s


def stdout_console() -> Console:
    """The console commands print to: soft-wrapped, and wide enough for the tables in pipes and CI logs."""
    return Console(stderr=False, highlight=False, soft_wrap=True, width=160 if not sys.stdout.isatty() else None)


def duration_option_s(name: str, value: str | None) -> float | None:
    """A --duration/--warmup value ("10s", "2m", or bare seconds) in seconds; None when not given."""
    if value is None:
        return None
    try:
        return parse_duration_s(float(value) if value.replace(".", "", 1).isdigit() else value)
    except UnitError as exc:
        raise PlaybookError(f"--{name}: {exc}") from None


def read_manifest(run_dir: Path) -> dict[str, Any]:
    manifest = run_dir / "manifest.json"
    if not manifest.is_file():
        raise ArchiveError(f"{run_dir}: no manifest.json; expected a run directory made by llmplay run")
    return dict(json.loads(manifest.read_text()))


def playbook_path_of(run_dir: Path) -> Path:
    """The playbook file an archived run was made from, still on disk."""
    path = Path(read_manifest(run_dir)["playbook"]["path"])
    if not path.is_file():
        raise ArchiveError(f"{run_dir}: its playbook {path} no longer exists; pass the playbook FILE with --resume")
    return path


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
) -> int:
    """Run the playbook (or, with dry_run, print its plan) and print the outcome; the run's exit code."""
    if file is None:
        if resume is None:
            raise PlaybookError("llmplay run: expected a playbook FILE (or --resume RUN_DIR)")
        file = playbook_path_of(resume)
    playbook = load_playbook(file, allow_outside_extends=allow_outside_extends)
    console = stdout_console()
    if dry_run:
        console.print(render_plan(build_plan(playbook)), markup=False)
        return ExitCode.OK
    options = RunOptions(
        archive_root=archive_root(archive_dir),
        repeats=repeats,
        duration_s=duration_option_s("duration", duration),
        warmup_s=duration_option_s("warmup", warmup),
        only=tuple(only),
        resume=resume,
        progress=sys.stderr.isatty(),
        image=image,
    )
    outcome = run_playbook(
        playbook, options, publish=publish_report, report=lambda line: console.print(line, markup=False)
    )
    print_outcome(console, outcome)
    return outcome.exit_code


def _fmt(metric: str, value: float | None) -> str:
    info = metric_info(metric)
    return info.format(value) if info else f"{value}"


def print_outcome(console: Console, outcome: RunOutcome) -> None:
    table = Table(title="Tuning record", show_lines=False)
    table.add_column("configuration")
    table.add_column("verdict")
    for metric in TUNING_RECORD_METRICS:
        info = metric_info(metric)
        table.add_column(info.label if info else metric, justify="right")
    for row in outcome.tuning_record:
        metrics = row.get("metrics", {})
        table.add_row(
            row["config_id"], row.get("verdict", "baseline"), *(_fmt(m, metrics.get(m)) for m in TUNING_RECORD_METRICS)
        )
    console.print(table)
    for verdict in outcome.verdicts:
        console.print(
            f"step {verdict.index} {verdict.step} [{', '.join(verdict.changes)}]: {verdict.verdict} — {verdict.reason}",
            markup=False,
        )
    console.print(f"final configuration: {outcome.final_config_id}", markup=False)
    print_gates(console, outcome.gates)
    print_diagnosis(console, outcome.diagnosis, outcome.findings)
    console.print(f"status {outcome.status}, exit {outcome.exit_code}; archive {outcome.run_dir}", markup=False)
    console.print(f"report: {outcome.run_dir / 'report.html'}", markup=False)


def _bytes(value: float | None) -> str:
    if value is None:
        return "not measured"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def print_diagnosis(console: Console, diagnosis: Mapping[str, Any], findings: Sequence[Mapping[str, Any]]) -> None:
    """The checklist's memory breakdown, decode roofline and findings for the final configuration."""
    memory = diagnosis.get("memory")
    if memory:
        share = f"{memory['kv_share']:.0%}" if memory.get("kv_share") is not None else "not measured"
        console.print(
            f"memory ({memory.get('device', 'gpu')}): weights {_bytes(memory['weights_bytes'])}, "
            f"KV cache {_bytes(memory['kv_bytes'])} ({memory['tokens_in_flight']:.0f} tokens in flight x "
            f"{memory['kv_bytes_per_token']:.0f} B), other {_bytes(memory.get('other_bytes'))}, "
            f"peak {_bytes(memory.get('peak_bytes'))}, KV share {share}",
            markup=False,
        )
    roofline = diagnosis.get("roofline")
    if roofline and roofline.get("achieved_over_floor") is not None:
        console.print(
            f"decode roofline: floor {roofline['floor_s'] * 1000:.2f} ms/token ({roofline['bandwidth_source']}), "
            f"achieved {roofline['achieved_tpot_s'] * 1000:.2f} ms = {roofline['achieved_over_floor']:.1f}x the floor",
            markup=False,
        )
    for note in diagnosis.get("notes", []):
        console.print(f"note: {note}", markup=False)
    for finding in findings:
        suggestion = f" -> {finding['suggestion']}" if finding.get("suggestion") else ""
        console.print(
            f"finding [{finding['severity']}] {finding['checklist_ref']} {finding['title']}: "
            f"{finding['evidence']}{suggestion}",
            markup=False,
        )


def print_gates(console: Console, gates: Sequence[GateResult]) -> None:
    if not gates:
        console.print("gates: none declared")
        return
    for gate in gates:
        state = "not measured" if gate.met is None else ("met" if gate.met else "FAILED")
        margin = f" (margin {gate.margin:+.0%})" if gate.margin is not None else ""
        console.print(f"gate {gate.gate}: observed {_fmt(gate.metric, gate.observed)} -> {state}{margin}", markup=False)
