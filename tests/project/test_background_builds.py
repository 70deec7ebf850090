"""How a test waits for a build `.ci/run` left running (llmplay_testing/background_builds.py): on the state each
build writes, whatever moment it is read at."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from llmplay_testing import background_builds
from llmplay_testing.background_builds import BackgroundBuildFailed, state_path, wait_for_background_build


def write_state(cache: Path, name: str, line: str) -> None:
    path = state_path(name, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line + "\n")


def test_no_state_means_nothing_builds_and_no_wait(tmp_path: Path) -> None:
    assert wait_for_background_build("vllm-cpu-0.32.0", cache=tmp_path) == 0.0


def test_a_build_still_going_is_waited_for_until_it_says_ok(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background_builds, "POLL_S", 0.05)
    builder = subprocess.Popen(["sleep", "30"])
    try:
        write_state(tmp_path, "b", f"waiting {builder.pid} {tmp_path / 'b.log'}")
        timer = threading.Timer(0.5, write_state, (tmp_path, "b", f"ok {tmp_path / 'b.log'}"))
        timer.start()
        started = time.monotonic()
        wait_for_background_build("b", cache=tmp_path)
        assert time.monotonic() - started >= 0.4
    finally:
        builder.kill()
        builder.wait()


def test_a_failed_build_fails_with_the_end_of_its_log(tmp_path: Path) -> None:
    log = tmp_path / "b.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)) + "cmake: error\n")
    write_state(tmp_path, "b", f"failed {log}")
    with pytest.raises(BackgroundBuildFailed, match=r"(?s)the background build b failed.*line 39\ncmake: error"):
        wait_for_background_build("b", cache=tmp_path)


def test_a_builder_gone_without_a_last_word_fails_at_once(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    write_state(tmp_path, "b", f"waiting {gone.pid} {tmp_path / 'b.log'}")
    with pytest.raises(BackgroundBuildFailed, match="stopped without ending"):
        wait_for_background_build("b", cache=tmp_path)


def test_a_build_past_the_limit_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background_builds, "POLL_S", 0.05)
    builder = subprocess.Popen(["sleep", "30"])
    try:
        write_state(tmp_path, "b", f"waiting {builder.pid} {tmp_path / 'b.log'}")
        with pytest.raises(BackgroundBuildFailed, match="did not end within 0s"):
            wait_for_background_build("b", cache=tmp_path, limit_s=0.2)
    finally:
        builder.kill()
        builder.wait()


def test_a_state_in_no_known_form_is_named(tmp_path: Path) -> None:
    write_state(tmp_path, "b", "building")
    with pytest.raises(BackgroundBuildFailed, match=r"b\.state: expected 'waiting PID LOG'"):
        wait_for_background_build("b", cache=tmp_path)
