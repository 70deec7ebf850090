"""§4 memory rules: where the peak went, memory-bound first, KV share, failures at full memory, preemptions."""

from __future__ import annotations

from llmplay.diagnose.memory import format_gib
from llmplay.diagnose.rule import Outcome, Rule, RunFacts, pct
from llmplay.diagnose.steps import (
    S_GPU_MEM,
    S_KV_QUANT,
    S_LOWER_CONC,
    S_MAX_TOKENS,
    S_SCALE,
    S_SEQ,
    S_WEIGHT_QUANT,
    steps,
)

# An engine that preallocates its KV pool peaks at its reserve; this much above it is still "by design".
_PREALLOCATION_SLACK = 0.02

NOT_EVALUATED = Rule(
    "memory.not_evaluated",
    "§4",
    "no memory breakdown: model facts (config.json or GGUF) or a memory measurement missing",
    lambda f: f.breakdown is None,
    lambda f: Outcome(
        "info", "Memory breakdown not evaluated", "no model facts (config.json or GGUF) or no memory measurement"
    ),
)


def _breakdown(f: RunFacts) -> Outcome:
    b = f.breakdown
    assert b is not None  # the condition
    where = "GPU memory" if b.device == "gpu" else "host memory (RSS)"
    parts = [
        f"weights {format_gib(b.weights_bytes)}",
        f"KV {format_gib(b.kv_bytes)} ({b.kv_bytes_per_token / 1024:.1f} KiB/token × {b.tokens_in_flight:.0f} tokens)",
    ]
    if b.other_bytes is not None:
        parts.append(f"activations/runtime {format_gib(b.other_bytes)}")
    if b.peak_bytes is not None:
        parts.append(f"peak {format_gib(b.peak_bytes)}")
    if b.capacity_bytes:
        parts.append(f"capacity {format_gib(b.capacity_bytes)}")
    return Outcome("info", f"Memory breakdown ({where})", "; ".join(parts + list(b.notes)))


BREAKDOWN = Rule(
    "memory.breakdown",
    "§4",
    "where the peak went: weights, KV cache, activations and runtime",
    lambda f: f.breakdown is not None,
    _breakdown,
)


def _peak_high(f: RunFacts) -> Outcome:
    b, th = f.breakdown, f.thresholds
    assert b is not None and b.peak_frac is not None  # the condition
    evidence = (
        f"peak {format_gib(b.peak_bytes or 0)} of {format_gib(b.capacity_bytes or 0)} = {pct(b.peak_frac)} "
        f"> {pct(th.peak_frac)}"
    )
    reserved = f.scheduler.kv_preallocated_frac
    if reserved is not None and b.peak_frac <= reserved + _PREALLOCATION_SLACK:
        return Outcome(
            "info",
            "Memory full by design (engine preallocates the KV cache)",
            evidence
            + f"; the engine reserves {pct(reserved)} up front, so watch KV-cache usage and preemptions instead",
        )
    return Outcome(
        "critical", "Memory-bound: fix memory first", evidence, steps(S_WEIGHT_QUANT, S_KV_QUANT, S_SEQ, S_SCALE)
    )


PEAK_HIGH = Rule(
    "memory.peak_high",
    "§4",
    "peak memory above 90% of capacity: memory-bound, fix memory first (by design where the engine preallocates)",
    RunFacts.peak_over_threshold,
    _peak_high,
)


def _kv_share_high(f: RunFacts) -> bool:
    b = f.breakdown
    return b is not None and b.kv_share is not None and b.kv_share > f.thresholds.kv_share


def _kv_share_finding(f: RunFacts) -> Outcome:
    b = f.breakdown
    assert b is not None and b.kv_share is not None  # the condition
    return Outcome(
        "warn",
        "KV cache dominates memory: concurrency / context length limited",
        f"KV {format_gib(b.kv_bytes)} of peak {format_gib(b.peak_bytes or 0)} = {pct(b.kv_share)} "
        f"> {pct(f.thresholds.kv_share)}",
        steps(S_MAX_TOKENS, S_KV_QUANT, S_SEQ),
    )


KV_SHARE_HIGH = Rule(
    "memory.kv_share_high",
    "§4",
    "KV cache above 60% of the peak: concurrency / context length limited",
    _kv_share_high,
    _kv_share_finding,
)


def _errors_at_full(f: RunFacts) -> Outcome:
    b = f.breakdown
    assert b is not None and b.peak_frac is not None  # the condition
    return Outcome(
        "critical",
        "Requests failed while memory was full (possible OOM)",
        f"error rate {pct(f.summary['errors.rate'])} with peak memory at {pct(b.peak_frac)}",
        steps(S_LOWER_CONC, S_KV_QUANT, S_WEIGHT_QUANT),
    )


ERRORS_AT_FULL_MEMORY = Rule(
    "memory.errors_at_full_memory",
    "§4",
    "failed requests while peak memory is above 90% of capacity: possible OOM",
    lambda f: bool(f.summary.get("errors.rate")) and f.peak_over_threshold(),
    _errors_at_full,
)


def _preemptions(f: RunFacts) -> Outcome:
    evidence = f"{f.telemetry['engine.preemptions']:.0f} preemptions (swap/recompute) in the window"
    usage = f.telemetry.get("engine.kv_cache_usage_max")
    if usage is not None:
        evidence += f"; peak KV-cache usage {pct(usage)}"
    return Outcome(
        "critical",
        "Preemptions: the KV cache ran out (latency disaster, fix now)",
        evidence,
        # More memory for the KV cache first: memory left unreserved costs the load nothing, a cap its concurrency.
        steps(S_GPU_MEM, S_LOWER_CONC, S_KV_QUANT, S_MAX_TOKENS),
    )


PREEMPTIONS = Rule(
    "memory.preemptions",
    "§4",
    "any preemption (swap or recompute): the KV cache ran out, fix now",
    lambda f: f.telemetry.get("engine.preemptions", 0.0) > 0,
    _preemptions,
)

RULES = (NOT_EVALUATED, BREAKDOWN, PEAK_HIGH, KV_SHARE_HIGH, ERRORS_AT_FULL_MEMORY, PREEMPTIONS)
