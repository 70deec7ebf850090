"""Issue #36: `history` (--check, --accept), `site` and `index` verify as `verify` does, and the index is a cache.

A signed forgery (re-hashed, stale signature) is never judged, accepted or shown as verified; an index row that
disagrees with its manifest is indexed again; absurd figures, damaged rows, a read-only or full root, a linked index
or run folder and a hostile reference.json each get a clear line, never an internal error.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from llmplay.archive.index import INDEX_FILE, ArchiveIndex
from llmplay.archive.index_rows import row_digest
from llmplay.archive.layout import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, MANIFEST
from llmplay.archive.references import REFERENCE_FILE
from llmplay.archive.signing import keygen, load_public_key
from llmplay.archive.verify import manifest_sha256
from llmplay.cli import cli
from llmplay.errors import ExitCode
from llmplay_testing.history_archive import PLAYBOOK_NAME, make_history_archive
from llmplay_testing.make_archive import make_archive


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SIGNING_KEY, raising=False)
    monkeypatch.delenv(ENV_PUBLIC_KEY, raising=False)


@pytest.fixture(scope="module")
def clones(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history") / "reports"
    make_history_archive(root, 6, upgrade_at=4)
    return root


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A signed run of synthetic-tune (the reference) and its team key pair."""
    keys = tmp_path_factory.mktemp("keys")
    private, public, _ = keygen(keys / "team.key")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_SIGNING_KEY, str(private))
        run = make_archive(tmp_path_factory.mktemp("signed"))
    return run, private, public


def copy_of(root: Path, tmp_path: Path) -> Path:
    target = tmp_path / "reports"
    shutil.copytree(root, target, symlinks=True)
    return target


def load(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / MANIFEST).read_text())


def reseal(run_dir: Path, manifest: dict[str, Any]) -> None:
    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def assert_clean(result: Result) -> None:
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


def forged_newest(reference: Path) -> Path:
    """The issue's forgery: a copy of a signed run as a newer run, every TTFT x5, re-hashed; its signature stale."""
    run_id = "20991231T000000Z-f0f0f0"
    forged = reference.parent / run_id
    shutil.copytree(reference, forged)
    manifest = load(forged)
    manifest["run_id"] = run_id
    manifest["environment"]["started_utc"] = "2099-12-31T00:00:00Z"
    for trial in manifest["trials"]:
        trial["summary"] = {k: v * 5 if k.startswith("ttft.") else v for k, v in trial["summary"].items()}
    reseal(forged, manifest)
    return forged


# ---------------------------------------------------------------------------------------------- HIGH: signatures
def test_history_check_accept_and_site_verify_signatures(signed, tmp_path, monkeypatch):
    run, _, public = signed
    root = tmp_path / "reports"
    reference = root / run.parent.name / run.name
    shutil.copytree(run, reference)
    forged = forged_newest(reference)
    assert invoke("verify", str(forged)).exit_code == 0  # integrity only: re-hashed
    monkeypatch.setenv(ENV_PUBLIC_KEY, str(public))
    assert invoke("verify", str(forged)).exit_code == 1

    result = invoke("history", "--archive", str(root), "--accept", forged.name)
    assert_clean(result)
    assert result.exit_code == ExitCode.INFRA and result.output.endswith(
        f"error: {forged}: cannot be a reference: it fails verification: manifest.sig: signature does not match "
        f"manifest.json (changed after it was signed); `llmplay verify {forged}` lists every problem\n"
    ), result.output
    result = invoke("history", "--archive", str(root), "--accept", reference.name)
    assert result.exit_code == 0, result.output

    result = invoke("history", "--archive", str(root), "--check")
    assert_clean(result)
    assert result.exit_code == ExitCode.INFRA, result.output  # a verification failure: not 0, not 4
    assert result.output.endswith(
        f"error: synthetic-tune: the newest run {forged} fails verification: manifest.sig: signature does not match "
        "manifest.json (changed after it was signed); `llmplay verify` lists every problem\n"
    ), result.output

    result = invoke("history", "--archive", str(root))
    assert result.exit_code == 0 and "FAILS VERIFICATION: manifest.sig: signature does not match" in result.output
    result = invoke("site", "--archive", str(root))
    assert result.exit_code == 0, result.output
    html = (root / "index.html").read_text()
    forged_row = html[html.index(f'id="run-{forged.name}"') :].split("</tr>")[0]
    assert 'class="unverified"' in forged_row and "fails verification" in forged_row
    reference_row = html[html.index(f'id="run-{reference.name}"') :].split("</tr>")[0]
    assert "fails verification" not in reference_row
    # the same archive, read without the key, is integrity only; the index re-verifies it with the key given
    by_key = {r.run_id: r.verified for r in ArchiveIndex(root, public_key=load_public_key(public)).runs()}
    assert by_key == {reference.name: True, forged.name: False}


# ---------------------------------------------------------------------------------------------- a cache only
def test_an_index_row_edited_to_verified_is_indexed_again(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs = ArchiveIndex(root, lambda _: None).runs()
    tampered = root / runs[2].path
    manifest = load(tampered)
    manifest["status"] = "complete "  # fails verification (schema and hash)
    (tampered / MANIFEST).write_text(json.dumps(manifest))
    assert not next(r for r in ArchiveIndex(root, lambda _: None).runs() if r.run_id == runs[2].run_id).verified
    with sqlite3.connect(root / INDEX_FILE) as conn:
        conn.execute("UPDATE runs SET verified = 1, problems = '' WHERE run_id = ?", (runs[2].run_id,))
    warnings: list[str] = []
    again = {r.run_id: r for r in ArchiveIndex(root, warnings.append).runs()}
    assert not again[runs[2].run_id].verified and again[runs[2].run_id].problems
    assert warnings == [
        f"{root / INDEX_FILE} disagreed with the manifests: 1 whose index row disagreed with its manifest (edited or "
        f"damaged) ({runs[2].path}); re-indexed them"
    ]
    result = invoke("history", "--archive", str(root), "--accept", runs[2].run_id)
    assert result.exit_code == 1 and "cannot be a reference: it fails verification" in result.output


def test_sync_compares_content_not_mtime_and_size(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs = ArchiveIndex(root, lambda _: None).runs()
    run_dir = root / runs[1].path
    before = os.stat(run_dir / MANIFEST)
    text = (run_dir / MANIFEST).read_text()
    manifest = json.loads(text)
    value = manifest["trials"][0]["summary"]["ttft.p95"]
    edited = text.replace(repr(value), repr(value).replace(repr(value)[-1], "9" if repr(value)[-1] != "9" else "1"), 1)
    assert len(edited) == len(text) and edited != text
    (run_dir / MANIFEST).write_text(edited)  # same size, then the old mtime put back
    os.utime(run_dir / MANIFEST, ns=(before.st_atime_ns, before.st_mtime_ns))
    warnings: list[str] = []
    entry = next(r for r in ArchiveIndex(root, warnings.append).runs() if r.run_id == runs[1].run_id)
    assert "1 changed since indexed" in warnings[0] and not entry.verified


def test_damaged_rows_and_absurd_figures_never_break_the_archive(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    runs = ArchiveIndex(root, lambda _: None).runs()
    huge = root / runs[3].path  # one archive with figures near the largest float: fsum of them overflows
    manifest = load(huge)
    for trial in manifest["trials"]:
        trial["summary"]["ttft.p95"] = 1e308
    reseal(huge, manifest)
    with sqlite3.connect(root / INDEX_FILE) as conn:  # a row edited, then one forged with its digest recomputed
        conn.execute("UPDATE figures SET trial_values = 'abc' WHERE run_id = ?", (runs[1].run_id,))
    for args in (("history",), ("history", PLAYBOOK_NAME), ("index",), ("site",)):
        result = invoke(*args, "--archive", str(root))
        assert_clean(result)
        assert result.exit_code == 0, (args, result.output)
    index = ArchiveIndex(root, lambda _: None)
    entries = {r.run_id: r for r in index.runs()}
    assert "ttft.p95" not in entries[runs[3].run_id].figures  # not measured, for that run only
    assert "ttft.p95" in entries[runs[1].run_id].figures  # re-indexed from its manifest
    result = invoke("history", PLAYBOOK_NAME, "--archive", str(root))
    assert "P95 TTFT" in result.output

    conn = sqlite3.connect(root / INDEX_FILE)
    conn.row_factory = sqlite3.Row
    with conn:
        conn.execute("UPDATE figures SET trial_values = 'abc' WHERE run_id = ?", (runs[1].run_id,))
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (runs[1].run_id,)).fetchone()
        figures = [
            tuple(f) for f in conn.execute("SELECT metric, trial_values FROM figures WHERE run_id = ?", (row[0],))
        ]
        conn.execute("UPDATE runs SET row_digest = ? WHERE run_id = ?", (row_digest(row, figures), row[0]))
    conn.close()
    warnings: list[str] = []
    left = ArchiveIndex(root, warnings.append).runs()
    assert runs[1].run_id not in {r.run_id for r in left} and len(left) == len(runs) - 1
    assert warnings == [
        f"{root / INDEX_FILE}: the row of {runs[1].path} is damaged (trial_values 'abc' are not numbers); skipped"
    ]
    for args in (("history",), ("index",), ("site",)):
        result = invoke(*args, "--archive", str(root))
        assert_clean(result)
        assert result.exit_code == 0, (args, result.output)


# ---------------------------------------------------------------------------------------------- the archive root
def test_a_read_only_or_full_root_is_a_clear_line(clones, tmp_path, monkeypatch):
    root = copy_of(clones, tmp_path)
    (root / INDEX_FILE).unlink(missing_ok=True)
    import tempfile

    for err in (errno.EACCES, errno.ENOSPC):

        def refused(*args: Any, err: int = err, **kwargs: Any) -> Any:  # root may write anywhere: say it is refused
            raise OSError(err, os.strerror(err))

        with monkeypatch.context() as mp:
            mp.setattr(tempfile, "mkstemp", refused)
            result = invoke("index", "--rebuild", "--archive", str(root))
            assert_clean(result)
            assert result.exit_code == 1 and result.output == (
                f"error: {root / INDEX_FILE}: cannot be written ({os.strerror(err)}); expected a writable archive root "
                "with free space (history, site and index read a read-only root through an index in memory)\n"
            )
            result = invoke("history", "--archive", str(root))
            assert_clean(result)
            assert result.exit_code == 0 and "indexing the manifests in memory for this command" in result.output
            result = invoke("site", "--archive", str(root))
            assert_clean(result)
            assert result.exit_code == 1 and result.output.endswith(
                f"error: {root / 'index.html'}: cannot be written ({os.strerror(err)}); expected a writable archive "
                "root with free space, or --out elsewhere\n"
            ), result.output

    assert invoke("index", "--archive", str(root)).exit_code == 0  # an index of this version now exists
    import llmplay.archive.index as index_module

    real = index_module._transaction

    def full(conn: sqlite3.Connection) -> Any:  # what SQLite answers when the disk under the index file is full
        if conn.execute("PRAGMA database_list").fetchone()[2]:
            raise sqlite3.OperationalError("database or disk is full")
        return real(conn)  # the index in memory still works

    shutil.rmtree(root / PLAYBOOK_NAME / sorted(os.listdir(root / PLAYBOOK_NAME))[0])  # a change to write
    monkeypatch.setattr(index_module, "_transaction", full)
    result = invoke("history", "--archive", str(root))
    assert_clean(result)
    assert result.exit_code == 0 and "(database or disk is full); indexing the manifests in memory" in result.output


def test_a_linked_index_is_never_written_through(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    other = tmp_path / "other.sqlite"
    (root / INDEX_FILE).unlink(missing_ok=True)
    other.write_bytes(b"another archive's index")
    (root / INDEX_FILE).symlink_to(other)
    for args in (("history",), ("index",), ("site",)):
        result = invoke(*args, "--archive", str(root))
        assert_clean(result)
        assert result.exit_code == 1 and result.output.endswith(
            f"error: {root / INDEX_FILE}: a symlink or not a regular file; the index is never written through it "
            "(remove it, or `llmplay index --rebuild` replaces it with a new file)\n"
        ), result.output
    assert other.read_bytes() == b"another archive's index"
    assert invoke("index", "--rebuild", "--archive", str(root)).exit_code == 0
    assert not (root / INDEX_FILE).is_symlink() and other.read_bytes() == b"another archive's index"


def test_a_linked_run_folder_is_skipped_by_ls_and_the_index_alike(clones, tmp_path):
    root = copy_of(clones, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    first = sorted((root / PLAYBOOK_NAME).iterdir())[1]
    shutil.move(first, elsewhere)
    (root / PLAYBOOK_NAME / first.name).symlink_to(elsewhere, target_is_directory=True)
    listed = invoke("ls", "--archive", str(root))
    assert listed.exit_code == 0 and first.name not in listed.stdout
    note = f"1 folder(s) under {root} skipped: a symlink ({PLAYBOOK_NAME}/{first.name})"
    assert note in listed.output
    indexed = invoke("index", "--archive", str(root))
    assert indexed.exit_code == 0 and f"unreadable: {PLAYBOOK_NAME}/{first.name}: a symlink, not read" in indexed.output
    assert first.name not in {r.run_id for r in ArchiveIndex(root, lambda _: None).runs()}


@pytest.mark.parametrize("kind", ["fifo", "zero", "big"])
def test_reference_json_is_read_bounded_and_regular(clones, tmp_path, kind):
    root = copy_of(clones, tmp_path)
    path = root / PLAYBOOK_NAME / REFERENCE_FILE
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(json.dumps({"run_id": "x", "note": "y" * (1 << 20)}))
    done: list[Result] = []
    worker = threading.Thread(target=lambda: done.append(invoke("history", PLAYBOOK_NAME, "--archive", str(root))))
    worker.start()
    worker.join(60)
    if worker.is_alive():  # a FIFO nobody writes: unblock it so the test ends, then fail
        with open(path, "w"):
            pass
        worker.join()
        pytest.fail("history hung on a FIFO reference.json")
    (result,) = done
    assert_clean(result)
    why = {
        "fifo": "not a regular file",
        "zero": "a symlink leads outside the run directory",
        "big": "bytes, over the 65536 bytes a reader accepts",
    }[kind]
    assert (
        result.exit_code == 1
        and why in result.output
        and result.output.splitlines()[-1].startswith(f"error: {path}: not readable")
    )
