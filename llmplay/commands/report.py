"""`llmplay report`: re-render a run's report.html from its archive alone, never touching its manifest."""

from __future__ import annotations

from pathlib import Path

import click

from llmplay.archive.layout import REPORT_FILE
from llmplay.archive.signing import public_key_from
from llmplay.archive.verify import require_verified
from llmplay.errors import ArchiveError, ExitCode, LlmplayError
from llmplay.report import render_report


def report_command(run_dir: Path, *, unverified: bool = False, public_key: Path | None = None) -> int:
    """Render RUN_DIR/report.html of a run that verifies (or, with `unverified`, of one that does not, saying so)."""
    result = require_verified(run_dir, allow_unverified=unverified, public_key=public_key_from(public_key))
    if not result.ok:
        click.echo(f"WARNING: {run_dir}: this archive failed verification: {result.one_line()}; rendered anyway")
    try:
        path = render_report(run_dir, unverified=result.problems)
    except LlmplayError:
        raise
    except Exception as exc:  # a rendering bug or a full disk: no report.html, and the exit status must say so
        first = (str(exc).splitlines() or [""])[0]
        raise ArchiveError(
            f"{Path(run_dir) / REPORT_FILE}: not written ({type(exc).__name__}: {first}); the archive is unchanged"
        ) from exc
    click.echo(str(path))
    return ExitCode.OK
