"""Reaching a Docker daemon: ping it, and on a bare machine start `dockerd` in the background (as root)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docker import DockerClient

from llmplay.errors import InfrastructureError
from llmplay.runtime.cache import default_cache_dir

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
# Daemons this process started: holding the Popen keeps it from being collected (and warning) while dockerd,
# deliberately, outlives us.
_STARTED: list[subprocess.Popen[bytes]] = []
START_HINT = "start it with `sudo dockerd &` (or `sudo systemctl start docker`), or install it: `sudo apt-get install -y docker.io`"


def _client(timeout_s: float = 10.0) -> DockerClient:
    import docker  # deferred: the docker SDK (requests, urllib3) loads only when a daemon is asked for

    return docker.from_env(timeout=int(max(timeout_s, 1)))


def _unix_socket_problem(timeout_s: float) -> str | None:
    """Check a local daemon socket ourselves: the SDK leaks its socket when the connect fails."""
    host = os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
    if not host.startswith("unix://"):
        return None
    path = host[len("unix://") :]
    if not os.path.exists(path):
        return f"no socket at {path}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(path)
        except OSError as exc:
            return f"cannot connect to {path}: {exc.strerror or exc}"
    return None


def ping(timeout_s: float = 5.0) -> str | None:
    """None when a daemon answers; otherwise why not (one line)."""
    problem = _unix_socket_problem(timeout_s)
    if problem:
        return problem
    try:
        client = _client(timeout_s)
        try:
            client.ping()
        finally:
            client.close()
        return None
    except Exception as exc:  # the SDK raises DockerException, requests' and socket errors alike
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def client(timeout_s: float = 120.0) -> DockerClient:
    """A docker SDK client for a daemon that answers, or an InfrastructureError saying how to start one."""
    why = ping()
    if why is not None:
        raise InfrastructureError(f"Docker daemon unreachable ({why}); {START_HINT}")
    return _client(timeout_s)


def ensure_dockerd(cache_dir: Path | str | None = None, timeout_s: float = 60.0) -> None:
    """Return once a daemon answers, starting a local `dockerd` when none does and we may (root, local socket)."""
    if ping() is None:
        return
    remote = os.environ.get("DOCKER_HOST", "")
    if remote and remote != DEFAULT_SOCKET:
        # A dockerd we start listens on the default socket, not there.
        raise InfrastructureError(
            f"Docker daemon at DOCKER_HOST={remote} unreachable ({ping()}); start it there, "
            "or unset DOCKER_HOST to use the local one"
        )
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise InfrastructureError(f"no Docker daemon answers and `dockerd` is not installed; {START_HINT}")
    if os.geteuid() != 0:
        raise InfrastructureError(f"no Docker daemon answers and only root may start one; {START_HINT}")
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    log_path = cache / "dockerd.log"
    with open(log_path, "ab") as log:
        # Its own session so it outlives this process and a Ctrl-C here; later runs reuse it.
        proc = subprocess.Popen(
            [dockerd], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    _STARTED.append(proc)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ping(2.0) is None:
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    tail = log_path.read_text(errors="replace").splitlines()[-5:]
    raise InfrastructureError(
        f"started dockerd but it did not answer within {timeout_s:.0f}s "
        f"(exit code {proc.poll()}); see {log_path}: {' | '.join(tail)}"
    )
