"""GPU telemetry through NVML (pynvml): memory, utilization, clocks, power, and Hopper GPM metrics."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any  # pynvml, the NVML bindings, ships no types: its module, handles and results are untyped

from llmplay.telemetry.sampler import Reading, add_note


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


class NvmlSource:
    """Per-GPU readings. `nvml` is the pynvml module (imported lazily when None), so nothing
    touches the driver at import time and tests can hand in `tests/fake_nvml.py`.

    Without a usable NVML (no library, no driver, no GPU) it says "no NVML: <reason>" once
    and produces no samples, so reports show "not measured" rather than zeros.
    """

    name = "nvml"

    def __init__(self, gpu_indices: Sequence[int | str] | None = None, nvml: Any = None):  # pynvml or its fake
        # NVML indices, or GPU UUIDs ("GPU-…"); None: every GPU
        self.gpu_indices = None if gpu_indices is None else list(gpu_indices)
        self._nvml = nvml
        self.notes: list[str] = []
        self.info: dict[str, str] = {}
        self._handles: dict[int, object] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._gpm: dict[int, list[object]] = {}  # gpu -> [previous sample, current sample]
        self._gpm_primed: set[int] = set()
        self._open = False

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> bool:
        if self._nvml is None:
            try:
                import pynvml  # deferred: loads libnvidia-ml bindings; a test passes a fake (package nvidia-ml-py)
            except ImportError as e:
                add_note(self.notes, f"no NVML: pynvml not installed ({e}); install nvidia-ml-py")
                return False
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            add_note(self.notes, f"no NVML: {e}")
            return False
        self._open = True
        try:
            count = int(nv.nvmlDeviceGetCount())
            wanted = list(range(count)) if self.gpu_indices is None else self.gpu_indices
            missing: list[int | str] = []
            for g in wanted:
                if isinstance(g, str) and not g.isdigit():  # a UUID, as docker device requests take
                    try:
                        h = nv.nvmlDeviceGetHandleByUUID(g)
                        self._handles[int(nv.nvmlDeviceGetIndex(h))] = h
                    except Exception:
                        missing.append(g)
                elif 0 <= int(g) < count:
                    self._handles[int(g)] = nv.nvmlDeviceGetHandleByIndex(int(g))
                else:
                    missing.append(int(g))
            if missing:
                add_note(self.notes, f"NVML: GPU {missing} not present ({count} GPUs)")
            self.info["nvml.driver_version"] = _text(nv.nvmlSystemGetDriverVersion())
        except Exception as e:
            add_note(self.notes, f"no NVML: {e}")
            self.close()
            return False
        if not self._handles:
            add_note(self.notes, "no NVML: no GPU to sample")
            self.close()
            return False
        for i, h in self._handles.items():
            self.info[f"gpu{i}.name"] = _text(self._try(i, "name", nv.nvmlDeviceGetName, h) or "?")
            mem = self._try(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                self.info[f"gpu{i}.memory_total_bytes"] = str(int(mem.total))
            self._start_gpm(i, h)
        return True

    def close(self) -> None:
        if not self._open:
            return
        nv = self._nvml
        for pair in self._gpm.values():
            for s in pair:
                with contextlib.suppress(Exception):  # freeing at shutdown; nothing useful to report
                    nv.nvmlGpmSampleFree(s)
        self._gpm.clear()
        try:
            nv.nvmlShutdown()
        finally:
            self._open = False

    def gpu_names(self) -> dict[int, str]:
        return {i: self.info.get(f"gpu{i}.name", "?") for i in self._handles}

    # -- reading ---------------------------------------------------------------------
    def _try(self, gpu: int, what: str, query: Callable[..., Any], *args: object) -> Any:  # an untyped NVML query
        """`query(*args)`, one NVML query; a NotSupported (or any) error disables it for that GPU, noted once."""
        if (gpu, what) in self._unsupported:
            return None
        try:
            return query(*args)
        except Exception as e:
            self._unsupported.add((gpu, what))
            add_note(self.notes, f"NVML gpu{gpu}: {what} not measured ({e})")
            return None

    def _start_gpm(self, i: int, h: object) -> None:
        nv = self._nvml
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            add_note(self.notes, f"NVML gpu{i}: GPM not measured (pynvml too old)")
            return
        try:
            supported = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except Exception as e:
            add_note(self.notes, f"NVML gpu{i}: GPM not measured ({e})")
            return
        if not supported:
            add_note(self.notes, f"NVML gpu{i}: GPM not supported (needs Hopper or newer)")
            return
        try:
            self._gpm[i] = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        except Exception as e:
            add_note(self.notes, f"NVML gpu{i}: GPM not measured ({e})")

    def _read_gpm(self, i: int, h: object) -> list[Reading]:
        """GPM metrics are rates between two samples: take one now, compare with the last."""
        nv = self._nvml
        prev, cur = self._gpm[i]
        nv.nvmlGpmSampleGet(h, cur)
        self._gpm[i] = [cur, prev]  # `cur` becomes the previous sample for the next tick
        if i not in self._gpm_primed:
            self._gpm_primed.add(i)
            return []
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 2
        mg.sample1 = prev
        mg.sample2 = cur
        wanted = [
            (nv.NVML_GPM_METRIC_SM_UTIL, "gpu.sm_activity_frac"),
            (nv.NVML_GPM_METRIC_DRAM_BW_UTIL, "gpu.dram_bw_util_frac"),
        ]
        for k, (mid, _) in enumerate(wanted):
            mg.metrics[k].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        out = []
        for k, (_, metric) in enumerate(wanted):
            m = mg.metrics[k]
            if int(m.nvmlReturn) == 0:  # NVML_SUCCESS
                out.append(Reading(metric, float(m.value) / 100.0, i))  # NVML gives percent
            else:
                add_note(self.notes, f"NVML gpu{i}: {metric} not measured (GPM return {int(m.nvmlReturn)})")
        return out

    def read(self) -> list[Reading]:
        nv = self._nvml
        out: list[Reading] = []
        for i, h in self._handles.items():
            mem = self._try(i, "memory", nv.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                out += [
                    Reading("memory.used_bytes", float(mem.used), i),
                    Reading("memory.total_bytes", float(mem.total), i),
                ]
            util = self._try(i, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                out += [
                    Reading("gpu.util_frac", util.gpu / 100.0, i),
                    Reading("gpu.mem_util_frac", util.memory / 100.0, i),
                ]
            sm = self._try(i, "sm clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
            if sm is not None:
                out.append(Reading("gpu.sm_clock_mhz", float(sm), i))
            mc = self._try(i, "memory clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            if mc is not None:
                out.append(Reading("gpu.mem_clock_mhz", float(mc), i))
            mw = self._try(i, "power", nv.nvmlDeviceGetPowerUsage, h)
            if mw is not None:
                out.append(Reading("gpu.power_w", float(mw) / 1000.0, i))  # NVML gives milliwatts
            if i in self._gpm:
                got = self._try(i, "GPM", self._read_gpm, i, h)
                out += got or []
        return out
