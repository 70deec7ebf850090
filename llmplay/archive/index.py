"""The archive's index: one SQLite file under the archive root with a row per run and its trial-level headline figures.

It is derived data, never the only copy of anything: every row comes from a run's manifest (and its archived
playbook for the goals), so `llmplay index --rebuild` can remake it at any time, reading each manifest once. It is
kept in step with the manifests by the writer (a finished run is recorded in one transaction) and checked against
them whenever it is read (`sync`): a manifest that is new, changed or gone since it was indexed is indexed again,
and an index that cannot be read is rebuilt, each with a warning. What a run was verified as is recorded when it is
indexed (every file hashed then); `sync` re-verifies any run whose manifest changed since.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmplay.archive.layout import MANIFEST, safe_name
from llmplay.archive.paths import MAX_MANIFEST_BYTES, read_bytes_inside
from llmplay.archive.run_entry import (
    GateState,
    Goals,
    RunEntry,
    entry_from_manifest,
)
from llmplay.errors import ArchiveError

INDEX_FILE = "index.sqlite"
REFERENCE_FILE = "reference.json"  # <root>/<playbook dir>/reference.json: the run `history --accept` named
# Bump when the tables change, or what an entry holds: an index of another version is rebuilt, not migrated (4: a
# configuration archived before a setting existed reads with its value then, so its fingerprint changed).
INDEX_VERSION = "4"

_TABLES = """
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
  manifest_mtime_ns INTEGER NOT NULL,
  manifest_size INTEGER NOT NULL
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
  manifest_mtime_ns INTEGER NOT NULL,
  manifest_size INTEGER NOT NULL
);
"""
_RUN_COLUMNS = (
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
    "manifest_mtime_ns",
    "manifest_size",
)

Warn = Callable[[str], None]


def warn_stderr(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")


# ---------------------------------------------------------------------------------------------- the index file
def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)  # transactions are explicit (BEGIN IMMEDIATE)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One atomic change: a reader sees the index before it or after it, never half of it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _insert(conn: sqlite3.Connection, entry: RunEntry) -> None:
    values = {
        **{c: getattr(entry, c) for c in _RUN_COLUMNS if hasattr(entry, c)},
        "config_json": json.dumps(entry.config, sort_keys=True),
        "goals_json": entry.goals.to_json() if entry.goals else None,
        "gates_json": json.dumps([vars(g) for g in entry.gates]),
        "verified": int(entry.verified),
        "problems": "\n".join(entry.problems),
    }
    conn.execute("DELETE FROM runs WHERE run_id = ? OR path = ?", (entry.run_id, entry.path))
    conn.execute(
        f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) VALUES ({', '.join('?' for _ in _RUN_COLUMNS)})",
        [values[c] for c in _RUN_COLUMNS],
    )
    conn.executemany(
        "INSERT INTO figures (run_id, metric, trial_values) VALUES (?, ?, ?)",
        [(entry.run_id, m, ",".join(map(repr, values_))) for m, values_ in entry.figures.items()],
    )


class _JsonCache:
    """Runs of one playbook repeat the same goals, configuration and gates texts: each is parsed once per read."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str | None], Any] = {}

    def get(self, kind: str, text: str | None) -> Any:
        key = (kind, text)
        if key not in self._seen:
            if kind == "goals":
                self._seen[key] = Goals.from_json(text)
            elif kind == "gates":
                self._seen[key] = tuple(GateState(**g) for g in json.loads(text or "[]"))
            else:
                self._seen[key] = json.loads(text or "{}")
        return self._seen[key]


def _entry_from_row(row: sqlite3.Row, figures: Mapping[str, tuple[float, ...]], parsed: _JsonCache) -> RunEntry:
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
        config=parsed.get("config", row["config_json"]),
        goals=parsed.get("goals", row["goals_json"]),
        gates=parsed.get("gates", row["gates_json"]),
        verified=bool(row["verified"]),
        problems=tuple(p for p in row["problems"].split("\n") if p),
        figures=figures,
        manifest_mtime_ns=row["manifest_mtime_ns"],
        manifest_size=row["manifest_size"],
    )


def _manifests(root: Path) -> dict[str, tuple[Path, int, int]]:
    """Every run directory with a manifest under root, by its path relative to root, with the manifest's mtime
    (ns) and size: one stat per run."""
    out: dict[str, tuple[Path, int, int]] = {}
    try:
        playbook_dirs = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return out
    for pdir in playbook_dirs:
        try:
            runs = [e for e in os.scandir(pdir.path) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for run in runs:
            try:
                st = os.stat(os.path.join(run.path, MANIFEST))
            except OSError:
                continue
            out[f"{pdir.name}/{run.name}"] = (Path(run.path), st.st_mtime_ns, st.st_size)
    return out


@dataclass(frozen=True)
class Unindexable:
    """A run directory whose manifest could not be indexed at all, and why (listed, never used)."""

    path: str
    why: str
    manifest_mtime_ns: int = 0
    manifest_size: int = 0


class ArchiveIndex:
    """The index of one archive root. Every read first checks it against the manifests (`sync`)."""

    def __init__(self, root: Path, warn: Warn = warn_stderr):
        self.root = Path(root)
        self.path = self.root / INDEX_FILE
        self._warn = warn

    # -------------------------------------------------------------------- building
    def _read_entry(self, rel: str, run_dir: Path, cache: dict[str, Goals | None]) -> RunEntry | Unindexable:
        try:
            stat = os.stat(run_dir / MANIFEST)
        except OSError as exc:
            return Unindexable(rel, str(exc), 0, 0)
        try:
            data = read_bytes_inside(run_dir, MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
            return entry_from_manifest(self.root, run_dir, data, stat, cache)
        except (OSError, ArchiveError) as exc:
            return Unindexable(rel, str(exc), stat.st_mtime_ns, stat.st_size)
        except (TypeError, KeyError, AttributeError, ValueError) as exc:  # a field of the wrong type: damaged
            why = f"damaged manifest ({type(exc).__name__}: {exc})"
            return Unindexable(rel, why, stat.st_mtime_ns, stat.st_size)

    @staticmethod
    def _store(conn: sqlite3.Connection, rel: str, found: RunEntry | Unindexable) -> None:
        conn.execute("DELETE FROM runs WHERE path = ?", (rel,))
        conn.execute("DELETE FROM unreadable WHERE path = ?", (rel,))
        if isinstance(found, RunEntry):
            _insert(conn, found)
        else:
            conn.execute(
                "INSERT INTO unreadable VALUES (?, ?, ?, ?)",
                (found.path, found.why, found.manifest_mtime_ns, found.manifest_size),
            )

    def rebuild(self) -> int:
        """Remake the index from the manifests (each read once) in a new file swapped in whole; the runs indexed."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix="-" + INDEX_FILE, dir=self.root)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            with closing(_connect(tmp)) as conn:
                count = self._fill(conn)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return count

    def _fill(self, conn: sqlite3.Connection) -> int:
        cache: dict[str, Goals | None] = {}
        count = 0
        conn.executescript(_TABLES)
        with _transaction(conn):
            conn.execute("INSERT INTO meta VALUES ('version', ?)", (INDEX_VERSION,))
            conn.execute("INSERT INTO meta VALUES ('built_utc', ?)", (_now(),))
            for rel, (run_dir, _, _) in sorted(_manifests(self.root).items()):
                found = self._read_entry(rel, run_dir, cache)
                self._store(conn, rel, found)
                count += isinstance(found, RunEntry)
        return count

    def _in_memory(self, why: OSError | sqlite3.DatabaseError) -> sqlite3.Connection:
        """An archive this user may read but not write (a shared, read-only copy): the index lives for this command
        only, built from the manifests in memory."""
        self._warn(f"{self.path}: cannot be written ({why}); indexing the manifests in memory for this command")
        conn = _connect(Path(":memory:"))
        conn.row_factory = sqlite3.Row
        self._fill(conn)
        return conn

    def _usable_connection(self) -> sqlite3.Connection | None:
        """A connection to an index of this version, or None (absent, unreadable, another version)."""
        if not self.path.is_file():
            return None
        try:
            conn = _connect(self.path)
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
            if row is None or row[0] != INDEX_VERSION:
                conn.close()
                return None
            conn.execute("SELECT 1 FROM runs LIMIT 1").fetchall()
            return conn
        except sqlite3.DatabaseError:
            return None

    def connection(self) -> sqlite3.Connection:
        """An index in step with the manifests: rebuilt (with a warning) when absent or unreadable, else synced."""
        conn = self._usable_connection()
        if conn is None:
            if self.path.exists():
                self._warn(f"{self.path}: unreadable or of another llmplay version; rebuilt from the manifests")
            elif _manifests(self.root):
                self._warn(f"{self.path}: no index yet; built from the manifests")
            try:
                self.rebuild()
            except OSError as exc:
                return self._in_memory(exc)
            conn = self._usable_connection()
            if conn is None:
                raise ArchiveError(f"{self.path}: cannot open the index just rebuilt")
            return conn
        try:
            self._sync(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if "readonly" not in str(exc):
                raise
            return self._in_memory(exc)
        except sqlite3.DatabaseError as exc:
            conn.close()
            self._warn(f"{self.path}: damaged ({exc}); rebuilt from the manifests")
            self.rebuild()
            conn = self._usable_connection()
            if conn is None:
                raise ArchiveError(f"{self.path}: cannot open the index just rebuilt") from None
        return conn

    def _sync(self, conn: sqlite3.Connection) -> None:
        """Index again every run whose manifest is new, changed or gone since it was indexed; warn about the
        disagreement unless it is only a run still being written (its manifest changes after every trial)."""
        on_disk = _manifests(self.root)
        indexed = {
            row[0]: (row[1], row[2], row[3])
            for row in conn.execute(
                "SELECT path, manifest_mtime_ns, manifest_size, status FROM runs UNION ALL "
                "SELECT path, manifest_mtime_ns, manifest_size, 'unreadable' FROM unreadable"
            )
        }
        gone = [rel for rel in indexed if rel not in on_disk]
        changed = [
            (rel, run_dir)
            for rel, (run_dir, mtime_ns, size) in on_disk.items()
            if rel not in indexed or (mtime_ns, size) != indexed[rel][:2]
        ]
        if not gone and not changed:
            return
        cache: dict[str, Goals | None] = {}
        entries = [(rel, self._read_entry(rel, run_dir, cache)) for rel, run_dir in changed]
        with _transaction(conn):
            for rel in gone:
                conn.execute("DELETE FROM runs WHERE path = ?", (rel,))
                conn.execute("DELETE FROM unreadable WHERE path = ?", (rel,))
            for rel, found in entries:
                self._store(conn, rel, found)
        quiet = {rel for rel, e in entries if isinstance(e, RunEntry) and e.status == "running"}
        quiet |= {rel for rel, _ in changed if rel in indexed and indexed[rel][2] == "running"}
        new = [rel for rel, _ in changed if rel not in indexed and rel not in quiet]
        edited = [rel for rel, _ in changed if rel in indexed and rel not in quiet]
        parts = [
            f"{len(x)} {what} ({x[0]}{', ...' if len(x) > 1 else ''})"
            for x, what in (
                (new, "not indexed"),
                (edited, "changed since indexed"),
                (gone, "gone"),
            )
            if x
        ]
        if parts:
            self._warn(f"{self.path} disagreed with the manifests: " + "; ".join(parts) + "; re-indexed them")

    def record(self, run_dir: Path) -> None:
        """Index one run (the writer, as a run finishes): one transaction; a missing or unreadable index is rebuilt."""
        conn = self._usable_connection()
        if conn is None:
            self.rebuild()
            return
        with closing(conn):
            rel = Path(run_dir).resolve().relative_to(self.root.resolve()).as_posix()
            found = self._read_entry(rel, Path(run_dir), {})
            with _transaction(conn):
                self._store(conn, rel, found)

    # -------------------------------------------------------------------- reading
    def runs(self, playbook: str | None = None) -> list[RunEntry]:
        """Every indexed run (of one playbook), oldest first, with its figures: two queries, whatever the size."""
        with closing(self.connection()) as conn:
            conn.row_factory = sqlite3.Row
            where, args = ("WHERE playbook = ?", (playbook,)) if playbook is not None else ("", ())
            rows = conn.execute(f"SELECT * FROM runs {where} ORDER BY started_utc, run_id", args).fetchall()
            figures: dict[str, dict[str, tuple[float, ...]]] = {}
            query = (
                "SELECT f.run_id, f.metric, f.trial_values FROM figures f JOIN runs r ON r.run_id = f.run_id "
                f"{where.replace('playbook', 'r.playbook')}"
            )
            for run_id, metric, text in conn.execute(query, args):
                figures.setdefault(run_id, {})[metric] = tuple(map(float, text.split(",")))
        parsed = _JsonCache()
        return [_entry_from_row(row, figures.get(row["run_id"], {}), parsed) for row in rows]

    def unreadable(self) -> list[Unindexable]:
        """Run directories whose manifest could not be indexed, and why."""
        with closing(self.connection()) as conn:
            return [Unindexable(*row) for row in conn.execute("SELECT * FROM unreadable ORDER BY path")]

    def playbooks(self) -> list[str]:
        with closing(self.connection()) as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT playbook FROM runs ORDER BY playbook")]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def index_finished_run(run_dir: Path, warn: Warn = warn_stderr) -> None:
    """The writer's hook as a run is finalised: record it in its archive root's index. The index is never the only
    copy, so a failure here costs nothing but a warning (the next read re-indexes from the manifest)."""
    run_dir = Path(run_dir)
    try:
        ArchiveIndex(run_dir.parent.parent, warn).record(run_dir)
    except Exception as exc:  # any failure: the run is archived; the index is rebuilt from it on the next read
        warn(f"the archive index was not updated for {run_dir} ({type(exc).__name__}: {exc}); the next read re-indexes")


# ---------------------------------------------------------------------------------------------- references
def reference_path(root: Path, playbook: str) -> Path:
    return Path(root) / safe_name(playbook) / REFERENCE_FILE


def read_reference(root: Path, playbook: str) -> str | None:
    """The run id accepted as the playbook's reference (`history --accept`), or None."""
    path = reference_path(root, playbook)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ArchiveError(
            f"{path}: not readable ({exc}); accept a reference again with llmplay history --accept"
        ) from None
    run_id = data.get("run_id") if isinstance(data, Mapping) else None
    if not isinstance(run_id, str):
        raise ArchiveError(f"{path}: no run_id; accept a reference again with llmplay history --accept")
    return run_id


def write_reference(root: Path, entry: RunEntry, *, note: str = "") -> Path:
    """Accept a run as its playbook's reference: a small file beside the runs (the index only reads it)."""
    path = reference_path(root, entry.playbook)
    document = {"run_id": entry.run_id, "path": entry.path, "accepted_utc": _now(), "note": note}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix="-" + REFERENCE_FILE, dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(document, indent=1) + "\n")
    os.chmod(tmp_name, 0o644)
    os.replace(tmp_name, path)
    return path


def find_run(entries: Iterable[RunEntry], key: str) -> RunEntry | None:
    """A run by its id, its directory name or its path (as printed by ls/history)."""
    wanted = Path(key.rstrip("/")).name
    for entry in entries:
        if key in (entry.run_id, entry.path) or wanted in (entry.run_id, Path(entry.path).name):
            return entry
    return None
