"""The run directory's layout: its path under the archive root, the file names in it, and the manifest's schema id.

`<root>/<playbook>/<UTC %Y%m%dT%H%M%SZ>-<6 hex>/` holds `playbook.yaml` (as run, redacted), `manifest.json`,
`trials/<trial_id>/{requests,telemetry}.{parquet,csv}` and `engine.log`, `report.html`, and `manifest.sig` when a
signing key is configured.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SCHEMA_ID = "llmplay/manifest.v1"
MANIFEST = "manifest.json"
PLAYBOOK_FILE = "playbook.yaml"
RESOLVED_FILE = "playbook.resolved.yaml"  # after `extends:`: loadable without the files it extended
REPORT_FILE = "report.html"  # rendered from the archive, so not hashed: `llmplay report` rewrites it
PROBES_FILE = "probes.json"  # a trial's greedy probe answers (goals.quality), under trials/<trial_id>/
SIGNATURE_FILE = "manifest.sig"  # detached Ed25519 signature over manifest.json's bytes (archive.signing)
STATUSES = ("running", "complete", "failed", "interrupted")
ENV_ARCHIVE = "LLMPLAY_ARCHIVE"
ENV_SIGNING_KEY = "LLMPLAY_SIGNING_KEY"  # PEM private key that signs each run's manifest as it is written
ENV_PUBLIC_KEY = "LLMPLAY_PUBLIC_KEY"  # PEM public key that verify, report, compare and retest check signatures with


def safe_name(name: str) -> str:
    """A playbook or trial name as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "playbook"


@dataclass(frozen=True)
class RunDirectories:
    """The run directories under an archive root, and the entries skipped because they are symlinks."""

    found: tuple[tuple[str, Path], ...]  # ("<playbook dir>/<run id>", its path), sorted
    linked: tuple[str, ...]  # a playbook or run folder that is a symlink: it may lead anywhere, so never read


def run_directories(root: Path) -> RunDirectories:
    """Every `<root>/<playbook>/<run>/` holding a manifest entry. A playbook or run folder that is a symlink is
    skipped and named in `linked`, by `ls` and the index alike: what is read is what lies under the root."""
    found: list[tuple[str, Path]] = []
    linked: list[str] = []
    try:
        playbook_dirs = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return RunDirectories((), ())
    for pdir in playbook_dirs:
        if pdir.is_symlink() and pdir.is_dir():
            linked.append(pdir.name)
            continue
        if not pdir.is_dir(follow_symlinks=False):
            continue
        try:
            runs = sorted(os.scandir(pdir.path), key=lambda e: e.name)
        except OSError:
            continue
        for run in runs:
            rel = f"{pdir.name}/{run.name}"
            if run.is_symlink():
                if os.path.lexists(os.path.join(run.path, MANIFEST)):
                    linked.append(rel)
                continue
            if run.is_dir(follow_symlinks=False) and os.path.lexists(os.path.join(run.path, MANIFEST)):
                found.append((rel, Path(run.path)))
    return RunDirectories(tuple(found), tuple(linked))


LINKED = "a symlink, not read: runs are read only where they lie under the archive root (copy the run in instead)"


def linked_note(linked: tuple[str, ...], root: Path) -> str:
    """The one line that says which symlinked folders were skipped."""
    shown = ", ".join(linked[:3]) + (f" and {len(linked) - 3} more" if len(linked) > 3 else "")
    return (
        f"{len(linked)} folder(s) under {root} skipped: a symlink ({shown}); runs are read only where they lie "
        "under the archive root (copy a run in rather than linking it)"
    )
