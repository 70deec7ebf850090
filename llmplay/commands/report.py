"""`llmplay report`: re-render a run's report.html from its archive alone."""

from __future__ import annotations

from pathlib import Path

import click

from llmplay.errors import ExitCode
from llmplay.report import publish_report


def report_command(run_dir: Path) -> int:
    """Render RUN_DIR/report.html and print its path."""
    click.echo(str(publish_report(run_dir)))
    return ExitCode.OK
