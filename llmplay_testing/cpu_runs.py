"""Helpers for tests that run real tuning runs on the CPU engine: short playbooks, the CLI as a subprocess,
and the containers one llmplay process or run owns (other runs may share the machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from llmplay.engines import get_engine
from llmplay.runtime.labels import LABEL_PID, LABEL_RUN, LABEL_TRIAL
from llmplay.telemetry.prom import CANONICAL, parse_metrics

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
    # cpu-tiny's own 2 minutes: how long an engine takes to start while another engine test holds both cores is the
    # machine's noise, and a generous timeout costs nothing when it starts at once.
    doc["engine"]["health"]["timeout"] = "2m"
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


def engine_containers(docker_client, *, pid: int) -> list:
    """The trial engines one llmplay process started: its containers with a trial label. The preflight's `--help`
    containers carry the process's labels too (the first time an image is checked), and serve nothing."""
    return [c for c in containers_of(docker_client, pid=pid) if LABEL_TRIAL in c.labels]


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


def host_port(container: Any) -> str | None:
    """The host port a llmplay engine container publishes its API on, once Docker has bound it (None before, or once
    the container is gone)."""
    import docker.errors  # deferred: the docker SDK loads only for container tests

    try:
        container.reload()
    except docker.errors.NotFound:
        return None
    bindings = [b for found in container.attrs["NetworkSettings"]["Ports"].values() for b in found or []]
    return bindings[0]["HostPort"] if bindings else None


def engine_finished_requests(port: str, output_tokens: int) -> int:
    """Requests llama-server has finished, counted on the engine: its predicted-token counter grows by a request's
    tokens when the request's slot is released (cpu-tiny's outputs are a fixed length, with ignore_eos). 0 while
    it does not answer them (loading, or gone)."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    except httpx.HTTPError:
        return 0
    if response.status_code != 200:
        return 0  # 503 while the model loads
    readings, _ = parse_metrics(response.text, get_engine("llamacpp").metric_names)
    total = next((r.value for r in readings if r.metric == CANONICAL["generation_tokens"]), 0.0)
    return int(total // output_tokens)


def wait_for_the_measured_window(
    container: Any, playbook_path: Path, *, recorded: bool = False, timeout_s: float = 180
) -> None:
    """Returns once the trial `container`'s engine serves is in its measured window, told by the engine's own
    counters (a fixed wait after the container or /health appeared landed in the engine's start when an engine test
    on the other worker had the cores): it has finished a request and the warm-up has run out since. `recorded`:
    also once the llmplay client has recorded a request of that window. The playbook (a tiny_playbook) gives the
    users, the output length and the warm-up."""
    from llmplay.playbook.load import load_playbook  # deferred: the loader pulls in the whole schema

    workload = load_playbook(playbook_path).workload
    users, output_tokens = int(workload.concurrency or 1), int(workload.output.value or 1)
    port = wait_for(lambda: host_port(container), timeout_s, "the engine's published port")
    wait_for(lambda: engine_finished_requests(port, output_tokens) >= 1, timeout_s, "the first finished request")
    time.sleep(workload.warmup_s or 0.0)  # the warm-up timer started before that request was sent: it has run out
    if not recorded:
        return
    before = engine_finished_requests(port, output_tokens)
    # At most `users` requests were in flight then. 2 x users + 1 more finished means some user finished a request
    # sent after the warm-up and then sent its next one, which it does only once its client recorded the first.
    wait_for(
        lambda: engine_finished_requests(port, output_tokens) >= before + 2 * users + 1, timeout_s, "a measured request"
    )


def run_dir_of(archive: Path) -> Path | None:
    found = sorted(archive.glob("*/*/manifest.json"))
    return found[0].parent if found else None
