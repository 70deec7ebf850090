"""Two archived runs side by side: every metric of each run's final configuration, its change with a CI, regressions.

The two runs' trials are independent (different days, maybe different engines), so each interval is Welch's t over
the trials of each side (stats.intervals), the trial being the unit: requests cluster within a trial.

Regressions are judged by run A's playbook with the rule a step's guards use (stats.decide.regressed_beyond): a
guard metric whose change is worse than its tolerance, the objective worse than its min_effect the same way, or a
gate that A met and B fails. Other metrics are shown and marked worse/better but never fail the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llmplay.archive.layout import RESOLVED_FILE
from llmplay.archive.model import GateResult, MetricDelta, TrialRecord
from llmplay.archive.paths import MAX_TEXT_BYTES, OutsideError, inside
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.writer import atomic_write_text
from llmplay.catalog import COMPARED_METRICS, absence_reason, fmt_full, fmt_pct, label_of, metric_info, thin_comparison
from llmplay.errors import LlmplayError
from llmplay.metrics import usd_per_hour_from_cost
from llmplay.playbook.load import load_playbook
from llmplay.report import charts
from llmplay.report.html import render_html
from llmplay.spec import Goals, Playbook, Trials
from llmplay.stats import TrialSample, compare_metric, describe_delta, regressed_beyond, sample_from_records


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    label: str
    a: float | None
    b: float | None
    rel_change: float | None  # (b - a) / |a|
    ci_low: float | None  # CI of rel_change at Comparison.confidence, Welch t over each run's trials
    ci_high: float | None
    better: bool | None  # is B better, direction-aware
    role: str  # "objective" | "guard" | ""
    tolerance: float | None  # guard tolerance or objective min_effect (relative; points when `in_points`)
    regression: bool
    why: str = ""  # one line when regression
    note: str = ""  # not measured on a side (and why), or a percentile from too few requests
    in_points: bool = False  # a rate's guard: tolerance and decision in percentage points (its count interval)

    @property
    def tolerance_text(self) -> str:
        if self.tolerance is None:
            return ""
        return f"{self.tolerance * 100:g}pp" if self.in_points else f"{self.tolerance:.0%}"


@dataclass(frozen=True)
class GateComparison:
    gate: str
    metric: str
    a: GateResult | None
    b: GateResult | None
    regression: bool  # met in A, failed in B


@dataclass(frozen=True)
class RunSide:
    run_dir: str
    run_id: str
    playbook: str
    config_id: str
    trials: tuple[str, ...]
    engine: str  # image and version
    started_utc: str
    status: str


@dataclass(frozen=True)
class Comparison:
    a: RunSide
    b: RunSide
    metrics: tuple[MetricComparison, ...]
    gates: tuple[GateComparison, ...]
    objective: MetricComparison | None
    notes: tuple[str, ...] = ()
    cdf: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # for the HTML: per metric, per side, values
    confidence: float = Trials.confidence  # run A's trials.confidence: the level of every interval
    # ("A" or "B", what verification found) for a run compared anyway (--unverified); empty when both verify
    unverified: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def ci_label(self) -> str:
        return f"{self.confidence:.0%} CI"

    @property
    def regressions(self) -> list[str]:
        out = [m.why for m in self.metrics if m.regression]
        out += [f"gate {g.gate}: met in A, failed in B" for g in self.gates if g.regression]
        return out

    @property
    def has_regression(self) -> bool:
        return bool(self.regressions)

    @property
    def unmeasured(self) -> list[str]:
        """The objective and guards that could not be judged: a side did not measure them."""
        return [f"{m.role} {m.label} ({m.note})" for m in self.metrics if m.role and (m.a is None or m.b is None)]


# ---------------------------------------------------------------------------------------------- inputs
def _playbook_of(archive: ArchivedRun) -> tuple[Playbook | None, str | None]:
    """Run A's playbook from its archive (resolved first, then as written); never a path outside the run."""
    errors = []
    for relpath in (RESOLVED_FILE, archive.info.playbook.file):
        try:
            path = inside(archive.run_dir, relpath, max_bytes=MAX_TEXT_BYTES)
        except OutsideError as exc:
            if not exc.missing:
                errors.append(str(exc))
            continue
        try:
            return load_playbook(path, archived=True), None
        except LlmplayError as exc:
            errors.append(str(exc).splitlines()[0])
    return None, (
        "run A's playbook could not be loaded ("
        + ("; ".join(errors) or "no playbook file")
        + "): no guard tolerances, only gates decide regressions"
    )


def _sample(archive: ArchivedRun, trial: TrialRecord, slo_s: Mapping[str, float]) -> TrialSample | None:
    """One archived trial as decide.TrialSample, built exactly as the runner built it."""
    records = archive.load_records(trial.trial_id)
    if not len(records):
        return None
    summary = trial.summary
    # the trial's own $/h, recovered from its cost (archives keep the cost, not the price)
    price = usd_per_hour_from_cost(summary.get("cost.usd_per_1m_tokens"), summary.get("throughput.output_tok_s"))
    return sample_from_records(records, float(summary.get("duration_s") or 0.0), dict(summary), slo_s, price)


def _side(archive: ArchivedRun, config_id: str, trials: Sequence[TrialRecord]) -> RunSide:
    info = archive.info
    return RunSide(
        str(archive.run_dir),
        info.run_id,
        info.playbook.name,
        config_id,
        tuple(t.trial_id for t in trials),
        archive.engine_facts().label,
        info.environment.started_utc,
        info.status,
    )


# ---------------------------------------------------------------------------------------------- judging
@dataclass(frozen=True)
class _Judged:
    """How one metric is judged: its role in run A's goals, the tolerance that makes a change a regression, and
    which direction is better."""

    role: str
    tolerance: float | None
    in_points: bool
    lower_better: bool


def _judged(metric: str, goals: Goals | None, d: MetricDelta) -> _Judged:
    info = metric_info(metric)
    lower_better = info.lower_is_better if info else True
    objective = goals.objective if goals is not None else None
    guards = {g.metric: g for g in goals.guards} if goals is not None else {}
    if objective is not None and metric == objective.metric:
        return _Judged("objective", objective.min_effect, False, objective.direction == "minimize")
    if metric in guards:
        guard = guards[metric]
        return _Judged("guard", guard.tolerance, guard.absolute and d.points is not None, guard.direction == "minimize")
    return _Judged("", None, False, lower_better)


def _regression(metric: str, d: MetricDelta, judged: _Judged) -> tuple[bool, str]:
    """Whether the change is worse than its tolerance (never claimed from an absent side), and why in one line."""
    tolerance = judged.tolerance
    if tolerance is None or not regressed_beyond(d, judged.lower_better, tolerance, judged.in_points):
        return False, ""
    if judged.in_points:
        change = describe_delta(d, points=True).removeprefix(label_of(metric) + " ")
        limit = f"{tolerance * 100:g}pp"
    else:
        change = fmt_pct(d.rel_change) if d.rel_change is not None else "from 0"
        change += f" [{fmt_pct(d.ci_low)}, {fmt_pct(d.ci_high)}]"
        limit = f"{tolerance:.0%}"
    return True, (
        f"{judged.role} {label_of(metric)}: {fmt_full(metric, d.baseline)} -> {fmt_full(metric, d.candidate)} "
        f"({change}), beyond its {limit} tolerance"
    )


def _metric_row(metric: str, d: MetricDelta, judged: _Judged) -> MetricComparison:
    regression, why = _regression(metric, d, judged)
    better = None  # only a change whose CI clears zero is called better or worse; the rest is noise
    clear = d.ci_low is not None and d.ci_high is not None and (d.ci_low > 0 or d.ci_high < 0)
    if d.rel_change not in (None, 0) and clear:
        better = (d.rel_change < 0) if judged.lower_better else (d.rel_change > 0)
    missing = [side for side, v in (("A", d.baseline), ("B", d.candidate)) if v is None]
    if missing:
        note = f"not measured on {' or '.join(missing) if len(missing) == 1 else 'either run'}: "
        note += absence_reason(metric)
    else:
        note = thin_comparison(metric, d.n_baseline, d.n_candidate) or ""
    return MetricComparison(
        metric,
        label_of(metric),
        d.baseline,
        d.candidate,
        d.rel_change,
        d.ci_low,
        d.ci_high,
        better,
        judged.role,
        judged.tolerance,
        regression,
        why,
        note,
        judged.in_points,
    )


def _metric_rows(
    goals: Goals | None, samples_a: list[TrialSample], samples_b: list[TrialSample], confidence: float
) -> list[MetricComparison]:
    objective = [goals.objective.metric] if goals is not None else []
    guards = [g.metric for g in goals.guards] if goals is not None else []
    gate_metrics = [g.metric for g in goals.gates] if goals is not None else []
    rows = []
    for metric in dict.fromkeys([*objective, *guards, *COMPARED_METRICS, *gate_metrics]):
        if samples_a and samples_b:
            d = compare_metric(samples_a, samples_b, metric, level=confidence, paired=False)
        else:  # a side without a successful trial measured nothing: its goals' rows still say so
            d = MetricDelta(metric, None, None, None, None, None)
        judged = _judged(metric, goals, d)
        if d.baseline is None and d.candidate is None and not judged.role and metric not in gate_metrics:
            continue  # a figure neither run measured and no goal asks about: nothing to show
        rows.append(_metric_row(metric, d, judged))
    return rows


def _gate_rows(archive_a: ArchivedRun, archive_b: ArchivedRun) -> list[GateComparison]:
    gates_a = {g.gate: g for g in archive_a.gates()}
    gates_b = {g.gate: g for g in archive_b.gates()}
    either = {**gates_a, **{text: g for text, g in gates_b.items() if text not in gates_a}}  # A's gates first
    rows = []
    for text, gate in either.items():
        ga, gb = gates_a.get(text), gates_b.get(text)
        rows.append(
            GateComparison(text, gate.metric, ga, gb, bool(ga and ga.met and gb is not None and gb.met is False))
        )
    return rows


def _cdf(samples_a: list[TrialSample], samples_b: list[TrialSample]) -> dict[str, dict[str, object]]:
    return {
        name: {
            "A": np.concatenate([s.values.get(head, np.array([])) for s in samples_a]) if samples_a else [],
            "B": np.concatenate([s.values.get(head, np.array([])) for s in samples_b]) if samples_b else [],
        }
        for name, head in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2EL", "e2el"))
    }


def compare_runs(run_a: Path, run_b: Path) -> Comparison:
    """Compare the final configuration of run B against run A's, with A's playbook deciding regressions."""
    archive_a, archive_b = ArchivedRun.open(Path(run_a)), ArchivedRun.open(Path(run_b))
    playbook, note = _playbook_of(archive_a)
    goals = playbook.goals if playbook is not None else None
    confidence = playbook.trials.confidence if playbook is not None else Trials.confidence
    notes = [note] if note else []
    slo_s = dict(goals.slo_s) if goals is not None else {}
    config_a, trials_a = archive_a.final_trials()
    config_b, trials_b = archive_b.final_trials()
    samples_a = [s for t in trials_a if (s := _sample(archive_a, t, slo_s)) is not None]
    samples_b = [s for t in trials_b if (s := _sample(archive_b, t, slo_s)) is not None]
    for name, samples in (("A", samples_a), ("B", samples_b)):
        if not samples:
            notes.append(f"run {name} has no successful trial of its final configuration: nothing to compare")
    rows = _metric_rows(goals, samples_a, samples_b, confidence)
    return Comparison(
        _side(archive_a, config_a, trials_a),
        _side(archive_b, config_b, trials_b),
        tuple(rows),
        tuple(_gate_rows(archive_a, archive_b)),
        next((r for r in rows if r.role == "objective"), None),
        tuple(notes),
        _cdf(samples_a, samples_b),
        confidence,
    )


# ---------------------------------------------------------------------------------------------- output
def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def format_comparison_table(comparison: Comparison, *, verdict: bool = True) -> str:
    """Plain text for a terminal or a CI log: metrics, gates, verdict line (left to the caller when not `verdict`)."""
    a, b = comparison.a, comparison.b
    out = [
        f"WARNING: run {side} ({(a if side == 'A' else b).run_dir}) failed verification: {problems[0]}"
        + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        + "; compared anyway (--unverified)"
        for side, problems in comparison.unverified
    ]
    out += [
        f"A: {a.run_dir} ({a.config_id}, {len(a.trials)} trials, {a.engine})",
        f"B: {b.run_dir} ({b.config_id}, {len(b.trials)} trials, {b.engine})",
        "",
    ]
    rows = []
    for m in comparison.metrics:
        flag = "REGRESSION" if m.regression else ("worse" if m.better is False else ("better" if m.better else ""))
        rows.append(
            [
                m.label,
                m.role,
                fmt_full(m.metric, m.a),
                fmt_full(m.metric, m.b),
                fmt_pct(m.rel_change),
                f"[{fmt_pct(m.ci_low)}, {fmt_pct(m.ci_high)}]" if m.ci_low is not None else "",
                m.tolerance_text,
                flag,
                m.note,
            ]
        )
    out += _table(
        ["metric", "role", "A", "B", "change", comparison.ci_label, "tolerance", "", "note"], rows, {2, 3, 4, 5, 6}
    )
    if comparison.gates:
        out.append("")
        grows = []
        for g in comparison.gates:

            def state(r: GateResult | None) -> str:
                return "—" if r is None else ("not measured" if r.met is None else ("met" if r.met else "FAILED"))

            grows.append([g.gate, state(g.a), state(g.b), "REGRESSION" if g.regression else ""])
        out += _table(["gate", "A", "B", ""], grows, set())
    for note in comparison.notes:
        out.append(f"note: {note}")
    if not verdict:
        return "\n".join(out)
    out.append("")
    if comparison.has_regression:
        out.append("REGRESSION: " + "; ".join(comparison.regressions))
    elif comparison.unmeasured:  # "every guard holds" would be a claim built on nothing
        out.append("no regression in what both runs measured; not judged: " + "; ".join(comparison.unmeasured))
    else:
        out.append("no regression: every guard, the objective and every gate hold within run A's tolerances")
    return "\n".join(out)


def render_comparison_html(comparison: Comparison, out_path: Path) -> Path:
    """One self-contained HTML page (inline CSS and SVG, no script, no network)."""
    rows = [
        {
            "label": m.label,
            "role": m.role,
            "a": fmt_full(m.metric, m.a),
            "b": fmt_full(m.metric, m.b),
            "delta": fmt_pct(m.rel_change),
            "ci": f"[{fmt_pct(m.ci_low)}, {fmt_pct(m.ci_high)}]" if m.ci_low is not None else "",
            "tolerance": m.tolerance_text,
            "flag": "regression"
            if m.regression
            else ("worse" if m.better is False else ("better" if m.better else "")),
            "why": m.why,
            "note": m.note,
        }
        for m in comparison.metrics
    ]

    def state(r: GateResult | None) -> str:
        return "—" if r is None else ("not measured" if r.met is None else ("met" if r.met else "failed"))

    gates = [{"gate": g.gate, "a": state(g.a), "b": state(g.b), "regression": g.regression} for g in comparison.gates]
    panels = [
        (f"{name} CDF", {"A": np.asarray(v["A"], dtype=float), "B": np.asarray(v["B"], dtype=float)})
        for name, v in comparison.cdf.items()
    ]
    context = {
        "a": comparison.a,
        "b": comparison.b,
        "rows": rows,
        "gates": gates,
        "regressions": comparison.regressions,
        "notes": list(comparison.notes),
        "unmeasured": comparison.unmeasured,
        "ci_label": f"{comparison.ci_label} (Welch t over trials)",
        "cdf": charts.latency_cdfs(panels) if panels else "",
        "unverified": [(side, list(problems)) for side, problems in comparison.unverified],
    }
    html = render_html("compare.html.j2", context)
    out_path = Path(out_path)
    atomic_write_text(out_path, html)
    return out_path
