"""`history --check`: the newest run of a playbook against its accepted reference, judged like `compare` judges.

The nightly job's question is whether tonight's run is worse than the one the team accepted. It is answered by
`compare` itself (compare.compare_runs: every request of both runs' final configurations, Welch t over their
trials, the reference's playbook deciding with its guard tolerances, objective min_effect and gates), after both
runs verify again, so the alarm is exactly what `llmplay compare REFERENCE NEWEST` would say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmplay.archive.run_entry import RunEntry
from llmplay.archive.verify import check
from llmplay.catalog import label_of
from llmplay.compare import Comparison, compare_runs, format_comparison_table
from llmplay.errors import ArchiveError, ExitCode
from llmplay.history.timeline import PlaybookHistory, coinciding_changes, comparable


@dataclass(frozen=True)
class CheckResult:
    exit_code: int
    lines: tuple[str, ...]
    comparison: Comparison | None = None


def _entry(history: PlaybookHistory, run_id: str) -> RunEntry | None:
    return next((r.entry for r in history.rows if r.entry.run_id == run_id), None)


def check_newest(root: Path, history: PlaybookHistory) -> CheckResult:
    """ExitCode.REGRESSION when the newest run regressed against the accepted reference beyond a tolerance, OK
    otherwise (the newest run is the reference, or it holds); ExitCode.INFRA when the newest run measured none of
    a goal the reference did; ArchiveError when there is nothing to check against or a run to be read fails
    verification (an alarm that cannot be trusted must not pass quietly)."""
    name = history.playbook
    if history.reference is None:
        raise ArchiveError(
            f"{name}: no accepted reference to check against; accept one with `llmplay history --accept RUN`"
        )
    reference = _entry(history, history.reference)
    if reference is None:
        raise ArchiveError(f"{name}: the accepted reference {history.reference} is not in the archive {root}")
    finished = [r.entry for r in history.rows if r.entry.status != "running"]
    newest = finished[-1] if finished else None
    if newest is None or newest.run_id == reference.run_id:
        return CheckResult(ExitCode.OK, (f"{name}: the newest run is the reference {reference.run_id}; nothing newer",))
    for label, entry in (("reference", reference), ("newest run", newest)):
        verification = check(root / entry.path)
        if not verification.ok:
            raise ArchiveError(
                f"{name}: the {label} {root / entry.path} fails verification: {verification.one_line()}; "
                "`llmplay verify` lists every problem"
            )
        if entry.status != "complete":
            raise ArchiveError(f"{name}: the {label} {root / entry.path} did not complete ({entry.status})")
    comparison = compare_runs(root / reference.path, root / newest.path)
    lines = [f"{name}: newest run {newest.run_id} against the reference {reference.run_id}"]
    changes = coinciding_changes(reference, newest)
    if not comparable(reference, newest):
        lines.append(
            "note: not the same playbook version, configuration and hardware as the reference; compared anyway"
        )
    lines.append(format_comparison_table(comparison))
    since = ", ".join(changes) if changes else "nothing recorded changed (engine, image, host, configuration)"
    goals = reference.goals
    judged = [
        g.metric for g in ((goals.objective,) if goals and goals.objective else ()) + (goals.guards if goals else ())
    ]
    lost = [label_of(m) for m in judged if m in reference.figures and m not in newest.figures]
    if lost and not comparison.has_regression:  # an engine that never served is no pass: nothing was judged
        lines.append(
            f"NOT MEASURED: the newest run {newest.run_id} measured none of {', '.join(lost)} that the reference "
            f"did (its trials failed?); since then {since}"
        )
        return CheckResult(ExitCode.INFRA, tuple(lines), comparison)
    if comparison.has_regression:
        lines.append(f"REGRESSION of {newest.run_id} against the reference {reference.run_id}: since then {since}")
        for why in comparison.regressions:
            lines.append(f"  {why}")
        return CheckResult(ExitCode.REGRESSION, tuple(lines), comparison)
    lines.append(f"no regression of {newest.run_id} against the reference {reference.run_id} (since then {since})")
    return CheckResult(ExitCode.OK, tuple(lines), comparison)
