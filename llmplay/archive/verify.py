"""Checking an archive: the manifest against its JSON schema and its own hash, every file against its listed sha256,
every path it names inside the run directory, and, given the team's public key, its signature.

The manifest's own hash (`manifest_sha256`) is unkeyed: it catches accidents and careless edits, not someone who
recomputes it. Only a signature (archive.signing) says who wrote the bytes; without one, verification says
"unsigned: integrity only". `report.html` is rendered from the archive, so it is not covered: `llmplay report`
may rewrite it at any time, and it never feeds anything back.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jsonschema
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from llmplay.archive.layout import MANIFEST, REPORT_FILE, SIGNATURE_FILE
from llmplay.archive.paths import MAX_MANIFEST_BYTES, OutsideError, open_inside, read_bytes_inside
from llmplay.archive.signing import fingerprint, parse_signature, signature_problem
from llmplay.errors import ArchiveError

UNSIGNED = "unsigned: integrity only"
_UNLISTED_OK = (MANIFEST, SIGNATURE_FILE, REPORT_FILE)


def manifest_schema() -> dict[str, object]:
    schema: dict[str, object] = json.loads(resources.files("llmplay").joinpath("schemas/manifest.v1.json").read_text())
    return schema


def _document_order(error: jsonschema.ValidationError) -> list[tuple[int, object]]:
    # an index and a key at the same depth would not compare (a field edited from a list to an object)
    return [(1, p) if isinstance(p, str) else (0, p) for p in error.absolute_path]


def schema_problems(manifest: object) -> list[str]:
    """One line per place the manifest breaks its schema, in document order."""
    validator = jsonschema.Draft202012Validator(manifest_schema())
    out = []
    for error in sorted(validator.iter_errors(manifest), key=_document_order):
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        out.append(f"{MANIFEST}: {where}: {error.message}")
    return out


def manifest_sha256(manifest: Mapping[str, object]) -> str:
    """The manifest's own hash: sha256 of its canonical JSON without the `manifest_sha256` key.

    Raises ValueError for a non-finite number (never written by llmplay, so such a manifest was edited)."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Verification:
    """The outcome of checking one run directory: its problems (none: it verifies) and what its signature says."""

    run_dir: Path
    problems: tuple[str, ...]
    signature: str  # UNSIGNED, "signed by ..., not checked: ...", or "signature valid: signed by ..."

    @property
    def ok(self) -> bool:
        return not self.problems

    def one_line(self) -> str:
        """The first problem and how many more, for a command that refuses the run."""
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"{self.problems[0]}{more}" if self.problems else "ok"


def _sha256_inside(run_dir: Path, relpath: str) -> str:
    digest = hashlib.sha256()
    with open_inside(run_dir, relpath) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _referenced_paths(manifest: Mapping[str, object]) -> list[tuple[str, object]]:
    """Every path the manifest tells a reader to open, with where it says so."""
    out: list[tuple[str, object]] = []
    playbook = manifest.get("playbook")
    if isinstance(playbook, Mapping) and playbook.get("file") is not None:
        out.append(("playbook.file", playbook["file"]))
    trials = manifest.get("trials")
    for i, trial in enumerate(trials if isinstance(trials, list) else []):
        files = trial.get("files") if isinstance(trial, Mapping) else None
        if isinstance(files, Mapping):
            name = trial.get("trial_id") if isinstance(trial.get("trial_id"), str) else str(i)
            out += [(f"trials[{name}].files.{role}", relpath) for role, relpath in files.items()]
    return out


def _unlisted(run_dir: Path, listed: Mapping[str, object]) -> list[str]:
    """Whatever sits in the run directory that no hash covers; symlinked directories are never walked into."""
    problems = []
    for here, dirs, files in os.walk(run_dir):  # followlinks=False: a link to / is one entry, not the host's tree
        for name in sorted(dirs):
            if os.path.islink(os.path.join(here, name)):
                rel = Path(here, name).relative_to(run_dir).as_posix()
                problems.append(f"{rel}: a symlink to a directory, not listed in {MANIFEST} (added after the run)")
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(here, d)))
        for name in sorted(files):
            rel = Path(here, name).relative_to(run_dir).as_posix()
            if rel not in _UNLISTED_OK and rel not in listed:
                problems.append(f"{rel}: not listed in {MANIFEST} (added after the run)")
    return problems


def _signature(
    run_dir: Path, manifest_bytes: bytes, public_key: Ed25519PublicKey | None, expected: str | None
) -> tuple[str, list[str]]:
    try:
        data = read_bytes_inside(run_dir, SIGNATURE_FILE, max_bytes=1 << 16)
    except OutsideError as exc:
        if not exc.missing:
            return "signature unreadable", [str(exc)]
        if public_key is None:
            return UNSIGNED, []
        return "unsigned", [f"{SIGNATURE_FILE}: missing; expected a signature by {expected} (the --public-key)"]
    try:
        signature = parse_signature(data)
    except ArchiveError as exc:
        return "signature unreadable", [str(exc)]
    if public_key is None:
        return f"signed by {signature.fingerprint}, not checked: no --public-key given (integrity only)", []
    problem = signature_problem(manifest_bytes, signature, public_key)
    if problem:
        return "signature check failed", [problem]
    return f"signature valid: signed by {signature.fingerprint}", []


def check(run_dir: Path, public_key: Ed25519PublicKey | None = None) -> Verification:
    """Every problem with an archive, one line each (file or entry: what; expected), and its signature status."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return Verification(run_dir, (f"{run_dir}: not a directory; expected a run directory",), UNSIGNED)
    root = run_dir.resolve()
    try:
        data = read_bytes_inside(root, MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
    except OutsideError as exc:
        why = f"no {MANIFEST}; not an llmplay run directory" if exc.missing else str(exc)
        return Verification(run_dir, (why,), UNSIGNED)
    return check_read(run_dir, data, public_key)


def check_read(run_dir: Path, data: bytes, public_key: Ed25519PublicKey | None = None) -> Verification:
    """`check` on manifest bytes the caller already read from run_dir (the index reads each manifest once)."""
    run_dir = Path(run_dir)
    root = run_dir.resolve()
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return Verification(run_dir, (f"{MANIFEST}: not readable JSON ({exc})",), UNSIGNED)
    if not isinstance(manifest, dict):
        return Verification(
            run_dir, (f"{MANIFEST}: expected a JSON object, found {type(manifest).__name__}",), UNSIGNED
        )
    problems = schema_problems(manifest)
    stored = manifest.get("manifest_sha256")
    try:
        actual: str | None = manifest_sha256(manifest)
    except ValueError:
        actual = None
    if stored != actual:
        problems.append(f"{MANIFEST}: changed after llmplay wrote it (its manifest_sha256 does not match its content)")
    listed: dict[str, object] = manifest["files"] if isinstance(manifest.get("files"), dict) else {}
    for relpath, digest in sorted(listed.items()):
        if relpath == REPORT_FILE:
            continue  # rendered from the archive and rewritten by `llmplay report`: listed by older versions only
        try:
            if _sha256_inside(root, relpath) != digest:
                problems.append(f"{relpath}: changed (sha256 differs from {MANIFEST})")
        except OutsideError as exc:
            problems.append(f"{relpath}: missing (listed in {MANIFEST})" if exc.missing else str(exc))
    for where, referenced in _referenced_paths(manifest):
        if not isinstance(referenced, str) or referenced not in listed or referenced == REPORT_FILE:
            problems.append(f"{where}: {referenced!r} is not a file listed in {MANIFEST} files (no hash covers it)")
    problems += _unlisted(root, listed)
    expected = fingerprint(public_key) if public_key is not None else None
    signature, sig_problems = _signature(root, data, public_key, expected)
    return Verification(run_dir, tuple(problems + sig_problems), signature)


def verify(run_dir: Path, public_key: Ed25519PublicKey | None = None) -> list[str]:
    """Every problem with an archive, one line each; empty means it verifies (and, given a key, is signed by it)."""
    return list(check(run_dir, public_key).problems)


def require_verified(
    run_dir: Path, *, allow_unverified: bool, public_key: Ed25519PublicKey | None = None
) -> Verification:
    """The run's verification; ArchiveError (one line naming the run and what failed) when it fails and the caller
    did not ask to read it anyway. Nothing of a run is read before this says yes."""
    result = check(run_dir, public_key)
    if not result.ok and not allow_unverified:
        raise ArchiveError(
            f"{run_dir}: fails verification: {result.one_line()}; `llmplay verify {run_dir}` lists every problem, "
            "--unverified reads it anyway"
        )
    return result
