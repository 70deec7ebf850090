"""The embedded CPU engine: llama.cpp's server, a tiny random Llama GGUF, and the local image
`llmplay/llamacpp-cpu:local` imported from a minimal root filesystem (no registry). The server is the prebuilt one
(`llama_server`: PyPI's xllamacpp wheel, nothing compiled) where it runs, else llama-server built from the pinned
llama-cpp-python sdist. A llama-cpp-python release named explicitly is built from source as
`llmplay/llamacpp-cpu:VERSION`, with the same model, so a run can be retested on an older or newer llama.cpp.

Everything lands under the cache directory (default ~/.cache/llmplay), keyed by content hashes, so a
second run only checks files and the image label and takes seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from llmplay.engines.base import VERSION_LABEL
from llmplay.engines.llamacpp import CPU_IMAGE, CPU_IMAGE_REPO
from llmplay.errors import InfrastructureError
from llmplay.hashing import sha256_file
from llmplay.runtime import dockerd, llama_server
from llmplay.runtime.cache import Log, cache_lock, content_key, default_cache_dir, run_logged
from llmplay.runtime.llama_server import ServerFiles

if TYPE_CHECKING:
    from docker import DockerClient
    from gguf import GGUFReader, GGUFWriter

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
)
IMAGE_TAG = CPU_IMAGE  # the default image's tag, the one playbooks name
MODEL_IN_IMAGE = "/models/tiny.gguf"
CONTENT_LABEL = "llmplay.content"
VOCAB_FILE = "vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf"


# A few million parameters: 4 layers of width 256 with grouped-query attention (8 query heads sharing
# 2 KV heads), so KV-cache knobs have something to act on; embeddings tied to the output.
class ModelParams(TypedDict):
    """The tiny random-weight Llama's sizes, shared by its GGUF and its Hugging Face copy (runtime.hf_model)."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    rope_freq_base: float
    rms_eps: float
    init_std: float
    seed: int


MODEL_PARAMS: ModelParams = {
    "n_layer": 4,
    "n_embd": 256,
    "n_head": 8,
    "n_head_kv": 2,
    "n_ff": 688,
    "n_ctx_train": 8192,
    "rope_freq_base": 10000.0,
    "rms_eps": 1e-5,
    "init_std": 0.02,
    "seed": 0,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class CpuEngine:
    image: str  # tag, e.g. llmplay/llamacpp-cpu:local ("" when built without the image)
    image_id: str
    binary: Path  # host path of llama-server (the prebuilt one's launcher, or a binary built from source)
    model_path: Path  # host path of the GGUF
    model_in_image: str  # where the image holds it
    content_hash: str  # label on the image; changes when server, libraries or model change
    engine_version: str  # what the image's version label says, e.g. "xllamacpp 2026.10.11549, ggml 0.26.0"


def image_tag(version: str | None = None) -> str:
    """The default image keeps `:local`, so playbooks and archives naming it stay valid; a release built from
    source is tagged with its version."""
    return IMAGE_TAG if version is None else f"{CPU_IMAGE_REPO}:{version}"


def sdist_name(version: str = LLAMA_CPP_PYTHON_VERSION) -> str:
    return f"llama_cpp_python-{version}"


def build_with_docker(cache: Path, log: Log, build: Callable[[DockerClient], tuple[str, str]]) -> tuple[str, str]:
    """Run `build` (an image build: its id and content key) against a dockerd, installed and started first when
    this machine has none."""
    if dockerd.ping() is not None and shutil.which("dockerd") is None:
        _apt_install(["docker.io"], cache / "build.log", log)
    dockerd.ensure_dockerd(cache)
    client = dockerd.client()
    try:
        return build(client)
    finally:
        client.close()


def _apt_install(packages: list[str], log_path: Path, log: Log) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise InfrastructureError(
            f"missing {', '.join(packages)}; install them: sudo apt-get install -y {' '.join(packages)}"
        )
    log(f"installing {' '.join(packages)} with apt-get")
    env_prefix = ["env", "DEBIAN_FRONTEND=noninteractive"]
    if (
        subprocess.call(
            [*env_prefix, "apt-get", "install", "-y", *packages], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        != 0
    ):
        run_logged([*env_prefix, "apt-get", "update"], log_path, "apt-get update")
        run_logged(
            [*env_prefix, "apt-get", "install", "-y", *packages], log_path, f"apt-get install {' '.join(packages)}"
        )


# --- source -------------------------------------------------------------------------------------------


def sdist_path(cache: Path, log: Log = print, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The release's sdist, downloaded once with pip (source only, no dependencies)."""
    dest = cache / "sdist"
    tarball = dest / f"{sdist_name(version)}.tar.gz"
    with cache_lock(cache, "sdist"):
        if not tarball.exists():
            download = dest / f".download-{os.getpid()}"
            shutil.rmtree(download, ignore_errors=True)
            download.mkdir(parents=True)
            log(
                f"downloading llama-cpp-python=={version} sdist with pip (77 MB: llama.cpp source, the tiny model's tokenizer)"
            )
            try:
                run_logged(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        # The release itself as source, its build tools as wheels: with `:all:`, pip built each of
                        # them from source to read the sdist's metadata (over 15 minutes on a cold machine, not 17 s).
                        "--no-binary",
                        "llama-cpp-python",
                        f"llama-cpp-python=={version}",
                        "-d",
                        str(download),
                    ],
                    cache / "build.log",
                    "pip download",
                )
                (download / tarball.name).rename(tarball)  # whole or absent: never a half-written tarball
            finally:
                shutil.rmtree(download, ignore_errors=True)
    return tarball


def _extract(tarball: Path, dest: Path, prefix: str, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Extract members under `<sdist>/<prefix>` into dest; returns dest/<sdist>/<prefix>."""
    root = dest / sdist_name(version) / prefix
    marker = root.parent / f".extracted-{content_key(prefix)}"
    with cache_lock(dest, "extract"):
        if marker.exists():
            return root
        want = f"{sdist_name(version)}/{prefix}"
        with tarfile.open(tarball) as tf:
            members = [
                m
                for m in tf.getmembers()
                if (m.name == want or m.name.startswith(want + "/")) and not _extracted(dest / m.name, m)
            ]
            tf.extractall(dest, members=members, filter="data")
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return root


def _extracted(path: Path, member: tarfile.TarInfo) -> bool:
    """Already on disk from an earlier extraction (another prefix's tree holds it): writing it again would truncate a
    file another process may have mapped, the tokenizer's vocabulary for one (SIGBUS in its reader)."""
    if member.isdir():
        return path.is_dir()
    return member.isfile() and path.is_file() and path.stat().st_size == member.size


# --- llama-server -------------------------------------------------------------------------------------


def binary_path(cache: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return cache / "llama-server" / content_key(version, CMAKE_FLAGS) / "llama-server"


def build_llama_server(
    cache: Path, force: bool = False, log: Log = print, version: str = LLAMA_CPP_PYTHON_VERSION
) -> Path:
    """llama-server from the sdist's vendored llama.cpp: Release, static, portable (no -march=native)."""
    binary = binary_path(cache, version)
    if binary.exists() and not force:
        return binary
    for tool, pkg in (("cmake", "cmake"), ("c++", "g++"), ("make", "make")):
        if shutil.which(tool) is None:
            _apt_install([pkg], cache / "build.log", log)
    src = _extract(sdist_path(cache, log, version), cache / "src", "vendor/llama.cpp", version)
    build = cache / "build" / binary.parent.name
    log(f"building llama-server {version} (about 8 minutes on 2 cores); log: {cache / 'build.log'}")
    t0 = time.perf_counter()
    run_logged(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS], cache / "build.log", "cmake configure")
    run_logged(
        [
            "cmake",
            "--build",
            str(build),
            "--config",
            "Release",
            "--target",
            "llama-server",
            "-j",
            str(os.cpu_count() or 1),
        ],
        cache / "build.log",
        "cmake build",
    )
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(".tmp")
    shutil.copy2(build / "bin" / "llama-server", tmp)
    tmp.rename(binary)  # atomic: a half-copied binary never passes the cache check
    log(f"built llama-server in {time.perf_counter() - t0:.0f}s")
    return binary


# --- the tiny model -----------------------------------------------------------------------------------


def model_path(cache: Path) -> Path:
    return cache / "models" / f"tiny-{content_key(MODEL_PARAMS, VOCAB_FILE, CHAT_TEMPLATE)}.gguf"


def vocab_path(cache: Path, log: Log = print) -> Path:
    """llama.cpp's SPM vocabulary file, from the pinned sdist: the tiny model's tokenizer."""
    return _extract(sdist_path(cache, log), cache / "src", VOCAB_FILE)


def write_tiny_model(cache: Path, force: bool = False, log: Log = print) -> Path:
    """The CPU engine's model in the cache, written once (atomically) from MODEL_PARAMS."""
    path = model_path(cache)
    if path.exists() and not force:
        return path
    vocab_file = vocab_path(cache, log)
    # Set-up builds the default image and the upgrade tests' releases at once, and each writes this model first:
    # one writes it while the others wait, then find it (they would otherwise share the temporary file).
    with cache_lock(cache, "model"):
        if path.exists() and not force:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write_llama_gguf(tmp, vocab_file)
        tmp.rename(path)
    log(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return path


def write_llama_gguf(
    path: Path, vocab_file: Path, params: ModelParams = MODEL_PARAMS, chat_template: str = CHAT_TEMPLATE
) -> Path:
    """A loadable random-weight Llama GGUF (seeded, so the bytes are reproducible) with `vocab_file`'s tokenizer,
    so llama-server really tokenizes and decodes; `params` has MODEL_PARAMS's keys."""
    import gguf  # deferred: an optional dependency (the `cpu` extra), needed only to write the model

    reader = gguf.GGUFReader(str(vocab_file))
    p = params
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    head_dim = p["n_embd"] // p["n_head"]
    rng = np.random.default_rng(p["seed"])

    def contents(w: GGUFWriter) -> None:
        _llama_contents(w, reader, p, n_vocab, head_dim, rng, chat_template)

    return write_gguf(path, "llmplay-tiny-random", contents)


def write_gguf(path: Path, name: str, contents: Callable[[GGUFWriter], None], architecture: str = "llama") -> Path:
    """The one GGUF writer: header, metadata and tensors in the order llama.cpp reads them; `contents(writer)`
    adds the metadata and tensors (tests pass their own, e.g. quantized, to check model facts)."""
    import gguf  # deferred: an optional dependency (the `cpu` extra), needed only to write a model

    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name(name)
    contents(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _llama_contents(
    w: GGUFWriter,
    reader: GGUFReader,
    p: ModelParams,
    n_vocab: int,
    head_dim: int,
    rng: np.random.Generator,
    chat_template: str,
) -> None:
    import gguf  # deferred: an optional dependency (the `cpu` extra), needed only to write the model

    w.add_context_length(p["n_ctx_train"])
    w.add_embedding_length(p["n_embd"])
    w.add_block_count(p["n_layer"])
    w.add_feed_forward_length(p["n_ff"])
    w.add_head_count(p["n_head"])
    w.add_head_count_kv(p["n_head_kv"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(p["rope_freq_base"])
    w.add_layer_norm_rms_eps(p["rms_eps"])
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    w.add_chat_template(chat_template)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * p["init_std"]).astype(np.float16)

    ones = np.ones(p["n_embd"], dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(n_vocab, p["n_embd"]))  # also the output projection (tied)
    w.add_tensor("output_norm.weight", ones)
    for i in range(p["n_layer"]):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(p["n_head"] * head_dim, p["n_embd"]))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(p["n_head_kv"] * head_dim, p["n_embd"]))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(p["n_head_kv"] * head_dim, p["n_embd"]))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(p["n_embd"], p["n_head"] * head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(p["n_ff"], p["n_embd"]))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(p["n_ff"], p["n_embd"]))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(p["n_embd"], p["n_ff"]))


# --- the image ----------------------------------------------------------------------------------------


def shared_libraries(*binaries: Path) -> list[Path]:
    """What the dynamic loader maps for `binaries` (libstdc++, libgomp, libc, ld-linux, ...), from ldd."""
    out = subprocess.run(["ldd", *map(str, binaries)], capture_output=True, text=True, check=True).stdout
    return sorted({Path(m.group(1)) for m in re.finditer(r"(/\S+)\s+\(0x", out)})


def _rootfs_tar(server: ServerFiles, model: Path, libs: list[Path], dest: Path) -> Path:
    """A tarball of the minimal root filesystem: /llama-server, the server's files and libraries at their paths,
    the model."""

    def add(tf: tarfile.TarFile, src: Path, arcname: str) -> None:
        info = tf.gettarinfo(str(src.resolve()), arcname=arcname.lstrip("/"))
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0  # the tarball's bytes depend only on the contents
        with open(src, "rb") as f:
            tf.addfile(info, f)

    def add_dir(tf: tarfile.TarFile, arcname: str, mode: int = 0o755) -> None:
        info = tarfile.TarInfo(arcname)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
        tf.addfile(info)

    with tarfile.open(dest, "w") as tf:
        for d in ("tmp",):
            add_dir(tf, d, 0o1777)
        add_dir(tf, "models")
        add(tf, server.executable, "llama-server")
        add(tf, model, MODEL_IN_IMAGE)
        for src, arcname in dict([*server.files, *((lib, str(lib)) for lib in libs)]).items():
            add(tf, src, arcname)
    return dest


def ggml_version(cache: Path, log: Log = print, version: str = LLAMA_CPP_PYTHON_VERSION) -> str | None:
    """The vendored ggml's release (ggml/CMakeLists.txt): the sdist carries no git metadata, so llama.cpp's own
    build number is 0 and its commit "unknown"; this and the llama-cpp-python release are what names the source.
    None where that ggml did not number its releases yet (llama-cpp-python 0.3.16's and older)."""
    src = _extract(sdist_path(cache, log, version), cache / "src", "vendor/llama.cpp/ggml/CMakeLists.txt", version)
    parts = dict(re.findall(r"set\(GGML_VERSION_(MAJOR|MINOR|PATCH)\s+(\d+)\)", src.read_text()))
    if not parts:
        return None
    return ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))


def source_server(binary: Path, cache: Path, log: Log = print, version: str = LLAMA_CPP_PYTHON_VERSION) -> ServerFiles:
    """A llama-server built from a llama-cpp-python release: the binary alone; its label names the source."""
    ggml = ggml_version(cache, log, version)
    described = f"llama-cpp-python {version}" + (f", ggml {ggml}" if ggml else "")
    return ServerFiles(binary, (), (binary,), described, ("llmplay.llama_cpp_python", version))


def build_image(
    client: DockerClient,
    server: ServerFiles,
    model: Path,
    tag_name: str,
    cache: Path,
    force: bool = False,
    log: Log = print,
) -> tuple[str, str]:
    """(image id, content hash); imports the image only when the tag's label differs from the contents."""
    import docker  # deferred: the docker SDK loads only when an image is built (not for --no-image)

    libs = shared_libraries(*server.elf)
    files = sorted({(str(src), arcname) for src, arcname in server.files} | {(str(lib), str(lib)) for lib in libs})
    content = content_key(
        [sha256_file(server.executable), sha256_file(model)] + [(arc, sha256_file(Path(src))) for src, arc in files],
        MODEL_IN_IMAGE,
        server.version,
        server.label,
    )
    if not force:
        try:
            image = client.images.get(tag_name)
            if (image.labels or {}).get(CONTENT_LABEL) == content:
                return image.id, content
        except docker.errors.ImageNotFound:
            pass
    log(f"importing image {tag_name} ({server.version}; content {content})")
    workdir = cache / "image"
    workdir.mkdir(parents=True, exist_ok=True)
    tar = _rootfs_tar(server, model, libs, workdir / f"rootfs-{content}.tar")
    repo, tag = tag_name.rsplit(":", 1)
    changes = [
        'ENTRYPOINT ["/llama-server"]',
        "EXPOSE 8080",
        f"LABEL {CONTENT_LABEL}={content}",
        f"LABEL {server.label[0]}={server.label[1]}",
        f'LABEL {VERSION_LABEL}="{server.version}"',
        "ENV LLAMA_ARG_HOST=0.0.0.0",
    ]
    try:
        client.api.import_image(src=str(tar), repository=repo, tag=tag, changes=changes)
    finally:
        tar.unlink(missing_ok=True)
    image = client.images.get(tag_name)
    (workdir / "image.json").write_text(json.dumps({"tag": tag_name, "id": image.id, "content": content}, indent=1))
    return image.id, content


def default_server(cache: Path, model: Path, force: bool = False, log: Log = print) -> ServerFiles:
    """The prebuilt server when it runs on this CPU; otherwise the pinned llama-cpp-python release, built from source
    (about 8 minutes on 2 cores, once)."""
    try:
        executable = llama_server.install(cache, force, log)
    except InfrastructureError as exc:  # no wheel for this platform, or pip could not fetch it
        failed: str | None = str(exc)
    else:
        failed = llama_server.check(executable, model, log)
        if failed is None:
            return llama_server.server_files(executable)
    log(f"the prebuilt llama.cpp server does not run here: {failed}; building llama-server from source instead")
    binary = build_llama_server(cache, force, log)
    return source_server(binary, cache, log)


def build_cpu_engine(
    cache_dir: Path | str | None = None,
    force: bool = False,
    *,
    with_image: bool = True,
    log: Log = print,
    version: str | None = None,
) -> CpuEngine:
    """Server, model and (unless with_image=False) the local image, each built only when missing or forced.
    Without `version`: the prebuilt server, as `:local`. With one: that llama-cpp-python release's vendored llama.cpp,
    built from source, as `:VERSION`. Every image embeds the same model (its tokenizer comes from the pinned sdist),
    so runs on two builds differ only in the engine."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    model = write_tiny_model(cache, force, log)
    if version is None:
        server = default_server(cache, model, force, log)
    else:
        server = source_server(build_llama_server(cache, force, log, version), cache, log, version)
    if not with_image:
        return CpuEngine("", "", server.executable, model, MODEL_IN_IMAGE, "", server.version)
    tag = image_tag(version)
    image_id, content = build_with_docker(
        cache, log, lambda client: build_image(client, server, model, tag, cache, force, log)
    )
    return CpuEngine(tag, image_id, server.executable, model, MODEL_IN_IMAGE, content, server.version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmplay.runtime.cpu_image", description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None, help="default: ~/.cache/llmplay (or $LLMPLAY_CACHE)")
    parser.add_argument("--force", action="store_true", help="rebuild the server, the model and the image")
    parser.add_argument("--no-image", action="store_true", help="server and model only (for the process runtime)")
    parser.add_argument(
        "--llama-cpp-python",
        dest="version",
        default=None,
        help="build this llama-cpp-python release's llama.cpp from source, tagged :VERSION (default: the prebuilt "
        "server, tagged :local)",
    )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        eng = build_cpu_engine(
            args.cache_dir,
            args.force,
            with_image=not args.no_image,
            log=lambda m: print(m, file=sys.stderr),
            version=args.version,
        )
    except InfrastructureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(
        f"image:  {eng.image or '(not built)'} {eng.image_id}\nserver: {eng.binary} ({eng.engine_version})"
        f"\nmodel:  {eng.model_path}\nready in {time.perf_counter() - t0:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
