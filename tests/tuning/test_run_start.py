"""Before the first trial: a Ctrl-C is exit 130 wherever it lands, and a run that never starts a trial (a missing
image, an interrupt) leaves a clear error and no archive, never an empty "failed" or "interrupted" run."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.playbook.load import load_playbook
from llmplay.tuning.run import RunOptions, TuningRun
from llmplay_testing.cpu_runs import cli as cli_process
from llmplay_testing.cpu_runs import reap_cli_processes, run_dir_of, tiny_playbook, wait_for


@pytest.fixture(autouse=True)
def _reap():
    yield
    reap_cli_processes()


class SilentDaemon:
    """A unix socket where a Docker daemon would listen that accepts connections and never answers: the run then
    waits on it in its preflight, long before any engine starts."""

    def __init__(self, path: Path):
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.server.close()


def test_sigint_before_the_first_engine_exits_130_and_leaves_no_archive(tmp_path: Path) -> None:
    daemon = SilentDaemon(tmp_path / "docker.sock")
    try:
        path = tiny_playbook(tmp_path, steps=[])
        proc = cli_process(
            "run",
            str(path),
            "--archive",
            str(tmp_path / "reports"),
            env_extra={"DOCKER_HOST": f"unix://{tmp_path}/docker.sock"},
        )
        # The first connection only probes the socket; the second is the daemon client waiting for its answer.
        wait_for(lambda: len(daemon.accepted) >= 2, 60, "the run to ask the daemon")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        daemon.close()
    assert proc.returncode == 130, out
    assert out.strip().splitlines()[-1] == "interrupted" and "Traceback" not in out and "Aborted" not in out
    assert not (tmp_path / "reports").exists()


def test_an_interrupt_before_the_first_trial_leaves_no_archive(tmp_path: Path) -> None:
    """After the archive is made, before a trial begins (the Ctrl-C lands as the first step's line is printed): the
    interrupt goes on to the CLI (exit 130) and the archive of nothing is removed."""
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], runtime="process")
    lines: list[str] = []

    def console(line: str) -> None:
        lines.append(line)
        if line.startswith("step 1/1"):
            raise KeyboardInterrupt("Ctrl-C")

    def never(config, **_):
        raise AssertionError("no trial may begin")

    run = TuningRun(
        load_playbook(path), RunOptions(archive_root=tmp_path / "reports"), report=console, measure_trial=never
    )
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    assert lines[-1].startswith("no trial started; the archive ") and lines[-1].endswith(" was removed")
    assert run_dir_of(tmp_path / "reports") is None and list((tmp_path / "reports").iterdir()) == []


@pytest.mark.docker
def test_a_run_on_a_missing_image_is_one_error_and_no_archive(docker_client, tmp_path: Path) -> None:
    path = tiny_playbook(tmp_path, steps=[], engine={"image": "llmplay/no-such-image:1"})
    result = CliRunner().invoke(cli, ["run", str(path), "--archive", str(tmp_path / "reports")])
    assert result.exit_code == 1, result.output
    assert result.output == (
        "error: image llmplay/no-such-image:1 not found locally; pull it: `docker pull llmplay/no-such-image:1`\n"
    )
    assert not (tmp_path / "reports").exists()
