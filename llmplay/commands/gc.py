"""`llmplay gc`: remove the containers of llmplay runs that died; never those of a run still going."""

from __future__ import annotations

import click

from llmplay.errors import ExitCode
from llmplay.runtime.docker import LIVE, ORPHAN, gc


def gc_command(*, force: bool = False, run_id: str | None = None) -> int:
    """One line per container removed or left alone, each with the reason, then the counts."""
    result = gc(run_id=run_id, force=force)
    for c in result.removed:
        click.echo(f"removed {c.describe()}")
    for c in result.kept:
        hint = "" if c.kind == LIVE else "; `llmplay gc --force` removes it"
        click.echo(f"left {c.describe()}{hint}")
    unproven = sum(1 for c in result.kept if c.kind not in (LIVE, ORPHAN))
    click.echo(
        f"removed {len(result.removed)} container(s); left {len(result.kept)}"
        + (f" ({unproven} not provably orphaned: other hosts' or older llmplay's)" if unproven else "")
    )
    return ExitCode.OK
