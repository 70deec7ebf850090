"""Reading an archived run back: its manifest as model values, and its records, telemetry and logs from disk."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from llmplay.archive.layout import MANIFEST, SCHEMA_ID, SIGNATURE_FILE
from llmplay.archive.model import ConfigRecord, Finding, GateResult, MetricDelta, StepVerdict, TrialRecord
from llmplay.archive.paths import (
    MAX_DATA_BYTES,
    MAX_MANIFEST_BYTES,
    OutsideError,
    open_inside,
    read_bytes_inside,
    read_text_inside,
)
from llmplay.errors import ArchiveError


def have_pyarrow() -> bool:
    """Parquet needs the optional pyarrow; without it the writer falls back to CSV."""
    return importlib.util.find_spec("pyarrow") is not None


# ---------------------------------------------------------------------------------------------- manifest dicts -> values
def delta_from(d: Mapping[str, Any] | None) -> MetricDelta | None:
    if d is None:
        return None
    values: dict[str, Any] = {k: d.get(k) for k in MetricDelta.__dataclass_fields__}
    return MetricDelta(**values)


def trial_from(d: Mapping[str, Any]) -> TrialRecord:
    kw = {k: d[k] for k in TrialRecord.__dataclass_fields__ if k in d}
    kw["summary"] = {k: v for k, v in (d.get("summary") or {}).items() if v is not None}
    kw["notes"] = tuple(d.get("notes") or ())
    kw["files"] = dict(d.get("files") or {})
    kw["engine_describe"] = dict(d.get("engine_describe") or {})
    return TrialRecord(**kw)


def config_from(d: Mapping[str, Any]) -> ConfigRecord:
    return ConfigRecord(
        config_id=d["config_id"],
        engine=d.get("engine") or {},
        workload=d.get("workload") or {},
        command=tuple(d.get("command") or ()),
        docker_command=d.get("docker_command") or "",
    )


def verdict_from(d: Mapping[str, Any]) -> StepVerdict:
    kw = {k: d[k] for k in StepVerdict.__dataclass_fields__ if k in d}
    kw["objective"] = delta_from(d.get("objective"))
    kw["guards"] = tuple(delta_from(g) for g in d.get("guards") or ())
    kw["deltas"] = tuple(delta_from(g) for g in d.get("deltas") or ())
    for key in ("changes", "trials_baseline", "trials_candidate"):
        kw[key] = tuple(d.get(key) or ())
    return StepVerdict(**kw)


def gate_from(d: Mapping[str, Any]) -> GateResult:
    values: dict[str, Any] = {k: d.get(k) for k in GateResult.__dataclass_fields__}
    return GateResult(**values)


def finding_from(d: Mapping[str, Any]) -> Finding:
    return Finding(**{k: str(d.get(k) or "") for k in Finding.__dataclass_fields__})


# ---------------------------------------------------------------------------------------------- describing a manifest
def engine_label(manifest: Mapping[str, Any]) -> str:
    """The final configuration's engine as people name it: image and version ("llmplay/llamacpp-cpu:local b4567")."""
    final = manifest.get("final_config_id")
    trials = [t for t in manifest.get("trials", []) if t.get("engine_describe")]
    chosen = [t for t in trials if t.get("config_id") == final] or trials
    describe = chosen[-1]["engine_describe"] if chosen else {}
    configs = {c.get("config_id"): c for c in manifest.get("configs", [])}
    config: Mapping[str, Any] = configs.get(final) or next(iter(configs.values()), {})
    engine = config.get("engine") or {}
    image = describe.get("image") or engine.get("image") or engine.get("kind") or "?"
    version = describe.get("version") or describe.get("engine_version")
    return f"{image} {version}" if version else str(image)


def gpu_label(environment: Mapping[str, Any]) -> str:
    gpu = environment.get("gpu")
    if not gpu or not isinstance(gpu, Mapping) or not gpu.get("name"):
        return "CPU only"
    count = gpu.get("count") or 1
    return f"{count}x {gpu['name']}" if count and int(count) > 1 else str(gpu["name"])


# ---------------------------------------------------------------------------------------------- the archived run
def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The manifest of an existing run directory, or an ArchiveError saying why it is not one."""
    path = run_dir / MANIFEST
    if not run_dir.is_dir():
        raise ArchiveError(f"{run_dir}: no such directory; expected a run directory made by llmplay run")
    try:
        data = read_bytes_inside(run_dir, MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
    except OutsideError as exc:
        if exc.missing:
            raise ArchiveError(f"{run_dir}: no {MANIFEST}; expected a run directory made by llmplay run") from None
        raise ArchiveError(f"{run_dir}: {exc}") from None
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

    def __init__(self, run_dir: Path, manifest: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self._manifest = manifest
        self.run_id: str = manifest["run_id"]

    @classmethod
    def open(cls, run_dir: Path) -> ArchivedRun:
        return cls(Path(run_dir), read_manifest(Path(run_dir)))

    def manifest(self) -> dict[str, Any]:
        """A deep copy: callers may change it without touching the archive."""
        return json.loads(json.dumps(self._manifest))

    def signed(self) -> bool:
        """Whether the run carries a signature file (whether it is valid is `llmplay verify --public-key`'s job)."""
        return (self.run_dir / SIGNATURE_FILE).is_file()

    def trials(self) -> list[TrialRecord]:
        return [trial_from(t) for t in self._manifest.get("trials", [])]

    def configs(self) -> list[ConfigRecord]:
        return [config_from(c) for c in self._manifest.get("configs", [])]

    def verdicts(self) -> list[StepVerdict]:
        return [verdict_from(v) for v in self._manifest.get("verdicts", [])]

    def gates(self) -> list[GateResult]:
        return [gate_from(g) for g in self._manifest.get("gates", [])]

    def findings(self) -> list[Finding]:
        return [finding_from(f) for f in self._manifest.get("findings", [])]

    def _trial_dict(self, trial_id: str) -> dict[str, Any]:
        for trial in self._manifest.get("trials", []):
            if trial.get("trial_id") == trial_id:
                return trial
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
        relpath = self._file_of(trial_id, "records")
        return pd.DataFrame() if relpath is None else self._read_frame(relpath)

    def load_telemetry(self, trial_id: str) -> pd.DataFrame | None:
        relpath = self._file_of(trial_id, "telemetry")
        return None if relpath is None else self._read_frame(relpath)

    def load_capacity(self, trial_id: str) -> dict[str, Any] | None:
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
        return dict(found) if isinstance(found, dict) else None

    def load_log(self, trial_id: str) -> str | None:
        relpath = self._file_of(trial_id, "log")
        return None if relpath is None else self.read_text(relpath)
