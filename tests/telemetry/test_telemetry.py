"""Telemetry: sampler summary rules, NVML through the fake, /metrics against real HTTP servers, real processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from llmplay.diagnose.checklist import diagnose
from llmplay.diagnose.memory import memory_breakdown
from llmplay.diagnose.model_facts import model_facts_from_gguf
from llmplay.engines import get_engine
from llmplay.engines.base import MetricNames
from llmplay.runtime.cache import default_cache_dir
from llmplay.runtime.cpu_image import MODEL_PARAMS, vocab_path, write_llama_gguf
from llmplay.telemetry.nvml import NvmlSource
from llmplay.telemetry.proc import DockerStatsSource, ProcessSource, docker_memory_bytes
from llmplay.telemetry.prom import PrometheusSource, parse_metrics
from llmplay.telemetry.sampler import Reading, Sample, TelemetrySampler, TelemetrySeries, counter_delta, summarize
from llmplay_testing.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, FakeNvml

GiB = 2**30


class ListSource:
    """A scripted source (not a fake of an external system): returns the next prepared readings each tick."""

    name = "script"

    def __init__(self, ticks: list[list[Reading]], fail_on: int | None = None):
        self.ticks, self.fail_on, self.n = ticks, fail_on, 0
        self.notes: list[str] = []
        self.info: dict[str, str] = {}
        self.closed = False

    def start(self) -> bool:
        return True

    def read(self) -> list[Reading]:
        n, self.n = self.n, self.n + 1
        if n == self.fail_on:
            raise RuntimeError("boom")
        return self.ticks[min(n, len(self.ticks) - 1)]

    def close(self) -> None:
        self.closed = True


def test_sampler_context_manager_and_frame() -> None:
    src = ListSource([[Reading("engine.waiting", 1.0)], [Reading("engine.waiting", 0.0)]], fail_on=2)
    with TelemetrySampler([src], interval_s=0.01) as s:
        time.sleep(0.08)
    series = s.result()
    assert src.closed and series.duration_s >= 0.08
    assert s.result() is series
    assert any("read failed: RuntimeError: boom" in n for n in series.notes)
    assert len([n for n in series.notes if "boom" in n]) == 1
    df = series.to_frame()
    assert list(df.columns) == ["t_s", "source", "metric", "gpu", "value"]
    assert (df["t_s"].diff().dropna() >= 0).all()
    assert set(df["metric"]) == {"engine.waiting"}
    back = TelemetrySeries.from_frame(df, series.notes, duration_s=series.duration_s)
    assert back.summary() == series.summary()


def test_result_before_exit_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="after the with-block"):
        TelemetrySampler([]).result()


def test_summary_absent_metrics_are_absent() -> None:
    assert summarize([], 1.0) == {}
    only_engine = [Sample(0.0, "engine", "engine.running", 2.0)]
    assert set(summarize(only_engine, 1.0)) == {"engine.running_mean", "engine.running_max"}


def test_counter_delta_handles_restart() -> None:
    assert counter_delta([5, 7, 10]) == 5
    assert counter_delta([5, 7, 2, 4]) == 2 + 2 + 2  # drop to 2 = restart; counted from 0
    assert counter_delta([3]) == 0


def test_summary_values() -> None:
    rows = []
    for k, (used0, used1, waiting, pre, hits, q) in enumerate(
        [(10, 20, 0, 1, 0, 0), (30, 20, 2, 1, 50, 100), (40, 70, 3, 4, 80, 200)]
    ):
        t = float(k)
        rows += [
            Sample(t, "nvml", "memory.used_bytes", used0 * GiB, 0),
            Sample(t, "nvml", "memory.used_bytes", used1 * GiB, 1),
            Sample(t, "nvml", "memory.total_bytes", 80 * GiB, 0),
            Sample(t, "nvml", "memory.total_bytes", 80 * GiB, 1),
            Sample(t, "nvml", "gpu.util_frac", 0.5 + 0.1 * k, 0),
            Sample(t, "nvml", "gpu.power_w", 100.0, 0),
            Sample(t, "nvml", "gpu.power_w", 200.0, 1),
            Sample(t, "engine", "engine.waiting", waiting),
            Sample(t, "engine", "engine.preemptions_total", pre),
            Sample(t, "engine", "engine.prefix_cache_hits_total", hits),
            Sample(t, "engine", "engine.prefix_cache_queries_total", q),
            Sample(t, "proc", "proc.cpu_s", 10.0 + 2 * k),
            Sample(t, "proc", "proc.rss_bytes", 1e9 * (k + 1)),
        ]
    s = summarize(rows, 2.0)
    assert s["memory.peak_bytes"] == 110 * GiB  # tick 2, summed over GPUs
    assert s["memory.capacity_bytes"] == 160 * GiB
    assert s["memory.peak_frac"] == pytest.approx(70 / 80)  # fullest single GPU
    assert s["gpu.util_mean"] == pytest.approx(0.6)
    assert s["gpu.power_w_mean"] == pytest.approx(300.0)
    assert s["engine.waiting_mean"] == pytest.approx(5 / 3)
    assert s["engine.waiting_max"] == 3
    assert s["engine.waiting_nonzero_frac"] == pytest.approx(2 / 3)
    assert s["engine.preemptions"] == 3
    assert s["engine.prefix_cache_hit_rate"] == pytest.approx(80 / 200)
    assert s["engine.prefix_cache_hits"] == 80
    assert s["proc.cpu_s"] == 4.0 and s["proc.cpu_cores_mean"] == 2.0
    assert s["proc.rss_peak_bytes"] == 3e9
    for absent in ("gpu.sm_activity_mean", "gpu.dram_bw_util_mean", "engine.kv_cache_usage_max"):
        assert absent not in s
    # window: only the first tick -> a counter needs two readings, so preemptions are not measured
    w = TelemetrySeries(tuple(rows), duration_s=2.0).summary(0.0, 0.5)
    assert "engine.preemptions" not in w and w["engine.waiting_max"] == 0


# -- NVML ------------------------------------------------------------------------------


def test_nvml_through_fake() -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                used_bytes=[10 * GiB, 30 * GiB, 20 * GiB], util_pct=[90], sm_activity_pct=[70.0], dram_bw_pct=[55.0]
            ),
            FakeGpu(name="NVIDIA A100-SXM4-80GB", gpm=False, unsupported={"power"}),
        ]
    )
    src = NvmlSource(nvml=fake)
    assert src.start()
    ticks = [src.read() for _ in range(3)]
    src.close()
    assert fake.shutdowns == 1 and fake.samples_alive == 0
    assert src.gpu_names() == {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA A100-SXM4-80GB"}
    assert src.info["nvml.driver_version"] == "550.54.15"
    assert src.info["gpu0.memory_total_bytes"] == str(80 * GiB)
    first = {(r.metric, r.gpu): r.value for r in ticks[0]}
    assert first[("gpu.util_frac", 0)] == 0.9
    assert first[("gpu.power_w", 0)] == 300.0
    assert ("gpu.power_w", 1) not in first
    assert ("gpu.sm_activity_frac", 0) not in first  # GPM needs two samples
    later = {(r.metric, r.gpu): r.value for r in ticks[1]}
    assert later[("gpu.sm_activity_frac", 0)] == pytest.approx(0.7)
    assert later[("gpu.dram_bw_util_frac", 0)] == pytest.approx(0.55)
    assert ("gpu.sm_activity_frac", 1) not in later
    assert "NVML gpu1: GPM not supported (needs Hopper or newer)" in src.notes
    assert any(n.startswith("NVML gpu1: power not measured (Not Supported)") for n in src.notes)


def test_nvml_in_sampler_summary() -> None:
    fake = FakeNvml([FakeGpu(used_bytes=[10 * GiB, 76 * GiB], util_pct=[20, 40])])
    with TelemetrySampler([NvmlSource(nvml=fake)], interval_s=0.01) as s:
        time.sleep(0.05)
    summ = s.result().summary()
    assert summ["memory.peak_bytes"] == 76 * GiB
    assert summ["memory.peak_frac"] == pytest.approx(76 / 80)
    assert 0.2 <= summ["gpu.util_mean"] <= 0.4  # one sample or more: a stalled sampler may have taken only one
    assert summ["gpu.sm_activity_mean"] == pytest.approx(0.4)
    assert summ["gpu.dram_bw_util_mean"] == pytest.approx(0.6)
    assert s.result().info["gpu0.name"] == "NVIDIA H100 80GB HBM3"


def test_nvml_absent_gives_one_note_and_no_zeros() -> None:
    fake = FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    with TelemetrySampler([NvmlSource(nvml=fake)], interval_s=0.01) as s:
        time.sleep(0.03)
    series = s.result()
    assert series.samples == ()
    assert series.notes == ("no NVML: NVML Shared Library Not Found",)
    assert series.summary() == {}


def test_nvml_real_library() -> None:
    """The real pynvml: without a driver one note and no readings; with one, the GPU's name (benchmarks/gpu_check.py
    exercises the rest on a GPU)."""
    src = NvmlSource()
    if src.start():
        try:
            assert src.info["gpu0.name"] and src.read()
        finally:
            src.close()
    else:
        assert len(src.notes) == 1 and src.notes[0].startswith("no NVML: ")


def test_nvml_missing_gpu_index() -> None:
    src = NvmlSource(gpu_indices=[3], nvml=FakeNvml())
    assert not src.start()
    assert "NVML: GPU [3] not present (1 GPUs)" in src.notes
    assert "no NVML: no GPU to sample" in src.notes


def test_nvml_gpus_by_uuid_and_digit_string() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(name="NVIDIA L4"), FakeGpu()])
    src = NvmlSource(gpu_indices=["GPU-fake-1", "2", "GPU-nope"], nvml=fake)
    assert src.start()
    assert src.gpu_names() == {1: "NVIDIA L4", 2: "NVIDIA H100 80GB HBM3"}
    assert "NVML: GPU ['GPU-nope'] not present (3 GPUs)" in src.notes
    src.close()


# -- Prometheus ------------------------------------------------------------------------

VLLM_NAMES = MetricNames(
    kv_cache_usage="vllm:gpu_cache_usage_perc",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    preemptions="vllm:num_preemptions_total",  # adapters may include the suffix ...
    prefix_cache_hits="vllm:prefix_cache_hits",  # ... or not
    prefix_cache_queries="vllm:prefix_cache_queries",
)


@pytest.fixture
def prom_server():
    reg = CollectorRegistry()
    metrics = {
        "kv": Gauge("vllm:gpu_cache_usage_perc", "kv", ["model_name", "engine"], registry=reg),
        "running": Gauge("vllm:num_requests_running", "r", ["model_name"], registry=reg),
        "waiting": Gauge("vllm:num_requests_waiting", "w", ["model_name"], registry=reg),
        "pre": Counter("vllm:num_preemptions", "p", ["model_name"], registry=reg),
        "hits": Counter("vllm:prefix_cache_hits", "h", registry=reg),
        "queries": Counter("vllm:prefix_cache_queries", "q", registry=reg),
    }
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    try:
        yield f"http://127.0.0.1:{server.server_port}", metrics
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_prometheus_source_real_http(prom_server) -> None:
    url, m = prom_server
    m["kv"].labels("m", "0").set(0.25)
    m["kv"].labels("m", "1").set(0.5)
    m["running"].labels("m").set(4)
    m["waiting"].labels("m").set(0)
    m["pre"].labels("m").inc(3)
    src = PrometheusSource(url, VLLM_NAMES)
    assert src.start()
    first = {r.metric: r.value for r in src.read()}
    assert first == {
        "engine.kv_cache_usage_frac": 0.5,  # max over label sets
        "engine.running": 4.0,
        "engine.waiting": 0.0,
        "engine.preemptions_total": 3.0,
        "engine.prefix_cache_hits_total": 0.0,
        "engine.prefix_cache_queries_total": 0.0,
    }
    m["pre"].labels("m").inc(2)
    m["hits"].inc(30)
    m["queries"].inc(120)
    second = src.read()
    src.close()
    rows = [
        Sample(float(t), "engine", r.metric, r.value) for t, rs in enumerate([list(first_r(first)), second]) for r in rs
    ]
    s = summarize(rows, 1.0)
    assert s["engine.preemptions"] == 2
    assert s["engine.prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert s["engine.kv_cache_usage_max"] == 0.5
    assert src.notes == []


def first_r(d: dict[str, float]) -> list[Reading]:
    return [Reading(k, v) for k, v in d.items()]


def test_prometheus_source_in_sampler_notes_missing_and_unreachable(prom_server) -> None:
    url, m = prom_server
    m["running"].labels("m").set(1)
    names = MetricNames(running="vllm:num_requests_running", waiting="sglang:num_queue_reqs")
    with TelemetrySampler([PrometheusSource(url, names)], interval_s=0.01) as s:
        time.sleep(0.05)
    series = s.result()
    assert series.notes == ("engine /metrics has no sglang:num_queue_reqs (waiting not measured)",)
    summ = series.summary()
    assert "engine.running_mean" in summ and "engine.waiting_mean" not in summ

    dead = PrometheusSource("http://127.0.0.1:9", names, timeout_s=0.5)
    assert dead.start()
    assert dead.read() == [] and dead.read() == []
    dead.close()
    assert len(dead.notes) == 1 and dead.notes[0].startswith(
        "engine /metrics unreachable at http://127.0.0.1:9/metrics"
    )


def test_prometheus_source_without_names_does_not_start() -> None:
    src = PrometheusSource("http://127.0.0.1:9", MetricNames())
    assert not src.start()
    assert src.notes == ["engine metrics not measured: the adapter names no /metrics metrics"]


LLAMACPP_TEXT = textwrap.dedent("""\
    # HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
    # TYPE llamacpp:prompt_tokens_total counter
    llamacpp:prompt_tokens_total 120
    # HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
    # TYPE llamacpp:tokens_predicted_total counter
    llamacpp:tokens_predicted_total 64
    # HELP llamacpp:requests_processing Number of requests processing.
    # TYPE llamacpp:requests_processing gauge
    llamacpp:requests_processing 2
    # HELP llamacpp:requests_deferred Number of requests deferred.
    # TYPE llamacpp:requests_deferred gauge
    llamacpp:requests_deferred 1
    """)
LLAMACPP_NAMES = MetricNames(
    running="llamacpp:requests_processing",
    waiting="llamacpp:requests_deferred",
    prompt_tokens="llamacpp:prompt_tokens_total",
    generation_tokens="llamacpp:tokens_predicted_total",
)


def test_parse_llamacpp_text() -> None:
    readings, missing = parse_metrics(LLAMACPP_TEXT, LLAMACPP_NAMES)
    assert {r.metric: r.value for r in readings} == {
        "engine.prompt_tokens_total": 120,
        "engine.generation_tokens_total": 64,
        "engine.running": 2,
        "engine.waiting": 1,
    }
    assert missing == []


LLAMACPP_ADAPTER_NAMES = get_engine("llamacpp").metric_names


@pytest.mark.docker
def test_prometheus_source_real_llama_server(llama_endpoint) -> None:
    url = str(llama_endpoint.url).rstrip("/").removesuffix("/v1")
    src = PrometheusSource(url, LLAMACPP_ADAPTER_NAMES)
    assert src.start()
    readings = src.read()
    src.close()
    got = {r.metric for r in readings}  # llama_server_spec turns metrics on, so a 501 here is a failure
    assert {"engine.running", "engine.waiting"} <= got, src.notes


# -- processes ---------------------------------------------------------------------------

BUSY = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time\\nt=time.time()\\nwhile time.time()-t<3: pass"])
buf = bytearray(64 * 1024 * 1024)
print("allocated", flush=True)
t = time.time()
while time.time() - t < 3:
    pass
child.wait()
"""


def _tree_cpu_s(pid: int) -> float:
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(sum(t.cpu_times()[:2]) for t in tree)


def test_process_source_real_subprocess_tree() -> None:
    p = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        # Sampled once its 64 MiB are written, however long a loaded machine takes to get there.
        assert p.stdout is not None and p.stdout.readline().strip() == "allocated"
        before = _tree_cpu_s(p.pid)
        with TelemetrySampler([ProcessSource(p.pid)], interval_s=0.1) as s:
            time.sleep(0.8)
        after = _tree_cpu_s(p.pid)
        summ = s.result().summary()
    finally:
        p.kill()
        p.communicate()
    # What the tree really used while the sampler ran, as the kernel counts it: how much CPU two spinning processes
    # get on a shared 2-core machine is the machine's business, so only the bounds of that window are checked.
    assert 0.0 < summ["proc.cpu_s"] <= after - before + 1e-6
    assert summ["proc.rss_peak_bytes"] > 64 * 1024 * 1024
    assert s.result().info["proc.cmdline"].startswith(sys.executable)


def test_process_source_exited_process() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    src = ProcessSource(p.pid)
    assert not src.start()
    assert src.notes and src.notes[0].startswith(f"process {p.pid} not measured")


def test_docker_memory_matches_docker_stats() -> None:
    assert docker_memory_bytes({"usage": 1000, "stats": {"inactive_file": 300}}) == 700
    assert docker_memory_bytes({"usage": 1000, "stats": {"total_inactive_file": 100}}) == 900
    assert docker_memory_bytes({}) is None


@pytest.mark.docker
def test_docker_stats_source_real_container(docker_client, cpu_engine) -> None:
    """The CPU engine image llmplay builds (llama-server and the tiny model inside) as the measured container."""
    c = docker_client.containers.create(
        cpu_engine.image,
        ["-m", cpu_engine.model_in_image, "--metrics", "-t", "1", "-c", "512"],
        labels={"llmplay.test": "telemetry"},
    )
    try:
        c.start()
        with TelemetrySampler([DockerStatsSource(c)], interval_s=0.2) as s:
            time.sleep(1.5)
        series = s.result()
        summ = series.summary()
    finally:
        c.remove(force=True)
    # Docker's counters, read as Docker reports them: the container has used CPU since it started (its cumulative
    # counter), and the window's share of it is a counter delta, never negative. Whether llama-server was still
    # loading or already idle during the 1.5 s window (a delta above 0 or of 0) is the machine's speed.
    cpu = [x.value for x in series.samples if x.metric == "proc.cpu_s"]
    assert len(cpu) >= 2 and cpu[-1] > 0, series.samples
    assert summ["proc.cpu_s"] >= 0
    assert summ["proc.rss_peak_bytes"] > 0


# -- a real llama-server process (no Docker): /metrics, process tree, and the CPU diagnosis ------------


def test_tiny_model_writer_gives_the_shape_asked_for(cpu_binary, tmp_path: Path) -> None:
    """The one GGUF writer (the CPU engine's), at another shape: the diagnosis reads back what was written."""
    shape = {**MODEL_PARAMS, "n_layer": 2, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "n_ff": 128, "n_ctx_train": 512}
    model = write_llama_gguf(tmp_path / "small.gguf", vocab_path(default_cache_dir()), shape)
    f = model_facts_from_gguf(model)
    assert (f.name, f.architecture, f.layers, f.heads, f.kv_heads, f.head_dim) == (
        "llmplay-tiny-random",
        "llama",
        2,
        4,
        2,
        16,
    )
    assert f.weight_bytes == pytest.approx(model.stat().st_size, rel=0.2)  # f16 weights, then the vocabulary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_llama_server(cpu_binary):
    binary, model = cpu_binary.binary, cpu_binary.model_path
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics",
            "-c",
            "1024",
            "-np",
            "2",
            "-t",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # generous: how long a start takes beside another engine test is noise
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama-server did not become healthy (exit {proc.poll()})")
            time.sleep(0.1)
        yield url, proc, model
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _complete(url: str, n: int) -> None:
    httpx.post(
        url + "/completion",
        json={"prompt": "Tell me a story", "n_predict": n, "ignore_eos": True, "temperature": 0},
        timeout=120,
    ).raise_for_status()


def test_real_llama_server_metrics_and_process(tiny_llama_server) -> None:
    url, proc, model = tiny_llama_server
    sources = [PrometheusSource(url, LLAMACPP_ADAPTER_NAMES), ProcessSource(proc.pid)]
    with TelemetrySampler(sources, interval_s=0.05) as s:
        threads = [threading.Thread(target=_complete, args=(url, 300)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    series = s.result()
    summ = series.summary()
    assert summ["engine.generation_tokens"] == 900  # counter delta over the window: exactly our requests
    assert summ["engine.running_max"] >= 1
    assert summ["proc.cpu_s"] > 0 and summ["proc.rss_peak_bytes"] > model.stat().st_size
    assert not [n for n in series.notes if "unreachable" in n or "HTTP" in n], series.notes
    assert set(series.to_frame()["source"]) == {"engine", "proc"}


def test_real_llama_server_cpu_diagnosis(tiny_llama_server) -> None:
    url, proc, model = tiny_llama_server
    f = model_facts_from_gguf(model)
    assert f.layers > 0 and 0 < f.kv_heads <= f.heads and f.head_dim > 0
    assert f.weight_bytes == pytest.approx(model.stat().st_size, rel=0.1)
    with TelemetrySampler([NvmlSource(), ProcessSource(proc.pid)], interval_s=0.05) as s:
        _complete(url, 50)
    series = s.result()
    tele = series.summary()
    b = memory_breakdown(f, 2, 1024, tele["proc.rss_peak_bytes"], psutil.virtual_memory().total, device="host")
    findings = diagnose({}, tele, b, None, notes=series.notes)
    got = {x.id for x in findings}
    assert "memory.breakdown" in got
    if any(n.startswith("no NVML") for n in series.notes):
        assert "gpu.not_evaluated" in got
