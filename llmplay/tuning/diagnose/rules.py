"""The checklist made executable: model facts, memory breakdown, decode roofline, and rule-based findings.

Everything here is a pure function of plain inputs (numbers, dicts, frozen dataclasses), so the
report can re-run a diagnosis on any archived run. Thresholds are CHECKLIST.md §4 and §6; each
finding carries the numbers that triggered it and the next step from the §7 catalogue, cheapest first.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from llmplay.errors import LlmplayError

GiB = 2**30


class ModelFactsError(LlmplayError):
    """The model file or config cannot be read into facts (layers, heads, parameters)."""


# ---------------------------------------------------------------------------------------------
# Model facts


@dataclass(frozen=True)
class ModelFacts:
    name: str
    architecture: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    params: int
    weight_bytes: int  # exact for GGUF (tensor sizes); estimated for config.json
    quantization: str  # e.g. "Q4_K_M", "bf16", "fp8", "awq"
    source: str  # where the facts came from, for the report

    @property
    def bytes_per_param(self) -> float:
        return self.weight_bytes / self.params if self.params else 0.0

    def kv_bytes_per_token(self, kv_dtype_bytes: float) -> float:
        """2 (K and V) × layers × kv_heads × head_dim × dtype bytes (CHECKLIST §4)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


def _gguf_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def model_facts_from_gguf(path: str | Path) -> ModelFacts:
    """Facts from GGUF metadata; parameters and bytes are summed over the tensors actually stored."""
    try:
        import gguf
    except ImportError as e:  # optional extra `cpu`
        raise ModelFactsError(f"reading {path} needs the gguf package: pip install 'llmplay[cpu]' ({e})") from e
    p = Path(path)
    if not p.is_file():
        raise ModelFactsError(f"{p}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(str(p))
    except Exception as e:
        raise ModelFactsError(f"{p}: not a readable GGUF file ({type(e).__name__}: {e})") from e
    arch = _gguf_value(reader, "general.architecture")
    if not arch:
        raise ModelFactsError(f"{p}: GGUF has no general.architecture")

    def num(key: str) -> int | None:
        v = _gguf_value(reader, f"{arch}.{key}")
        if v is None:
            return None
        if isinstance(v, (list, tuple)):  # per-layer arrays (e.g. head_count_kv): the largest layer
            v = max(v) if v else None
        return None if v is None else int(v)

    layers = num("block_count")
    heads = num("attention.head_count")
    hidden = num("embedding_length")
    if not (layers and heads and hidden):
        raise ModelFactsError(f"{p}: GGUF lacks {arch}.block_count / attention.head_count / embedding_length")
    kv_heads = num("attention.head_count_kv") or heads
    head_dim = num("attention.key_length") or hidden // heads
    params = sum(int(t.n_elements) for t in reader.tensors)
    weight_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    if not params:
        raise ModelFactsError(f"{p}: GGUF holds no tensors (a vocab-only file?); point at the model weights")
    ftype = _gguf_value(reader, "general.file_type")
    if ftype is not None:
        try:
            quant = gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
        except ValueError:
            quant = f"file_type {ftype}"
    else:  # the type holding most bytes
        by_type: Counter[str] = Counter()
        for t in reader.tensors:
            by_type[gguf.GGMLQuantizationType(int(t.tensor_type)).name] += int(t.n_bytes)
        quant = by_type.most_common(1)[0][0] if by_type else "unknown"
    name = _gguf_value(reader, "general.name") or p.stem
    return ModelFacts(str(name), str(arch), layers, heads, kv_heads, head_dim, hidden, params, weight_bytes,
                      quant, f"gguf:{p}")


# bytes per weight; 4-bit group-quantized formats carry scales/zeros (~0.16 bit per weight at group 128)
QUANT_BYTES: Mapping[str, float] = {
    "fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "none": 2,
    "fp8": 1, "int8": 1, "w8a8": 1, "fbgemm_fp8": 1, "compressed-tensors": 1,
    "awq": 0.52, "gptq": 0.52, "int4": 0.5, "w4a16": 0.52, "marlin": 0.52, "bitsandbytes": 0.52,
    "nvfp4": 0.5625, "mxfp4": 0.53125,
}


def model_facts_from_hf_config(config_path: str | Path, quantization: str | None = None) -> ModelFacts:
    """Facts from a Hugging Face config.json; parameters are counted from the shapes (decoder-only,
    gated MLP, MoE experts counted in full) and embeddings stay at the checkpoint dtype, as
    weight-only quantizers leave them."""
    p = Path(config_path)
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ModelFactsError(f"{p}: cannot read config.json ({e})") from e
    top = cfg
    cfg = cfg.get("text_config") or cfg  # multimodal wrappers keep the LM under text_config

    def get(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        return default

    layers = get("num_hidden_layers", "n_layer", "num_layers")
    heads = get("num_attention_heads", "n_head")
    hidden = get("hidden_size", "n_embd", "d_model")
    if not (layers and heads and hidden):
        raise ModelFactsError(f"{p}: config.json lacks num_hidden_layers / num_attention_heads / hidden_size")
    kv_heads = get("num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = get("head_dim", default=hidden // heads)
    inter = get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    vocab = get("vocab_size", default=0)
    experts = get("num_local_experts", "num_experts", "n_routed_experts", default=0) or 0
    moe_inter = get("moe_intermediate_size", default=inter)
    shared = get("n_shared_experts", "num_shared_experts", default=0) or 0
    tied = bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))

    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if experts:
        mlp = experts * 3 * hidden * moe_inter + shared * 3 * hidden * moe_inter + hidden * experts
    else:
        mlp = 3 * hidden * inter
    per_layer = attn + mlp + 2 * hidden
    embed = vocab * hidden * (1 if tied else 2)
    params = layers * per_layer + embed + hidden

    dtype = str(get("torch_dtype", "dtype", default=top.get("torch_dtype", "bfloat16"))).replace("torch.", "")
    base_bytes = QUANT_BYTES.get(dtype, 2)
    q = quantization
    qcfg = top.get("quantization_config") or cfg.get("quantization_config")
    if q is None and qcfg:
        q = str(qcfg.get("quant_method", "")).lower()
        if q in ("gptq", "awq") or not q:
            bits = qcfg.get("bits")
            q = q or (f"int{bits}" if bits else "int8")
    q = (q or dtype).lower()
    if q not in QUANT_BYTES:
        raise ModelFactsError(
            f"{p}: unknown quantization '{q}'; expected one of {', '.join(sorted(QUANT_BYTES))}")
    body_bytes = QUANT_BYTES[q]
    weight_bytes = int(layers * per_layer * body_bytes + (embed + hidden) * base_bytes)
    name = top.get("_name_or_path") or p.parent.name
    arch = (top.get("architectures") or [top.get("model_type", "unknown")])[0]
    return ModelFacts(str(name), str(arch), int(layers), int(heads), int(kv_heads), int(head_dim), int(hidden),
                      int(params), weight_bytes, q, f"config.json:{p}")


# ---------------------------------------------------------------------------------------------
# Memory breakdown and roofline


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
            notes.append(f"weights + KV ({_gib(weights + kv)}) exceed the measured peak ({_gib(peak_bytes)})")
        other = max(rest, 0.0)
        kv_share = kv / peak_bytes
    if peak_bytes is not None and capacity_bytes:
        peak_frac = peak_bytes / capacity_bytes
    return MemoryBreakdown(weights, per_tok, float(tokens_in_flight), kv, other, peak_bytes, capacity_bytes,
                           kv_share, peak_frac, device, tuple(notes))


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
    return Roofline(moved, bandwidth_bytes_s, floor, achieved_tpot_s, achieved_tpot_s / floor,
                    floor / achieved_tpot_s, moved / achieved_tpot_s, bandwidth_source)


def prefill_mfu(params: float, prompt_tokens_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilization of prefill: 2 × params FLOPs per prompt token ÷ peak dense FLOP/s."""
    if peak_flops <= 0:
        raise ValueError("peak_flops must be > 0")
    return 2.0 * params * prompt_tokens_per_s / peak_flops


# ---------------------------------------------------------------------------------------------
# Findings


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # info | warn | critical
    title: str
    evidence: str  # the numbers that triggered it
    suggestion: str  # next step(s), cheapest first (CHECKLIST §7)
    checklist_ref: str  # "§4", "§5", "§6"


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


def _gib(b: float) -> str:
    return f"{b / GiB:.2f} GiB"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


_LATENCY_PREFIXES = ("ttft.", "tpot.", "itl.", "e2el.")


def targets_from_gates(gates: Sequence[Any]) -> dict[str, float]:
    """Latency limits (`ttft.p95 < 0.5`) and throughput floors (`throughput.output_tok_s > 3000`)
    from playbook gates (spec.Gate), the yardsticks for "latency high" and "tokens/s low"."""
    out: dict[str, float] = {}
    for g in gates:
        if g.metric.startswith(_LATENCY_PREFIXES) and g.op in ("<", "<="):
            out[g.metric] = g.value
        elif g.metric.startswith("throughput.") and g.op in (">", ">="):
            out[g.metric] = g.value
    return out


def _latency_high(summary: Mapping[str, float], targets: Mapping[str, float], th: Thresholds) -> tuple[bool | None, str]:
    over, under = [], []
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
            f"({'≥' if r >= th.ttft_tail_ratio else '<'} {th.ttft_tail_ratio:g}×)")
    return None, "latency not measured"


def _throughput_ok(summary: Mapping[str, float], targets: Mapping[str, float], roofline: Roofline | None,
                   th: Thresholds) -> tuple[bool | None, str]:
    for k, floor in targets.items():
        if k.startswith("throughput.") and summary.get(k) is not None:
            v = summary[k]
            return v >= floor, f"{k} {v:.4g} {'≥' if v >= floor else '<'} target {floor:.4g}"
    if roofline is not None and roofline.bandwidth_util is not None:
        ok = roofline.bandwidth_util >= th.throughput_ok_bandwidth_util
        return ok, (f"no throughput gate; decode uses {_pct(roofline.bandwidth_util)} of the bandwidth roofline "
                    f"({'≥' if ok else '<'} {_pct(th.throughput_ok_bandwidth_util)})")
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
    sched = dict(scheduler_info or {})
    tg = dict(targets or {})
    out: list[Finding] = []

    def add(id_: str, severity: str, title: str, evidence: str, suggestion: str, ref: str) -> None:
        out.append(Finding(id_, severity, title, evidence, suggestion, ref))

    # -- §4 memory -------------------------------------------------------------------------
    if breakdown is None:
        add("memory.not_evaluated", "info", "Memory breakdown not evaluated",
            "no model facts (config.json or GGUF) or no memory measurement", "", "§4")
    else:
        b = breakdown
        where = "GPU memory" if b.device == "gpu" else "host memory (RSS)"
        parts = [f"weights {_gib(b.weights_bytes)}",
                 f"KV {_gib(b.kv_bytes)} ({b.kv_bytes_per_token / 1024:.1f} KiB/token × {b.tokens_in_flight:.0f} tokens)"]
        if b.other_bytes is not None:
            parts.append(f"activations/runtime {_gib(b.other_bytes)}")
        if b.peak_bytes is not None:
            parts.append(f"peak {_gib(b.peak_bytes)}")
        if b.capacity_bytes:
            parts.append(f"capacity {_gib(b.capacity_bytes)}")
        add("memory.breakdown", "info", f"Memory breakdown ({where})", "; ".join(parts + list(b.notes)), "", "§4")

        if b.peak_frac is not None and b.peak_frac > th.peak_frac:
            pre = sched.get("kv_preallocated_frac")
            ev = f"peak {_gib(b.peak_bytes or 0)} of {_gib(b.capacity_bytes or 0)} = {_pct(b.peak_frac)} > {_pct(th.peak_frac)}"
            if pre is not None and b.peak_frac <= float(pre) + 0.02:
                add("memory.peak_high", "info", "Memory full by design (engine preallocates the KV cache)",
                    ev + f"; the engine reserves {_pct(float(pre))} up front, so watch KV-cache usage and preemptions instead",
                    "", "§4")
            else:
                add("memory.peak_high", "critical", "Memory-bound: fix memory first", ev,
                    _steps(S_WEIGHT_QUANT, S_KV_QUANT, S_SEQ, S_SCALE), "§4")
        if b.kv_share is not None and b.kv_share > th.kv_share:
            add("memory.kv_share_high", "warn", "KV cache dominates memory: concurrency / context length limited",
                f"KV {_gib(b.kv_bytes)} of peak {_gib(b.peak_bytes or 0)} = {_pct(b.kv_share)} > {_pct(th.kv_share)}",
                _steps(S_MAX_TOKENS, S_KV_QUANT, S_SEQ), "§4")
        errors = summary.get("errors.rate")
        if errors and b.peak_frac is not None and b.peak_frac > th.peak_frac:
            add("memory.errors_at_full_memory", "critical", "Requests failed while memory was full (possible OOM)",
                f"error rate {_pct(errors)} with peak memory at {_pct(b.peak_frac)}",
                _steps(S_LOWER_CONC, S_KV_QUANT, S_WEIGHT_QUANT), "§4")

    pre_n = telemetry.get("engine.preemptions")
    if pre_n is not None and pre_n > 0:
        usage = telemetry.get("engine.kv_cache_usage_max")
        ev = f"{pre_n:.0f} preemptions (swap/recompute) in the window"
        if usage is not None:
            ev += f"; peak KV-cache usage {_pct(usage)}"
        add("memory.preemptions", "critical", "Preemptions: the KV cache ran out (latency disaster, fix now)", ev,
            _steps(S_LOWER_CONC, S_GPU_MEM, S_KV_QUANT, S_MAX_TOKENS), "§4")

    # -- §5 roofline -----------------------------------------------------------------------
    if roofline is not None:
        r = roofline
        src = f" ({r.bandwidth_source})" if r.bandwidth_source else ""
        ev = (f"{_gib(r.bytes_per_step)} per step ÷ {r.bandwidth_bytes_s / 1e12:.3g} TB/s{src} = floor {_ms(r.floor_s)}/token")
        if r.achieved_over_floor is None:
            add("roofline.floor", "info", "Decode floor (no TPOT measured)", ev, "", "§5")
        else:
            ev += (f"; achieved TPOT {_ms(r.achieved_tpot_s or 0)} = {r.achieved_over_floor:.2f}× floor, "
                   f"{_pct(r.bandwidth_util or 0)} of bandwidth ({(r.achieved_bandwidth_bytes_s or 0) / 1e12:.3g} TB/s)")
            gpu_act = telemetry.get("gpu.sm_activity_mean")
            dram = telemetry.get("gpu.dram_bw_util_mean", telemetry.get("gpu.mem_bw_util_mean"))
            if gpu_act is not None:
                ev += f"; SM activity {_pct(gpu_act)}"
            if dram is not None:
                ev += f"; memory-bandwidth utilization {_pct(dram)}"
            if r.achieved_over_floor > th.decode_headroom:
                add("roofline.headroom", "info", "Decode well above its bandwidth floor: headroom left",
                    ev, _steps(S_BATCH, S_KERNELS), "§5")
            else:
                add("roofline.at_floor", "info", "Decode at its bandwidth floor: only fewer bytes per step help",
                    ev, _steps(S_WEIGHT_QUANT, S_KV_QUANT), "§5")
    if prefill_mfu_frac is not None:
        add("roofline.prefill_mfu", "info", "Prefill compute utilization",
            f"prefill MFU {_pct(prefill_mfu_frac)} (2 × params FLOPs per prompt token ÷ peak dense FLOP/s)", "", "§5")

    # -- §6 scheduler and GPU rules ----------------------------------------------------------
    if sched.get("continuous_batching") is False:
        add("sched.no_continuous_batching", "warn", "Continuous batching is off",
            "engine runs static batches", S_CONT_BATCH, "§6")
    mb, conc = sched.get("max_batch"), sched.get("concurrency")
    if mb and conc and conc > mb:
        add("sched.concurrency_over_batch", "info", "Load concurrency exceeds the engine's max batch",
            f"concurrency {conc} > max batch {mb}: {conc - mb} requests wait in the engine queue",
            _steps(S_BATCH, S_SCALE), "§6")
    if sched.get("prefix_caching") is False and (sched.get("shared_prefix_tokens") or 0) > 0:
        add("sched.prefix_cache_off", "info", "Prompts share a prefix but prefix caching is off",
            f"{sched['shared_prefix_tokens']} shared prefix tokens per request", S_PREFIX, "§6")
    hit = telemetry.get("engine.prefix_cache_hit_rate")
    if hit is not None and (sched.get("shared_prefix_tokens") or 0) > 0 and hit < 0.1:
        add("sched.prefix_cache_misses", "info", "Shared prefixes are not being hit in the prefix cache",
            f"prefix-cache hit rate {_pct(hit)} with {sched['shared_prefix_tokens']} shared prefix tokens",
            S_PREFIX, "§6")

    nz = telemetry.get("engine.waiting_nonzero_frac")
    wmean, wmax = telemetry.get("engine.waiting_mean"), telemetry.get("engine.waiting_max")
    persistent = nz >= th.queue_persistent_frac if nz is not None else (wmean is not None and wmean >= 1.0)
    if persistent:
        ev = f"waiting queue > 0 in {_pct(nz)} of samples" if nz is not None else ""
        if wmean is not None:
            ev += f"{'; ' if ev else ''}mean {wmean:.1f}, max {wmax:.0f} waiting"
        add("queue.persistent", "warn", "Requests queue persistently in the engine",
            ev, _steps(S_BATCH, S_PREFIX, S_WEIGHT_QUANT, S_SCALE), "§6")

    util = telemetry.get("gpu.sm_activity_mean")
    util_name = "SM activity (GPM)"
    if util is None:
        util, util_name = telemetry.get("gpu.util_mean"), "GPU utilization (NVML)"
    if util is None:
        why = next((n for n in notes if n.startswith("no NVML")), "no GPU utilization measured")
        add("gpu.not_evaluated", "info", "GPU rules not evaluated",
            f"{why}; the §6 GPU-utilization rules need a GPU", "", "§6")
    else:
        lat_high, lat_ev = _latency_high(summary, tg, th)
        tp_ok, tp_ev = _throughput_ok(summary, tg, roofline, th)
        u_ev = f"{util_name} {_pct(util)}"
        if util >= th.util_high:
            if lat_high:
                add("gpu.busy_and_slow", "warn", "GPU busy and latency high: queueing at the concurrency limit",
                    f"{u_ev} ≥ {_pct(th.util_high)}; {lat_ev}", _steps(S_PREFIX, S_WEIGHT_QUANT, S_SCALE), "§6")
        elif util < th.util_low:
            if tp_ok is False:
                add("gpu.batch_too_small", "warn", "GPU idle and tokens/s low: batch too small",
                    f"{u_ev} < {_pct(th.util_low)}; {tp_ev}", _steps(S_CONT_BATCH, S_BATCH), "§6")
            elif tp_ok is True:
                add("gpu.bandwidth_bound", "info", "GPU compute idle but tokens/s fine: bandwidth-bound already",
                    f"{u_ev} < {_pct(th.util_low)}; {tp_ev}", _steps(S_WEIGHT_QUANT, S_KV_QUANT), "§6")
            else:
                add("gpu.low_util_undecided", "info", "GPU utilization low; tokens/s not judged",
                    f"{u_ev} < {_pct(th.util_low)}; {tp_ev}: set a throughput gate to decide batch-too-small vs "
                    "bandwidth-bound", "", "§6")

    out.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    return out
