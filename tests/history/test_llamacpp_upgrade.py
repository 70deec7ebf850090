"""An engine upgrade on two real llama.cpp builds: the two llama-cpp-python releases pinned in
llmplay_testing.llamacpp_releases, each built from source by `llmplay engine build-cpu --llama-cpp-python V` (the
real command; `scripts/setup.sh --test` compiles both in the background while the rest of set-up downloads, so here it
finds them in the cache, or compiles them first: a few minutes each on 2 cores); a run on the older release,
accepted as the reference, re-tested on the newer one; `history` and `history --check` after.

Asserted is what llmplay controls: the images and both archives name their release, the re-test names the flags the
upgrade dropped and the preflight stops a configuration that uses one, the history shows the engine change, and the
exit codes of `retest` and `history --check` say what their own comparison says. Whether the newer release is faster
or slower is the releases' and this machine's to decide (benchmarks/RESULTS.md's first table), never asserted.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmplay.compare import compare_runs
from llmplay.engines import get_engine
from llmplay.engines.base import VERSION_LABEL
from llmplay.errors import ExitCode, PlaybookError
from llmplay.playbook.load import load_playbook
from llmplay.runtime.cache import default_cache_dir
from llmplay.runtime.cpu_image import CONTENT_LABEL, binary_path, image_tag
from llmplay.runtime.image_flags import image_flags
from llmplay.tuning.preflight import preflight
from llmplay_testing.background_builds import BackgroundBuildFailed, llamacpp_build, wait_for_background_build
from llmplay_testing.cpu_runs import cli, reap_cli_processes, tiny_playbook
from llmplay_testing.llamacpp_releases import NEWER, OLDER, UPGRADE_RELEASES

pytestmark = [pytest.mark.docker, pytest.mark.slow]

NAME = "llamacpp-upgrade"
# A compile of one release from an empty cache: 0.3.8 took 348 CPU-seconds, 0.3.16 282, so 10-11 minutes each on the
# 2-core machine beside other jobs (load 6-12); a generous limit, as a busy machine's is the noise's to decide.
BUILD_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 600
DROPPED_FLAG = "--dump-kv-cache"  # in the older release's llama-server, gone from the newer one's


def released(version: str) -> str:
    """How an image built from `version` names its engine (its ggml does not number its releases)."""
    return f"llama-cpp-python {version}"


def llmplay(*args: str, timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    proc = cli(*args)
    out, _ = proc.communicate(timeout=timeout_s)
    return proc.returncode, out


@pytest.fixture(autouse=True)
def _reap():
    yield
    reap_cli_processes()


@pytest.fixture(scope="module")
def release_images(docker_client: Any) -> dict[str, Any]:
    """Each pinned release built from source by the CLI, as a user would build it; its image, by release."""
    missing = [tool for tool in ("cmake", "c++", "make") if shutil.which(tool) is None]
    uncompiled = [v for v in UPGRADE_RELEASES if not binary_path(default_cache_dir(), v).exists()]
    if missing and uncompiled and os.geteuid() != 0:
        why = f"{', '.join(missing)} missing and not root to install them: llama-cpp-python {uncompiled} not compiled"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{why} (CI=true: the upgrade tests must run)", pytrace=False)
        pytest.skip(why)
    images = {}
    for version in UPGRADE_RELEASES:
        try:  # `.ci/run` starts the tests while set-up compiles the releases: the command below then finds them
            wait_for_background_build(llamacpp_build(version))
        except BackgroundBuildFailed as exc:
            pytest.fail(str(exc), pytrace=False)
        code, out = llmplay("engine", "build-cpu", "--llama-cpp-python", version, timeout_s=BUILD_TIMEOUT_S)
        assert code == ExitCode.OK, out
        assert f"CPU engine ready: {image_tag(version)} ({released(version)})" in out, out
        images[version] = docker_client.images.get(image_tag(version))
    reap_cli_processes()
    return images


def test_each_release_is_its_own_image_labelled_with_its_release(release_images: dict[str, Any]) -> None:
    old, new = release_images[OLDER], release_images[NEWER]
    for version, image in release_images.items():
        assert image.labels[VERSION_LABEL] == released(version)
        assert image.labels["llmplay.llama_cpp_python"] == version
    assert old.id != new.id and old.labels[CONTENT_LABEL] != new.labels[CONTENT_LABEL]


def test_the_preflight_stops_a_flag_the_newer_release_dropped(
    release_images: dict[str, Any], docker_client: Any, tmp_path: Path
) -> None:
    """A configuration written for the older release passes its preflight there and is stopped on the newer one,
    before any engine starts, naming the step and the flag."""
    path = tiny_playbook(tmp_path, name=NAME, steps=[{"name": "dump-kv", "set": {"extra_args": [DROPPED_FLAG]}}])
    engine = get_engine("llamacpp")

    def on(version: str):
        doc = yaml.safe_load(path.read_text())
        doc["engine"]["image"] = image_tag(version)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return preflight(load_playbook(path), engine, lambda i: image_flags(docker_client, i, engine), print)

    assert on(OLDER).engine.version == released(OLDER)
    with pytest.raises(PlaybookError) as info:
        on(NEWER)
    assert (
        f"steps[0].set.extra_args: step 'dump-kv' passes {DROPPED_FLAG}, which image {image_tag(NEWER)} "
        f"(llamacpp {released(NEWER)}) does not accept" in str(info.value)
    )


def _engine_versions(run_dir: Path) -> set[str]:
    trials = json.loads((run_dir / "manifest.json").read_text())["trials"]
    assert trials and all(t["status"] == "ok" for t in trials), trials
    return {t["engine_describe"]["engine_version"] for t in trials}


def test_a_run_on_the_older_release_retested_on_the_newer(release_images: dict[str, Any], tmp_path: Path) -> None:
    archive = tmp_path / "reports"
    # Three short trials a side give each goal an interval (so `--check` can judge); gates loose enough for a machine
    # other jobs share: this test is about the upgrade loop, not a stray slow request.
    playbook = tiny_playbook(
        tmp_path,
        name=NAME,
        steps=[],
        duration="3s",
        warmup="0.5s",
        repeats=3,
        gates=["ttft.p95 < 20s", "errors.rate < 20%"],
        engine={"image": image_tag(OLDER)},
    )
    code, out = llmplay("run", str(playbook), "--archive", str(archive))
    assert code in (ExitCode.OK, ExitCode.GATES), out
    (reference_dir,) = [p.parent for p in archive.glob(f"{NAME}/*/manifest.json")]
    assert _engine_versions(reference_dir) == {released(OLDER)}
    code, out = llmplay("history", NAME, "--accept", reference_dir.name, "--archive", str(archive))
    assert code == ExitCode.OK, out

    code, out = llmplay("retest", str(reference_dir), "--image", image_tag(NEWER), "--archive", str(archive))
    assert code in (ExitCode.OK, ExitCode.REGRESSION), out
    (change,) = [line for line in out.splitlines() if line.startswith("engine change: ")]
    assert change.startswith(f"engine change: llamacpp {released(OLDER)} -> {released(NEWER)}; "), change
    assert change.endswith(f"2 removed ({DROPPED_FLAG}, -dkvc)"), change  # the two releases' own --help
    assert f"{image_tag(NEWER)} (llamacpp {released(NEWER)}" in out  # the preflight read the newer release's flags
    (retest_dir,) = [p.parent for p in archive.glob(f"{NAME}/*/manifest.json") if p.parent != reference_dir]
    assert _engine_versions(retest_dir) == {released(NEWER)}  # both releases named in the archives
    regressed = compare_runs(reference_dir, retest_dir).has_regression or "\nquality: " in out
    assert code == (ExitCode.REGRESSION if regressed else ExitCode.OK), out

    code, out = llmplay("history", NAME, "--archive", str(archive))
    assert code == ExitCode.OK, out
    assert f"{reference_dir.name} REFERENCE" in out and retest_dir.name in out, out
    assert released(OLDER) in out and released(NEWER) in out, out
    engine_change = f"engine version {released(OLDER)} -> {released(NEWER)}"
    flags = [line for line in out.splitlines() if line.startswith("    ! ")]
    assert all(engine_change in flag for flag in flags), out  # whatever the trials show, it is laid at the upgrade

    code, out = llmplay("history", NAME, "--check", "--archive", str(archive))
    # Judged either way (three trials a side give every goal an interval); which way is the releases' and the noise's.
    assert code in (ExitCode.OK, ExitCode.REGRESSION), out
    verdict = "REGRESSION of" if code == ExitCode.REGRESSION else "no regression of"
    assert f"{verdict} {retest_dir.name} against the reference {reference_dir.name}" in out, out
    assert engine_change in out, out  # "since then ...": the check names the upgrade
