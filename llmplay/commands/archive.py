"""The archive commands of the CLI: report, compare, verify, ls (each parses, makes one core call, exits)."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from llmplay.cli import EXIT_INFRA, EXIT_OK, EXIT_REGRESSION, handles_errors

_RUN_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


@click.command()
@click.argument("run_dir", type=_RUN_DIR)
@handles_errors
def report(run_dir: Path) -> None:
    """Re-render RUN_DIR/report.html from the archive alone and print its path."""
    from llmplay.report import publish_report

    click.echo(str(publish_report(run_dir)))


@click.command()
@click.argument("run_a", type=_RUN_DIR)
@click.argument("run_b", type=_RUN_DIR)
@click.option("--html", "html", type=click.Path(dir_okay=False, path_type=Path), help="Also write the comparison as HTML.")
@click.option("--bootstrap", "n_boot", type=click.IntRange(100, 100_000), default=1000, show_default=True,
              help="Bootstrap resamples for the confidence intervals.")
@handles_errors
def compare(run_a: Path, run_b: Path, html: Path | None, n_boot: int) -> None:
    """Compare the final configurations of two runs; exit 4 when B regressed against A's playbook tolerances."""
    from llmplay.compare import compare_runs, format_comparison_table, render_comparison_html

    comparison = compare_runs(run_a, run_b, n_boot=n_boot)
    click.echo(format_comparison_table(comparison))
    if html is not None:
        click.echo(f"comparison: {render_comparison_html(comparison, html)}")
    sys.exit(EXIT_REGRESSION if comparison.has_regression else EXIT_OK)


@click.command()
@click.argument("run_dir", type=_RUN_DIR)
@handles_errors
def verify(run_dir: Path) -> None:
    """Recompute the sha256 of every archived file and check the manifest; exit 1 listing each problem."""
    from llmplay.archive.store import verify as verify_archive

    problems = verify_archive(run_dir)
    for problem in problems:
        click.echo(f"{run_dir}: {problem}", err=True)
    if problems:
        click.echo(f"{run_dir}: FAILED verification ({len(problems)} problem(s))", err=True)
        sys.exit(EXIT_INFRA)
    click.echo(f"{run_dir}: ok")


@click.command("ls")
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False),
              help="Archive root (default $LLMPLAY_ARCHIVE or ./reports).")
@handles_errors
def ls(archive_dir: str | None) -> None:
    """List archived runs, newest first: playbook, date, status, engine, GPU, gates met, path."""
    from rich.console import Console
    from rich.table import Table

    from llmplay.archive.store import archive_root, list_runs

    root = archive_root(archive_dir)
    rows = list_runs(root)
    if not rows:
        click.echo(f"no runs under {root}")
        return
    table = Table(title=f"runs under {root}")
    for column in ("playbook", "date", "status", "engine", "GPU", "gates met", "path"):
        table.add_column(column, overflow="fold", no_wrap=column in ("path", "date"))
    for r in rows:
        name = f"{r['playbook']} {r['version']}".strip() + (" (overridden)" if r.get("overridden") else "")
        table.add_row(name, r["date"], r["status"], r["engine"], r["gpu"], r["gates"], r["path"])
    Console(highlight=False, soft_wrap=False, width=200 if not sys.stdout.isatty() else None).print(table)


def register(cli: click.Group) -> None:
    """Add the archive commands to the top-level group (replacing any placeholder of the same name)."""
    for command in (report, compare, verify, ls):
        cli.commands.pop(command.name, None)
        cli.add_command(command)
