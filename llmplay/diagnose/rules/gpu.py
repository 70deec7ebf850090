"""§6 GPU-utilization rules: busy and slow (queueing), idle and slow (batch too small), idle and fast (bandwidth-bound).

"Latency high" is judged against the playbook's latency gates, or without one by the TTFT tail; "tokens/s low" against
a throughput gate, or without one by how much of the decode roofline the run used.
"""

from __future__ import annotations

from llmplay.diagnose.rule import LATENCY_PREFIXES, Outcome, Rule, RunFacts, ms, pct
from llmplay.diagnose.steps import S_BATCH, S_CONT_BATCH, S_KV_QUANT, S_PREFIX, S_SCALE, S_WEIGHT_QUANT, steps


def latency_high(f: RunFacts) -> tuple[bool | None, str]:
    """Whether latency is high, and why: a latency gate missed, or a TTFT tail that signals queueing."""
    over: list[str] = []
    under: list[str] = []
    for metric, limit in f.targets.items():
        value = f.summary.get(metric) if metric.startswith(LATENCY_PREFIXES) else None
        if value is None:
            continue
        (over if value > limit else under).append(f"{metric} {ms(value)} {'>' if value > limit else '≤'} {ms(limit)}")
    if over:
        return True, ", ".join(over)
    if under:
        return False, ", ".join(under)
    p50, p95 = f.summary.get("ttft.p50"), f.summary.get("ttft.p95")
    if p50 and p95 is not None:
        ratio, limit = p95 / p50, f.thresholds.ttft_tail_ratio
        return ratio >= limit, (
            f"no latency gate; TTFT P95/P50 = {ms(p95)}/{ms(p50)} = {ratio:.1f}× ({'≥' if ratio >= limit else '<'} "
            f"{limit:g}×)"
        )
    return None, "latency not measured"


def throughput_ok(f: RunFacts) -> tuple[bool | None, str]:
    """Whether tokens/s are fine, and why: a throughput gate met, or decode at half its bandwidth roofline or more."""
    for metric, floor in f.targets.items():
        value = f.summary.get(metric) if metric.startswith("throughput.") else None
        if value is not None:
            return value >= floor, f"{metric} {value:.4g} {'≥' if value >= floor else '<'} target {floor:.4g}"
    used = f.roofline.bandwidth_util if f.roofline is not None else None
    if used is not None:
        enough = f.thresholds.throughput_ok_bandwidth_util
        return used >= enough, (
            f"no throughput gate; decode uses {pct(used)} of the bandwidth roofline "
            f"({'≥' if used >= enough else '<'} {pct(enough)})"
        )
    return None, "no throughput gate and no roofline"


def _util_text(f: RunFacts) -> str:
    measured = f.gpu_utilization()
    assert measured is not None  # every utilization rule's condition
    return f"{measured[1]} {pct(measured[0])}"


def _util_high(f: RunFacts) -> bool:
    measured = f.gpu_utilization()
    return measured is not None and measured[0] >= f.thresholds.util_high


def _util_low(f: RunFacts) -> bool:
    measured = f.gpu_utilization()
    return measured is not None and measured[0] < f.thresholds.util_low


def _not_evaluated(f: RunFacts) -> Outcome:
    why = next((n for n in f.notes if n.startswith("no NVML")), "no GPU utilization measured")
    return Outcome("info", "GPU rules not evaluated", f"{why}; the §6 GPU-utilization rules need a GPU")


NOT_EVALUATED = Rule(
    "gpu.not_evaluated",
    "§6",
    "no GPU utilization measured (a CPU engine, or no NVML): the GPU-utilization rules cannot apply",
    lambda f: f.gpu_utilization() is None,
    _not_evaluated,
)

BUSY_AND_SLOW = Rule(
    "gpu.busy_and_slow",
    "§6",
    "GPU utilization high (80% or more) and latency high: queueing at the concurrency limit",
    lambda f: _util_high(f) and latency_high(f)[0] is True,
    lambda f: Outcome(
        "warn",
        "GPU busy and latency high: queueing at the concurrency limit",
        f"{_util_text(f)} ≥ {pct(f.thresholds.util_high)}; {latency_high(f)[1]}",
        steps(S_PREFIX, S_WEIGHT_QUANT, S_SCALE),
    ),
)

BATCH_TOO_SMALL = Rule(
    "gpu.batch_too_small",
    "§6",
    "GPU utilization low (below 50%) and tokens/s low: batch too small",
    lambda f: _util_low(f) and throughput_ok(f)[0] is False,
    lambda f: Outcome(
        "warn",
        "GPU idle and tokens/s low: batch too small",
        f"{_util_text(f)} < {pct(f.thresholds.util_low)}; {throughput_ok(f)[1]}",
        steps(S_CONT_BATCH, S_BATCH),
    ),
)

BANDWIDTH_BOUND = Rule(
    "gpu.bandwidth_bound",
    "§6",
    "GPU utilization low (below 50%) and tokens/s fine: bandwidth-bound already",
    lambda f: _util_low(f) and throughput_ok(f)[0] is True,
    lambda f: Outcome(
        "info",
        "GPU compute idle but tokens/s fine: bandwidth-bound already",
        f"{_util_text(f)} < {pct(f.thresholds.util_low)}; {throughput_ok(f)[1]}",
        steps(S_WEIGHT_QUANT, S_KV_QUANT),
    ),
)

LOW_UTIL_UNDECIDED = Rule(
    "gpu.low_util_undecided",
    "§6",
    "GPU utilization low (below 50%) with tokens/s not judged (no throughput gate, no roofline)",
    lambda f: _util_low(f) and throughput_ok(f)[0] is None,
    lambda f: Outcome(
        "info",
        "GPU utilization low; tokens/s not judged",
        f"{_util_text(f)} < {pct(f.thresholds.util_low)}; {throughput_ok(f)[1]}: set a throughput gate to decide "
        "batch-too-small vs bandwidth-bound",
    ),
)

RULES = (NOT_EVALUATED, BUSY_AND_SLOW, BATCH_TOO_SMALL, BANDWIDTH_BOUND, LOW_UTIL_UNDECIDED)
