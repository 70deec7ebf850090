"""Where a configuration's peak memory went (CHECKLIST §4): weights, KV cache, the rest."""

from __future__ import annotations

from dataclasses import dataclass

from llmplay.diagnose.model_facts import ModelFacts

GiB = 2**30

# bytes per KV element by dtype name as engines spell them (llama.cpp block formats include their scales)
KV_DTYPE_BYTES = {
    "auto": 2.0,
    "f16": 2.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "float16": 2.0,
    "f32": 4.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "iq4_nl": 18 / 32,
}


def format_gib(b: float) -> str:
    return f"{b / GiB:.2f} GiB"


@dataclass(frozen=True)
class MemoryBreakdown:
    """Where the peak went (CHECKLIST §4). Peak and capacity are GPU memory for GPU runs and host
    RSS / RAM for CPU runs (`device`)."""

    weights_bytes: float
    kv_bytes_per_token: float
    tokens_in_flight: float
    kv_bytes: float
    other_bytes: float | None  # activations + runtime overhead; None without a measured peak
    peak_bytes: float | None
    capacity_bytes: float | None
    kv_share: float | None  # kv_bytes / peak_bytes
    peak_frac: float | None  # peak_bytes / capacity_bytes
    device: str = "gpu"
    notes: tuple[str, ...] = ()


def memory_breakdown(
    facts: ModelFacts,
    kv_dtype_bytes: float,
    tokens_in_flight: float,
    peak_bytes: float | None,
    capacity_bytes: float | None,
    *,
    device: str = "gpu",
) -> MemoryBreakdown:
    weights = float(facts.weight_bytes)
    per_tok = facts.kv_bytes_per_token(kv_dtype_bytes)
    kv = per_tok * tokens_in_flight
    notes: list[str] = []
    other = kv_share = peak_frac = None
    if peak_bytes is not None and peak_bytes > 0:
        rest = peak_bytes - weights - kv
        if rest < 0:
            # e.g. llama.cpp maps weights lazily so RSS holds only the pages touched
            notes.append(
                f"weights + KV ({format_gib(weights + kv)}) exceed the measured peak ({format_gib(peak_bytes)})"
            )
        other = max(rest, 0.0)
        kv_share = kv / peak_bytes
    if peak_bytes is not None and capacity_bytes:
        peak_frac = peak_bytes / capacity_bytes
    return MemoryBreakdown(
        weights,
        per_tok,
        float(tokens_in_flight),
        kv,
        other,
        peak_bytes,
        capacity_bytes,
        kv_share,
        peak_frac,
        device,
        tuple(notes),
    )
