"""Issue #36: `run --resume` verifies before it continues, never re-signs what it did not measure, and runs only the
configuration its hashed playbook copy resolves to.

Runs are made and resumed through `llmplay run` as the CLI calls it, with trials handed in (no engine):
llmplay_testing.resume_runs. The first run is interrupted after two trials (the baseline's and the candidate's).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner, Result

from llmplay.archive.layout import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, MANIFEST, RESOLVED_FILE, SIGNATURE_FILE
from llmplay.archive.signing import keygen, load_public_key
from llmplay.archive.verify import manifest_sha256, verify
from llmplay.cli import cli
from llmplay_testing.resume_runs import Trials, use_trials, write_playbook

MARKER = "HOST-SECRET-36c0de"


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SIGNING_KEY, raising=False)
    monkeypatch.delenv(ENV_PUBLIC_KEY, raising=False)


@pytest.fixture
def team_key(tmp_path: Path) -> tuple[Path, Path]:
    private, public, _ = keygen(tmp_path / "keys" / "team.key")
    return private, public


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch) -> list[Trials]:
    return use_trials(monkeypatch)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def interrupted_run(tmp_path: Path, archive: str = "r") -> Path:
    """An interrupted run of two archived trials (the baseline's and the candidate's), as `llmplay run` leaves it."""
    path = write_playbook(tmp_path / "resume.yaml")
    result = invoke("run", str(path), "--archive", str(tmp_path / archive), "--duration", "3s")
    assert result.exit_code == 130, result.output
    (run_dir,) = (tmp_path / archive / "resume").iterdir()
    manifest = load(run_dir)
    assert manifest["status"] == "interrupted" and sorted(t["role"] for t in manifest["trials"]) == [
        "baseline",
        "candidate",
    ]
    return run_dir


def load(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / MANIFEST).read_text())


def rehash(run_dir: Path, manifest: dict[str, Any] | None = None) -> None:
    """What anyone can do by hand: every listed file's sha256 and the manifest's own hash recomputed."""
    manifest = manifest or load(run_dir)
    for relpath in manifest["files"]:
        manifest["files"][relpath] = hashlib.sha256((run_dir / relpath).read_bytes()).hexdigest()
    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def faster_candidate(run_dir: Path) -> None:
    """The issue's forgery: the candidate's TTFTs divided by 10 in its records, status interrupted, re-hashed."""
    manifest = load(run_dir)
    candidate = next(t for t in manifest["trials"] if t["role"] == "candidate")
    relpath = candidate["files"]["records"]
    read, write = (
        (pd.read_parquet, pd.DataFrame.to_parquet)
        if relpath.endswith(".parquet")
        else (pd.read_csv, pd.DataFrame.to_csv)
    )
    frame = read(run_dir / relpath)
    for column in ("first_token_ns", "first_text_ns"):
        if column in frame.columns:
            frame[column] = frame["sent_ns"] + (frame[column] - frame["sent_ns"]) // 10
    write(frame, run_dir / relpath, index=False)
    candidate["summary"] = {k: v / 10 if k.startswith("ttft.") else v for k, v in candidate["summary"].items()}
    manifest["status"] = "interrupted"
    rehash(run_dir, manifest)


def assert_refused(result: Result, run_dir: Path, why: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert result.output == f"error: {run_dir}: {why}\n", result.output


# ---------------------------------------------------------------------------------------------- HIGH: re-signing
def test_resume_never_re_signs_forged_trials(tmp_path, seam, team_key, monkeypatch):
    private, public = team_key
    monkeypatch.setenv(ENV_SIGNING_KEY, str(private))
    run_dir = interrupted_run(tmp_path)
    forged = tmp_path / "copy" / "resume" / run_dir.name
    shutil.copytree(run_dir, forged)
    faster_candidate(forged)
    assert invoke("verify", str(forged), "--public-key", str(public)).exit_code == 1
    before = {p.name: p.read_bytes() for p in (forged / MANIFEST, forged / SIGNATURE_FILE)}

    # the signing key alone is enough: a resume checks the signature with its own key's public half
    result = invoke("run", "--resume", str(forged))
    why = (
        "fails verification: manifest.sig: signature does not match manifest.json (changed after it was signed); "
        f"`llmplay verify {forged}` lists every problem, --unverified resumes it anyway (unsigned)"
    )
    assert_refused(result, forged, why)
    assert len(seam) == 1  # no trial was asked for, no engine would have started
    assert {p.name: p.read_bytes() for p in (forged / MANIFEST, forged / SIGNATURE_FILE)} == before
    monkeypatch.setenv(ENV_PUBLIC_KEY, str(public))
    assert_refused(invoke("run", "--resume", str(forged)), forged, why)
    monkeypatch.delenv(ENV_PUBLIC_KEY)

    # asked to continue anyway: it does, says so first, and the result still never verifies against the team's key
    result = invoke("run", "--resume", str(forged), "--unverified")
    assert result.exit_code in (0, 3), result.output
    assert result.output.startswith(
        f"WARNING: {forged}: this archive failed verification: manifest.sig: signature does not match manifest.json "
        "(changed after it was signed); resuming anyway, unsigned\n"
    )
    assert [t[0] for t in seam[1].seen] == ["t003", "t004"] and load(forged)["status"] == "complete"
    assert (forged / SIGNATURE_FILE).read_bytes() == before[SIGNATURE_FILE]  # left to go stale, never re-made
    result = invoke("verify", str(forged), "--public-key", str(public))
    assert result.exit_code == 1 and "signature does not match manifest.json" in result.output

    # the genuine run resumes, signed, and verifies against the team's key
    assert invoke("run", "--resume", str(run_dir)).exit_code in (0, 3)
    assert verify(run_dir, public_key=load_public_key(public)) == []


def test_an_unsigned_run_is_never_signed_by_a_resume(tmp_path, seam, team_key, monkeypatch):
    run_dir = interrupted_run(tmp_path)  # no signing key while it ran
    monkeypatch.setenv(ENV_SIGNING_KEY, str(team_key[0]))
    result = invoke("run", "--resume", str(run_dir))
    assert_refused(
        result,
        run_dir,
        f"fails verification: manifest.sig: missing; ${ENV_SIGNING_KEY} would sign earlier trials that no key signed "
        f"(unset it to resume unsigned); `llmplay verify {run_dir}` lists every problem, --unverified resumes it "
        "anyway (unsigned)",
    )
    monkeypatch.delenv(ENV_SIGNING_KEY)
    assert invoke("run", "--resume", str(run_dir)).exit_code in (0, 3)
    assert not (run_dir / SIGNATURE_FILE).exists() and verify(run_dir) == []


# ---------------------------------------------------------------------------------------------- HIGH: the image
@pytest.mark.parametrize("rehashed", [False, True])
def test_a_tampered_resolved_copy_never_chooses_the_image(tmp_path, seam, rehashed):
    run_dir = interrupted_run(tmp_path)
    resolved = yaml.safe_load((run_dir / RESOLVED_FILE).read_text())
    resolved["engine"]["image"] = "attacker/image:latest"
    (run_dir / RESOLVED_FILE).write_text(yaml.safe_dump(resolved, sort_keys=False))
    if rehashed:
        rehash(run_dir)  # unsigned: integrity only, so verify passes
        assert invoke("verify", str(run_dir)).exit_code == 0
    result = invoke("run", "--resume", str(run_dir))
    if rehashed:
        why = (
            f"{run_dir / RESOLVED_FILE}: disagrees with {run_dir / 'playbook.yaml'} resolved again (at engine.image): "
            "the copy was edited, or a file it extends changed since the run started; a resumed run measures what "
            "its first trials measured, so it is not resumed (start a new run)"
        )
        assert result.exit_code == 1 and result.output == f"error: {why}\n", result.output
    else:
        assert_refused(
            result,
            run_dir,
            f"fails verification: {RESOLVED_FILE}: changed (sha256 differs from manifest.json); `llmplay verify "
            f"{run_dir}` lists every problem, --unverified resumes it anyway (unsigned)",
        )
    assert len(seam) == 1 and "attacker" not in json.dumps(load(run_dir)["configs"])


# ---------------------------------------------------------------------------------------------- bounded reads
def test_resume_reads_its_playbook_copies_only_from_inside_the_run(tmp_path, seam):
    outside = tmp_path / "host" / "secret.yaml"
    outside.parent.mkdir()
    outside.write_text(f"apiVersion: llmplay/v1\nnote: {MARKER}\n")
    run_dir = interrupted_run(tmp_path)

    manifest = load(run_dir)
    manifest["playbook"]["file"] = str(outside)
    rehash(run_dir, manifest)
    result = invoke("run", "--resume", str(run_dir))
    assert result.exit_code == 1 and f"playbook.file: {str(outside)!r} is not a file listed in" in result.output
    result = invoke("run", "--resume", str(run_dir), "--unverified")
    assert result.exit_code == 1 and MARKER not in result.output, result.output
    assert result.output.splitlines()[-1] == (
        f"error: {run_dir}: the archived playbook {str(outside)!r}: absolute path; expected a path relative to the run "
        "directory; cannot resume it"
    )
    manifest["playbook"]["file"] = "playbook.yaml"
    rehash(run_dir, manifest)

    (run_dir / RESOLVED_FILE).unlink()
    (run_dir / RESOLVED_FILE).symlink_to(outside)
    rehash(run_dir)  # the link's target hashed, as a forger would
    result = invoke("run", "--resume", str(run_dir), "--unverified")
    assert result.exit_code == 1 and MARKER not in result.output, result.output
    assert result.output.splitlines()[-1] == (
        f"error: {run_dir}: the archived playbook {RESOLVED_FILE!r}: a symlink leads outside the run directory; "
        "cannot resume it"
    )
    assert len(seam) == 1


def test_a_trial_id_llmplay_never_writes_is_a_clear_error(tmp_path, seam):
    run_dir = interrupted_run(tmp_path)
    manifest = load(run_dir)
    manifest["trials"][0]["trial_id"] = "tabc"
    rehash(run_dir, manifest)
    result = invoke("run", "--resume", str(run_dir))
    assert result.exit_code == 1 and "internal error" not in result.output, result.output
    assert result.output.splitlines()[-1] == (
        f"error: {run_dir}: manifest.json trials: trial_id 'tabc'; expected t followed by digits, like t001, as "
        "llmplay writes them (the manifest was edited; cannot resume it)"
    )


def test_unverified_and_public_key_belong_to_resume(tmp_path):
    path = write_playbook(tmp_path / "resume.yaml")
    result = invoke("run", str(path), "--unverified", "--archive", str(tmp_path / "r"))
    assert result.exit_code == 2 and "only with --resume RUN_DIR" in result.output
    assert not (tmp_path / "r").exists()
