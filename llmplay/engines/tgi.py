"""The Text Generation Inference adapter: text-generation-launcher flags (launcher/src/main.rs), /health, /info, tgi_* metrics."""

from __future__ import annotations

from llmplay.engines.base import (
    Engine,
    MetricNames,
    RefusedValue,
    flag_with_value,
    fraction,
    integer,
    max_model_len,
    one_of,
)
from llmplay.engines.knobs import Direction, KnobSpec, Remedy, Risk
from llmplay.spec import EngineSpec, Scalar

KIND = "tgi"


def _base(spec: EngineSpec, port: int) -> list[str]:
    # TGI serves one model and ignores the request's `model`; the name only labels the endpoint.
    return ["--model-id", spec.model, "--hostname", "0.0.0.0", "--port", str(port)]


def _cuda_graphs(value: Scalar) -> list[str]:
    # `--cuda-graphs` takes the batch sizes to capture; "0" disables them, the default keeps them.
    if value is None or value is True:
        return []
    if value is False:
        return ["--cuda-graphs", "0"]
    raise RefusedValue("true or false")


# Defaults as `text-generation-launcher --help` of the default image prints them. Prefix caching is switched by
# the PREFIX_CACHING env var (on by default since TGI 3), so it is built in here rather than a knob.
KNOB_MAP = (
    KnobSpec(Remedy.MAX_BATCH, "max_num_seqs", "int", (128, 256, 512), 128, Risk.MEMORY),
    KnobSpec(Remedy.CONCURRENCY_CAP, "max_num_seqs", "int", (16, 32, 64), 128, direction=Direction.LOWER),
    KnobSpec(Remedy.KV_MEMORY, "gpu_memory_utilization", "fraction", (0.95, 1.0), 1.0, Risk.MEMORY),
    KnobSpec(Remedy.CHUNKED_PREFILL, "max_num_batched_tokens", "int", (2048, 4096, 8192), 4096),
    KnobSpec(Remedy.CONTEXT_LENGTH, "max_model_len", "int", (2048, 4096, 8192), None, direction=Direction.LOWER),
    KnobSpec(Remedy.CUDA_GRAPHS, "cuda_graphs", "bool", (True,), True, direction=Direction.ENABLE, already_when=True),
    KnobSpec(
        Remedy.KV_DTYPE, "kv_cache_dtype", "choice", ("fp8_e5m2", "fp8_e4m3fn"), None, Risk.QUALITY, Direction.QUANTIZE
    ),
    KnobSpec(
        Remedy.WEIGHT_QUANTIZATION, "quantization", "choice", ("fp8", "eetq"), None, Risk.QUALITY, Direction.QUANTIZE
    ),
    KnobSpec(Remedy.SCALE_OUT, "tensor_parallel", "int", (2, 4), 1, Risk.HARDWARE),
)

ENGINE = Engine(
    kind=KIND,
    # The image's ENTRYPOINT is text-generation-launcher.
    default_image="ghcr.io/huggingface/text-generation-inference:3.3.0",
    default_port=80,  # the image sets PORT=80; we pass --port explicitly anyway
    health_path="/health",
    version_path="/info",
    knobs={
        "max_num_seqs": flag_with_value("--max-concurrent-requests", integer(minimum=1)),
        # The launcher's KvCacheDtype and Quantization value enums.
        "kv_cache_dtype": flag_with_value("--kv-cache-dtype", one_of("fp8_e4m3fn", "fp8_e5m2")),
        "quantization": flag_with_value(
            "--quantize",
            one_of(
                "awq",
                "compressed-tensors",
                "eetq",
                "exl2",
                "gptq",
                "marlin",
                "bitsandbytes",
                "bitsandbytes-nf4",
                "bitsandbytes-fp4",
                "fp8",
            ),
        ),
        "tensor_parallel": flag_with_value("--num-shard", integer(minimum=1)),
        "cuda_graphs": _cuda_graphs,
        "max_model_len": flag_with_value("--max-total-tokens", integer(minimum=1)),
        "gpu_memory_utilization": flag_with_value("--cuda-memory-fraction", fraction),
        "max_num_batched_tokens": flag_with_value("--max-batch-prefill-tokens", integer(minimum=1)),
        # No prefix_caching knob: TGI switches it with the PREFIX_CACHING env var, not a flag
        # (set it through `env:`).
    },
    base_command=_base,
    context_tokens=max_model_len,
    metric_names=MetricNames(
        running="tgi_batch_current_size",
        waiting="tgi_queue_size",
    ),
    default_executable=("text-generation-launcher",),
    knob_map=KNOB_MAP,
    built_in=frozenset({Remedy.CONTINUOUS_BATCHING, Remedy.PREFIX_CACHING}),
)
