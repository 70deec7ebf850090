"""The host a run measured on: machine, Docker, Python and GPU inventory for the archive header."""

from __future__ import annotations

import getpass
import platform
import socket
import sys

from llmplay import __version__
from llmplay.archive.run_facts import RunEnvironment
from llmplay.runtime.docker import connect
from llmplay.runtime.gpus import gpu_inventory
from llmplay.spec import Playbook


def _docker_version(playbook: Playbook) -> str | None:
    if playbook.runtime.kind != "docker":
        return None
    try:
        return str(connect(playbook.runtime.docker_host, timeout_s=10).version().get("Version"))
    except Exception:  # the header then says "Docker —"; the run itself reports real failures
        return None


def describe_environment(playbook: Playbook, *, started_utc: str) -> RunEnvironment:
    """Host, Docker, Python, GPU and seed for the archive header: what a later reader needs to compare runs."""
    return RunEnvironment(
        host=socket.gethostname(),
        docker=_docker_version(playbook),
        user=getpass.getuser(),
        llmplay_version=__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
        gpu=gpu_inventory(),
        seed=playbook.workload.seed,
        started_utc=started_utc,
    )
