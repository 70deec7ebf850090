"""`llmplay ls`: the archived runs under the archive root, newest first."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from llmplay.archive.listing import archive_root, list_runs
from llmplay.archive.reader import read_manifest
from llmplay.errors import ArchiveError, ExitCode


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
        table.add_row(name, r["date"], r["status"], r["engine"], r["gpu"], gates_cell(r), r["path"])
    Console(highlight=False, soft_wrap=False, width=200 if not sys.stdout.isatty() else None).print(table)
    stale = [r for r in rows if r.get("stale")]
    if stale:
        click.echo(
            f"{len(stale)} run(s) shown interrupted: their manifest says running, but the llmplay process writing it "
            f"is gone (killed?); `llmplay run --resume {stale[0]['path']}` continues one"
        )
    return ExitCode.OK


def gates_cell(row: Mapping[str, Any]) -> str:
    """ "met/total", and how many of the unmet gates were not measured at all (an absent figure is no failure
    of the engine, but it is no pass either)."""
    if row.get("status") == "unreadable":
        return str(row.get("gates", ""))
    try:
        gates = read_manifest(Path(row["path"])).get("gates") or []
    except ArchiveError:
        return str(row.get("gates", ""))
    unmeasured = sum(1 for g in gates if isinstance(g, Mapping) and g.get("met") is None)
    return str(row.get("gates", "")) + (f" ({unmeasured} not measured)" if unmeasured else "")
