"""The llmplay runs on this host: a registry where each run holds a lock for as long as it lives.

Two runs on one machine share its CPUs, memory bandwidth and GPUs, and each measures the other's load as its own
engine's slowness; a run reads this registry around every trial to record which others were live meanwhile.
The lock (flock, released by the kernel however its holder dies) also tells a run killed with -9 from a live one,
and refuses a second process continuing the same run at once. The registry is host-wide (in the temporary
directory, sticky and writable by all, like /tmp itself): colleagues sharing a GPU box run as different users, and a
per-user cache directory would hide their runs from each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from llmplay.errors import InfrastructureError
from llmplay.runtime.owner import Owner

# Entries of runs that ended are kept this long, so a trial still learns of a run that came and went meanwhile.
KEEP_ENDED_S = 24 * 3600


class RunTaken(InfrastructureError):
    """Another live process holds this run (two processes writing one archive would interleave their trials)."""


ENV_REGISTRY = "LLMPLAY_LIVE_RUNS"


def registry_dir() -> Path:
    """$LLMPLAY_LIVE_RUNS, or llmplay-live-runs in the temporary directory; read at each call (tests point it away)."""
    return Path(os.environ.get(ENV_REGISTRY) or Path(tempfile.gettempdir()) / "llmplay-live-runs")


def _make_registry(directory: Path) -> None:
    if directory.is_dir():
        return
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # another user made it first, and made it so
        # Every user's runs register here; sticky, so none can remove another's entries.
        os.chmod(directory, 0o777 | stat.S_ISVTX)


@dataclass(frozen=True)
class SharedRun:
    """Another llmplay run that was live on the same host during a trial, as the trial's record keeps it. An older
    archive may lack its playbook or host ("") or its pid (None)."""

    run_id: str
    playbook: str = ""
    pid: int | None = None
    host: str = ""


@dataclass(frozen=True)
class RunEntry:
    """One run in the registry: who runs it, since when, and (once it ended cleanly) until when."""

    run_id: str
    playbook: str
    owner: Owner
    started: float  # seconds since the epoch
    ended: float | None

    def as_shared(self) -> SharedRun:
        """What a trial archives of a run that shared its host."""
        return SharedRun(self.run_id, self.playbook, self.owner.pid, self.owner.host)


def _lock_path(directory: Path, run_id: str) -> Path:
    return directory / f"{run_id}.lock"


def lock_held(run_id: str, directory: Path | None = None) -> bool | None:
    """Whether a live process holds `run_id`'s lock on this host; None when the run never registered here."""
    path = _lock_path(directory or registry_dir(), run_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _read(path: Path) -> RunEntry | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        owner = Owner.from_dict(data.get("owner"))
        if owner is None:
            return None
        ended = data.get("ended")
        return RunEntry(
            str(data["run_id"]), str(data.get("playbook", "")), owner, float(data["started"]), ended and float(ended)
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # half-removed or foreign: no run to speak of


def entries(directory: Path | None = None) -> list[RunEntry]:
    directory = directory or registry_dir()
    found = (_read(path) for path in sorted(directory.glob("*.json")))
    return [entry for entry in found if entry is not None]


def alive(entry: RunEntry, directory: Path | None = None) -> bool:
    return entry.ended is None and lock_held(entry.run_id, directory) is True


def live_ids(exclude: str, directory: Path | None = None) -> set[str]:
    """The runs live on this host now, but `exclude` (the asking run)."""
    return {e.run_id for e in entries(directory) if e.run_id != exclude and alive(e, directory)}


def others_during(run_id: str, since: float, live_at_start: set[str], directory: Path | None = None) -> list[RunEntry]:
    """The runs other than `run_id` live on this host at some time between `since` and now: those live at the start
    (`live_ids` then), live now, or that began or ended in between."""
    now = time.time()
    out = []
    for entry in entries(directory):
        if entry.run_id == run_id or entry.started > now:
            continue
        if entry.ended is not None:
            overlapped = entry.ended > since
        else:
            overlapped = entry.run_id in live_at_start or alive(entry, directory) or entry.started > since
        if overlapped:
            out.append(entry)
    return out


def _write(path: Path, data: dict[str, object]) -> None:
    # mkstemp's unguessable name: in a directory everyone may write to, a predictable one could be a planted link.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data))
        os.chmod(tmp, 0o644)  # other users' runs read it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _prune(directory: Path) -> None:
    """Entries of runs long ended, or long dead (killed, so never marked ended: their entry dates from their start)."""
    cutoff = time.time() - KEEP_ENDED_S
    for path in directory.glob("*.json"):
        entry = _read(path)
        with contextlib.suppress(OSError):
            if entry is not None and alive(entry, directory):
                continue
            last = entry.ended if entry is not None and entry.ended else path.stat().st_mtime
            if last < cutoff:
                path.unlink()
                if entry is not None:
                    _lock_path(directory, entry.run_id).unlink(missing_ok=True)


class LiveRun:
    """`with LiveRun(run_id, playbook):` registers this process as the run's owner on this host until the block ends.

    A second process registering the same run while the first lives gets RunTaken."""

    def __init__(self, run_id: str, playbook: str, directory: Path | None = None):
        self.directory = directory or registry_dir()
        self.run_id, self.playbook = run_id, playbook
        self.entry_path = self.directory / f"{run_id}.json"
        self._lock: int | None = None  # the lock file's descriptor, held open (and so locked) until __exit__
        self._data: dict[str, object] = {}

    def __enter__(self) -> LiveRun:
        _make_registry(self.directory)
        _prune(self.directory)
        fd = os.open(_lock_path(self.directory, self.run_id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read(self.entry_path)
            by = f" ({holder.owner.describe()})" if holder else ""
            raise RunTaken(
                f"run {self.run_id} is going on in another llmplay process{by}; wait for it to end (or stop it) "
                "before resuming it"
            ) from None
        self._lock = fd
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o644)  # whatever the umask: other users' runs open it to test the lock
        owner = Owner.current()
        self._data = {
            "run_id": self.run_id,
            "playbook": self.playbook,
            "owner": owner.as_dict(),
            "started": time.time(),
        }
        try:
            _write(self.entry_path, {**self._data, "ended": None})
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            _write(self.entry_path, {**self._data, "ended": time.time()})
        with contextlib.suppress(OSError):
            _lock_path(self.directory, self.run_id).unlink()
        os.close(self._lock)
        self._lock = None
