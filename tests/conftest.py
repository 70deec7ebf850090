"""Session fixtures for the real things: dockerd, the CPU engine (llama-server, tiny GGUF, local image),
and a running llama.cpp container. In CI (CI=true) a missing Docker fails the tests instead of skipping."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from llmplay.engines import get_engine
from llmplay.errors import InfrastructureError
from llmplay.runtime import dockerd
from llmplay.runtime.cpu_image import build_cpu_engine
from llmplay.runtime.docker import DockerRuntime
from llmplay.runtime.labels import LABEL_RUN, LABEL_TRIAL
from llmplay.spec import EngineSpec, frozen_map
from llmplay_testing.priority import timing_priority


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip here; fail in CI, where a silently skipped container test would hide a broken setup."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: container tests must run)", pytrace=False)
    pytest.skip(reason)


def _quiet(message: str) -> None:
    print(f"[cpu-engine] {message}", file=sys.stderr)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker SDK client; starts dockerd in the background first when none answers (root only)."""
    try:
        dockerd.ensure_dockerd()
        client = dockerd.client()
    except InfrastructureError as exc:
        unavailable(f"docker unavailable: {exc}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def cpu_binary() -> Any:
    """llama-server and the tiny model on the host (no Docker needed): a CpuEngine without image."""
    try:
        return build_cpu_engine(with_image=False, log=_quiet)
    except InfrastructureError as exc:
        unavailable(f"CPU engine could not be built: {exc}")


@pytest.fixture(scope="session")
def cpu_engine(docker_client: Any) -> Any:
    """The CPU engine with its local image: `.image` (tag), `.model_path` (host), `.binary` (host)."""
    try:
        return build_cpu_engine(log=_quiet)
    except InfrastructureError as exc:
        unavailable(f"CPU engine image could not be built: {exc}")


@pytest.fixture(scope="session")
def llama_server_spec(cpu_engine: Any) -> EngineSpec:
    """llama.cpp in the CPU image: small context, 2 threads, 2 slots, metrics on."""
    return EngineSpec(
        kind="llamacpp",
        model=cpu_engine.model_in_image,
        image=cpu_engine.image,
        args=frozen_map({"threads": 2, "ctx_size": 1024, "parallel": 2, "metrics": True}),
        health_timeout_s=60.0,
    )


@pytest.fixture(scope="module")
def llama_endpoint(docker_client: Any, llama_server_spec: EngineSpec) -> Iterator[Any]:
    """A running llama.cpp container started through the docker runtime; removed after the module."""
    runtime = DockerRuntime(docker_client)
    labels = {LABEL_RUN: f"test-{uuid.uuid4().hex[:8]}", LABEL_TRIAL: "fixture"}
    with runtime.start(llama_server_spec, get_engine("llamacpp"), labels) as endpoint:
        yield endpoint


# A test that needs one of these starts dockerd, a container, an engine or a Ray cluster (test_ray's `cluster`):
# seconds to minutes each, so it belongs to the slow lane whatever its own markers say, as does every `docker`
# test (`pytest -m "not slow"` is the fast lane).
_ENGINE_FIXTURES = frozenset(
    {"docker_client", "cpu_binary", "cpu_engine", "llama_server_spec", "llama_endpoint", "cluster"}
)


@pytest.fixture(scope="module", autouse=True)
def _timing_modules_at_a_raised_priority(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module marked `timing` runs at a raised CPU priority, set before its module fixtures start an instrument
    process (which inherits it): its margins hold whatever engine test the other worker runs meanwhile."""
    if request.node.get_closest_marker("timing") is None:
        yield
        return
    with timing_priority():
        yield


def pytest_configure(config: pytest.Config) -> None:
    # The live-runs registry is host-wide and keeps each ended run a day: a suite's runs, and every earlier suite's
    # on this machine, would pile up there, and each trial reads it all twice. One fresh registry per test session
    # (its workers and the CLI processes they start inherit it); a test that names its own keeps its own.
    if not os.environ.get("LLMPLAY_LIVE_RUNS"):
        os.environ["LLMPLAY_LIVE_RUNS"] = tempfile.mkdtemp(prefix="llmplay-live-runs-")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("docker") or _ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def draws_free_of_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run draws which side of each pair starts, and a search the order it tries values in, from its run id (a time
    and a random part). A simulated engine's data follow those orders, so on one its verdicts would change with the
    run id: here both draws take a fixed run id instead, and stay varied across steps and pairs."""
    from llmplay.tuning import search_step, steps

    real_first, real_seed = steps.candidate_first, search_step.search_seed
    monkeypatch.setattr(steps, "candidate_first", lambda _run_id, step, repeat: real_first("fixed", step, repeat))
    monkeypatch.setattr(search_step, "search_seed", lambda _run_id, step: real_seed("fixed", step))
