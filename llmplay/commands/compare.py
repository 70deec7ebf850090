"""`llmplay compare`: the final configurations of two archived runs side by side, with confidence intervals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from llmplay.archive.signing import public_key_from
from llmplay.archive.verify import require_verified
from llmplay.commands.ci_outputs import comparison_sections, write_guarded
from llmplay.compare import compare_runs, format_comparison_table, render_comparison_html
from llmplay.errors import ArchiveError, ExitCode, LlmplayError
from llmplay.outputs.files import NO_OUTPUTS, OutputFiles


def compare_command(
    run_a: Path,
    run_b: Path,
    *,
    html: Path | None,
    unverified: bool = False,
    public_key: Path | None = None,
    outputs: OutputFiles = NO_OUTPUTS,
) -> int:
    """Print the comparison (and write it as HTML if asked); ExitCode.REGRESSION when B regressed against A.

    Both runs must verify first, unless `unverified`: then the output opens with what failed."""
    key = public_key_from(public_key)
    checks = [
        (side, require_verified(run, allow_unverified=unverified, public_key=key))
        for side, run in (("A", run_a), ("B", run_b))
    ]
    failed = tuple((side, result.problems) for side, result in checks if not result.ok)
    try:
        comparison = replace(compare_runs(run_a, run_b), unverified=failed)
    except LlmplayError:
        raise
    except Exception as exc:
        if not failed:
            raise  # two verified archives: a bug, reported as one by main
        first = (str(exc).splitlines() or [""])[0]
        raise ArchiveError(
            f"cannot compare {run_a} and {run_b}: run {failed[0][0]} failed verification and is damaged "
            f"({type(exc).__name__}: {first})"
        ) from exc
    click.echo(format_comparison_table(comparison))
    if html is not None:
        click.echo(f"comparison: {render_comparison_html(comparison, html)}")
    code = ExitCode.REGRESSION if comparison.has_regression else ExitCode.OK
    return write_guarded(outputs, lambda: comparison_sections("compare", comparison, code, html=html), code)
