"""The SGLang adapter: launch_server flags (sglang/srt/server_args.py), /health, sglang:* metrics."""
from __future__ import annotations

from llmplay.engines.base import Engine, MetricNames, switch, valued
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
        "prefix_caching": switch(KIND, "prefix_caching", [], ["--disable-radix-cache"]),
        "max_num_seqs": valued("--max-running-requests"),
        "kv_cache_dtype": valued("--kv-cache-dtype"),  # auto | fp8_e5m2 | fp8_e4m3
        "quantization": valued("--quantization"),
        "tensor_parallel": valued("--tp-size"),
        "cuda_graphs": switch(KIND, "cuda_graphs", [], ["--disable-cuda-graph"]),
        "max_model_len": valued("--context-length"),
        "gpu_memory_utilization": valued("--mem-fraction-static"),
        # The per-iteration prefill budget, vLLM's max_num_batched_tokens counterpart.
        "max_num_batched_tokens": valued("--chunked-prefill-size"),
    },
    base_command=_base,
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
