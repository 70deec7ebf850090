"""Interrupted runs to resume, made through the real command path with trials handed in (no engine).

`Trials` measures 20 streamed requests per trial and can raise KeyboardInterrupt at a chosen trial (a Ctrl-C in the
middle of the run); `seam_run_playbook` wires it into `llmplay run` as the CLI calls it, so a test sees which
configuration every trial was asked for and what the resumed run archived.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml

from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.loadgen.records import RequestRecord
from llmplay.metrics import per_request_frame, summarize
from llmplay.tuning.trial import TrialResult, trial_sample

ROOT = Path(__file__).resolve().parents[1]
MS = 1_000_000


class Trials:
    """20 streamed requests per trial; `seen` keeps (trial id, image, concurrency, duration) of every trial asked
    for, and the trial numbered `interrupt_at` raises KeyboardInterrupt (a Ctrl-C in the middle of the run)."""

    def __init__(self, playbook: Any, interrupt_at: int | None = None):
        self.playbook, self.interrupt_at = playbook, interrupt_at
        self.seen: list[tuple[str, str | None, int, float | None]] = []

    def __call__(self, config: Any, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult:
        if self.interrupt_at is not None and len(self.seen) + 1 == self.interrupt_at:
            raise KeyboardInterrupt("Ctrl-C")
        self.seen.append((trial_id, config.engine.image, config.workload.concurrency, config.workload.duration_s))
        records = []
        for i in range(20):
            sent = (1 + i) * 100 * MS
            first = sent + int(40 * (1 + 0.02 * (i % 5)) * MS)
            chunks = tuple(first + k * 10 * MS for k in range(8))
            records.append(
                RequestRecord(
                    i, False, True, sent, sent, first, first, chunks, chunks[-1], 64, 8, "usage", "length", 200,
                    None, None, 0.0,
                )
            )  # fmt: skip
        # as the runner archives it: a figure it could not compute stays, as None
        summary = cast(dict[str, float], dict(summarize(records, 2.2, self.playbook.goals.slo_s).as_dict()))
        trial = TrialRecord(trial_id, config.label, step, role, repeat, TRIAL_OK, "2026-12-04T00:00:00Z", 2.2, summary)
        frame = per_request_frame(records)
        return TrialResult(trial, frame, sample=trial_sample(self.playbook, config, trial, frame))


def write_playbook(path: Path, **workload: Any) -> Path:
    """playbooks/cpu-tiny.yaml as `resume`: process runtime, two repeats, one step (parallel-4)."""
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["metadata"]["name"] = "resume"
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2}
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}]
    doc["workload"].update(workload)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def use_trials(monkeypatch: Any, interrupt_at: int | None = 3) -> list[Trials]:
    """`llmplay run` as the CLI calls it, its trials measured by Trials: the first run is interrupted at trial
    `interrupt_at`, every later one (a --resume) runs to the end. The list holds one Trials per run started."""
    from llmplay.commands import run as run_command_module  # deferred: only the tests that run a playbook need it
    from llmplay.tuning.run import run_playbook

    made: list[Trials] = []

    def with_trials(playbook: Any, options: Any, **kwargs: Any) -> Any:
        made.append(Trials(playbook, interrupt_at=interrupt_at if not made else None))
        return run_playbook(playbook, options, measure_trial=made[-1], **kwargs)

    monkeypatch.setattr(run_command_module, "run_playbook", with_trials)
    monkeypatch.setattr(run_command_module, "publish_run", None)
    return made
