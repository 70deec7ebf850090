"""`llmplay engine ...`: engine images; today the embedded CPU engine (llama.cpp and a tiny model)."""

from __future__ import annotations

import click

from llmplay.errors import ExitCode
from llmplay.runtime.cpu_image import build_cpu_engine


def build_cpu_command(*, force: bool = False) -> int:
    """Build (or reuse from the cache) the CPU engine image and print what is ready."""
    result = build_cpu_engine(force=force)
    click.echo(f"CPU engine ready: {result}")
    return ExitCode.OK
