"""The llama.cpp adapter: llama-server flags (common/arg.cpp, tools/server/README.md), /health, /props, llamacpp:* metrics."""
from __future__ import annotations

from llmplay.engines.base import BadKnobValue, Engine, MetricNames, Scalar, switch, valued
from llmplay.spec import EngineSpec

KIND = "llamacpp"
CPU_IMAGE = "llmplay/llamacpp-cpu:local"  # built locally by `llmplay engine build-cpu`


def _base(spec: EngineSpec, port: int) -> list[str]:
    argv = ["--model", spec.model, "--host", "0.0.0.0", "--port", str(port)]
    if spec.served_model_name:
        argv += ["--alias", spec.served_model_name]
    return argv


def _flash_attn(value: Scalar) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):
        return ["--flash-attn", "on" if value else "off"]
    if value in ("on", "off", "auto"):
        return ["--flash-attn", str(value)]
    raise BadKnobValue(KIND, "flash_attn", value, "true, false or auto")


def _kv_cache_dtype(value: Scalar) -> list[str]:
    # Both halves of the cache; a quantized V cache needs flash attention, which `auto` enables on CPU.
    return [] if value is None else ["--cache-type-k", str(value), "--cache-type-v", str(value)]


ENGINE = Engine(
    kind=KIND,
    default_image=CPU_IMAGE,
    default_port=8080,
    health_path="/health",  # 503 while the model loads, 200 when ready
    version_path="/props",
    knobs={
        "prefix_caching": switch(KIND, "prefix_caching", ["--cache-prompt"], ["--no-cache-prompt"]),
        "max_num_seqs": valued("--parallel"),  # engine-neutral name for the slot count
        "parallel": valued("--parallel"),
        "kv_cache_dtype": _kv_cache_dtype,  # f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1
        "flash_attn": _flash_attn,
        "cont_batching": switch(KIND, "cont_batching", ["--cont-batching"], ["--no-cont-batching"]),
        "threads": valued("--threads"),
        # One HTTP thread per kept-alive connection: fewer threads than clients queue connections
        # (seconds of fake TTFT) and drop some, so size it above the load's concurrency.
        "threads_http": valued("--threads-http"),
        "batch_size": valued("--batch-size"),
        "ubatch_size": valued("--ubatch-size"),
        "ctx_size": valued("--ctx-size"),  # total over all slots
        "cache_reuse": valued("--cache-reuse"),
        "n_gpu_layers": valued("--n-gpu-layers"),
        "metrics": switch(KIND, "metrics", ["--metrics"], []),
    },
    base_command=_base,
    # Needs `metrics: true` (--metrics). This llama.cpp no longer exports a KV-cache usage gauge.
    metric_names=MetricNames(
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        prefix_cache_hits="llamacpp:prompt_tokens_cached_total",  # prompt tokens reused from the cache
        prompt_tokens="llamacpp:prompt_tokens_total",
        generation_tokens="llamacpp:tokens_predicted_total",
    ),
    default_executable=("llama-server",),
    version_field="build_info",  # e.g. b1-0c1e570
)
