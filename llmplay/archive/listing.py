"""Finding archived runs: the archive root a command uses, and one summary row per run under it (`llmplay ls`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from llmplay.archive.layout import ENV_ARCHIVE, MANIFEST, SCHEMA_ID, run_directories
from llmplay.archive.paths import MAX_MANIFEST_BYTES, read_bytes_inside
from llmplay.archive.reader import ArchivedRun
from llmplay.errors import ArchiveError
from llmplay.jsonvalue import as_list, as_mapping


class ListedRun(TypedDict, total=False):
    """One run as `llmplay ls` lists it; `why` only for an unreadable one, `stale` and `overridden` for the others."""

    playbook: str
    version: str
    date: str
    status: str
    stale: bool
    engine: str
    gpu: str
    gates: str
    path: str
    run_id: str
    overridden: bool
    why: str


def _unreadable(run_dir: Path, why: str) -> ListedRun:
    return {
        "playbook": run_dir.parent.name,
        "version": "",
        "date": "",
        "status": "unreadable",
        "engine": "",
        "gpu": "",
        "gates": "",
        "path": str(run_dir),
        "run_id": run_dir.name,
        "why": why,
    }


def _row(run_dir: Path, m: dict[str, object]) -> ListedRun:
    gates = as_list(m.get("gates"))
    met = sum(1 for g in gates if isinstance(g, Mapping) and g.get("met") is True)
    archived = ArchivedRun(run_dir, {"run_id": run_dir.name, **m})
    info = archived.info
    stale = info.status == "running" and not still_running(m)
    return {
        "playbook": info.playbook.name or run_dir.parent.name,
        "version": info.playbook.version,
        "date": info.environment.started_utc,
        "status": "interrupted" if stale else (info.status or "?"),
        "stale": stale,
        "engine": archived.engine_facts().label,
        "gpu": info.environment.gpu_label,
        "gates": f"{met}/{len(gates)}" if gates else "-",
        "path": str(run_dir),
        "run_id": info.run_id or run_dir.name,
        "overridden": bool(info.overrides),
    }


def list_runs(root: Path) -> list[ListedRun]:
    """One row per run under root, newest first: playbook, date, status, engine, GPU, gates met, path.

    A listing reads manifests only (verifying every run would hash every file); a manifest that cannot be read,
    or that leaves its run directory through a symlink, is listed as "unreadable". A run or playbook folder that is
    itself a symlink is skipped (`linked_runs` names them), as the index skips it."""
    rows: list[ListedRun] = []
    for _, run_dir in run_directories(Path(root)).found:
        try:
            m = json.loads(read_bytes_inside(run_dir, MANIFEST, max_bytes=MAX_MANIFEST_BYTES).decode("utf-8"))
            if not isinstance(m, dict) or m.get("schema") != SCHEMA_ID:
                raise ValueError("not an llmplay manifest")
            rows.append(_row(run_dir, m))
        except (OSError, ValueError, RecursionError, ArchiveError) as exc:
            rows.append(_unreadable(run_dir, str(exc)))
        except (TypeError, KeyError, AttributeError) as exc:  # a field of the wrong type: damaged, not a crash
            rows.append(_unreadable(run_dir, f"damaged manifest ({type(exc).__name__}: {exc})"))
    rows.sort(key=lambda r: (r.get("date", ""), r.get("run_id", "")), reverse=True)
    return rows


def linked_runs(root: Path) -> tuple[str, ...]:
    """The playbook and run folders under root that are symlinks, which neither `ls` nor the index reads."""
    return run_directories(Path(root)).linked


def still_running(manifest: Mapping[str, object]) -> bool:
    """Whether the process writing a "running" archive still lives. A run killed with -9 never marks its archive
    interrupted, and a reader must not rewrite it, so this is judged here, at every listing: by the owner the
    manifest names (host, pid, start time), else by the run's lock in this host's registry; a run on another host,
    or one that records neither, is taken at its word."""
    # deferred: the runtime package loads an HTTP client, and `history` (which needs only archive_root) answers sooner
    from llmplay.runtime.live_runs import lock_held
    from llmplay.runtime.owner import Owner  # deferred: as above

    owner = Owner.from_dict(as_mapping(manifest.get("owner")))
    if owner is not None:
        return owner.alive() is not False
    return lock_held(str(manifest.get("run_id", ""))) is not False


def archive_root(cli_value: str | None) -> Path:
    """--archive DIR, else $LLMPLAY_ARCHIVE, else ./reports."""
    if cli_value:
        return Path(cli_value)
    if os.environ.get(ENV_ARCHIVE):
        return Path(os.environ[ENV_ARCHIVE])
    return Path("reports")
