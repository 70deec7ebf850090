"""Telemetry sampled during a trial: GPU (NVML), engine /metrics, and the engine process, as one series."""

from llmplay.telemetry.sampler import Reading, Sample, Source, TelemetrySampler, TelemetrySeries, summarize

__all__ = ["Reading", "Sample", "Source", "TelemetrySampler", "TelemetrySeries", "summarize"]
