"""One run's entry in the archive index, built from its manifest (and its archived playbook for the goals)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmplay.archive.layout import RESOLVED_FILE
from llmplay.archive.paths import MAX_TEXT_BYTES, OutsideError, inside
from llmplay.catalog import CAPACITY_METRICS
from llmplay.errors import LlmplayError

if TYPE_CHECKING:  # an index entry is built from these; reading the index (history) needs none of them
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from llmplay.archive.model import ConfigRecord, RunInfo, TrialRecord
    from llmplay.spec import EngineSpec, Workload

# Besides the goals' metrics, what every run's headline keeps per trial: cost, and the counts an error rate's
# interval in points needs.
HEADLINE_EXTRA = ("cost.usd_per_1m_tokens", "errors.count", "requests.total", *CAPACITY_METRICS)
# Measurement length, not configuration: runs of one configuration with a shorter --duration stay comparable.
_NOT_CONFIGURATION = ("duration_s", "warmup_s", "warmup_requests", "num_requests")
# What an upgrade re-test changes, and how long llmplay waits for the engine: neither is what the engine runs with.
_NOT_ENGINE_CONFIGURATION = ("image", "health_path", "health_timeout_s")
RUN, RETEST, CAPACITY = "run", "retest", "capacity"
# No figure llmplay measures (seconds, tokens/s, USD per 1M tokens, bytes, request counts) comes near this: a value
# beyond it was edited in, and summing a few near 1e308 overflows. Such a figure is "not measured" for its run.
ABSURD = 1e15


def plausible(value: object) -> bool:
    """Whether a figure may be shown and computed with: a finite number (not a bool) no larger than ABSURD."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= ABSURD
    )


@dataclass(frozen=True)
class GuardGoal:
    metric: str
    tolerance: float
    lower_is_better: bool
    absolute: bool  # a rate's tolerance in points


@dataclass(frozen=True)
class Goals:
    """What a run's playbook says about regressions: the objective's min_effect and every guard's tolerance."""

    objective: GuardGoal | None
    guards: tuple[GuardGoal, ...]
    confidence: float
    gate_metrics: tuple[str, ...]
    steps: int  # how many steps the playbook has: a run of its final configuration alone is a re-test

    def headline(self) -> tuple[str, ...]:
        """The metrics a run of this playbook is judged on, objective first."""
        goals = [g.metric for g in ((self.objective,) if self.objective else ()) + self.guards]
        return tuple(dict.fromkeys([*goals, *self.gate_metrics]))

    def to_json(self) -> str:
        return json.dumps(
            {
                "objective": None if self.objective is None else vars(self.objective),
                "guards": [vars(g) for g in self.guards],
                "confidence": self.confidence,
                "gate_metrics": list(self.gate_metrics),
                "steps": self.steps,
            }
        )

    @classmethod
    def from_json(cls, text: str | None) -> Goals | None:
        if not text:
            return None
        d = json.loads(text)
        return cls(
            GuardGoal(**d["objective"]) if d.get("objective") else None,
            tuple(GuardGoal(**g) for g in d.get("guards", [])),
            float(d.get("confidence", 0.95)),
            tuple(d.get("gate_metrics", [])),
            int(d.get("steps", 0)),
        )


@dataclass(frozen=True)
class GateState:
    gate: str
    metric: str
    met: bool | None


@dataclass(frozen=True)
class RunEntry:
    """One indexed run: where it is, what ran, on what, and its final configuration's figures trial by trial."""

    run_id: str
    path: str  # relative to the archive root
    playbook: str
    playbook_version: str
    playbook_sha256: str
    kind: str
    status: str
    started_utc: str
    engine: str
    engine_version: str
    image_digest: str
    llmplay_version: str
    host: str
    hardware: str
    config_id: str
    config_fingerprint: str
    config: Mapping[str, object]
    goals: Goals | None
    gates: tuple[GateState, ...]
    verified: bool
    problems: tuple[str, ...]
    figures: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # metric -> one value per trial
    # What the entry was built from, so the index can tell when it no longer agrees with the run (archive.index):
    manifest_digest: str = ""  # sha256 of the manifest's bytes
    signature_digest: str = ""  # sha256 of manifest.sig's bytes; "" when unsigned
    files: tuple[str, ...] = ()  # the files the manifest lists
    files_digest: str = ""  # files_fingerprint of them when indexed
    verified_with: str = ""  # the public key's fingerprint verification used; "" for integrity only

    @property
    def usable(self) -> bool:
        """Whether the run may be a reference or a point of a trend: it verifies and finished."""
        return self.verified and self.status == "complete"


def _goals_of(run_dir: Path, info: RunInfo, cache: dict[str, Goals | None]) -> Goals | None:
    """The goals of the playbook archived with the run (resolved copy first, as `compare` reads it); None when it
    does not load. Cached by the file's recorded sha256: a rebuild loads each distinct playbook once."""
    from llmplay.playbook.load import load_playbook  # deferred: reading the index needs no playbook loader

    for relpath in (RESOLVED_FILE, info.playbook.file):
        if relpath not in info.file_sha256:
            continue
        digest = info.file_sha256[relpath]
        if digest in cache:
            return cache[digest]
        try:
            loaded = load_playbook(inside(run_dir, relpath, max_bytes=MAX_TEXT_BYTES), archived=True)
        except (OutsideError, LlmplayError, OSError):
            continue
        goals = loaded.goals

        def guard(metric: str, tolerance: float, direction: str, absolute: bool = False) -> GuardGoal:
            return GuardGoal(metric, float(tolerance), direction == "minimize", absolute)

        objective = goals.objective
        cache[digest] = Goals(
            guard(objective.metric, objective.min_effect, objective.direction) if objective else None,
            tuple(guard(g.metric, g.tolerance, g.direction, g.absolute) for g in goals.guards),
            float(loaded.trials.confidence),
            tuple(g.metric for g in goals.gates),
            len(loaded.steps),
        )
        return cache[digest]
    return None


def _without(record: EngineSpec | Workload, keys: Sequence[str]) -> dict[str, object]:
    from llmplay.archive.model import to_plain  # deferred: see the imports

    return {k: v for k, v in to_plain(record).items() if k not in keys}


def _configuration(configs: Sequence[ConfigRecord], final: str) -> dict[str, object]:
    """What makes the final configuration that configuration: the engine without its image (an upgrade re-tests the
    same configuration) and the workload without its measurement length. Built from the typed records, so a run
    archived before a setting existed reads with the value it then had (archive.convert), not without the setting:
    an llmplay upgrade that adds one does not change every earlier run's configuration."""
    chosen = next((c for c in configs if c.config_id == final), configs[0] if configs else None)
    if chosen is None:
        return {"engine": {}, "workload": {}}
    return {
        "engine": _without(chosen.engine, _NOT_ENGINE_CONFIGURATION),
        "workload": _without(chosen.workload, _NOT_CONFIGURATION),
    }


def _kind(info: RunInfo, decided: bool, goals: Goals | None) -> str:
    if info.capacity_override:
        return CAPACITY
    if info.image_override:
        return RETEST
    # `retest` without --image runs the final configuration alone: no verdicts although the playbook has steps
    if goals is not None and goals.steps and not decided and not info.only_override:
        return RETEST
    return RUN


def _figures(trials: Sequence[TrialRecord], metrics: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Each metric's value trial by trial, over the trials that archived a summary."""
    summaries = [t.summary for t in trials if t.summary]
    figures: dict[str, tuple[float, ...]] = {}
    for metric in dict.fromkeys(metrics):
        values = [summary.get(metric) for summary in summaries]
        # a figure some trial lacks has no trial-level interval (as in compare): kept only when every trial has it;
        # a non-finite or absurd value makes it "not measured" for this run, never an overflow for every run
        if values and all(plausible(v) for v in values):
            figures[metric] = tuple(float(v) for v in values if v is not None)
    return figures


def files_fingerprint(run_dir: Path, relpaths: Sequence[str]) -> str:
    """The listed files as they lie now: inode, size, mtime and ctime of each (ctime cannot be set back by whoever
    rewrites a file), so a file replaced after indexing is noticed without hashing it. Paths that would leave the
    run directory are not looked at (verification already names them)."""
    digest = hashlib.sha256()
    base = os.fspath(run_dir)
    for relpath in relpaths:
        if relpath.startswith(("/", "\\")) or ".." in relpath.replace("\\", "/").split("/") or "\x00" in relpath:
            digest.update(f"{relpath}:refused\n".encode())
            continue
        try:
            st = os.lstat(os.path.join(base, relpath))
            digest.update(f"{relpath}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}\n".encode())
        except (OSError, ValueError):
            digest.update(f"{relpath}:absent\n".encode())
    return digest.hexdigest()


def entry_from_manifest(
    root: Path,
    run_dir: Path,
    data: bytes,
    goals_cache: dict[str, Goals | None] | None = None,
    *,
    public_key: Ed25519PublicKey | None = None,
    signature: bytes = b"",
) -> RunEntry:
    """The index entry of one run from its manifest's bytes (read once by the caller, with its signature's bytes),
    verified as `llmplay verify` does with `public_key`; ArchiveError when they are not an llmplay manifest at all."""
    # Indexing needs the reader's conversion and jsonschema; reading the index (history) needs neither.
    from llmplay.archive.reader import ArchivedRun, manifest_from  # deferred: see above
    from llmplay.archive.signing import fingerprint  # deferred: see above
    from llmplay.archive.verify import check_read  # deferred: see above

    verification = check_read(run_dir, data, public_key)
    run = ArchivedRun(run_dir, manifest_from(run_dir, data))
    info = run.info
    goals = _goals_of(run_dir, info, {} if goals_cache is None else goals_cache)
    final, trials = run.final_trials()
    config = _configuration(run.configs(), final)
    engine = run.engine_facts()
    return RunEntry(
        run_id=info.run_id,
        path=run_dir.relative_to(root).as_posix(),
        playbook=info.playbook.name or run_dir.parent.name,
        playbook_version=info.playbook.version,
        playbook_sha256=info.playbook.sha256,
        kind=_kind(info, bool(run.verdicts()), goals),
        status=info.status,
        started_utc=info.environment.started_utc,
        engine=engine.label,
        engine_version=engine.version or "",
        image_digest=engine.digest or "",
        llmplay_version=info.environment.llmplay_version or "",
        host=info.environment.host or "",
        hardware=info.environment.gpu_label,
        config_id=final,
        config_fingerprint=hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12],
        config=config,
        goals=goals,
        gates=tuple(GateState(g.gate or "", g.metric or "", g.met) for g in run.gates()),
        verified=verification.ok,
        problems=verification.problems,
        figures=_figures(trials, [*(goals.headline() if goals else ()), *HEADLINE_EXTRA]),
        manifest_digest=hashlib.sha256(data).hexdigest(),
        signature_digest=hashlib.sha256(signature).hexdigest() if signature else "",
        files=tuple(sorted(info.file_sha256)),
        files_digest=files_fingerprint(run_dir, sorted(info.file_sha256)),
        verified_with=fingerprint(public_key) if public_key is not None else "",
    )
