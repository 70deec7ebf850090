"""The tuning session's page: the trail (`trail.json`) handed to the report as its records, rendered beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmplay.report.trail import CandidateLine, RacedLine, RoundLine, SessionPage, render_session
from llmplay.tune import trail
from llmplay.tune.rank import Ranked
from llmplay.tune.trail import Raced, Trail


def _lines(ranked: Sequence[Ranked]) -> tuple[CandidateLine, ...]:
    return tuple(
        CandidateLine(c.remedy.value, c.knob, tuple(c.values), tuple(c.findings), c.evidence, c.reason, c.rank)
        for c in ranked
    )


def _raced(raced: Sequence[Raced]) -> tuple[RacedLine, ...]:
    return tuple(RacedLine(c.step, c.rank, c.remedy, c.knob, c.verdict, c.reason, c.carried) for c in raced)


def session_page(state: Trail, tune_dir: Path, name: str) -> SessionPage:
    """The page's records: each round with the findings its ranking read (the round before's incumbent's)."""
    rounds = []
    for i, r in enumerate(state.rounds):
        read = state.rounds[i - 1].findings if i else ()
        rounds.append(
            RoundLine(
                r.number,
                r.run_dir,
                dict(r.incumbent),
                read=tuple(read),
                ranked=_lines(r.ranked),
                step=r.step,
                verdict=r.verdict,
                reason=r.reason,
                kept_args=dict(r.kept_args),
                engine_s=r.engine_s,
                raced=_raced(r.raced),
                race=r.race,
            )
        )
    tuned = tune_dir / trail.TUNED_FILE
    return SessionPage(
        name=name,
        playbook=state.playbook,
        tune_dir=str(tune_dir),
        rounds=tuple(rounds),
        stop=state.stop,
        infeasible=state.infeasible,
        alone=dict(state.alone),
        alone_run=state.alone_run,
        alone_s=state.alone_s,
        final_read=tuple(state.rounds[-1].findings) if state.rounds and state.stop else (),
        final_ranking=_lines(state.final_ranking),
        interrupted=state.pending.run_dir if state.pending is not None else "",
        tuned=str(tuned) if tuned.is_file() else "",
    )


def write_page(state: Trail, tune_dir: Path, name: str) -> Path:
    """Render the session's report.html from its trail and the rounds' archives; its path."""
    return render_session(session_page(state, tune_dir, name))
