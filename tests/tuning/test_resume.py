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

from llmplay.archive.verify import verify
from llmplay.commands.run import run_command
from llmplay.errors import PlaybookError
from llmplay.tuning.resume import yaml_differences
from llmplay_testing.resume_runs import Trials, use_trials, write_playbook


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch) -> list[Trials]:
    """run_command as the CLI calls it, its trials measured by Trials (the first run is interrupted at trial 3)."""
    return use_trials(monkeypatch)


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
