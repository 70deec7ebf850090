"""Finding archived runs: the archive root a command uses, and one summary row per run under it (`llmplay ls`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llmplay.archive.layout import ENV_ARCHIVE, MANIFEST, SCHEMA_ID
from llmplay.archive.reader import engine_label, gpu_label
from llmplay.runtime.live_runs import lock_held
from llmplay.runtime.owner import Owner


def list_runs(root: Path) -> list[dict[str, Any]]:
    """One row per run under root, newest first: playbook, date, status, engine, GPU, gates met, path."""
    rows: list[dict[str, Any]] = []
    for manifest_path in sorted(Path(root).glob(f"*/*/{MANIFEST}")):
        run_dir = manifest_path.parent
        try:
            m = json.loads(manifest_path.read_text(encoding="utf-8"))
            if not isinstance(m, dict) or m.get("schema") != SCHEMA_ID:
                raise ValueError("not an llmplay manifest")
        except (OSError, ValueError):
            rows.append(
                {
                    "playbook": run_dir.parent.name,
                    "version": "",
                    "date": "",
                    "status": "unreadable",
                    "engine": "",
                    "gpu": "",
                    "gates": "",
                    "path": str(run_dir),
                    "run_id": run_dir.name,
                }
            )
            continue
        gates = m.get("gates") or []
        met = sum(1 for g in gates if g.get("met"))
        env = m.get("environment") or {}
        stale = m.get("status") == "running" and not still_running(m)
        rows.append(
            {
                "playbook": m.get("playbook", {}).get("name", run_dir.parent.name),
                "version": m.get("playbook", {}).get("version", ""),
                "date": env.get("started_utc", ""),
                "status": "interrupted" if stale else m.get("status", "?"),
                "stale": stale,
                "engine": engine_label(m),
                "gpu": gpu_label(env),
                "gates": f"{met}/{len(gates)}" if gates else "-",
                "path": str(run_dir),
                "run_id": m.get("run_id", run_dir.name),
                "overridden": bool(m.get("overrides")),
            }
        )
    rows.sort(key=lambda r: (r["date"], r["run_id"]), reverse=True)
    return rows


def still_running(manifest: dict[str, Any]) -> bool:
    """Whether the process writing a "running" archive still lives. A run killed with -9 never marks its archive
    interrupted, and a reader must not rewrite it, so this is judged here, at every listing: by the owner the
    manifest names (host, pid, start time), else by the run's lock in this host's registry; a run on another host,
    or one that records neither, is taken at its word."""
    owner = Owner.from_dict(manifest.get("owner"))
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
