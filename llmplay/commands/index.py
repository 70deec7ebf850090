"""`llmplay index` and `llmplay site`: the archive's SQLite index (rebuilt from the manifests on demand) and its
static index.html."""

from __future__ import annotations

import time
from pathlib import Path

import click

from llmplay.archive.index import ArchiveIndex
from llmplay.archive.listing import archive_root
from llmplay.archive.signing import public_key_from
from llmplay.errors import ExitCode


def index_command(archive_dir: str | None, *, rebuild: bool, public_key: Path | None = None) -> int:
    """Bring the index in step with the manifests (or, with `rebuild`, remake it from them) and say what it holds;
    runs are verified as `verify` does, with the public key when one is configured."""
    root = archive_root(archive_dir)
    index = ArchiveIndex(root, public_key=public_key_from(public_key))
    started = time.perf_counter()
    if rebuild:
        count = index.rebuild()
        click.echo(f"rebuilt {index.path} from {count} manifest(s) in {time.perf_counter() - started:.2f} s")
    runs = index.runs()
    unreadable = index.unreadable()
    failing = [r for r in runs if not r.verified]
    click.echo(
        f"{index.path}: {len(runs)} run(s) of {len({r.playbook for r in runs})} playbook(s), in step with the "
        f"manifests; {len(failing)} fail verification, {len(unreadable)} unreadable"
    )
    for entry in failing:
        click.echo(f"  fails verification: {entry.path}: {entry.problems[0] if entry.problems else '?'}")
    for u in unreadable:
        click.echo(f"  unreadable: {u.path}: {u.why}")
    return ExitCode.OK


def site_command(archive_dir: str | None, *, out: Path | None, public_key: Path | None = None) -> int:
    """Write the archive site and print its path."""
    from llmplay.history.site import write_site  # deferred: pulls in matplotlib and compare

    result = write_site(archive_root(archive_dir), out=out, public_key=public_key_from(public_key))
    click.echo(
        f"{result.path}: {result.playbooks} playbook(s), {result.runs} run(s), {result.compare_pages} compare page(s)"
    )
    return ExitCode.OK
