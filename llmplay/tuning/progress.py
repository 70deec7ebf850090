"""The tuning run's progress lines: each finished trial, each step's header and verdict, and a stop by a bug.

The run narrates through a plain line callback (the command prints, a test collects); what a line tells is
archived before it is shown, so these only format."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.catalog import CAPACITY_METRICS, figure, label_of, measured, thin_warning, turn_ttft_p50s
from llmplay.metrics import prefix_reuse_text
from llmplay.spec import ChangeEffect
from llmplay.stats.decide import Decision

Reporter = Callable[[str], None]


class Narrator:
    """The run's voice: plain lines through `report`, warnings through `warn`, and lines whose rendering may fail.

    What a rendered line tells is archived before it is shown, so a bug in rendering it costs only the line: a
    warning (the first time), a note in the diagnosis (`unshown`), and the run goes on."""

    def __init__(self, report: Reporter, warn: Reporter):
        self.report = report
        self.warn = warn
        self.unshown: list[str] = []  # lines a bug kept from being shown, for the diagnosis notes

    def say(self, what: str, render: Callable[[], str]) -> None:
        try:
            self.report(render())
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if not self.unshown:
                self.warn(
                    f"warning: {what} could not be shown ({error}); the run goes on and archives every trial "
                    "(console lines lost later are listed in the diagnosis notes)"
                )
            self.unshown.append(f"{what} ({error})")


def describe_trial(trial: TrialRecord) -> str:
    """The console line of a finished trial: its headline figures (an absent one says why), or why it failed;
    percentiles resting on too few requests are named at the end of the line."""
    # A search step's candidates are several configurations under one role: name the value measured.
    side = trial.config_id if trial.role == "candidate" and trial.config_id != trial.step else trial.role
    role = f"{trial.step or 'baseline'}/{side} #{trial.repeat + 1}"
    if trial.status != TRIAL_OK:
        return f"  trial {trial.trial_id} {role}: FAILED: {trial.error or 'no reason recorded'}"
    s: Mapping[str, float] = trial.summary
    shown = ("ttft.p95", "tpot.p95", "errors.rate")
    figures = [f"output {figure('throughput.output_tok_s', s)}", *(f"{label_of(m)} {figure(m, s)}" for m in shown)]
    head = ""
    if "capacity.runs" in s:  # a capacity search: its boundary first, the figures after are its boundary probe's
        found = [f"{label_of(m)} {figure(m, s)}" for m in CAPACITY_METRICS if measured(s.get(m)) is not None]
        head = ", ".join(found or ["capacity not measured (indeterminate, or outside its bounds)"])
        head += "; at the boundary probe: "
    if (reuse := prefix_reuse_text(s)) is not None:
        figures.append(reuse)
    if (sessions := session_text(s)) is not None:
        figures.append(sessions)
    thin = [warning for m in shown if (warning := thin_warning(m, s)) is not None]
    return f"  trial {trial.trial_id} {role}: {head}{', '.join(figures)}" + (f" — {'; '.join(thin)}" if thin else "")


def session_text(s: Mapping[str, float]) -> str | None:
    """Conversations of several turns: how many, and P50 TTFT by turn ("12 conversations, P50 TTFT by turn
    1: 41 ms, 2: 55 ms"); None for a workload of one turn."""
    count = measured(s.get("session.count"))
    if count is None:
        return None
    turns = turn_ttft_p50s(s)
    by_turn = ", P50 TTFT by turn " + ", ".join(f"{k}: {v * 1000:.0f} ms" for k, v in turns) if turns else ""
    return f"{count:.0f} conversations{by_turn}"


def step_line(head: str, effects: Sequence[ChangeEffect]) -> str:
    return f"{head}: " + "; ".join(e.describe() for e in effects)


def verdict_line(decision: Decision) -> str:
    return f"  -> {decision.verdict}: {decision.reason}"


def stopped_by_bug(exc: Exception, run_dir: Path) -> str:
    return (
        f"stopped by an internal error ({type(exc).__name__}: {exc}); every finished trial is archived: "
        f"continue with llmplay run --resume {run_dir}"
    )
