"""The llama.cpp CPU images, the prebuilt default and any llama-cpp-python release built from source: their tags,
cache keys and labels, so two builds never share a binary or an image and the archive tells them apart. No compile,
no dockerd."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.engines.base import VERSION_LABEL
from llmplay.runtime import cpu_image
from llmplay.runtime.cpu_image import (
    CONTENT_LABEL,
    LLAMA_CPP_PYTHON_VERSION,
    CpuEngine,
    binary_path,
    build_image,
    ggml_version,
    image_tag,
    sdist_name,
    source_server,
)
from llmplay.runtime.docker import image_hint
from llmplay.runtime.llama_server import XLLAMACPP_VERSION, ServerFiles
from llmplay_testing.llamacpp_releases import OLDER, UPGRADE_RELEASES

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_image_keeps_the_local_tag_and_source_builds_are_tagged_with_their_release() -> None:
    assert image_tag() == "llmplay/llamacpp-cpu:local"
    assert image_tag(LLAMA_CPP_PYTHON_VERSION) == f"llmplay/llamacpp-cpu:{LLAMA_CPP_PYTHON_VERSION}"
    assert image_tag(OLDER) == f"llmplay/llamacpp-cpu:{OLDER}"
    assert (
        image_hint(f"llmplay/llamacpp-cpu:{OLDER}")
        == f"build it: `llmplay engine build-cpu --llama-cpp-python {OLDER}`"
    )


def test_each_release_has_its_own_sdist_and_binary_cache(tmp_path: Path) -> None:
    assert sdist_name(OLDER) == f"llama_cpp_python-{OLDER}"
    assert sdist_name() == f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    assert binary_path(tmp_path) == binary_path(tmp_path, LLAMA_CPP_PYTHON_VERSION)
    assert binary_path(tmp_path, OLDER) != binary_path(tmp_path)
    assert binary_path(tmp_path, OLDER).name == "llama-server"


class FakeImages:
    def __init__(self) -> None:
        self.imported: dict[str, dict[str, str]] = {}

    def get(self, tag: str) -> Any:
        import docker.errors

        if tag not in self.imported:
            raise docker.errors.ImageNotFound(tag)
        return type("Image", (), {"id": f"sha256:{tag}", "labels": self.imported[tag]})()


class FakeClient:
    """Records what `docker import` would be asked: the tag and the LABEL changes."""

    def __init__(self) -> None:
        self.images = FakeImages()
        self.api = self

    def import_image(self, *, src: str, repository: str, tag: str, changes: list[str]) -> None:
        labels = {}
        for change in changes:
            if change.startswith("LABEL "):
                key, _, value = change[len("LABEL ") :].partition("=")
                labels[key] = value.strip('"')
        self.images.imported[f"{repository}:{tag}"] = labels


@pytest.mark.parametrize("version", [LLAMA_CPP_PYTHON_VERSION, OLDER])
def test_a_source_build_is_tagged_and_labelled_with_its_release(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_image, "shared_libraries", lambda *binaries: [])
    monkeypatch.setattr(cpu_image, "ggml_version", lambda cache, log, version: f"ggml-of-{version}")
    binary, model = tmp_path / "llama-server", tmp_path / "tiny.gguf"
    binary.write_bytes(b"same binary")
    model.write_bytes(b"same model")
    client = FakeClient()

    server = source_server(binary, tmp_path, version=version)
    image_id, content = build_image(client, server, model, image_tag(version), tmp_path)

    labels = client.images.imported[image_tag(version)]
    assert image_id == f"sha256:{image_tag(version)}"
    assert labels[VERSION_LABEL] == f"llama-cpp-python {version}, ggml ggml-of-{version}"
    assert labels["llmplay.llama_cpp_python"] == version
    assert labels[CONTENT_LABEL] == content
    # The same bytes under another release's name are another image: the version is part of the content.
    other = OLDER if version == LLAMA_CPP_PYTHON_VERSION else LLAMA_CPP_PYTHON_VERSION
    assert build_image(client, source_server(binary, tmp_path, version=other), model, "x:y", tmp_path)[1] != content


def test_the_prebuilt_image_names_the_wheel_and_each_file_it_holds_is_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_image, "shared_libraries", lambda *binaries: [])
    launcher, extension, model = tmp_path / "llama-server", tmp_path / "ext.so", tmp_path / "tiny.gguf"
    for path in (launcher, extension, model):
        path.write_bytes(path.name.encode())
    version = f"xllamacpp {XLLAMACPP_VERSION}, ggml 0.26.0"
    server = ServerFiles(launcher, ((extension, "/ext.so"),), (extension,), version, ("llmplay.xllamacpp", "V"))
    client = FakeClient()

    _, content = build_image(client, server, model, image_tag(), tmp_path)

    labels = client.images.imported["llmplay/llamacpp-cpu:local"]
    assert labels[VERSION_LABEL] == version and labels["llmplay.xllamacpp"] == "V"
    assert labels[CONTENT_LABEL] == content
    extension.write_bytes(b"another build of the extension")
    assert build_image(client, server, model, image_tag(), tmp_path)[1] != content


def test_build_cpu_passes_the_release_through(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def fake_build(*, force: bool, version: str | None) -> CpuEngine:
        asked.append(version)
        return CpuEngine(image_tag(version), "id", Path("b"), Path("m"), "/models/tiny.gguf", "c", f"v {version}")

    monkeypatch.setattr("llmplay.commands.engine.build_cpu_engine", fake_build)
    runner = CliRunner()
    assert runner.invoke(cli, ["engine", "build-cpu", "--llama-cpp-python", OLDER]).exit_code == 0
    assert runner.invoke(cli, ["engine", "build-cpu"]).exit_code == 0
    assert asked == [OLDER, None]  # no release named: the prebuilt default


def _sdist_with_ggml_cmake(cache: Path, version: str, cmake_text: str) -> None:
    """A stand-in sdist in the cache holding only the vendored ggml's CMakeLists.txt."""
    (cache / "sdist").mkdir(parents=True, exist_ok=True)
    data = cmake_text.encode()
    with tarfile.open(cache / "sdist" / f"{sdist_name(version)}.tar.gz", "w:gz") as tf:
        info = tarfile.TarInfo(f"{sdist_name(version)}/vendor/llama.cpp/ggml/CMakeLists.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))


def test_the_label_names_ggml_where_it_numbers_its_releases_and_the_release_alone_before(tmp_path: Path) -> None:
    numbered = (
        'project("ggml" C CXX)\nset(GGML_VERSION_MAJOR 0)\nset(GGML_VERSION_MINOR 25)\nset(GGML_VERSION_PATCH 3)\n'
    )
    _sdist_with_ggml_cmake(tmp_path, "9.9.9", numbered)
    _sdist_with_ggml_cmake(tmp_path, OLDER, 'project("ggml" C CXX)\n')
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"binary")
    assert ggml_version(tmp_path, version="9.9.9") == "0.25.3"
    assert source_server(binary, tmp_path, version="9.9.9").version == "llama-cpp-python 9.9.9, ggml 0.25.3"
    assert ggml_version(tmp_path, version=OLDER) is None
    assert source_server(binary, tmp_path, version=OLDER).version == f"llama-cpp-python {OLDER}"  # not "ggml ?.?.?"


def test_set_up_compiles_the_releases_the_upgrade_tests_pin() -> None:
    """The pins live in one module; `setup.sh --test` reads them from it rather than naming releases of its own."""
    printed = subprocess.run(
        [sys.executable, "-m", "llmplay_testing.llamacpp_releases"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert printed == list(UPGRADE_RELEASES) and len(set(printed)) == 2
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-m llmplay_testing.llamacpp_releases" in setup
    assert 'engine build-cpu --llama-cpp-python "$1"' in setup  # each release the module printed
