"""Engine scheduler telemetry scraped from its Prometheus /metrics endpoint, named by the engine adapter."""

from __future__ import annotations

from dataclasses import fields

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmplay.engines.base import MetricNames
from llmplay.telemetry.sampler import Reading, add_note

# adapter field -> canonical series metric (counters carry `_total`, fractions `_frac`)
CANONICAL: dict[str, str] = {
    "kv_cache_usage": "engine.kv_cache_usage_frac",
    "running": "engine.running",
    "waiting": "engine.waiting",
    "preemptions": "engine.preemptions_total",
    "prefix_cache_hits": "engine.prefix_cache_hits_total",
    "prefix_cache_queries": "engine.prefix_cache_queries_total",
    "prompt_tokens": "engine.prompt_tokens_total",
    "generation_tokens": "engine.generation_tokens_total",
}
# a usage fraction over several label sets (e.g. data-parallel ranks) is the fullest one; counts add up
_MAX_OVER_LABELS = {"kv_cache_usage"}


def _candidates(name: str) -> set[str]:
    """The sample names a metric may appear under: prometheus_client writes counters as `<name>_total`
    while some adapters name them with, some without, the suffix."""
    base = name[: -len("_total")] if name.endswith("_total") else name
    return {name, base, base + "_total"}


def parse_metrics(text: str, names: MetricNames) -> tuple[list[Reading], list[str]]:
    """Pick the adapter's metrics out of Prometheus exposition text.

    Returns the readings and the adapter fields whose metric the text did not contain.
    Pure, so tests can pin edge cases with literal text.
    """
    wanted: dict[str, str] = {}  # sample name -> adapter field
    for f in fields(MetricNames):
        metric = getattr(names, f.name)
        if metric:
            for cand in _candidates(metric):
                wanted.setdefault(cand, f.name)
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue  # creation timestamps of counters, not values
            field = wanted.get(s.name)
            if field is not None:
                values.setdefault(field, []).append(float(s.value))
    readings = []
    for field, vs in values.items():
        v = max(vs) if field in _MAX_OVER_LABELS else sum(vs)
        readings.append(Reading(CANONICAL[field], v))
    missing = [f.name for f in fields(MetricNames) if getattr(names, f.name) and f.name not in values]
    return readings, missing


class PrometheusSource:
    """GET <url>/metrics each tick. A failed scrape is noted once and retried next tick; a metric the
    engine does not expose is noted once and simply absent from the summary."""

    name = "engine"

    def __init__(self, url: str, names: MetricNames, client: httpx.Client | None = None, timeout_s: float = 2.0):
        self.url = url.rstrip("/") + "/metrics"
        self.names = names
        self.notes: list[str] = []
        self.info: dict[str, str] = {"engine.metrics_url": self.url}
        self._client = client
        self._own_client = client is None
        self._timeout_s = timeout_s

    def start(self) -> bool:
        if not any(getattr(self.names, f.name) for f in fields(MetricNames)):
            add_note(self.notes, "engine metrics not measured: the adapter names no /metrics metrics")
            return False
        if self._client is None:
            self._client = httpx.Client(timeout=self._timeout_s)
        return True

    def read(self) -> list[Reading]:
        assert self._client is not None
        try:
            r = self._client.get(self.url)
        except httpx.HTTPError as e:
            add_note(self.notes, f"engine /metrics unreachable at {self.url}: {type(e).__name__}: {e}")
            return []
        if r.status_code != 200:
            # llama.cpp answers 501 unless started with --metrics
            add_note(self.notes, f"engine /metrics at {self.url} answered HTTP {r.status_code}: {r.text[:120].strip()}")
            return []
        readings, missing = parse_metrics(r.text, self.names)
        for f in missing:
            add_note(self.notes, f"engine /metrics has no {getattr(self.names, f)} ({f} not measured)")
        return readings

    def close(self) -> None:
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None
