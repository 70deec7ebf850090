"""A playbook's history: every archived run oldest first, its headline figures with trial-level intervals, what
changed between runs, and the changes its trials show at the playbook's tolerances.

Change detection is the guard rule of a step and of `compare` (stats.decide.guard_outcome), applied between each
run and the one before it in its comparable series (same playbook version, final configuration and hardware class):
the change of a metric is flagged only when its interval over the two runs' trials (Welch t, the trial the unit, as
`compare` computes it) lies wholly beyond the tolerance, in the worse direction (a regression) or the better one.
The objective is judged at its min_effect, each guard at its tolerance (a rate's in points, on its count interval).
The figures are each trial's summary as archived, read from the index, so a history of thousands of runs reads no
per-request file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from llmplay.archive.model import MetricDelta
from llmplay.archive.run_entry import GuardGoal, RunEntry
from llmplay.catalog import RATE_METRICS, fmt_full, label_of
from llmplay.stats import (
    BEYOND,
    describe_delta,
    guard_outcome,
    newcombe_difference,
    t_mean_interval,
    welch_effect,
    wilson_interval,
)

DEFAULT_CONFIDENCE = 0.95
REGRESSION, IMPROVEMENT = "regression", "improvement"


@dataclass(frozen=True)
class Figure:
    """One headline metric of one run: the mean over its final configuration's trials and its interval."""

    metric: str
    value: float
    low: float
    high: float
    trials: int

    def text(self) -> str:
        if self.trials < 2 or self.low == self.high:
            return fmt_full(self.metric, self.value)
        return f"{fmt_full(self.metric, self.value)} [{fmt_full(self.metric, self.low)}, {fmt_full(self.metric, self.high)}]"


@dataclass(frozen=True)
class Flag:
    """A change the trials show between a run and the one before it in its comparable series."""

    run_id: str
    previous_run_id: str
    metric: str
    role: str  # objective | guard | gate
    direction: str  # regression | improvement
    delta: MetricDelta | None  # None for a gate that flipped
    tolerance_text: str
    coinciding: tuple[str, ...]  # what else changed between the two runs: engine version, image digest, host, ...

    def text(self) -> str:
        what = f"{self.role} {label_of(self.metric)}" if self.role != "gate" else f"gate on {label_of(self.metric)}"
        if self.delta is None:
            size = "met -> failed" if self.direction == REGRESSION else "failed -> met"
        else:
            size = describe_delta(self.delta, points=self.delta.points is not None).removeprefix(
                label_of(self.metric) + " "
            )
            size += f" beyond its {self.tolerance_text}"
        since = "; coincides with " + ", ".join(self.coinciding) if self.coinciding else "; nothing recorded changed"
        return f"{self.direction.upper()} {what}: {size} (vs {self.previous_run_id}){since}"


@dataclass(frozen=True)
class HistoryRow:
    entry: RunEntry
    figures: Mapping[str, Figure]
    marks: tuple[str, ...]  # "configuration changed: ...", "playbook version 1.0 -> 1.1", "first run"
    flags: tuple[Flag, ...]
    reference: bool
    previous: str | None  # the run it was compared with (its comparable predecessor)

    @property
    def usable(self) -> bool:
        return self.entry.usable


@dataclass(frozen=True)
class PlaybookHistory:
    playbook: str
    rows: tuple[HistoryRow, ...]
    metrics: tuple[str, ...]  # headline metrics, objective first
    roles: Mapping[str, str]  # metric -> objective | guard | gate | ""
    reference: str | None  # accepted run id
    confidence: float
    notes: tuple[str, ...] = ()

    @property
    def flags(self) -> list[Flag]:
        return [f for row in self.rows for f in row.flags]


# ---------------------------------------------------------------------------------------------- figures
def run_figure(entry: RunEntry, metric: str, confidence: float) -> Figure | None:
    """The metric's mean over the run's trials with a t interval (a rate: pooled over requests, Wilson)."""
    values = entry.figures.get(metric)
    if not values:
        return None
    if metric in RATE_METRICS and "errors.count" in entry.figures and "requests.total" in entry.figures:
        errors, total = int(sum(entry.figures["errors.count"])), int(sum(entry.figures["requests.total"]))
        if total > 0:
            low, high = wilson_interval(errors, total, confidence)
            return Figure(metric, errors / total, low, high, len(values))
    low, high = t_mean_interval(values, confidence)
    if min(values) >= 0:  # latencies, throughputs, costs: a bound below zero says only that zero is not excluded
        low = max(low, 0.0)
    return Figure(metric, math.fsum(values) / len(values), low, high, len(values))


def _point_change(xa: Sequence[float], xb: Sequence[float]) -> float | None:
    """The relative change welch_effect would put at the centre of its interval (geometric means when every value
    is positive, else the means), computed without its interval; None from a zero baseline."""
    if all(v > 0 and math.isfinite(v) for v in (*xa, *xb)):
        return math.expm1(sum(map(math.log, xb)) / len(xb) - sum(map(math.log, xa)) / len(xa))
    base = sum(xa) / len(xa)
    return (sum(xb) / len(xb) - base) / abs(base) if base else None


def _can_be_beyond(a: RunEntry, b: RunEntry, goal: GuardGoal) -> bool:
    """Whether the change can be shown beyond the tolerance at all: an interval holds its point estimate, so a
    point within the tolerance either way can never be flagged. Saves the interval for almost every pair."""
    xa, xb = a.figures.get(goal.metric), b.figures.get(goal.metric)
    if not xa or not xb:
        return False
    if goal.absolute and goal.metric in RATE_METRICS:
        counts = [x.figures.get(k) for x in (a, b) for k in ("errors.count", "requests.total")]
        if all(counts):
            ea, ta, eb, tb = (sum(c or ()) for c in counts)
            return not (ta and tb) or abs(eb / tb - ea / ta) > goal.tolerance
    point = _point_change(xa, xb)
    return point is None or abs(point) > goal.tolerance


def _delta(a: RunEntry, b: RunEntry, metric: str, level: float) -> MetricDelta | None:
    """B against A over their trials, as `compare` computes it (Welch t, the trial the unit); a rate also in points
    over the pooled requests."""
    xa, xb = a.figures.get(metric), b.figures.get(metric)
    if not xa or not xb:
        return None
    effect = welch_effect(xa, xb, level)
    va, vb = float(np.mean(xa)), float(np.mean(xb))
    rel = effect.rel
    if rel is None:
        rel = (vb - va) / abs(va) if va != 0 else None
    delta = MetricDelta(
        metric,
        va,
        vb,
        rel if rel is None or math.isfinite(rel) else None,
        effect.low,
        effect.high,
        units=effect.units,
        method=effect.method,
        confidence=level,
    )
    if metric in RATE_METRICS:
        counts = [x.figures.get(k) for x in (a, b) for k in ("errors.count", "requests.total")]
        if all(counts):
            ea, ta, eb, tb = (int(sum(c or ())) for c in counts)
            diff = newcombe_difference(ea, ta, eb, tb, level)
            if diff is not None:
                delta = MetricDelta(
                    metric,
                    ea / ta,
                    eb / tb,
                    delta.rel_change,
                    delta.ci_low,
                    delta.ci_high,
                    units=delta.units,
                    method=delta.method,
                    confidence=level,
                    points=diff[0],
                    points_low=diff[1],
                    points_high=diff[2],
                )
    return delta


def _tolerance_text(goal: GuardGoal) -> str:
    return f"{goal.tolerance * 100:g}pp" if goal.absolute else f"{goal.tolerance:.0%}"


# ---------------------------------------------------------------------------------------------- what changed
def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, Mapping):
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


def config_changes(a: RunEntry, b: RunEntry) -> list[str]:
    """The final configuration's settings that differ, "engine.args.parallel: 4 -> 1"."""
    fa, fb = _flat(a.config), _flat(b.config)
    return [f"{k}: {fa.get(k)} -> {fb.get(k)}" for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def coinciding_changes(a: RunEntry, b: RunEntry) -> list[str]:
    """What differs between two runs besides their figures: engine, image, host, llmplay, configuration, playbook."""
    out = []
    for label, x, y in (
        ("engine version", a.engine_version, b.engine_version),
        ("image digest", a.image_digest[:19], b.image_digest[:19]),
        ("host", a.host, b.host),
        ("hardware", a.hardware, b.hardware),
        ("llmplay version", a.llmplay_version, b.llmplay_version),
        ("playbook version", a.playbook_version, b.playbook_version),
    ):
        if x != y:
            out.append(f"{label} {x or '?'} -> {y or '?'}")
    if a.config_fingerprint != b.config_fingerprint:
        changes = config_changes(a, b)
        out.append("configuration " + ("; ".join(changes[:4]) + (" ..." if len(changes) > 4 else "")))
    return out


def comparable(a: RunEntry, b: RunEntry) -> bool:
    """Same playbook version, final configuration and hardware class: a change between them is the engine's, the
    image's, the host's or noise, and the trials can tell which."""
    return (
        a.playbook_version == b.playbook_version
        and a.config_fingerprint == b.config_fingerprint
        and a.hardware == b.hardware
    )


def detect_changes(a: RunEntry, b: RunEntry) -> list[Flag]:
    """The changes from A to B that B's and A's trials show beyond A's playbook's tolerances."""
    goals = a.goals
    if goals is None:
        return []
    level = goals.confidence
    coinciding = tuple(coinciding_changes(a, b))
    flags = []
    judged = [("objective", g) for g in ((goals.objective,) if goals.objective else ())]
    judged += [("guard", g) for g in goals.guards]
    for role, goal in judged:
        if not _can_be_beyond(a, b, goal):
            continue
        delta = _delta(a, b, goal.metric, level)
        if delta is None:
            continue
        absolute = goal.absolute and delta.points is not None
        for direction, lower_better in ((REGRESSION, goal.lower_is_better), (IMPROVEMENT, not goal.lower_is_better)):
            if guard_outcome(delta, lower_better, goal.tolerance, absolute) == BEYOND:
                flags.append(
                    Flag(b.run_id, a.run_id, goal.metric, role, direction, delta, _tolerance_text(goal), coinciding)
                )
    gates_a = {g.gate: g for g in a.gates}
    for gate in b.gates:
        before = gates_a.get(gate.gate)
        if before is None or before.met is None or gate.met is None or before.met == gate.met:
            continue
        direction = REGRESSION if before.met else IMPROVEMENT
        flags.append(Flag(b.run_id, a.run_id, gate.metric, "gate", direction, None, gate.gate, coinciding))
    return flags


# ---------------------------------------------------------------------------------------------- the history
def build_history(playbook: str, entries: Sequence[RunEntry], reference: str | None) -> PlaybookHistory:
    """The playbook's runs oldest first with their figures, marks and flags; `entries` as the index returns them."""
    entries = sorted(entries, key=lambda e: (e.started_utc, e.run_id))
    latest_goals = next((e.goals for e in reversed(entries) if e.goals is not None), None)
    confidence = latest_goals.confidence if latest_goals else DEFAULT_CONFIDENCE
    roles: dict[str, str] = {}
    for entry in entries:
        if entry.goals is None:
            continue
        if entry.goals.objective:
            roles.setdefault(entry.goals.objective.metric, "objective")
        for g in entry.goals.guards:
            roles.setdefault(g.metric, "guard")
        for m in entry.goals.gate_metrics:
            roles.setdefault(m, "gate")
    measured = {m for e in entries for m in e.figures}
    extra = [m for m in ("cost.usd_per_1m_tokens", "capacity.rate", "capacity.concurrency") if m in measured]
    metrics = tuple(dict.fromkeys([*(m for m in roles if m in measured), *extra]))
    notes = []
    if reference is not None and not any(e.run_id == reference for e in entries):
        notes.append(f"the accepted reference {reference} is not in the archive")
    rows: list[HistoryRow] = []
    previous_shown: RunEntry | None = None
    series_last: dict[tuple[str, str, str], RunEntry] = {}
    for entry in entries:
        marks = []
        if previous_shown is None:
            marks.append("first run")
        else:
            if entry.playbook_version != previous_shown.playbook_version:
                marks.append(f"playbook version {previous_shown.playbook_version} -> {entry.playbook_version}")
            if entry.config_fingerprint != previous_shown.config_fingerprint:
                marks.append("configuration changed: " + "; ".join(config_changes(previous_shown, entry)[:6]))
            if entry.hardware != previous_shown.hardware:
                marks.append(f"hardware {previous_shown.hardware} -> {entry.hardware}")
        if not entry.verified:
            marks.append("FAILS VERIFICATION: " + (entry.problems[0] if entry.problems else "?"))
        if entry.usable and not entry.figures:
            marks.append("no successful trial of its final configuration: nothing measured")
        flags: list[Flag] = []
        previous = None
        if entry.usable and entry.figures:  # a run whose engine never served is no point of comparison
            key = (entry.playbook_version, entry.config_fingerprint, entry.hardware)
            before = series_last.get(key)
            if before is not None:
                flags = detect_changes(before, entry)
                previous = before.run_id
            series_last[key] = entry
        figures = {m: f for m in metrics if (f := run_figure(entry, m, confidence)) is not None}
        rows.append(HistoryRow(entry, figures, tuple(marks), tuple(flags), entry.run_id == reference, previous))
        previous_shown = entry
    reference_row = next((r for r in rows if r.reference), None)
    if reference_row is not None and not reference_row.usable:
        notes.append(f"the accepted reference {reference} fails verification or did not complete: not used")
    return PlaybookHistory(playbook, tuple(rows), metrics, roles, reference, confidence, tuple(notes))


def format_history(history: PlaybookHistory) -> str:
    """Plain text for a terminal or a CI log: one block per run, oldest first."""
    ci = f"{history.confidence:.0%} CI"
    head = f"{history.playbook}: {len(history.rows)} run(s)"
    head += f"; reference {history.reference}" if history.reference else "; no accepted reference"
    out = [head, f"figures: mean over the final configuration's trials [{ci} over trials]"]
    for row in history.rows:
        e = row.entry
        out.append("")
        for mark in row.marks:
            if mark != "first run":
                out.append(f"  ^ {mark}")
        tag = " REFERENCE" if row.reference else ""
        status = "" if e.status == "complete" else f" ({e.status})"
        out.append(f"{e.started_utc}  {e.kind}{status}  {e.path}{tag}")
        out.append(
            f"    engine {e.engine} | image {e.image_digest[:19] or '?'} | llmplay {e.llmplay_version or '?'} | "
            f"{e.host or '?'} / {e.hardware} | config {e.config_id} #{e.config_fingerprint[:8]}"
        )
        shown = [f"{label_of(m)} {f.text()}" for m, f in row.figures.items()]
        gates = list(e.gates)
        if gates:
            met = sum(1 for g in gates if g.met)
            shown.append(f"gates {met}/{len(gates)} met")
        if shown:
            out.append("    " + "; ".join(shown))
        for flag in row.flags:
            out.append(f"    ! {flag.text()}")
    for note in history.notes:
        out.append(f"note: {note}")
    return "\n".join(out)
