"""Where engines run: docker (default), a local process, or an endpoint already running; one interface."""

from __future__ import annotations

from typing import Any

from llmplay.errors import PlaybookError
from llmplay.runtime.base import Endpoint, Runtime, live_runtimes, stop_all
from llmplay.runtime.endpoint import EndpointRuntime
from llmplay.runtime.process import ProcessRuntime
from llmplay.spec import RuntimeSpec

KINDS = ("docker", "process", "endpoint")


def make_runtime(kind: str | RuntimeSpec = "docker", **kwargs: Any) -> Runtime:
    """A fresh runtime for one engine start. `kind` is a RuntimeSpec (from the playbook) or its kind;
    kwargs go to the runtime's constructor (client=, docker_host=, log_dir=, url=)."""
    if isinstance(kind, RuntimeSpec):
        spec, kind = kind, kind.kind
        if kind == "docker" and spec.docker_host:
            kwargs.setdefault("docker_host", spec.docker_host)
        if kind == "endpoint" and spec.url:
            kwargs.setdefault("url", spec.url)
    if kind == "docker":
        from llmplay.runtime.docker import DockerRuntime  # deferred: the docker SDK loads only for this runtime

        return DockerRuntime(**kwargs)
    if kind == "process":
        return ProcessRuntime(**kwargs)
    if kind == "endpoint":
        if not kwargs.get("url"):
            raise PlaybookError("runtime endpoint needs url: http://HOST:PORT of the running engine")
        return EndpointRuntime(**kwargs)
    raise PlaybookError(f"unknown runtime '{kind}'; expected one of: {', '.join(KINDS)}")


__all__ = ["KINDS", "Endpoint", "Runtime", "live_runtimes", "make_runtime", "stop_all"]
