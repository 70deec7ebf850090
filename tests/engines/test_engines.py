"""Engine adapters: the exact argv every knob renders to, per engine; unknown knobs; the registry."""

from __future__ import annotations

import pytest

from llmplay.engines import ENGINES, get_engine
from llmplay.engines.base import BadKnobValue, UnknownKnob
from llmplay.errors import PlaybookError
from llmplay.spec import EngineSpec, frozen_map


def argv(kind: str, **knobs: object) -> list[str]:
    """The flags after the base command (model/host/port), for these knobs in this order."""
    engine = get_engine(kind)
    plain = engine.server_args(EngineSpec(kind, "/models"))
    full = engine.server_args(EngineSpec(kind, "/models", args=frozen_map(knobs)))
    assert full[: len(plain)] == plain
    return full[len(plain) :]


def test_registry_and_unknown_kind() -> None:
    assert list(ENGINES) == ["vllm", "sglang", "tgi", "trtllm", "llamacpp"]
    with pytest.raises(PlaybookError) as info:
        get_engine("vlm")
    assert str(info.value) == "unknown engine kind 'vlm'; expected one of: vllm, sglang, tgi, trtllm, llamacpp"


VLLM = {
    "prefix_caching": (True, ["--enable-prefix-caching"]),
    "max_num_seqs": (256, ["--max-num-seqs", "256"]),
    "kv_cache_dtype": ("fp8", ["--kv-cache-dtype", "fp8"]),
    "quantization": ("fp8", ["--quantization", "fp8"]),
    "tensor_parallel": (2, ["--tensor-parallel-size", "2"]),
    "cuda_graphs": (False, ["--enforce-eager"]),
    "max_model_len": (8192, ["--max-model-len", "8192"]),
    "gpu_memory_utilization": (0.9, ["--gpu-memory-utilization", "0.9"]),
    "max_num_batched_tokens": (16384, ["--max-num-batched-tokens", "16384"]),
}
SGLANG = {
    "prefix_caching": (False, ["--disable-radix-cache"]),
    "max_num_seqs": (256, ["--max-running-requests", "256"]),
    "kv_cache_dtype": ("fp8_e5m2", ["--kv-cache-dtype", "fp8_e5m2"]),
    "quantization": ("fp8", ["--quantization", "fp8"]),
    "tensor_parallel": (2, ["--tp-size", "2"]),
    "cuda_graphs": (False, ["--disable-cuda-graph"]),
    "max_model_len": (8192, ["--context-length", "8192"]),
    "gpu_memory_utilization": (0.85, ["--mem-fraction-static", "0.85"]),
    "max_num_batched_tokens": (8192, ["--chunked-prefill-size", "8192"]),
}
TGI = {
    "max_num_seqs": (256, ["--max-concurrent-requests", "256"]),
    "kv_cache_dtype": ("fp8_e5m2", ["--kv-cache-dtype", "fp8_e5m2"]),
    "quantization": ("fp8", ["--quantize", "fp8"]),
    "tensor_parallel": (2, ["--num-shard", "2"]),
    "cuda_graphs": (False, ["--cuda-graphs", "0"]),
    "max_model_len": (8192, ["--max-total-tokens", "8192"]),
    "gpu_memory_utilization": (0.9, ["--cuda-memory-fraction", "0.9"]),
    "max_num_batched_tokens": (4096, ["--max-batch-prefill-tokens", "4096"]),
}
TRTLLM = {
    "max_num_seqs": (64, ["--max_batch_size", "64"]),
    "max_num_batched_tokens": (8192, ["--max_num_tokens", "8192"]),
    "max_model_len": (4096, ["--max_seq_len", "4096"]),
    "tensor_parallel": (2, ["--tp_size", "2"]),
    "gpu_memory_utilization": (0.9, ["--kv_cache_free_gpu_memory_fraction", "0.9"]),
}
LLAMACPP = {
    "prefix_caching": (False, ["--no-cache-prompt"]),
    "max_num_seqs": (4, ["--parallel", "4"]),
    "parallel": (4, ["--parallel", "4"]),
    "kv_cache_dtype": ("q8_0", ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]),
    "flash_attn": (True, ["--flash-attn", "on"]),
    "cont_batching": (False, ["--no-cont-batching"]),
    "threads": (2, ["--threads", "2"]),
    "threads_http": (16, ["--threads-http", "16"]),
    "batch_size": (1024, ["--batch-size", "1024"]),
    "ubatch_size": (256, ["--ubatch-size", "256"]),
    "ctx_size": (4096, ["--ctx-size", "4096"]),
    "cache_reuse": (64, ["--cache-reuse", "64"]),
    "n_gpu_layers": (99, ["--n-gpu-layers", "99"]),
    "metrics": (True, ["--metrics"]),
}
TABLES = {"vllm": VLLM, "sglang": SGLANG, "tgi": TGI, "trtllm": TRTLLM, "llamacpp": LLAMACPP}


@pytest.mark.parametrize("kind", TABLES)
def test_every_knob_is_pinned(kind: str) -> None:
    table = TABLES[kind]
    assert sorted(table) == get_engine(kind).known_knobs()  # no knob without a pinned rendering
    for knob, (value, expected) in table.items():
        assert argv(kind, **{knob: value}) == expected, knob
        assert argv(kind, **{knob: None}) == [], knob  # None: the engine's default


@pytest.mark.parametrize(
    "kind,knob,expected",
    [
        ("vllm", "prefix_caching", ["--no-enable-prefix-caching"]),
        ("vllm", "cuda_graphs", []),  # on by default; there is no portable flag to say so
        ("sglang", "prefix_caching", []),
        ("sglang", "cuda_graphs", []),
        ("tgi", "cuda_graphs", []),
        ("llamacpp", "prefix_caching", ["--cache-prompt"]),
        ("llamacpp", "flash_attn", ["--flash-attn", "off"]),
        ("llamacpp", "cont_batching", ["--cont-batching"]),
        ("llamacpp", "metrics", []),
    ],
)
def test_the_other_side_of_each_boolean_flag(kind: str, knob: str, expected: list[str]) -> None:
    value = not TABLES[kind][knob][0]
    assert argv(kind, **{knob: value}) == expected


def test_flash_attn_auto_and_bad_values() -> None:
    assert argv("llamacpp", flash_attn="auto") == ["--flash-attn", "auto"]
    with pytest.raises(
        BadKnobValue, match=r"engine 'llamacpp' knob 'flash_attn': found 'yes', expected true, false or auto"
    ):
        argv("llamacpp", flash_attn="yes")
    with pytest.raises(BadKnobValue, match="expected true or false"):
        argv("vllm", prefix_caching="on")


@pytest.mark.parametrize(
    "kind,knob,value,expected",
    [
        ("vllm", "max_num_seqs", True, "an integer >= 1"),  # YAML `true` is not the integer 1
        ("vllm", "max_num_seqs", "256", "an integer >= 1"),
        ("vllm", "gpu_memory_utilization", 0, "a number > 0 and <= 1"),
        ("vllm", "quantization", [1], "a single value (text or a number)"),
        ("sglang", "kv_cache_dtype", "fp8", "one of auto, fp8_e5m2, fp8_e4m3"),
        ("tgi", "kv_cache_dtype", "fp8", "one of fp8_e4m3fn, fp8_e5m2"),
        ("trtllm", "tensor_parallel", 1.0, "an integer >= 1"),
        ("llamacpp", "n_gpu_layers", "some", "an integer, auto or all"),
        ("llamacpp", "ctx_size", -1, "an integer >= 0"),
    ],
)
def test_values_the_engine_would_refuse(kind: str, knob: str, value: object, expected: str) -> None:
    with pytest.raises(BadKnobValue) as info:
        get_engine(kind).check_value(knob, value)  # type: ignore[arg-type]
    assert (info.value.engine, info.value.knob, info.value.expected) == (kind, knob, expected)


def test_values_beyond_the_pinned_ones() -> None:
    assert argv("llamacpp", n_gpu_layers="all") == ["--n-gpu-layers", "all"]
    assert argv("llamacpp", parallel=-1) == ["--parallel", "-1"]  # llama.cpp's "auto"
    assert argv("sglang", max_num_batched_tokens=-1) == ["--chunked-prefill-size", "-1"]  # no chunked prefill
    assert argv("vllm", quantization="awq_marlin") == ["--quantization", "awq_marlin"]  # not checked: grows per release
    assert argv("vllm", gpu_memory_utilization=1) == ["--gpu-memory-utilization", "1"]


def test_base_commands() -> None:
    spec = EngineSpec("vllm", "/models", served_model_name="llama-3-8b")
    assert get_engine("vllm").command(spec) == [
        "--model",
        "/models",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--served-model-name",
        "llama-3-8b",
    ]
    assert get_engine("sglang").command(EngineSpec("sglang", "/models"), 30001) == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models",
        "--host",
        "0.0.0.0",
        "--port",
        "30001",
        "--enable-metrics",
    ]
    assert get_engine("tgi").command(EngineSpec("tgi", "/models")) == [
        "--model-id",
        "/models",
        "--hostname",
        "0.0.0.0",
        "--port",
        "80",
    ]
    assert get_engine("trtllm").command(EngineSpec("trtllm", "/models")) == [
        "trtllm-serve",
        "/models",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    assert get_engine("llamacpp").command(
        EngineSpec("llamacpp", "/models/tiny.gguf", served_model_name="tiny", extra_args=("--seed", "1"))
    ) == ["--model", "/models/tiny.gguf", "--host", "0.0.0.0", "--port", "8080", "--alias", "tiny", "--seed", "1"]


def test_knobs_render_in_playbook_order_then_extra_args() -> None:
    spec = EngineSpec("llamacpp", "/m.gguf", args=frozen_map({"threads": 2, "parallel": 4}), extra_args=("-v",))
    assert get_engine("llamacpp").server_args(spec, 9000)[-5:] == ["--threads", "2", "--parallel", "4", "-v"]


def test_process_argv() -> None:
    eng = get_engine("llamacpp")
    assert eng.process_argv(EngineSpec("llamacpp", "/m.gguf", executable="/opt/llama server"), 1)[:1] == ["/opt/llama"]
    assert eng.process_argv(EngineSpec("llamacpp", "/m.gguf"), 1)[0] == "llama-server"
    assert get_engine("vllm").process_argv(EngineSpec("vllm", "m"), 1)[:3] == [
        "python3",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert get_engine("sglang").process_argv(EngineSpec("sglang", "m"), 1)[:3] == [
        "python3",
        "-m",
        "sglang.launch_server",
    ]


@pytest.mark.parametrize("kind", TABLES)
def test_unknown_knob_lists_the_known_ones(kind: str) -> None:
    engine = get_engine(kind)
    with pytest.raises(UnknownKnob) as info:
        engine.command(EngineSpec(kind, "/models", args=frozen_map({"paralel": 4})))
    assert str(info.value) == f"engine '{kind}' has no knob 'paralel'; known knobs: {', '.join(engine.known_knobs())}"


def test_health_version_and_metric_names() -> None:
    facts = {k: (e.default_port, e.health_path, e.version_path, e.version_field) for k, e in ENGINES.items()}
    assert facts == {
        "vllm": (8000, "/health", "/version", "version"),
        "sglang": (30000, "/health", "/get_server_info", "version"),
        "tgi": (80, "/health", "/info", "version"),
        "trtllm": (8000, "/health", "/version", "version"),
        "llamacpp": (8080, "/health", "/props", "build_info"),
    }
    vllm = ENGINES["vllm"].metric_names
    assert (vllm.kv_cache_usage, vllm.running, vllm.waiting, vllm.preemptions, vllm.prefix_cache_hits) == (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_hits_total",
    )
    sgl = ENGINES["sglang"].metric_names
    assert (sgl.kv_cache_usage, sgl.running, sgl.waiting) == (
        "sglang:token_usage",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    )
    assert (ENGINES["tgi"].metric_names.running, ENGINES["tgi"].metric_names.waiting) == (
        "tgi_batch_current_size",
        "tgi_queue_size",
    )
    lc = ENGINES["llamacpp"].metric_names
    assert (lc.running, lc.waiting, lc.prefix_cache_hits, lc.generation_tokens) == (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:prompt_tokens_cached_total",
        "llamacpp:tokens_predicted_total",
    )
    assert ENGINES["trtllm"].metric_names.running is None  # its /metrics is JSON, not Prometheus


def test_served_model() -> None:
    assert get_engine("vllm").served_model(EngineSpec("vllm", "/models", served_model_name="x")) == "x"
    assert get_engine("llamacpp").served_model(EngineSpec("llamacpp", "/models/tiny.gguf")) == "/models/tiny.gguf"


@pytest.mark.parametrize(
    ("version", "kv_cache", "prefix_hits"),
    [
        ("0.8.5", "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits_total"),
        ("v0.10.2.post2", "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits_total"),
        ("0.11.0", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"),
        ("0.32.0", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"),
        (None, "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"),
        ("not-a-version", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"),
    ],
)
def test_vllm_metric_names_follow_the_engine_version(version: str | None, kv_cache: str, prefix_hits: str) -> None:
    names = ENGINES["vllm"].at(version).metric_names
    assert (names.kv_cache_usage, names.prefix_cache_hits) == (kv_cache, prefix_hits)
