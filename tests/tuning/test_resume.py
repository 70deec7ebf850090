"""`--resume` continues the archived playbook and overrides, never a file edited since the run started.

Trials come through TuningRun's `measure_trial` seam (the command's own path otherwise: run_command loads, notes and
merges exactly as `llmplay run --resume` does), so each test sees which configuration every trial was asked for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.archive.verify import verify
from llmplay.commands import run as run_command_module
from llmplay.commands.run import run_command
from llmplay.errors import PlaybookError
from llmplay.loadgen.records import RequestRecord
from llmplay.metrics import per_request_frame, summarize
from llmplay.tuning.resume import yaml_differences
from llmplay.tuning.run import run_playbook
from llmplay.tuning.trial import TrialResult, trial_sample

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000


class Trials:
    """20 streamed requests per trial; `seen` keeps (trial id, image, concurrency, duration) of every trial asked
    for, and the trial numbered `interrupt_at` raises KeyboardInterrupt (a Ctrl-C in the middle of the run)."""

    def __init__(self, playbook: Any, interrupt_at: int | None = None):
        self.playbook, self.interrupt_at = playbook, interrupt_at
        self.seen: list[tuple[str, str | None, int, float | None]] = []

    def __call__(self, config, *, trial_id, step, role, repeat) -> TrialResult:
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
        summary = dict(summarize(records, 2.2, self.playbook.goals.slo_s).as_dict())
        trial = TrialRecord(trial_id, config.label, step, role, repeat, TRIAL_OK, "2026-12-04T00:00:00Z", 2.2, summary)
        frame = per_request_frame(records)
        return TrialResult(trial, frame, sample=trial_sample(self.playbook, config, trial, frame))


def write_playbook(path: Path, **workload: Any) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["metadata"]["name"] = "resume"
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2}
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}]
    doc["workload"].update(workload)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch) -> list[Trials]:
    """run_command as the CLI calls it, its trials measured by Trials (the first run is interrupted at trial 3)."""
    made: list[Trials] = []

    def with_trials(playbook, options, **kwargs):
        made.append(Trials(playbook, interrupt_at=3 if not made else None))
        return run_playbook(playbook, options, measure_trial=made[-1], **kwargs)

    monkeypatch.setattr(run_command_module, "run_playbook", with_trials)
    monkeypatch.setattr(run_command_module, "publish_run", None)
    return made


def cli_run(file: Path | None, archive: Path, resume: Path | None = None, **given: Any) -> int:
    options: dict[str, Any] = {"only": (), "repeats": None, "duration": None, "warmup": None, **given}
    return run_command(file, archive_dir=str(archive), resume=resume, dry_run=False, **options)


def test_resume_runs_the_archived_playbook_not_the_edited_file(tmp_path, seam, capsys):
    path = write_playbook(tmp_path / "resume.yaml", concurrency=4)
    assert cli_run(path, tmp_path / "r", duration="3s") == 130
    (run_dir,) = (tmp_path / "r" / "resume").iterdir()
    started = manifest(run_dir)
    assert started["status"] == "interrupted" and len(started["trials"]) == 2
    capsys.readouterr()

    # Edited between the interrupt and --resume: another workload and another image.
    doc = yaml.safe_load(path.read_text())
    doc["workload"]["concurrency"] = 16
    doc["engine"]["image"] = "llmplay/llamacpp-cpu:edited"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))

    assert cli_run(None, tmp_path / "r", resume=run_dir) in (0, 3)
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if " changed since this run started" in line]
    assert len(notes) == 1, out
    note = notes[0]
    assert note == (
        f"note: {path} changed since this run started (differs at workload.concurrency, engine.image); resuming "
        f"with the archived playbook {run_dir / 'playbook.resolved.yaml'}, not the edited file"
    )
    first, resumed = seam
    assert [t[0] for t in resumed.seen] == ["t003", "t004"]  # the two trials the interrupt kept from running
    # every trial, before and after the edit, ran the archived playbook with the run's --duration 3s
    assert {t[1:] for t in first.seen + resumed.seen} == {("llmplay/llamacpp-cpu:local", 4, 3.0)}
    finished = manifest(run_dir)
    assert finished["status"] == "complete" and len(finished["trials"]) == 4
    assert finished["playbook"] == started["playbook"] and finished["overrides"] == {"duration_s": 3.0}
    assert verify(run_dir) == []


def test_resume_without_an_edit_says_nothing_and_a_changed_override_is_refused(tmp_path, seam, capsys):
    path = write_playbook(tmp_path / "resume.yaml")
    assert cli_run(path, tmp_path / "r", duration="3s") == 130
    (run_dir,) = (tmp_path / "r" / "resume").iterdir()
    with pytest.raises(PlaybookError) as refused:
        cli_run(path, tmp_path / "r", resume=run_dir, duration="5s")
    assert str(refused.value) == (
        f"--resume {run_dir}: duration_s 5.0 given, but the run started with 3.0; a resumed run keeps what it "
        "started with (start a new run to change it)"
    )
    capsys.readouterr()
    path.unlink()  # the original file may be gone: the archive holds the playbook
    assert cli_run(None, tmp_path / "r", resume=run_dir) in (0, 3)
    assert "changed since this run started" not in capsys.readouterr().out
    assert manifest(run_dir)["status"] == "complete" and verify(run_dir) == []


def test_yaml_differences_name_paths_in_document_order():
    old = {"workload": {"concurrency": 4, "seed": 1}, "steps": [{"set": {"parallel": 4}}], "engine": {"image": "a"}}
    new = {"workload": {"concurrency": 8, "seed": 1}, "steps": [{"set": {"parallel": 2}}], "cost": {}}
    assert yaml_differences(old, new) == ["workload.concurrency", "steps[0].set.parallel", "engine", "cost"]
    assert yaml_differences(old, old) == []


def test_a_stopped_run_says_why_its_gates_were_not_judged_not_that_nothing_was_sent(tmp_path, seam, capsys):
    """A signal (SIGINT or SIGTERM: SignalGuard raises KeyboardInterrupt for both) after two trials completed, before
    the step was decided: the gates are not measured because the run stopped, and the console says so (issue #36)."""
    path = write_playbook(tmp_path / "resume.yaml", concurrency=4)
    assert cli_run(path, tmp_path / "r", duration="3s") == 130
    out = capsys.readouterr().out
    assert out.count("trial t00") == 2, out
    gates = [line for line in out.splitlines() if line.startswith("gate ")]
    assert gates and all("no request was sent" not in line for line in gates), out
    assert all("not judged: the run stopped before its figures were pooled; 2 completed trial(s)" in g for g in gates)
    (run_dir,) = (tmp_path / "r" / "resume").iterdir()
    notes = {g["note"] for g in manifest(run_dir)["gates"]}
    assert len(notes) == 1 and "continue with --resume" in notes.pop()
