"""The GPUs this host has, as NVML reports them: for the archive header, a cluster node's answer and the diagnosis."""

from __future__ import annotations

import contextlib
from typing import Any, TypedDict  # Any: the NVML module, pynvml (which ships no types) or its test fake

import pynvml


class GpuInventory(TypedDict, total=False):
    """The host's GPUs as the archive header keeps them; `error` alone when NVML could not say."""

    name: str | None
    names: list[str]
    count: int
    driver: str
    cuda: str
    error: str


def gpu_inventory(nvml: Any = None) -> GpuInventory | None:  # nvml: pynvml, untyped, or a fake of it
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
