"""`llmplay gc`: remove the containers that llmplay runs which died left behind."""

from __future__ import annotations

import click

from llmplay.errors import ExitCode
from llmplay.runtime.docker import gc


def gc_command() -> int:
    removed = gc()
    click.echo(f"removed {len(removed)} container(s)" + (": " + ", ".join(removed) if removed else ""))
    return ExitCode.OK
