"""Bounds that show a latency goal unreachable before the tuner spends its budget: what one request alone takes on
this engine (no batching, queueing or cache knob makes a request faster than that), and on a GPU the decode
roofline's floor per token (weight bytes over memory bandwidth)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmplay.archive.model import RooflineFacts
from llmplay.spec import Gate

# Latency figures a request alone bounds from below: under load each of them can only grow.
LATENCY_FAMILIES = ("ttft", "tpot", "itl", "e2el")
# The alone figure compared: the median, so the bound holds for any gate on a percentile at or above it.
ALONE_QUANTILE = "p50"


@dataclass(frozen=True)
class Infeasible:
    """A gate no setting of the tuned knobs can meet, and the bound that shows it."""

    gate: str
    bound: str  # "one request alone" | "decode roofline"
    message: str


def _percentile(metric: str) -> int | None:
    """50 for `ttft.p50`, 95 for `tpot.p95`; None for a mean or a non-percentile figure."""
    tail = metric.rsplit(".", 1)[-1]
    return int(tail[1:]) if tail.startswith("p") and tail[1:].isdigit() else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def unloaded_bound(gates: Sequence[Gate], alone: Mapping[str, float], requests: int) -> Infeasible | None:
    """The first latency gate (`ttft.p95 < 0.05`) whose limit is below what one request alone takes, at the median of
    `requests` requests sent one at a time: under any load the gate's percentile (at or above the median) is worse."""
    for gate in gates:
        family, _, _ = gate.metric.partition(".")
        pct = _percentile(gate.metric)
        if family not in LATENCY_FAMILIES or gate.op not in ("<", "<=") or pct is None or pct < 50:
            continue
        took = alone.get(f"{family}.{ALONE_QUANTILE}")
        if took is None or took <= gate.value:
            continue
        return Infeasible(
            gate.text,
            "one request alone",
            f"{gate.text}: the limit {_ms(gate.value)} is below the {_ms(took)} one request alone takes on this engine "
            f"(median of {requests} requests sent one at a time): no setting of the load's batching, cache or "
            "concurrency knobs reaches it",
        )
    return None


def roofline_bound(gates: Sequence[Gate], roofline: RooflineFacts | None) -> Infeasible | None:
    """A TPOT or ITL limit below the decode floor per token (weight bytes over memory bandwidth, CHECKLIST §5)."""
    if roofline is None:
        return None
    for gate in gates:
        family = gate.metric.partition(".")[0]
        if family in ("tpot", "itl") and gate.op in ("<", "<=") and gate.value < roofline.floor_s:
            return Infeasible(
                gate.text,
                "decode roofline",
                f"{gate.text}: the limit {_ms(gate.value)} is below the decode floor of {roofline.floor_s * 1000:.1f} ms "
                f"per token (the bytes read per step over the memory bandwidth, {roofline.bandwidth_source or 'table'}): "
                "only fewer bytes per step (quantization) or faster memory reach it",
            )
    return None
