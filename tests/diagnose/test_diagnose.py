"""Diagnosis: model facts from real GGUF / config.json files, breakdown and roofline arithmetic, every rule's edges."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import quants

from llmplay.archive.model import Finding
from llmplay.diagnose.checklist import Thresholds, diagnose, targets_from_gates
from llmplay.diagnose.gpus import lookup_gpu
from llmplay.diagnose.memory import MemoryBreakdown, memory_breakdown
from llmplay.diagnose.model_facts import (
    ModelFacts,
    ModelFactsError,
    model_facts_from_gguf,
    model_facts_from_hf_config,
)
from llmplay.diagnose.roofline import decode_roofline, prefill_mfu
from llmplay.runtime.cpu_image import write_gguf as write_gguf_file
from llmplay.spec import Gate

GiB = 2**30


def write_gguf(path: Path, *, tensors: bool = True) -> Path:
    """A metadata-only model (one Q8_0 tensor) whose facts are known exactly, through the project's GGUF writer."""

    def contents(w: gguf.GGUFWriter) -> None:
        w.add_block_count(2)
        w.add_head_count(4)
        w.add_head_count_kv(2)
        w.add_embedding_length(64)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
        if tensors:
            a = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
            q = quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor("blk.0.attn_q.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))

    return write_gguf_file(path, "tiny-test", contents)


def test_facts_from_gguf(tmp_path: Path) -> None:
    f = model_facts_from_gguf(write_gguf(tmp_path / "m.gguf"))
    assert (f.name, f.architecture, f.layers, f.heads, f.kv_heads, f.head_dim) == ("tiny-test", "llama", 2, 4, 2, 16)
    assert f.params == 64 * 256 + 64
    assert f.weight_bytes == 64 * 256 // 32 * 34 + 64 * 4  # Q8_0: 34 bytes per 32 weights; f32 norm
    assert f.quantization == "Q8_0"
    assert f.kv_bytes_per_token(2) == 2 * 2 * 2 * 16 * 2


def test_facts_from_gguf_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelFactsError, match="no tensors"):
        model_facts_from_gguf(write_gguf(tmp_path / "v.gguf", tensors=False))
    with pytest.raises(ModelFactsError, match="no such GGUF file"):
        model_facts_from_gguf(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not gguf at all")
    with pytest.raises(ModelFactsError, match="not a readable GGUF file"):
        model_facts_from_gguf(tmp_path / "junk.gguf")


LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "torch_dtype": "float16",
}


def _cfg(tmp_path: Path, cfg: dict) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_facts_from_hf_config_known_models(tmp_path: Path) -> None:
    f = model_facts_from_hf_config(_cfg(tmp_path, LLAMA3_8B))
    assert f.params == pytest.approx(8.03e9, rel=0.005)
    assert f.weight_bytes == pytest.approx(2 * f.params, rel=1e-6)
    assert f.kv_heads == 8 and f.head_dim == 128
    assert f.kv_bytes_per_token(2) == 131072  # 128 KiB per token in bf16
    f7 = model_facts_from_hf_config(_cfg(tmp_path, LLAMA2_7B))
    assert f7.params == pytest.approx(6.74e9, rel=0.005)
    assert f7.quantization == "float16"
    fp8 = model_facts_from_hf_config(_cfg(tmp_path, LLAMA3_8B), "fp8")
    # FP8 halves the body; embeddings and lm_head stay bf16
    emb = 2 * 128256 * 4096
    assert fp8.weight_bytes == pytest.approx((f.params - emb) * 1 + emb * 2, rel=1e-4)


def test_facts_from_hf_config_quantization_config_and_errors(tmp_path: Path) -> None:
    awq = dict(LLAMA2_7B, quantization_config={"quant_method": "awq", "bits": 4})
    f = model_facts_from_hf_config(_cfg(tmp_path, awq))
    assert f.quantization == "awq" and 0.5 < f.bytes_per_param < 0.7
    with pytest.raises(ModelFactsError, match="unknown quantization 'q3'; expected one of"):
        model_facts_from_hf_config(_cfg(tmp_path, LLAMA2_7B), "q3")
    with pytest.raises(ModelFactsError, match="lacks num_hidden_layers"):
        model_facts_from_hf_config(_cfg(tmp_path, {"vocab_size": 3}))


def facts(weight_bytes: float = 14e9, params: float = 7e9) -> ModelFacts:
    return ModelFacts("m", "llama", 32, 32, 8, 128, 4096, int(params), int(weight_bytes), "bf16", "test")


def test_memory_breakdown_arithmetic() -> None:
    b = memory_breakdown(facts(), 2, 10_000, peak_bytes=40 * GiB, capacity_bytes=80 * GiB)
    assert b.kv_bytes_per_token == 131072
    assert b.kv_bytes == 131072 * 10_000
    assert b.other_bytes == pytest.approx(40 * GiB - 14e9 - 131072 * 10_000)
    assert b.kv_share == pytest.approx(131072 * 10_000 / (40 * GiB))
    assert b.peak_frac == 0.5 and b.notes == ()
    # no measurement: only the model side
    b2 = memory_breakdown(facts(), 1, 100, None, None)
    assert (b2.other_bytes, b2.kv_share, b2.peak_frac) == (None, None, None)
    # lazily mapped weights: peak below weights; said, and clamped
    b3 = memory_breakdown(facts(), 2, 0, peak_bytes=1e9, capacity_bytes=8e9, device="host")
    assert b3.other_bytes == 0 and b3.notes and "exceed the measured peak" in b3.notes[0]


def test_roofline_checklist_example() -> None:
    bw = lookup_gpu("NVIDIA H100 80GB HBM3").memory_bandwidth_bytes_s
    r = decode_roofline(14e9, 0, bw, 0.008, bandwidth_source="table: H100 SXM")
    assert r.floor_s == pytest.approx(4.18e-3, rel=0.01)  # 7B FP16 on H100: ≈ 4.2 ms
    assert r.achieved_over_floor == pytest.approx(0.008 / r.floor_s)
    assert r.bandwidth_util == pytest.approx(r.floor_s / 0.008)
    assert r.achieved_bandwidth_bytes_s == pytest.approx(14e9 / 0.008)
    half = decode_roofline(7e9, 0, bw, None)  # quantization halves the floor
    assert half.floor_s == pytest.approx(r.floor_s / 2) and half.achieved_over_floor is None
    with pytest.raises(ValueError):
        decode_roofline(1, 0, 0, None)


def test_prefill_mfu() -> None:
    assert prefill_mfu(7e9, 10_000, 989e12) == pytest.approx(2 * 7e9 * 1e4 / 989e12)
    with pytest.raises(ValueError):
        prefill_mfu(1, 1, 0)


def test_gpu_table() -> None:
    assert lookup_gpu("NVIDIA H200").memory_bandwidth_bytes_s == 4.8e12
    assert lookup_gpu("NVIDIA H100 PCIe").memory_bandwidth_bytes_s == 2.0e12
    assert lookup_gpu("NVIDIA A100-SXM4-40GB").memory_bandwidth_bytes_s == 1.555e12
    assert lookup_gpu("NVIDIA A100-SXM4-80GB").model == "A100 80GB SXM"
    assert lookup_gpu("NVIDIA L40S").model == "L40S"
    assert lookup_gpu("NVIDIA L4").model == "L4"
    assert lookup_gpu("NVIDIA GeForce RTX 4090").memory_bandwidth_bytes_s == 1.008e12
    assert lookup_gpu("NVIDIA A10G").model == "A10G"
    assert lookup_gpu("Matrox G200") is None


# -- rules -------------------------------------------------------------------------------------


def bd(peak_frac: float = 0.5, kv_share: float = 0.2, device: str = "gpu") -> MemoryBreakdown:
    cap = 80 * GiB
    peak = peak_frac * cap
    kv = kv_share * peak
    return MemoryBreakdown(
        14e9, 131072, kv / 131072, kv, max(peak - 14e9 - kv, 0), peak, cap, kv_share, peak_frac, device
    )


def ids(findings: list[Finding]) -> set[str]:
    return {f.id for f in findings}


def by_id(findings: list[Finding], id_: str) -> Finding:
    return next(f for f in findings if f.id == id_)


GPU_OK = {"gpu.util_mean": 0.65}  # neither high nor low


@pytest.mark.parametrize("frac, fires", [(0.90, False), (0.9001, True)])
def test_peak_frac_threshold(frac: float, fires: bool) -> None:
    f = diagnose({}, GPU_OK, bd(peak_frac=frac), None)
    assert ("memory.peak_high" in ids(f)) is fires
    if fires:
        x = by_id(f, "memory.peak_high")
        assert x.severity == "critical" and x.checklist_ref == "§4"
        assert "90.0% > 90.0%" in x.evidence
        assert x.suggestion.index("FP8") < x.suggestion.index("KV-cache quantization") < x.suggestion.index("scale out")


def test_peak_frac_preallocating_engine_is_info() -> None:
    f = diagnose({}, GPU_OK, bd(peak_frac=0.91), None, {"kv_preallocated_frac": 0.9})
    x = by_id(f, "memory.peak_high")
    assert x.severity == "info" and "reserves 90.0% up front" in x.evidence
    f2 = diagnose({}, GPU_OK, bd(peak_frac=0.97), None, {"kv_preallocated_frac": 0.9})
    assert by_id(f2, "memory.peak_high").severity == "critical"


@pytest.mark.parametrize("share, fires", [(0.60, False), (0.61, True)])
def test_kv_share_threshold(share: float, fires: bool) -> None:
    f = diagnose({}, GPU_OK, bd(kv_share=share), None)
    assert ("memory.kv_share_high" in ids(f)) is fires
    if fires:
        assert "61.0% > 60.0%" in by_id(f, "memory.kv_share_high").evidence


@pytest.mark.parametrize(
    "tele, fires",
    [
        ({}, False),
        ({"engine.preemptions": 0.0}, False),
        ({"engine.preemptions": 1.0, "engine.kv_cache_usage_max": 0.99}, True),
    ],
)
def test_preemptions(tele: dict, fires: bool) -> None:
    f = diagnose({}, {**GPU_OK, **tele}, None, None)
    assert ("memory.preemptions" in ids(f)) is fires
    if fires:
        x = by_id(f, "memory.preemptions")
        assert x.severity == "critical" and "1 preemptions" in x.evidence and "99.0%" in x.evidence
        assert f[0].id == "memory.preemptions"  # critical first


def test_errors_at_full_memory() -> None:
    f = diagnose({"errors.rate": 0.05}, GPU_OK, bd(peak_frac=0.95), None)
    assert "memory.errors_at_full_memory" in ids(f)
    assert "memory.errors_at_full_memory" not in ids(diagnose({"errors.rate": 0.05}, GPU_OK, bd(0.5), None))


def test_memory_breakdown_finding_and_missing() -> None:
    f = diagnose({}, GPU_OK, bd(), None)
    x = by_id(f, "memory.breakdown")
    assert "weights 13.04 GiB" in x.evidence and "KV" in x.evidence and "capacity 80.00 GiB" in x.evidence
    assert "memory.not_evaluated" in ids(diagnose({}, GPU_OK, None, None))


def test_roofline_findings() -> None:
    r_head = decode_roofline(14e9, 0, 3.35e12, 0.0063)  # 1.51× floor
    r_floor = decode_roofline(14e9, 0, 3.35e12, 0.0062)  # 1.48× floor
    f = diagnose({}, {**GPU_OK, "gpu.dram_bw_util_mean": 0.7}, None, r_head)
    x = by_id(f, "roofline.headroom")
    assert (
        "floor 4.2 ms/token" in x.evidence
        and "1.51× floor" in x.evidence
        and "bandwidth utilization 70.0%" in x.evidence
    )
    assert "roofline.at_floor" in ids(diagnose({}, GPU_OK, None, r_floor))
    assert by_id(diagnose({}, GPU_OK, None, r_floor), "roofline.at_floor").suggestion.startswith("FP8")
    assert "roofline.floor" in ids(diagnose({}, GPU_OK, None, decode_roofline(14e9, 0, 3.35e12, None)))
    mfu = by_id(diagnose({}, GPU_OK, None, None, prefill_mfu_frac=0.42), "roofline.prefill_mfu")
    assert "42.0%" in mfu.evidence


LAT = {"ttft.p50": 0.1, "ttft.p95": 0.2, "tpot.p95": 0.05}


@pytest.mark.parametrize(
    "util, lat_target, fires",
    [
        (0.80, 0.04, True),  # util at the high edge, TPOT over target
        (0.79, 0.04, False),  # util just below high
        (0.95, 0.06, False),  # latency within target
    ],
)
def test_busy_and_slow(util: float, lat_target: float, fires: bool) -> None:
    f = diagnose(LAT, {"gpu.util_mean": util}, None, None, targets={"tpot.p95": lat_target})
    assert ("gpu.busy_and_slow" in ids(f)) is fires
    if fires:
        assert "tpot.p95 50.0 ms > 40.0 ms" in by_id(f, "gpu.busy_and_slow").evidence


def test_busy_and_slow_without_targets_uses_ttft_tail() -> None:
    tail = {"ttft.p50": 0.1, "ttft.p95": 0.35}
    f = diagnose(tail, {"gpu.util_mean": 0.9}, None, None)
    assert "TTFT P95/P50" in by_id(f, "gpu.busy_and_slow").evidence
    assert "gpu.busy_and_slow" not in ids(
        diagnose({"ttft.p50": 0.1, "ttft.p95": 0.25}, {"gpu.util_mean": 0.9}, None, None)
    )


def test_gpm_sm_activity_preferred_over_nvml_util() -> None:
    f = diagnose(LAT, {"gpu.util_mean": 0.99, "gpu.sm_activity_mean": 0.3}, None, None, targets={"tpot.p95": 0.01})
    # NVML util says busy; SM activity says idle -> the low-util rules apply
    assert "gpu.busy_and_slow" not in ids(f)
    assert "SM activity (GPM) 30.0%" in by_id(f, "gpu.low_util_undecided").evidence


@pytest.mark.parametrize(
    "util, tok_s, expect",
    [
        (0.49, 1000.0, "gpu.batch_too_small"),
        (0.49, 3000.0, "gpu.bandwidth_bound"),
        (0.50, 1000.0, None),  # at the low edge: not low
    ],
)
def test_low_util_rules_with_throughput_target(util: float, tok_s: float, expect: str | None) -> None:
    f = diagnose(
        {"throughput.output_tok_s": tok_s},
        {"gpu.util_mean": util},
        None,
        None,
        targets={"throughput.output_tok_s": 3000},
    )
    got = ids(f) & {"gpu.batch_too_small", "gpu.bandwidth_bound", "gpu.low_util_undecided"}
    assert got == ({expect} if expect else set())
    if expect == "gpu.batch_too_small":
        x = by_id(f, expect)
        assert "GPU utilization (NVML) 49.0% < 50.0%" in x.evidence and "1000 < target 3000" in x.evidence
        assert x.suggestion.startswith("turn continuous batching on")


def test_low_util_rules_from_roofline_without_targets() -> None:
    near = decode_roofline(14e9, 0, 3.35e12, 0.0083)  # 50.4% of roofline
    far = decode_roofline(14e9, 0, 3.35e12, 0.0090)
    assert "gpu.bandwidth_bound" in ids(diagnose({}, {"gpu.util_mean": 0.3}, None, near))
    assert "gpu.batch_too_small" in ids(diagnose({}, {"gpu.util_mean": 0.3}, None, far))
    assert "gpu.low_util_undecided" in ids(diagnose({}, {"gpu.util_mean": 0.3}, None, None))


@pytest.mark.parametrize(
    "tele, fires",
    [
        ({"engine.waiting_nonzero_frac": 0.5, "engine.waiting_mean": 2.0, "engine.waiting_max": 5.0}, True),
        ({"engine.waiting_nonzero_frac": 0.49, "engine.waiting_mean": 2.0, "engine.waiting_max": 5.0}, False),
        ({"engine.waiting_mean": 1.0, "engine.waiting_max": 3.0}, True),  # no per-sample share: mean ≥ 1
        ({"engine.waiting_mean": 0.9, "engine.waiting_max": 3.0}, False),
        ({}, False),
    ],
)
def test_queue_persistent(tele: dict, fires: bool) -> None:
    f = diagnose({}, {**GPU_OK, **tele}, None, None)
    assert ("queue.persistent" in ids(f)) is fires
    if fires and "engine.waiting_nonzero_frac" in tele:
        assert by_id(f, "queue.persistent").evidence == "waiting queue > 0 in 50.0% of samples; mean 2.0, max 5 waiting"


def test_cpu_run_no_gpu_rules_but_memory_and_queue() -> None:
    host = MemoryBreakdown(0.6e9, 24576, 2048, 24576 * 2048, 0.3e9, 1e9, 8e9, 0.05, 0.125, "host")
    tele = {
        "proc.rss_peak_bytes": 1e9,
        "engine.waiting_mean": 1.5,
        "engine.waiting_max": 3.0,
        "engine.waiting_nonzero_frac": 0.8,
    }
    f = diagnose(LAT, tele, host, None, notes=["no NVML: NVML Shared Library Not Found"])
    assert {"memory.breakdown", "queue.persistent", "gpu.not_evaluated"} <= ids(f)
    x = by_id(f, "gpu.not_evaluated")
    assert x.evidence.startswith("no NVML: NVML Shared Library Not Found")
    assert "host memory (RSS)" in by_id(f, "memory.breakdown").title
    assert not ids(f) & {"gpu.busy_and_slow", "gpu.batch_too_small", "gpu.bandwidth_bound"}


def test_scheduler_checks() -> None:
    f = diagnose(
        {},
        GPU_OK,
        None,
        None,
        {
            "continuous_batching": False,
            "max_batch": 4,
            "concurrency": 8,
            "prefix_caching": False,
            "shared_prefix_tokens": 512,
        },
    )
    assert {"sched.no_continuous_batching", "sched.concurrency_over_batch", "sched.prefix_cache_off"} <= ids(f)
    assert "8 > max batch 4: 4 requests wait" in by_id(f, "sched.concurrency_over_batch").evidence
    f2 = diagnose(
        {},
        {**GPU_OK, "engine.prefix_cache_hit_rate": 0.02},
        None,
        None,
        {"prefix_caching": True, "shared_prefix_tokens": 512},
    )
    assert "sched.prefix_cache_misses" in ids(f2) and "sched.prefix_cache_off" not in ids(f2)


def test_findings_sorted_and_frozen() -> None:
    f = diagnose({}, {"gpu.util_mean": 0.3, "engine.preemptions": 2.0}, bd(peak_frac=0.95, kv_share=0.7), None)
    sev = [x.severity for x in f]
    assert sev == sorted(sev, key={"critical": 0, "warn": 1, "info": 2}.get)
    with pytest.raises(AttributeError):
        f[0].severity = "info"  # type: ignore[misc]


def test_thresholds_are_configurable() -> None:
    f = diagnose({}, GPU_OK, bd(peak_frac=0.85), None, thresholds=Thresholds(peak_frac=0.8))
    assert "memory.peak_high" in ids(f)


def test_targets_from_gates() -> None:
    gates = [
        Gate("ttft.p95", "<", 0.5, "ttft.p95 < 500ms"),
        Gate("throughput.output_tok_s", ">", 3000, "x"),
        Gate("cost.usd_per_1m_tokens", "<", 0.5, "y"),
        Gate("tpot.p95", ">", 0.01, "odd"),
    ]
    assert targets_from_gates(gates) == {"ttft.p95": 0.5, "throughput.output_tok_s": 3000}
