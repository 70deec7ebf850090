"""A stand-in for the pynvml module (same function and constant names) for machines without a GPU.

Tests only: the real pynvml path runs on a GPU machine via benchmarks/gpu_check.py. Each call of
`nvmlDeviceGetMemoryInfo` etc. advances nothing by itself; values come from per-GPU lists indexed by
how many times that query was made, so a test can script a time series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRICS_GET_VERSION = 1


class NVMLError(Exception):
    _text: ClassVar[dict[int, str]] = {
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    }

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._text.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    total_bytes: int = 80 * 2**30
    used_bytes: list[int] = field(default_factory=lambda: [10 * 2**30])
    util_pct: list[int] = field(default_factory=lambda: [50])
    mem_util_pct: list[int] = field(default_factory=lambda: [30])
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    power_mw: list[int] = field(default_factory=lambda: [300_000])
    gpm: bool = True
    sm_activity_pct: list[float] = field(default_factory=lambda: [40.0])
    dram_bw_pct: list[float] = field(default_factory=lambda: [60.0])
    unsupported: set[str] = field(default_factory=set)  # e.g. {"power"}


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class GpmMetricsRequest:
    """pynvml's c_nvmlGpmMetricsGet_t: two samples in, one value per requested metric out."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(8)]


class FakeNvml:
    """Pass an instance as `NvmlSource(nvml=FakeNvml([...]))`."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_GPM_METRIC_SM_UTIL = NVML_GPM_METRIC_SM_UTIL
    NVML_GPM_METRIC_DRAM_BW_UTIL = NVML_GPM_METRIC_DRAM_BW_UTIL
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = GpmMetricsRequest  # the name pynvml gives the struct

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: int | None = None):
        self.gpus = [FakeGpu()] if gpus is None else gpus
        self.init_error = init_error
        self.initialized = False
        self.shutdowns = 0
        self.calls: dict[tuple[int, str], int] = {}
        self.samples_alive = 0

    def _next(self, i: int, what: str, seq: list[Any]) -> Any:
        if what in self.gpus[i].unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        n = self.calls.get((i, what), 0)
        self.calls[(i, what)] = n + 1
        return seq[min(n, len(seq) - 1)]

    def _check(self) -> None:
        if not self.initialized:
            raise NVMLError(1)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized = False
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._check()
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        self._check()
        for i in range(len(self.gpus)):
            if uuid == f"GPU-fake-{i}":
                return i
        raise NVMLError(6)  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h].name.encode()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self.gpus[h]
        used = self._next(h, "memory", g.used_bytes)
        return SimpleNamespace(total=g.total_bytes, used=used, free=g.total_bytes - used)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        g = self.gpus[h]
        return SimpleNamespace(
            gpu=self._next(h, "utilization", g.util_pct), memory=self._next(h, "mem_util", g.mem_util_pct)
        )

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        g = self.gpus[h]
        return g.sm_clock_mhz if kind == NVML_CLOCK_SM else g.mem_clock_mhz

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._next(h, "power", self.gpus[h].power_mw)

    def nvmlGpmQueryDeviceSupport(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=int(self.gpus[h].gpm))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        self.samples_alive += 1
        return SimpleNamespace(gpu=None, tick=None)

    def nvmlGpmSampleFree(self, s: SimpleNamespace) -> None:
        self.samples_alive -= 1

    def nvmlGpmSampleGet(self, h: int, s: SimpleNamespace) -> SimpleNamespace:
        n = self.calls.get((h, "gpm_sample"), 0)
        self.calls[(h, "gpm_sample")] = n + 1
        s.gpu, s.tick = h, n
        return s

    def nvmlGpmMetricsGet(self, mg: GpmMetricsRequest) -> GpmMetricsRequest:
        g = self.gpus[mg.sample2.gpu]
        k = mg.sample2.tick - 1  # the interval ending at sample2
        for m in mg.metrics[: mg.numMetrics]:
            if m.metricId == NVML_GPM_METRIC_SM_UTIL:
                m.value = g.sm_activity_pct[min(k, len(g.sm_activity_pct) - 1)]
            elif m.metricId == NVML_GPM_METRIC_DRAM_BW_UTIL:
                m.value = g.dram_bw_pct[min(k, len(g.dram_bw_pct) - 1)]
            else:
                m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return mg
