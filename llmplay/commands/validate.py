"""`llmplay validate`: check playbooks against the schema and the engine's knobs, one line per file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from llmplay.errors import ExitCode, LlmplayError
from llmplay.playbook.load import load_playbook


def validate_command(files: Sequence[Path], *, allow_outside_extends: bool = False, on_this_host: bool = True) -> int:
    """Every file is checked (a bad one does not stop the rest); ExitCode.PLAYBOOK when any failed. `on_this_host`:
    also what the playbook needs from this host (a missing engine.model_dir), as a run here would refuse it."""
    failed = 0
    for file in files:
        try:
            pb = load_playbook(file, allow_outside_extends=allow_outside_extends, on_this_host=on_this_host)
        except LlmplayError as exc:
            failed += 1
            click.echo(str(exc), err=True)
            continue
        click.echo(
            f"{file}: ok ({pb.metadata.name}, engine {pb.engine.kind}, {len(pb.steps)} steps, "
            f"{len(pb.goals.gates)} gates)"
        )
    return ExitCode.PLAYBOOK if failed else ExitCode.OK
