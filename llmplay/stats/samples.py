"""One trial reduced to what the statistics need (TrialSample), and a configuration's figures over its pooled trials.

The experimental unit of every comparison is the trial: metric_value over one sample is that trial's value, the one
an interval rests on; over several it is the pooled figure (every request of every trial) the record shows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from llmplay.catalog import METRICS, SAMPLE_COUNT_KEYS
from llmplay.metrics import completed, good_mask, measured_requests, per_request_arrays, usd_per_1m_tokens

if TYPE_CHECKING:
    from llmplay.metrics import Records

PER_REQUEST = ("ttft", "tpot", "itl", "e2el", "ttft_nonstream", "ttft_content", "queue_wait")

_THROUGHPUT = {
    "throughput.output_tok_s": "output_tokens",
    "throughput.total_tok_s": "total_tokens",
    "goodput.req_s": "good",
}


@dataclass(frozen=True)
class TrialSample:
    """One successful trial reduced to what the statistics need."""

    duration_s: float
    values: Mapping[
        str, np.ndarray
    ]  # per request: ttft, tpot, e2el, ... (s); output_tokens, total_tokens; good (0/1); itl pooled
    n_requests: int
    n_errors: int
    scalars: Mapping[str, float] = field(default_factory=dict)  # the trial's summary (telemetry, cost inputs)
    price_usd_per_hour: float = 0.0
    repeat: int | None = None  # which A/B pair it belongs to (its TrialRecord.repeat); None: not paired


def sample_from_records(
    records: Records,
    duration_s: float,
    summary: Mapping[str, float],
    slo_s: Mapping[str, float],
    price_usd_per_hour: float,
    repeat: int | None = None,
) -> TrialSample:
    """A trial's sample from its request records (a load run's, or an archive's frame), counted by the rules the
    summary uses (metrics.measured_requests, metrics.completed), so a verdict and the record rest on the same requests."""
    sent = measured_requests(records)
    done = [r for r in sent if completed(r)]
    arrays = {k: np.asarray(v, dtype=float) for k, v in per_request_arrays(sent).items()}
    out_tokens = np.asarray([r.output_tokens for r in done], dtype=float)
    in_tokens = np.asarray([r.input_tokens for r in done], dtype=float)
    arrays["output_tokens"] = out_tokens
    arrays["total_tokens"] = out_tokens + in_tokens
    arrays["good"] = good_mask(done, slo_s)  # the same rule as the summary's goodput
    return TrialSample(
        duration_s=duration_s,
        values=arrays,
        n_requests=len(sent),
        n_errors=sum(not r.ok for r in sent),
        scalars=dict(summary),
        price_usd_per_hour=price_usd_per_hour,
        repeat=repeat,
    )


def _stat(values: np.ndarray, stat: str) -> float | None:
    if values.size == 0:
        return None
    if stat == "mean":
        return float(np.mean(values))
    if stat == "std":
        return float(np.std(values))
    return float(np.percentile(values, float(stat[1:]), method="linear"))


def metric_value(samples: Sequence[TrialSample], metric: str) -> float | None:
    """The metric over the pooled trials (one trial: that trial's value, the unit the intervals rest on)."""
    head, _, stat = metric.partition(".")
    if head in PER_REQUEST:
        pooled = np.concatenate([s.values.get(head, np.array([])) for s in samples]) if samples else np.array([])
        return _stat(pooled, stat)
    duration = sum(s.duration_s for s in samples)
    if duration <= 0:
        return None
    if metric in _THROUGHPUT:
        return float(sum(float(s.values.get(_THROUGHPUT[metric], np.array([])).sum()) for s in samples)) / duration
    if metric == "throughput.req_s":
        return float(sum(s.values.get("output_tokens", np.array([])).size for s in samples)) / duration
    if metric == "errors.rate":
        total = sum(s.n_requests for s in samples)
        return float(sum(s.n_errors for s in samples) / total) if total else None
    if metric == "cost.usd_per_1m_tokens":
        price = float(np.mean([s.price_usd_per_hour for s in samples]))
        cost = usd_per_1m_tokens(price, metric_value(samples, "throughput.output_tok_s"))
        return None if cost is None else float(cost)
    observed = [s.scalars[metric] for s in samples if metric in s.scalars]
    return float(np.mean(observed)) if observed else None


def per_trial(samples: Sequence[TrialSample], metric: str) -> list[float] | None:
    """One value per trial; None when some trial lacks it (an interval over the rest would hide why)."""
    values = [metric_value([s], metric) for s in samples]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values if v is not None]


def summed_counts(per_trial_counts: Sequence[Mapping[str, float]]) -> dict[str, int]:
    """How many requests pooled figures rest on (catalog.SAMPLE_COUNT_KEYS): each count summed over the trials.
    A count some trial does not carry (an archive from before counts were kept) is left out, never guessed.
    The one rule for pooled counts: a run's samples (pooled_counts) and an archive's trial summaries alike."""
    if not per_trial_counts:
        return {}
    return {
        key: int(sum(counts[key] for counts in per_trial_counts))
        for key in SAMPLE_COUNT_KEYS
        if all(key in counts for counts in per_trial_counts)
    }


# Families whose per-request arrays hold one value per request, so the pooled array's size is the count its
# percentiles rest on; ITL pools chunk gaps, so its request count comes from the trials' summaries.
_COUNTED_BY_ARRAY = frozenset({"ttft", "tpot", "e2el", "ttft_nonstream", "ttft_content", "ttfo"})


def pooled_counts(samples: Sequence[TrialSample]) -> dict[str, int]:
    """How many requests the pooled figures rest on: per family and streamed / not, summed over the trials
    (summed_counts), a family's count read from its per-request array where every trial has one."""
    arrays = [f for f in _COUNTED_BY_ARRAY if samples and all(f in s.values for s in samples)]
    per_trial_counts = [
        {
            **{k: s.scalars[k] for k in SAMPLE_COUNT_KEYS if k in s.scalars},
            **{f"{f}.n": s.values[f].size for f in arrays},
        }
        for s in samples
    ]
    return summed_counts(per_trial_counts)


def pooled_summary(samples: Sequence[TrialSample]) -> dict[str, float]:
    """Every known metric over the pooled trials: the tuning-record row of a configuration, with the request
    counts (pooled_counts) its percentiles rest on."""
    out: dict[str, float] = dict(pooled_counts(samples))
    for metric in METRICS:
        value = metric_value(samples, metric)
        if value is not None:
            out[metric] = value
    for key in ("memory.peak_bytes", "memory.capacity_bytes", "proc.rss_peak_bytes", "engine.preemptions"):
        vals = [s.scalars[key] for s in samples if key in s.scalars]
        if vals:
            out[key] = float(max(vals)) if key != "engine.preemptions" else float(sum(vals))
    return out
