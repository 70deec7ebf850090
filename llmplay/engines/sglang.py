"""The SGLang adapter: launch_server flags (sglang/srt/server_args.py), /health, sglang:* metrics."""

from __future__ import annotations

from llmplay.engines.base import (
    Engine,
    MetricNames,
    boolean_flag,
    flag_with_value,
    fraction,
    integer,
    max_model_len,
    one_of,
)
from llmplay.engines.knobs import Direction, KnobSpec, Remedy, Risk
from llmplay.spec import EngineSpec

KIND = "sglang"


def _base(spec: EngineSpec, port: int) -> list[str]:
    # Metrics are off by default in SGLang; llmplay always samples them, and they cost ~nothing.
    argv = ["--model-path", spec.model, "--host", "0.0.0.0", "--port", str(port), "--enable-metrics"]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    return argv


# Defaults as `python -m sglang.launch_server --help` of the default image prints them (None: sized at start).
KNOB_MAP = (
    KnobSpec(
        Remedy.PREFIX_CACHING, "prefix_caching", "bool", (True,), True, direction=Direction.ENABLE, already_when=True
    ),
    KnobSpec(
        Remedy.MAX_BATCH, "max_num_seqs", "int", (64, 128, 256, 512), None, Risk.MEMORY, default_note="from the KV pool"
    ),
    KnobSpec(Remedy.CONCURRENCY_CAP, "max_num_seqs", "int", (16, 32, 64), None, direction=Direction.LOWER),
    KnobSpec(
        Remedy.KV_MEMORY,
        "gpu_memory_utilization",
        "fraction",
        (0.85, 0.9),
        None,
        Risk.MEMORY,
        default_note="by GPU size",
    ),
    KnobSpec(
        Remedy.CHUNKED_PREFILL, "max_num_batched_tokens", "int", (2048, 4096, 8192), None, default_note="by GPU size"
    ),
    KnobSpec(Remedy.CONTEXT_LENGTH, "max_model_len", "int", (2048, 4096, 8192), None, direction=Direction.LOWER),
    KnobSpec(Remedy.CUDA_GRAPHS, "cuda_graphs", "bool", (True,), True, direction=Direction.ENABLE, already_when=True),
    KnobSpec(Remedy.KV_DTYPE, "kv_cache_dtype", "choice", ("fp8_e5m2",), "auto", Risk.QUALITY, Direction.QUANTIZE),
    KnobSpec(Remedy.WEIGHT_QUANTIZATION, "quantization", "choice", ("fp8",), None, Risk.QUALITY, Direction.QUANTIZE),
    KnobSpec(Remedy.SCALE_OUT, "tensor_parallel", "int", (2, 4), 1, Risk.HARDWARE),
)

ENGINE = Engine(
    kind=KIND,
    default_image="lmsysorg/sglang:v0.4.6.post1-cu124",
    default_port=30000,
    health_path="/health",
    version_path="/get_server_info",
    knobs={
        # The radix cache (SGLang's prefix cache) is on by default; only a disable flag exists.
        "prefix_caching": boolean_flag([], ["--disable-radix-cache"]),
        "max_num_seqs": flag_with_value("--max-running-requests", integer(minimum=1)),
        # The choices of --kv-cache-dtype in the default image's release.
        "kv_cache_dtype": flag_with_value("--kv-cache-dtype", one_of("auto", "fp8_e5m2", "fp8_e4m3")),
        # Not checked: the methods change with each release, and the playbook picks the image.
        "quantization": flag_with_value("--quantization"),
        "tensor_parallel": flag_with_value("--tp-size", integer(minimum=1)),
        "cuda_graphs": boolean_flag([], ["--disable-cuda-graph"]),
        "max_model_len": flag_with_value("--context-length", integer(minimum=1)),
        "gpu_memory_utilization": flag_with_value("--mem-fraction-static", fraction),
        # The per-iteration prefill budget, vLLM's max_num_batched_tokens counterpart (-1 disables chunking).
        "max_num_batched_tokens": flag_with_value("--chunked-prefill-size", integer()),
    },
    base_command=_base,
    context_tokens=max_model_len,
    metric_names=MetricNames(
        kv_cache_usage="sglang:token_usage",
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        preemptions="sglang:num_retracted_requests_total",  # retractions; newer releases only
        prefix_cache_hits="sglang:cached_tokens_total",
        prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total",
    ),
    # The image has no server ENTRYPOINT; the documented command starts the module.
    entrypoint=("python3", "-m", "sglang.launch_server"),
    knob_map=KNOB_MAP,
    built_in=frozenset({Remedy.CONTINUOUS_BATCHING}),
    kv_preallocated_frac=0.9,
)
