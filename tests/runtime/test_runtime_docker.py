"""The docker runtime against a real dockerd and the real llama.cpp CPU image: start, stream, stop,
failures that explain themselves, and nothing left behind."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import replace
from typing import Any

import docker.errors
import httpx
import pytest
import requests
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.engines import get_engine
from llmplay.errors import EngineStartError, InfrastructureError, PlaybookError
from llmplay.runtime import make_runtime, stop_all
from llmplay.runtime.cpu_image import build_cpu_engine
from llmplay.runtime.docker import DockerRuntime, being_removed, connect, gc, image_hint, owner_labels
from llmplay.runtime.endpoint import EndpointRuntime, refuse_engine_changes
from llmplay.runtime.labels import LABEL_HOST, LABEL_PID, LABEL_PID_STARTED, LABEL_RUN, LABEL_TRIAL
from llmplay.spec import Change, EngineSpec, RuntimeSpec, Step
from llmplay.telemetry.prom import parse_metrics
from llmplay_testing.cpu_runs import wait_for

LLAMACPP = get_engine("llamacpp")


def run_labels() -> dict[str, str]:
    return {LABEL_RUN: f"test-{uuid.uuid4().hex[:8]}", LABEL_TRIAL: "1"}


def left_over(client: Any, labels: dict[str, str]) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={labels[LABEL_RUN]}"}, ignore_removed=True)


def stream_completion(base_url: str, model: str, max_tokens: int = 16) -> tuple[list[str], dict]:
    """POST /v1/completions with stream=true; the text of each content chunk, and the usage."""
    texts, usage = [], {}
    body = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    texts.append(choice["text"])
    return texts, usage


@pytest.mark.docker
def test_start_stream_stop_leaves_nothing(docker_client: Any, llama_server_spec: EngineSpec, cpu_engine: Any) -> None:
    labels = run_labels()
    runtime = make_runtime(RuntimeSpec("docker"))
    with runtime.start(llama_server_spec, LLAMACPP, labels) as endpoint:
        assert endpoint.base_url.startswith("http://127.0.0.1:")
        texts, usage = stream_completion(endpoint.base_url, endpoint.model)
        assert len(texts) >= 2 and usage["completion_tokens"] == 16
        d = runtime.describe()
        assert d.image == "llmplay/llamacpp-cpu:local" and d.image_digest.startswith("sha256:")
        assert d.engine_version_reported.startswith("b")  # llama.cpp build_info, e.g. b1-0c1e570
        assert d.engine_version == cpu_engine.engine_version  # the image label: the release it came from
        assert d.container_id == runtime.container.id and runtime.alive()
        assert list(d.command[1:]) == LLAMACPP.command(llama_server_spec)
        assert d.labels[LABEL_RUN] == labels[LABEL_RUN] and d.labels[LABEL_TRIAL] == "1"
        assert endpoint.describe.container_id == d.container_id
        container = docker_client.containers.get(d.container_id)
        assert container.labels[LABEL_RUN] == labels[LABEL_RUN]
        assert "listening on" in runtime.logs() and len(runtime.logs(tail=2).splitlines()) == 2
    assert left_over(docker_client, labels) == []
    assert runtime.container is None and "listening on" in runtime.logs()  # the logs outlive the container


@pytest.mark.docker
def test_exit_at_once_gives_exit_code_and_log_lines(docker_client: Any, llama_server_spec: EngineSpec) -> None:
    labels = run_labels()
    spec = replace(llama_server_spec, extra_args=("--no-such-flag",))
    with pytest.raises(EngineStartError) as info:
        DockerRuntime(docker_client).start(spec, LLAMACPP, labels)
    err = info.value
    assert err.container_exit_code not in (None, 0)
    assert f"exited with code {err.container_exit_code} before becoming healthy" in str(err)
    assert "--no-such-flag" in err.log_tail and err.log_tail in str(err)
    assert left_over(docker_client, labels) == []


@pytest.mark.docker
def test_health_timeout_gives_the_error_and_no_container(docker_client: Any, llama_server_spec: EngineSpec) -> None:
    labels = run_labels()
    spec = replace(llama_server_spec, health_path="/never-healthy", health_timeout_s=1.5)
    with pytest.raises(
        EngineStartError,
        match=r"not healthy at http://127\.0\.0\.1:\d+/never-healthy after 1\.5s \(last: (HTTP 404|\w+)\)",
    ) as info:
        DockerRuntime(docker_client).start(spec, LLAMACPP, labels)
    # The message carries the engine's last words, whatever they were when the timeout passed. Whether llama-server
    # was already listening 1.5 s after its start (then its last answer was a 404) is the machine's speed; the
    # wording of "last: HTTP 404" is checked against a server already listening, in test_runtime_process.py.
    assert info.value.log_tail in str(info.value)
    if "(last: HTTP 404)" in str(info.value):
        assert "listening on" in info.value.log_tail
    assert left_over(docker_client, labels) == []


@pytest.mark.docker
def test_gpu_request_without_nvidia_runtime_is_a_clear_error(docker_client: Any, llama_server_spec: EngineSpec) -> None:
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        # Not a broken setup (which the CI rule turns into a failure): here a GPU request is simply granted.
        pytest.xfail("this Docker has the NVIDIA runtime, so it grants GPU requests instead of refusing them")
    labels = run_labels()
    for gpus in (1, ("0",)):
        with pytest.raises(InfrastructureError) as info:
            DockerRuntime(docker_client).start(replace(llama_server_spec, gpus=gpus), LLAMACPP, labels)
        message = str(info.value)
        assert message.startswith("GPUs requested but Docker cannot provide them: ")
        assert "could not select device driver" in message and "nvidia-container-toolkit" in message
        assert "\n" not in message
        assert left_over(docker_client, labels) == []


@pytest.mark.docker
def test_missing_image_says_how_to_get_it(docker_client: Any, llama_server_spec: EngineSpec) -> None:
    with pytest.raises(
        InfrastructureError,
        match=r"^image llmplay/no-such-image:1 not found locally; pull it: "
        r"`docker pull llmplay/no-such-image:1`$",
    ):
        DockerRuntime(docker_client).start(replace(llama_server_spec, image="llmplay/no-such-image:1"), LLAMACPP)


def test_cpu_image_hint() -> None:
    assert image_hint("llmplay/llamacpp-cpu:local") == "build it: `llmplay engine build-cpu` (or scripts/cpu-engine.sh)"


def test_unreachable_daemon_says_how_to_start_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(InfrastructureError, match=r"^Docker daemon unreachable \(.*\); start it with `sudo dockerd &`"):
        connect()
    with pytest.raises(InfrastructureError, match=r"^Docker daemon at tcp://127\.0\.0\.1:9 unreachable"):
        connect("tcp://127.0.0.1:9")


@pytest.mark.docker
def test_stop_all_stops_live_containers(docker_client: Any, llama_server_spec: EngineSpec) -> None:
    labels = run_labels()
    runtime = DockerRuntime(docker_client)
    with runtime.start(llama_server_spec, LLAMACPP, labels):
        assert len(left_over(docker_client, labels)) == 1
        stop_all()  # what the runner's signal handler calls
        assert left_over(docker_client, labels) == []
    assert left_over(docker_client, labels) == []


def recycled_pid_labels() -> dict[str, str]:
    """Owner labels naming this process's pid with another start time: a recycled pid, so an owner provably gone."""
    me = owner_labels()
    return {**me, LABEL_PID_STARTED: f"{float(me[LABEL_PID_STARTED]) - 3600:.2f}"}


# A live llmplay process as far as gc can tell: it creates a container labelled as its own, says its id, and
# lives until its stdin closes.
LIVE_OWNER = """
import sys
from llmplay.runtime.docker import connect, owner_labels
from llmplay.runtime.labels import LABEL_RUN
client = connect()
c = client.containers.create(sys.argv[1], ["--version"], labels={LABEL_RUN: sys.argv[2], **owner_labels()})
print(c.id, flush=True)
sys.stdin.read()
"""


@pytest.mark.docker
def test_gc_never_touches_a_live_run_and_removes_it_once_its_owner_is_gone(docker_client: Any, cpu_engine: Any) -> None:
    run = f"test-gc-{uuid.uuid4().hex[:8]}"
    host = os.uname().nodename
    owner = subprocess.Popen(
        [sys.executable, "-c", LIVE_OWNER, cpu_engine.image, run],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    live_id = owner.stdout.readline().strip()

    def labelled(**labels: str) -> Any:
        return docker_client.containers.create(cpu_engine.image, ["--version"], labels={LABEL_RUN: run, **labels})

    me = owner_labels()
    recycled_pid = recycled_pid_labels()
    older = labelled(**{LABEL_PID: str(os.getpid()), LABEL_HOST: host})  # labels of an older llmplay
    elsewhere = labelled(**{**me, LABEL_HOST: "another-host"})
    made = [older, elsewhere]
    runner = CliRunner()
    try:
        assert live_id and owner.poll() is None
        # A run starting in the other test worker collects every orphan on this host, ours too, if it lists the
        # containers between our create and our gc: then this gc never saw it, so make another and ask again.
        for _ in range(5):
            recycled = labelled(**recycled_pid)
            made.append(recycled)
            out = runner.invoke(cli, ["gc", "--run", run]).output
            if recycled.name in out:
                break
        else:
            pytest.fail("five times running, a third collector took the orphan before the gc under test saw it")
        # our pid with another start time is a recycled pid, not the owner: provably gone
        assert f"removed {recycled.name} (run {run}: its llmplay process (pid {os.getpid()} on {host}) is gone)" in out
        assert f"left {older.name} (run {run}: pid {os.getpid()} runs, but an older llmplay labelled it" in out
        assert f"left {elsewhere.name} (run {run}: owned by pid {os.getpid()} on another-host" in out
        assert "`llmplay gc --force` removes it" in out
        assert "removed 1 container(s); left 3 (2 not provably orphaned" in out, out
        assert {c.id for c in left_over(docker_client, {LABEL_RUN: run})} == {live_id, older.id, elsewhere.id}

        out = runner.invoke(cli, ["gc", "--run", run, "--force"]).output
        assert f"removed {older.name}" in out and f"removed {elsewhere.name}" in out
        assert f"(run {run}: its run is still going (pid {owner.pid} on {host}))" in out, out
        assert [c.id for c in left_over(docker_client, {LABEL_RUN: run})] == [live_id]  # even --force leaves it

        owner.communicate("", timeout=30)  # the owner ends without removing its container: as after kill -9
        out = runner.invoke(cli, ["gc", "--run", run]).output
        assert f"its llmplay process (pid {owner.pid} on {host}) is gone)" in out, out
        assert left_over(docker_client, {LABEL_RUN: run}) == []
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()
        for c in made:
            with contextlib.suppress(Exception):
                c.remove(force=True)
        gc(docker_client, run_id=run, force=True)


def test_two_collectors_at_once_remove_every_orphan_and_neither_fails(docker_client: Any, cpu_engine: Any) -> None:
    """Every run collects orphans as it starts, so two runs starting together race for the same containers: Docker
    answers the slower one 409 ("removal ... already in progress") or 404, and that run must go on (CI once lost a
    run to the 409). When the two removals overlap closely enough, Docker answers both 204 (CI saw one container
    reported by both collectors), so "removed" means "gone after this collector asked", not "removed by it alone"."""
    dead_owner = recycled_pid_labels()
    # A run starting in the other test worker collects every orphan on this host too, and may take some of ours
    # first: then the two here cannot account for all twelve, so race them again over a fresh twelve.
    for _ in range(5):
        run = f"test-gc-race-{uuid.uuid4().hex[:8]}"
        made = [
            docker_client.containers.create(cpu_engine.image, ["--version"], labels={LABEL_RUN: run, **dead_owner})
            for _ in range(12)
        ]
        try:
            results, errors = race_two_collectors(run)
            assert errors == [] and len(results) == 2
            # Docker lists a container until its removal ends, and a third collector's may still be under way.
            wait_for(lambda run=run: not left_over(docker_client, {LABEL_RUN: run}), 30, "every orphan gone")
            removed = {c.name for result in results for c in result.removed}
            orphans = {c.name for c in made}
            assert removed <= orphans
            if removed == orphans:  # each by one of the two at least
                return
        finally:
            gc(docker_client, run_id=run, force=True)
    pytest.fail("five times running, a third collector took some of the orphans before the two under test")


def race_two_collectors(run: str) -> tuple[list[Any], list[BaseException]]:
    """Two gc calls for `run` released at one instant, each on its own Docker connection."""
    results: list[Any] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def collect() -> None:
        start.wait()
        try:
            results.append(gc(connect(), run_id=run))
        except BaseException as exc:  # the failure under test is any exception, in a thread pytest does not watch
            errors.append(exc)

    threads = [threading.Thread(target=collect) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results, errors


def test_only_a_removal_already_under_way_counts_as_being_removed() -> None:
    def api_error(status: int, explanation: str) -> docker.errors.APIError:
        response = requests.Response()
        response.status_code = status
        return docker.errors.APIError(f"{status} Client Error", response=response, explanation=explanation)

    assert being_removed(api_error(409, "removal of container 106ea6d0f1d3 is already in progress"))
    assert not being_removed(api_error(409, "container 106ea6d0f1d3 is running: stop it first"))
    assert not being_removed(api_error(500, "driver failed to remove root filesystem"))


@pytest.mark.docker
def test_fixture_endpoint_metrics_and_endpoint_runtime(llama_endpoint: Any) -> None:
    text = httpx.get(llama_endpoint.base_url + "/metrics", timeout=30).text
    _, missing = parse_metrics(text, LLAMACPP.metric_names)
    assert missing == []  # every metric the adapter names is really exported
    runtime = EndpointRuntime(llama_endpoint.base_url)
    with runtime.start(EngineSpec("llamacpp", "/models/tiny.gguf"), LLAMACPP) as endpoint:
        assert endpoint.base_url == llama_endpoint.base_url
        # An endpoint has no image to read a label from: the engine's own report is all there is.
        assert runtime.describe().engine_version == llama_endpoint.describe.engine_version_reported
        texts, _ = stream_completion(endpoint.base_url, endpoint.model, 4)
        assert texts
    assert httpx.get(llama_endpoint.base_url + "/health", timeout=30).status_code == 200  # not ours to stop


def test_endpoint_runtime_refuses_engine_changes() -> None:
    steps = [Step("more-users", (Change("workload.concurrency", 8),)), Step("p4", (Change("args.parallel", 4),))]
    refuse_engine_changes(steps[:1])
    with pytest.raises(
        PlaybookError,
        match=r"^step 'p4' changes args.parallel, but runtime endpoint at http://x:1 "
        r"cannot restart the engine",
    ):
        refuse_engine_changes(steps, "http://x:1")
    with pytest.raises(PlaybookError, match="needs url"):
        make_runtime("endpoint")
    with pytest.raises(PlaybookError, match="unknown runtime 'k8s'; expected one of: docker, process, endpoint"):
        make_runtime("k8s")


def test_endpoint_runtime_unreachable_is_an_engine_start_error() -> None:
    with pytest.raises(EngineStartError, match=r"not healthy at http://127\.0\.0\.1:9/health after 0\.5s"):
        EndpointRuntime("http://127.0.0.1:9/", health_timeout_s=0.5).start(EngineSpec("llamacpp", "m"), LLAMACPP)


@pytest.mark.docker
def test_cpu_engine_second_build_is_cached(cpu_engine: Any) -> None:
    # Cached: nothing built, downloaded, written or imported (each of those says so in the log), the same engine
    # back. How many seconds the check of the cache takes on a busy machine is not a property of the cache.
    again = build_cpu_engine(log=lambda m: pytest.fail(f"rebuilt: {m}"))
    assert again == cpu_engine
    assert len(cpu_engine.content_hash) == 16


@pytest.mark.parametrize("ci,outcome", [("true", "1 error"), ("", "1 skipped")])
def test_without_docker_ci_fails_and_elsewhere_skips(tmp_path: Any, ci: str, outcome: str) -> None:
    env = {**os.environ, "CI": ci, "DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    test = f"{__file__}::test_missing_image_says_how_to_get_it"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outcome in done.stdout, done.stdout
    assert (done.returncode != 0) == bool(ci)
    if ci:
        assert "docker unavailable: Docker daemon at DOCKER_HOST=unix://" in done.stdout
