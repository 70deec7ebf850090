"""`llmplay ls`: the archived runs under the archive root, newest first."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from llmplay.archive.listing import archive_root, list_runs
from llmplay.errors import ExitCode


def ls_command(archive_dir: str | None) -> int:
    """A table of playbook, date, status, engine, GPU, gates met and path per run."""
    root = archive_root(archive_dir)
    rows = list_runs(root)
    if not rows:
        click.echo(f"no runs under {root}")
        return ExitCode.OK
    table = Table(title=f"runs under {root}")
    for column in ("playbook", "date", "status", "engine", "GPU", "gates met", "path"):
        table.add_column(column, overflow="fold", no_wrap=column in ("path", "date"))
    for r in rows:
        name = f"{r['playbook']} {r['version']}".strip() + (" (overridden)" if r.get("overridden") else "")
        table.add_row(name, r["date"], r["status"], r["engine"], r["gpu"], r["gates"], r["path"])
    Console(highlight=False, soft_wrap=False, width=200 if not sys.stdout.isatty() else None).print(table)
    return ExitCode.OK
