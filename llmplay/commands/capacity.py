"""`llmplay capacity`: search the baseline configuration's capacity under goals.slo and print the boundary table."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llmplay.archive.capacity import SLO_LABELS, CapacityResult
from llmplay.archive.listing import archive_root
from llmplay.archive.reader import ArchivedRun
from llmplay.catalog import fmt_full
from llmplay.commands.run import stdout_console
from llmplay.errors import ExitCode
from llmplay.history.site import publish_run
from llmplay.playbook.load import load_playbook
from llmplay.playbook.source import located_error
from llmplay.tuning.run import RunOptions, run_playbook


def capacity_command(
    file: Path, *, archive_dir: str | None, repeats: int | None, allow_outside_extends: bool = False
) -> int:
    """Search the baseline's capacity (one search per repeat, each on one engine start), archive it, print it."""
    playbook = load_playbook(
        file, allow_outside_extends=allow_outside_extends, on_this_host=True, archive_root=archive_root(archive_dir)
    )
    if playbook.goals.capacity is None:
        raise located_error(
            str(file),
            1,
            "goals.capacity: not found; expected e.g. goals: {slo: {ttft: 2s}, capacity: {search: rate, "
            "bounds: [0.5, 16]}}",
        )
    # The baseline only: a step is a capacity A/B, which `llmplay run` with a capacity objective makes.
    playbook = replace(playbook, steps=())
    console = stdout_console()
    options = RunOptions(
        archive_root=archive_root(archive_dir),
        repeats=repeats or 1,
        progress=sys.stderr.isatty(),
        capacity=True,
    )
    outcome = run_playbook(
        playbook, options, publish=publish_run, report=lambda line: console.print(line, markup=False)
    )
    archived = ArchivedRun.open(outcome.run_dir)
    rows = []
    for trial in archived.trials():
        found = archived.capacity_search(trial.trial_id)
        if found is not None:
            rows.append((trial.config_id, trial.repeat, found, dict(trial.summary)))
    print_boundaries(console, rows)
    console.print(f"archive {outcome.run_dir}; report: {outcome.run_dir / 'report.html'}", markup=False)
    if outcome.status != "complete" or not rows:
        return outcome.exit_code if outcome.exit_code != ExitCode.OK else ExitCode.INFRA
    return ExitCode.OK


def boundary_table(rows: Sequence[tuple[str, int, CapacityResult, dict[str, float]]]) -> Table:
    """One row per search: status, the capacity with its bracket and CI, what bound it, what it cost."""
    table = Table(title="Capacity under SLO")
    for column in ("configuration", "#", "status", "capacity", "boundary CI", "feasible max", "infeasible min"):
        table.add_column(column, justify="right" if column not in ("configuration", "status") else "left")
    for column in ("binding SLO", "probes", "engine s", "output tok/s at SLO", "$/1M tok at SLO"):
        table.add_column(column, justify="right")
    for config, repeat, result, summary in rows:
        u = result.unit
        binding = (
            f"{SLO_LABELS.get(result.binding, result.binding)} "
            f"(P{result.target * 100:g} {fmt_full('ttft.p95', result.binding_value_s)})"
            if result.binding
            else "none broke"
        )
        ci = "—" if result.ci[0] is None else f"[{result.ci[0]:.3g}, {result.ci[1]:.3g}]"
        cost = summary.get("cost.usd_per_1m_tokens_at_slo")
        table.add_row(
            config,
            str(repeat + 1),
            result.status,
            "—" if result.capacity is None else f"{'≥ ' if result.censored else ''}{result.capacity:.3g} {u}",
            ci,
            "—" if result.feasible_max is None else f"{result.feasible_max:.3g}",
            "—" if result.infeasible_min is None else f"{result.infeasible_min:.3g}",
            binding,
            str(result.runs),
            f"{result.engine_s:.0f}",
            "—" if result.output_tok_s is None or result.capacity is None else f"{result.output_tok_s:.1f}",
            "—" if cost is None else fmt_full("cost.usd_per_1m_tokens_at_slo", cost),
        )
    return table


def print_boundaries(console: Console, rows: Sequence[tuple[str, int, CapacityResult, dict[str, float]]]) -> None:
    """The boundary table, then per search its binding constraint in words, its notes and how probes were ordered."""
    console.print(boundary_table(rows))
    for config, repeat, result, _ in rows:
        target = f"{result.target:.0%} of requests within " + ", ".join(
            f"{SLO_LABELS.get(k, k)} {fmt_full('ttft.p95', v)}" for k, v in result.slo_s.items()
        )
        console.print(f"{config} #{repeat + 1}: {result.boundary_text()}; target {target}", markup=False)
        console.print(f"  binding: {result.binding_sentence()}", markup=False)
        for note in result.notes:
            console.print(f"  note: {note}", markup=False)
        console.print(f"  probes: {result.order}", markup=False)
