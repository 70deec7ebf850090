"""The TensorRT-LLM adapter (trtllm-serve, tensorrt_llm/commands/serve.py): flags, /health, /version."""

from __future__ import annotations

from llmplay.engines.base import Engine, MetricNames, flag_with_value, fraction, integer, max_model_len
from llmplay.engines.knobs import Direction, KnobSpec, Remedy, Risk
from llmplay.spec import EngineSpec

KIND = "trtllm"


def _base(spec: EngineSpec, port: int) -> list[str]:
    # MODEL is positional; the served name is the model argument itself.
    return [spec.model, "--host", "0.0.0.0", "--port", str(port)]


# Defaults as `trtllm-serve --help` of the default image prints them. Block reuse (prefix caching), the KV dtype
# and CUDA graphs live in --extra_llm_api_options, not in knobs.
KNOB_MAP = (
    KnobSpec(Remedy.MAX_BATCH, "max_num_seqs", "int", (64, 128, 256, 512), 2048, Risk.MEMORY),
    KnobSpec(Remedy.CONCURRENCY_CAP, "max_num_seqs", "int", (16, 32, 64), 2048, direction=Direction.LOWER),
    KnobSpec(Remedy.KV_MEMORY, "gpu_memory_utilization", "fraction", (0.92, 0.95), 0.9, Risk.MEMORY),
    KnobSpec(Remedy.CHUNKED_PREFILL, "max_num_batched_tokens", "int", (2048, 4096, 8192), 8192),
    KnobSpec(Remedy.CONTEXT_LENGTH, "max_model_len", "int", (2048, 4096, 8192), None, direction=Direction.LOWER),
    KnobSpec(Remedy.SCALE_OUT, "tensor_parallel", "int", (2, 4), 1, Risk.HARDWARE),
)

ENGINE = Engine(
    kind=KIND,
    default_image="nvcr.io/nvidia/tensorrt-llm/release:0.20.0",
    default_port=8000,
    health_path="/health",
    version_path="/version",
    knobs={
        "max_num_seqs": flag_with_value("--max_batch_size", integer(minimum=1)),
        "max_num_batched_tokens": flag_with_value("--max_num_tokens", integer(minimum=1)),
        "max_model_len": flag_with_value("--max_seq_len", integer(minimum=1)),
        "tensor_parallel": flag_with_value("--tp_size", integer(minimum=1)),
        "gpu_memory_utilization": flag_with_value("--kv_cache_free_gpu_memory_fraction", fraction),
        # prefix caching (kv_cache_config.enable_block_reuse), KV dtype and CUDA graphs live in the
        # --extra_llm_api_options YAML, not in flags; pass that file through extra_args.
    },
    base_command=_base,
    context_tokens=max_model_len,
    # trtllm-serve's /metrics is JSON iteration stats, not Prometheus text.
    metric_names=MetricNames(),
    entrypoint=("trtllm-serve",),
    knob_map=KNOB_MAP,
    built_in=frozenset({Remedy.CONTINUOUS_BATCHING}),
    kv_preallocated_frac=0.9,
)
