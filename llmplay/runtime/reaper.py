"""The engine's watchdog on a cluster node: when the process that started an engine dies without stopping it (its
node's raylet was killed, the job was torn down), a detached process left behind removes the engine.

On one machine a killed llmplay leaves its containers to the next run's orphan collection on that machine; a
cluster node may never see this run again, so each trial there leaves a watchdog that outlives the trial's worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil

# Every engine a watched process starts carries this in its environment, so its process group can be found.
OWNER_ENV = "LLMPLAY_ENGINE_OWNER"
POLL_S = 0.5


def _kill_engines_of(owner: int) -> None:
    """Process-runtime engines started by `owner` (found by OWNER_ENV): their whole process groups."""
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(OWNER_ENV) == str(owner):
                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def reap(owner: int, run_id: str, docker_host: str | None) -> None:
    """Wait for `owner` to exit, then remove what it left running of `run_id`."""
    while _alive(owner):
        time.sleep(POLL_S)
    _kill_engines_of(owner)
    with contextlib.suppress(Exception):  # no dockerd on this node: the process runtime's engines are gone already
        from llmplay.runtime.docker import connect, gc  # deferred: the docker SDK only when there is something to do

        client = connect(docker_host, timeout_s=30)
        try:
            gc(client, run_id=run_id)
        finally:
            client.close()


@contextlib.contextmanager
def watched(run_id: str, docker_host: str | None = None) -> Iterator[None]:
    """While the block runs, a detached watchdog stands ready to remove this process's engines should it die; a
    block that ends normally has stopped its engines itself and ends the watchdog."""
    os.environ[OWNER_ENV] = str(os.getpid())
    argv = [sys.executable, "-m", "llmplay.runtime.reaper", str(os.getpid()), run_id, docker_host or ""]
    # Its own session, and detached (it forks and its parent exits): a cluster worker's teardown kills the worker's
    # process group and its children, and the watchdog must outlive exactly that.
    starter = subprocess.Popen(
        argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    out, _ = starter.communicate(timeout=30)
    watchdog = int(out.split()[0]) if out.split() else None
    try:
        yield
    finally:
        if watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(watchdog, signal.SIGKILL)


def _detach_and_reap(owner: int, run_id: str, docker_host: str | None) -> None:
    if os.fork():
        os._exit(0)
    sys.stdout.write(f"{os.getpid()}\n")
    sys.stdout.flush()
    os.close(sys.stdout.fileno())
    reap(owner, run_id, docker_host)


if __name__ == "__main__":
    _detach_and_reap(int(sys.argv[1]), sys.argv[2], sys.argv[3] or None)
