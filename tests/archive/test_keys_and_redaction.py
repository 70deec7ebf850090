"""Key files and redaction records (issue #36): a key path from a flag or the environment is read only when it is a
small regular file (never /dev/zero, never a FIFO that would block); keygen leaves no half-written key; the manifest
and the report say where values were redacted, never the values."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from llmplay.archive.layout import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, MANIFEST, REPORT_FILE
from llmplay.archive.model import ConfigRecord
from llmplay.archive.run_facts import RunEnvironment, RunOverrides
from llmplay.archive.signing import MAX_KEY_BYTES, keygen
from llmplay.archive.writer import RunArchive
from llmplay.cli import cli
from llmplay.errors import ArchiveError
from llmplay.playbook.load import load_playbook
from llmplay.playbook.mounts import ENV_ARCHIVE as MOUNTS_ENV_ARCHIVE
from llmplay.playbook.mounts import ENV_SIGNING_KEY as MOUNTS_ENV_SIGNING_KEY
from llmplay.report import publish_report
from llmplay.spec import Config
from llmplay_testing.make_archive import SECRETS, make_archive, shared_archive

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def without_blocking(call: Callable[[], object], fifo: Path) -> object:
    """`call()`'s result; fails the test (after unblocking the FIFO) when it waits on `fifo` for 30 s."""
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(call()), daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():
        with open(fifo, "wb"):
            pass
        pytest.fail(f"blocked on the FIFO {fifo}")
    return done[0]


@pytest.fixture()
def bad_keys(tmp_path: Path) -> dict[str, Path]:
    """A device, a FIFO and a file over the bound, each where a key file is expected."""
    os.mkfifo(tmp_path / "fifo.pub")
    huge = tmp_path / "huge.pub"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_KEY_BYTES * 1024)  # sparse: big without filling the disk
    return {"a character device": Path("/dev/zero"), "a FIFO": tmp_path / "fifo.pub", "bytes": huge}


@pytest.fixture()
def run_dir(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    src = shared_archive(tmp_path_factory)
    dst = tmp_path / "reports" / src.parent.name / src.name
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------------------------ 3. key files
@pytest.mark.parametrize("kind", ["a character device", "a FIFO", "bytes"])
def test_a_public_key_that_is_no_small_regular_file_is_one_line_error(run_dir, bad_keys, monkeypatch, kind):
    key = bad_keys[kind]
    monkeypatch.delenv(ENV_PUBLIC_KEY, raising=False)
    result = without_blocking(lambda: invoke("verify", str(run_dir), "--public-key", str(key)), key)
    assert isinstance(result, Result)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "Traceback" not in result.output and "the public key: a PEM file from llmplay keygen" in result.output
    assert (f"not a regular file ({kind})" if kind != "bytes" else "expected at most 65536") in result.output
    monkeypatch.setenv(ENV_PUBLIC_KEY, str(key))
    result = without_blocking(lambda: invoke("report", str(run_dir)), key)
    assert isinstance(result, Result)
    assert result.exit_code == 1 and result.output.startswith(f"error: ${ENV_PUBLIC_KEY}: {key}"), result.output


@pytest.mark.parametrize("kind", ["a character device", "a FIFO", "bytes"])
def test_a_signing_key_that_is_no_small_regular_file_stops_the_run_first(tmp_path, bad_keys, monkeypatch, kind):
    key = bad_keys[kind]
    monkeypatch.setenv(ENV_SIGNING_KEY, str(key))

    def make() -> object:
        try:
            make_archive(tmp_path / "reports")
        except ArchiveError as exc:
            return str(exc)
        return "no error"

    message = without_blocking(make, key)
    assert isinstance(message, str) and message.startswith(f"${ENV_SIGNING_KEY}: {key}: "), message
    assert "the signing key: a PEM file from llmplay keygen" in message
    assert not list((tmp_path / "reports").rglob(MANIFEST))


def test_keygen_on_a_full_disk_leaves_no_key_behind(tmp_path):
    """A file-size limit makes every write past 100 bytes fail as a full disk would (EFBIG for ENOSPC)."""

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    key = tmp_path / "keys" / "team.key"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    full = subprocess.run(
        [sys.executable, "-m", "llmplay", "keygen", str(key)],
        preexec_fn=limited,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert full.returncode == 1, full.stdout + full.stderr
    assert "Traceback" not in full.stderr and f"{key}: cannot write the key" in full.stderr, full.stderr
    assert list((tmp_path / "keys").iterdir()) == []  # no 0-byte key, no temporary file
    again = invoke("keygen", str(key))  # the disk has room again: the next keygen is not blocked
    assert again.exit_code == 0, again.output
    assert key.stat().st_size > 0 and key.with_name("team.key.pub").stat().st_size > 0


def test_keygen_still_never_overwrites(tmp_path):
    private, public, _ = keygen(tmp_path / "team.key")
    before = private.read_bytes()
    public.unlink()
    with pytest.raises(ArchiveError, match="already exists"):
        keygen(private)
    assert private.read_bytes() == before and not public.exists()


def test_the_mount_rule_names_the_archive_s_variables():
    from llmplay.archive.layout import ENV_ARCHIVE

    assert (MOUNTS_ENV_SIGNING_KEY, MOUNTS_ENV_ARCHIVE) == (ENV_SIGNING_KEY, ENV_ARCHIVE)


# ------------------------------------------------------------------------------------------- 5. what was redacted
def test_the_manifest_and_report_say_where_values_were_redacted_never_the_values(run_dir):
    manifest = json.loads((run_dir / MANIFEST).read_text())
    redacted = manifest["redacted"]
    assert "environment.cluster.address" in redacted
    assert any(p.endswith(".engine.env.HF_TOKEN") for p in redacted), redacted
    assert any(p.endswith("/engine.log") for p in redacted), redacted
    text = json.dumps(redacted)
    assert all(secret not in text for secret in SECRETS)
    html = (run_dir / REPORT_FILE).read_text()
    assert "secrets redacted" in html and "environment.cluster.address" in html


def test_a_value_shaped_like_a_secret_is_redacted_and_recorded(tmp_path, monkeypatch):
    """A literal the loader refuses today may still arrive (a log line, an older playbook read back): the writer
    blanks it by shape, under any name, in the manifest, the engine log and the docker line, and says where."""
    monkeypatch.delenv(ENV_SIGNING_KEY, raising=False)
    playbook = load_playbook(ROOT / "playbooks" / "cpu-tiny.yaml")
    archive = RunArchive.create(
        tmp_path / "r", playbook, overrides=RunOverrides(), environment=RunEnvironment(), secrets=[]
    )
    literal, random_note = "sk-live-LITERAL-888888", "Zq8Xw3Lp7Rt5Vb2Nm4Kj6"
    engine = replace(
        playbook.engine,
        env={"MODEL_NOTE": literal, "RANDOM_NOTE": random_note},
        extra_args=("--note", literal),
    )
    config = Config("baseline", engine, playbook.workload)
    archive.write_config(
        ConfigRecord(
            "baseline",
            engine,
            playbook.workload,
            command=("llama-server", "--note", literal),
            docker_command=f"docker run -e MODEL_NOTE={literal} -e RANDOM_NOTE={random_note} img",
        )
    )
    assert config.label == "baseline"
    publish_report(archive.run_dir)
    for path in archive.run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert literal.encode() not in data and random_note.encode() not in data, path
    redacted = json.loads((archive.run_dir / MANIFEST).read_text())["redacted"]
    assert {
        "configs[baseline].engine.env.MODEL_NOTE",
        "configs[baseline].engine.env.RANDOM_NOTE",
        "configs[baseline].engine.extra_args[1]",
        "configs[baseline].command[2]",
        "configs[baseline].docker_command",
    } <= set(redacted), redacted
    assert "configs[baseline].engine.env.MODEL_NOTE" in (archive.run_dir / REPORT_FILE).read_text()
