"""`llmplay run` and `llmplay retest` between the CLI and the runner: options in, tuning record and gates out."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from llmplay.catalog import metric_info
from llmplay.errors import ArchiveError, PlaybookError
from llmplay.archive.model import GateResult
from llmplay.report import publish_report
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
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
    from llmplay.archive.store import archive_root
    from llmplay.playbook.load import load_playbook
    from llmplay.plan import build_plan
    from llmplay.commands.plan import render_plan

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
    outcome = run_playbook(playbook, options, publish=publish_report, report=lambda line: console.print(line, markup=False))
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
        console.print(f"memory ({memory.get('device', 'gpu')}): weights {_bytes(memory['weights_bytes'])}, "
                      f"KV cache {_bytes(memory['kv_bytes'])} ({memory['tokens_in_flight']:.0f} tokens in flight x "
                      f"{memory['kv_bytes_per_token']:.0f} B), other {_bytes(memory.get('other_bytes'))}, "
                      f"peak {_bytes(memory.get('peak_bytes'))}, KV share {share}", markup=False)
    roofline = diagnosis.get("roofline")
    if roofline and roofline.get("achieved_over_floor") is not None:
        console.print(f"decode roofline: floor {roofline['floor_s'] * 1000:.2f} ms/token ({roofline['bandwidth_source']}), "
                      f"achieved {roofline['achieved_tpot_s'] * 1000:.2f} ms = {roofline['achieved_over_floor']:.1f}x the floor",
                      markup=False)
    for note in diagnosis.get("notes", []):
        console.print(f"note: {note}", markup=False)
    for finding in findings:
        suggestion = f" -> {finding['suggestion']}" if finding.get("suggestion") else ""
        console.print(f"finding [{finding['severity']}] {finding['checklist_ref']} {finding['title']}: "
                      f"{finding['evidence']}{suggestion}", markup=False)


def print_gates(console: Console, gates: Sequence[GateResult]) -> None:
    if not gates:
        console.print("gates: none declared")
        return
    for gate in gates:
        state = "not measured" if gate.met is None else ("met" if gate.met else "FAILED")
        margin = f" (margin {gate.margin:+.0%})" if gate.margin is not None else ""
        console.print(f"gate {gate.gate}: observed {_fmt(gate.metric, gate.observed)} -> {state}{margin}", markup=False)


def final_playbook_of(run_dir: Path, playbook_file: Path | None = None):
    """The archived run's final configuration as a step-less playbook: the baseline with every carried step applied."""
    from dataclasses import replace

    from llmplay.playbook.load import load_playbook
    from llmplay.spec import Config, apply_step

    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ArchiveError(f"{run_dir}: no manifest.json; expected a run directory made by llmplay run")
    manifest = json.loads(manifest_path.read_text())
    playbook = load_playbook(playbook_file or _playbook_path_of(run_dir))
    if playbook.sha256 != manifest["playbook"]["sha256"]:
        raise ArchiveError(f"{playbook.path} changed since {run_dir} was run (sha256 differs); "
                           "restore it or re-run the playbook instead of re-testing")
    carried = [v["step"] for v in manifest.get("verdicts", []) if v.get("carried")]
    config = Config("baseline", playbook.engine, playbook.workload)
    for step in playbook.steps:
        if step.name in carried:
            config, _ = apply_step(config, step)
    return replace(playbook, engine=config.engine, workload=config.workload, steps=()), manifest


def retest_command(run_dir: Path, *, image: str | None, archive_dir: str | None, repeats: int | None,
                   duration: str | None, html: Path | None = None) -> int:
    """Re-run the archived final configuration (optionally on a new image) and compare; 4 on regression."""
    from llmplay.archive.store import archive_root
    from llmplay.compare import compare_runs, format_comparison_table, render_comparison_html

    playbook, manifest = final_playbook_of(run_dir)
    console = _console()
    console.print(f"re-testing {run_dir} final configuration '{manifest.get('final_config_id')}'"
                  + (f" on image {image}" if image else ""), markup=False)
    repeats = repeats or int(manifest.get("overrides", {}).get("repeats") or playbook.trials.repeats)
    options = RunOptions(archive_root=archive_root(archive_dir), repeats=repeats,
                         duration_s=_duration_option("duration", duration), image=image, progress=sys.stderr.isatty())
    outcome = run_playbook(playbook, options, publish=publish_report, report=lambda line: console.print(line, markup=False))
    print_gates(console, outcome.gates)
    if outcome.status != "complete":
        console.print(f"re-test did not complete ({outcome.status}); archive {outcome.run_dir}", markup=False)
        return outcome.exit_code or 1
    comparison = compare_runs(run_dir, outcome.run_dir)
    console.print(format_comparison_table(comparison), markup=False)
    if html is not None:
        render_comparison_html(comparison, html)
    if comparison.has_regression:
        console.print(f"REGRESSION against {run_dir}; new run {outcome.run_dir}", markup=False)
        return 4
    console.print(f"no regression against {run_dir}; new run {outcome.run_dir}", markup=False)
    return 0
