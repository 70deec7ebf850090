"""One test case per gate, per step verdict and per judged metric of a comparison: what a CI system shows as
passed, failed or skipped, and the one line that says why.

A case fails exactly where the command's exit code says something failed: a gate the final configuration missed
or could not measure (`run`, exit 3), a regression beyond a tolerance or changed greedy outputs (`retest`,
`compare`, `history --check`, exit 4). A step that was decided (kept or rejected) passed: the tuning answered
it. An inconclusive step is skipped with its interval and how many more trials would decide it, and so is a step
whose candidate failed to run: neither moves the exit code, and neither is a regression. A run that did not
complete, or a check that could judge nothing, is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmplay.archive.model import FAILED, INCONCLUSIVE, GateResult, StepVerdict
from llmplay.catalog import fmt_ci, fmt_full, fmt_pct, label_of, measured
from llmplay.compare import GateComparison, MetricComparison
from llmplay.outputs.facts import RunFacts, Section

PASSED, FAILURE, SKIPPED, ERROR = "passed", "failure", "skipped", "error"  # FAILURE and ERROR: JUnit's tags


@dataclass(frozen=True)
class Case:
    group: str  # "gates", "steps", "regressions", "run": the JUnit classname's last part
    name: str
    outcome: str  # PASSED | FAILURE | SKIPPED | ERROR
    message: str  # one line: why it failed, was skipped, or passed
    detail: str = ""  # further lines (a step's changes, what coincided)


def trial_range(run: RunFacts, metric: str, *, gate: bool = False) -> str:
    """The spread of a figure over the final configuration's trials (those its gates were judged on, with `gate`),
    "per-trial 52.1 ms to 61.0 ms over 3 trials"; "" with fewer than two."""
    values = (run.gate_per_trial if gate else run.per_trial).get(metric, ())
    if len(values) < 2:
        return ""
    return f"per-trial {fmt_full(metric, min(values))} to {fmt_full(metric, max(values))} over {len(values)} trials"


def gate_state(gate: GateResult) -> str:
    return "not measured" if gate.met is None else ("met" if gate.met else "FAILED")


def gate_message(gate: GateResult, run: RunFacts) -> str:
    """`ttft.p95 < 2s: observed 2.31 s (per-trial 2.10 s to 2.52 s over 3 trials) -> FAILED (margin -16%)`."""
    observed = measured(gate.observed)
    if observed is None:
        return f"{gate.gate}: not measured ({gate.note or 'no figure'}) -> not met"
    spread = trial_range(run, gate.metric, gate=True)
    margin = measured(gate.margin)
    return (
        f"{gate.gate}: observed {fmt_full(gate.metric, observed)}"
        + (f" ({spread})" if spread else "")
        + f" -> {gate_state(gate)}"
        + (f" (margin {margin:+.0%})" if margin is not None else "")
        + (f"; {gate.note}" if gate.note else "")
    )


def _gate_case(gate: GateResult, run: RunFacts) -> Case:
    outcome = PASSED if gate.met else FAILURE
    return Case("gates", f"gate {gate.gate}", outcome, gate_message(gate, run))


def objective_text(verdict: StepVerdict, confidence: float) -> str:
    """`P95 TTFT -67.5% [-74.5%, -58.4%] (95% CI over 3 pairs)`; "" when the step has no objective delta."""
    d = verdict.objective
    if d is None:
        return ""
    level = d.confidence if d.confidence is not None else confidence
    over = f" over {d.units} {'pairs' if d.method and 'paired' in d.method else 'trials'}" if d.units else ""
    ci = fmt_ci(d.ci_low, d.ci_high)
    return f"{label_of(d.metric)} {fmt_pct(d.rel_change)}" + (f" {ci} ({level:.0%} CI{over})" if ci else "")


def _step_case(verdict: StepVerdict, confidence: float) -> Case:
    name = f"step {verdict.index} {verdict.step}"
    detail = "\n".join(
        [
            f"changes: {', '.join(verdict.changes) or '(none)'}",
            f"compared with: {verdict.baseline_config}",
            *([f"objective: {text}"] if (text := objective_text(verdict, confidence)) else []),
        ]
    )
    if verdict.verdict == INCONCLUSIVE:
        return Case("steps", name, SKIPPED, f"inconclusive: {verdict.reason}", detail)
    if verdict.verdict == FAILED:
        return Case("steps", name, SKIPPED, f"the candidate failed: {verdict.reason}", detail)
    return Case("steps", name, PASSED, f"{verdict.verdict}: {verdict.reason}", detail)


def _metric_case(m: MetricComparison, confidence_label: str) -> Case:
    name = f"{m.role} {m.label}"
    if m.regression:
        return Case("regressions", name, FAILURE, m.why)
    if m.a is None or m.b is None:
        return Case("regressions", name, SKIPPED, f"not judged: {m.note}")
    ci = f" {fmt_ci(m.ci_low, m.ci_high)} ({confidence_label})" if m.ci_low is not None else ""
    limit = f" within its {m.tolerance_text} tolerance" if m.tolerance_text else ""
    change = f"{fmt_full(m.metric, m.a)} -> {fmt_full(m.metric, m.b)} ({fmt_pct(m.rel_change)}{ci})"
    return Case("regressions", name, PASSED, f"{change}{limit}", m.note)


def _gate_comparison_case(g: GateComparison, run: RunFacts) -> Case:
    name = f"gate {g.gate}"
    after = gate_message(g.b, run) if g.b is not None else f"{g.gate}: not evaluated in the newer run"
    if g.regression:
        return Case("regressions", name, FAILURE, f"met in the reference, failed now: {after}")
    if g.b is None or g.b.met is None:
        return Case("regressions", name, SKIPPED, f"not judged: {after}")
    if not g.b.met:
        return Case("regressions", name, SKIPPED, f"not judged: the reference did not meet it either; {after}")
    return Case("regressions", name, PASSED, after)


def run_cases(section: Section) -> list[Case]:
    run = section.run
    cases: list[Case] = []
    if run.status != "complete":
        cases.append(Case("run", "run completed", ERROR, f"the run did not complete ({run.status})"))
    cases += [_gate_case(g, run) for g in run.gates]
    cases += [_step_case(v, run.confidence) for v in run.verdicts]
    return cases


def comparison_cases(section: Section) -> list[Case]:
    comparison = section.comparison
    assert comparison is not None  # a comparison section always carries one
    cases = [_metric_case(m, comparison.ci_label) for m in comparison.metrics if m.role]
    cases += [_gate_comparison_case(g, section.run) for g in comparison.gates]
    cases += [Case("regressions", name, FAILURE, message) for name, message in section.failures]
    if section.error is not None:
        cases.append(Case("regressions", "measured what the reference measured", ERROR, section.error))
    return cases


def cases_of(section: Section) -> list[Case]:
    """Every case of one section, in the order a reader goes through it."""
    if section.nothing_newer is not None:
        return [Case("regressions", "a run newer than the reference", SKIPPED, section.nothing_newer)]
    return comparison_cases(section) if section.comparison is not None else run_cases(section)
