"""The vLLM adapter: OpenAI server flags (vllm/engine/arg_utils.py), /health, /version, vllm:* metrics."""

from __future__ import annotations

from llmplay.engines.base import Engine, MetricNames, boolean_flag, flag_with_value, fraction, integer, one_of
from llmplay.spec import EngineSpec

KIND = "vllm"


def _base(spec: EngineSpec, port: int) -> list[str]:
    argv = ["--model", spec.model, "--host", "0.0.0.0", "--port", str(port)]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    return argv


ENGINE = Engine(
    kind=KIND,
    # The image's ENTRYPOINT is the OpenAI API server, so the command is flags only.
    default_image="vllm/vllm-openai:v0.8.5",
    default_port=8000,
    health_path="/health",
    version_path="/version",
    knobs={
        # BooleanOptionalAction since V1 turned prefix caching on by default.
        "prefix_caching": boolean_flag(["--enable-prefix-caching"], ["--no-enable-prefix-caching"]),
        "max_num_seqs": flag_with_value("--max-num-seqs", integer(minimum=1)),
        # The choices of --kv-cache-dtype in the default image's release.
        "kv_cache_dtype": flag_with_value("--kv-cache-dtype", one_of("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
        # Not checked: every vLLM release adds quantization methods, and the playbook picks the image.
        "quantization": flag_with_value("--quantization"),
        "tensor_parallel": flag_with_value("--tensor-parallel-size", integer(minimum=1)),
        # CUDA graphs are vLLM's default; only `--enforce-eager` (a store_true flag in older
        # releases, so no `--no-` form to rely on) turns them off.
        "cuda_graphs": boolean_flag([], ["--enforce-eager"]),
        "max_model_len": flag_with_value("--max-model-len", integer(minimum=1)),
        "gpu_memory_utilization": flag_with_value("--gpu-memory-utilization", fraction),
        "max_num_batched_tokens": flag_with_value("--max-num-batched-tokens", integer(minimum=1)),
    },
    base_command=_base,
    # Names as of v0.8.x, still exported (deprecated) up to 0.10; later releases call them
    # vllm:kv_cache_usage_perc and vllm:prefix_cache_{hits,queries}.
    metric_names=MetricNames(
        kv_cache_usage="vllm:gpu_cache_usage_perc",
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        preemptions="vllm:num_preemptions_total",
        prefix_cache_hits="vllm:gpu_prefix_cache_hits_total",
        prefix_cache_queries="vllm:gpu_prefix_cache_queries_total",
        prompt_tokens="vllm:prompt_tokens_total",
        generation_tokens="vllm:generation_tokens_total",
    ),
    default_executable=("python3", "-m", "vllm.entrypoints.openai.api_server"),
    version_log_pattern=r"vLLM API server version ([0-9][\w.+-]*)",
)
