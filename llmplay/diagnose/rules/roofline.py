"""§5 roofline rules: decode against its bandwidth floor (headroom left, or at the floor), and prefill MFU."""

from __future__ import annotations

from llmplay.diagnose.memory import format_gib
from llmplay.diagnose.rule import Outcome, Rule, RunFacts, ms, pct
from llmplay.diagnose.steps import S_BATCH, S_KERNELS, S_KV_QUANT, S_WEIGHT_QUANT, steps


def _floor_evidence(f: RunFacts) -> str:
    r = f.roofline
    assert r is not None  # every roofline rule's condition
    source = f" ({r.bandwidth_source})" if r.bandwidth_source else ""
    return (
        f"{format_gib(r.bytes_per_step)} per step ÷ {r.bandwidth_bytes_s / 1e12:.3g} TB/s{source} = floor "
        f"{ms(r.floor_s)}/token"
    )


def _achieved_evidence(f: RunFacts) -> str:
    """The floor, the achieved TPOT against it, and the GPU's own utilization figures beside them (§5)."""
    r = f.roofline
    assert r is not None and r.achieved_over_floor is not None  # the conditions of the rules that call it
    evidence = _floor_evidence(f) + (
        f"; achieved TPOT {ms(r.achieved_tpot_s or 0)} = {r.achieved_over_floor:.2f}× floor, "
        f"{pct(r.bandwidth_util or 0)} of bandwidth ({(r.achieved_bandwidth_bytes_s or 0) / 1e12:.3g} TB/s)"
    )
    sm = f.telemetry.get("gpu.sm_activity_mean")
    dram = f.telemetry.get("gpu.dram_bw_util_mean", f.telemetry.get("gpu.mem_bw_util_mean"))
    if sm is not None:
        evidence += f"; SM activity {pct(sm)}"
    if dram is not None:
        evidence += f"; memory-bandwidth utilization {pct(dram)}"
    return evidence


def _over_floor(f: RunFacts) -> float | None:
    return f.roofline.achieved_over_floor if f.roofline is not None else None


FLOOR = Rule(
    "roofline.floor",
    "§5",
    "the decode floor per token (weight and KV bytes ÷ memory bandwidth), when no TPOT was measured",
    lambda f: f.roofline is not None and f.roofline.achieved_over_floor is None,
    lambda f: Outcome("info", "Decode floor (no TPOT measured)", _floor_evidence(f)),
)


def _above_headroom(f: RunFacts) -> bool:
    over = _over_floor(f)
    return over is not None and over > f.thresholds.decode_headroom


HEADROOM = Rule(
    "roofline.headroom",
    "§5",
    "achieved TPOT more than 1.5× its bandwidth floor: headroom left",
    _above_headroom,
    lambda f: Outcome(
        "info",
        "Decode well above its bandwidth floor: headroom left",
        _achieved_evidence(f),
        steps(S_BATCH, S_KERNELS),
    ),
)


def _at_floor(f: RunFacts) -> bool:
    over = _over_floor(f)
    return over is not None and over <= f.thresholds.decode_headroom


AT_FLOOR = Rule(
    "roofline.at_floor",
    "§5",
    "achieved TPOT within 1.5× its bandwidth floor: only fewer bytes per step help",
    _at_floor,
    lambda f: Outcome(
        "info",
        "Decode at its bandwidth floor: only fewer bytes per step help",
        _achieved_evidence(f),
        steps(S_WEIGHT_QUANT, S_KV_QUANT),
    ),
)

PREFILL_MFU = Rule(
    "roofline.prefill_mfu",
    "§5",
    "prefill compute utilization (MFU) against the GPU's peak dense FLOP/s",
    lambda f: f.prefill_mfu_frac is not None,
    lambda f: Outcome(
        "info",
        "Prefill compute utilization",
        f"prefill MFU {pct(f.prefill_mfu_frac or 0)} (2 × params FLOPs per prompt token ÷ peak dense FLOP/s)",
    ),
)

RULES = (FLOOR, HEADROOM, AT_FLOOR, PREFILL_MFU)
