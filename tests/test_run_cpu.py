"""End to end on the CPU: real dockerd, real llama.cpp containers, real measurements, real verdicts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from llmplay.archive import verify
from llmplay.playbook import load_playbook
from llmplay.results import KEPT
from llmplay.runner import RunOptions, run_playbook

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.docker, pytest.mark.slow]


def tiny_playbook(tmp_path: Path, *, steps: list[dict], duration: str = "4s", repeats: int = 2, name: str = "cpu-e2e",
                  **workload) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["steps"] = steps
    doc["trials"] = {"repeats": repeats, "interleave": True, "bootstrap_samples": 400, "on_failure": "continue"}
    doc["workload"].update({"duration": duration, "warmup": "1s", **workload})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def llmplay_containers(docker_client, *, pid: int | None = None, run_id: str | None = None) -> list:
    """Containers of one llmplay process or run: other runs on the same machine are not this test's."""
    label = f"llmplay.pid={pid}" if pid is not None else (f"llmplay.run={run_id}" if run_id else "llmplay.run")
    return docker_client.containers.list(all=True, filters={"label": label})


def test_tuning_run_decides_from_real_measurements(cpu_engine, docker_client, tmp_path):
    playbook = load_playbook(tiny_playbook(tmp_path, steps=[
        {"name": "parallel-4", "set": {"parallel": 4}},
        {"name": "useless-env", "description": "changes nothing the engine reads", "set": {"env.LLMPLAY_NOOP": "1"}},
    ]))
    lines: list[str] = []
    outcome = run_playbook(playbook, RunOptions(archive_root=tmp_path / "reports"), report=lines.append)
    assert outcome.status == "complete", lines
    by_step = {v.step: v for v in outcome.verdicts}
    parallel = by_step["parallel-4"]
    assert parallel.verdict == KEPT, parallel.reason
    assert parallel.objective.metric == "ttft.p95"
    assert parallel.objective.rel_change < -0.3  # four slots serve four users at once: no queueing for one
    assert by_step["useless-env"].verdict != KEPT, by_step["useless-env"].reason
    assert outcome.final_config_id == "parallel-4"
    assert [row["config_id"] for row in outcome.tuning_record] == ["baseline", "parallel-4", "useless-env"]
    assert outcome.exit_code in (0, 3) and len(outcome.gates) == 4
    assert verify(outcome.run_dir) == []
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert len(manifest["trials"]) == 8 and all(t["status"] == "ok" for t in manifest["trials"])
    first = manifest["trials"][0]["summary"]
    assert first["ttft.p95"] > 0 and first["errors.rate"] == 0
    assert (outcome.run_dir / "report.html").is_file()
    assert llmplay_containers(docker_client, run_id=manifest["run_id"]) == []


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _run_dir(archive: Path) -> Path | None:
    found = sorted(archive.glob("*/*/manifest.json"))
    return found[0].parent if found else None


_SPAWNED: list[subprocess.Popen] = []


def _cli(*args: str, env_extra: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    proc = subprocess.Popen([sys.executable, "-m", "llmplay", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _SPAWNED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _reap_cli_processes():
    """A failed assertion must not leave a tuning run going: the next test would share the machine with it."""
    yield
    while _SPAWNED:
        proc = _SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_trial_leaves_no_container(cpu_engine, docker_client, tmp_path, sig):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="30s")
    proc = _cli("run", str(path), "--archive", str(tmp_path / "reports"))
    _wait_for(lambda: llmplay_containers(docker_client, pid=proc.pid), 60, "the engine container")
    time.sleep(2)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    assert llmplay_containers(docker_client, pid=proc.pid) == []
    manifest = json.loads((_run_dir(tmp_path / "reports") / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"


def test_kill9_then_resume_completes_and_verifies(cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="3s")
    archive = tmp_path / "reports"
    proc = _cli("run", str(path), "--archive", str(archive))

    def two_trials_archived():
        run_dir = _run_dir(archive)
        if run_dir is None:
            return False
        try:
            return len(json.loads((run_dir / "manifest.json").read_text())["trials"]) >= 2
        except (json.JSONDecodeError, KeyError):
            return False  # never expected: writes are atomic; the assertion below would catch a torn file

    _wait_for(two_trials_archived, 120, "two archived trials")
    proc.kill()
    proc.wait(timeout=30)
    run_dir = _run_dir(archive)
    done_before = json.loads((run_dir / "manifest.json").read_text())["trials"]
    resumed = _cli("run", "--resume", str(run_dir), str(path))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode in (0, 3), out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert len(manifest["trials"]) == 4
    assert [t["trial_id"] for t in manifest["trials"][:len(done_before)]] == [t["trial_id"] for t in done_before]
    assert verify(run_dir) == []
    assert llmplay_containers(docker_client, pid=resumed.pid) == []
    # the container orphaned by kill -9 was found and removed when the resumed run started
    assert llmplay_containers(docker_client, pid=proc.pid) == []


def test_engine_killed_mid_trial_is_a_failed_trial_and_the_run_goes_on(cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="8s", repeats=1)
    archive = tmp_path / "reports"
    proc = _cli("run", str(path), "--archive", str(archive))
    container = _wait_for(lambda: llmplay_containers(docker_client, pid=proc.pid), 60, "the engine container")[0]
    _wait_for(lambda: _run_dir(archive), 30, "the archive")
    time.sleep(4)  # inside the measured window
    container.kill()
    out, _ = proc.communicate(timeout=300)
    manifest = json.loads((_run_dir(archive) / "manifest.json").read_text())
    trials = manifest["trials"]
    assert trials[0]["status"] == "failed", out
    assert trials[0]["error"]
    assert len(trials) == 2 and trials[1]["status"] == "ok"  # the run went on
    assert manifest["verdicts"][0]["verdict"] == "failed"
    assert trials[0]["files"]["log"].endswith("engine.log")  # the engine's own last words are archived
    assert llmplay_containers(docker_client, pid=proc.pid) == []
