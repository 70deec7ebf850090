"""The archive's index: one SQLite file under the archive root with a row per run and its trial-level headline figures.

It is a cache, never an authority: every row comes from a run's manifest (and its archived playbook for the goals),
verified as `llmplay verify` verifies it (with the public key the command was given, when one was), so
`llmplay index --rebuild` can remake it at any time, reading each manifest once. It is kept in step with the
manifests by the writer (a finished run is recorded in one transaction) and checked against them whenever it is read
(`sync`): every manifest's bytes are hashed and compared with the digest its row was built from, the files it lists
are compared by inode, size, mtime and ctime, the row's own digest is checked, and with a public key every signature
is checked again over the manifest's bytes. A row that disagrees in any of these is indexed again from its manifest,
and an index that cannot be read is rebuilt, each with a warning; a row that still does not parse is skipped.

What this cannot do: the index lives in the archive root, so whoever can write there can also write a row and
recompute its digest, as they can an unsigned manifest's hash. Commands that act on a run (`history --accept` and
`--check`, `compare`, `retest`, `run --resume`, the site's compare pages) verify it again from the archive itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmplay.archive.atomic import atomic_write
from llmplay.archive.index_rows import (
    INDEX_VERSION,
    TABLES,
    DamagedRow,
    JsonCache,
    entry_from_row,
    insert,
    row_digest,
    trial_values,
)
from llmplay.archive.layout import LINKED, MANIFEST, SIGNATURE_FILE, run_directories
from llmplay.archive.paths import MAX_MANIFEST_BYTES, MISSING, OutsideError, read_bytes_inside
from llmplay.archive.run_entry import Goals, RunEntry, entry_from_manifest, files_fingerprint
from llmplay.errors import ArchiveError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

INDEX_FILE = "index.sqlite"
MAX_SIGNATURE_BYTES = 1 << 16

Warn = Callable[[str], None]


def warn_stderr(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")


# ---------------------------------------------------------------------------------------------- the index file
def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)  # transactions are explicit (BEGIN IMMEDIATE)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.row_factory = sqlite3.Row
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


@dataclass(frozen=True)
class Unindexable:
    """A run directory whose manifest could not be indexed at all, and why (listed, never used)."""

    path: str
    why: str
    manifest_digest: str = ""


@dataclass(frozen=True)
class _Seen:
    """One run directory as it lies now: its manifest's bytes (or why they cannot be read) and its signature's."""

    rel: str
    run_dir: Path
    manifest: bytes | None
    why: str
    signature: bytes

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.manifest).hexdigest() if self.manifest is not None else f"unreadable: {self.why}"

    @property
    def signature_digest(self) -> str:
        return hashlib.sha256(self.signature).hexdigest() if self.signature else ""


def _read_run_file(run_dir: Path, name: str, max_bytes: int) -> bytes:
    """A file directly in a run directory that `run_directories` found (so no symlink itself): opened without
    following a link, a regular file, bounded. Every other file goes through the containment rule for its message."""
    path = os.path.join(run_dir, name)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a link is never even opened here: the rule says where it leads
            return read_bytes_inside(run_dir, name, max_bytes=max_bytes)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise OutsideError(name, MISSING) from None
    except OSError:  # swapped for a link since (ELOOP), no permission: the rule says which
        return read_bytes_inside(run_dir, name, max_bytes=max_bytes)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return read_bytes_inside(run_dir, name, max_bytes=max_bytes)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OutsideError(name, f"over the {max_bytes} bytes a reader accepts")
    return data


def _look(rel: str, run_dir: Path) -> _Seen:
    try:
        data: bytes | None = _read_run_file(run_dir, MANIFEST, MAX_MANIFEST_BYTES)
        why = ""
    except OutsideError as exc:
        data, why = None, str(exc)
    try:
        signature = _read_run_file(run_dir, SIGNATURE_FILE, MAX_SIGNATURE_BYTES)
    except OutsideError:
        signature = b""  # missing or unreadable: verification names it
    return _Seen(rel, run_dir, data, why, signature)


class ArchiveIndex:
    """The index of one archive root, checked against the manifests (`sync`) once per instance, when first read."""

    def __init__(self, root: Path, warn: Warn = warn_stderr, public_key: Ed25519PublicKey | None = None):
        self.root = Path(root)
        self.path = self.root / INDEX_FILE
        self._warn = warn
        self.public_key = public_key
        self._synced = False
        self._memory: sqlite3.Connection | None = None

    @property
    def _key_fingerprint(self) -> str:
        from llmplay.archive.signing import fingerprint  # deferred: reading an index without a key needs no crypto

        return fingerprint(self.public_key) if self.public_key is not None else ""

    # -------------------------------------------------------------------- building
    def _read_entry(self, seen: _Seen, cache: dict[str, Goals | None]) -> RunEntry | Unindexable:
        if seen.manifest is None:
            return Unindexable(seen.rel, seen.why, seen.digest)
        try:
            return entry_from_manifest(
                self.root, seen.run_dir, seen.manifest, cache, public_key=self.public_key, signature=seen.signature
            )
        except ArchiveError as exc:
            return Unindexable(seen.rel, str(exc), seen.digest)
        except (OSError, TypeError, KeyError, AttributeError, ValueError, RecursionError) as exc:
            why = f"damaged manifest ({type(exc).__name__}: {exc})"  # a field of the wrong type
            return Unindexable(seen.rel, why, seen.digest)

    @staticmethod
    def _store(conn: sqlite3.Connection, rel: str, found: RunEntry | Unindexable) -> None:
        conn.execute("DELETE FROM runs WHERE path = ?", (rel,))
        conn.execute("DELETE FROM unreadable WHERE path = ?", (rel,))
        if isinstance(found, RunEntry):
            insert(conn, found)
        else:
            conn.execute("INSERT INTO unreadable VALUES (?, ?, ?)", (found.path, found.why, found.manifest_digest))

    def _refuse_link(self) -> None:
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise ArchiveError(
                f"{self.path}: a symlink or not a regular file; the index is never written through it (remove it, "
                "or `llmplay index --rebuild` replaces it with a new file)"
            )

    def rebuild(self) -> int:
        """Remake the index from the manifests (each read once) in a new file swapped in whole; the runs indexed.
        ArchiveError when the archive root cannot be written (read-only, full)."""
        try:
            return self._rebuild_file()
        except (OSError, sqlite3.OperationalError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ArchiveError(
                f"{self.path}: cannot be written ({why}); expected a writable archive root with free space "
                "(history, site and index read a read-only root through an index in memory)"
            ) from None

    def _rebuild_file(self) -> int:
        counted: list[int] = []

        def fill(tmp: Path) -> None:
            with closing(_connect(tmp)) as conn:
                counted.append(self._fill(conn))

        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, fill)  # replaces a symlink itself, never writes through it
        count = counted[0]
        self._synced = True
        return count

    def _fill(self, conn: sqlite3.Connection) -> int:
        cache: dict[str, Goals | None] = {}
        count = 0
        conn.executescript(TABLES)
        with _transaction(conn):
            conn.execute("INSERT INTO meta VALUES ('version', ?)", (INDEX_VERSION,))
            for rel, run_dir in run_directories(self.root).found:
                found = self._read_entry(_look(rel, run_dir), cache)
                self._store(conn, rel, found)
                count += isinstance(found, RunEntry)
        return count

    def _in_memory(self, why: object) -> sqlite3.Connection:
        """An archive this user may read but not write (a shared, read-only copy, or a full disk): the index lives
        for this command only, built from the manifests in memory."""
        if self._memory is None:
            self._warn(f"{self.path}: cannot be written ({why}); indexing the manifests in memory for this command")
            conn = _connect(Path(":memory:"))
            self._fill(conn)
            self._memory = conn
        return self._memory

    def _usable_connection(self) -> sqlite3.Connection | None:
        """A connection to an index of this version, or None (absent, unreadable, another version)."""
        if not self.path.is_file():
            return None
        try:
            conn = _connect(self.path)
            row = conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
            if row is None or row[0] != INDEX_VERSION:
                conn.close()
                return None
            conn.execute("SELECT 1 FROM runs LIMIT 1").fetchall()
            return conn
        except sqlite3.DatabaseError:
            return None

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """An index in step with the manifests: rebuilt (with a warning) when absent or unreadable, else synced;
        in memory when the archive root cannot be written."""
        if self._memory is not None:
            yield self._memory
            return
        self._refuse_link()
        conn = self._open_synced()
        if conn is self._memory:
            yield conn
            return
        with closing(conn):
            yield conn

    def _open_synced(self) -> sqlite3.Connection:
        conn = self._usable_connection()
        if conn is None:
            if self.path.exists():
                self._warn(f"{self.path}: unreadable or of another llmplay version; rebuilt from the manifests")
            elif run_directories(self.root).found:
                self._warn(f"{self.path}: no index yet; built from the manifests")
            try:
                self._rebuild_file()
            except (OSError, sqlite3.OperationalError) as exc:
                return self._in_memory(exc)
            conn = self._usable_connection()
            if conn is None:
                raise ArchiveError(f"{self.path}: cannot open the index just rebuilt")
            return conn
        if self._synced:
            return conn
        try:
            self._sync(conn)
        except sqlite3.OperationalError as exc:  # read-only, full, or locked beyond the timeout
            conn.close()
            return self._in_memory(exc)
        except sqlite3.DatabaseError as exc:
            conn.close()
            self._warn(f"{self.path}: damaged ({exc}); rebuilt from the manifests")
            try:
                self._rebuild_file()
            except (OSError, sqlite3.OperationalError) as again:
                return self._in_memory(again)
            conn = self._usable_connection()
            if conn is None:
                raise ArchiveError(f"{self.path}: cannot open the index just rebuilt") from None
        self._synced = True
        return conn

    # -------------------------------------------------------------------- keeping it in step
    def _disagrees(self, row: sqlite3.Row, figures: list[tuple[str, str]], seen: _Seen) -> str | None:
        """Why a run's row no longer stands for its run directory ("changed", "damaged", "key"); None if it does."""
        if row["manifest_digest"] != seen.digest or row["signature_digest"] != seen.signature_digest:
            return "changed"
        if row_digest(row, figures) != row["row_digest"]:
            return "damaged"
        try:
            files = json.loads(row["files_json"])
        except (ValueError, TypeError, RecursionError):
            return "damaged"
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            return "damaged"
        if files_fingerprint(seen.run_dir, files) != row["files_digest"]:
            return "changed"
        if row["verified_with"] != self._key_fingerprint:
            return "key"
        if self.public_key is not None and row["verified"] == 1 and seen.manifest is not None:
            from llmplay.archive.signing import parse_signature, signature_problem  # deferred: see _key_fingerprint

            try:
                if signature_problem(seen.manifest, parse_signature(seen.signature), self.public_key) is not None:
                    return "damaged"
            except ArchiveError:
                return "damaged"
        return None

    def _sync(self, conn: sqlite3.Connection) -> None:
        """Index again every run whose row no longer stands for its run directory, or that is new or gone; warn
        about the disagreement unless it is only a run still being written (its manifest changes after every trial)
        or a verification with another public key."""
        on_disk = [_look(rel, run_dir) for rel, run_dir in run_directories(self.root).found]
        rows = {row["path"]: row for row in conn.execute("SELECT * FROM runs")}
        figures: dict[str, list[tuple[str, str]]] = {}
        for run_id, metric, text in conn.execute("SELECT run_id, metric, trial_values FROM figures"):
            figures.setdefault(run_id, []).append((metric, text))
        unreadable = {row[0]: row[1] for row in conn.execute("SELECT path, manifest_digest FROM unreadable")}
        why: dict[str, str] = {}
        for seen in on_disk:
            row = rows.get(seen.rel)
            if row is not None:
                reason = self._disagrees(row, figures.get(row["run_id"], []), seen)
            elif seen.rel in unreadable:
                reason = None if unreadable[seen.rel] == seen.digest else "changed"
            else:
                reason = "new"
            if reason is not None:
                why[seen.rel] = reason
        present = {s.rel for s in on_disk}
        gone = [rel for rel in [*rows, *unreadable] if rel not in present]
        if not gone and not why:
            return
        cache: dict[str, Goals | None] = {}
        entries = [(s.rel, self._read_entry(s, cache)) for s in on_disk if s.rel in why]
        with _transaction(conn):
            for rel in gone:
                conn.execute("DELETE FROM runs WHERE path = ?", (rel,))
                conn.execute("DELETE FROM unreadable WHERE path = ?", (rel,))
            for rel, found in entries:
                self._store(conn, rel, found)
        self._say_disagreement(why, gone, rows, entries)

    def _say_disagreement(
        self,
        why: dict[str, str],
        gone: list[str],
        rows: dict[str, sqlite3.Row],
        entries: list[tuple[str, RunEntry | Unindexable]],
    ) -> None:
        quiet = {rel for rel, e in entries if isinstance(e, RunEntry) and e.status == "running"}
        quiet |= {rel for rel in why if rel in rows and rows[rel]["status"] == "running" and why[rel] == "changed"}
        kinds = {
            "new": "not indexed",
            "changed": "changed since indexed",
            "damaged": "whose index row disagreed with its manifest (edited or damaged)",
        }
        parts = []
        for kind, what in kinds.items():
            listed = [rel for rel, reason in why.items() if reason == kind and rel not in quiet]
            if listed:
                parts.append(f"{len(listed)} {what} ({listed[0]}{', ...' if len(listed) > 1 else ''})")
        if gone:
            parts.append(f"{len(gone)} gone ({gone[0]}{', ...' if len(gone) > 1 else ''})")
        if parts:
            self._warn(f"{self.path} disagreed with the manifests: " + "; ".join(parts) + "; re-indexed them")

    def record(self, run_dir: Path) -> None:
        """Index one run (the writer, as a run finishes): one transaction; a missing or unreadable index is rebuilt."""
        self._refuse_link()
        conn = self._usable_connection()
        if conn is None:
            self._rebuild_file()
            return
        with closing(conn):
            rel = Path(run_dir).resolve().relative_to(self.root.resolve()).as_posix()
            found = self._read_entry(_look(rel, Path(run_dir)), {})
            with _transaction(conn):
                self._store(conn, rel, found)

    # -------------------------------------------------------------------- reading
    def runs(self, playbook: str | None = None) -> list[RunEntry]:
        """Every indexed run (of one playbook), oldest first, with its figures: two queries, whatever the size. A row
        that does not parse is skipped with a warning; a figure not finite or absurd is left out (not measured)."""
        with self.connection() as conn:
            where, args = ("WHERE playbook = ?", (playbook,)) if playbook is not None else ("", ())
            rows = conn.execute(f"SELECT * FROM runs {where} ORDER BY started_utc, run_id", args).fetchall()
            query = (
                "SELECT f.run_id, f.metric, f.trial_values FROM figures f JOIN runs r ON r.run_id = f.run_id "
                f"{where.replace('playbook', 'r.playbook')}"
            )
            stored: dict[str, list[tuple[str, object]]] = {}
            for run_id, metric, text in conn.execute(query, args):
                stored.setdefault(run_id, []).append((metric, text))
        parsed = JsonCache()
        out = []
        for row in rows:
            try:
                figures = {}
                for metric, text in stored.get(row["run_id"], []):
                    values = trial_values(text)
                    if values is not None:
                        figures[metric] = values
                out.append(entry_from_row(row, figures, parsed))
            except DamagedRow as exc:
                self._warn(f"{self.path}: the row of {row['path']} is damaged ({exc}); skipped")
        return out

    def unreadable(self) -> list[Unindexable]:
        """Run directories whose manifest could not be indexed, and why; symlinked folders, which are not read."""
        with self.connection() as conn:
            stored = [Unindexable(*row) for row in conn.execute("SELECT * FROM unreadable ORDER BY path")]
        return stored + [Unindexable(rel, LINKED) for rel in run_directories(self.root).linked]

    def playbooks(self) -> list[str]:
        with self.connection() as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT playbook FROM runs ORDER BY playbook")]


def index_finished_run(run_dir: Path, warn: Warn = warn_stderr) -> None:
    """The writer's hook as a run is finalised: record it in its archive root's index. The index is never the only
    copy, so a failure here costs nothing but a warning (the next read re-indexes from the manifest)."""
    run_dir = Path(run_dir)
    try:
        ArchiveIndex(run_dir.parent.parent, warn).record(run_dir)
    except Exception as exc:  # any failure: the run is archived; the index is rebuilt from it on the next read
        warn(f"the archive index was not updated for {run_dir} ({type(exc).__name__}: {exc}); the next read re-indexes")
