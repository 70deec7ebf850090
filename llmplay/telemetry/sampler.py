"""Background-thread sampling of telemetry sources into one immutable time series with a flat summary."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pandas is imported only when a frame is asked for
    import pandas as pd


@dataclass(frozen=True)
class Reading:
    """One value a source read now; the sampler stamps the time."""

    metric: str  # canonical name, e.g. "memory.used_bytes", "engine.waiting"
    value: float
    gpu: int | None = None  # GPU index for per-GPU metrics


@dataclass(frozen=True)
class Sample:
    t_s: float  # seconds since the sampler started (time.perf_counter_ns clock)
    source: str
    metric: str
    value: float
    gpu: int | None = None


class Source(Protocol):
    """What the sampler needs from a source. `start` may fail softly by adding a note
    and returning False; `read` returns current readings (raising is caught and noted)."""

    name: str
    notes: list[str]  # said once each, e.g. "no NVML: <reason>"
    info: dict[str, str]  # static facts for the archive (GPU names, driver, ...)

    def start(self) -> bool: ...

    def read(self) -> list[Reading]: ...

    def close(self) -> None: ...


def add_note(notes: list[str], note: str) -> None:
    """Append a note unless already said: a failing source must not repeat itself every tick."""
    if note not in notes:
        notes.append(note)


# Metric names the sources write (fractions are 0..1, never percent).
GAUGE_MEAN_KEYS: Mapping[str, str] = {
    "gpu.util_mean": "gpu.util_frac",
    "gpu.mem_bw_util_mean": "gpu.mem_util_frac",
    "gpu.sm_activity_mean": "gpu.sm_activity_frac",
    "gpu.dram_bw_util_mean": "gpu.dram_bw_util_frac",
    "gpu.sm_clock_mhz_mean": "gpu.sm_clock_mhz",
    "gpu.mem_clock_mhz_mean": "gpu.mem_clock_mhz",
    "engine.kv_cache_usage_mean": "engine.kv_cache_usage_frac",
    "engine.running_mean": "engine.running",
    "engine.waiting_mean": "engine.waiting",
}


@dataclass(frozen=True)
class TelemetrySeries:
    """Everything sampled during one window; `summary()` is what reports and diagnosis read."""

    samples: tuple[Sample, ...] = ()
    notes: tuple[str, ...] = ()
    info: Mapping[str, str] = field(default_factory=dict)
    duration_s: float = 0.0

    COLUMNS = ("t_s", "source", "metric", "gpu", "value")

    def to_frame(self) -> pd.DataFrame:
        """Long format: one row per sample, columns t_s, source, metric, gpu, value."""
        import pandas as pd  # deferred: pandas takes most of a second to import; only archiving asks for frames

        rows = [(s.t_s, s.source, s.metric, s.gpu, s.value) for s in self.samples]
        df = pd.DataFrame(rows, columns=list(self.COLUMNS))
        df["gpu"] = df["gpu"].astype("Int64")
        return df

    @classmethod
    def from_frame(
        cls,
        df: pd.DataFrame,
        notes: Sequence[str] = (),
        info: Mapping[str, str] | None = None,
        duration_s: float | None = None,
    ) -> TelemetrySeries:
        """Rebuild a series from an archived frame, so an old run can be re-summarised."""
        import pandas as pd  # deferred: as in to_frame

        samples = tuple(
            Sample(float(r.t_s), str(r.source), str(r.metric), float(r.value), None if pd.isna(r.gpu) else int(r.gpu))
            for r in df.itertuples(index=False)
        )
        dur = duration_s if duration_s is not None else max((s.t_s for s in samples), default=0.0)
        return cls(samples, tuple(notes), dict(info or {}), dur)

    def window(self, start_s: float | None = None, end_s: float | None = None) -> TelemetrySeries:
        """The samples in [start_s, end_s], e.g. the measured part of a trial without warm-up."""
        lo = 0.0 if start_s is None else start_s
        hi = self.duration_s if end_s is None else end_s
        kept = tuple(s for s in self.samples if lo <= s.t_s <= hi)
        return TelemetrySeries(kept, self.notes, self.info, max(hi - lo, 0.0))

    def summary(self, start_s: float | None = None, end_s: float | None = None) -> dict[str, float]:
        """Flat keys (see module docs); a metric that was not measured is absent, never 0."""
        series = self if start_s is None and end_s is None else self.window(start_s, end_s)
        return summarize(series.samples, series.duration_s)


def _by_metric(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.metric, []).append(s)
    return out


def _per_tick_total(rows: list[Sample]) -> list[float]:
    """Sum per-GPU values taken at the same tick (one tick = one t_s)."""
    ticks: dict[float, float] = {}
    for s in rows:
        ticks[s.t_s] = ticks.get(s.t_s, 0.0) + s.value
    return [ticks[t] for t in sorted(ticks)]


def counter_delta(values: Sequence[float]) -> float:
    """Increase of a counter over the window; a drop is a restart, after which counting resumes from 0."""
    total = 0.0
    for prev, cur in itertools.pairwise(values):
        total += cur - prev if cur >= prev else cur
    return total


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs))


def summarize(samples: Sequence[Sample], duration_s: float) -> dict[str, float]:
    m = _by_metric(samples)
    out: dict[str, float] = {}

    # GPU memory: bytes are summed over GPUs; the fraction is the fullest single GPU, because that one OOMs.
    if "memory.used_bytes" in m:
        used = m["memory.used_bytes"]
        out["memory.peak_bytes"] = max(_per_tick_total(used))
        totals = {s.gpu: s.value for s in m.get("memory.total_bytes", [])}
        if totals:
            out["memory.capacity_bytes"] = float(sum(totals.values()))
            fracs = [s.value / totals[s.gpu] for s in used if totals.get(s.gpu)]
            if fracs:
                out["memory.peak_frac"] = max(fracs)

    for key, metric in GAUGE_MEAN_KEYS.items():
        if metric in m:
            rows = m[metric]
            # engine gauges have no gpu label; GPU gauges are averaged over GPUs and time alike
            out[key] = _mean([s.value for s in rows])
    if "gpu.power_w" in m:
        out["gpu.power_w_mean"] = _mean(_per_tick_total(m["gpu.power_w"]))  # whole-node draw
    if "engine.kv_cache_usage_frac" in m:
        out["engine.kv_cache_usage_max"] = max(s.value for s in m["engine.kv_cache_usage_frac"])
    if "engine.running" in m:
        out["engine.running_max"] = max(s.value for s in m["engine.running"])
    if "engine.waiting" in m:
        waiting = [s.value for s in m["engine.waiting"]]
        out["engine.waiting_max"] = max(waiting)
        # share of ticks with a queue: "persistently > 0" in CHECKLIST §6
        out["engine.waiting_nonzero_frac"] = sum(1 for w in waiting if w > 0) / len(waiting)

    # counters need two readings to say anything about the window
    def delta(metric: str) -> float | None:
        rows = m.get(metric, [])
        return counter_delta([s.value for s in rows]) if len(rows) >= 2 else None

    pre = delta("engine.preemptions_total")
    if pre is not None:
        out["engine.preemptions"] = pre
    hits, queries = delta("engine.prefix_cache_hits_total"), delta("engine.prefix_cache_queries_total")
    if hits is not None:
        # Tokens served from the cache; with caching off vLLM looks nothing up, so no hit rate but a measured 0 here.
        out["engine.prefix_cache_hits"] = hits
    if hits is not None and queries:
        out["engine.prefix_cache_hit_rate"] = hits / queries
    for name in ("prompt_tokens", "generation_tokens"):
        d = delta(f"engine.{name}_total")
        if d is not None:
            out[f"engine.{name}"] = d

    cpu = delta("proc.cpu_s")
    if cpu is not None:
        out["proc.cpu_s"] = cpu
        if duration_s > 0:
            out["proc.cpu_cores_mean"] = cpu / duration_s
    if "proc.rss_bytes" in m:
        out["proc.rss_peak_bytes"] = max(s.value for s in m["proc.rss_bytes"])
    return out


class TelemetrySampler:
    """`with TelemetrySampler([NvmlSource(), PrometheusSource(url, names)]) as s: ...; s.result()`.

    Each source gets its own thread, so a slow one (Docker stats, an unresponsive /metrics)
    does not stretch the others' intervals. Each takes one reading at start and one at stop,
    so counter deltas cover the whole window.
    """

    def __init__(self, sources: Sequence[Source], interval_s: float = 0.5):
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.sources = list(sources)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._notes: list[str] = []
        self._threads: list[threading.Thread] = []
        self._t0_ns = 0
        self._t1_ns: int | None = None
        self._result: TelemetrySeries | None = None

    def _now_s(self) -> float:
        return (time.perf_counter_ns() - self._t0_ns) / 1e9

    def _note(self, note: str) -> None:
        with self._lock:
            add_note(self._notes, note)

    def _read_once(self, src: Source) -> None:
        t_s = self._now_s()
        try:
            readings = src.read()
        except Exception as e:  # a source failing must not end the trial; say so once
            self._note(f"{src.name}: read failed: {type(e).__name__}: {e}")
            return
        rows = [Sample(t_s, src.name, r.metric, float(r.value), r.gpu) for r in readings]
        with self._lock:
            self._samples.extend(rows)

    def _loop(self, src: Source) -> None:
        self._read_once(src)
        while not self._stop.wait(self.interval_s):
            self._read_once(src)
        self._read_once(src)  # the closing reading, for counter deltas

    def start(self) -> TelemetrySampler:
        self._t0_ns = time.perf_counter_ns()
        for src in self.sources:
            try:
                ok = src.start()
            except Exception as e:
                self._note(f"{src.name}: start failed: {type(e).__name__}: {e}")
                ok = False
            if ok:
                t = threading.Thread(target=self._loop, args=(src,), name=f"telemetry-{src.name}", daemon=True)
                self._threads.append(t)
                t.start()
        return self

    def stop(self) -> TelemetrySeries:
        if self._result is not None:
            return self._result
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self._t1_ns = time.perf_counter_ns()
        info: dict[str, str] = {}
        for src in self.sources:
            try:
                src.close()
            except Exception as e:
                self._note(f"{src.name}: close failed: {type(e).__name__}: {e}")
            # source notes first-said order, then the sampler's own
            for n in src.notes:
                add_note(self._notes, n)
            info.update(src.info)
        samples = tuple(sorted(self._samples, key=lambda s: (s.t_s, s.source, s.metric, s.gpu or 0)))
        self._result = TelemetrySeries(samples, tuple(self._notes), info, (self._t1_ns - self._t0_ns) / 1e9)
        return self._result

    def elapsed_s(self) -> float:
        """Seconds since start on the sampler's clock, to mark windows (e.g. end of warm-up)."""
        return self._now_s()

    def result(self) -> TelemetrySeries:
        if self._result is None:
            raise RuntimeError("TelemetrySampler.result() is available after the with-block ends")
        return self._result

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
