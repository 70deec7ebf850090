"""The run archive: atomic manifest with hashes, verify catches any change, secrets never reach the disk, ls, root."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

import llmplay.archive.writer as archive_writer
from llmplay.archive.convert import config_from, diagnosis_from, environment_from, playbook_as_run, tuning_row_from
from llmplay.archive.layout import MANIFEST
from llmplay.archive.listing import archive_root, list_runs
from llmplay.archive.model import TrialRecord
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.run_facts import RunEnvironment, RunOverrides
from llmplay.archive.verify import schema_problems, verify
from llmplay.archive.writer import RunArchive
from llmplay.cli import cli
from llmplay.errors import ArchiveError
from llmplay.playbook.load import load_playbook
from llmplay.redaction import redact_yaml_text
from llmplay_testing.make_archive import PLAYBOOK_TEXT, SECRETS, shared_archive


@pytest.fixture()
def run_dir(tmp_path_factory, tmp_path) -> Path:
    """A private copy of the shared synthetic archive, free to tamper with."""
    src = shared_archive(tmp_path_factory)
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_fresh_archive_verifies_and_lists_every_file(run_dir):
    assert verify(run_dir) == []
    manifest = json.loads((run_dir / MANIFEST).read_text())
    on_disk = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()} - {MANIFEST}
    # report.html is rendered from the archive and `llmplay report` rewrites it: derived, so not hashed
    assert set(manifest["files"]) == on_disk - {"report.html"} and "report.html" in on_disk
    assert {
        "playbook.yaml",
        "playbook.resolved.yaml",
        "trials/t001/requests.parquet",
        "trials/t001/telemetry.parquet",
        "trials/t001/engine.log",
    } <= on_disk
    assert manifest["schema"] == "llmplay/manifest.v1" and manifest["status"] == "complete"
    assert schema_problems({k: v for k, v in manifest.items() if k != "manifest_sha256"}) == []
    assert not list(run_dir.rglob(".tmp-*"))


def test_layout_name_and_run_id(run_dir, tmp_path_factory):
    src = shared_archive(tmp_path_factory)
    assert src.parent.name == "synthetic-tune"
    run_id = json.loads((src / MANIFEST).read_text())["run_id"]
    assert src.name == run_id
    assert len(run_id) == len("20250102T030405Z-abcdef") and run_id[8] == "T" and run_id[15] == "Z"


def test_tampered_file_fails_verify(run_dir):
    log = run_dir / "trials" / "t006" / "engine.log"
    log.write_text(log.read_text() + "one more line\n")
    assert verify(run_dir) == ["trials/t006/engine.log: changed (sha256 differs from manifest.json)"]
    result = CliRunner().invoke(cli, ["verify", str(run_dir)])
    assert result.exit_code == 1
    assert "trials/t006/engine.log: changed" in result.output


def test_deleted_and_added_files_fail_verify(run_dir):
    (run_dir / "trials" / "t001" / "requests.parquet").unlink()
    (run_dir / "trials" / "t001" / "notes.txt").write_text("added later")
    problems = verify(run_dir)
    assert "trials/t001/requests.parquet: missing (listed in manifest.json)" in problems
    assert "trials/t001/notes.txt: not listed in manifest.json (added after the run)" in problems


def test_edited_manifest_fails_verify(run_dir):
    path = run_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["trials"][0]["summary"]["ttft.p95"] = 0.001  # a prettier number, same schema
    path.write_text(json.dumps(manifest, indent=1))
    assert verify(run_dir) == [
        "manifest.json: changed after llmplay wrote it (its manifest_sha256 does not match its content)"
    ]


def test_schema_errors_are_reported(run_dir):
    path = run_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["status"] = "great"
    manifest["surprise"] = 1
    path.write_text(json.dumps(manifest))
    problems = verify(run_dir)
    assert any(p.startswith("manifest.json: status: 'great' is not one of") for p in problems)
    assert any("surprise" in p for p in problems)
    path.write_text("{not json")
    assert verify(run_dir)[0].startswith("manifest.json: not readable JSON")


def test_secrets_never_reach_any_file(run_dir):
    for path in run_dir.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} in {path}"
        if path.suffix == ".parquet":  # compressed pages could hide a value from a byte search
            frame = pd.read_parquet(path)
            text = frame.astype(str).to_csv()
            assert not any(secret in text for secret in SECRETS), path
    manifest = json.loads((run_dir / MANIFEST).read_text())
    assert manifest["environment"]["cluster"]["address"] == "ray://***@ray.internal:10001"
    assert manifest["configs"][0]["engine"]["env"]["HF_TOKEN"] == "***"
    assert "HF_TOKEN=***" in (run_dir / "trials" / "t006" / "engine.log").read_text()
    assert "${env:HF_TOKEN}" in (run_dir / "playbook.yaml").read_text()  # references are kept, they are not secret


def test_archived_playbook_is_the_playbook_as_run(run_dir):
    assert (run_dir / "playbook.yaml").read_text() == PLAYBOOK_TEXT  # nothing secret in it: byte for byte
    for name in ("playbook.yaml", "playbook.resolved.yaml"):
        assert yaml.safe_load((run_dir / name).read_text())["workload"]["prefix_tokens"] == 32
        assert load_playbook(run_dir / name).goals.guards[0].tolerance == 0.5


def test_redact_yaml_text_blanks_literal_secret_values():
    text = "engine:\n  env:\n    HF_TOKEN: hf_literal_value\n    OTHER: ${env:X}\n    API_KEY: '${env:KEY}'\n  url: http://u:p@h/\n"
    out = redact_yaml_text(text, ["zzz"])
    assert "hf_literal_value" not in out and "HF_TOKEN: ***" in out
    assert "API_KEY: '${env:KEY}'" in out and "http://***@h/" in out
    numbers = "workload:\n  prefix_tokens: 64\n  max_tokens: 128  # cap\n  tokenizer: auto\n  ACCESS_TOKEN: abcdef\n"
    out = redact_yaml_text(numbers)
    assert "prefix_tokens: 64\n" in out and "max_tokens: 128  # cap" in out and "tokenizer: auto" in out
    assert "ACCESS_TOKEN: ***" in out


# One name per form a secret-named key takes: each word of llmplay.redaction.SECRET_NAME, with and without a
# separator before it (both the env redaction's and the playbook text's former patterns, now one).
SECRET_NAMES = (
    "HF_TOKEN",
    "GITHUBTOKEN",
    "my.secret",
    "DB_PASSWORD",
    "mysql-passwd",
    "OPENAI_API_KEY",
    "x-api-key",
    "APIKEY",
    "AWS_ACCESS_KEY",
    "ACCESSKEY",
    "SSH_PRIVATE_KEY",
    "PRIVATEKEY",
    "AWS_SECRET_KEY",
    "SECRET-KEY",
    "GOOGLE_CREDENTIALS",
    "credential",
    "proxy_auth",
    "AUTH",
)


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_every_secret_name_form_is_blanked_in_the_archive(tmp_path, name):
    value = "literal-" + name.lower() + "-value"
    text = f"apiVersion: llmplay/v1\nengine:\n  env:\n    {name}: {value}\n"
    playbook = SimpleNamespace(
        metadata=SimpleNamespace(name="secret-names", version="1"),
        path=tmp_path / "p.yaml",
        sha256="0" * 64,
        text=text,
        api_version="llmplay/v1",
        resolved={"engine": {"env": {name: value}}},
    )
    archive = RunArchive.create(tmp_path, playbook, overrides=RunOverrides(), environment=RunEnvironment(), secrets=[])
    for path in archive.run_dir.rglob("*"):
        if path.is_file():
            assert value not in path.read_text(), f"{name}: its value reached {path.name}"
    assert f"    {name}: ***\n" in (archive.run_dir / "playbook.yaml").read_text()
    assert yaml.safe_load((archive.run_dir / "playbook.resolved.yaml").read_text())["engine"]["env"][name] == "***"
    assert verify(archive.run_dir) == []


@pytest.mark.parametrize("name", ["prefix_tokens", "max_tokens", "tokenizer", "OAUTH", "author", "secrets_dir"])
def test_names_that_merely_contain_a_secret_word_are_kept(tmp_path, name):
    archive = RunArchive.create(
        tmp_path,
        SimpleNamespace(
            metadata=SimpleNamespace(name="kept-names", version="1"),
            path=tmp_path / "p.yaml",
            sha256="0" * 64,
            text=f"workload:\n  {name}: kept-text\n",
        ),
        overrides=RunOverrides(),
        environment=RunEnvironment(),
        secrets=[],
    )
    assert f"  {name}: kept-text\n" in (archive.run_dir / "playbook.yaml").read_text()


def test_read_side_round_trips_records_and_telemetry(run_dir):
    archive = RunArchive.open(run_dir)
    trials = archive.trials()
    assert [t.trial_id for t in trials] == [f"t{i:03d}" for i in range(1, 13)]
    failed = [t for t in trials if t.status == "failed"]
    assert len(failed) == 1 and failed[0].error and "log" in failed[0].files
    assert archive.load_records(failed[0].trial_id).empty
    assert archive.load_telemetry(failed[0].trial_id) is None
    records = archive.load_records("t001")
    assert len(records) == 52 and isinstance(records["chunk_ns"].iloc[5], list)
    assert len(records["chunk_ns"].iloc[5]) == 32 and records["sent_ns"].dtype.kind in "iu"
    telemetry = archive.load_telemetry("t001")
    assert set(telemetry.columns) == {"t_s", "source", "metric", "gpu", "value"}
    assert "gpu.util_frac" in set(telemetry["metric"])
    assert "gpu.util_frac" not in set(archive.load_telemetry("t003")["metric"])  # this trial had no NVML
    assert [v.verdict for v in archive.verdicts()] == ["kept", "rejected", "inconclusive"]
    assert archive.verdicts()[0].objective.metric == "throughput.output_tok_s"
    assert [c.config_id for c in archive.configs()] == ["baseline", "parallel-4", "flash-attention", "kv-cache-q8"]
    with pytest.raises(ArchiveError, match="no trial 't999'"):
        archive.load_records("t999")


def test_open_rejects_non_archives(tmp_path):
    for opener in (RunArchive.open, ArchivedRun.open):
        (tmp_path / MANIFEST).unlink(missing_ok=True)
        with pytest.raises(ArchiveError, match=r"no manifest\.json"):
            opener(tmp_path)
        (tmp_path / MANIFEST).write_text('{"schema": "other/v9"}')
        with pytest.raises(ArchiveError, match=r"expected 'llmplay/manifest\.v1'"):
            opener(tmp_path)


def test_resume_appends_and_keeps_verifying(run_dir):
    archive = RunArchive.open(run_dir, secrets=["late-secret-value"])
    archive.write_trial(
        TrialRecord(
            "t013",
            "kv-cache-q8",
            "kv-cache-q8",
            "candidate",
            2,
            "failed",
            "2025-01-02T04:00:00Z",
            1.0,
            {},
            error="boom",
        ),
        None,
        None,
        "late-secret-value in http://me:pw@host/\n",
    )
    assert verify(run_dir) == []
    text = (run_dir / "trials" / "t013" / "engine.log").read_text()
    assert "late-secret-value" not in text and "me:pw" not in text


def test_csv_fallback_without_pyarrow(tmp_path, monkeypatch, run_dir):
    archive = RunArchive.open(run_dir)
    records = archive.load_records("t002")
    telemetry = archive.load_telemetry("t002")
    monkeypatch.setattr(archive_writer, "have_pyarrow", lambda: False)
    trial = next(t for t in archive.trials() if t.trial_id == "t002")
    archive.write_trial(replace(trial, trial_id="t099", files={}), records, telemetry, "")
    assert (run_dir / "trials" / "t099" / "requests.csv").is_file()
    back = archive.load_records("t099")
    assert back["sent_ns"].tolist() == records["sent_ns"].tolist()  # all 64 bits survive the text round trip
    assert back["chunk_ns"].iloc[7] == records["chunk_ns"].iloc[7]
    assert archive.load_telemetry("t099")["gpu"].dtype == "Int64"
    assert verify(run_dir) == []


def test_list_runs_and_ls(tmp_path_factory, tmp_path):
    src = shared_archive(tmp_path_factory)
    rows = list_runs(src.parents[1])
    assert len(rows) == 1
    row = rows[0]
    assert row["playbook"] == "synthetic-tune" and row["status"] == "complete"
    assert row["gpu"] == "NVIDIA H100 80GB HBM3" and row["gates"] == "3/3"
    assert row["engine"] == "llmplay/llamacpp-cpu:local b4567 (abc123)"
    result = CliRunner().invoke(cli, ["ls", "--archive", str(src.parents[1])])
    assert result.exit_code == 0, result.output
    assert "synthetic-tune" in result.output and "3/3" in result.output
    assert CliRunner().invoke(cli, ["ls", "--archive", str(tmp_path)]).output.startswith("no runs under")


def test_ls_keeps_a_status_whole_however_long_the_paths(tmp_path_factory, tmp_path):
    src = shared_archive(tmp_path_factory)
    deep = tmp_path / ("archive-of-a-team-with-a-long-name-" * 3) / "reports"
    shutil.copytree(src.parents[1], deep)
    output = CliRunner().invoke(cli, ["ls", "--archive", str(deep)]).output
    assert " complete " in output, output  # a status folded over two lines reads as two words


def test_archive_root_precedence(monkeypatch):
    monkeypatch.setenv("LLMPLAY_ARCHIVE", "/srv/runs")
    assert archive_root("mine") == Path("mine")
    assert archive_root(None) == Path("/srv/runs")
    monkeypatch.delenv("LLMPLAY_ARCHIVE")
    assert archive_root(None) == Path("reports")


def test_older_manifest_shapes_become_the_same_records():
    """What older llmplay versions left out is handled once, in the reader's conversion."""
    row = tuning_row_from({"config_id": "baseline", "metrics": {"ttft.p95": 0.2, "x": None}, "trials": ["t001"]})
    assert row.samples == {} and row.metrics == {"ttft.p95": 0.2} and row.verdict is None and not row.rebuilt
    diagnosis = diagnosis_from({"memory": {"weights_bytes": 1e9}, "roofline": {"floor_s": 0}, "model": {"a": None}})
    assert diagnosis.memory is not None and diagnosis.memory.device == "gpu" and diagnosis.memory.kv_share is None
    assert diagnosis.roofline is None and diagnosis.model == {} and diagnosis.rules is None
    assert diagnosis_from({}).memory is None
    env = environment_from({"docker": {"version": "26.1"}, "gpu": {"name": "H100", "count": 2}})
    assert env.docker == "26.1" and env.gpu_label == "2x H100" and environment_from({}).gpu_label == "CPU only"
    config = config_from({"config_id": "baseline", "engine": {"kind": "vllm", "gpus": [0, 1]}, "workload": {}})
    assert config.engine.gpus == ("0", "1") and config.workload.input.kind == "fixed" and config.command == ()
    assert playbook_as_run({"trials": {"confidence": "95%"}}).trials.confidence == 0.95  # the spec's default
