"""The prebuilt llama-server (PyPI's xllamacpp wheel behind llama_server_launcher): llama.cpp's own parser reads the
adapter's command line, the image needs only the standard library, a CPU it does not run on sends the build to
source, and the check's outcome is kept per CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmplay.engines import get_engine
from llmplay.errors import InfrastructureError
from llmplay.runtime import cpu_image, llama_server
from llmplay.runtime.image_flags import flags_in_help
from llmplay.spec import EngineSpec, frozen_map

LLAMACPP = get_engine("llamacpp")


@pytest.fixture(scope="module")
def prebuilt(cpu_binary: Any) -> Path:
    if cpu_binary.engine_version.startswith("llama-cpp-python"):
        pytest.skip("the prebuilt server does not run on this CPU; the default image was built from source")
    return Path(cpu_binary.binary)


def test_every_flag_the_adapter_writes_is_one_llama_cpps_parser_accepts(prebuilt: Path) -> None:
    out = subprocess.run([str(prebuilt), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    accepted = flags_in_help(out.stdout + out.stderr)
    values: dict[str, Any] = {"prefix_caching": True, "kv_cache_dtype": "q8_0", "flash_attn": "on"}
    values |= {"cont_batching": False, "n_gpu_layers": 0, "metrics": True}
    args = {knob: values.get(knob, 2) for knob in LLAMACPP.knobs}
    spec = EngineSpec("llamacpp", "/models/tiny.gguf", served_model_name="tiny", args=frozen_map(args))
    written = {word for word in LLAMACPP.command(spec) if word.startswith("--")}
    assert len(written) > 15 and written <= accepted, sorted(written - accepted)
    negatives = {"--no-cache-prompt", "--no-cont-batching"}  # the knobs' other halves
    assert negatives <= accepted


def test_a_flag_llama_cpp_does_not_know_is_refused_in_its_words(prebuilt: Path) -> None:
    out = subprocess.run([str(prebuilt), "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "invalid argument: --no-such-flag" in out.stdout + out.stderr


def test_the_image_needs_only_this_pythons_standard_library(prebuilt: Path) -> None:
    modules, ggml = llama_server.describe(prebuilt)
    stdlib = Path(sys.base_prefix).resolve() / "lib"
    own = {prebuilt, prebuilt.with_name("xllamacpp.abi3.so")}  # the launcher and the extension beside it
    assert modules and all(Path(m).resolve().is_relative_to(stdlib) or Path(m) in own for m in modules)
    assert {"ctypes", "signal", "json"} <= {Path(m).stem for m in modules} | {Path(m).parent.name for m in modules}
    assert ggml.count(".") == 2
    files = llama_server.server_files(prebuilt)
    assert files.version == f"xllamacpp {llama_server.XLLAMACPP_VERSION}, ggml {ggml}"
    pycs = [arc for _, arc in files.files if arc.endswith(".pyc")]
    assert len(pycs) == sum(m.endswith(".py") for m in modules)  # every module compiled: no start compiles one


def test_a_server_killed_at_start_up_is_reported_and_the_outcome_kept(tmp_path: Path) -> None:
    executable = tmp_path / "llama-server"
    executable.write_text("#!/bin/sh\nkill -ILL $$\n")  # what an instruction this CPU lacks does
    executable.chmod(0o755)
    logged: list[str] = []

    failed = llama_server.check(executable, tmp_path / "tiny.gguf", logged.append)

    assert failed is not None and failed.startswith("it stopped at start-up (killed by SIGILL)")
    assert len(logged) == 1
    executable.write_text("#!/bin/sh\nexit 0\n")
    assert llama_server.check(executable, tmp_path / "tiny.gguf", logged.append) == failed  # kept for this CPU
    assert len(logged) == 1


def test_where_the_prebuilt_server_does_not_run_the_default_is_built_from_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "built-from-source"
    monkeypatch.setattr(llama_server, "install", lambda cache, force, log: tmp_path / "llama-server")
    monkeypatch.setattr(
        llama_server, "check", lambda executable, model, log: "it stopped at start-up (killed by SIGILL)"
    )
    monkeypatch.setattr(cpu_image, "build_llama_server", lambda cache, force, log: binary)
    monkeypatch.setattr(cpu_image, "ggml_version", lambda cache, log, version: "0.25.3")
    logged: list[str] = []

    server = cpu_image.default_server(tmp_path, tmp_path / "tiny.gguf", log=logged.append)

    assert server.executable == binary
    assert server.version == f"llama-cpp-python {cpu_image.LLAMA_CPP_PYTHON_VERSION}, ggml 0.25.3"
    assert logged == [
        "the prebuilt llama.cpp server does not run here: it stopped at start-up (killed by SIGILL); "
        "building llama-server from source instead"
    ]


def test_a_wheel_pip_cannot_fetch_sends_the_build_to_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_wheel(cache: Path, force: bool, log: Any) -> Path:
        raise InfrastructureError("pip download xllamacpp failed (exit code 1)")

    monkeypatch.setattr(llama_server, "install", no_wheel)
    monkeypatch.setattr(cpu_image, "build_llama_server", lambda cache, force, log: tmp_path / "built-from-source")
    monkeypatch.setattr(cpu_image, "ggml_version", lambda cache, log, version: "0.25.3")
    logged: list[str] = []

    server = cpu_image.default_server(tmp_path, tmp_path / "tiny.gguf", log=logged.append)

    assert server.executable == tmp_path / "built-from-source"
    assert logged[0].startswith("the prebuilt llama.cpp server does not run here: pip download xllamacpp failed")
