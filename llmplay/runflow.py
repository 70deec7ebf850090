"""`llmplay run` and `llmplay retest` between the CLI and the runner: options in, tuning record and gates out."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.table import Table

from llmplay.catalog import metric_info
from llmplay.errors import ArchiveError, PlaybookError
from llmplay.results import GateResult
from llmplay.runner import RunOptions, RunOutcome, run_playbook
from llmplay.units import UnitError, parse_duration_s

RECORD_COLUMNS = ("ttft.p50", "ttft.p95", "tpot.p95", "itl.p99", "e2el.p95", "throughput.output_tok_s",
                  "throughput.req_s", "goodput.req_s", "cost.usd_per_1m_tokens", "errors.rate")


def _console() -> Console:
    return Console(stderr=False, highlight=False, soft_wrap=True, width=160 if not sys.stdout.isatty() else None)


def _duration_option(name: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration_s(float(value) if value.replace(".", "", 1).isdigit() else value)
    except UnitError as exc:
        raise PlaybookError(f"--{name}: {exc}") from None


def _playbook_path_of(run_dir: Path) -> Path:
    manifest = run_dir / "manifest.json"
    if not manifest.is_file():
        raise ArchiveError(f"{run_dir}: no manifest.json; expected a run directory made by llmplay run")
    path = Path(json.loads(manifest.read_text())["playbook"]["path"])
    if not path.is_file():
        raise ArchiveError(f"{run_dir}: its playbook {path} no longer exists; pass the playbook FILE with --resume")
    return path


def run_command(file: Path | None, *, archive_dir: str | None, resume: Path | None, dry_run: bool,
                only: Sequence[str], repeats: int | None, duration: str | None, warmup: str | None,
                allow_outside_extends: bool = False, image: str | None = None) -> int:
    from llmplay.archive import archive_root
    from llmplay.playbook import load_playbook
    from llmplay.plan import build_plan
    from llmplay.planview import render_plan

    if file is None:
        if resume is None:
            raise PlaybookError("llmplay run: expected a playbook FILE (or --resume RUN_DIR)")
        file = _playbook_path_of(resume)
    playbook = load_playbook(file, allow_outside_extends=allow_outside_extends)
    console = _console()
    if dry_run:
        console.print(render_plan(build_plan(playbook)), markup=False)
        return 0
    options = RunOptions(archive_root=archive_root(archive_dir), repeats=repeats,
                         duration_s=_duration_option("duration", duration), warmup_s=_duration_option("warmup", warmup),
                         only=tuple(only), resume=resume, progress=sys.stderr.isatty(), image=image)
    outcome = run_playbook(playbook, options, report=lambda line: console.print(line, markup=False))
    print_outcome(console, outcome)
    return outcome.exit_code


def _fmt(metric: str, value: float | None) -> str:
    info = metric_info(metric)
    return info.format(value) if info else f"{value}"


def print_outcome(console: Console, outcome: RunOutcome) -> None:
    table = Table(title="Tuning record", show_lines=False)
    table.add_column("configuration")
    table.add_column("verdict")
    for metric in RECORD_COLUMNS:
        info = metric_info(metric)
        table.add_column(info.label if info else metric, justify="right")
    for row in outcome.tuning_record:
        metrics = row.get("metrics", {})
        table.add_row(row["config_id"], row.get("verdict", "baseline"), *(_fmt(m, metrics.get(m)) for m in RECORD_COLUMNS))
    console.print(table)
    for verdict in outcome.verdicts:
        console.print(f"step {verdict.index} {verdict.step} [{', '.join(verdict.changes)}]: {verdict.verdict} — "
                      f"{verdict.reason}", markup=False)
    console.print(f"final configuration: {outcome.final_config_id}", markup=False)
    print_gates(console, outcome.gates)
    console.print(f"status {outcome.status}, exit {outcome.exit_code}; archive {outcome.run_dir}", markup=False)
    console.print(f"report: {outcome.run_dir / 'report.html'}", markup=False)


def print_gates(console: Console, gates: Sequence[GateResult]) -> None:
    if not gates:
        console.print("gates: none declared")
        return
    for gate in gates:
        state = "not measured" if gate.met is None else ("met" if gate.met else "FAILED")
        margin = f" (margin {gate.margin:+.0%})" if gate.margin is not None else ""
        console.print(f"gate {gate.gate}: observed {_fmt(gate.metric, gate.observed)} -> {state}{margin}", markup=False)
