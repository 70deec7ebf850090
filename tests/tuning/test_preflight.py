"""The preflight against a real image: `--help` in a throw-away container, cached per image id, and a flag
the image lacks stopping `llmplay run` with exit code 2 before any trial (no archive, no engine started)."""

from __future__ import annotations

import os

import pytest
import yaml

from llmplay.engines import get_engine
from llmplay.errors import PlaybookError
from llmplay.playbook.load import load_playbook
from llmplay.playbook.source import display_path
from llmplay.runtime.image_flags import flags_in_help, image_flags
from llmplay.runtime.labels import LABEL_PID, LABEL_RUN
from llmplay.tuning.preflight import flag_names, nearest_flag, preflight
from llmplay_testing.cpu_runs import cli, tiny_playbook


def test_flag_names_skip_values_and_negative_numbers() -> None:
    assert flag_names(["--ctx-size", "4096", "--n-gpu-layers", "-1", "--dtype=float32", "-t", "2"]) == [
        "--ctx-size",
        "--n-gpu-layers",
        "--dtype",
        "-t",
    ]


def test_flags_in_help_reads_usage_and_option_lists() -> None:
    text = (
        "usage: api_server.py [-h] [--max-num-seqs MAX_NUM_SEQS]\n"
        "  [--enable-prefix-caching | --no-enable-prefix-caching]\n"
        "-c,    --ctx-size N     size of the prompt context (env: LLAMA_ARG_CTX_SIZE)\n"
        "--------- a rule, not a flag\n"
    )
    assert flags_in_help(text) == {
        "-h",
        "--max-num-seqs",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "-c",
        "--ctx-size",
    }
    assert nearest_flag("--max-num-seq", flags_in_help(text)) == "--max-num-seqs"


@pytest.mark.docker
def test_help_is_read_once_per_image_and_cached(cpu_engine, docker_client, tmp_path) -> None:
    engine = get_engine("llamacpp")
    first = image_flags(docker_client, cpu_engine.image, engine, cache=tmp_path)
    assert first is not None and not first.cached
    assert {"--ctx-size", "--parallel", "--cache-reuse", "--no-cache-prompt", "--metrics"} <= first.flags
    assert first.version == cpu_engine.engine_version  # the image's label
    again = image_flags(docker_client, cpu_engine.image, engine, cache=tmp_path)
    assert again is not None and again.cached and again.flags == first.flags  # read from the cache, no container
    assert image_flags(docker_client, "llmplay/no-such-image:none", engine, cache=tmp_path) is None
    # This process's help containers only: tests on the other worker read help too.
    mine = [f"{LABEL_RUN}=preflight", f"{LABEL_PID}={os.getpid()}"]
    assert not docker_client.containers.list(all=True, filters={"label": mine}, ignore_removed=True)


@pytest.mark.docker
def test_valid_playbook_passes_and_a_bad_flag_names_step_line_and_nearest(cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}])
    engine = get_engine("llamacpp")

    def flags_of(image: str):
        return image_flags(docker_client, image, engine, cache=tmp_path / "cache")

    lines: list[str] = []
    result = preflight(load_playbook(path), engine, flags_of, lines.append)
    assert result.checked_flags >= 8 and result.images[0].image == cpu_engine.image

    doc = yaml.safe_load(path.read_text())
    doc["steps"].append({"name": "renamed", "set": {"extra_args": ["--ctx-sise", "2048"]}})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    lines_of_file = path.read_text().splitlines()
    step_at = next(i for i, text in enumerate(lines_of_file) if "name: renamed" in text)
    line = next(i for i, text in enumerate(lines_of_file, 1) if i > step_at and "extra_args" in text)
    with pytest.raises(PlaybookError) as info:
        preflight(load_playbook(path), engine, flags_of, lines.append)
    message = str(info.value)
    assert message.startswith(
        f"{display_path(str(path))}:{line}: steps[1].set.extra_args: step 'renamed' passes --ctx-sise"
    )
    assert message.endswith("nearest accepted flag: --ctx-size (from the image's `--help`)")


@pytest.mark.docker
def test_run_stops_with_exit_code_2_before_any_trial(cpu_engine, docker_client, tmp_path) -> None:
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}])
    doc = yaml.safe_load(path.read_text())
    doc["engine"]["extra_args"] = ["--threads-htp", "4"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = cli("run", str(path), "--archive", str(tmp_path / "reports"))
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 2, out
    assert "engine.extra_args: the baseline passes --threads-htp, which image" in out
    assert "nearest accepted flag: --threads-http" in out
    # Before any trial: no archive was made (a trial would have made one). How many seconds a busy machine takes to
    # start the CLI and read the image's --help is not llmplay's to assert.
    assert not (tmp_path / "reports").exists()


@pytest.mark.docker
def test_llamacpp_trials_name_the_release_not_b0_unknown(llama_endpoint, cpu_engine) -> None:
    """llama.cpp built without git metadata (the wheel, or the sdist) reports `b0-unknown`; the image label names
    the release it came from."""
    describe = llama_endpoint.describe
    assert describe.engine_version == describe.image_labels["llmplay.engine.version"]
    assert describe.engine_version == cpu_engine.engine_version
    assert (
        describe.engine_version.startswith(("xllamacpp ", "llama-cpp-python ")) and ", ggml " in describe.engine_version
    )
    assert describe.engine_version_reported.startswith("b0-")  # what /props says, kept beside it


def test_every_value_of_a_search_step_is_checked_against_the_image(tmp_path) -> None:
    """A search races each of its values: a flag only some value renders must be refused before any trial."""
    from llmplay.runtime.image_flags import ImageFlags
    from llmplay.tuning.preflight import check_flags

    path = tiny_playbook(tmp_path, steps=[{"name": "parallel", "search": {"parallel": [2, 4]}}])
    playbook = load_playbook(path)
    engine = get_engine("llamacpp")
    image = playbook.engine.image or "llmplay/llamacpp-cpu:local"
    accepted = {flag for site in _sites(playbook, engine, image) for flag in flag_names(site.flags)}
    known = ImageFlags(image, "sha256:x", None, frozenset(accepted - {"--parallel"}), 0.0, True)
    problems, checked = check_flags(playbook, engine, {image: known}, image)
    assert checked >= 3 and any("--parallel" in line and "steps[0]" in line for line in problems), problems


def _sites(playbook, engine, image):
    from llmplay.tuning.preflight import flag_sites

    return list(flag_sites(playbook, engine, image))
