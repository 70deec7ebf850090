"""`history --check`: the newest run of a playbook against its accepted reference.

The nightly job's question is whether tonight's run is worse than the one the team accepted. Both runs verify again;
`compare` shows every metric side by side (compare.compare_runs, the reference's playbook and confidence), and the
decision is history.judge's: a regression only where an interval shows it beyond a tolerance (a gate only where it
is shown failed), and a run whose trials cannot show anything is reported as not judged, with its own exit code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmplay.archive.index import Unindexable
from llmplay.archive.layout import safe_name
from llmplay.archive.run_entry import RunEntry
from llmplay.archive.verify import check
from llmplay.catalog import label_of
from llmplay.compare import Comparison, compare_runs, format_comparison_table
from llmplay.errors import ArchiveError, ExitCode
from llmplay.history.judge import TRIALS, GateLimit, judge
from llmplay.history.timeline import PlaybookHistory, coinciding_changes, comparable

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


@dataclass(frozen=True)
class CheckResult:
    exit_code: int
    lines: tuple[str, ...]
    comparison: Comparison | None = None


def _entry(history: PlaybookHistory, run_id: str) -> RunEntry | None:
    return next((r.entry for r in history.rows if r.entry.run_id == run_id), None)


def _unreadable_newer(name: str, newest: RunEntry | None, unreadable: Sequence[Unindexable]) -> Unindexable | None:
    """A run directory of this playbook, named after the newest run (run ids start with their UTC start), that could
    not even be indexed: the newest run may be that one, so nothing older may be judged in its place."""
    folder = safe_name(name) + "/"
    after = newest.path.split("/")[-1] if newest is not None else ""
    late = [u for u in unreadable if u.path.startswith(folder) and u.path[len(folder) :] > after]
    return late[-1] if late else None


def check_newest(
    root: Path,
    history: PlaybookHistory,
    public_key: Ed25519PublicKey | None = None,
    unreadable: Sequence[Unindexable] = (),
    noise: str = TRIALS,
) -> CheckResult:
    """ExitCode.REGRESSION when the newest run is shown to have regressed against the accepted reference beyond a
    tolerance (or to fail a gate the reference met); ExitCode.UNJUDGED when it cannot be judged (a goal it did not
    measure, too few trials for an interval); OK otherwise (the newest run is the reference, or it holds).
    ArchiveError when there is nothing to check against or a run to be read fails verification (an alarm that
    cannot be trusted must not pass quietly). Both runs are verified again from the archive, with `public_key` when
    one is configured: the index only says which runs they are. `noise`: the runs' own trials, or the history of
    comparable runs."""
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
    late = _unreadable_newer(name, newest, unreadable)
    if late is not None:
        raise ArchiveError(
            f"{name}: the newest run {root / late.path} fails verification: {late.why}; `llmplay verify` lists why"
        )
    newest = newest or reference
    sides = [("newest run", newest)] + ([("reference", reference)] if reference.run_id != newest.run_id else [])
    for label, entry in sides:
        verification = check(root / entry.path, public_key)
        if not verification.ok:
            raise ArchiveError(
                f"{name}: the {label} {root / entry.path} fails verification: {verification.one_line()}; "
                "`llmplay verify` lists every problem"
            )
        if entry.status != "complete":
            raise ArchiveError(f"{name}: the {label} {root / entry.path} did not complete ({entry.status})")
    if newest.run_id == reference.run_id:
        return CheckResult(ExitCode.OK, (f"{name}: the newest run is the reference {reference.run_id}; nothing newer",))
    comparison = compare_runs(root / reference.path, root / newest.path)
    lines = [f"{name}: newest run {newest.run_id} against the reference {reference.run_id}"]
    changes = coinciding_changes(reference, newest)
    if not comparable(reference, newest):
        lines.append(
            "note: not the same playbook version, configuration and hardware as the reference; compared anyway"
        )
    lines.append(format_comparison_table(comparison, verdict=False))
    gates = [GateLimit(g.gate, g.metric, g.a.op, g.a.threshold, g.a.met) for g in comparison.gates if g.a is not None]
    judged = judge(reference, newest, gates, noise=noise, entries=[r.entry for r in history.rows])
    lines.append("")
    source = "the history of comparable runs" if judged.noise != TRIALS else "the two runs' trials"
    lines.append(f"the check (noise from {source}):")
    lines += [f"  {g.text()}" for g in judged.goals] + [f"  {g.text()}" for g in judged.gates]
    lines += [f"note: {n}" for n in judged.notes]
    since = ", ".join(changes) if changes else "nothing recorded changed (engine, image, host, configuration)"
    if judged.regressions:
        lines.append(f"REGRESSION of {newest.run_id} against the reference {reference.run_id}: since then {since}")
        lines += [f"  {why}" for why in judged.regressions]
        return CheckResult(ExitCode.REGRESSION, tuple(lines), comparison)
    lost = [g.goal.metric for g in judged.goals if g.outcome is None and "did not measure" in g.why]
    if lost:  # an engine that never served is no pass: nothing was judged
        lines.append(
            f"NOT MEASURED: the newest run {newest.run_id} measured none of "
            f"{', '.join(label_of(m) for m in lost)} that the reference did (its trials failed?); since then {since}"
        )
    if judged.unjudged:
        lines.append(
            f"NOT JUDGED: {newest.run_id} against the reference {reference.run_id} cannot be judged: "
            + "; ".join(judged.unjudged)
        )
        return CheckResult(ExitCode.UNJUDGED, tuple(lines), comparison)
    lines.append(f"no regression of {newest.run_id} against the reference {reference.run_id} (since then {since})")
    return CheckResult(ExitCode.OK, tuple(lines), comparison)
