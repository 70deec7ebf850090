"""One run's entry in the archive index, built from its manifest (and its archived playbook for the goals)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmplay.archive.layout import MANIFEST, PLAYBOOK_FILE, RESOLVED_FILE, SCHEMA_ID
from llmplay.archive.paths import MAX_TEXT_BYTES, OutsideError, inside
from llmplay.catalog import CAPACITY_METRICS
from llmplay.errors import ArchiveError, LlmplayError

# Besides the goals' metrics, what every run's headline keeps per trial: cost, and the counts an error rate's
# interval in points needs.
HEADLINE_EXTRA = ("cost.usd_per_1m_tokens", "errors.count", "requests.total", *CAPACITY_METRICS)
# Measurement length, not configuration: runs of one configuration with a shorter --duration stay comparable.
_NOT_CONFIGURATION = ("duration_s", "warmup_s", "warmup_requests", "num_requests")
# What an upgrade re-test changes, and how long llmplay waits for the engine: neither is what the engine runs with.
_NOT_ENGINE_CONFIGURATION = ("image", "health_path", "health_timeout_s")
RUN, RETEST, CAPACITY = "run", "retest", "capacity"


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
    config: Mapping[str, Any]
    goals: Goals | None
    gates: tuple[GateState, ...]
    verified: bool
    problems: tuple[str, ...]
    figures: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # metric -> one value per trial
    manifest_mtime_ns: int = 0
    manifest_size: int = 0

    @property
    def usable(self) -> bool:
        """Whether the run may be a reference or a point of a trend: it verifies and finished."""
        return self.verified and self.status == "complete"


def _goals_of(run_dir: Path, manifest: Mapping[str, Any], cache: dict[str, Goals | None]) -> Goals | None:
    """The goals of the playbook archived with the run (resolved copy first, as `compare` reads it); None when it
    does not load. Cached by the file's recorded sha256: a rebuild loads each distinct playbook once."""
    from llmplay.playbook.load import load_playbook  # deferred: reading the index needs no playbook loader

    files = _mapping(manifest, "files")
    playbook = _mapping(manifest, "playbook")
    for relpath in (RESOLVED_FILE, playbook.get("file") or PLAYBOOK_FILE):
        digest = files.get(relpath) if isinstance(files, Mapping) else None
        if not isinstance(digest, str):
            continue
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


def _mapping(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = d.get(key)
    return value if isinstance(value, Mapping) else {}


def _without(d: Any, keys: Sequence[str]) -> Any:
    return {k: v for k, v in d.items() if k not in keys} if isinstance(d, Mapping) else {}


def _final_config(manifest: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The final configuration's id and what makes it that configuration: the engine without its image (an upgrade
    re-tests the same configuration) and the workload without its measurement length."""
    final = str(manifest.get("final_config_id") or "baseline")
    configs = [c for c in manifest.get("configs") or [] if isinstance(c, Mapping)]
    chosen = next((c for c in configs if c.get("config_id") == final), configs[0] if configs else {})
    return final, {
        "engine": _without(chosen.get("engine"), _NOT_ENGINE_CONFIGURATION),
        "workload": _without(chosen.get("workload"), _NOT_CONFIGURATION),
    }


def _final_trials(manifest: Mapping[str, Any], final: str) -> list[Mapping[str, Any]]:
    """The trials `compare` takes of the final configuration: successful ones that were not superseded."""
    return [
        t
        for t in manifest.get("trials") or []
        if isinstance(t, Mapping)
        and t.get("config_id") == final
        and t.get("status") == "ok"
        and t.get("superseded") is None
    ]


def _kind(manifest: Mapping[str, Any], goals: Goals | None) -> str:
    overrides = _mapping(manifest, "overrides")
    if overrides.get("capacity"):
        return CAPACITY
    if overrides.get("image"):
        return RETEST
    # `retest` without --image runs the final configuration alone: no verdicts although the playbook has steps
    if goals is not None and goals.steps and not manifest.get("verdicts") and not overrides.get("only"):
        return RETEST
    return RUN


def entry_from_manifest(
    root: Path,
    run_dir: Path,
    data: bytes,
    stat: os.stat_result,
    goals_cache: dict[str, Goals | None] | None = None,
) -> RunEntry:
    """The index entry of one run from its manifest's bytes (read once by the caller); ArchiveError when they are
    not an llmplay manifest at all."""
    # Indexing needs pandas (via the reader) and jsonschema; reading the index (history) needs neither.
    from llmplay.archive.convert import config_from, environment_from, trial_from  # deferred: see above
    from llmplay.archive.reader import engine_facts  # deferred: see above
    from llmplay.archive.verify import check_read  # deferred: see above

    verification = check_read(run_dir, data)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArchiveError(f"{run_dir / MANIFEST}: not readable JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA_ID or "run_id" not in manifest:
        raise ArchiveError(f"{run_dir / MANIFEST}: not an llmplay manifest ({SCHEMA_ID})")
    env = _mapping(manifest, "environment")
    playbook = _mapping(manifest, "playbook")
    goals = _goals_of(run_dir, manifest, {} if goals_cache is None else goals_cache)
    final, config = _final_config(manifest)
    trials = _final_trials(manifest, final)
    describe: Mapping[str, Any] = next(
        (t["engine_describe"] for t in reversed(trials) if isinstance(t.get("engine_describe"), Mapping)), {}
    )
    wanted = [*(goals.headline() if goals else ()), *HEADLINE_EXTRA]
    figures: dict[str, tuple[float, ...]] = {}
    for metric in dict.fromkeys(wanted):
        values = [t.get("summary", {}).get(metric) for t in trials if isinstance(t.get("summary"), Mapping)]
        # a figure some trial lacks has no trial-level interval (as in compare): kept only when every trial has it
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            figures[metric] = tuple(float(v) for v in values)
    gates = tuple(
        GateState(str(g.get("gate", "")), str(g.get("metric", "")), g.get("met"))
        for g in manifest.get("gates") or []
        if isinstance(g, Mapping)
    )
    return RunEntry(
        run_id=str(manifest["run_id"]),
        path=run_dir.relative_to(root).as_posix(),
        playbook=str(playbook.get("name") or run_dir.parent.name),
        playbook_version=str(playbook.get("version") or ""),
        playbook_sha256=str(playbook.get("sha256") or ""),
        kind=_kind(manifest, goals),
        status=str(manifest.get("status") or "?"),
        started_utc=str(env.get("started_utc") or ""),
        engine=engine_facts(
            [trial_from(x) for x in manifest.get("trials", [])],
            [config_from(c) for c in manifest.get("configs", [])],
            manifest.get("final_config_id"),
        ).label,
        engine_version=str(describe.get("version") or describe.get("engine_version") or ""),
        image_digest=str(describe.get("image_digest") or describe.get("image_id") or ""),
        llmplay_version=str(env.get("llmplay_version") or ""),
        host=str(env.get("host") or ""),
        hardware=environment_from(env).gpu_label,
        config_id=final,
        config_fingerprint=hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12],
        config=config,
        goals=goals,
        gates=gates,
        verified=verification.ok,
        problems=verification.problems,
        figures=figures,
        manifest_mtime_ns=stat.st_mtime_ns,
        manifest_size=stat.st_size,
    )
