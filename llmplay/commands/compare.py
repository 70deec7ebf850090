"""`llmplay compare`: the final configurations of two archived runs side by side, with confidence intervals."""

from __future__ import annotations

from pathlib import Path

import click

from llmplay.compare import compare_runs, format_comparison_table, render_comparison_html
from llmplay.errors import ExitCode


def compare_command(run_a: Path, run_b: Path, *, html: Path | None) -> int:
    """Print the comparison (and write it as HTML if asked); ExitCode.REGRESSION when B regressed against A."""
    comparison = compare_runs(run_a, run_b)
    click.echo(format_comparison_table(comparison))
    if html is not None:
        click.echo(f"comparison: {render_comparison_html(comparison, html)}")
    return ExitCode.REGRESSION if comparison.has_regression else ExitCode.OK
