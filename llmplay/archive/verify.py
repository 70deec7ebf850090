"""Checking an archive: the manifest against its JSON schema and its own hash, every file against its listed sha256."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from llmplay.archive.layout import MANIFEST
from llmplay.hashing import sha256_file


def manifest_schema() -> dict[str, Any]:
    return json.loads(resources.files("llmplay").joinpath("schemas/manifest.v1.json").read_text())


def schema_problems(manifest: Any) -> list[str]:
    """One line per place the manifest breaks its schema, in document order."""
    validator = jsonschema.Draft202012Validator(manifest_schema())
    out = []
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        out.append(f"{MANIFEST}: {where}: {error.message}")
    return out


def manifest_sha256(manifest: Mapping[str, Any]) -> str:
    """The manifest's own hash: sha256 of its canonical JSON without the `manifest_sha256` key.

    Raises ValueError for a non-finite number (never written by llmplay, so such a manifest was edited)."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def verify(run_dir: Path) -> list[str]:
    """Every problem with an archive, one line each; empty means every listed file is present and unchanged."""
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST
    if not path.is_file():
        return [f"{run_dir}: no {MANIFEST}; not an llmplay run directory"]
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST}: not readable JSON ({exc})"]
    if not isinstance(manifest, dict):
        return [f"{MANIFEST}: expected a JSON object, found {type(manifest).__name__}"]
    problems = schema_problems(manifest)
    stored = manifest.get("manifest_sha256")
    try:
        actual: str | None = manifest_sha256(manifest)
    except ValueError:
        actual = None
    if stored != actual:
        problems.append(f"{MANIFEST}: changed after llmplay wrote it (its manifest_sha256 does not match its content)")
    listed: dict[str, Any] = manifest["files"] if isinstance(manifest.get("files"), dict) else {}
    root = run_dir.resolve()
    for relpath, digest in sorted(listed.items()):
        target = (run_dir / relpath).resolve()
        if Path(relpath).is_absolute() or root not in target.parents:
            problems.append(f"{relpath}: listed path leaves the run directory")
            continue
        if not target.is_file():
            problems.append(f"{relpath}: missing (listed in {MANIFEST})")
        elif sha256_file(target) != digest:
            problems.append(f"{relpath}: changed (sha256 differs from {MANIFEST})")
    for file in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        relpath = file.relative_to(run_dir).as_posix()
        if relpath != MANIFEST and relpath not in listed:
            problems.append(f"{relpath}: not listed in {MANIFEST} (added after the run)")
    return problems
