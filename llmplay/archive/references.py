"""A playbook's accepted reference: `<root>/<playbook dir>/reference.json`, the run `history --accept` named.

The file sits in an archive root others may write, so it is read as any archived file is: a regular file inside its
playbook folder, under a small bound, never through a symlink out (a FIFO or /dev/zero there is an error, not a hang).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from llmplay.archive.atomic import atomic_write
from llmplay.archive.layout import safe_name
from llmplay.archive.paths import OutsideError, read_bytes_inside
from llmplay.archive.run_entry import RunEntry
from llmplay.errors import ArchiveError

REFERENCE_FILE = "reference.json"
MAX_REFERENCE_BYTES = 64 << 10  # a run id, a path, a date and a note


def reference_path(root: Path, playbook: str) -> Path:
    return Path(root) / safe_name(playbook) / REFERENCE_FILE


def read_reference(root: Path, playbook: str) -> str | None:
    """The run id accepted as the playbook's reference (`history --accept`), or None."""
    path = reference_path(root, playbook)
    again = "accept a reference again with llmplay history --accept"
    if not os.path.lexists(path):
        return None
    try:
        data = read_bytes_inside(path.parent, REFERENCE_FILE, max_bytes=MAX_REFERENCE_BYTES)
        document = json.loads(data.decode("utf-8"))
    except OutsideError as exc:
        raise ArchiveError(f"{path}: not readable ({exc.why}); {again}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArchiveError(f"{path}: not readable JSON ({exc}); {again}") from None
    run_id = document.get("run_id") if isinstance(document, Mapping) else None
    if not isinstance(run_id, str):
        raise ArchiveError(f"{path}: no run_id; {again}")
    return run_id


def write_reference(root: Path, entry: RunEntry, *, note: str = "") -> Path:
    """Accept a run as its playbook's reference: a small file beside the runs (the index only reads it)."""
    path = reference_path(root, entry.playbook)
    accepted = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    document = {"run_id": entry.run_id, "path": entry.path, "accepted_utc": accepted, "note": note}
    try:
        # replaces a symlink itself, never writes through it
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8"))
    except OSError as exc:
        raise ArchiveError(
            f"{path}: cannot be written ({exc.strerror or exc}); expected a writable archive root to accept a reference"
        ) from None
    return path


def find_run(entries: Iterable[RunEntry], key: str) -> RunEntry | None:
    """A run by its id, its directory name or its path (as printed by ls/history)."""
    wanted = Path(key.rstrip("/")).name
    for entry in entries:
        if key in (entry.run_id, entry.path) or wanted in (entry.run_id, Path(entry.path).name):
            return entry
    return None
