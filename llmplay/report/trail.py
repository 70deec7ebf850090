"""The tuning session's page (`report.html` beside `trail.json` and `tuned.yaml`): its decision trail as records the
tuner hands over (what each round read, ranked, chose and decided, and why it stopped), with each round's figures
and intervals read from that round's own archive. Nothing here knows how the tuner ranks or runs: it lays out what
`trail.json` and the rounds' archives say, so the page is rebuilt from them alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmplay.archive.layout import REPORT_FILE
from llmplay.archive.model import KEPT, Finding, StepVerdict
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.writer import atomic_write_text
from llmplay.catalog import fmt_ci, fmt_full, fmt_pct, label_of
from llmplay.report.data import arrow
from llmplay.report.diagnosis import finding_rows
from llmplay.report.html import render_html
from llmplay.report.steps import ci_header, delta_rows
from llmplay.spec import Scalar

TUNE_REPORT_FILE = "report.html"  # in the tuning directory, as a run's report.html is in its run directory
# The figures the final configuration is shown against the baseline with (the objective joins them).
HEADLINE_METRICS = ("ttft.p95", "tpot.p95", "throughput.output_tok_s")


@dataclass(frozen=True)
class CandidateLine:
    """One candidate of a ranking: ranked (`rank` 1 was run) or skipped (`rank` None), with its reason."""

    remedy: str
    knob: str | None
    values: tuple[Scalar, ...]
    findings: tuple[str, ...]  # the ids of the findings calling for it
    evidence: str
    reason: str
    rank: int | None


@dataclass(frozen=True)
class RacedLine:
    """One candidate of a raced round (tune.race on a cluster): its step against the incumbent and its own verdict;
    `carried` the one the round carried (the first kept in ranking order)."""

    step: str
    rank: int
    remedy: str
    knob: str
    verdict: str
    reason: str
    carried: bool


@dataclass(frozen=True)
class RoundLine:
    """One round: the findings its ranking read (the incumbent's, from the round before), the ranking, the step run,
    its verdict, and the engine time its run spent."""

    number: int  # 0: the baseline and the playbook's own steps
    run_dir: str
    incumbent: Mapping[str, Scalar]
    read: tuple[Finding, ...] = ()
    ranked: tuple[CandidateLine, ...] = ()
    step: str | None = None
    verdict: str | None = None
    reason: str = ""
    kept_args: Mapping[str, Scalar] = field(default_factory=dict)
    engine_s: float = 0.0
    raced: tuple[RacedLine, ...] = ()  # a raced round: every candidate it ran, in ranking order (its step among them)
    race: str = ""  # how many it raced, and why the one carried was chosen


@dataclass(frozen=True)
class SessionPage:
    """A tuning session as its page shows it."""

    name: str  # the playbook's name
    playbook: str  # its path
    tune_dir: str
    rounds: tuple[RoundLine, ...]
    stop: str  # "" while it runs (an interrupted session)
    infeasible: bool
    alone: Mapping[str, float] = field(default_factory=dict)  # one request alone: its figures
    alone_run: str = ""
    alone_s: float = 0.0
    final_read: tuple[Finding, ...] = ()  # the findings the last ranking read
    final_ranking: tuple[CandidateLine, ...] = ()
    interrupted: str = ""  # the run a stopped session continues with --resume
    tuned: str = ""  # tuned.yaml, "" when none was written


def _link(tune_dir: Path, run_dir: str) -> dict[str, str]:
    """The run's own report, relative to the session's page; `missing` says how to render one not yet written."""
    report = Path(run_dir) / REPORT_FILE
    missing = "" if report.is_file() else f"not rendered yet: llmplay report {run_dir}"
    return {"run_dir": run_dir, "href": os.path.relpath(report, tune_dir), "missing": missing}


def _ranking(ranked: Sequence[CandidateLine]) -> list[dict[str, object]]:
    return [
        {
            "rank": "skipped" if c.rank is None else f"#{c.rank}",
            "skipped": c.rank is None,
            "candidate": f"{c.remedy}: {c.knob or '(no knob)'}"
            + (f" → {', '.join(map(str, c.values))}" if c.values and c.rank is not None else ""),
            "findings": ", ".join(c.findings),
            "evidence": c.evidence,
            "reason": c.reason,
        }
        for c in ranked
    ]


def _verdict(run: ArchivedRun, step: str) -> StepVerdict | None:
    return next((v for v in run.verdicts() if v.step == step), None)


def _raced(run: ArchivedRun, raced: Sequence[RacedLine]) -> list[dict[str, object]]:
    """A raced round's candidates, each with its own verdict and objective interval from the round's archive."""
    verdicts = {v.step: v for v in run.verdicts()}
    rows: list[dict[str, object]] = []
    for c in raced:
        objective = verdicts[c.step].objective if c.step in verdicts else None
        interval = (
            f"{fmt_pct(objective.rel_change)} {fmt_ci(objective.ci_low, objective.ci_high)}" if objective else "—"
        )
        rows.append(
            {
                "rank": f"#{c.rank}",
                "step": c.step,
                "candidate": f"{c.remedy}: {c.knob or '(no knob)'}",
                "verdict": c.verdict,
                "objective": interval,
                "carried": "carried: the first kept in ranking order" if c.carried else "not carried",
                "reason": c.reason,
            }
        )
    return rows


def _round(tune_dir: Path, r: RoundLine) -> dict[str, object]:
    run = ArchivedRun.open(Path(r.run_dir))
    verdict = _verdict(run, r.step) if r.step else None
    own = run.verdicts() if r.number == 0 else []  # round 0: the playbook's own steps
    return {
        "number": r.number,
        "title": "Round 0: the baseline and the playbook's own steps" if r.number == 0 else f"Round {r.number}",
        "link": _link(tune_dir, r.run_dir),
        "incumbent": _knobs(r.incumbent),
        "read": finding_rows(r.read),
        "ranking": _ranking(r.ranked),
        "step": r.step or "",
        "verdict": r.verdict or "",
        "reason": r.reason,
        "changes": [arrow(c) for c in verdict.changes] if verdict else [],
        "deltas": delta_rows(verdict) if verdict else [],
        "ci_header": ci_header(verdict) if verdict else "CI",
        "own": [{"step": v.step, "verdict": v.verdict, "reason": v.reason} for v in own],
        "raced": _raced(run, r.raced),
        "race": r.race,
        "carried": any(c.carried for c in r.raced),
        "engine": f"{r.engine_s / 60:.1f} engine minutes ({r.engine_s:.0f} s)",
    }


def _knobs(args: Mapping[str, Scalar]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(args.items())) or "(the engine's defaults)"


def _row_metrics(run: ArchivedRun, config_id: str | None) -> Mapping[str, float]:
    return next((row.metrics for row in run.tuning_record() if row.config_id == config_id), {})


def _kept_steps(rounds: Sequence[RoundLine]) -> list[tuple[str, StepVerdict]]:
    """Every verdict that carried its configuration forward, in order: round 0's own steps, then the tuner's."""
    out = []
    for r in rounds:
        for v in ArchivedRun.open(Path(r.run_dir)).verdicts():
            if v.carried and v.verdict == KEPT and (r.number == 0 or v.step == r.step):
                out.append((f"round {r.number}: {v.step}", v))
    return out


def _final(page: SessionPage, objective: str) -> dict[str, object] | None:
    """The final configuration against the baseline: round 0's baseline figures, the last kept configuration's, and
    each kept step's interval on each figure (a step's interval is against the incumbent it was run on)."""
    if not page.rounds:
        return None
    first = ArchivedRun.open(Path(page.rounds[0].run_dir))
    baseline = _row_metrics(first, "baseline")
    kept = _kept_steps(page.rounds)
    last = next((r for r in reversed(page.rounds) if r.verdict == KEPT), page.rounds[0])
    last_run = ArchivedRun.open(Path(last.run_dir))
    final = _row_metrics(last_run, last_run.info.final_config_id)
    metrics = [*HEADLINE_METRICS, *([objective] if objective and objective not in HEADLINE_METRICS else [])]
    rows = []
    for m in metrics:
        b, f = baseline.get(m), final.get(m)
        steps = []
        for name, v in kept:
            d = next((d for d in (v.objective, *v.guards, *v.deltas) if d is not None and d.metric == m), None)
            if d is not None:
                steps.append(f"{name} {fmt_pct(d.rel_change)} {fmt_ci(d.ci_low, d.ci_high)}")
        change = (f - b) / b if b and f is not None else None
        rows.append(
            {
                "metric": label_of(m),
                "baseline": fmt_full(m, b),
                "final": fmt_full(m, f),
                "change": fmt_pct(change),
                "steps": steps,
            }
        )
    final_args = page.rounds[-1].kept_args
    knobs = sorted({*page.rounds[0].incumbent, *final_args})
    return {
        "rows": rows,
        "kept": [name for name, _ in kept],
        "knobs": [
            {"knob": k, "baseline": str(page.rounds[0].incumbent.get(k, "—")), "final": str(final_args.get(k, "—"))}
            for k in knobs
            if page.rounds[0].incumbent.get(k) != final_args.get(k)
        ],
        "final_knobs": _knobs(final_args),
    }


def session_context(page: SessionPage) -> dict[str, object]:
    """Everything the session's page shows, from its records and the rounds' archives."""
    tune_dir = Path(page.tune_dir)
    objective = ""
    if page.rounds:
        objective = ArchivedRun.open(Path(page.rounds[0].run_dir)).playbook_as_run().objective
    engine_s = page.alone_s + sum(r.engine_s for r in page.rounds)
    return {
        "page": page,
        "objective": objective or "—",
        "steps_chosen": sum(len(r.raced) or (1 if r.step else 0) for r in page.rounds),  # each raced one counts
        "engine": f"{engine_s / 60:.1f} engine minutes",
        "alone": {
            "link": _link(tune_dir, page.alone_run) if page.alone_run else None,
            "figures": [(label_of(m), fmt_full(m, page.alone.get(m))) for m in ("ttft.p95", "ttft.p50", "tpot.p95")],
            "engine": f"{page.alone_s:.0f} s",
        },
        "rounds": [_round(tune_dir, r) for r in page.rounds],
        "final": _final(page, objective.split(" ")[-1] if objective else ""),
        "final_read": finding_rows(page.final_read),
        "final_ranking": _ranking(page.final_ranking),
        "tuned": os.path.relpath(page.tuned, tune_dir) if page.tuned else "",
    }


def render_session(page: SessionPage) -> Path:
    """Write the session's page into its tuning directory and return its path."""
    path = Path(page.tune_dir) / TUNE_REPORT_FILE
    atomic_write_text(path, render_html("tune.html.j2", session_context(page)))
    return path
