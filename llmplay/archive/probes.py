"""The greedy probe answers a run archived (trials/<id>/probes.json, written by RunArchive.write_probes)."""

from __future__ import annotations

import json
from pathlib import Path

from llmplay.archive.layout import MANIFEST, PROBES_FILE, safe_name
from llmplay.archive.paths import MAX_MANIFEST_BYTES, OutsideError, read_bytes_inside, read_text_inside
from llmplay.errors import ArchiveError
from llmplay.loadgen.probes import ProbeResult


def load_probes(run_dir: Path, trial_id: str) -> tuple[ProbeResult, ...] | None:
    """The probe answers a trial archived (RunArchive.write_probes); None when it took none."""
    try:  # the trial id comes from a manifest: the path it makes must stay inside the run (archive.paths)
        text = read_text_inside(Path(run_dir), f"trials/{safe_name(trial_id)}/{PROBES_FILE}")
    except OutsideError as exc:
        if exc.missing:
            return None
        raise ArchiveError(f"{run_dir}: {exc}") from None
    return tuple(ProbeResult.from_dict(row) for row in json.loads(text))


def archived_probes(run_dir: Path, config_id: str) -> tuple[ProbeResult, ...] | None:
    """The probe answers of `config_id`'s first ok trial that took them in an archived run; None when there are none."""
    try:
        manifest = json.loads(read_bytes_inside(Path(run_dir), MANIFEST, max_bytes=MAX_MANIFEST_BYTES))
    except OutsideError as exc:
        raise ArchiveError(f"{run_dir}: {exc}") from None
    except ValueError as exc:
        raise ArchiveError(f"{run_dir}: {MANIFEST}: not readable JSON ({exc})") from None
    trials = manifest.get("trials") if isinstance(manifest, dict) else None
    for trial in trials if isinstance(trials, list) else []:
        if not isinstance(trial, dict):
            continue
        if trial.get("config_id") == config_id and trial.get("status") == "ok":
            found = load_probes(Path(run_dir), str(trial["trial_id"]))
            if found is not None:
                return found
    return None
