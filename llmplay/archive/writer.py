"""Writing a run archive: create or reopen a run directory, then trials, verdicts and the finish, atomically and redacted.

Every write is atomic (temp file in the same directory, then os.replace) and the manifest is rewritten after every
trial, so a crash loses at most the trial in flight. The manifest carries its own hash (`manifest_sha256`, over its
canonical JSON without that key) so an edited manifest fails `verify` too; with $LLMPLAY_SIGNING_KEY set, every
manifest written is also signed (`manifest.sig`, archive.signing), which is what makes an edit detectable by someone
who recomputes that hash. Only this class writes a manifest: re-rendering a report never does. Secrets are redacted
before anything reaches the disk: known values, URL credentials and secret-named keys (llmplay.redaction).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import secrets as _secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast, overload

import pandas as pd
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from llmplay.archive.atomic import atomic_write
from llmplay.archive.capacity import CapacityResult
from llmplay.archive.index import index_finished_run
from llmplay.archive.layout import (
    ENV_ARCHIVE,
    ENV_SIGNING_KEY,
    MANIFEST,
    PLAYBOOK_FILE,
    PROBES_FILE,
    RESOLVED_FILE,
    SCHEMA_ID,
    SIGNATURE_FILE,
    STATUSES,
    safe_name,
)
from llmplay.archive.model import (
    ConfigRecord,
    Diagnosis,
    EngineDescription,
    Finding,
    GateResult,
    RooflineFacts,
    StepVerdict,
    TrialRecord,
    TuningRow,
    to_plain,
)
from llmplay.archive.reader import ArchivedRun, have_pyarrow, read_manifest
from llmplay.archive.run_facts import GpuInventory, RunEnvironment, RunOverrides
from llmplay.archive.signing import signature_document, signing_key_from_env
from llmplay.archive.verify import manifest_sha256, schema_problems
from llmplay.errors import ArchiveError
from llmplay.hashing import sha256_file
from llmplay.loadgen.probes import ProbeResult
from llmplay.redaction import redact, redact_text, redact_yaml_text
from llmplay.runtime.owner import Owner

if TYPE_CHECKING:
    from llmplay.spec import Playbook


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


@overload
def _finite(obj: Mapping[str, object]) -> dict[str, object]: ...
@overload
def _finite(obj: object) -> object: ...
def _finite(obj: object) -> object:
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


def _utc_stamp(now: dt.datetime | None = None) -> tuple[str, str]:
    now = now or dt.datetime.now(dt.UTC)
    return now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _upsert(items: list[dict[str, object]], key: str, item: dict[str, object]) -> None:
    for i, existing in enumerate(items):
        if existing.get(key) == item.get(key):
            items[i] = item
            return
    items.append(item)


def _row_json(row: TuningRow) -> dict[str, object]:
    """A tuning-record row as the manifest holds it: a step's keys only on a step's row (never `rebuilt`, which only
    a reader sets)."""
    out: dict[str, object] = {
        "config_id": row.config_id,
        "trials": list(row.trials),
        "failed_trials": row.failed_trials,
        "metrics": dict(row.metrics),
        "samples": dict(row.samples),
    }
    if row.verdict is not None:
        out.update(
            step=row.step,
            verdict=row.verdict,
            reason=row.reason,
            compared_with=row.compared_with,
            changes=list(row.changes),
        )
    return out


def _roofline_json(r: RooflineFacts) -> dict[str, object]:
    return {
        "bytes_per_step": r.bytes_per_step,
        "bandwidth_bytes_s": r.bandwidth_bytes_s,
        "floor_s": r.floor_s,
        "achieved_tpot_s": r.achieved_tpot_s,
        "achieved_over_floor": r.achieved_over_floor,
        "bandwidth_util": r.bandwidth_util,
        "achieved_bandwidth_bytes_s": r.achieved_bandwidth_bytes_s,
        "bandwidth_source": r.bandwidth_source,
    }


def _diagnosis_json(d: Diagnosis) -> dict[str, object]:
    """The diagnosis as the manifest holds it: only the parts the run made (an empty object when it made none)."""
    if not (d.notes or d.model or d.memory or d.roofline or d.scheduler or d.rules is not None):
        return {}
    out: dict[str, object] = {"notes": list(d.notes)}
    if d.model:
        out["model"] = dict(d.model)
    if d.memory is not None:
        out["memory"] = to_plain(d.memory)
    if d.roofline is not None:
        out["roofline"] = _roofline_json(d.roofline)
    if d.scheduler:
        out["scheduler"] = dict(d.scheduler)
    if d.rules is not None:
        out["rules"] = [to_plain(r) for r in d.rules]
    return out


# The order each runtime has always described its engine in (every fact it has, null included); a description
# from elsewhere (a test's maker) is written with the facts it gives.
_DESCRIBED_AS: dict[str, tuple[str, ...]] = {
    "docker": (
        "runtime",
        "engine",
        "engine_version",
        "image",
        "image_id",
        "image_digest",
        "command",
        "command_line",
        "container_id",
        "container_name",
        "host_port",
        "container_port",
        "labels",
        "gpus",
        "image_labels",
        "health_s",
        "engine_version_reported",
        "base_url",
    ),
    "process": (
        "runtime",
        "engine",
        "engine_version",
        "image",
        "image_id",
        "image_digest",
        "container_id",
        "executable",
        "command",
        "command_line",
        "host_port",
        "log_path",
        "labels",
        "pid",
        "health_s",
        "base_url",
    ),
    "endpoint": (
        "runtime",
        "engine",
        "engine_version",
        "image",
        "image_id",
        "image_digest",
        "container_id",
        "command",
        "command_line",
        "base_url",
        "health_s",
        "labels",
    ),
}


def _engine_json(d: EngineDescription | None) -> dict[str, object]:
    """A trial's engine as the manifest holds it: `{}` when it was never described."""
    if d is None:
        return {}
    plain = to_plain(d)
    keys = _DESCRIBED_AS.get(d.runtime or "") or [k for k, v in plain.items() if v is not None and v != {}]
    return {k: plain[k] for k in keys}


def _trial_json(trial: TrialRecord) -> dict[str, object]:
    out = to_plain(trial)
    out["engine_describe"] = _engine_json(trial.engine_describe)
    return out


def _gpu_json(gpu: GpuInventory | None) -> dict[str, object] | None:
    """The GPU inventory as NVML gave it: `error` alone when it could not say; the node that answered on a cluster."""
    if gpu is None:
        return None
    out: dict[str, object]
    if gpu.error is not None:
        out = {"error": gpu.error}
    else:
        out = {"name": gpu.name, "names": list(gpu.names), "count": gpu.count, "driver": gpu.driver, "cuda": gpu.cuda}
    if gpu.node is not None:
        out["node"] = gpu.node
    return out


def _environment_json(env: RunEnvironment, started_utc: str) -> dict[str, object]:
    """The header as a run has always written it; a text fact not given ("") is left out, as a maker of test
    archives leaves it."""
    given: dict[str, object] = {
        "host": env.host,
        "docker": env.docker,
        "user": env.user,
        "llmplay_version": env.llmplay_version,
        "python": env.python,
        "platform": env.platform,
        "gpu": _gpu_json(env.gpu),
        "seed": env.seed,
        "started_utc": env.started_utc or started_utc,
    }
    out = {k: v for k, v in given.items() if v != ""}
    if env.cluster is not None:
        out["cluster"] = to_plain(env.cluster)
    return out


def _overrides_json(o: RunOverrides) -> dict[str, object]:
    """Only what the command line overrode."""
    given = {
        "repeats": o.repeats,
        "duration_s": o.duration_s,
        "warmup_s": o.warmup_s,
        "only": list(o.only) or None,
        "image": o.image,
        "ray": o.ray,
        "capacity": o.capacity or None,
    }
    return {k: v for k, v in given.items() if v is not None}


class RunArchive(ArchivedRun):
    """One run directory the runner writes through (and reads back from, for --resume)."""

    def __init__(
        self,
        run_dir: Path,
        manifest: dict[str, object],
        secrets: Sequence[str] = (),
        signing_key: Ed25519PrivateKey | None = None,
    ):
        super().__init__(run_dir, manifest)
        self._secrets = [s for s in secrets if s]
        self._signing_key = signing_key

    # -------------------------------------------------------------------- creating and opening
    @classmethod
    def create(
        cls,
        root: Path,
        playbook: Playbook,
        *,
        overrides: RunOverrides,
        environment: RunEnvironment,
        secrets: list[str],
    ) -> RunArchive:
        signing_key = signing_key_from_env()  # a set but broken key fails here, before the run directory exists
        stamp, iso = _utc_stamp()
        short = _secrets.token_hex(3)
        run_dir = Path(root) / safe_name(playbook.metadata.name) / f"{stamp}-{short}"
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
        except FileExistsError:  # same second and same 24 random bits: astronomically rare, but never overwrite
            raise ArchiveError(f"{run_dir} already exists; run again") from None
        except OSError as exc:
            raise ArchiveError(
                f"cannot create the run archive {run_dir}: {exc.strerror}; "
                f"expected a writable --archive directory or ${ENV_ARCHIVE}"
            ) from None
        redacted: list[str] = []
        env = redact(_finite(_environment_json(environment, iso)), list(secrets), redacted, "environment")
        manifest: dict[str, object] = {
            "schema": SCHEMA_ID,
            "run_id": f"{stamp}-{short}",
            "playbook": {
                "name": playbook.metadata.name,
                "version": str(playbook.metadata.version),
                "path": str(playbook.path),
                "sha256": playbook.sha256,
                "file": PLAYBOOK_FILE,
                "api_version": getattr(playbook, "api_version", ""),
            },
            "environment": env,
            "overrides": redact(_finite(_overrides_json(overrides)), list(secrets), redacted, "overrides"),
            "status": "running",
            "exit_code": None,
            "configs": [],
            "trials": [],
            "verdicts": [],
            "final_config_id": None,
            "gates": [],
            "findings": [],
            "diagnosis": {},
            "tuning_record": [],
            "files": {},
        }
        archive = cls(run_dir, manifest, secrets, signing_key)
        archive._note(redacted)
        lines: list[int] = []
        archive._write_text(PLAYBOOK_FILE, redact_yaml_text(playbook.text, archive._secrets, lines))
        archive._note(f"{PLAYBOOK_FILE} line {n}" for n in lines)
        resolved = getattr(playbook, "resolved", None)
        if resolved:
            found: list[str] = []
            plain = redact(to_plain(resolved), archive._secrets, found)
            archive._write_text(RESOLVED_FILE, yaml.safe_dump(plain, sort_keys=False, allow_unicode=True))
            archive._note(f"{RESOLVED_FILE}: {path}" for path in found)
        archive._save()
        return archive

    @classmethod
    def open(cls, run_dir: Path, *, secrets: Sequence[str] = (), sign: bool = True) -> RunArchive:
        """Open an existing archive (for --resume, or to record its report). Redaction on later writes is then by
        name and URL pattern, plus any `secrets` the caller passes again (values are never stored). `sign=False`:
        what is written is never signed, and a signature already there is left to go stale (archive.trust)."""
        if not sign:
            return cls(Path(run_dir), read_manifest(Path(run_dir)), secrets, None)
        key = signing_key_from_env()
        if key is None and (Path(run_dir) / SIGNATURE_FILE).exists():  # writing on would leave a stale signature
            raise ArchiveError(
                f"{run_dir} is signed ({SIGNATURE_FILE}); expected ${ENV_SIGNING_KEY} set to its signing key to "
                "write to it"
            )
        return cls(Path(run_dir), read_manifest(Path(run_dir)), secrets, key)

    def set_owner(self, owner: Owner) -> None:
        """The process writing this archive from now on (a resumed run has a new one): host, pid, start time, so a
        reader can tell a run still going from one whose process was killed."""
        self._manifest["owner"] = owner.as_dict()
        self._save()

    # -------------------------------------------------------------------- writing
    def _write_text(self, relpath: str, text: str) -> None:
        atomic_write_text(self.run_dir / relpath, text)
        self._files()[relpath] = sha256_file(self.run_dir / relpath)

    def _files(self) -> dict[str, object]:
        return cast(dict[str, object], self._manifest["files"])  # created as a mapping above

    def _entries(self, key: str) -> list[dict[str, object]]:
        """One of the manifest's lists of records (configs, trials, verdicts), as created above."""
        return cast(list[dict[str, object]], self._manifest[key])

    def _redact(self, obj: object, where: str) -> object:
        found: list[str] = []
        out = redact(_finite(to_plain(obj)), self._secrets, found, where)
        self._note(found)
        return out

    def _redact_record(self, obj: object, where: str) -> dict[str, object]:
        """A record (or a mapping) as the manifest's JSON object, redacted."""
        return cast(dict[str, object], self._redact(obj, where))

    def _redact_text(self, text: str, where: str) -> str:
        out = redact_text(text, self._secrets)
        if out != text:
            self._note([where])
        return out

    def _note(self, paths: Iterable[str]) -> None:
        """Where values were redacted (paths and file names, never the values): the report lists them."""
        known = cast(list[str], self._manifest.get("redacted", []))
        added = [p for p in dict.fromkeys(paths) if p not in known]
        if added:
            self._manifest["redacted"] = [*known, *added]

    def _save(self) -> None:
        manifest = _finite(self._manifest)
        manifest["files"] = dict(sorted(cast(dict[str, object], manifest["files"]).items()))
        manifest.pop("manifest_sha256", None)
        problems = schema_problems(manifest)
        if problems:  # the runner handed in something the contract does not allow: a bug, say exactly where
            raise ArchiveError(f"refusing to write an invalid manifest to {self.run_dir}: {problems[0]}")
        manifest["manifest_sha256"] = manifest_sha256(manifest)
        self._manifest = manifest
        data = (json.dumps(manifest, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()
        atomic_write(self.run_dir / MANIFEST, lambda tmp: tmp.write_bytes(data))
        if self._signing_key is not None:  # over the bytes just written; a crash between the two fails verify loudly
            signature = signature_document(data, self._signing_key)
            atomic_write(self.run_dir / SIGNATURE_FILE, lambda tmp: tmp.write_bytes(signature))
        if manifest["status"] != "running":  # finished (or a finished run's manifest amended): into the index
            index_finished_run(self.run_dir)  # never fails the run: the index is rebuilt from manifests on demand

    def write_config(self, config: ConfigRecord) -> None:
        _upsert(self._entries("configs"), "config_id", self._redact_record(config, f"configs[{config.config_id}]"))
        self._save()

    def _write_frame(self, relbase: str, frame: pd.DataFrame) -> str:
        frame = frame.copy()
        if "chunk_ns" in frame.columns:  # one JSON text per request: same in Parquet and CSV, no list-type guessing
            frame["chunk_ns"] = [
                json.dumps([int(x) for x in v]) if v is not None and not isinstance(v, str) else v
                for v in frame["chunk_ns"]
            ]
        for column in frame.columns:  # pandas 3 stores text as "str", older versions as object
            if pd.api.types.is_object_dtype(frame[column]) or pd.api.types.is_string_dtype(frame[column]):
                where = f"{relbase} column {column}"
                frame[column] = [self._redact_text(v, where) if isinstance(v, str) else v for v in frame[column]]
        if have_pyarrow():
            relpath = relbase + ".parquet"
            atomic_write(self.run_dir / relpath, lambda tmp: frame.to_parquet(tmp, index=False))
        else:
            relpath = relbase + ".csv"
            atomic_write(self.run_dir / relpath, lambda tmp: frame.to_csv(tmp, index=False))
        self._files()[relpath] = sha256_file(self.run_dir / relpath)
        return relpath

    def write_trial(
        self,
        trial: TrialRecord,
        records: pd.DataFrame | None,
        telemetry: pd.DataFrame | None,
        engine_log: str,
        capacity: CapacityResult | None = None,
    ) -> None:
        """The trial's record and raw data; `capacity` is its capacity search (every probe), when it ran one."""
        base = f"trials/{safe_name(trial.trial_id)}"
        files = dict(trial.files)
        if capacity is not None:
            files["capacity"] = f"{base}/capacity.json"
            self._write_text(
                files["capacity"],
                json.dumps(self._redact(capacity.as_dict(), files["capacity"]), indent=1, ensure_ascii=False) + "\n",
            )
        if records is not None:
            files["records"] = self._write_frame(f"{base}/requests", records)
        if telemetry is not None:
            files["telemetry"] = self._write_frame(f"{base}/telemetry", telemetry)
        if engine_log:
            files["log"] = f"{base}/engine.log"
            self._write_text(files["log"], self._redact_text(engine_log, files["log"]))
        record = self._redact_record(_trial_json(replace(trial, files=files)), f"trials[{trial.trial_id}]")
        _upsert(self._entries("trials"), "trial_id", record)
        self._save()

    def mark_superseded(self, trial_id: str, reason: str) -> None:
        """A trial kept for the audit whose figures are no longer used (its pair was measured again elsewhere)."""
        for trial in self._entries("trials"):
            if trial.get("trial_id") == trial_id:
                trial["superseded"] = self._redact_text(reason, f"trials[{trial_id}].superseded")
        self._save()

    def write_probes(self, trial_id: str, probes: Sequence[ProbeResult]) -> None:
        """A trial's goals.quality answers (prompt, text, tokens, log-probabilities), redacted, for later compares."""
        relpath = f"trials/{safe_name(trial_id)}/{PROBES_FILE}"
        answers = [p.as_dict() for p in probes]
        self._write_text(relpath, json.dumps(self._redact(answers, relpath), indent=1, ensure_ascii=False) + "\n")
        self._save()

    def write_verdict(self, verdict: StepVerdict) -> None:
        _upsert(self._entries("verdicts"), "step", self._redact_record(verdict, f"verdicts[{verdict.step}]"))
        self._save()

    def finish(
        self,
        *,
        status: str,
        exit_code: int,
        final_config_id: str,
        gates: Sequence[GateResult],
        findings: Sequence[Finding],
        diagnosis: Diagnosis,
        tuning_record: Sequence[TuningRow],
    ) -> None:
        """The run's conclusion, from its records; the manifest holds them in the JSON shape it always has."""
        if status not in STATUSES[1:]:
            raise ArchiveError(f"finish(status={status!r}): expected one of {', '.join(STATUSES[1:])}")
        m = self._manifest
        m.update(
            status=status,
            exit_code=int(exit_code),
            final_config_id=final_config_id,
            gates=self._redact(list(gates), "gates"),
            findings=self._redact(list(findings), "findings"),
            diagnosis=self._redact(_diagnosis_json(diagnosis), "diagnosis"),
            tuning_record=self._redact([_row_json(row) for row in tuning_record], "tuning_record"),
            finished_utc=_utc_stamp()[1],
        )
        self._save()

    def record_report_error(self, error: str) -> None:
        """Rendering failed as the run finished; the measurements are safe on disk and the manifest says why there is
        no report. (The report itself is not hashed: it is derived, and `llmplay report` rewrites it.)"""
        self._manifest["report_error"] = error
        self._save()
