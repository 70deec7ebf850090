"""The checklist made executable: rule-based findings from a configuration's metrics, memory and roofline.

Everything here is a pure function of plain inputs (numbers, dicts, frozen dataclasses), so the
report can re-run a diagnosis on any archived run. Thresholds are CHECKLIST.md §4 and §6; each
finding carries the numbers that triggered it and the next step from the §7 catalogue, cheapest first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmplay.archive.model import Finding
from llmplay.tuning.diagnose.memory import MemoryBreakdown, format_gib
from llmplay.tuning.diagnose.roofline import Roofline


@dataclass(frozen=True)
class Thresholds:
    peak_frac: float = 0.90  # §4: above → memory-bound first
    kv_share: float = 0.60  # §4: above → concurrency / length limited
    util_high: float = 0.80  # §6
    util_low: float = 0.50  # §6
    queue_persistent_frac: float = 0.50  # share of samples with waiting > 0 that counts as "persistently"
    ttft_tail_ratio: float = 3.0  # without latency targets: P95/P50 TTFT this large signals queueing
    decode_headroom: float = 1.5  # achieved TPOT / floor above this: headroom left (§5)
    throughput_ok_bandwidth_util: float = 0.5  # without a throughput target: decode at ≥ half the roofline


# §7 catalogue steps in the order the checklist ranks them by cost-effectiveness
S_CONT_BATCH = "turn continuous batching on (§7.1)"
S_PREFIX = "prefix caching for shared system prompts / multi-turn (§7.2)"
S_MAX_TOKENS = "streaming and a sensible max_tokens (§7.3)"
S_WEIGHT_QUANT = "FP8/INT8/AWQ/GPTQ weights (halves the bytes per step)"
S_KV_QUANT = "KV-cache quantization (8/4 bit)"
S_BATCH = "raise max batch / max concurrent sequences (max_num_seqs, llama.cpp --parallel) matched to the load"
S_SEQ = "max-seq-len matched to the load"
S_KERNELS = "CUDA graphs, FlashAttention, kernel fusion (engine choice and version)"
S_GPU_MEM = "give the KV cache more memory (e.g. vLLM gpu_memory_utilization)"
S_LOWER_CONC = "cap concurrency (max_num_seqs) below the point where the KV cache runs out"
S_SCALE = "scale out: more replicas behind a load balancer, or tensor parallelism / a bigger GPU"


def _steps(*steps: str) -> str:
    return "; then ".join(steps)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


def measured_only(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a summary or telemetry mapping: a None, NaN or non-number is "not measured", which
    every rule already reads as an absent key (so it skips, never crashes)."""
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


_LATENCY_PREFIXES = ("ttft.", "tpot.", "itl.", "e2el.")


def targets_from_gates(gates: Sequence[Any]) -> dict[str, float]:
    """Latency limits (`ttft.p95 < 0.5`) and throughput floors (`throughput.output_tok_s > 3000`)
    from playbook gates (spec.Gate), the yardsticks for "latency high" and "tokens/s low"."""
    out: dict[str, float] = {}
    for g in gates:
        if (g.metric.startswith(_LATENCY_PREFIXES) and g.op in ("<", "<=")) or (
            g.metric.startswith("throughput.") and g.op in (">", ">=")
        ):
            out[g.metric] = g.value
    return out


def _latency_high(
    summary: Mapping[str, float], targets: Mapping[str, float], th: Thresholds
) -> tuple[bool | None, str]:
    over: list[str] = []
    under: list[str] = []
    for k, limit in targets.items():
        if not k.startswith(_LATENCY_PREFIXES):
            continue
        v = summary.get(k)
        if v is None:
            continue
        (over if v > limit else under).append(f"{k} {_ms(v)} {'>' if v > limit else '≤'} {_ms(limit)}")
    if over:
        return True, ", ".join(over)
    if under:
        return False, ", ".join(under)
    p50, p95 = summary.get("ttft.p50"), summary.get("ttft.p95")
    if p50 and p95 is not None:
        r = p95 / p50
        return r >= th.ttft_tail_ratio, (
            f"no latency gate; TTFT P95/P50 = {_ms(p95)}/{_ms(p50)} = {r:.1f}× "
            f"({'≥' if r >= th.ttft_tail_ratio else '<'} {th.ttft_tail_ratio:g}×)"
        )
    return None, "latency not measured"


def _throughput_ok(
    summary: Mapping[str, float], targets: Mapping[str, float], roofline: Roofline | None, th: Thresholds
) -> tuple[bool | None, str]:
    for k, floor in targets.items():
        if k.startswith("throughput.") and summary.get(k) is not None:
            v = summary[k]
            return v >= floor, f"{k} {v:.4g} {'≥' if v >= floor else '<'} target {floor:.4g}"
    if roofline is not None and roofline.bandwidth_util is not None:
        ok = roofline.bandwidth_util >= th.throughput_ok_bandwidth_util
        return ok, (
            f"no throughput gate; decode uses {_pct(roofline.bandwidth_util)} of the bandwidth roofline "
            f"({'≥' if ok else '<'} {_pct(th.throughput_ok_bandwidth_util)})"
        )
    return None, "no throughput gate and no roofline"


_SEVERITY_ORDER = {"critical": 0, "warn": 1, "info": 2}


def diagnose(
    summary: Mapping[str, float],
    telemetry: Mapping[str, float],
    breakdown: MemoryBreakdown | None,
    roofline: Roofline | None,
    scheduler_info: Mapping[str, Any] | None = None,
    *,
    targets: Mapping[str, float] | None = None,
    notes: Sequence[str] = (),
    prefill_mfu_frac: float | None = None,
    thresholds: Thresholds = Thresholds(),
) -> list[Finding]:
    """Findings for one configuration, most severe first.

    summary: the metrics summary (ttft.p50, ttft.p95, tpot.p95, throughput.output_tok_s, errors.rate, ...).
    telemetry: TelemetrySeries.summary() — absent keys mean "not measured" and skip the rules needing them.
    scheduler_info: what the engine was told, e.g. {"continuous_batching": True, "max_batch": 256,
        "concurrency": 64, "prefix_caching": False, "shared_prefix_tokens": 512,
        "kv_preallocated_frac": 0.9 (vLLM/SGLang reserve memory up front)}.
    targets: latency limits / throughput floors, see targets_from_gates.
    notes: telemetry notes, quoted when a rule could not be evaluated (e.g. "no NVML: ...").
    """
    th = thresholds
    summary, telemetry = measured_only(summary), measured_only(telemetry)
    sched = dict(scheduler_info or {})
    tg = dict(targets or {})
    out: list[Finding] = []

    def add(id_: str, severity: str, title: str, evidence: str, suggestion: str, ref: str) -> None:
        out.append(Finding(id_, severity, title, evidence, suggestion, ref))

    # -- §4 memory -------------------------------------------------------------------------
    if breakdown is None:
        add(
            "memory.not_evaluated",
            "info",
            "Memory breakdown not evaluated",
            "no model facts (config.json or GGUF) or no memory measurement",
            "",
            "§4",
        )
    else:
        b = breakdown
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
        add("memory.breakdown", "info", f"Memory breakdown ({where})", "; ".join(parts + list(b.notes)), "", "§4")

        if b.peak_frac is not None and b.peak_frac > th.peak_frac:
            pre = sched.get("kv_preallocated_frac")
            ev = f"peak {format_gib(b.peak_bytes or 0)} of {format_gib(b.capacity_bytes or 0)} = {_pct(b.peak_frac)} > {_pct(th.peak_frac)}"
            if pre is not None and b.peak_frac <= float(pre) + 0.02:
                add(
                    "memory.peak_high",
                    "info",
                    "Memory full by design (engine preallocates the KV cache)",
                    ev
                    + f"; the engine reserves {_pct(float(pre))} up front, so watch KV-cache usage and preemptions instead",
                    "",
                    "§4",
                )
            else:
                add(
                    "memory.peak_high",
                    "critical",
                    "Memory-bound: fix memory first",
                    ev,
                    _steps(S_WEIGHT_QUANT, S_KV_QUANT, S_SEQ, S_SCALE),
                    "§4",
                )
        if b.kv_share is not None and b.kv_share > th.kv_share:
            add(
                "memory.kv_share_high",
                "warn",
                "KV cache dominates memory: concurrency / context length limited",
                f"KV {format_gib(b.kv_bytes)} of peak {format_gib(b.peak_bytes or 0)} = {_pct(b.kv_share)} > {_pct(th.kv_share)}",
                _steps(S_MAX_TOKENS, S_KV_QUANT, S_SEQ),
                "§4",
            )
        errors = summary.get("errors.rate")
        if errors and b.peak_frac is not None and b.peak_frac > th.peak_frac:
            add(
                "memory.errors_at_full_memory",
                "critical",
                "Requests failed while memory was full (possible OOM)",
                f"error rate {_pct(errors)} with peak memory at {_pct(b.peak_frac)}",
                _steps(S_LOWER_CONC, S_KV_QUANT, S_WEIGHT_QUANT),
                "§4",
            )

    pre_n = telemetry.get("engine.preemptions")
    if pre_n is not None and pre_n > 0:
        usage = telemetry.get("engine.kv_cache_usage_max")
        ev = f"{pre_n:.0f} preemptions (swap/recompute) in the window"
        if usage is not None:
            ev += f"; peak KV-cache usage {_pct(usage)}"
        add(
            "memory.preemptions",
            "critical",
            "Preemptions: the KV cache ran out (latency disaster, fix now)",
            ev,
            _steps(S_LOWER_CONC, S_GPU_MEM, S_KV_QUANT, S_MAX_TOKENS),
            "§4",
        )

    # -- §5 roofline -----------------------------------------------------------------------
    if roofline is not None:
        r = roofline
        src = f" ({r.bandwidth_source})" if r.bandwidth_source else ""
        ev = f"{format_gib(r.bytes_per_step)} per step ÷ {r.bandwidth_bytes_s / 1e12:.3g} TB/s{src} = floor {_ms(r.floor_s)}/token"
        if r.achieved_over_floor is None:
            add("roofline.floor", "info", "Decode floor (no TPOT measured)", ev, "", "§5")
        else:
            ev += (
                f"; achieved TPOT {_ms(r.achieved_tpot_s or 0)} = {r.achieved_over_floor:.2f}× floor, "
                f"{_pct(r.bandwidth_util or 0)} of bandwidth ({(r.achieved_bandwidth_bytes_s or 0) / 1e12:.3g} TB/s)"
            )
            gpu_act = telemetry.get("gpu.sm_activity_mean")
            dram = telemetry.get("gpu.dram_bw_util_mean", telemetry.get("gpu.mem_bw_util_mean"))
            if gpu_act is not None:
                ev += f"; SM activity {_pct(gpu_act)}"
            if dram is not None:
                ev += f"; memory-bandwidth utilization {_pct(dram)}"
            if r.achieved_over_floor > th.decode_headroom:
                add(
                    "roofline.headroom",
                    "info",
                    "Decode well above its bandwidth floor: headroom left",
                    ev,
                    _steps(S_BATCH, S_KERNELS),
                    "§5",
                )
            else:
                add(
                    "roofline.at_floor",
                    "info",
                    "Decode at its bandwidth floor: only fewer bytes per step help",
                    ev,
                    _steps(S_WEIGHT_QUANT, S_KV_QUANT),
                    "§5",
                )
    if prefill_mfu_frac is not None:
        add(
            "roofline.prefill_mfu",
            "info",
            "Prefill compute utilization",
            f"prefill MFU {_pct(prefill_mfu_frac)} (2 × params FLOPs per prompt token ÷ peak dense FLOP/s)",
            "",
            "§5",
        )

    # -- §6 scheduler and GPU rules ----------------------------------------------------------
    if sched.get("continuous_batching") is False:
        add(
            "sched.no_continuous_batching",
            "warn",
            "Continuous batching is off",
            "engine runs static batches",
            S_CONT_BATCH,
            "§6",
        )
    mb, conc = sched.get("max_batch"), sched.get("concurrency")
    if mb and conc and conc > mb:
        add(
            "sched.concurrency_over_batch",
            "info",
            "Load concurrency exceeds the engine's max batch",
            f"concurrency {conc} > max batch {mb}: {conc - mb} requests wait in the engine queue",
            _steps(S_BATCH, S_SCALE),
            "§6",
        )
    # The workload's own prefix reuse (measured on what was sent: shared prefixes, conversations resending their
    # history) against what the engine served from its prefix cache; the configured shared prefix where an older
    # summary has no such figure.
    expected, achieved = summary.get("prefix_reuse.expected"), summary.get("prefix_reuse.achieved")
    shared = sched.get("shared_prefix_tokens") or 0
    reuses = expected >= 0.05 if expected is not None else shared > 0
    reuse_text = (
        f"the workload repeats {_pct(expected)} of its prompt tokens"
        if expected is not None
        else f"{shared} shared prefix tokens per request"
    )
    if sched.get("prefix_caching") is False and reuses:
        add(
            "sched.prefix_cache_off",
            "info",
            "Prompts share a prefix but prefix caching is off",
            reuse_text,
            S_PREFIX,
            "§6",
        )
    hit = achieved if achieved is not None else telemetry.get("engine.prefix_cache_hit_rate")
    missed = hit < expected / 2 if expected is not None and hit is not None else hit is not None and hit < 0.1
    if sched.get("prefix_caching") is not False and reuses and missed:
        add(
            "sched.prefix_cache_misses",
            "info",
            "Shared prefixes are not being hit in the prefix cache",
            f"prefix-cache hit rate {_pct(hit)} where {reuse_text}",  # type: ignore[arg-type]
            S_PREFIX,
            "§6",
        )

    nz = telemetry.get("engine.waiting_nonzero_frac")
    wmean, wmax = telemetry.get("engine.waiting_mean"), telemetry.get("engine.waiting_max")
    persistent = nz >= th.queue_persistent_frac if nz is not None else (wmean is not None and wmean >= 1.0)
    if persistent:
        ev = f"waiting queue > 0 in {_pct(nz)} of samples" if nz is not None else ""
        if wmean is not None:
            ev += (
                f"{'; ' if ev else ''}mean {wmean:.1f}" + (f", max {wmax:.0f}" if wmax is not None else "") + " waiting"
            )
        add(
            "queue.persistent",
            "warn",
            "Requests queue persistently in the engine",
            ev,
            _steps(S_BATCH, S_PREFIX, S_WEIGHT_QUANT, S_SCALE),
            "§6",
        )

    util = telemetry.get("gpu.sm_activity_mean")
    util_name = "SM activity (GPM)"
    if util is None:
        util, util_name = telemetry.get("gpu.util_mean"), "GPU utilization (NVML)"
    if util is None:
        why = next((n for n in notes if n.startswith("no NVML")), "no GPU utilization measured")
        add(
            "gpu.not_evaluated",
            "info",
            "GPU rules not evaluated",
            f"{why}; the §6 GPU-utilization rules need a GPU",
            "",
            "§6",
        )
    else:
        lat_high, lat_ev = _latency_high(summary, tg, th)
        tp_ok, tp_ev = _throughput_ok(summary, tg, roofline, th)
        u_ev = f"{util_name} {_pct(util)}"
        if util >= th.util_high:
            if lat_high:
                add(
                    "gpu.busy_and_slow",
                    "warn",
                    "GPU busy and latency high: queueing at the concurrency limit",
                    f"{u_ev} ≥ {_pct(th.util_high)}; {lat_ev}",
                    _steps(S_PREFIX, S_WEIGHT_QUANT, S_SCALE),
                    "§6",
                )
        elif util < th.util_low:
            if tp_ok is False:
                add(
                    "gpu.batch_too_small",
                    "warn",
                    "GPU idle and tokens/s low: batch too small",
                    f"{u_ev} < {_pct(th.util_low)}; {tp_ev}",
                    _steps(S_CONT_BATCH, S_BATCH),
                    "§6",
                )
            elif tp_ok is True:
                add(
                    "gpu.bandwidth_bound",
                    "info",
                    "GPU compute idle but tokens/s fine: bandwidth-bound already",
                    f"{u_ev} < {_pct(th.util_low)}; {tp_ev}",
                    _steps(S_WEIGHT_QUANT, S_KV_QUANT),
                    "§6",
                )
            else:
                add(
                    "gpu.low_util_undecided",
                    "info",
                    "GPU utilization low; tokens/s not judged",
                    f"{u_ev} < {_pct(th.util_low)}; {tp_ev}: set a throughput gate to decide batch-too-small vs "
                    "bandwidth-bound",
                    "",
                    "§6",
                )

    out.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    return out
