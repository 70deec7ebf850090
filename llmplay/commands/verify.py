"""`llmplay verify`: recompute every archived file's sha256 against the run's manifest, and check its signature."""

from __future__ import annotations

from pathlib import Path

import click

from llmplay.archive.signing import public_key_from
from llmplay.archive.verify import check
from llmplay.errors import ExitCode


def verify_command(run_dir: Path, *, public_key: Path | None = None) -> int:
    """One line per problem on stderr and ExitCode.INFRA, or "ok" with what the signature says."""
    result = check(run_dir, public_key_from(public_key))
    for problem in result.problems:
        click.echo(f"{run_dir}: {problem}", err=True)
    if not result.ok:
        click.echo(f"{run_dir}: FAILED verification ({len(result.problems)} problem(s))", err=True)
        return ExitCode.INFRA
    click.echo(f"{run_dir}: ok ({result.signature})")
    return ExitCode.OK
