"""What every runtime shares: the Endpoint it hands out, the health wait, the version probe, and the
registry of live runtimes that a signal handler stops."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from llmplay.engines.base import Engine
from llmplay.errors import EngineStartError
from llmplay.spec import EngineSpec, frozen_map

if TYPE_CHECKING:
    from docker.models.containers import Container

LOG_TAIL_LINES = 100

_live: set[Runtime] = set()
_live_lock = threading.Lock()


def stop_all() -> None:
    """Stop every runtime still running (for SIGINT/SIGTERM handlers); never raises."""
    with _live_lock:
        runtimes = list(_live)
    for runtime in runtimes:
        with contextlib.suppress(Exception):  # a handler must go on to the next one
            runtime.stop()


def live_runtimes() -> list[Runtime]:
    with _live_lock:
        return list(_live)


@dataclass(frozen=True)
class EngineDescription:
    """An engine a runtime started (or reached), as the trial's record keeps it: what ran, from which image or
    program, where, and which version answered. A fact the runtime does not have is None (a process has no image,
    an endpoint no command)."""

    runtime: str | None = None  # docker | process | endpoint; None: described by something else (a test's maker)
    engine: str | None = None  # the adapter's kind
    engine_version: str | None = None  # the image's release label, else what the engine reported; None: neither
    image: str | None = None
    image_id: str | None = None
    image_digest: str | None = None  # the first repo digest, else the image id
    command: tuple[str, ...] | None = None  # the argv (the image first, in a container)
    command_line: str | None = None
    container_id: str | None = None
    container_name: str | None = None
    host_port: int | None = None
    container_port: int | None = None
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    gpus: int | tuple[str, ...] | None = None  # as the engine spec asked for them
    image_labels: Mapping[str, str] | None = None
    health_s: float | None = None  # how long it took to answer its health check
    engine_version_reported: str | None = None  # what the engine itself reported, beside an image's label
    base_url: str | None = None
    executable: str | None = None  # a process's program
    log_path: str | None = None
    pid: int | None = None


@dataclass(frozen=True)
class Endpoint:
    """A healthy engine: where to send requests and what model name to put in them.

    Also a context manager: leaving the `with` block stops the runtime that started it."""

    base_url: str  # e.g. http://127.0.0.1:PORT, no trailing slash
    model: str
    describe: EngineDescription = field(default_factory=EngineDescription)
    _stop: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    @property
    def url(self) -> str:
        return self.base_url

    def __str__(self) -> str:
        return self.base_url

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._stop()


class Runtime(ABC):
    """Starts one engine, waits until it is healthy, and always cleans up."""

    kind: str = ""
    # What telemetry samples besides the engine's /metrics, while the engine runs: its container (docker SDK
    # Container), or its process and children (pid). Neither for an engine this runtime did not start.
    container: Container | None = None
    pid: int | None = None

    def _register(self) -> None:
        with _live_lock:
            _live.add(self)

    def _unregister(self) -> None:
        with _live_lock:
            _live.discard(self)

    @abstractmethod
    def start(self, spec: EngineSpec, engine: Engine, labels: Mapping[str, str] | None = None) -> Endpoint:
        """Launch and wait for health; on any failure clean up and raise (EngineStartError for the engine's own)."""

    @abstractmethod
    def stop(self) -> None:
        """Idempotent; safe from a signal handler's thread of control."""

    @abstractmethod
    def logs(self, tail: int | None = None) -> str: ...

    @abstractmethod
    def describe(self) -> EngineDescription | None:
        """The engine as started (None before a start: nothing to describe)."""

    def alive(self) -> bool:
        return True

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def require_free_port(host: str, port: int, what: str) -> None:
    """A fixed port (engine.port, or network_mode: host) must be free before an engine starts there: a server already
    on it would answer the health check and be measured instead, or the engine would exit unable to bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port a stopped engine left in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as exc:
            # An engine start that failed (the trial fails and says why), as when the engine itself cannot bind.
            raise EngineStartError(port_in_use(port, host, what, exc.strerror or str(exc))) from None


def port_in_use(port: int, host: str, what: str, detail: str = "") -> str:
    """The message for an engine whose port is taken: the port named, and how to free it."""
    why = f" ({detail})" if detail else ""
    return (
        f"port {port} on {host} is already in use{why}; expected it free for {what}: stop what listens there "
        f"(`ss -ltnp 'sport = :{port}'`), or set engine.port to another"
    )


BIND_FAILED = re.compile(
    r"address already in use|already allocated|could ?n[o']t bind|bind\(\) failed|EADDRINUSE", re.I
)


def tail_lines(text: str, n: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-n:])


def wait_healthy(
    url: str,
    timeout_s: float,
    exit_code: Callable[[], int | None],
    logs: Callable[[], str],
    what: str,
    interval_s: float = 0.25,
) -> float:
    """Poll `url` until it answers 200; seconds it took. Raises EngineStartError with the exit code and the
    last log lines when the engine exits first or the timeout passes."""
    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    last = "no answer yet"
    with httpx.Client(timeout=min(5.0, max(timeout_s, 0.5))) as client:
        while True:
            code = exit_code()
            if code is not None:
                tail = tail_lines(logs())
                port = httpx.URL(url).port
                hint = f" (its port {port} is in use: stop what listens there)" if BIND_FAILED.search(tail) else ""
                raise EngineStartError(
                    f"{what} exited with code {code} before becoming healthy{hint}; last {LOG_TAIL_LINES} log "
                    f"lines:\n{tail}",
                    code,
                    tail,
                )
            try:
                r = client.get(url)
                if r.status_code == 200:
                    return time.perf_counter() - t0
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            if time.perf_counter() >= deadline:
                tail = tail_lines(logs())
                raise EngineStartError(
                    f"{what} not healthy at {url} after {timeout_s:g}s (last: {last}); "
                    f"last {LOG_TAIL_LINES} log lines:\n{tail}",
                    None,
                    tail,
                )
            time.sleep(interval_s)


def probe_version(base_url: str, engine: Engine, log_text: str = "") -> str | None:
    """The engine's own version: from its API when it has one, else from its log."""
    if engine.version_path:
        try:
            r = httpx.get(base_url + engine.version_path, timeout=5.0)
            if r.status_code == 200:
                value = r.json().get(engine.version_field)
                if value:
                    return str(value)
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    if engine.version_log_pattern and log_text:
        m = re.search(engine.version_log_pattern, log_text)
        if m:
            return m.group(1)
    return None
