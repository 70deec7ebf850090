"""The process runtime: the engine as a local executable in its own process group, logging to a file,
killed as a group (bare-metal installs, Slurm nodes without Docker)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import psutil

from llmplay.engines.base import Engine
from llmplay.errors import InfrastructureError
from llmplay.runtime.base import (
    Endpoint,
    EngineDescription,
    Runtime,
    free_port,
    probe_version,
    require_free_port,
    tail_lines,
    wait_healthy,
)
from llmplay.runtime.labels import LABEL_RUN, LABEL_TRIAL
from llmplay.spec import EngineSpec

STOP_TIMEOUT_S = 10.0
_HOST_FLAGS = ("--host", "--hostname")


def _bind_loopback(argv: list[str], host: str) -> list[str]:
    """Adapters bind 0.0.0.0 for containers; on the host itself listen on loopback only."""
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a in _HOST_FLAGS:
            out[i + 1] = host
    return out


def host_model(spec: EngineSpec, engine: Engine) -> EngineSpec:
    """A model path written as the container sees it (/models/...) maps to model_dir on the host."""
    if spec.model_dir and spec.model.startswith(engine.model_path_in_container):
        rest = spec.model[len(engine.model_path_in_container) :].lstrip("/")
        host = Path(spec.model_dir).expanduser() / rest if rest else Path(spec.model_dir).expanduser()
        return replace(spec, model=str(host))
    return spec


class ProcessRuntime(Runtime):
    kind = "process"

    def __init__(self, *, log_dir: str | Path | None = None, bind_host: str = "127.0.0.1"):
        self.log_dir = Path(log_dir) if log_dir else None
        self.bind_host = bind_host
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None  # telemetry samples this process (and its children)
        self.log_path: Path | None = None
        self._info: EngineDescription | None = None
        self._lock = threading.RLock()

    def start(self, spec: EngineSpec, engine: Engine, labels: Mapping[str, str] | None = None) -> Endpoint:
        if self.proc is not None:
            raise RuntimeError("this ProcessRuntime already runs an engine; use one runtime per start")
        spec = host_model(spec, engine)
        if spec.port:
            require_free_port(self.bind_host, spec.port, f"the {engine.kind} process (engine.port)")
        port = spec.port or free_port(self.bind_host)
        argv = _bind_loopback(engine.process_argv(spec, port), self.bind_host)
        if not argv:
            raise InfrastructureError(f"engine '{engine.kind}' has no default program; set engine.executable")
        program = argv[0]
        if shutil.which(program) is None:
            raise InfrastructureError(
                f"executable '{program}' not found or not executable; set engine.executable "
                f"to the {engine.kind} server program"
            )
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="llmplay-engine-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        run = (labels or {}).get(LABEL_TRIAL) or (labels or {}).get(LABEL_RUN) or "adhoc"
        self.log_path = log_dir / f"{engine.kind}-{run}-{port}.log"
        env = dict(os.environ)
        env.update(spec.env)
        self._info = info = EngineDescription(
            runtime=self.kind,
            engine=engine.kind,
            executable=program,
            command=tuple(argv),
            command_line=shlex.join(argv),
            host_port=port,
            log_path=str(self.log_path),
            labels=dict(labels or {}),
        )
        self._register()
        try:
            with open(self.log_path, "wb") as log:
                # A session of its own: signals to our terminal's group do not reach it, and the
                # whole group (engine workers included) is killed together.
                self.proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            self.pid = self.proc.pid
            self._info = info = replace(info, pid=self.pid)
            base_url = f"http://127.0.0.1:{port}"
            health_s = wait_healthy(
                base_url + (spec.health_path or engine.health_path),
                spec.health_timeout_s,
                self.proc.poll,
                self.logs,
                f"{engine.kind} process {program} (pid {self.pid})",
            )
            version = probe_version(base_url, engine, self.logs(tail=200))
            self._info = info = replace(info, health_s=health_s, engine_version=version, base_url=base_url)
        except BaseException:
            self.stop()
            raise
        return Endpoint(base_url, engine.served_model(spec), info, self.stop)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self, tail: int | None = None) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace")
        return tail_lines(text, tail) if tail else text

    def stop(self) -> None:
        with self._lock:  # reentrant, as in the docker runtime: a nested call kills the group again
            proc = self.proc
            try:
                if proc is not None:
                    _kill_group(proc)
            finally:
                self.proc = None
                self._unregister()

    def describe(self) -> EngineDescription | None:
        return self._info


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL what is left after STOP_TIMEOUT_S, and reap."""
    pgid = proc.pid  # start_new_session made it the group leader
    # Children that left the group (their own setsid) are still found through the process tree.
    try:
        stragglers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        stragglers = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S if sig == signal.SIGTERM else 5)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + 2
    for child in stragglers:
        try:
            child.kill()
            child.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except psutil.Error:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)  # anything of the group still around
