"""--junit, --summary and --metrics of `run`, `retest`, `compare` and `history --check`: the sections each command
hands to llmplay.outputs, and what happens when they cannot be written (the job must not pass without them)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from llmplay.compare import Comparison
from llmplay.errors import ExitCode, LlmplayError
from llmplay.history.check import CheckResult
from llmplay.history.timeline import PlaybookHistory
from llmplay.outputs.facts import Section, comparison_section, run_facts
from llmplay.outputs.files import OutputFiles
from llmplay.outputs.write import write_outputs


def write_guarded(files: OutputFiles, sections: Callable[[], Sequence[Section]], exit_code: int) -> int:
    """Write the outputs asked for; the command's exit code, or ExitCode.INFRA in place of a pass when they could
    not be written (a CI job reading a missing JUnit file would otherwise report nothing, or a stale result)."""
    if not files.wanted:
        return exit_code
    try:
        write_outputs(files, sections())
    except (OSError, LlmplayError) as exc:
        sys.stderr.write(f"error: could not write {files.named}: {exc}\n")
        return exit_code or ExitCode.INFRA
    except Exception as exc:  # a bug: said in one line, and the run's own exit code is kept when it failed
        sys.stderr.write(
            f"internal error: could not write {files.named} ({type(exc).__name__}: {exc}); "
            "re-run with --debug for the traceback\n"
        )
        return exit_code or ExitCode.INFRA
    return exit_code


def comparison_sections(
    command: str,
    comparison: Comparison,
    exit_code: int,
    *,
    changed_outputs: str | None = None,
    html: Path | None = None,
) -> list[Section]:
    """`retest` and `compare`: the newer run judged against the earlier one; changed greedy outputs fail too."""
    failures = (("greedy outputs unchanged", f"quality: {changed_outputs}"),) if changed_outputs else ()
    return [comparison_section(command, comparison, exit_code, failures=failures, html=html)]


def check_section(root: Path, history: PlaybookHistory, result: CheckResult) -> Section:
    """`history --check` of one playbook: its newest run against the accepted reference."""
    if result.comparison is None:  # nothing newer than the reference: the reference is what is reported
        reference = next(r.entry for r in history.rows if r.entry.run_id == history.reference)
        return Section(
            "history --check", run_facts(root / reference.path), result.exit_code, nothing_newer=result.lines[-1]
        )
    error = result.lines[-1] if result.exit_code == ExitCode.INFRA else None
    return comparison_section("history --check", result.comparison, result.exit_code, error=error)
