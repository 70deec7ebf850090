"""Where engines run: docker (default), a local process, or an endpoint already running; one interface, one
registry of kinds (like the engines'). A Ray cluster (runtime.ray) is a place such runtimes run, on its nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmplay.errors import PlaybookError
from llmplay.runtime.base import Endpoint, Runtime, live_runtimes, stop_all
from llmplay.runtime.endpoint import EndpointRuntime
from llmplay.runtime.process import ProcessRuntime
from llmplay.spec import RuntimeSpec

# The seam a trial starts its engine through: a fresh runtime for the playbook's runtime section.
RuntimeFactory = Callable[[RuntimeSpec], Runtime]


def _docker(spec: RuntimeSpec, options: dict[str, Any]) -> Runtime:
    from llmplay.runtime.docker import DockerRuntime  # deferred: the docker SDK loads only for this runtime

    if spec.docker_host:
        options.setdefault("docker_host", spec.docker_host)
    return DockerRuntime(**options)


def _process(spec: RuntimeSpec, options: dict[str, Any]) -> Runtime:
    return ProcessRuntime(**options)


def _endpoint(spec: RuntimeSpec, options: dict[str, Any]) -> Runtime:
    url = options.pop("url", None) or spec.url
    if not url:
        raise PlaybookError("runtime endpoint needs url: http://HOST:PORT of the running engine")
    return EndpointRuntime(url, **options)


# kind -> how to build one from the playbook's runtime section and constructor options (client=, log_dir=, url=)
RUNTIMES: dict[str, Callable[[RuntimeSpec, dict[str, Any]], Runtime]] = {
    "docker": _docker,
    "process": _process,
    "endpoint": _endpoint,
}
KINDS = tuple(RUNTIMES)


def make_runtime(kind: str | RuntimeSpec = "docker", **options: Any) -> Runtime:
    """A fresh runtime for one engine start. `kind` is a RuntimeSpec (from the playbook) or its kind; `options`
    go to the runtime's constructor (client=, docker_host=, log_dir=, url=), over what the spec says."""
    spec = kind if isinstance(kind, RuntimeSpec) else RuntimeSpec(kind=kind)
    build = RUNTIMES.get(spec.kind)
    if build is None:
        raise PlaybookError(f"unknown runtime '{spec.kind}'; expected one of: {', '.join(KINDS)}")
    return build(spec, dict(options))


__all__ = ["KINDS", "RUNTIMES", "Endpoint", "Runtime", "RuntimeFactory", "live_runtimes", "make_runtime", "stop_all"]
