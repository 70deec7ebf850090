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
from llmplay.spec import EngineSpec

KIND = "sglang"


def _base(spec: EngineSpec, port: int) -> list[str]:
    # Metrics are off by default in SGLang; llmplay always samples them, and they cost ~nothing.
    argv = ["--model-path", spec.model, "--host", "0.0.0.0", "--port", str(port), "--enable-metrics"]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    return argv


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
)
