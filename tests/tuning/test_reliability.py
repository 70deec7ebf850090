"""Reliability and safety guarantees, each proven with the real thing: real dockerd and llama.cpp containers,
real signals and freezes, real sockets that reset, untrusted playbooks that try to escape.

Each test that injects a fault or counts records appends one JSON line to the file named by
LLMPLAY_RELIABILITY_FIGURES (when set); benchmarks/reliability.py adds those lines up for docs/RELIABILITY.md."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from llmplay.archive.verify import verify
from llmplay.archive.writer import RunArchive
from llmplay.engines import get_engine
from llmplay.errors import InfrastructureError, PlaybookError
from llmplay.loadgen.records import ERROR_KINDS, records_from_dataframe
from llmplay.loadgen.runner import run_load_sync
from llmplay.loadgen.tokenizer import WordRatioTokenizer
from llmplay.loadgen.workload import build_requests
from llmplay.playbook.load import load_playbook, load_workload
from llmplay.report import publish_report
from llmplay.runtime.docker import DockerRuntime
from llmplay.runtime.labels import LABEL_PID, LABEL_RUN, LABEL_TRIAL
from llmplay.spec import EngineSpec, frozen_map
from llmplay.tuning.run import RunOptions, run_playbook
from llmplay_testing.cpu_runs import (
    cli,
    containers_of,
    engine_containers,
    reap_cli_processes,
    run_dir_of,
    tiny_playbook,
    wait_for,
    wait_for_the_measured_window,
)
from llmplay_testing.fault_server import FaultServer

DATA = Path(__file__).resolve().parents[1] / "data" / "reliability"


# ------------------------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def _reap():
    yield
    reap_cli_processes()


def figure(test: str, **values: Any) -> None:
    """One line of figures for benchmarks/reliability.py: faults={kind: n}, requests_sent, records, leaked..."""
    target = os.environ.get("LLMPLAY_RELIABILITY_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": test, **values}) + "\n")


def manifest_of(archive: Path) -> dict:
    return json.loads((run_dir_of(archive) / "manifest.json").read_text())


def assert_every_record_accounted(records, sent: int) -> dict[str, int]:
    """records == requests sent, one per planned index, each ok or a classified error kind."""
    assert len(records) == sent
    assert sorted(r.index for r in records) == list(range(sent))
    kinds: dict[str, int] = {}
    for r in records:
        assert r.error_kind is None or r.error_kind in ERROR_KINDS, r
        if r.error_kind is not None:
            assert r.error_message, r
        kinds[r.error_kind or "ok"] = kinds.get(r.error_kind or "ok", 0) + 1
    return kinds


class ManifestWatcher(threading.Thread):
    """Reads manifest.json as fast as it can while a run writes it: a torn (non-atomic) write would not parse."""

    def __init__(self, archive: Path):
        super().__init__(daemon=True)
        self.archive, self.reads, self.torn, self.stop = archive, 0, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            run_dir = run_dir_of(self.archive)
            if run_dir is None:
                time.sleep(0.01)
                continue
            try:
                text = (run_dir / "manifest.json").read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
            except json.JSONDecodeError as exc:
                self.torn.append(f"{exc}: {len(text)} bytes")
            self.reads += 1

    def __enter__(self) -> ManifestWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(5)


# ------------------------------------------------------------------------ 2. client robustness under load
def test_1024_streams_against_random_resets_every_request_accounted_for():
    """1,024 concurrent streams, a server in another process resetting ~30% of requests at random:
    records == requests sent, every one ok or a classified error, and the ok count is the server's."""
    workload, _ = load_workload(DATA / "storm.yaml")
    requests = build_requests(workload, WordRatioTokenizer(), "storm")
    server = subprocess.Popen(
        [sys.executable, "-m", "llmplay_testing.fault_server", "server", "--seed", "11", "--fault-rate", "0.3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        assert line.startswith("LISTENING"), line
        port = int(line.split()[1])
        started = time.perf_counter()
        result = run_load_sync(f"http://127.0.0.1:{port}", workload, requests)
        elapsed_s = time.perf_counter() - started
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    stats = json.loads(out.strip().splitlines()[-1])
    kinds = assert_every_record_accounted(result.records, len(requests))
    # How fast a shared 2-core machine drives the storm is a measurement (this test's `elapsed_s` figure, which
    # benchmarks/reliability.py gathers into docs/RELIABILITY.md), not an assertion: each request has its 30 s timeout.
    # Every stream the server finished arrived complete, and nothing else counted as ok.
    assert kinds["ok"] == stats["ok"], (kinds, stats)
    assert stats["peak_connections"] >= 1000, stats  # the streams really were concurrent
    assert stats["faults_total"] > 0.2 * len(requests), stats
    assert set(kinds) - {"ok"} <= {"connect", "truncated", "http_5xx"}, kinds
    assert kinds.get("http_5xx", 0) == stats["faults"]["http_500"]
    figure(
        "storm",
        faults=stats["faults"],
        requests_sent=len(requests),
        records=len(result.records),
        concurrency=workload.concurrency,
        elapsed_s=round(elapsed_s, 2),
        error_kinds=kinds,
    )


# ------------------------------------------------------------------------------- 1. engine faults, real engine
# 2^26 tokens of f32 KV cache: 128 GiB for the tiny model, more than this machine (or the CI runner) can
# allocate, and llama.cpp gives up within seconds ("failed to allocate buffer for kv cache").
OOM_STEP = {
    "name": "kv-oom",
    "bundle": True,
    "description": "a KV cache no host can hold",
    "set": {"ctx_size": 67108864, "kv_cache_dtype": "f32"},
}


@pytest.mark.docker
def test_engine_oom_at_start_is_a_failed_trial_with_cause_and_log_and_the_run_goes_on(
    cpu_engine, docker_client, tmp_path
):
    path = tiny_playbook(
        tmp_path, name="oom-continue", steps=[OOM_STEP, {"name": "parallel-2", "set": {"parallel": 2}}]
    )
    archive = tmp_path / "reports"
    lines: list[str] = []
    with ManifestWatcher(archive) as watcher:
        outcome = run_playbook(
            load_playbook(path), RunOptions(archive_root=archive), publish=publish_report, report=lines.append
        )
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    trials = {t["trial_id"]: t for t in manifest["trials"]}
    failed = [t for t in trials.values() if t["status"] == "failed"]
    assert [t["config_id"] for t in failed] == ["kv-oom"], lines
    assert "before becoming healthy" in failed[0]["error"] and "allocate" in failed[0]["error"], failed[0]
    log = (outcome.run_dir / failed[0]["files"]["log"]).read_text()
    assert "failed to allocate buffer for kv cache" in log
    verdicts = {v["step"]: v["verdict"] for v in manifest["verdicts"]}
    assert verdicts["kv-oom"] == "failed"  # not "rejected": the candidate was never measured
    assert verdicts["parallel-2"] in ("kept", "rejected", "inconclusive")  # the run went on to the next step
    assert outcome.status == "complete" and verify(outcome.run_dir) == []
    assert containers_of(docker_client, run_id=manifest["run_id"]) == []
    assert watcher.reads > 0 and watcher.torn == [], watcher.torn
    figure(
        "oom-continue",
        faults={"engine_oom_at_start": 1},
        manifest_reads=watcher.reads,
        torn_reads=len(watcher.torn),
        leaked=0,
    )


@pytest.mark.docker
def test_engine_oom_with_on_failure_stop_stops_the_run_and_the_archive_verifies(cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(
        tmp_path, name="oom-stop", on_failure="stop", steps=[OOM_STEP, {"name": "parallel-2", "set": {"parallel": 2}}]
    )
    proc = cli("run", str(path), "--archive", str(tmp_path / "reports"))
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "on_failure is stop" in out
    manifest = manifest_of(tmp_path / "reports")
    assert manifest["status"] == "failed"
    # The failed trial stops the run: its pair's first trial (either side: the order is drawn per pair) and no more;
    # parallel-2 never started.
    configs = [t["config_id"] for t in manifest["trials"]]
    assert configs in (["baseline", "kv-oom"], ["kv-oom"]), configs
    assert verify(run_dir_of(tmp_path / "reports")) == []
    assert containers_of(docker_client, pid=proc.pid) == []
    figure("oom-stop", faults={"engine_oom_at_start": 1}, leaked=0)


def _log_has(container, marker: bytes) -> bool:
    return marker in container.logs(tail=300)


@pytest.mark.docker
@pytest.mark.parametrize("moment", ["serving", "startup"])
def test_engine_frozen_mid_trial_is_recorded_requests_never_dropped_container_removed(
    cpu_engine, docker_client, tmp_path, moment
):
    """`docker pause` freezes llama-server for real (cgroup freezer): sockets accept, nothing answers.
    serving: frozen mid-load, so requests time out; startup: frozen as it starts listening, so the health
    wait or the tokenizer probe hangs. Either way the trial is archived and the container removed."""
    # serving: a bounded workload, so every prompt is built before the clock and the freeze hits requests only
    # (a duration-bound feed asks the frozen engine's tokenizer for more prompts: a failed trial, see startup).
    bound = {"num_requests": 40} if moment == "serving" else {"duration": "5s"}
    # startup: the frozen engine's health wait runs to its timeout, so a short one keeps the test short; 20 s, since
    # the engine must first reach "listening" within it however busy the machine is. serving: cpu-tiny's own.
    health = "2m" if moment == "serving" else "20s"
    path = tiny_playbook(
        tmp_path,
        name=f"stall-{moment}",
        steps=[],
        request_timeout="1.5s",
        **bound,
        gates=["errors.rate < 1%"],
        engine={"health": {"path": "/health", "timeout": health}},
    )
    archive = tmp_path / "reports"
    proc = cli("run", str(path), "--archive", str(archive))
    try:
        container = wait_for(lambda: engine_containers(docker_client, pid=proc.pid), 120, "the engine container")[0]
        if moment == "serving":
            # Frozen once the client has recorded a request of the measured window, told by the engine's counters
            # (a fixed 0.5 s after its first answer could freeze it before any measured request was recorded).
            wait_for_the_measured_window(container, path, recorded=True)
        else:
            wait_for(lambda: _log_has(container, b"listening"), 60, "the engine listening")
        container.pause()
        paused_at = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        stop_s = time.monotonic() - paused_at
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in containers_of(docker_client, pid=proc.pid):  # only if the runner failed to: the asserts say so
            c.reload()
            if c.status == "paused":
                c.unpause()
    assert "Traceback" not in out
    assert containers_of(docker_client, pid=proc.pid) == [], out
    run_dir = run_dir_of(archive)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and len(manifest["trials"]) == 1, out  # recorded, not a crashed run
    trial = manifest["trials"][0]
    kinds: dict[str, int] = {}
    if trial["files"].get("records"):
        records = records_from_dataframe(RunArchive.open(run_dir).load_records(trial["trial_id"]))
        kinds = assert_every_record_accounted(records, len(records))  # every planned index, exactly once
    if moment == "serving":
        # The requests sent before and during the freeze are all on disk: ok ones, then timeouts.
        assert kinds.get("timeout", 0) >= 1 and kinds.get("ok", 0) >= 1, (kinds, trial)
        assert trial["status"] == "failed" or trial["summary"]["errors.rate"] > 0, trial
        assert proc.returncode in (1, 3), out  # a failed trial, or the errors.rate gate fails
    else:
        # startup: the health wait or the tokenizer probe hangs; a failed trial with its cause
        assert trial["status"] == "failed" and trial["error"], trial
    assert verify(run_dir) == []
    figure(
        f"stall-{moment}",
        faults={"engine_stall": 1},
        requests_sent=sum(kinds.values()),
        records=sum(kinds.values()),
        error_kinds=kinds,
        stop_after_pause_s=round(stop_s, 1),
        leaked=0,
    )


@pytest.mark.docker
def test_5xx_bursts_and_resets_in_front_of_the_real_engine_every_request_accounted_and_gated(llama_endpoint, tmp_path):
    with FaultServer("proxy", upstream=llama_endpoint.base_url, burst_every=10, burst_len=3) as proxy:
        path = tiny_playbook(
            tmp_path,
            name="bursts",
            steps=[],
            num_requests=40,
            warmup=0,
            concurrency=2,
            input={"fixed": 16},
            output={"fixed": 8},
            prefix_tokens=0,
            runtime={"kind": "endpoint", "url": proxy.url},
            gates=["errors.rate < 1%"],
        )
        outcome = run_playbook(
            load_playbook(path),
            RunOptions(archive_root=tmp_path / "reports"),
            publish=publish_report,
            report=lambda line: None,
        )
        stats = proxy.stats.as_dict()
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    trial = manifest["trials"][0]
    records = records_from_dataframe(RunArchive.open(outcome.run_dir).load_records(trial["trial_id"]))
    kinds = assert_every_record_accounted(records, 40)
    assert stats["faults"]["http_500"] > 0 and stats["faults"]["reset_before"] > 0 and stats["faults"]["reset_mid"] > 0
    assert kinds["http_5xx"] == stats["faults"]["http_500"]
    assert kinds["ok"] == stats["ok"], (kinds, stats)
    errors = sum(n for k, n in kinds.items() if k != "ok")
    assert trial["summary"]["errors.rate"] == pytest.approx(errors / 40)
    gate = next(g for g in outcome.gates if g.metric == "errors.rate")
    assert gate.met is False and outcome.exit_code == 3
    assert verify(outcome.run_dir) == []
    figure(
        "bursts",
        faults={
            "http_500": stats["faults"]["http_500"],
            "connection_reset": stats["faults"]["reset_before"] + stats["faults"]["reset_mid"],
            "connection_closed": stats["faults"]["close_before"],
        },
        requests_sent=40,
        records=len(records),
        error_kinds=kinds,
    )


# --------------------------------------------------------------------------- 3. shared playbooks are untrusted
BASE_DOC = (
    "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: p}\n"
    "engine: {kind: llamacpp, model: /models/tiny.gguf}\nworkload: {concurrency: 1, num_requests: 2}\n"
)


@pytest.mark.parametrize(
    "tag",
    [
        "!!python/object/apply:os.system [touch {marker}]",
        "!!python/object/apply:subprocess.check_call [[touch, {marker}]]",
        "!!python/object/new:builtins.open [{marker}, w]",
        "!!python/name:os.system",
    ],
)
def test_python_tags_are_refused_and_run_nothing(tmp_path, tag):
    marker = tmp_path / "pwned"
    for where in ("metadata: {{name: p, description: {tag}}}\n", "x-extra: {tag}\n"):
        path = tmp_path / "p.yaml"
        path.write_text(BASE_DOC + where.format(tag=tag.format(marker=marker)))
        with pytest.raises(PlaybookError) as info:
            load_playbook(path)
        assert "\n" not in str(info.value) and "p.yaml" in str(info.value)
        assert not marker.exists()
    # through extends: as well
    (tmp_path / "base.yaml").write_text(BASE_DOC + "x-extra: " + tag.format(marker=marker) + "\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\n" + BASE_DOC)
    with pytest.raises(PlaybookError):
        load_playbook(tmp_path / "child.yaml")
    assert not marker.exists()
    figure("python-tags", inputs=3)


@pytest.mark.parametrize(
    "engine_extra",
    [
        "privileged: true",
        "pid: host",
        "pid_mode: host",
        "volumes: ['/:/host']",
        "mounts: ['/etc:/etc']",
        "cap_add: [SYS_ADMIN]",
        "devices: ['/dev/mem']",
        "security_opt: ['seccomp=unconfined']",
        "user: root",
        "binds: ['/:/host:rw']",
        "runtime: nvidia",
    ],
)
def test_docker_options_outside_the_schema_are_unknown_keys(tmp_path, engine_extra):
    path = tmp_path / "p.yaml"
    path.write_text(BASE_DOC.replace("model: /models/tiny.gguf}", f"model: /models/tiny.gguf, {engine_extra}}}"))
    with pytest.raises(PlaybookError, match=r"unknown key|not allowed|additional") as info:
        load_playbook(path)
    assert engine_extra.split(":")[0] in str(info.value)


@pytest.mark.docker
def test_the_real_container_gets_only_the_model_dir_read_only_and_no_host_namespaces(
    cpu_engine, docker_client, tmp_path
):
    engine = get_engine("llamacpp")
    model_dir = cpu_engine.model_path.parent
    spec = EngineSpec(
        kind="llamacpp",
        model=f"{engine.model_path_in_container}/{cpu_engine.model_path.name}",
        image=cpu_engine.image,
        model_dir=str(model_dir),
        health_timeout_s=60.0,
        args=frozen_map({"threads": 1, "ctx_size": 512, "parallel": 1}),
    )
    runtime = DockerRuntime(docker_client)
    with runtime.start(spec, engine, {LABEL_RUN: f"untrusted-{secrets.token_hex(4)}", LABEL_TRIAL: "t"}):
        attrs = docker_client.api.inspect_container(runtime.container.id)
    host = attrs["HostConfig"]
    assert host["Privileged"] is False
    assert host["PidMode"] in ("", None)
    assert host["NetworkMode"] != "host" and host["IpcMode"] != "host" and host.get("UsernsMode") in ("", None)
    assert not host.get("CapAdd") and not host.get("Devices") and not host.get("SecurityOpt")
    assert not host.get("Binds") and not host.get("VolumesFrom")
    # A bind mount, read-only: unlike a volume bind, the daemon never creates a missing source.
    assert [(m["Type"], m["Source"], m["Target"], m.get("ReadOnly")) for m in host["Mounts"]] == [
        ("bind", str(model_dir), engine.model_path_in_container, True)
    ]
    mounts = [m for m in attrs["Mounts"] if m["Type"] == "bind"]
    assert [(m["Source"], m["Destination"], m["RW"]) for m in mounts] == [
        (str(model_dir), engine.model_path_in_container, False)
    ]
    assert all(m["Type"] != "volume" or not m.get("RW", True) for m in attrs["Mounts"])
    assert all(b.get("HostIp") == "127.0.0.1" for p in (host.get("PortBindings") or {}).values() for b in p)


@pytest.mark.docker
def test_secrets_by_reference_never_reach_archive_report_logs_or_console(cpu_engine, docker_client, tmp_path):
    """HF_TOKEN by reference; another secret referenced under a name that does not look secret and echoed by
    the engine itself in its log as it fails; a URL with credentials in an env value. None of them may appear
    in any archived byte or on the console."""
    token, echoed, url_password = (
        f"hf_{secrets.token_hex(12)}",
        f"ek{secrets.token_hex(10)}",
        f"pw{secrets.token_hex(10)}",
    )
    # A literal password in a URL is refused at validate now; by reference it is resolved, then redacted.
    env = {"HF_TOKEN": "${env:HF_TOKEN}", "MODEL_MIRROR": "https://bob:${env:RELIABILITY_URL_PW}@127.0.0.1:9/models"}
    # llama-server reads LLAMA_ARG_* and, for a bad cache type, prints the value it got and exits.
    leaky = {"name": "leaky-env", "set": {"env.LLAMA_ARG_CACHE_TYPE_K": "${env:RELIABILITY_ECHOED}"}}
    path = tiny_playbook(tmp_path, name="secrets", steps=[leaky], engine={"env": env})
    archive = tmp_path / "reports"
    proc = cli(
        "run",
        str(path),
        "--archive",
        str(archive),
        env_extra={"HF_TOKEN": token, "RELIABILITY_ECHOED": echoed, "RELIABILITY_URL_PW": url_password},
    )
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode in (0, 1, 3), out
    run_dir = run_dir_of(archive)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    failed = [t for t in manifest["trials"] if t["status"] == "failed"]
    assert failed, out
    log = (run_dir / failed[0]["files"]["log"]).read_text()
    assert "LLAMA_ARG_CACHE_TYPE_K" in log and "***" in log  # the engine did echo it, and it was blanked
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"manifest.json", "report.html", "playbook.yaml", "engine.log"} <= {p.name for p in files}
    assert any(p.suffix in (".parquet", ".csv") for p in files)
    for secret in (token, echoed, url_password):
        assert secret not in out, "console"
        for p in files:
            assert secret.encode() not in p.read_bytes(), p
    assert containers_of(docker_client, pid=proc.pid) == []
    figure("secrets", files_scanned=len(files), secrets=3, leaked_secrets=0, leaked=0)


# ---------------------------------------------------------------------- 4. no orphans on an exception anywhere
@pytest.mark.docker
def test_an_exception_inside_a_trial_leaves_no_container_and_a_failed_archive(cpu_engine, docker_client, tmp_path):
    """A dataset row whose output_tokens is not a number, written after the playbook validated (validate refuses
    it up front), so the load path fails with the engine up. The container goes, the archive says failed, the CLI
    prints one line naming the row and exits 2."""
    dataset = tmp_path / "data.jsonl"
    dataset.write_text('{"prompt": "a prompt the engine can answer", "output_tokens": 8}\n')
    path = tiny_playbook(tmp_path, name="exception", steps=[], num_requests=4, dataset="data.jsonl")
    proc = cli("run", str(path), "--archive", str(tmp_path / "reports"))
    # The bad row goes in while the engine is frozen the moment Docker starts it (its start event): the trial reads
    # the dataset only once the engine answers, so it reads the bad one. Swapped on first sight of the container
    # instead, a quick engine could be serving the good one before the swap.
    events = docker_client.events(
        decode=True, filters={"type": "container", "event": "start", "label": f"{LABEL_PID}={proc.pid}"}
    )
    seen: list[str] = []

    def swap_while_frozen() -> None:
        for event in events:
            if LABEL_TRIAL not in (event.get("Actor") or {}).get("Attributes", {}):
                continue  # the preflight's `--help` container, the first time the image is checked
            container = docker_client.containers.get(event["id"])
            container.pause()
            try:
                dataset.write_text((DATA / "bad-dataset.jsonl").read_text())
            finally:
                container.unpause()
            seen.append(container.id)
            return

    swapper = threading.Thread(target=swap_while_frozen, daemon=True)
    swapper.start()
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        events.close()
        swapper.join(10)
    assert seen, "the engine container never started: the exception must come from inside the trial"
    assert proc.returncode == 2 and "data.jsonl:2" in out, out
    assert "Traceback" not in out
    assert containers_of(docker_client, pid=proc.pid) == []
    manifest = manifest_of(tmp_path / "reports")
    assert manifest["status"] == "failed", manifest["status"]
    assert verify(run_dir_of(tmp_path / "reports")) == []
    figure("exception", faults={"exception_in_trial": 1}, leaked=0)


@pytest.mark.docker
def test_a_missing_model_dir_is_never_created_by_docker(cpu_engine, docker_client, tmp_path):
    """Docker's volume binds create a missing source (empty, owned by root); the runtime's bind mount refuses it."""
    engine = get_engine("llamacpp")
    missing = tmp_path / "no-such-model-dir"
    spec = EngineSpec(
        kind="llamacpp", model="/models/x.gguf", image=cpu_engine.image, model_dir=str(missing), health_timeout_s=5.0
    )
    with pytest.raises(InfrastructureError, match="does not exist where Docker runs"):
        DockerRuntime(docker_client).start(spec, engine, {"llmplay.run": f"untrusted-{secrets.token_hex(4)}"})
    assert not missing.exists()
