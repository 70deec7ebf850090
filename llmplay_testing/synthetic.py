"""Synthetic trials for TuningRun's `measure_trial` seam: the archived record of a trial no engine ran."""

from __future__ import annotations

from collections.abc import Mapping

from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.spec import Config

STARTED_UTC = "2026-12-03T00:00:00Z"


def scripted_trial(
    config: Config,
    *,
    trial_id: str,
    step: str | None,
    role: str,
    repeat: int,
    summary: Mapping[str, float],
    status: str = TRIAL_OK,
    wall_s: float = 0.0,
    error: str | None = None,
) -> TrialRecord:
    """The TrialRecord run_trial would archive for `config`, with the given summary."""
    return TrialRecord(
        trial_id=trial_id,
        config_id=config.label,
        step=step,
        role=role,
        repeat=repeat,
        status=status,
        started_utc=STARTED_UTC,
        wall_s=wall_s,
        summary=summary,
        error=error,
    )
