"""The llama.cpp adapter: llama-server flags (common/arg.cpp, tools/server/README.md), /health, /props, llamacpp:* metrics."""

from __future__ import annotations

from collections.abc import Mapping

from llmplay.engines.base import (
    ContextLimit,
    Engine,
    MetricNames,
    RefusedValue,
    boolean_flag,
    flag_with_value,
    integer,
    one_of,
)
from llmplay.engines.knobs import Direction, KnobSpec, Remedy, Risk
from llmplay.spec import EngineSpec, Scalar

KIND = "llamacpp"
CPU_IMAGE_REPO = "llmplay/llamacpp-cpu"  # built locally by `llmplay engine build-cpu [--llama-cpp-python V]`
CPU_IMAGE = f"{CPU_IMAGE_REPO}:local"  # the pinned release


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
    raise RefusedValue("true, false or auto")


# common/arg.cpp's kv_cache_types, as ggml names them.
_check_kv_cache_dtype = one_of("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def _kv_cache_dtype(value: Scalar) -> list[str]:
    # Both halves of the cache; a quantized V cache needs flash attention, which `auto` enables on CPU.
    if value is None:
        return []
    _check_kv_cache_dtype(value)
    return ["--cache-type-k", str(value), "--cache-type-v", str(value)]


def _n_gpu_layers(value: Scalar) -> list[str]:
    # An exact layer count, or the words llama.cpp takes for "as many as fit" and "every layer".
    if value is None:
        return []
    if value in ("auto", "all") or (isinstance(value, int) and not isinstance(value, bool)):
        return ["--n-gpu-layers", str(value)]
    raise RefusedValue("an integer, auto or all")


_count = integer(minimum=1, auto=-1)


def _context_per_slot(args: Mapping[str, Scalar]) -> ContextLimit | None:
    # --ctx-size is the total over all slots: each of --parallel N slots holds ctx_size / N tokens.
    ctx = args.get("ctx_size")
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx <= 0:
        return None  # 0 or unset: the model's own context
    slots = args.get("parallel", args.get("max_num_seqs"))
    if isinstance(slots, int) and not isinstance(slots, bool) and slots > 1:
        return ContextLimit(ctx // slots, f"ctx_size {ctx} over {slots} slots")
    return ContextLimit(ctx, f"ctx_size {ctx}")


# Defaults as `llama-server --help` of the pinned release (llama-cpp-python 0.3.36's llama.cpp) prints them.
KNOB_MAP = (
    KnobSpec(
        Remedy.CONTINUOUS_BATCHING,
        "cont_batching",
        "bool",
        (True,),
        True,
        direction=Direction.ENABLE,
        already_when=True,
    ),
    KnobSpec(
        Remedy.PREFIX_CACHING, "prefix_caching", "bool", (True,), True, direction=Direction.ENABLE, already_when=True
    ),
    # Reuse of a cached prefix that moved (chunks of at least N tokens shifted into place); 0 turns it off.
    KnobSpec(Remedy.PREFIX_CACHING, "cache_reuse", "int", (64, 256), 0),
    KnobSpec(
        Remedy.MAX_BATCH,
        "parallel",
        "int",
        (2, 4, 8, 16),
        -1,
        Risk.MEMORY,
        default_note="-1: auto, 4 slots with a unified KV cache",
        also=("max_num_seqs",),
    ),
    KnobSpec(
        Remedy.CONCURRENCY_CAP,
        "parallel",
        "int",
        (1, 2, 4),
        -1,
        direction=Direction.LOWER,
        default_note="-1: auto",
        also=("max_num_seqs",),
    ),
    # --ctx-size is the KV cache over all slots: the memory a CPU engine gives it.
    KnobSpec(
        Remedy.KV_MEMORY,
        "ctx_size",
        "int",
        (4096, 8192, 16384),
        0,
        Risk.MEMORY,
        default_note="0: the model's trained context",
    ),
    # The logical batch is the prompt chunk one iteration processes.
    KnobSpec(Remedy.CHUNKED_PREFILL, "batch_size", "int", (256, 512, 1024), 2048, direction=Direction.LOWER),
    KnobSpec(
        Remedy.CONTEXT_LENGTH,
        "ctx_size",
        "int",
        (2048, 4096),
        0,
        direction=Direction.LOWER,
        default_note="0: the model's",
    ),
    # llama.cpp has no CUDA graphs switch of its own; its kernel choice is Flash Attention.
    KnobSpec(Remedy.CUDA_GRAPHS, "flash_attn", "choice", ("on",), "auto", direction=Direction.ENABLE),
    KnobSpec(Remedy.KV_DTYPE, "kv_cache_dtype", "choice", ("q8_0", "q4_0"), "f16", Risk.QUALITY, Direction.QUANTIZE),
    # Weights are quantized in the GGUF file itself: a quantized file is a `model` change the playbook names.
    KnobSpec(
        Remedy.WEIGHT_QUANTIZATION,
        "model",
        "choice",
        (),
        None,
        Risk.QUALITY,
        Direction.QUANTIZE,
        "the GGUF file's own type",
    ),
    # On a CPU the instance scales up with cores.
    KnobSpec(Remedy.SCALE_OUT, "threads", "int", (2, 4, 8), -1, Risk.HARDWARE, default_note="-1: every core"),
)

ENGINE = Engine(
    kind=KIND,
    default_image=CPU_IMAGE,
    default_port=8080,
    health_path="/health",  # 503 while the model loads, 200 when ready
    version_path="/props",
    knobs={
        "prefix_caching": boolean_flag(["--cache-prompt"], ["--no-cache-prompt"]),
        # llama.cpp reads -1 as "auto" for the slot and thread counts; 0 or -4 is a typo, not a request.
        "max_num_seqs": flag_with_value("--parallel", _count),  # engine-neutral name for the slot count
        "parallel": flag_with_value("--parallel", _count),
        "kv_cache_dtype": _kv_cache_dtype,
        "flash_attn": _flash_attn,
        "cont_batching": boolean_flag(["--cont-batching"], ["--no-cont-batching"]),
        "threads": flag_with_value("--threads", _count),
        # One HTTP thread per kept-alive connection: fewer threads than clients queue connections
        # (seconds of fake TTFT) and drop some, so size it above the load's concurrency.
        "threads_http": flag_with_value("--threads-http", _count),
        "batch_size": flag_with_value("--batch-size", integer(minimum=1)),
        "ubatch_size": flag_with_value("--ubatch-size", integer(minimum=1)),
        "ctx_size": flag_with_value("--ctx-size", integer(minimum=0)),  # total over all slots; 0: the model's
        "cache_reuse": flag_with_value("--cache-reuse", integer(minimum=0)),
        "n_gpu_layers": _n_gpu_layers,
        "metrics": boolean_flag(["--metrics"], []),
    },
    base_command=_base,
    context_tokens=_context_per_slot,
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
    knob_map=KNOB_MAP,
    model_in_cpu_image=True,
)
