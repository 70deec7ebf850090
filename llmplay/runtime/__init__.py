"""Where engines run: docker (default), a local process, or an endpoint already running; one interface, one
registry of kinds (like the engines'). A Ray cluster (runtime.ray) is a place such runtimes run, on its nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from llmplay.errors import PlaybookError
from llmplay.runtime.base import Endpoint, Runtime, live_runtimes, stop_all
from llmplay.runtime.endpoint import EndpointRuntime
from llmplay.runtime.process import ProcessRuntime
from llmplay.spec import RuntimeSpec

if TYPE_CHECKING:
    from docker import DockerClient

# The seam a trial starts its engine through: a fresh runtime for the playbook's runtime section.
RuntimeFactory = Callable[[RuntimeSpec], Runtime]


class RuntimeOptions(TypedDict, total=False):
    """What a runtime's constructor takes besides the playbook's runtime section, each by the runtime that uses it."""

    client: DockerClient  # docker
    docker_host: str | None  # docker
    bind_host: str  # docker, process
    log_dir: str | Path | None  # process
    url: str  # endpoint
    health_timeout_s: float | None  # endpoint


def _docker(spec: RuntimeSpec, options: RuntimeOptions) -> Runtime:
    from llmplay.runtime.docker import DockerRuntime  # deferred: the docker SDK loads only for this runtime

    docker_host = options.get("docker_host", spec.docker_host or None)
    return DockerRuntime(
        options.get("client"), docker_host=docker_host, bind_host=options.get("bind_host", "127.0.0.1")
    )


def _process(spec: RuntimeSpec, options: RuntimeOptions) -> Runtime:
    return ProcessRuntime(log_dir=options.get("log_dir"), bind_host=options.get("bind_host", "127.0.0.1"))


def _endpoint(spec: RuntimeSpec, options: RuntimeOptions) -> Runtime:
    url = options.get("url") or spec.url
    if not url:
        raise PlaybookError("runtime endpoint needs url: http://HOST:PORT of the running engine")
    return EndpointRuntime(url, health_timeout_s=options.get("health_timeout_s"))


# kind -> how to build one from the playbook's runtime section and constructor options (client=, log_dir=, url=)
RUNTIMES: dict[str, Callable[[RuntimeSpec, RuntimeOptions], Runtime]] = {
    "docker": _docker,
    "process": _process,
    "endpoint": _endpoint,
}
KINDS = tuple(RUNTIMES)


def make_runtime(kind: str | RuntimeSpec = "docker", **options: Unpack[RuntimeOptions]) -> Runtime:
    """A fresh runtime for one engine start. `kind` is a RuntimeSpec (from the playbook) or its kind; `options`
    go to the runtime's constructor (client=, docker_host=, log_dir=, url=), over what the spec says."""
    spec = kind if isinstance(kind, RuntimeSpec) else RuntimeSpec(kind=kind)
    build = RUNTIMES.get(spec.kind)
    if build is None:
        raise PlaybookError(f"unknown runtime '{spec.kind}'; expected one of: {', '.join(KINDS)}")
    return build(spec, options)


__all__ = ["KINDS", "RUNTIMES", "Endpoint", "Runtime", "RuntimeFactory", "live_runtimes", "make_runtime", "stop_all"]
