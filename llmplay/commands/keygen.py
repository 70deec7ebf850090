"""`llmplay keygen`: a new Ed25519 key pair for signing run archives."""

from __future__ import annotations

from pathlib import Path

import click

from llmplay.archive.layout import ENV_PUBLIC_KEY, ENV_SIGNING_KEY
from llmplay.archive.signing import keygen
from llmplay.errors import ExitCode


def keygen_command(private_path: Path) -> int:
    """Write PRIVATE (0600) and PRIVATE.pub and say how each is used."""
    private, public, fp = keygen(private_path)
    click.echo(f"private key {private} (mode 0600): keep it only on the machines that run; {ENV_SIGNING_KEY}={private}")
    click.echo(f"public key  {public}: check it into the team repo; llmplay verify RUN --public-key {public}")
    click.echo(f"            (or {ENV_PUBLIC_KEY}={public})")
    click.echo(f"fingerprint {fp}")
    return ExitCode.OK
