"""The GPUs this host has, as NVML reports them: for the archive header, a cluster node's answer and the diagnosis."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any  # Any: the NVML module, pynvml (which ships no types) or its test fake

import pynvml


@dataclass(frozen=True)
class GpuInventory:
    """The host's GPUs as the archive header keeps them; `error` alone when NVML could not say."""

    name: str | None = None
    names: tuple[str, ...] = ()
    count: int = 0
    driver: str = ""
    cuda: str = ""
    error: str | None = None  # why NVML could not say: then the only fact
    node: str | None = None  # the cluster node that answered (a Ray run's trials' GPUs); None: this host

    def on_node(self, node: str) -> GpuInventory:
        return replace(self, node=node)


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
        return GpuInventory(
            name=names[0] if names else None,
            names=tuple(names),
            count=count,
            driver=str(nvml.nvmlSystemGetDriverVersion()),
            cuda=f"{cuda // 1000}.{cuda % 1000 // 10}",
        )
    except Exception as exc:  # any NVML failure is reported in the header, never fatal to the run
        return GpuInventory(error=f"NVML query failed: {exc}")
    finally:
        with contextlib.suppress(Exception):  # shutting down is best effort; the inventory is already taken
            nvml.nvmlShutdown()
