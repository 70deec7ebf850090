"""The endpoint runtime: an engine someone else already runs at a URL; llmplay only checks and measures it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmplay.engines.base import Engine
from llmplay.errors import PlaybookError
from llmplay.runtime.base import Endpoint, EngineDescription, Runtime, probe_version, wait_healthy
from llmplay.spec import EngineSpec, Step


def refuse_engine_changes(steps: Iterable[Step], url: str = "") -> None:
    """Steps may only change the workload here: llmplay cannot restart an engine it did not start."""
    for step in steps:
        for change in step.changes:
            if not change.target.startswith("workload."):
                where = f" at {url}" if url else ""
                raise PlaybookError(
                    f"step '{step.name}' changes {change.target}, but runtime endpoint{where} cannot "
                    "restart the engine; expected only workload.* steps, or runtime docker/process"
                )


class EndpointRuntime(Runtime):
    kind = "endpoint"

    def __init__(self, url: str, *, health_timeout_s: float | None = None):
        self.url = url.rstrip("/")
        self.health_timeout_s = health_timeout_s
        self._info: EngineDescription | None = None

    def start(self, spec: EngineSpec, engine: Engine, labels: Mapping[str, str] | None = None) -> Endpoint:
        timeout_s = self.health_timeout_s if self.health_timeout_s is not None else min(spec.health_timeout_s, 30.0)
        health_s = wait_healthy(
            self.url + (spec.health_path or engine.health_path),
            timeout_s,
            lambda: None,
            lambda: "(engine not started by llmplay: no logs)",
            f"{engine.kind} endpoint {self.url}",
        )
        self._info = info = EngineDescription(
            runtime=self.kind,
            engine=engine.kind,
            engine_version=probe_version(self.url, engine),
            base_url=self.url,
            health_s=health_s,
            labels=dict(labels or {}),
        )
        return Endpoint(self.url, engine.served_model(spec), info, self.stop)

    def stop(self) -> None:
        """Nothing to stop: the engine is not ours."""

    def logs(self, tail: int | None = None) -> str:
        return ""

    def describe(self) -> EngineDescription | None:
        return self._info
