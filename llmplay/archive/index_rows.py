"""The index's tables and one run's row in them: written from a RunEntry, read back into one, and the row's own digest.

A row is a cache of what its manifest says. Its digest (`row_digest`, sha256 over every stored value and figure)
catches a row edited in place (`UPDATE runs SET verified = 1`) the way `manifest_sha256` catches a careless edit of
a manifest: the index re-indexes such a row from its manifest. A row that still fails to parse is skipped, never
an error for the whole archive.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar, cast

from llmplay.archive.run_entry import ABSURD, GateState, Goals, RunEntry

# Bump when the tables change, or what an entry holds: an index of another version is rebuilt, not migrated (5: rows
# carry the manifest's content digest, the files' fingerprint, the key they were verified with and their own digest).
INDEX_VERSION = "5"

TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,
  path TEXT NOT NULL UNIQUE,          -- relative to the archive root: <playbook dir>/<run id>
  playbook TEXT NOT NULL,
  playbook_version TEXT NOT NULL,
  playbook_sha256 TEXT NOT NULL,
  kind TEXT NOT NULL,                 -- run | retest | capacity
  status TEXT NOT NULL,
  started_utc TEXT NOT NULL,
  engine TEXT NOT NULL,               -- image and version as people name it
  engine_version TEXT NOT NULL,
  image_digest TEXT NOT NULL,
  llmplay_version TEXT NOT NULL,
  host TEXT NOT NULL,
  hardware TEXT NOT NULL,             -- the GPU class ("CPU only", "8x NVIDIA H100 80GB HBM3")
  config_id TEXT NOT NULL,
  config_fingerprint TEXT NOT NULL,   -- the final configuration without its image and measurement length
  config_json TEXT NOT NULL,
  goals_json TEXT,                    -- objective, guards, confidence of the run's playbook; NULL: not loadable
  gates_json TEXT NOT NULL,
  verified INTEGER NOT NULL,
  problems TEXT NOT NULL,             -- what verification found, one line each
  manifest_digest TEXT NOT NULL,      -- sha256 of the manifest's bytes the row was built from
  signature_digest TEXT NOT NULL,     -- sha256 of manifest.sig's bytes then; '' when unsigned
  files_json TEXT NOT NULL,           -- the files the manifest lists
  files_digest TEXT NOT NULL,         -- their inode, size, mtime and ctime then (run_entry.files_fingerprint)
  verified_with TEXT NOT NULL,        -- the public key's fingerprint verification used; '' for integrity only
  row_digest TEXT NOT NULL            -- sha256 of everything above and the run's figures
);
CREATE INDEX runs_by_playbook ON runs (playbook, started_utc, run_id);
CREATE TABLE figures (
  run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
  metric TEXT NOT NULL,
  trial_values TEXT NOT NULL,         -- one value per successful final-configuration trial, comma-separated repr
  PRIMARY KEY (run_id, metric)
);
CREATE TABLE unreadable (             -- run directories whose manifest could not be indexed, and why
  path TEXT PRIMARY KEY,
  why TEXT NOT NULL,
  manifest_digest TEXT NOT NULL
);
"""
RUN_COLUMNS = (
    "run_id",
    "path",
    "playbook",
    "playbook_version",
    "playbook_sha256",
    "kind",
    "status",
    "started_utc",
    "engine",
    "engine_version",
    "image_digest",
    "llmplay_version",
    "host",
    "hardware",
    "config_id",
    "config_fingerprint",
    "config_json",
    "goals_json",
    "gates_json",
    "verified",
    "problems",
    "manifest_digest",
    "signature_digest",
    "files_json",
    "files_digest",
    "verified_with",
    "row_digest",
)


class DamagedRow(ValueError):
    """A row that does not parse back into an entry (edited, or written by a bug)."""


def row_digest(values: Mapping[str, object] | sqlite3.Row, figures: Sequence[tuple[str, str]]) -> str:
    """sha256 of a row's stored values (all but row_digest) and its figures as stored, in a fixed order."""
    body = [f"{c}={values[c]!r}" for c in RUN_COLUMNS if c != "row_digest"]
    body += [f"{m}={t!r}" for m, t in sorted(figures)]
    return hashlib.sha256("\x1e".join(body).encode()).hexdigest()


def insert(conn: sqlite3.Connection, entry: RunEntry) -> None:
    values: dict[str, object] = {
        **{c: getattr(entry, c) for c in RUN_COLUMNS if hasattr(entry, c)},
        "config_json": json.dumps(entry.config, sort_keys=True),
        "goals_json": entry.goals.to_json() if entry.goals else None,
        "gates_json": json.dumps([vars(g) for g in entry.gates]),
        "verified": int(entry.verified),
        "problems": "\n".join(entry.problems),
        "files_json": json.dumps(list(entry.files)),
    }
    figures = [(m, ",".join(map(repr, values_))) for m, values_ in entry.figures.items()]
    values["row_digest"] = row_digest(values, figures)
    conn.execute("DELETE FROM runs WHERE run_id = ? OR path = ?", (entry.run_id, entry.path))
    conn.execute(
        f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' for _ in RUN_COLUMNS)})",
        [values[c] for c in RUN_COLUMNS],
    )
    conn.executemany(
        "INSERT INTO figures (run_id, metric, trial_values) VALUES (?, ?, ?)",
        [(entry.run_id, m, text) for m, text in figures],
    )


def trial_values(text: object) -> tuple[float, ...] | None:
    """A stored figure's values; None when one is not finite or absurd (shown as not measured); DamagedRow when
    they are not numbers at all."""
    if not isinstance(text, str):
        raise DamagedRow(f"trial_values {text!r} is not text")
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise DamagedRow(f"trial_values {text[:40]!r} are not numbers") from None
    # a comparison is false for NaN, and infinities lie beyond the bound
    return values if all(-ABSURD <= v <= ABSURD for v in values) else None


T = TypeVar("T")


class JsonCache:
    """Runs of one playbook repeat the same goals, configuration and gates texts: each is parsed once per read."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str | None], object] = {}

    def _parsed(self, kind: str, text: str | None, parse: Callable[[str | None], T]) -> T:
        key = (kind, text)
        if key not in self._seen:
            try:
                self._seen[key] = parse(text)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
                raise DamagedRow(f"{kind} not readable ({type(exc).__name__}: {exc})") from None
        return cast(T, self._seen[key])  # stored above by this same `parse`, under this kind

    def goals(self, text: str | None) -> Goals | None:
        return self._parsed("goals", text, Goals.from_json)

    def gates(self, text: str | None) -> tuple[GateState, ...]:
        return self._parsed("gates", text, lambda t: tuple(GateState(**g) for g in json.loads(t or "[]")))

    def files(self, text: str | None) -> tuple[str, ...]:
        return self._parsed("files", text, lambda t: tuple(str(f) for f in json.loads(t or "[]")))

    def config(self, text: str | None) -> dict[str, object]:
        return self._parsed("config", text, _config_object)


def _config_object(text: str | None) -> dict[str, object]:
    config = json.loads(text or "{}")
    if not isinstance(config, dict):
        raise TypeError(f"a {type(config).__name__}, expected an object")
    return config


def entry_from_row(row: sqlite3.Row, figures: Mapping[str, tuple[float, ...]], parsed: JsonCache) -> RunEntry:
    """The entry a row holds; DamagedRow when it does not parse."""
    try:
        problems = row["problems"]
        return RunEntry(
            run_id=row["run_id"],
            path=row["path"],
            playbook=row["playbook"],
            playbook_version=row["playbook_version"],
            playbook_sha256=row["playbook_sha256"],
            kind=row["kind"],
            status=row["status"],
            started_utc=row["started_utc"],
            engine=row["engine"],
            engine_version=row["engine_version"],
            image_digest=row["image_digest"],
            llmplay_version=row["llmplay_version"],
            host=row["host"],
            hardware=row["hardware"],
            config_id=row["config_id"],
            config_fingerprint=row["config_fingerprint"],
            config=parsed.config(row["config_json"]),
            goals=parsed.goals(row["goals_json"]),
            gates=parsed.gates(row["gates_json"]),
            verified=row["verified"] == 1,
            problems=tuple(p for p in problems.split("\n") if p),
            figures=figures,
            manifest_digest=row["manifest_digest"],
            signature_digest=row["signature_digest"],
            files=parsed.files(row["files_json"]),
            files_digest=row["files_digest"],
            verified_with=row["verified_with"],
        )
    except (TypeError, AttributeError) as exc:
        raise DamagedRow(f"{type(exc).__name__}: {exc}") from None
