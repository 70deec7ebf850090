"""The metric paths playbooks may name: their unit, which direction is better, and how to show them."""
from __future__ import annotations

from dataclasses import dataclass

from llmplay import units


@dataclass(frozen=True)
class MetricInfo:
    path: str
    unit: str  # "s" | "tok/s" | "req/s" | "usd" | "fraction" | "bytes" | "count"
    lower_is_better: bool
    label: str

    def parse_value(self, raw: object) -> float:
        if self.unit == "s":
            return units.parse_duration_s(raw, unit_required=True)
        if self.unit == "usd":
            return units.parse_money_usd(raw)
        if self.unit == "fraction":
            return units.parse_fraction(raw)
        return units.parse_plain_number(raw)

    def format(self, value: float | None) -> str:
        if value is None:
            return "not measured"
        if self.unit == "s":
            return f"{value * 1000:.1f} ms"
        if self.unit == "usd":
            return f"${value:.4g}"
        if self.unit == "fraction":
            return f"{value * 100:.1f}%"
        if self.unit == "bytes":
            return f"{value / 2**30:.2f} GiB"
        return f"{value:.4g} {self.unit}" if self.unit != "count" else f"{value:.4g}"


_LATENCY_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency",
                   "ttft_nonstream": "TTFT (non-streamed)", "queue_wait": "client queue wait"}
_STATS = ("mean", "std", "p50", "p90", "p95", "p99")

METRICS: dict[str, MetricInfo] = {}
for _name, _label in _LATENCY_LABELS.items():
    for _stat in _STATS:
        _path = f"{_name}.{_stat}"
        METRICS[_path] = MetricInfo(_path, "s", True, f"{_stat.upper()} {_label}")
for _info in (
    MetricInfo("throughput.output_tok_s", "tok/s", False, "output tokens/s"),
    MetricInfo("throughput.total_tok_s", "tok/s", False, "total tokens/s"),
    MetricInfo("throughput.req_s", "req/s", False, "requests/s"),
    MetricInfo("goodput.req_s", "req/s", False, "goodput"),
    MetricInfo("cost.usd_per_1m_tokens", "usd", True, "$ per 1M tokens"),
    MetricInfo("memory.peak_frac", "fraction", True, "peak memory / capacity"),
    MetricInfo("memory.peak_bytes", "bytes", True, "peak memory"),
    MetricInfo("memory.kv_share", "fraction", True, "KV-cache share of memory"),
    MetricInfo("errors.rate", "fraction", True, "error rate"),
    MetricInfo("engine.preemptions", "count", True, "preemptions"),
    MetricInfo("engine.kv_cache_usage_max", "fraction", True, "peak KV-cache usage"),
    MetricInfo("engine.waiting_mean", "count", True, "mean waiting requests"),
):
    METRICS[_info.path] = _info


def metric_info(path: str) -> MetricInfo | None:
    return METRICS.get(path)
