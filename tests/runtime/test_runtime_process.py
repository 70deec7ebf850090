"""The process runtime with the real llama-server binary, and a process tree that must die as a group."""

from __future__ import annotations

import http.server
import json
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmplay.engines import get_engine
from llmplay.errors import EngineStartError, InfrastructureError
from llmplay.runtime import live_runtimes, make_runtime
from llmplay.runtime.base import wait_healthy
from llmplay.runtime.labels import LABEL_RUN, LABEL_TRIAL
from llmplay.runtime.process import ProcessRuntime, host_model
from llmplay.spec import EngineSpec, frozen_map

LLAMACPP = get_engine("llamacpp")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def llama_spec(cpu_binary: Any) -> EngineSpec:
    return EngineSpec(
        "llamacpp",
        str(cpu_binary.model_path),
        executable=str(cpu_binary.binary),
        args=frozen_map({"threads": 2, "ctx_size": 1024, "metrics": True}),
        health_timeout_s=60.0,
    )


def test_start_stream_stop(llama_spec: EngineSpec, tmp_path: Path) -> None:
    runtime = make_runtime("process", log_dir=tmp_path)
    with runtime.start(llama_spec, LLAMACPP, {LABEL_RUN: "r1", LABEL_TRIAL: "3"}) as endpoint:
        pid = runtime.pid
        assert psutil.pid_exists(pid) and runtime.alive() and runtime in live_runtimes()
        body = {"model": endpoint.model, "prompt": "Hello", "max_tokens": 12, "stream": True, "ignore_eos": True}
        texts = []
        with httpx.stream("POST", endpoint.base_url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    texts += [c["text"] for c in json.loads(line[6:]).get("choices", []) if c.get("text")]
        assert len(texts) >= 2
        d = runtime.describe()
        assert d.engine_version.startswith("b") and d.pid == pid and d.image is None
        assert d.command[0] == llama_spec.executable and "--host" in d.command
        assert d.command[d.command.index("--host") + 1] == "127.0.0.1"  # loopback on the host
        assert Path(d.log_path).parent == tmp_path
    assert gone(pid)
    assert runtime not in live_runtimes() and not runtime.alive()
    assert "listening on" in runtime.logs()


def test_bad_flag_gives_exit_code_and_log_lines(llama_spec: EngineSpec, tmp_path: Path) -> None:
    spec = EngineSpec(**{**llama_spec.__dict__, "extra_args": ("--no-such-flag",)})
    with pytest.raises(EngineStartError) as info:
        ProcessRuntime(log_dir=tmp_path).start(spec, LLAMACPP)
    assert info.value.container_exit_code not in (None, 0)
    assert "--no-such-flag" in info.value.log_tail and "before becoming healthy" in str(info.value)


FAKE_SERVER = textwrap.dedent("""\
    import http.server, subprocess, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print(f"child {child.pid}", flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def test_the_whole_process_group_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    spec = EngineSpec("llamacpp", "m.gguf", executable=f"{sys.executable} {script}", health_timeout_s=20)
    runtime = ProcessRuntime(log_dir=tmp_path)
    with runtime.start(spec, LLAMACPP):
        child = int(runtime.logs().split()[1])
        assert psutil.pid_exists(child)
        assert psutil.Process(child).ppid() == runtime.pid
    assert gone(child)


def test_health_timeout_kills_the_process(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    spec = EngineSpec(
        "llamacpp", "m.gguf", executable=f"{sys.executable} {script}", health_path="/nope", health_timeout_s=1.0
    )
    runtime = ProcessRuntime(log_dir=tmp_path)
    # The last answer is a 404 once the fake server listens, an error class before: whether a busy machine starts
    # Python within the second is its noise (the 404's wording: test_a_health_timeout_names_the_last_answer).
    with pytest.raises(EngineStartError, match=r"not healthy at .*/nope after 1s \(last: (HTTP 404|\w+)\)"):
        runtime.start(spec, LLAMACPP)
    assert runtime.pid is not None and gone(runtime.pid)


def test_a_health_timeout_names_the_last_answer() -> None:
    """Against a server listening before the wait starts: the error says what it last answered."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/nope"
    try:
        # 3 s: each poll may take that long to be answered, ample for a server that already listens
        with pytest.raises(EngineStartError, match=rf"^engine not healthy at {url} after 3s \(last: HTTP 404\)"):
            wait_healthy(url, 3.0, lambda: None, lambda: "a log line", "engine", interval_s=0.1)
    finally:
        server.shutdown()
        server.server_close()


def test_missing_executable_is_a_clear_error(tmp_path: Path) -> None:
    spec = EngineSpec("llamacpp", "m.gguf", executable=str(tmp_path / "llama-server"))
    with pytest.raises(
        InfrastructureError,
        match=r"^executable '.*/llama-server' not found or not executable; "
        r"set engine.executable to the llamacpp server program$",
    ):
        ProcessRuntime().start(spec, LLAMACPP)


def test_model_dir_maps_container_paths_to_the_host(tmp_path: Path) -> None:
    spec = EngineSpec("llamacpp", "/models/tiny.gguf", model_dir=str(tmp_path))
    assert host_model(spec, LLAMACPP).model == str(tmp_path / "tiny.gguf")
    assert host_model(EngineSpec("vllm", "/models", model_dir=str(tmp_path)), get_engine("vllm")).model == str(tmp_path)
