"""What `--resume` continues: the playbook and overrides archived with the run, never a file edited since.

A resumed run that read the playbook file again would measure its remaining trials under whatever the file says
now (another workload, another image) while its archive, and `verify`, still vouch for the old text and hash.

Nothing of the archive is read before it verifies (archive.trust decides that, and whether the resumed run signs).
The configuration is then resolved again from the hashed playbook copy as written (`playbook.yaml`, its `extends:`
read where the original lay) and the recorded overrides; the resolved copy (`playbook.resolved.yaml`) must agree
with it, or the resume is refused: a copy edited to name another `image:` can never choose what runs. Both copies
are read only from inside the run directory, as regular files of bounded size.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from llmplay.archive.layout import PLAYBOOK_FILE, RESOLVED_FILE
from llmplay.archive.model import to_plain
from llmplay.archive.paths import OutsideError, read_text_inside
from llmplay.archive.reader import read_manifest
from llmplay.archive.trust import ResumeTrust, resume_trust
from llmplay.errors import ArchiveError, PlaybookError
from llmplay.playbook.load import load_playbook
from llmplay.redaction import REDACTED, redact
from llmplay.spec import Playbook, frozen_map

# What a resumed run keeps from its start, whatever the command line says. Not the cluster address: a restarted
# Ray head has a new one, and where a trial runs does not change what it measures.
KEPT_OVERRIDES = ("repeats", "duration_s", "warmup_s", "only", "image", "capacity")
# Beyond this many, the note names the count of further differences.
SHOWN_CHANGES = 6


@dataclass(frozen=True)
class Resumed:
    """The archived playbook to continue, its overrides, a note when the original file changed since, and what
    verification said of the archive (whether the resumed run signs it)."""

    playbook: Playbook
    overrides: Mapping[str, object]
    note: str | None
    trust: ResumeTrust | None = None


def _archived_text(run_dir: Path, relpath: object, *, required: bool) -> str | None:
    """A playbook copy of the run, read only from inside it (a regular file, bounded); None when absent and not
    required."""
    try:
        return read_text_inside(run_dir, relpath)
    except OutsideError as exc:
        if exc.missing and not required:
            return None
        why = "missing" if exc.missing else exc.why
        raise ArchiveError(f"{run_dir}: the archived playbook {relpath!r}: {why}; cannot resume it") from None


def _playbook_entry(run_dir: Path, manifest: Mapping[str, object]) -> tuple[str, Path, str]:
    """The manifest's playbook entry: the copy as written, where the original lay, and its recorded sha256."""
    entry = manifest.get("playbook")
    entry = entry if isinstance(entry, Mapping) else {}
    relpath, path, sha256 = entry.get("file") or PLAYBOOK_FILE, entry.get("path"), entry.get("sha256")
    if not isinstance(relpath, str) or not isinstance(path, str) or not isinstance(sha256, str):
        raise ArchiveError(
            f"{run_dir}: manifest.json playbook: expected file, path and sha256 as text; cannot resume it"
        )
    return relpath, Path(path), sha256


def _blind(old: object, new: object) -> tuple[object, object]:
    """The two documents with every value that either side shows redacted made equal: a redacted value is compared
    by neither (the run uses the one resolved again, never the copy)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        pairs = {k: _blind(old[k], new[k]) for k in old if k in new}
        return (
            {k: pairs[k][0] if k in pairs else v for k, v in old.items()},
            {k: pairs[k][1] if k in pairs else v for k, v in new.items()},
        )
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        pairs_ = [_blind(a, b) for a, b in zip(old, new, strict=True)]
        return [a for a, _ in pairs_], [b for _, b in pairs_]
    if any(isinstance(v, str) and REDACTED in v for v in (old, new)):
        return REDACTED, REDACTED
    return old, new


def _check_resolved_copy(run_dir: Path, resolved_text: str, loaded: Playbook) -> None:
    """PlaybookError naming where the archived resolved copy disagrees with the playbook resolved again."""
    try:
        archived = yaml.safe_load(resolved_text)
    except yaml.YAMLError:
        archived = None
    again = redact(to_plain(loaded.resolved))
    differ = yaml_differences(*_blind(archived, again)) if isinstance(archived, Mapping) else ["(not a mapping)"]
    if differ:
        shown = ", ".join(differ[:SHOWN_CHANGES]) + (
            f" and {len(differ) - SHOWN_CHANGES} more" if len(differ) > SHOWN_CHANGES else ""
        )
        raise ArchiveError(
            f"{run_dir / RESOLVED_FILE}: disagrees with {loaded.path} resolved again (at {shown}): the copy was "
            "edited, or a file it extends changed since the run started; a resumed run measures what its first "
            "trials measured, so it is not resumed (start a new run)"
        )


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
    sites = {k: v.replace(str(tmp), str(shown_as)) for k, v in loaded.sites.items()}
    return replace(loaded, path=str(shown_as), sites=frozen_map(sites))


def yaml_differences(old: object, new: object, path: str = "") -> list[str]:
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


def resumed_playbook(
    run_dir: Path,
    file: Path | None = None,
    *,
    allow_outside_extends: bool = False,
    allow_unverified: bool = False,
    public_key: Ed25519PublicKey | None = None,
) -> Resumed:
    """The run's archived playbook resolved again (relative paths and `extends:` where the original lay), its
    archived overrides, and a note if the original file (or `file`, when given) was edited since the run started.
    ArchiveError when the archive fails verification (unless `allow_unverified`) or its resolved copy disagrees."""
    run_dir = Path(run_dir)
    trust = resume_trust(run_dir, allow_unverified=allow_unverified, public_key=public_key)
    manifest = read_manifest(run_dir)
    relpath, original, sha256 = _playbook_entry(run_dir, manifest)
    text = _archived_text(run_dir, relpath, required=True) or ""
    resolved_text = _archived_text(run_dir, RESOLVED_FILE, required=False)
    as_written = run_dir / relpath
    base_dir = original.parent if original.parent.is_dir() else run_dir
    loaded = _load_beside(text, base_dir, as_written, allow_outside_extends)
    if resolved_text is not None:
        _check_resolved_copy(run_dir, resolved_text, loaded)
    playbook = replace(loaded, text=text, sha256=sha256)
    note = change_note(file or original, text, sha256, run_dir / (RESOLVED_FILE if resolved_text else relpath))
    overrides = manifest.get("overrides")
    return Resumed(playbook, dict(overrides) if isinstance(overrides, Mapping) else {}, note, trust)


def resumed_overrides(run_dir: Path, archived: Mapping[str, object], given: Mapping[str, object]) -> dict[str, object]:
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
