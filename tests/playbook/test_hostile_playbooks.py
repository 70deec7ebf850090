"""Hostile playbooks (issue #36): limits a playbook cannot exceed, mounts and images it cannot choose, secrets it
cannot smuggle by shape, and the low cases of the probe, each refused by `llmplay validate` or `llmplay run` with one
line naming FILE:LINE and the YAML path, before any archive or engine exists."""

from __future__ import annotations

import os
import re
import shlex
import socket
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.playbook.load import load_playbook
from llmplay.redaction import REDACTED, redact, redact_text
from llmplay_testing.playbooks import assert_refused
from llmplay_testing.playbooks import write_playbook as playbook


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


# ------------------------------------------------------------------------------------- 4. limits at validate
def test_a_search_may_not_ask_for_more_candidates_than_the_bound(tmp_path):
    step = {"name": "slots", "max_candidates": 1_000_000_000, "search": {"parallel": {"from": 1, "to": 10_000_000}}}
    assert_refused(playbook(tmp_path, steps=[step]), "steps[0].max_candidates", "expected a number <= 256")


def test_a_huge_range_is_counted_never_built(tmp_path):
    # 10^15 values: built as a list this would never finish; counted, it is one line at once.
    step = {"name": "slots", "max_candidates": 256, "search": {"parallel": {"from": 1, "to": 10**15}}}
    assert_refused(
        playbook(tmp_path, steps=[step]), "steps[0].search.parallel", "the range has 1000000000000000 values"
    )


@pytest.mark.parametrize(
    ("section", "key", "value", "fragment"),
    [
        ("workload", "warmup", "1000h", "found 1000h (3.6e+06 s); expected at most 1h for a warm-up"),
        ("workload", "duration", "1000000h", "expected at most 24h for a trial's measured window"),
        ("workload", "duration", 90000, "found 90000 (90000 s); expected at most 24h"),
        ("trials", "cooldown", "2h", "expected at most 1h for a cool-down between trials"),
    ],
)
def test_absurd_phases_are_refused_with_the_limit_named(tmp_path, section, key, value, fragment):
    extra = {"num_requests": None} if key == "duration" else {}
    assert_refused(playbook(tmp_path, **{section: {key: value, **extra}}), f"{section}.{key}", fragment)


def test_the_longest_allowed_phases_still_validate(tmp_path):
    path = playbook(tmp_path, workload={"warmup": "1h", "duration": "24h", "num_requests": None})
    assert invoke("validate", str(path))[0] == 0


@pytest.mark.parametrize(
    ("flag", "fragment"),
    [
        ("--duration=1000000h", "--duration: found '1000000h' (3.6e+09 s); expected at most 24h"),
        ("--warmup=1000h", "--warmup: found '1000h' (3.6e+06 s); expected at most 1h"),
    ],
)
def test_command_line_phases_obey_the_same_limits(tmp_path, flag, fragment):
    code, out = invoke("run", "--dry-run", str(playbook(tmp_path)), flag)
    assert code == 2 and fragment in out and out.count("\n") == 1, out


# ------------------------------------------------------------------------------------- 4. mounts and images
@pytest.fixture()
def key_folder(tmp_path, monkeypatch) -> Path:
    """$LLMPLAY_SIGNING_KEY in a folder of its own; $HOME and the archive root elsewhere."""
    folder = tmp_path / "secrets" / "keys"
    folder.mkdir(parents=True)
    (folder / "team.key").write_text("a private key\n")
    monkeypatch.setenv("LLMPLAY_SIGNING_KEY", str(folder / "team.key"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("LLMPLAY_ARCHIVE", str(tmp_path / "archive" / "reports"))
    (tmp_path / "archive" / "reports").mkdir(parents=True)
    return folder


@pytest.mark.parametrize(
    ("written", "fragment"),
    [
        ("secrets/keys", "is the folder of $LLMPLAY_SIGNING_KEY (the private signing key)"),
        ("secrets", "is a directory above the folder of $LLMPLAY_SIGNING_KEY"),
        ("link-to-keys", "resolves to"),
        ("archive/reports", "is the archive root"),
        ("archive", "is a directory above the archive root"),
        ("~/.ssh", "inside the credential directory .ssh"),
    ],
)
def test_model_dir_may_not_mount_the_signing_key_ssh_or_the_archive(tmp_path, key_folder, written, fragment):
    (tmp_path / "link-to-keys").symlink_to(key_folder)
    (tmp_path / "home" / ".ssh").mkdir()
    assert_refused(playbook(tmp_path, engine={"model_dir": written}), "engine.model_dir", fragment)


def test_the_archive_root_of_the_run_is_protected_too(tmp_path, key_folder):
    (tmp_path / "models" / "runs").mkdir(parents=True)
    path = playbook(tmp_path, engine={"model_dir": "models"})
    assert invoke("validate", str(path))[0] == 0
    code, out = invoke("run", "--dry-run", "--archive", str(tmp_path / "models" / "runs"), str(path))
    assert code == 2 and "engine.model_dir: 'models' is a directory above the archive root" in out, out


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "has space", ""])
def test_an_image_docker_could_read_as_an_option_is_refused(tmp_path, image):
    assert_refused(playbook(tmp_path, engine={"image": image}), "engine.image", "expected a Docker image reference")
    step = [{"name": "img", "set": {"image": image}}]
    assert_refused(playbook(tmp_path, steps=step), "steps[0].set.image", "never '-'")


def test_an_image_flag_obeys_the_same_rule(tmp_path):
    code, out = invoke("retest", str(tmp_path), "--image=--privileged")
    assert code == 2 and out.startswith("error: --image: found '--privileged'; expected a Docker image"), out


# ------------------------------------------------------------------------------------- 5. secrets by shape
@pytest.mark.parametrize(
    ("engine", "yaml_path"),
    [
        ({"env": {"MODEL_NOTE": "sk-live-LITERAL-888888"}}, "engine.env.MODEL_NOTE"),
        ({"extra_args": ["--note", "sk-live-LITERAL-888888"]}, "engine.extra_args[1]"),
        ({"env": {"NOTE": "hf_a1b2c3d4e5"}}, "engine.env.NOTE"),
        ({"env": {"NOTE": "AKIA12345678"}}, "engine.env.NOTE"),
    ],
)
def test_a_short_token_in_a_known_format_is_refused_by_shape(tmp_path, engine, yaml_path):
    out = assert_refused(playbook(tmp_path, engine=engine), yaml_path, "a token in a known credential format")
    assert "LITERAL" not in out and "a1b2c3" not in out and "12345678" not in out


def test_shape_redaction_blanks_short_tokens_and_random_values_under_any_name():
    found: list[str] = []
    config = {
        "engine": {
            "env": {"MODEL_NOTE": "sk-live-LITERAL-888888", "RANDOM_NOTE": "Zq8Xw3Lp7Rt5Vb2Nm4Kj6"},
            "extra_args": ["--note=Zq8Xw3Lp7Rt5Vb2Nm4Kj6"],
            "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        },
        "docker_command": "docker run -e RANDOM_NOTE=Zq8Xw3Lp7Rt5Vb2Nm4Kj6 img",
    }
    out = redact(config, (), found, "configs[baseline]")
    assert out["engine"]["env"] == {"MODEL_NOTE": REDACTED, "RANDOM_NOTE": REDACTED}
    assert out["engine"]["extra_args"] == [f"--note={REDACTED}"]
    assert out["docker_command"] == f"docker run -e RANDOM_NOTE={REDACTED} img"  # the same value, wherever it is
    assert out["engine"]["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert sorted(found) == [
        "configs[baseline].docker_command",
        "configs[baseline].engine.env.MODEL_NOTE",
        "configs[baseline].engine.env.RANDOM_NOTE",
        "configs[baseline].engine.extra_args[0]",
    ]
    # words that merely start like a token stay
    for text in ("hf_transfer", "use sk-learn", "AKIAEXAMPLE", "task-12345678"):
        assert redact_text(text) == text


# ------------------------------------------------------------------------------------------- 6. low cases
def test_extends_naming_a_fifo_says_it_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "base.yaml")
    path = tmp_path / "p.yaml"
    path.write_text("extends: base.yaml\n")
    done: list[tuple[int, str]] = []
    worker = threading.Thread(target=lambda: done.append(invoke("validate", str(path))), daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():
        with open(tmp_path / "base.yaml", "wb"):
            pass
        pytest.fail("validate blocked on a FIFO named by extends:")
    code, out = done[0]
    assert code == 2 and "p.yaml:1: extends: 'base.yaml' is not a regular file (a FIFO" in out, out
    assert "does not exist" not in out


def test_an_unset_reference_stops_the_run_before_the_archive_at_its_own_yaml_path(tmp_path, monkeypatch):
    for name in ("UNSET_36_A", "UNSET_36_B", "UNSET_36_C"):
        monkeypatch.delenv(name, raising=False)
    path = playbook(
        tmp_path,
        runtime="process",
        engine={"env": {"HF_TOKEN": "${env:UNSET_36_A}"}, "extra_args": ["--api-key", "${env:UNSET_36_B}"]},
        steps=[{"name": "e", "set": {"env.OTHER": "${env:UNSET_36_C}"}}],
    )
    code, out = invoke("run", str(path), "--archive", str(tmp_path / "r"))
    assert code == 2, out
    assert re.search(r"p\.yaml:\d+: engine\.env\.HF_TOKEN: references \$\{env:UNSET_36_A\} but UNSET_36_A", out)
    assert re.search(r"p\.yaml:\d+: engine\.extra_args\[1\]: references \$\{env:UNSET_36_B\}", out), out
    assert re.search(r"p\.yaml:\d+: steps\[0\]\.set\.env\.OTHER: references \$\{env:UNSET_36_C\}", out), out
    assert not (tmp_path / "r").exists()  # no empty failed archive


def test_an_azure_trace_with_a_byte_order_mark_validates(tmp_path):
    rows = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,100,10\n2023-11-16 18:15:47.0,120,12\n"
    (tmp_path / "t.csv").write_bytes(b"\xef\xbb\xbf" + rows.encode())  # as a spreadsheet saves it
    path = playbook(tmp_path, workload={"trace": {"file": "t.csv", "format": "azure"}})
    doc = yaml.safe_load(path.read_text())
    doc["workload"] = {"trace": {"file": "t.csv", "format": "azure"}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, out = invoke("validate", str(path))
    assert code == 0, out
    assert load_playbook(path).workload.trace is not None


def test_a_port_in_use_is_named_in_the_trial_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = playbook(
            tmp_path,
            runtime="process",
            engine={"port": port, "executable": "llama-server"},
            trials={"repeats": 1},
        )
        _, out = invoke("run", str(path), "--archive", str(tmp_path / "r"))
    (run_dir,) = (tmp_path / "r" / "p").iterdir()
    trials = yaml.safe_load((run_dir / "manifest.json").read_text())["trials"]
    assert trials and f"port {port} on 127.0.0.1 is already in use" in trials[0]["error"], trials
    assert f"port {port}" in out


def test_the_printed_docker_line_quotes_every_playbook_value(tmp_path):
    """The plan's `docker run` line is pasted into shells: a GPU id or an extra arg is one quoted word there."""
    hostile = '"; touch pwned; "'
    path = playbook(tmp_path, engine={"gpus": ["0", hostile], "extra_args": [hostile]})
    code, out = invoke("plan", str(path))
    assert code == 0, out
    (line,) = [line.split("$ ", 1)[1] for line in out.splitlines() if line.strip().startswith("$ docker run")]
    words = shlex.split(line)
    assert words[words.index("--gpus") + 1] == f'"device=0,{hostile}"' and words[-1] == hostile
