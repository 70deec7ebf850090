"""The decode roofline (CHECKLIST §5): the best TPOT the memory bandwidth allows, and prefill MFU."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    """Decode is bandwidth-bound: each step reads every weight once plus the KV cache in use."""

    bytes_per_step: float
    bandwidth_bytes_s: float
    floor_s: float  # per decode step, i.e. the best possible TPOT
    achieved_tpot_s: float | None
    achieved_over_floor: float | None  # 1.0 is at the floor
    bandwidth_util: float | None  # floor / achieved: share of bandwidth the decode uses
    achieved_bandwidth_bytes_s: float | None
    bandwidth_source: str = ""  # "table: H100 SXM" | "measured copy" ...


def decode_roofline(
    weight_bytes: float,
    kv_bytes_per_step: float,
    bandwidth_bytes_s: float,
    achieved_tpot_s: float | None,
    *,
    bandwidth_source: str = "",
) -> Roofline:
    if bandwidth_bytes_s <= 0:
        raise ValueError("bandwidth_bytes_s must be > 0")
    moved = float(weight_bytes + kv_bytes_per_step)
    floor = moved / bandwidth_bytes_s
    if achieved_tpot_s is None or achieved_tpot_s <= 0 or not math.isfinite(achieved_tpot_s):
        return Roofline(moved, bandwidth_bytes_s, floor, None, None, None, None, bandwidth_source)
    return Roofline(
        moved,
        bandwidth_bytes_s,
        floor,
        achieved_tpot_s,
        achieved_tpot_s / floor,
        floor / achieved_tpot_s,
        moved / achieved_tpot_s,
        bandwidth_source,
    )


def prefill_mfu(params: float, prompt_tokens_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilization of prefill: 2 × params FLOPs per prompt token ÷ peak dense FLOP/s."""
    if peak_flops <= 0:
        raise ValueError("peak_flops must be > 0")
    return 2.0 * params * prompt_tokens_per_s / peak_flops
