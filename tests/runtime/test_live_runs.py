"""Runs on one host: each trial records the other llmplay runs live meanwhile (and the report says so), `ls` tells a
killed run from a live one without rewriting its archive, and one run is continued by one process at a time.

The other runs are real processes holding their registration (or their archive) the way a run does; the trials
come through TuningRun's `measure_trial` seam, so no engine is needed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from llmplay.archive.listing import still_running
from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.verify import verify
from llmplay.cli import cli
from llmplay.playbook.load import load_playbook
from llmplay.report.context import build_context
from llmplay.runtime import live_runs
from llmplay.runtime.live_runs import LiveRun, RunTaken
from llmplay.runtime.owner import Owner
from llmplay.tuning.run import RunOptions, TuningRun
from llmplay.tuning.trial import TrialResult

ROOT = Path(__file__).resolve().parents[2]

# Another llmplay run as far as the registry can tell: registered, live until its stdin closes.
OTHER_RUN = """
import sys
from llmplay.runtime.live_runs import LiveRun
with LiveRun(sys.argv[1], "other-playbook"):
    print("ready", flush=True)
    sys.stdin.read()
"""

# A run's process that has made its archive and owns it; the test kills it with -9 mid-run.
ARCHIVE_OWNER = """
import sys, time
from pathlib import Path
from llmplay.archive.run_facts import RunEnvironment, RunOverrides
from llmplay.archive.writer import RunArchive
from llmplay.playbook.load import load_playbook
from llmplay.runtime.owner import Owner
archive = RunArchive.create(Path(sys.argv[2]), load_playbook(sys.argv[1]), overrides=RunOverrides(), environment=RunEnvironment(), secrets=[])
archive.set_owner(Owner.current())
print(archive.run_dir, flush=True)
time.sleep(600)
"""


def child(code: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return proc


def playbook(tmp_path: Path) -> Any:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2}
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}]
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_playbook(path)


@pytest.fixture(autouse=True)
def own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's registry only: the machine's real one lists whatever else runs here now."""
    monkeypatch.setenv("LLMPLAY_LIVE_RUNS", str(tmp_path / "live-runs"))


def test_trials_record_the_runs_that_shared_the_host_and_the_report_warns(tmp_path: Path) -> None:
    other = child(OTHER_RUN, "20261204T000000Z-0a0a0a")
    assert other.stdout.readline().strip() == "ready"
    pb = playbook(tmp_path)

    def trials(config, *, trial_id, step, role, repeat) -> TrialResult:
        if trial_id == "t003":
            other.communicate("", timeout=30)  # the other run ends during t003, before t004 starts
        summary = {"ttft.p95": 0.05, "requests.completed": 30.0}
        return TrialResult(TrialRecord(trial_id, config.label, step, role, repeat, TRIAL_OK, "now", 1.0, summary))

    lines: list[str] = []
    try:
        outcome = TuningRun(pb, RunOptions(archive_root=tmp_path / "r"), report=lines.append, measure_trial=trials)
        run = outcome.execute()
    finally:
        if other.poll() is None:
            other.kill()
            other.communicate()
    shared = {
        t["trial_id"]: t.get("shared_with") for t in json.loads((run.run_dir / "manifest.json").read_text())["trials"]
    }
    who = [
        {
            "run_id": "20261204T000000Z-0a0a0a",
            "playbook": "other-playbook",
            "pid": other.pid,
            "host": socket.gethostname(),
        }
    ]
    assert shared == {"t001": who, "t002": who, "t003": who, "t004": []}
    assert (
        f"warning: llmplay run 20261204T000000Z-0a0a0a (other-playbook, pid {other.pid} on {socket.gethostname()}) "
        "shares this host; its load is in this run's figures too (recorded with each trial it overlapped)"
    ) in lines
    assert verify(run.run_dir) == []
    context = build_context(ArchivedRun.open(run.run_dir))
    assert context["shared_host"] == {
        "trials": 3,
        "of": 4,
        "runs": [f"20261204T000000Z-0a0a0a (other-playbook, pid {other.pid})"],
    }


def test_a_run_alone_on_its_host_records_no_sharer(tmp_path: Path) -> None:
    pb = playbook(tmp_path)

    def trials(config, *, trial_id, step, role, repeat) -> TrialResult:
        return TrialResult(TrialRecord(trial_id, config.label, step, role, repeat, TRIAL_OK, "now", 1.0, {}))

    run = TuningRun(pb, RunOptions(archive_root=tmp_path / "r"), report=lambda _: None, measure_trial=trials).execute()
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    assert all(t["shared_with"] == [] for t in manifest["trials"])  # looked for, none found
    assert Owner.from_dict(manifest["owner"]) == Owner.current()
    assert build_context(ArchivedRun.open(run.run_dir))["shared_host"] is None
    (entry,) = live_runs.entries()  # registered while it ran, marked ended since
    assert entry.run_id == run.run_dir.name and entry.ended is not None and not live_runs.alive(entry)


def test_ls_shows_a_killed_run_interrupted_and_leaves_its_archive_alone(tmp_path: Path) -> None:
    pb = playbook(tmp_path)
    owner = child(ARCHIVE_OWNER, pb.path, str(tmp_path / "r"))
    try:
        run_dir = Path(owner.stdout.readline().strip())
        before = (run_dir / "manifest.json").read_bytes()
        out = CliRunner().invoke(cli, ["ls", "--archive", str(tmp_path / "r")]).output
        assert " running " in out and "shown interrupted" not in out, out
    finally:
        owner.kill()  # kill -9: the archive stays "running" on disk
        owner.communicate()
    out = CliRunner().invoke(cli, ["ls", "--archive", str(tmp_path / "r")]).output
    assert " interrupted " in out and " running " not in out, out
    assert (
        "1 run(s) shown interrupted: their manifest says running, but the llmplay process writing it is gone "
        f"(killed?); `llmplay run --resume {run_dir}` continues one"
    ) in out.replace("\n", " ")
    assert (run_dir / "manifest.json").read_bytes() == before  # ls is a reader
    assert json.loads(before)["status"] == "running"


def test_a_recycled_pid_is_not_the_owner() -> None:
    me = Owner.current()
    assert still_running({"status": "running", "owner": me.as_dict()})
    recycled = {**me.as_dict(), "started": me.started - 3600}  # our pid, but another process's start time
    assert not still_running({"status": "running", "owner": recycled})
    elsewhere = {**recycled, "host": "another-host"}
    assert still_running({"status": "running", "owner": elsewhere})  # cannot be looked into: taken at its word
    assert still_running({"status": "running", "run_id": "20261204T000000Z-0b0b0b"})  # no owner, never registered


def test_one_run_is_continued_by_one_process_at_a_time() -> None:
    holder = child(OTHER_RUN, "20261204T000000Z-0c0c0c")
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(RunTaken, match=rf"^run 20261204T000000Z-0c0c0c is going on in another llmplay process "
                           rf"\(pid {holder.pid} on {socket.gethostname()}\); wait for it to end"):  # fmt: skip
            LiveRun("20261204T000000Z-0c0c0c", "again").__enter__()
    finally:
        holder.communicate("", timeout=30)
    with LiveRun("20261204T000000Z-0c0c0c", "again"):  # once it ended, the run is free again
        assert live_runs.lock_held("20261204T000000Z-0c0c0c") is True
