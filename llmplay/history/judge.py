"""How `history --check` decides: the newest run's objective, guards and gates against the accepted reference, by
the rule a step's guards use, with an honest "cannot judge" where the trials cannot show anything.

- Objective and guards: the change against the reference, with its interval; a regression only when the interval
  lies wholly beyond the tolerance (stats.guards.guard_outcome: the objective at its min_effect, a guard at its
  tolerance, a rate's in points on its count interval). The interval is Welch's over the two runs' trials (noise
  "trials", as `compare` makes it) or, with noise "history", the newest run against the reference and the earlier
  runs comparable to it (same playbook version, final configuration, hardware class and engine image), with their
  trial-to-trial and run-to-run noise (stats.runs): a single trial tonight is judged against many earlier ones.
  The history's noise is checked against the newest run's own spread and not used when they disagree beyond chance.
- Gates: the newest run's level with its interval against the threshold: "failed" only when the interval lies
  wholly on the failing side, "at risk" when it straddles, "met" otherwise; a regression when the reference met it
  and the newest run is shown to fail it.
- A goal with no interval (one trial a side and no history) or not measured by the newest run leaves the run
  unjudged: the check says why and exits with its own code, never "no regression".
- Each judged goal says what the check could detect: the regression caught 80% of the time with these trials.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmplay.archive.run_entry import GuardGoal, RunEntry
from llmplay.catalog import RATE_METRICS, fmt_full, fmt_pct, label_of
from llmplay.history.timeline import _delta, comparable
from llmplay.outcomes import MetricDelta
from llmplay.stats.decide import BEYOND, HOLDS, describe_delta, guard_outcome
from llmplay.stats.intervals import welch_effect, wilson_interval
from llmplay.stats.power import POWER, detectable
from llmplay.stats.runs import RunNoise, against_history, level_interval, own_noise_agrees, run_noise

TRIALS, HISTORY = "trials", "history"
NOISE_SOURCES = (TRIALS, HISTORY)
FAILED, AT_RISK, MET, NOT_JUDGED = "FAILED", "at risk", "met", "not judged"


@dataclass(frozen=True)
class GateLimit:
    """A gate as the reference's playbook states it, and whether the reference met it."""

    gate: str
    metric: str
    op: str
    threshold: float
    reference_met: bool | None


@dataclass(frozen=True)
class GoalCheck:
    role: str  # objective | guard
    goal: GuardGoal
    delta: MetricDelta | None
    outcome: str | None  # BEYOND, HOLDS, UNSETTLED; None: not judged
    why: str = ""  # why not judged
    detectable: float | None = None  # the regression caught with POWER (relative, in the worse direction)

    @property
    def tolerance_text(self) -> str:
        return f"{self.goal.tolerance * 100:g}pp" if self.goal.absolute else f"{self.goal.tolerance:.0%}"

    def text(self) -> str:
        head = f"{self.role} {label_of(self.goal.metric)}"
        if self.outcome is None or self.delta is None:
            return f"{head}: not judged, {self.why}"
        points = self.goal.absolute and self.delta.points is not None
        change = describe_delta(self.delta, points=points).removeprefix(label_of(self.goal.metric) + " ")
        state = {BEYOND: "beyond", HOLDS: "shown within"}.get(self.outcome, "not shown beyond")
        line = f"{head} {change}: {state} its {self.tolerance_text} tolerance"
        if self.detectable is not None:
            line += f"; a regression of {fmt_pct(self.detectable)} would be caught {POWER:.0%} of the time"
        return line


@dataclass(frozen=True)
class GateCheck:
    limit: GateLimit
    state: str  # FAILED, AT_RISK, MET, NOT_JUDGED
    value: float | None
    low: float | None
    high: float | None
    why: str = ""

    @property
    def regression(self) -> bool:
        return self.state == FAILED and self.limit.reference_met is True

    def text(self) -> str:
        if self.state == NOT_JUDGED:
            return f"gate {self.limit.gate}: not judged, {self.why}"
        m = self.limit.metric
        shown = f"{fmt_full(m, self.value)} [{fmt_full(m, self.low)}, {fmt_full(m, self.high)}]"
        was = {True: "met", False: "failed", None: "not measured"}[self.limit.reference_met]
        return f"gate {self.limit.gate}: {self.state}, {shown} (the reference: {was})"


@dataclass(frozen=True)
class Judgement:
    goals: tuple[GoalCheck, ...]
    gates: tuple[GateCheck, ...]
    noise: str  # the source used: trials, or history
    notes: tuple[str, ...]  # which runs the history's noise came from, or why it was not used

    @property
    def regressions(self) -> list[str]:
        return [g.text() for g in self.goals if g.outcome == BEYOND] + [g.text() for g in self.gates if g.regression]

    @property
    def unjudged(self) -> list[str]:
        return [g.text() for g in self.goals if g.outcome is None] + [
            g.text() for g in self.gates if g.state == NOT_JUDGED
        ]


def _image(e: RunEntry) -> str:
    return e.image_digest or e.engine_version


def history_runs(entries: Sequence[RunEntry], reference: RunEntry, newest: RunEntry) -> list[RunEntry]:
    """The runs the history's noise comes from: the reference and every earlier run comparable to it (same playbook
    version, final configuration: engine kind, arguments, workload; and hardware class), on any engine image;
    never the newest run itself."""
    same = [
        e
        for e in entries
        if e.usable
        and e.run_id != newest.run_id
        and e.started_utc <= newest.started_utc
        and comparable(e, reference)
        and e.figures
    ]
    return sorted({e.run_id: e for e in (reference, *same)}.values(), key=lambda e: (e.started_utc, e.run_id))


def _history_noise(runs: Sequence[RunEntry], metric: str) -> RunNoise | None:
    groups: dict[str, list[tuple[float, ...]]] = {}
    for e in runs:
        if e.figures.get(metric):
            groups.setdefault(_image(e), []).append(tuple(e.figures[metric]))
    return run_noise(list(groups.values()))


def _geomean(values: Sequence[float]) -> float:
    return math.exp(math.fsum(map(math.log, values)) / len(values))


def _worse_limit(goal: GuardGoal, log_gap: float) -> float:
    """The regression `log_gap` beyond the tolerance, as a relative change in the worse direction."""
    if goal.lower_is_better:
        return math.expm1(math.log1p(goal.tolerance) + log_gap)
    return math.expm1(math.log1p(-min(goal.tolerance, 0.999)) - log_gap)


def _judge_goal(
    role: str,
    goal: GuardGoal,
    reference: RunEntry,
    newest: RunEntry,
    noise: RunNoise | None,
    baseline: Sequence[RunEntry],
    level: float,
) -> GoalCheck:
    metric = goal.metric
    if not reference.figures.get(metric):
        return GoalCheck(role, goal, None, None, "the reference did not measure it")
    if not newest.figures.get(metric):
        return GoalCheck(role, goal, None, None, "the newest run did not measure it (its trials failed?)")
    absolute = goal.absolute and metric in RATE_METRICS
    if noise is not None and not absolute:
        runs = [e.figures[metric] for e in baseline if e.figures.get(metric)]
        effect = against_history(noise, runs, newest.figures[metric], level)
        delta = (
            None
            if effect is None
            else MetricDelta(
                metric,
                _geomean([_geomean(r) for r in runs]),
                _geomean(newest.figures[metric]),
                effect.rel,
                effect.low,
                effect.high,
                units=effect.units,
                method=effect.method,
                confidence=level,
            )
        )
        se, df = (effect.se, effect.df) if effect is not None else (None, None)
    else:
        delta = _delta(reference, newest, metric, level)
        welch = welch_effect(reference.figures[metric], newest.figures[metric], level)
        se, df = (welch.se, welch.df) if welch.log_scale else (None, None)
    shown = delta is not None and (
        (absolute and delta.points_low is not None) or (not absolute and delta.ci_low is not None)
    )
    if delta is None or not shown:
        n_ref, n_new = len(reference.figures[metric]), len(newest.figures[metric])
        why = (
            f"too few trials: the reference has {n_ref} and the newest run {n_new}; an interval needs two a side, "
            "or `--noise history` with earlier runs of the reference's configuration"
        )
        return GoalCheck(role, goal, delta, None, why)
    outcome = guard_outcome(delta, goal.lower_is_better, goal.tolerance, absolute)
    catch = None
    if se is not None and df is not None and not absolute:
        catch = _worse_limit(goal, detectable(se, df, level))
    return GoalCheck(role, goal, delta, outcome, detectable=catch)


def _judge_gate(limit: GateLimit, newest: RunEntry, noise: RunNoise | None, level: float) -> GateCheck:
    values = newest.figures.get(limit.metric)
    if not values:
        return GateCheck(limit, NOT_JUDGED, None, None, None, "the newest run did not measure it")
    bounds: tuple[float, float, float] | None = None
    if limit.metric in RATE_METRICS and newest.figures.get("errors.count") and newest.figures.get("requests.total"):
        errors, total = int(sum(newest.figures["errors.count"])), int(sum(newest.figures["requests.total"]))
        if total > 0:
            low, high = wilson_interval(errors, total, level)
            bounds = (errors / total, low, high)
    else:
        bounds = level_interval(noise, values, level)
    if bounds is None:
        why = f"too few trials: {len(values)}; an interval needs two, or `--noise history`"
        return GateCheck(limit, NOT_JUDGED, values[0] if len(values) == 1 else None, None, None, why)
    value, low, high = bounds
    upper = limit.op in ("<", "<=")  # the gate fails above its threshold

    def passes(x: float) -> bool:
        return {"<": x < limit.threshold, "<=": x <= limit.threshold, ">": x > limit.threshold}.get(
            limit.op, x >= limit.threshold
        )

    better, worse = (low, high) if upper else (high, low)
    state = FAILED if not passes(better) else (MET if passes(worse) else AT_RISK)
    return GateCheck(limit, state, value, low, high)


def judge(
    reference: RunEntry,
    newest: RunEntry,
    gates: Sequence[GateLimit],
    *,
    noise: str = TRIALS,
    entries: Sequence[RunEntry] = (),
) -> Judgement:
    """The newest run against the reference by the reference's goals; `entries`: the playbook's runs, whose runs
    comparable to the reference give the history's noise when `noise` is HISTORY."""
    goals = reference.goals
    level = goals.confidence if goals is not None else 0.95
    judged: list[tuple[str, GuardGoal]] = []
    if goals is not None:
        judged = [("objective", goals.objective)] if goals.objective else []
        judged += [("guard", g) for g in goals.guards]
    notes: list[str] = []
    runs = history_runs(entries, reference, newest) if noise == HISTORY else []
    baseline = [e for e in runs if _image(e) == _image(reference)]
    used = TRIALS
    checks = []
    for role, goal in judged:
        history = _history_noise(runs, goal.metric) if runs else None
        if history is not None and own_noise_agrees(history, newest.figures.get(goal.metric, ())) is False:
            notes.append(
                f"{label_of(goal.metric)}: the newest run's own spread is larger than the history's beyond chance; "
                "its noise is not used (Welch over the two runs' trials instead)"
            )
            history = None
        if history is not None:
            used = HISTORY
        checks.append(_judge_goal(role, goal, reference, newest, history, baseline, level))
    gate_checks = []
    for limit in gates:
        history = _history_noise(runs, limit.metric) if runs else None
        if history is not None and own_noise_agrees(history, newest.figures.get(limit.metric, ())) is False:
            history = None
        gate_checks.append(_judge_gate(limit, newest, history, level))
    if noise == HISTORY:
        ids = ", ".join(e.run_id for e in runs)
        notes.insert(
            0,
            f"history noise from {len(runs)} run(s) of the reference's configuration ({ids}); "
            f"the baseline: {len(baseline)} run(s) on the reference's engine image",
        )
    return Judgement(tuple(checks), tuple(gate_checks), used, tuple(notes))
