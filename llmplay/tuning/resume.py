"""What `--resume` continues: the playbook and overrides archived with the run, never a file edited since.

A resumed run that read the playbook file again would measure its remaining trials under whatever the file says
now (another workload, another image) while its archive, and `verify`, still vouch for the old text and hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from llmplay.archive.layout import PLAYBOOK_FILE, RESOLVED_FILE
from llmplay.archive.reader import read_manifest
from llmplay.errors import ArchiveError, PlaybookError
from llmplay.playbook.load import load_playbook
from llmplay.spec import Playbook, frozen_map

# What a resumed run keeps from its start, whatever the command line says. Not the cluster address: a restarted
# Ray head has a new one, and where a trial runs does not change what it measures.
KEPT_OVERRIDES = ("repeats", "duration_s", "warmup_s", "only", "image", "capacity")
# Beyond this many, the note names the count of further differences.
SHOWN_CHANGES = 6


@dataclass(frozen=True)
class Resumed:
    """The archived playbook to continue, its overrides, and a note when the original file changed since."""

    playbook: Playbook
    overrides: Mapping[str, Any]
    note: str | None


def _archived_file(run_dir: Path, manifest: Mapping[str, Any]) -> Path:
    # The resolved copy first: it holds what `extends:` merged in, and the files it extended may have changed too.
    for name in (RESOLVED_FILE, manifest["playbook"].get("file") or PLAYBOOK_FILE):
        if (run_dir / name).is_file():
            return run_dir / name
    raise ArchiveError(f"{run_dir}: no archived playbook ({RESOLVED_FILE} or {PLAYBOOK_FILE}); cannot resume it")


def _load_beside(text: str, base_dir: Path, shown_as: Path, allow_outside_extends: bool) -> Playbook:
    """Load `text` as if it lay in `base_dir`, so relative paths in it (a dataset, a model_dir) resolve as they did
    when the run started; messages name `shown_as`, the archived copy."""
    if not os.access(base_dir, os.W_OK):
        base_dir = shown_as.parent
    fd, name = tempfile.mkstemp(prefix=".llmplay-resume-", suffix=".yaml", dir=base_dir)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            loaded = load_playbook(tmp, allow_outside_extends=allow_outside_extends, archived=True)
        except PlaybookError as exc:
            raise PlaybookError(str(exc).replace(str(tmp), str(shown_as))) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    sites = {k: str(v).replace(str(tmp), str(shown_as)) for k, v in loaded.sites.items()}
    return replace(loaded, path=str(shown_as), sites=frozen_map(sites))


def yaml_differences(old: Any, new: Any, path: str = "") -> list[str]:
    """The YAML paths (`workload.concurrency`, `steps[1].set`) where two documents differ, in document order."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in [*old, *(k for k in new if k not in old)]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                out.append(sub)
            else:
                out.extend(yaml_differences(old[key], new[key], sub))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in yaml_differences(a, b, f"{path}[{i}]")
        ]
    return [] if old == new else [path or "(the whole document)"]


def change_note(file: Path, archived_text: str, archived_sha256: str, archived_copy: Path) -> str | None:
    """One line when `file` no longer holds the text the run started from: which YAML paths differ."""
    try:
        current = file.read_text(encoding="utf-8")
    except OSError:
        return None
    if hashlib.sha256(current.encode()).hexdigest() == archived_sha256:
        return None
    try:
        differ = yaml_differences(yaml.safe_load(archived_text), yaml.safe_load(current))
    except yaml.YAMLError:
        differ = []
    if differ:
        shown = ", ".join(differ[:SHOWN_CHANGES]) + (
            f" and {len(differ) - SHOWN_CHANGES} more" if len(differ) > SHOWN_CHANGES else ""
        )
        what = f"differs at {shown}"
    else:
        what = "its text differs (comments or layout only, or it no longer parses)"
    return (
        f"note: {file} changed since this run started ({what}); resuming with the archived playbook "
        f"{archived_copy}, not the edited file"
    )


def resumed_playbook(run_dir: Path, file: Path | None = None, *, allow_outside_extends: bool = False) -> Resumed:
    """The run's archived playbook (relative paths resolved where the original lay), its archived overrides, and a
    note if the original file (or `file`, when given) was edited since the run started."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    archived = _archived_file(run_dir, manifest)
    original = Path(manifest["playbook"]["path"])
    as_written = run_dir / (manifest["playbook"].get("file") or PLAYBOOK_FILE)
    text = as_written.read_text(encoding="utf-8") if as_written.is_file() else archived.read_text(encoding="utf-8")
    base_dir = original.parent if original.parent.is_dir() else run_dir
    loaded = _load_beside(archived.read_text(encoding="utf-8"), base_dir, archived, allow_outside_extends)
    playbook = replace(loaded, text=text, sha256=manifest["playbook"]["sha256"])
    note = change_note(file or original, text, manifest["playbook"]["sha256"], archived)
    return Resumed(playbook, dict(manifest.get("overrides") or {}), note)


def resumed_overrides(run_dir: Path, archived: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides a resumed run goes on with: those it started with; a different one on the command line is a
    PlaybookError (its remaining trials would measure something else than its first ones). `ray` may change."""
    merged = dict(given)
    for key in KEPT_OVERRIDES:
        value, kept = given.get(key), archived.get(key)
        if value is not None and value != kept:
            started = "without it" if kept is None else f"with {kept!r}"
            raise PlaybookError(
                f"--resume {run_dir}: {key} {value!r} given, but the run started {started}; a resumed run keeps "
                "what it started with (start a new run to change it)"
            )
        merged[key] = kept
    if merged.get("ray") is None:
        merged["ray"] = archived.get("ray")
    return merged
