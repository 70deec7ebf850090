"""`${cache}` in engine.model_dir (the machine's llmplay cache, wherever $LLMPLAY_CACHE puts it), and what a
missing model directory's message tells a newcomer: how to get the model, and `validate --any-host`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from llmplay.cache_dir import CACHE_REFERENCE
from llmplay.cli import cli
from llmplay.playbook.load import load_playbook
from llmplay.playbook.mounts import host_path
from llmplay.runtime.hf_model import model_dir as tiny_hf_dir
from llmplay.runtime.models import gemma_dir

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty llmplay cache somewhere else than ~/.cache/llmplay."""
    cache = tmp_path / "elsewhere" / "llmplay-cache"
    cache.mkdir(parents=True)
    monkeypatch.setenv("LLMPLAY_CACHE", str(cache))
    return cache


def validate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["validate", *args])
    return result.exit_code, result.output


def test_the_shipped_playbooks_mount_what_set_up_writes_into_the_cache(cache):
    built = {str(tiny_hf_dir(cache).resolve()), str(gemma_dir(cache).resolve())}
    mounted = {}
    for path in sorted(PLAYBOOKS.glob("*.yaml")):
        written = (yaml.safe_load(path.read_text()).get("engine") or {}).get(
            "model_dir", ""
        )  # an `extends` file may have none
        assert ".cache/llmplay" not in written, f"{path.name}: write {CACHE_REFERENCE}/..., not the default cache"
        if written.startswith(CACHE_REFERENCE):
            mounted[path.name] = str(Path(host_path(written)).resolve())  # as the loader resolves it
    assert {"vllm-cpu-tiny.yaml", "cpu-gemma.yaml", "cpu-chat.yaml"} <= set(mounted)
    assert set(mounted.values()) == built


def test_a_cache_model_present_under_llmplay_cache_validates(cache):
    tiny_hf_dir(cache).mkdir(parents=True)
    code, output = validate(str(PLAYBOOKS / "vllm-cpu-tiny.yaml"))
    assert code == 0, output
    assert load_playbook(PLAYBOOKS / "vllm-cpu-tiny.yaml").engine.model_dir == str(tiny_hf_dir(cache).resolve())


def test_a_missing_cache_model_says_how_to_build_it_and_about_any_host(cache):
    code, output = validate(str(PLAYBOOKS / "vllm-cpu-tiny.yaml"), str(PLAYBOOKS / "cpu-gemma.yaml"))
    assert code == 2 and "Traceback" not in output
    tiny, gemma = output.strip().splitlines()
    assert "vllm-cpu-tiny.yaml:" in tiny and "engine.model_dir: '${cache}/models/tiny-llama" in tiny
    assert f"(looked for {tiny_hf_dir(cache)})" in tiny
    assert "`llmplay engine build-vllm-cpu` writes it" in tiny and "`llmplay validate --any-host`" in tiny
    assert "`bash scripts/setup.sh --gemma` assembles it" in gemma and "`llmplay validate --any-host`" in gemma
    assert validate("--any-host", str(PLAYBOOKS / "vllm-cpu-tiny.yaml"))[0] == 0


def test_a_cache_model_named_outside_the_cache_is_told_the_cache_reference(cache, tmp_path):
    doc = yaml.safe_load((PLAYBOOKS / "vllm-cpu-tiny.yaml").read_text())
    doc["engine"]["model_dir"] = "old-cache/models/tiny-llama-hf"  # the default cache's layout, not this cache
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, output = validate(str(path))
    assert code == 2
    assert f"into {tiny_hf_dir(cache)}: name it `${{cache}}/models/tiny-llama-hf`" in output


def test_a_directory_no_set_up_makes_says_to_copy_the_model_there(tmp_path):
    doc = yaml.safe_load((PLAYBOOKS / "vllm-cpu-tiny.yaml").read_text())
    doc["engine"]["model_dir"] = "weights/llama3-8b"
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, output = validate(str(path))
    assert code == 2 and "copy or download the model's files there" in output and "--any-host" in output


def test_other_references_in_model_dir_are_refused(tmp_path):
    doc = yaml.safe_load((PLAYBOOKS / "vllm-cpu-tiny.yaml").read_text())
    doc["engine"]["model_dir"] = "${env:HOME}/models"
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, output = validate("--any-host", str(path))
    assert code == 2
    assert "engine.model_dir: '${env:HOME}/models': only ${cache} is expanded here" in output
