"""Reading an archived run back: its manifest as model values, and its records, telemetry and logs from disk."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from llmplay.archive.capacity import CapacityResult
from llmplay.archive.convert import (
    capacity_from,
    config_from,
    diagnosis_from,
    finding_from,
    gate_from,
    playbook_as_run,
    run_info_from,
    trial_from,
    tuning_row_from,
    verdict_from,
)
from llmplay.archive.layout import MANIFEST, RESOLVED_FILE, SCHEMA_ID, SIGNATURE_FILE
from llmplay.archive.model import (
    TRIAL_OK,
    ConfigRecord,
    Diagnosis,
    EngineDescription,
    EngineFacts,
    Finding,
    GateResult,
    PlaybookAsRun,
    RunInfo,
    StepVerdict,
    TrialRecord,
    TrialRequests,
    TuningRow,
)
from llmplay.archive.paths import (
    MAX_DATA_BYTES,
    MAX_MANIFEST_BYTES,
    OutsideError,
    open_inside,
    read_bytes_inside,
    read_text_inside,
)
from llmplay.catalog import REPORT_RECORD_COLUMNS
from llmplay.errors import ArchiveError
from llmplay.jsonvalue import as_list as _items
from llmplay.jsonvalue import as_mapping as mapping
from llmplay.metrics import per_request_arrays, request_timeline

if TYPE_CHECKING:  # imported where a frame is read: describing a run (history, the index, list) needs no pandas
    import pandas as pd

    from llmplay.metrics import Records


def have_pyarrow() -> bool:
    """Parquet needs the optional pyarrow; without it the writer falls back to CSV."""
    return importlib.util.find_spec("pyarrow") is not None


# ---------------------------------------------------------------------------------------------- describing a run
def engine_facts(trials: Sequence[TrialRecord], configs: Sequence[ConfigRecord], final: str | None) -> EngineFacts:
    described = [d for t in trials if (d := t.engine_describe) is not None]
    chosen = [t.engine_describe for t in trials if t.engine_describe is not None and t.config_id == final]
    d = (chosen or described or [EngineDescription()])[-1]
    config = next((c for c in configs if c.config_id == final), configs[0] if configs else None)
    engine = config.engine if config else None
    return EngineFacts(
        kind=engine.kind if engine else "",
        model=engine.model if engine else "",
        image=d.image or (engine.image if engine else None) or None,
        version=d.engine_version or None,
        digest=d.image_digest or d.image_id or None,
        images=tuple(sorted({e.image for e in described if e.image})),
    )


def requests_from(records: pd.DataFrame | None) -> TrialRequests:
    """A records frame as the charts need it; tolerant of missing or extra columns (what cannot be computed is
    empty), and of no frame at all."""
    rows: Records = records if records is not None and len(records) else ()
    return TrialRequests(per_request_arrays(rows), request_timeline(rows))


# ---------------------------------------------------------------------------------------------- the archived run
def read_manifest(run_dir: Path) -> dict[str, object]:
    """The manifest of an existing run directory, or an ArchiveError saying why it is not one."""
    if not run_dir.is_dir():
        raise ArchiveError(f"{run_dir}: no such directory; expected a run directory made by llmplay run")
    try:
        data = read_bytes_inside(run_dir, MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
    except OutsideError as exc:
        if exc.missing:
            raise ArchiveError(f"{run_dir}: no {MANIFEST}; expected a run directory made by llmplay run") from None
        raise ArchiveError(f"{run_dir}: {exc}") from None
    return manifest_from(run_dir, data)


def manifest_from(run_dir: Path, data: bytes) -> dict[str, object]:
    """The manifest from its bytes (read once by a caller that also verifies them), or an ArchiveError saying why
    they are not an llmplay manifest."""
    path = run_dir / MANIFEST
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArchiveError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA_ID:
        found = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise ArchiveError(
            f"{path}: schema is {found!r}, expected {SCHEMA_ID!r} (an archive from another "
            "llmplay version, or not an llmplay archive)"
        )
    if "run_id" not in manifest:
        raise ArchiveError(f"{path}: no run_id; the manifest is damaged (llmplay verify {run_dir} lists why)")
    return manifest


class ArchivedRun:
    """One run directory, read-only: what the report, compare and --resume read through."""

    def __init__(self, run_dir: Path, manifest: dict[str, object]):
        self.run_dir = Path(run_dir)
        self._manifest = manifest
        self.run_id = str(manifest["run_id"])

    @classmethod
    def open(cls, run_dir: Path) -> ArchivedRun:
        return cls(Path(run_dir), read_manifest(Path(run_dir)))

    def manifest(self) -> dict[str, object]:
        """A deep copy: callers may change it without touching the archive."""
        copy: dict[str, object] = json.loads(json.dumps(self._manifest))
        return copy

    def signed(self) -> bool:
        """Whether the run carries a signature file (whether it is valid is `llmplay verify --public-key`'s job)."""
        return (self.run_dir / SIGNATURE_FILE).is_file()

    @property
    def info(self) -> RunInfo:
        """The manifest's head as it is now (a run still being written changes it)."""
        return run_info_from(self._manifest)

    def trials(self) -> list[TrialRecord]:
        return [trial_from(mapping(t)) for t in _items(self._manifest.get("trials"))]

    def configs(self) -> list[ConfigRecord]:
        return [config_from(mapping(c)) for c in _items(self._manifest.get("configs"))]

    def verdicts(self) -> list[StepVerdict]:
        return [verdict_from(mapping(v)) for v in _items(self._manifest.get("verdicts"))]

    def gates(self) -> list[GateResult]:
        return [gate_from(mapping(g)) for g in _items(self._manifest.get("gates"))]

    def findings(self) -> list[Finding]:
        return [finding_from(mapping(f)) for f in _items(self._manifest.get("findings"))]

    def diagnosis(self) -> Diagnosis:
        return diagnosis_from(mapping(self._manifest.get("diagnosis")))

    def engine_facts(self) -> EngineFacts:
        return engine_facts(self.trials(), self.configs(), self.info.final_config_id)

    def final_trials(self) -> tuple[str, list[TrialRecord]]:
        """The final configuration's id and the trials its figures rest on: the successful ones not superseded."""
        final = self.info.final_config_id or "baseline"
        # A superseded trial's pair was measured again on another cluster node: the run did not use it, nor does this.
        trials = [t for t in self.trials() if t.config_id == final and t.status == TRIAL_OK and t.superseded is None]
        return final, trials

    def tuning_record(self) -> list[TuningRow]:
        return [tuning_row_from(mapping(r)) for r in _items(self._manifest.get("tuning_record"))]

    def rebuilt_record(self) -> list[TuningRow]:
        """For a run interrupted before its tuning record was written: one row per configuration from its trials'
        own summaries (each figure the mean over its ok trials), marked `rebuilt`."""
        rows: list[TuningRow] = []
        trials = self.trials()
        for config_id in dict.fromkeys(t.config_id for t in trials):
            ok = [t for t in trials if t.config_id == config_id and t.superseded is None and t.status == TRIAL_OK]
            metrics = {
                m: float(np.mean([t.summary[m] for t in ok if m in t.summary]))
                for m, _ in REPORT_RECORD_COLUMNS
                if any(m in t.summary for t in ok)
            }
            rows.append(TuningRow(config_id, tuple(t.trial_id for t in ok), metrics, rebuilt=True))
        return rows

    def playbook_as_run(self) -> PlaybookAsRun:
        """The archived playbook as written (resolved first: loadable without what it extended); its defaults when
        neither copy reads as a YAML mapping."""
        for name in (RESOLVED_FILE, self.info.playbook.file):
            try:
                doc = yaml.safe_load(self.read_text(name) or "")
            except yaml.YAMLError:
                continue
            if isinstance(doc, dict):
                return playbook_as_run(doc)
        return playbook_as_run({})

    def _trial_dict(self, trial_id: str) -> dict[str, object]:
        for trial in map(mapping, _items(self._manifest.get("trials"))):
            if trial.get("trial_id") == trial_id:
                return dict(trial)
        raise ArchiveError(f"{self.run_dir}: no trial {trial_id!r} in {MANIFEST}")

    def _inside_error(self, exc: OutsideError) -> ArchiveError:
        if exc.missing:
            return ArchiveError(f"{self.run_dir / str(exc.entry)}: listed in {MANIFEST} but missing (llmplay verify)")
        return ArchiveError(f"{self.run_dir}: {exc} (llmplay verify {self.run_dir})")

    def read_text(self, relpath: object) -> str | None:
        """A text file of the run (a playbook copy) by the path its manifest gives, kept inside the run; None when
        it is missing, ArchiveError when the path may not be read."""
        try:
            return read_text_inside(self.run_dir, relpath)
        except OutsideError as exc:
            if exc.missing:
                return None
            raise self._inside_error(exc) from None

    def _read_frame(self, relpath: object) -> pd.DataFrame:
        import pandas as pd  # deferred: see the imports

        try:
            fh = open_inside(self.run_dir, relpath, max_bytes=MAX_DATA_BYTES)
        except OutsideError as exc:
            raise self._inside_error(exc) from None
        with fh:
            if str(relpath).endswith(".parquet"):
                if not have_pyarrow():
                    raise ArchiveError(
                        f"{self.run_dir / str(relpath)}: reading Parquet needs pyarrow; expected `pip install pyarrow`"
                    )
                frame = pd.read_parquet(fh)
            else:
                frame = pd.read_csv(fh)
        if not str(relpath).endswith(".parquet"):
            for column in frame.columns:  # CSV loses nullable ints; ns timestamps need all 64 bits
                if (column.endswith("_ns") and column != "chunk_ns") or column in ("http_status", "gpu"):
                    frame[column] = pd.to_numeric(frame[column], errors="coerce").round().astype("Int64")
        if "chunk_ns" in frame.columns:
            frame["chunk_ns"] = [
                json.loads(v)
                if isinstance(v, str) and v.strip()
                else ([] if v is None or (not hasattr(v, "__len__") and pd.isna(v)) else list(v))
                for v in frame["chunk_ns"]
            ]
        return frame

    def _file_of(self, trial_id: str, role: str) -> object | None:
        files = self._trial_dict(trial_id).get("files")
        return files.get(role) if isinstance(files, Mapping) else None

    def load_records(self, trial_id: str) -> pd.DataFrame:
        """The trial's per-request records; an empty frame when the trial produced none (it failed to start)."""
        import pandas as pd  # deferred: see the imports

        relpath = self._file_of(trial_id, "records")
        return pd.DataFrame() if relpath is None else self._read_frame(relpath)

    def load_telemetry(self, trial_id: str) -> pd.DataFrame | None:
        relpath = self._file_of(trial_id, "telemetry")
        return None if relpath is None else self._read_frame(relpath)

    def capacity_search(self, trial_id: str) -> CapacityResult | None:
        """The capacity search a trial archived (every probe, the bracket, the binding SLO); None when it ran none."""
        relpath = self._file_of(trial_id, "capacity")
        if not relpath:
            return None
        try:
            found = json.loads(read_text_inside(self.run_dir, relpath))
        except OutsideError as exc:
            if exc.missing:
                return None
            raise self._inside_error(exc) from None
        except ValueError as exc:
            raise ArchiveError(f"{self.run_dir / str(relpath)}: not readable JSON ({exc})") from None
        return capacity_from(found) if isinstance(found, dict) else None

    def requests(self, trial_id: str) -> TrialRequests:
        """The trial's measured requests as the charts need them (empty when it archived none)."""
        return requests_from(self.load_records(trial_id) if self._file_of(trial_id, "records") is not None else None)

    def load_log(self, trial_id: str) -> str | None:
        relpath = self._file_of(trial_id, "log")
        return None if relpath is None else self.read_text(relpath)
