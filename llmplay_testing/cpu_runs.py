"""Helpers for tests that run real tuning runs on the CPU engine: short playbooks, the CLI as a subprocess,
and the containers one llmplay process or run owns (other runs may share the machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from llmplay.runtime.labels import LABEL_PID, LABEL_RUN

ROOT = Path(__file__).resolve().parents[1]
SPAWNED: list[subprocess.Popen] = []


def tiny_playbook(
    tmp_path: Path,
    *,
    steps: list[dict],
    name: str = "cpu-e2e",
    duration: str = "2s",
    warmup: str = "0.5s",
    repeats: int = 1,
    on_failure: str = "continue",
    engine: dict | None = None,
    runtime: Any = None,
    gates: list[str] | None = None,
    **workload: Any,
) -> Path:
    """cpu-tiny with short trials; `engine` entries are merged into the engine mapping."""
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["steps"] = steps
    doc["trials"] = {
        "repeats": repeats,
        "interleave": True,
        "on_failure": on_failure,
    }
    doc["workload"].update({"duration": duration, "warmup": warmup, **workload})
    if "num_requests" in workload:
        doc["workload"].pop("duration")
    doc["engine"]["health"]["timeout"] = "60s"
    doc["engine"].update(engine or {})
    if runtime is not None:
        doc["runtime"] = runtime
    if gates is not None:
        doc["goals"]["gates"] = gates
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def containers_of(docker_client, *, pid: int | None = None, run_id: str | None = None) -> list:
    label = f"{LABEL_PID}={pid}" if pid is not None else f"{LABEL_RUN}={run_id}"
    return docker_client.containers.list(all=True, filters={"label": label})


def cli(*args: str, env_extra: dict | None = None) -> subprocess.Popen:
    """`llmplay ARGS` as the console script runs it; reaped by `reap_cli_processes` whatever the test's outcome."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from llmplay.cli import main; main()", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    SPAWNED.append(proc)
    return proc


def reap_cli_processes() -> None:
    """A failed assertion must not leave a tuning run going: the next test would share the machine with it."""
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def run_dir_of(archive: Path) -> Path | None:
    found = sorted(archive.glob("*/*/manifest.json"))
    return found[0].parent if found else None
