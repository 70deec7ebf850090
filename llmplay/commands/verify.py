"""`llmplay verify`: recompute every archived file's sha256 against the run's manifest."""

from __future__ import annotations

from pathlib import Path

import click

from llmplay.archive.verify import verify
from llmplay.errors import ExitCode


def verify_command(run_dir: Path) -> int:
    """One line per problem on stderr and ExitCode.INFRA, or "ok"."""
    problems = verify(run_dir)
    for problem in problems:
        click.echo(f"{run_dir}: {problem}", err=True)
    if problems:
        click.echo(f"{run_dir}: FAILED verification ({len(problems)} problem(s))", err=True)
        return ExitCode.INFRA
    click.echo(f"{run_dir}: ok")
    return ExitCode.OK
