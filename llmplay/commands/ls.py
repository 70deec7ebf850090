"""`llmplay ls`: the archived runs under the archive root, newest first."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from llmplay.archive.layout import linked_note
from llmplay.archive.listing import ListedRun, archive_root, linked_runs, list_runs
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.signing import public_key_from
from llmplay.archive.verify import check
from llmplay.errors import ArchiveError, ExitCode


def ls_command(archive_dir: str | None, *, verify: bool = False, public_key: Path | None = None) -> int:
    """A table of playbook, date, status, engine, GPU, gates met and path per run; with `verify`, each run is also
    verified (every file hashed) and the exit status is ExitCode.INFRA when any fails."""
    root = archive_root(archive_dir)
    rows = list_runs(root)
    linked = linked_runs(root)
    if linked:
        click.echo(linked_note(linked, root), err=True)
    if not rows:
        click.echo(f"no runs under {root}")
        return ExitCode.OK
    key = public_key_from(public_key) if verify else None
    table = Table(title=f"runs under {root}")
    columns = ["playbook", "date", "status", "engine", "GPU", "gates met", *(["verified"] if verify else []), "path"]
    # A status and a date are read at a glance (and matched by scripts): never folded. A long archive path folds
    # instead of squeezing every other column to nothing; the resume hint below prints it whole.
    for column in columns:
        table.add_column(column, overflow="fold", no_wrap=column in ("date", "status"))
    failed = 0
    for r in rows:
        name = f"{r['playbook']} {r['version']}".strip() + (" (overridden)" if r.get("overridden") else "")
        cells = [name, r["date"], r["status"], r["engine"], r["gpu"], gates_cell(r)]
        if verify:
            result = check(Path(r["path"]), key)
            failed += not result.ok
            cells.append("ok" if result.ok else f"FAILED: {result.one_line()}")
        table.add_row(*cells, r["path"])
    Console(highlight=False, soft_wrap=False, width=200 if not sys.stdout.isatty() else None).print(table)
    stale = [r for r in rows if r.get("stale")]
    if stale:
        click.echo(
            f"{len(stale)} run(s) shown interrupted: their manifest says running, but the llmplay process writing it "
            f"is gone (killed?); `llmplay run --resume {stale[0]['path']}` continues one"
        )
    if failed:
        click.echo(f"{failed} run(s) under {root} fail verification", err=True)
        return ExitCode.INFRA
    return ExitCode.OK


def gates_cell(row: ListedRun) -> str:
    """ "met/total", and how many of the unmet gates were not measured at all (an absent figure is no failure
    of the engine, but it is no pass either)."""
    if row.get("status") == "unreadable":
        return str(row.get("gates", ""))
    try:
        gates = ArchivedRun.open(Path(str(row["path"]))).gates()
    except (ArchiveError, TypeError, AttributeError):  # unreadable, or a damaged gates list: the count alone
        return str(row.get("gates", ""))
    unmeasured = sum(1 for g in gates if g.met is None)
    return str(row.get("gates", "")) + (f" ({unmeasured} not measured)" if unmeasured else "")
