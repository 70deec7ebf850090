"""Issue #25: an audit archive nobody can quietly rewrite or use to read the host.

Tampering (report never re-seals), authenticity (Ed25519 signatures), containment (no path from an archive leaves
its run directory), and a property test that mutates copies of an archive and runs every command that reads one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from llmplay.archive.layout import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, MANIFEST, REPORT_FILE, SIGNATURE_FILE
from llmplay.archive.listing import list_runs
from llmplay.archive.paths import OutsideError, inside, read_text_inside
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.signing import keygen, load_private_key, signature_document
from llmplay.archive.verify import manifest_sha256, verify
from llmplay.archive.writer import RunArchive
from llmplay.cli import cli
from llmplay.errors import ArchiveError
from llmplay_testing.make_archive import make_archive, shared_archive

MARKER = "HOST-SECRET-4f1c9e"  # the content of every file outside the run that an attack points at


# ---------------------------------------------------------------------------------------------- helpers
def copy_run(src: Path, dest_root: Path) -> Path:
    """A private copy of a run, laid out as <root>/<playbook>/<run_id> so `ls --archive root` finds it."""
    dst = dest_root / src.parent.name / src.name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def load(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / MANIFEST).read_text())


def reseal(run_dir: Path, manifest: dict[str, Any]) -> None:
    """What anyone can do by hand: write an edited manifest with its unkeyed hash recomputed."""
    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def assert_one_line_refusal(result: Result, run_dir: Path) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.output.startswith(f"error: {run_dir}: fails verification: "), result.output
    assert result.output.count("\n") == 1, result.output


@pytest.fixture()
def run_dir(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    return copy_run(shared_archive(tmp_path_factory), tmp_path / "reports")


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A host file no archive may make a command read."""
    path = tmp_path / "host" / "secret.txt"
    path.parent.mkdir()
    path.write_text(f"root:x:0:0:{MARKER}\n")
    return path


@pytest.fixture(scope="module")
def team_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    private, public, _ = keygen(tmp_path_factory.mktemp("keys") / "team.key")
    return private, public


@pytest.fixture(scope="module")
def signed_src(tmp_path_factory: pytest.TempPathFactory, team_key: tuple[Path, Path]) -> Iterator[Path]:
    """A synthetic archive written with $LLMPLAY_SIGNING_KEY set: the writer signs every manifest it writes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_SIGNING_KEY, str(team_key[0]))
        mp.delenv(ENV_PUBLIC_KEY, raising=False)
        yield make_archive(tmp_path_factory.mktemp("signed"))


# ---------------------------------------------------------------------------------------------- defect 1: re-sealing
def test_report_refuses_a_tampered_archive_and_never_reseals_it(run_dir: Path):
    text = (run_dir / MANIFEST).read_text()
    assert '"verdict": "inconclusive"' in text
    (run_dir / MANIFEST).write_text(text.replace('"verdict": "inconclusive"', '"verdict": "kept"', 1))
    tampered = (run_dir / MANIFEST).read_bytes()
    report_before = (run_dir / REPORT_FILE).read_bytes()
    assert invoke("verify", str(run_dir)).exit_code == 1

    assert_one_line_refusal(invoke("report", str(run_dir)), run_dir)
    assert (run_dir / MANIFEST).read_bytes() == tampered  # before the fix: re-sealed, and verify then passed
    assert (run_dir / REPORT_FILE).read_bytes() == report_before
    result = invoke("verify", str(run_dir))
    assert result.exit_code == 1 and "manifest_sha256 does not match" in result.output

    # asked to render anyway: it does, says so first on the console and atop the page, and still never re-seals
    result = invoke("report", str(run_dir), "--unverified")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"WARNING: {run_dir}: this archive failed verification: manifest.json: changed")
    html = (run_dir / REPORT_FILE).read_text()
    assert html.index('id="unverified"') < html.index("<h1")
    assert "This archive failed verification:" in html
    assert (run_dir / MANIFEST).read_bytes() == tampered
    assert invoke("verify", str(run_dir)).exit_code == 1


def test_report_leaves_the_manifest_byte_for_byte_and_keeps_verifying(run_dir: Path):
    before = (run_dir / MANIFEST).read_bytes()
    result = invoke("report", str(run_dir))
    assert result.exit_code == 0, result.output
    assert (run_dir / MANIFEST).read_bytes() == before
    assert verify(run_dir) == []


def test_compare_and_retest_refuse_a_tampered_run(run_dir: Path, tmp_path: Path, tmp_path_factory):
    other = copy_run(shared_archive(tmp_path_factory), tmp_path / "other")
    manifest = load(run_dir)
    manifest["final_config_id"] = "baseline"
    (run_dir / MANIFEST).write_text(json.dumps(manifest))  # not re-sealed
    result = invoke("compare", str(other), str(run_dir))
    assert_one_line_refusal(result, run_dir)
    result = invoke("retest", str(run_dir), "--archive", str(tmp_path / "retests"))
    assert_one_line_refusal(result, run_dir)
    assert not (tmp_path / "retests").exists()  # refused before any engine or archive was started

    html = tmp_path / "cmp.html"
    result = invoke("compare", str(other), str(run_dir), "--unverified", "--html", str(html))
    assert result.exit_code in (0, 4), result.output
    assert result.output.startswith(f"WARNING: run B ({run_dir}) failed verification: manifest.json: changed")
    page = html.read_text()
    assert "Run B: this archive failed verification:" in page and page.index("failed verification") < page.index("<h1")


def test_report_exits_non_zero_when_report_html_cannot_be_written(run_dir: Path):
    (run_dir / REPORT_FILE).unlink()
    (run_dir / REPORT_FILE).mkdir()  # os.replace cannot put a file there
    assert verify(run_dir) == []
    result = invoke("report", str(run_dir))
    assert result.exit_code == 1, result.output  # before the fix: a warning, and exit 0
    assert result.output.startswith(f"error: {run_dir / REPORT_FILE}: not written (")
    assert result.output.count("\n") == 1 and "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------- defect 2: containment
def point_log_at(run_dir: Path, target: str) -> None:
    """The attack of issue #25: a failed trial's log entry names another file, and the manifest is re-sealed."""
    manifest = load(run_dir)
    trial = next(t for t in manifest["trials"] if t["status"] == "failed")
    trial["files"]["log"] = target
    reseal(run_dir, manifest)


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_a_files_entry_outside_the_run_fails_verify_and_is_never_read(run_dir: Path, outside: Path, kind: str):
    target = str(outside) if kind == "absolute" else os.path.relpath(outside, run_dir)
    point_log_at(run_dir, target)
    problems = verify(run_dir)
    assert any(p.startswith("trials[t") and f"{target!r} is not a file listed in" in p for p in problems), problems
    assert_one_line_refusal(invoke("report", str(run_dir)), run_dir)
    result = invoke("report", str(run_dir), "--unverified")  # even asked to: the reader keeps to the run directory
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    why = "absolute path" if kind == "absolute" else "'..' leaves the run directory"
    assert why in result.output and result.output.count("\n") == 2  # the warning line, then the error
    assert MARKER not in result.output and MARKER not in (run_dir / REPORT_FILE).read_text()


def test_a_listed_file_replaced_by_a_symlink_out_of_the_run_fails_by_name(run_dir: Path, outside: Path):
    manifest = load(run_dir)
    trial = next(t for t in manifest["trials"] if t["status"] == "failed")
    log = run_dir / trial["files"]["log"]
    log.unlink()
    log.symlink_to(outside)
    manifest["files"][trial["files"]["log"]] = hashlib.sha256(outside.read_bytes()).hexdigest()  # hash matches
    reseal(run_dir, manifest)
    assert verify(run_dir) == [f"{trial['files']['log']}: a symlink leads outside the run directory"]
    result = invoke("report", str(run_dir), "--unverified")
    assert result.exit_code == 1 and MARKER not in result.output
    assert MARKER not in (run_dir / REPORT_FILE).read_text()


def test_a_symlinked_trial_directory_or_manifest_is_refused(run_dir: Path, outside: Path, tmp_path: Path):
    elsewhere = outside.parent / "t001"  # the trial's very files, moved out of the run: hashes still match
    shutil.move(run_dir / "trials" / "t001", elsewhere)
    (run_dir / "trials" / "t001").symlink_to(elsewhere, target_is_directory=True)
    problems = verify(run_dir)
    assert "trials/t001: a symlink to a directory, not listed in manifest.json (added after the run)" in problems
    assert any(p.startswith("trials/t001/") and "symlink leads outside" in p for p in problems), problems

    # ls reads manifests only, never through a symlink out of the run
    (run_dir / MANIFEST).unlink()
    (run_dir / MANIFEST).symlink_to(outside)
    rows = list_runs(run_dir.parent.parent)
    assert [r["status"] for r in rows] == ["unreadable"]
    assert "symlink leads outside" in rows[0]["why"]
    result = invoke("ls", "--archive", str(run_dir.parent.parent))
    assert result.exit_code == 0 and "unreadable" in result.output and MARKER not in result.output
    result = invoke("ls", "--archive", str(run_dir.parent.parent), "--verify")
    assert result.exit_code == 1 and "FAILED" in result.output and MARKER not in result.output


def test_the_containment_rule(tmp_path: Path, outside: Path):
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    (run / "sub" / "ok.txt").write_text("fine")
    (run / "big.txt").write_text("x" * 100)
    (run / "link-in").symlink_to(run / "sub" / "ok.txt")
    (run / "link-out").symlink_to(outside)
    (run / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(run / "fifo")
    assert read_text_inside(run, "sub/ok.txt") == "fine"
    assert read_text_inside(run, "link-in") == "fine"  # a symlink that stays inside is fine
    cases = {
        str(outside): "absolute path; expected a path relative to the run directory",
        "../host/secret.txt": "'..' leaves the run directory; expected a path inside it",
        "sub/../../host/secret.txt": "'..' leaves the run directory; expected a path inside it",
        "link-out": "a symlink leads outside the run directory",
        "dangling": "a symlink to nothing; expected a regular file",
        "fifo": "not a regular file",
        "sub": "not a regular file",
        "absent.txt": "missing",
        "": "expected a relative path, found an empty or NUL-bearing name",
    }
    for relpath, why in cases.items():
        with pytest.raises(OutsideError) as caught:
            inside(run, relpath)
        assert caught.value.why == why, relpath
        assert str(caught.value) == f"{relpath}: {why}"
    for value in (7, None, ["sub/ok.txt"], {"a": 1}):
        with pytest.raises(OutsideError, match="expected a relative path \\(text\\), found"):
            inside(run, value)
    with pytest.raises(OutsideError, match="100 bytes, over the 10 bytes a reader accepts"):
        inside(run, "big.txt", max_bytes=10)


# ---------------------------------------------------------------------------------------------- authenticity
def test_the_manifest_hash_alone_is_integrity_only(run_dir: Path):
    manifest = load(run_dir)
    next(v for v in manifest["verdicts"] if v["verdict"] == "inconclusive")["verdict"] = "kept"
    reseal(run_dir, manifest)  # anyone can recompute an unkeyed hash: verify cannot tell, and says so
    result = invoke("verify", str(run_dir))
    assert result.exit_code == 0 and result.output == f"{run_dir}: ok (unsigned: integrity only)\n"


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path: Path):
    result = invoke("keygen", str(tmp_path / "keys" / "team.key"))
    assert result.exit_code == 0, result.output
    private, public = tmp_path / "keys" / "team.key", tmp_path / "keys" / "team.key.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in private.read_bytes() and b"PUBLIC KEY" in public.read_bytes()
    assert "fingerprint SHA256:" in result.output and ENV_SIGNING_KEY in result.output
    again = invoke("keygen", str(private))
    assert again.exit_code == 1 and "already exists" in again.output and again.output.count("\n") == 1


def test_a_signed_run_verifies_with_its_public_key_and_fails_after_any_byte_change(
    signed_src: Path, team_key: tuple[Path, Path], tmp_path: Path, monkeypatch
):
    monkeypatch.delenv(ENV_PUBLIC_KEY, raising=False)
    _, public = team_key
    run_dir = copy_run(signed_src, tmp_path / "a")
    fp = json.loads((run_dir / SIGNATURE_FILE).read_text())["public_key_fingerprint"]
    assert invoke("verify", str(run_dir)).output == (
        f"{run_dir}: ok (signed by {fp}, not checked: no --public-key given (integrity only))\n"
    )
    result = invoke("verify", str(run_dir), "--public-key", str(public))
    assert result.exit_code == 0 and result.output == f"{run_dir}: ok (signature valid: signed by {fp})\n"
    monkeypatch.setenv(ENV_PUBLIC_KEY, str(public))  # the team's CI can set it once for every command
    assert invoke("verify", str(run_dir)).exit_code == 0
    # re-rendering the report touches neither the manifest nor its signature
    assert invoke("report", str(run_dir)).exit_code == 0
    assert invoke("verify", str(run_dir), "--public-key", str(public)).exit_code == 0

    # any byte of the manifest, re-sealed or not
    edited = copy_run(signed_src, tmp_path / "b")
    manifest = load(edited)
    next(v for v in manifest["verdicts"] if v["verdict"] == "inconclusive")["verdict"] = "kept"
    reseal(edited, manifest)
    result = invoke("verify", str(edited), "--public-key", str(public))
    assert result.exit_code == 1
    assert f"{edited}: manifest.sig: signature does not match manifest.json (changed after it was signed)" in (
        result.output
    )
    assert_one_line_refusal(invoke("report", str(edited)), edited)  # $LLMPLAY_PUBLIC_KEY applies here too

    for flip in ("manifest.json", "trials/t001/requests.parquet", "playbook.yaml"):
        copy = copy_run(signed_src, tmp_path / f"c-{flip.replace('/', '-')}")
        data = bytearray((copy / flip).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / flip).write_bytes(bytes(data))
        assert invoke("verify", str(copy), "--public-key", str(public)).exit_code == 1, flip

    # stripped of its signature, or signed by someone else's key
    stripped = copy_run(signed_src, tmp_path / "d")
    (stripped / SIGNATURE_FILE).unlink()
    result = invoke("verify", str(stripped), "--public-key", str(public))
    assert result.exit_code == 1 and f"manifest.sig: missing; expected a signature by {fp}" in result.output
    _, other_public, other_fp = keygen(tmp_path / "other.key")
    result = invoke("verify", str(run_dir), "--public-key", str(other_public))
    assert result.exit_code == 1 and f"manifest.sig: signed by {fp}, expected {other_fp}" in result.output
    # a forger who re-signs with their own key still fails against the team's key
    forged = copy_run(signed_src, tmp_path / "e")
    (forged / SIGNATURE_FILE).write_bytes(
        signature_document((forged / MANIFEST).read_bytes(), load_private_key(tmp_path / "other.key"))
    )
    assert invoke("verify", str(forged), "--public-key", str(public)).exit_code == 1


def test_a_signed_run_is_never_written_on_without_its_key(signed_src: Path, tmp_path: Path, monkeypatch):
    monkeypatch.delenv(ENV_SIGNING_KEY, raising=False)
    run_dir = copy_run(signed_src, tmp_path)
    with pytest.raises(ArchiveError, match=f"is signed \\(manifest.sig\\); expected \\${ENV_SIGNING_KEY} set"):
        RunArchive.open(run_dir)  # --resume would rewrite the manifest and leave a signature that no longer matches


def test_a_broken_signing_key_stops_the_run_before_its_directory_exists(tmp_path: Path, monkeypatch):
    (tmp_path / "bad.key").write_text("not a key\n")
    monkeypatch.setenv(ENV_SIGNING_KEY, str(tmp_path / "bad.key"))
    with pytest.raises(ArchiveError, match=f"^\\${ENV_SIGNING_KEY}: .*bad.key: not an unencrypted PEM private key"):
        make_archive(tmp_path / "reports")
    assert not list(tmp_path.rglob(MANIFEST))


def test_an_old_unsigned_archive_that_hashed_its_report_still_verifies_and_rerenders(run_dir: Path):
    manifest = load(run_dir)  # as llmplay wrote them before report.html became a derived, unhashed file
    manifest["files"][REPORT_FILE] = hashlib.sha256((run_dir / REPORT_FILE).read_bytes()).hexdigest()
    manifest["files"] = dict(sorted(manifest["files"].items()))
    reseal(run_dir, manifest)
    result = invoke("verify", str(run_dir))
    assert result.exit_code == 0 and "unsigned: integrity only" in result.output
    assert invoke("report", str(run_dir)).exit_code == 0
    assert invoke("verify", str(run_dir)).exit_code == 0
    assert ArchivedRun.open(run_dir).trials()


# ---------------------------------------------------------------------------------------------- property test
# Every command that reads an archive, on copies mutated the ways an attacker or an accident would: paths in files
# entries (absolute, '..', symlinks out), hashes, the types of JSON fields, deleted files; re-sealed or not, signed
# or not. Fixed and derandomized so CI time is bounded (about 25 s on 2 cores, most of it building the archive).
KINDS = ("path", "symlink", "hash", "file", "type", "delete", "manifest-link")
MUTATION_EXAMPLES = 4  # per kind
MUTATION_SETTINGS = settings(
    max_examples=MUTATION_EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_WATCHED: dict[str, Any] = {"root": None, "opened": []}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Records every file the process opens or lists under the watched host directory (an audit hook sees opens by
    Python and by the libraries it hands file objects to; the archive reader hands pyarrow and pandas file objects)."""
    root = _WATCHED["root"]
    if root is None or event not in ("open", "os.listdir", "os.scandir") or not args:
        return
    path = args[0]
    if isinstance(path, (str, bytes, os.PathLike)):
        _WATCHED["root"] = None  # realpath below must not re-enter
        try:
            if os.path.realpath(os.fsdecode(path)).startswith(root):
                _WATCHED["opened"].append((event, os.fsdecode(path)))
        finally:
            _WATCHED["root"] = root


sys.addaudithook(_audit)

_ROLES = ("records", "telemetry", "log")
_VALUES: list[Any] = ["text", 7, -1, 2.5, [], ["a"], None, {}, {"x": 1}, True]


@st.composite
def mutations(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "trial": draw(st.integers(0, 15)),
        "role": draw(st.sampled_from(_ROLES)),
        "path_form": draw(st.sampled_from(["absolute", "dotdot", "dotdot-deep", "host"])),
        "list_it": draw(st.booleans()),  # also add the outside path, with its true hash, to the files map
        "steps": draw(st.lists(st.integers(0, 40), min_size=1, max_size=4)),  # a walk to the field to retype
        "value": draw(st.sampled_from(_VALUES)),
        "reseal": draw(st.booleans()),
        "signed": draw(st.booleans()),
        "anyway": draw(st.integers(0, 2)) == 0,  # now and then also run report with --unverified
    }


def _retype(node: Any, steps: list[int], value: Any) -> bool:
    """Replace the field a walk of child indices reaches with `value`; False when it would change nothing."""
    for depth, step in enumerate(steps):
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            return False
        key = keys[step % len(keys)]
        child = node[key]
        if depth == len(steps) - 1 or not isinstance(child, (dict, list)) or not child:
            if child == value and type(child) is type(value):
                return False
            node[key] = value
            return True
        node = child
    return False


def _mutate(run_dir: Path, m: dict[str, Any], outside: Path) -> None:
    manifest = load(run_dir)
    trials = manifest["trials"]
    trial = trials[m["trial"] % len(trials)]
    files = trial["files"]
    role = m["role"] if m["role"] in files else next(iter(files), None)
    kind = m["kind"]
    if kind == "path" and role is not None:
        form = m["path_form"]
        target = {
            "absolute": str(outside),
            "dotdot": os.path.relpath(outside, run_dir),
            "dotdot-deep": "trials/" + os.path.relpath(outside, run_dir / "trials"),
            "host": "/etc/passwd",
        }[form]
        files[role] = target
        if m["list_it"] and form != "host":
            manifest["files"][target] = hashlib.sha256(outside.read_bytes()).hexdigest()
    elif kind == "symlink" and role is not None:
        victim = run_dir / files[role]
        victim.unlink()
        victim.symlink_to(outside)
        if m["list_it"]:
            manifest["files"][files[role]] = hashlib.sha256(outside.read_bytes()).hexdigest()
    elif kind == "hash":
        key = sorted(manifest["files"])[m["trial"] % len(manifest["files"])]
        manifest["files"][key] = hashlib.sha256(key.encode()).hexdigest()
    elif kind == "file":
        key = sorted(manifest["files"])[m["trial"] % len(manifest["files"])]
        with open(run_dir / key, "ab") as fh:
            fh.write(b"\n")
    elif kind == "type":
        _retype(manifest, m["steps"], m["value"])
    elif kind == "delete":
        key = sorted(manifest["files"])[m["trial"] % len(manifest["files"])]
        (run_dir / key).unlink()
        if m["list_it"]:
            del manifest["files"][key]
    elif kind == "manifest-link":
        (run_dir / MANIFEST).unlink()
        (run_dir / MANIFEST).symlink_to(outside)
        return
    if m["reseal"]:
        try:
            reseal(run_dir, manifest)
        except ValueError:  # a non-finite number cannot be canonical JSON: written as is
            (run_dir / MANIFEST).write_text(json.dumps(manifest))
    else:
        (run_dir / MANIFEST).write_text(json.dumps(manifest))


def _no_leak(result: Result, *pages: Path) -> None:
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert MARKER not in result.output
    for page in pages:
        if page.is_file():
            assert MARKER not in page.read_text(errors="replace")


@pytest.mark.parametrize("kind", KINDS)
@MUTATION_SETTINGS
@given(drawn=mutations())
def test_mutated_archives_never_leak_never_pass_never_crash(
    kind: str, drawn: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, team_key: tuple[Path, Path]
):
    m = {**drawn, "kind": kind}
    base = tmp_path_factory.mktemp("mutant")
    host = base / "host"
    host.mkdir()
    outside = host / "secret.txt"
    outside.write_text(f"root:x:0:0:{MARKER}\n")
    src = shared_archive(tmp_path_factory)
    pristine = src  # only read: verification never writes, and a refused compare reads nothing
    run_dir = copy_run(src, base / "b")
    private, public = team_key
    if m["signed"]:
        (run_dir / SIGNATURE_FILE).write_bytes(
            signature_document((run_dir / MANIFEST).read_bytes(), load_private_key(private))
        )
    before = {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    _mutate(run_dir, m, outside)
    after = {
        p.relative_to(run_dir).as_posix(): (p.read_bytes() if not p.is_symlink() else b"link")
        for p in run_dir.rglob("*")
        if p.is_file() or p.is_symlink()
    }
    changed = before != after
    key = ["--public-key", str(public)] if m["signed"] else []
    compare_html = base / "cmp.html"

    _WATCHED.update(root=str(host.resolve()), opened=[])
    try:
        verified = invoke("verify", str(run_dir), *key)
        _no_leak(verified)
        failed = verified.exit_code != 0
        event(f"{m['kind']}: verify {'fails' if failed else 'passes'}")
        if m["signed"] and changed:
            assert failed, f"a signed archive verified after {m}"
        # Unsigned, a re-sealed manifest is integrity only: a retyped field within the schema, or a file dropped
        # together with its entry when nothing else names it, is what a signature is for (asserted above).
        forgeable = kind == "type" or (kind == "delete" and m["list_it"] and m["reseal"])
        if changed and not forgeable:
            assert failed, f"verify passed after {m}: {verified.output}"
        report = invoke("report", str(run_dir), *key)
        _no_leak(report, run_dir / REPORT_FILE)
        for side in (("compare", str(pristine), str(run_dir)), ("compare", str(run_dir), str(pristine))):
            compared = invoke(*side, *key, "--html", str(compare_html))
            _no_leak(compared, compare_html)
            if failed:
                assert compared.exit_code == 1 and "fails verification" in compared.output, compared.output
        listed = invoke("ls", "--archive", str(base / "b"), "--verify", *key)
        _no_leak(listed)
        assert listed.exit_code == (1 if failed else 0), listed.output
        if failed:
            assert report.exit_code == 1 and "fails verification" in report.output, report.output
            assert report.output.count("\n") == 1
            retest = invoke("retest", str(run_dir), *key, "--archive", str(base / "retests"))
            _no_leak(retest)
            assert retest.exit_code == 1 and "fails verification" in retest.output, retest.output
            assert not (base / "retests").exists()
            if m["anyway"] and kind in ("path", "symlink", "type"):  # the others only change bytes the reader trusts
                anyway = invoke("report", str(run_dir), *key, "--unverified")
                _no_leak(anyway, run_dir / REPORT_FILE)
                assert anyway.output.startswith("WARNING: ")
                if anyway.exit_code == 0:
                    assert 'id="unverified"' in (run_dir / REPORT_FILE).read_text()
        else:
            assert report.exit_code == 0, report.output
        assert _WATCHED["opened"] == [], _WATCHED["opened"]
    finally:
        _WATCHED["root"] = None
    shutil.rmtree(base)


# ---------------------------------------------------------------------------------------------- issue 36: every reader
# The same mutated archives, now read by every command that acts on archives (issue #36): `run --resume` (its trials
# handed in: no engine may start), `history`, `history --accept`, `history --check` (against a reference.json written
# by hand, as an earlier --accept would have), `index` and `site`; then the index itself mutated in place (a column
# of a row or a figure set to a wrong type, an edited `verified`) and history, site and index read again. None may
# fail with an internal error or a traceback, leak the host file, or pass an archive that fails verification.
READER_EXAMPLES = 2  # per kind: each example builds an index and a site, and resumes a run
READER_SETTINGS = settings(
    max_examples=READER_EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_INDEX_EDITS = (
    ("runs", "verified", 1),
    ("runs", "verified", "yes"),
    ("runs", "config_json", "["),
    ("runs", "gates_json", '{"x": 1}'),
    ("runs", "goals_json", "[]"),
    ("runs", "files_json", "7"),
    ("runs", "status", "complete"),
    ("runs", "problems", ""),
    ("figures", "trial_values", "abc"),
    ("figures", "trial_values", "1e308,1e308"),
    ("figures", "trial_values", "nan"),
)


def _edit_index(root: Path, edit: tuple[str, str, Any], recompute: bool) -> None:
    """One column of every row (or figure) set to `value`; with `recompute`, the rows' digests made to match, as
    someone who read llmplay's code would."""
    from llmplay.archive.index_rows import row_digest

    table, column, value = edit
    conn = sqlite3.connect(root / "index.sqlite")
    conn.row_factory = sqlite3.Row
    with conn:
        conn.execute(f"UPDATE {table} SET {column} = ?", (value,))
        if recompute:
            for row in conn.execute("SELECT * FROM runs").fetchall():
                figures = [
                    tuple(f)
                    for f in conn.execute("SELECT metric, trial_values FROM figures WHERE run_id = ?", (row["run_id"],))
                ]
                conn.execute(
                    "UPDATE runs SET row_digest = ? WHERE run_id = ?", (row_digest(row, figures), row["run_id"])
                )
    conn.close()


@pytest.mark.parametrize("kind", KINDS)
@READER_SETTINGS
@given(
    drawn=mutations(),
    edit=st.sampled_from(_INDEX_EDITS),
    recompute=st.booleans(),
)
def test_mutated_archives_and_index_never_crash_history_site_index_or_resume(
    kind: str,
    drawn: dict[str, Any],
    edit: tuple[str, str, Any],
    recompute: bool,
    tmp_path_factory: pytest.TempPathFactory,
    team_key: tuple[Path, Path],
):
    from llmplay.archive.references import REFERENCE_FILE
    from llmplay_testing.resume_runs import use_trials

    m = {**drawn, "kind": kind}
    base = tmp_path_factory.mktemp("readers")
    host = base / "host"
    host.mkdir()
    outside = host / "secret.txt"
    outside.write_text(f"root:x:0:0:{MARKER}\n")
    root = base / "b"
    run_dir = copy_run(shared_archive(tmp_path_factory), root)
    private, public = team_key
    if m["signed"]:
        (run_dir / SIGNATURE_FILE).write_bytes(
            signature_document((run_dir / MANIFEST).read_bytes(), load_private_key(private))
        )
    (run_dir.parent / REFERENCE_FILE).write_text(json.dumps({"run_id": run_dir.name, "path": "x"}))
    _mutate(run_dir, m, outside)
    key = ["--public-key", str(public)] if m["signed"] else []
    archive = ["--archive", str(root)]

    _WATCHED.update(root=str(host.resolve()), opened=[])
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv(ENV_SIGNING_KEY, raising=False)
            mp.delenv(ENV_PUBLIC_KEY, raising=False)
            failed = invoke("verify", str(run_dir), *key).exit_code != 0
            event(f"{kind}: verify {'fails' if failed else 'passes'}")
            for args in (("history", *archive), ("index", *archive), ("site", *archive)):
                result = invoke(*args, *key)
                _no_leak(result, root / "index.html")
                assert result.exit_code == 0, (args, result.output)
            accepted = invoke("history", *archive, *key, "--accept", run_dir.name)
            _no_leak(accepted)
            checked = invoke("history", *archive, *key, "--check")
            _no_leak(checked)
            if failed:
                assert accepted.exit_code == 1, accepted.output  # refused, or not even indexed
                assert checked.exit_code == 1, checked.output  # a verification failure: never 0, never 4
                assert run_dir.name in checked.output, checked.output
            _edit_index(root, edit, recompute)
            for args in (("history", *archive), ("index", *archive), ("site", *archive)):
                result = invoke(*args, *key)
                _no_leak(result, root / "index.html")
                assert result.exit_code == 0, (edit, args, result.output)
            if failed:
                result = invoke("history", *archive, *key, "--accept", run_dir.name)
                _no_leak(result)
                assert result.exit_code == 1, (edit, result.output)  # the index's word is never taken
            made = use_trials(mp, interrupt_at=None)
            resumed = invoke("run", "--resume", str(run_dir), *key)
            _no_leak(resumed)
            if failed:
                assert resumed.exit_code == 1 and "fails verification" in resumed.output, resumed.output
                assert made == []  # refused before any trial was asked for
        assert _WATCHED["opened"] == [], _WATCHED["opened"]
    finally:
        _WATCHED["root"] = None
    shutil.rmtree(base)
