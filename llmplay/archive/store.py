"""The run archive on disk: one directory per run with manifest.json (sha256 of every file), records, telemetry, logs.

Layout: `<root>/<playbook>/<UTC %Y%m%dT%H%M%SZ>-<6 hex>/` holding `playbook.yaml` (as run, redacted),
`manifest.json`, `trials/<trial_id>/{requests,telemetry}.{parquet,csv}` and `engine.log`, and `report.html`.
Every write is atomic (temp file in the same directory, then os.replace) and the manifest is rewritten
after every trial, so a crash loses at most the trial in flight. The manifest carries its own hash
(`manifest_sha256`, over its canonical JSON without that key) so an edited manifest fails `verify` too.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
import secrets as _secrets
import tempfile
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from llmplay.errors import ArchiveError
from llmplay.hashing import sha256_file
from llmplay.archive.model import (
    ConfigRecord,
    Finding,
    GateResult,
    MetricDelta,
    StepVerdict,
    TrialRecord,
    to_plain,
)
from llmplay.redaction import ENV_REF, REDACTED, redact, redact_text

SCHEMA_ID = "llmplay/manifest.v1"
MANIFEST = "manifest.json"
PLAYBOOK_FILE = "playbook.yaml"
RESOLVED_FILE = "playbook.resolved.yaml"  # after `extends:`: loadable without the files it extended
REPORT_FILE = "report.html"
STATUSES = ("running", "complete", "failed", "interrupted")
ENV_ARCHIVE = "LLMPLAY_ARCHIVE"
_TMP_PREFIX = ".tmp-"
# `KEY: value` lines in YAML whose key names a secret; the value is blanked unless it is a ${env:X} reference.
# In playbook text a key is secret only when it *ends* in a secret word (HF_TOKEN, OPENAI_API_KEY): `prefix_tokens`
# or `max_tokens` are workload numbers, and blanking them would make the archived playbook unloadable.
_SECRET_KEY = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)$", re.I)
_PLAIN_SCALAR = re.compile(r"(-?[0-9][0-9_.eE+-]*|true|false|null|~)(\s+#.*)?", re.I)
_YAML_SECRET_LINE = re.compile(r"^(?P<head>\s*-?\s*[\"']?(?P<key>[A-Za-z0-9_.-]+)[\"']?\s*:\s*)(?P<value>\S.*?)\s*$")


# ---------------------------------------------------------------------------------------------- low level
def _have_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temp file beside `path`; os.replace then swaps it in, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix="-" + path.name, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; archives are meant to be read by others
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    _atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _finite(obj: Any) -> Any:
    """JSON-ready: NaN/inf (a non-finite number means "not measured") become null, unknown types their text."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item"):  # numpy scalars
        try:
            return _finite(obj.item())
        except (TypeError, ValueError):
            pass
    return str(obj)  # Paths, datetimes, anything else a describe() hands over: JSON text, never a crash mid-run


def _canonical(manifest: Mapping[str, Any]) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def manifest_schema() -> dict[str, Any]:
    return json.loads(resources.files("llmplay").joinpath("schemas/manifest.v1.json").read_text())


def schema_problems(manifest: Any) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(manifest_schema())
    out = []
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        out.append(f"{MANIFEST}: {where}: {error.message}")
    return out


def redact_yaml_text(text: str, secrets: Sequence[str] = ()) -> str:
    """Playbook text as archived: known secret values, URL credentials and literal values of secret-named keys blanked."""
    lines = []
    for line in redact_text(text, list(secrets)).splitlines(keepends=True):
        end = "\n" if line.endswith("\n") else ""
        match = _YAML_SECRET_LINE.match(line.rstrip("\n"))
        if match and _SECRET_KEY.search(match.group("key")):
            value = match.group("value")
            bare = value.strip("\"'")
            if not ENV_REF.fullmatch(bare) and not value.startswith(("{", "[", "#", "|", ">")) and \
                    not _PLAIN_SCALAR.fullmatch(value):
                line = f"{match.group('head')}{REDACTED}{end}"
        lines.append(line)
    return "".join(lines)


def _utc_stamp(now: dt.datetime | None = None) -> tuple[str, str]:
    now = now or dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "playbook"


# ---------------------------------------------------------------------------------------------- records <-> dicts
def _delta(d: Mapping[str, Any] | None) -> MetricDelta | None:
    if d is None:
        return None
    return MetricDelta(**{k: d.get(k) for k in MetricDelta.__dataclass_fields__})


def _trial_from(d: Mapping[str, Any]) -> TrialRecord:
    kw = {k: d[k] for k in TrialRecord.__dataclass_fields__ if k in d}
    kw["summary"] = {k: v for k, v in (d.get("summary") or {}).items() if v is not None}
    kw["notes"] = tuple(d.get("notes") or ())
    kw["files"] = dict(d.get("files") or {})
    kw["engine_describe"] = dict(d.get("engine_describe") or {})
    return TrialRecord(**kw)


def _config_from(d: Mapping[str, Any]) -> ConfigRecord:
    return ConfigRecord(config_id=d["config_id"], engine=d.get("engine") or {}, workload=d.get("workload") or {},
                        command=tuple(d.get("command") or ()), docker_command=d.get("docker_command") or "")


def _verdict_from(d: Mapping[str, Any]) -> StepVerdict:
    kw = {k: d[k] for k in StepVerdict.__dataclass_fields__ if k in d}
    kw["objective"] = _delta(d.get("objective"))
    kw["guards"] = tuple(_delta(g) for g in d.get("guards") or ())
    kw["deltas"] = tuple(_delta(g) for g in d.get("deltas") or ())
    for key in ("changes", "trials_baseline", "trials_candidate"):
        kw[key] = tuple(d.get(key) or ())
    return StepVerdict(**kw)


def gate_from(d: Mapping[str, Any]) -> GateResult:
    return GateResult(**{k: d.get(k) for k in GateResult.__dataclass_fields__})


def finding_from(d: Mapping[str, Any]) -> Finding:
    return Finding(**{k: str(d.get(k) or "") for k in Finding.__dataclass_fields__})


def _upsert(items: list[dict[str, Any]], key: str, item: dict[str, Any]) -> None:
    for i, existing in enumerate(items):
        if existing.get(key) == item.get(key):
            items[i] = item
            return
    items.append(item)


# ---------------------------------------------------------------------------------------------- the archive
class RunArchive:
    """One run directory. The runner writes through it; the report, compare and verify read through it."""

    def __init__(self, run_dir: Path, manifest: dict[str, Any], secrets: Sequence[str] = ()):
        self.run_dir = Path(run_dir)
        self._manifest = manifest
        self._secrets = [s for s in secrets if s]
        self.run_id: str = manifest["run_id"]

    # -------------------------------------------------------------------- creating and opening
    @classmethod
    def create(cls, root: Path, playbook: Any, *, overrides: Mapping[str, Any], environment: Mapping[str, Any],
               secrets: list[str]) -> "RunArchive":
        stamp, iso = _utc_stamp()
        short = _secrets.token_hex(3)
        run_dir = Path(root) / _safe_name(playbook.metadata.name) / f"{stamp}-{short}"
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
        except FileExistsError:  # same second and same 24 random bits: astronomically rare, but never overwrite
            raise ArchiveError(f"{run_dir} already exists; run again") from None
        except OSError as exc:
            raise ArchiveError(f"cannot create the run archive {run_dir}: {exc.strerror}; "
                               f"expected a writable --archive directory or ${ENV_ARCHIVE}") from None
        env = redact(_finite(to_plain(dict(environment))), list(secrets))
        env.setdefault("started_utc", iso)
        manifest: dict[str, Any] = {
            "schema": SCHEMA_ID,
            "run_id": f"{stamp}-{short}",
            "playbook": {"name": playbook.metadata.name, "version": str(playbook.metadata.version),
                         "path": str(playbook.path), "sha256": playbook.sha256, "file": PLAYBOOK_FILE,
                         "api_version": getattr(playbook, "api_version", "")},
            "environment": env,
            "overrides": redact(_finite(to_plain(dict(overrides))), list(secrets)),
            "status": "running",
            "exit_code": None,
            "configs": [], "trials": [], "verdicts": [],
            "final_config_id": None,
            "gates": [], "findings": [], "diagnosis": {}, "tuning_record": [],
            "files": {},
        }
        archive = cls(run_dir, manifest, secrets)
        archive._write_text(PLAYBOOK_FILE, redact_yaml_text(playbook.text, archive._secrets))
        resolved = getattr(playbook, "resolved", None)
        if resolved:
            import yaml

            archive._write_text(RESOLVED_FILE, yaml.safe_dump(redact(to_plain(resolved), archive._secrets),
                                                              sort_keys=False, allow_unicode=True))
        archive._save()
        return archive

    @classmethod
    def open(cls, run_dir: Path, *, secrets: Sequence[str] = ()) -> "RunArchive":
        """Open an existing archive (for --resume, report, compare). Redaction on later writes is then by name and
        URL pattern, plus any `secrets` the caller passes again (values are never stored)."""
        run_dir = Path(run_dir)
        path = run_dir / MANIFEST
        if not run_dir.is_dir():
            raise ArchiveError(f"{run_dir}: no such directory; expected a run directory made by llmplay run")
        if not path.is_file():
            raise ArchiveError(f"{run_dir}: no {MANIFEST}; expected a run directory made by llmplay run")
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"{path}: not readable JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA_ID:
            found = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
            raise ArchiveError(f"{path}: schema is {found!r}, expected {SCHEMA_ID!r} (an archive from another "
                               "llmplay version, or not an llmplay archive)")
        if "run_id" not in manifest:
            raise ArchiveError(f"{path}: no run_id; the manifest is damaged (llmplay verify {run_dir} lists why)")
        return cls(run_dir, manifest, secrets)

    # -------------------------------------------------------------------- writing
    def _write_text(self, relpath: str, text: str) -> None:
        atomic_write_text(self.run_dir / relpath, text)
        self._manifest["files"][relpath] = sha256_file(self.run_dir / relpath)

    def _redact(self, obj: Any) -> Any:
        return redact(_finite(to_plain(obj)), self._secrets)

    def _save(self) -> None:
        manifest = _finite(self._manifest)
        manifest["files"] = dict(sorted(manifest["files"].items()))
        manifest.pop("manifest_sha256", None)
        problems = schema_problems(manifest)
        if problems:  # the runner handed in something the contract does not allow: a bug, say exactly where
            raise ArchiveError(f"refusing to write an invalid manifest to {self.run_dir}: {problems[0]}")
        manifest["manifest_sha256"] = hashlib.sha256(_canonical(manifest)).hexdigest()
        self._manifest = manifest
        atomic_write_text(self.run_dir / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False,
                                                              allow_nan=False) + "\n")

    def write_config(self, config: ConfigRecord) -> None:
        _upsert(self._manifest["configs"], "config_id", self._redact(config))
        self._save()

    def _write_frame(self, relbase: str, frame: Any) -> str:
        import pandas as pd

        frame = frame.copy()
        if "chunk_ns" in frame.columns:  # one JSON text per request: same in Parquet and CSV, no list-type guessing
            frame["chunk_ns"] = [json.dumps([int(x) for x in v]) if v is not None and not isinstance(v, str) else v
                                 for v in frame["chunk_ns"]]
        for column in frame.columns:  # pandas 3 stores text as "str", older versions as object
            if pd.api.types.is_object_dtype(frame[column]) or pd.api.types.is_string_dtype(frame[column]):
                frame[column] = [redact_text(v, self._secrets) if isinstance(v, str) else v for v in frame[column]]
        if _have_pyarrow():
            relpath = relbase + ".parquet"
            _atomic_write(self.run_dir / relpath, lambda tmp: frame.to_parquet(tmp, index=False))
        else:
            relpath = relbase + ".csv"
            _atomic_write(self.run_dir / relpath, lambda tmp: frame.to_csv(tmp, index=False))
        self._manifest["files"][relpath] = sha256_file(self.run_dir / relpath)
        return relpath

    def write_trial(self, trial: TrialRecord, records: Any, telemetry: Any, engine_log: str) -> None:
        base = f"trials/{_safe_name(trial.trial_id)}"
        files = dict(trial.files)
        if records is not None:
            files["records"] = self._write_frame(f"{base}/requests", records)
        if telemetry is not None:
            files["telemetry"] = self._write_frame(f"{base}/telemetry", telemetry)
        if engine_log:
            files["log"] = f"{base}/engine.log"
            self._write_text(files["log"], redact_text(engine_log, self._secrets))
        _upsert(self._manifest["trials"], "trial_id", self._redact(replace(trial, files=files)))
        self._save()

    def write_verdict(self, verdict: StepVerdict) -> None:
        _upsert(self._manifest["verdicts"], "step", self._redact(verdict))
        self._save()

    def finish(self, *, status: str, exit_code: int, final_config_id: str, gates: Sequence[GateResult],
               findings: Sequence[Any], diagnosis: Mapping[str, Any],
               tuning_record: Sequence[Mapping[str, Any]]) -> None:
        if status not in STATUSES[1:]:
            raise ArchiveError(f"finish(status={status!r}): expected one of {', '.join(STATUSES[1:])}")
        m = self._manifest
        m.update(status=status, exit_code=int(exit_code), final_config_id=final_config_id,
                 gates=self._redact(list(gates)), findings=self._redact(list(findings)),
                 diagnosis=self._redact(dict(diagnosis)), tuning_record=self._redact(list(tuning_record)),
                 finished_utc=_utc_stamp()[1])
        self._save()

    def record_report(self, relpath: str) -> None:
        """The report renderer wrote `relpath`: hash it into the manifest and clear any earlier rendering error."""
        self._manifest.pop("report_error", None)
        self.record_file(relpath)

    def record_report_error(self, error: str) -> None:
        """Rendering failed; the measurements are safe on disk and the manifest says why there is no report."""
        self._manifest["report_error"] = error
        self._save()

    def record_file(self, relpath: str) -> None:
        """Hash a file written by someone else (e.g. the report renderer) into the manifest."""
        self._manifest["files"][relpath] = sha256_file(self.run_dir / relpath)
        self._save()

    # -------------------------------------------------------------------- reading
    def manifest(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._manifest))

    def trials(self) -> list[TrialRecord]:
        return [_trial_from(t) for t in self._manifest.get("trials", [])]

    def configs(self) -> list[ConfigRecord]:
        return [_config_from(c) for c in self._manifest.get("configs", [])]

    def verdicts(self) -> list[StepVerdict]:
        return [_verdict_from(v) for v in self._manifest.get("verdicts", [])]

    def gates(self) -> list[GateResult]:
        return [gate_from(g) for g in self._manifest.get("gates", [])]

    def findings(self) -> list[Finding]:
        return [finding_from(f) for f in self._manifest.get("findings", [])]

    def _trial_dict(self, trial_id: str) -> dict[str, Any]:
        for trial in self._manifest.get("trials", []):
            if trial.get("trial_id") == trial_id:
                return trial
        raise ArchiveError(f"{self.run_dir}: no trial {trial_id!r} in {MANIFEST}")

    def _read_frame(self, relpath: str) -> Any:
        import pandas as pd

        path = self.run_dir / relpath
        if not path.is_file():
            raise ArchiveError(f"{path}: listed in {MANIFEST} but missing (llmplay verify {self.run_dir})")
        if path.suffix == ".parquet":
            if not _have_pyarrow():
                raise ArchiveError(f"{path}: reading Parquet needs pyarrow; expected `pip install pyarrow`")
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path)
            for column in frame.columns:  # CSV loses nullable ints; ns timestamps need all 64 bits
                if column.endswith("_ns") and column != "chunk_ns" or column in ("http_status", "gpu"):
                    frame[column] = pd.to_numeric(frame[column], errors="coerce").round().astype("Int64")
        if "chunk_ns" in frame.columns:
            frame["chunk_ns"] = [json.loads(v) if isinstance(v, str) and v.strip() else
                                 ([] if v is None or (not hasattr(v, "__len__") and pd.isna(v)) else list(v))
                                 for v in frame["chunk_ns"]]
        return frame

    def load_records(self, trial_id: str) -> Any:
        """The trial's per-request records; an empty frame when the trial produced none (it failed to start)."""
        import pandas as pd

        relpath = (self._trial_dict(trial_id).get("files") or {}).get("records")
        return pd.DataFrame() if relpath is None else self._read_frame(relpath)

    def load_telemetry(self, trial_id: str) -> Any:
        relpath = (self._trial_dict(trial_id).get("files") or {}).get("telemetry")
        return None if relpath is None else self._read_frame(relpath)

    def load_log(self, trial_id: str) -> str | None:
        relpath = (self._trial_dict(trial_id).get("files") or {}).get("log")
        if relpath is None or not (self.run_dir / relpath).is_file():
            return None
        return (self.run_dir / relpath).read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------- verify, ls, root
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
        actual = hashlib.sha256(_canonical(manifest)).hexdigest()
    except ValueError:
        actual = None
    if stored != actual:
        problems.append(f"{MANIFEST}: changed after llmplay wrote it (its manifest_sha256 does not match its content)")
    listed = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
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


def _engine_of(manifest: Mapping[str, Any]) -> str:
    final = manifest.get("final_config_id")
    trials = [t for t in manifest.get("trials", []) if t.get("engine_describe")]
    chosen = [t for t in trials if t.get("config_id") == final] or trials
    describe = chosen[-1]["engine_describe"] if chosen else {}
    configs = {c.get("config_id"): c for c in manifest.get("configs", [])}
    config = configs.get(final) or next(iter(configs.values()), {})
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


def list_runs(root: Path) -> list[dict[str, Any]]:
    """One row per run under root, newest first: playbook, date, status, engine, GPU, gates met, path."""
    rows = []
    for manifest_path in sorted(Path(root).glob(f"*/*/{MANIFEST}")):
        run_dir = manifest_path.parent
        try:
            m = json.loads(manifest_path.read_text(encoding="utf-8"))
            if not isinstance(m, dict) or m.get("schema") != SCHEMA_ID:
                raise ValueError("not an llmplay manifest")
        except (OSError, ValueError):
            rows.append({"playbook": run_dir.parent.name, "version": "", "date": "", "status": "unreadable",
                         "engine": "", "gpu": "", "gates": "", "path": str(run_dir), "run_id": run_dir.name})
            continue
        gates = m.get("gates") or []
        met = sum(1 for g in gates if g.get("met"))
        env = m.get("environment") or {}
        rows.append({"playbook": m.get("playbook", {}).get("name", run_dir.parent.name),
                     "version": m.get("playbook", {}).get("version", ""),
                     "date": env.get("started_utc", ""), "status": m.get("status", "?"),
                     "engine": _engine_of(m), "gpu": gpu_label(env),
                     "gates": f"{met}/{len(gates)}" if gates else "-", "path": str(run_dir),
                     "run_id": m.get("run_id", run_dir.name),
                     "overridden": bool(m.get("overrides"))})
    rows.sort(key=lambda r: (r["date"], r["run_id"]), reverse=True)
    return rows


def archive_root(cli_value: str | None) -> Path:
    """--archive DIR, else $LLMPLAY_ARCHIVE, else ./reports."""
    if cli_value:
        return Path(cli_value)
    if os.environ.get(ENV_ARCHIVE):
        return Path(os.environ[ENV_ARCHIVE])
    return Path("reports")
