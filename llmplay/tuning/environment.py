"""The host a run measured on: machine, Docker, Python and GPU inventory for the archive header."""

from __future__ import annotations

import contextlib
import getpass
import platform
import socket
import sys
from typing import Any

import pynvml

from llmplay import __version__
from llmplay.runtime.docker import connect
from llmplay.spec import Playbook


def _docker_version(playbook: Playbook) -> str | None:
    if playbook.runtime.kind != "docker":
        return None
    try:
        return str(connect(playbook.runtime.docker_host, timeout_s=10).version().get("Version"))
    except Exception:  # the header then says "Docker —"; the run itself reports real failures
        return None


def describe_environment(playbook: Playbook, *, started_utc: str) -> dict[str, Any]:
    """Host, Docker, Python, GPU and seed for the archive header: what a later reader needs to compare runs."""
    gpu = gpu_inventory()
    return {
        "host": socket.gethostname(),
        "docker": _docker_version(playbook),
        "user": getpass.getuser(),
        "llmplay_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "gpu": gpu,
        "seed": playbook.workload.seed,
        "started_utc": started_utc,
    }


def gpu_inventory(nvml: Any = None) -> dict[str, Any] | None:
    """GPU model, driver and CUDA version for the archive header; None on a machine without NVML."""
    nvml = pynvml if nvml is None else nvml
    try:
        nvml.nvmlInit()
    except Exception:  # no driver/library is the normal CPU case; the report says "CPU only"
        return None
    try:
        count = nvml.nvmlDeviceGetCount()
        names = [str(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        cuda = nvml.nvmlSystemGetCudaDriverVersion()
        return {
            "name": names[0] if names else None,
            "names": names,
            "count": count,
            "driver": str(nvml.nvmlSystemGetDriverVersion()),
            "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
        }
    except Exception as exc:  # any NVML failure is reported in the header, never fatal to the run
        return {"error": f"NVML query failed: {exc}"}
    finally:
        with contextlib.suppress(Exception):  # shutting down is best effort; the inventory is already taken
            nvml.nvmlShutdown()
