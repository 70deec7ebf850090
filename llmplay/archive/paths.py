"""Paths read from an archive: the one rule that keeps every read inside its run directory, and bounded in size.

A manifest is data anyone may have edited, so a path in it is never joined to the run directory and opened as is:
it must be relative text without `..`, resolve (symlinks included) to a regular file inside the resolved run
directory, and be no larger than a bound. Verification, the reader, the report, compare, retest and ls all go
through `open_inside`/`inside`, so the rule cannot drift between them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO

from llmplay.errors import ArchiveError

MiB = 1 << 20
MAX_MANIFEST_BYTES = 256 * MiB  # a manifest of thousands of trials is a few MiB
MAX_TEXT_BYTES = 64 * MiB  # engine logs, playbooks, capacity searches
MAX_DATA_BYTES = 4096 * MiB  # per-request records and telemetry of a long trial

MISSING = "missing"


class OutsideError(ArchiveError):
    """A path from an archive that must not be read: `entry` as the archive gave it, `why` in a few words."""

    def __init__(self, entry: object, why: str):
        super().__init__(f"{entry if isinstance(entry, str) else repr(entry)}: {why}")
        self.entry = entry
        self.why = why

    @property
    def missing(self) -> bool:
        return self.why == MISSING


def inside(run_dir: Path, relpath: object, *, max_bytes: int = MAX_DATA_BYTES) -> Path:
    """The resolved path of the regular file `relpath` names inside `run_dir`, or OutsideError saying why not."""
    if not isinstance(relpath, str):
        raise OutsideError(relpath, f"expected a relative path (text), found {type(relpath).__name__}")
    if not relpath or "\x00" in relpath:
        raise OutsideError(relpath, "expected a relative path, found an empty or NUL-bearing name")
    pure = PurePosixPath(relpath)
    if pure.is_absolute() or PureWindowsPath(relpath).is_absolute() or relpath.startswith("\\"):
        raise OutsideError(relpath, "absolute path; expected a path relative to the run directory")
    if ".." in pure.parts or ".." in PureWindowsPath(relpath).parts:
        raise OutsideError(relpath, "'..' leaves the run directory; expected a path inside it")
    root = Path(run_dir).resolve()
    try:
        target = (root / pure).resolve(strict=True)
    except FileNotFoundError:
        if os.path.islink(root / pure):  # a dangling link: where it points is nobody's business but still wrong
            raise OutsideError(relpath, "a symlink to nothing; expected a regular file") from None
        raise OutsideError(relpath, MISSING) from None
    except (OSError, RuntimeError):  # symlink loops, permission errors on a parent
        raise OutsideError(relpath, "cannot be resolved (symlink loop or no permission)") from None
    if not target.is_relative_to(root):
        raise OutsideError(relpath, "a symlink leads outside the run directory")
    try:
        info = target.stat()
    except OSError as exc:
        raise OutsideError(relpath, f"cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise OutsideError(relpath, "not a regular file")
    if info.st_size > max_bytes:
        raise OutsideError(relpath, f"{info.st_size} bytes, over the {max_bytes} bytes a reader accepts")
    return target


def open_inside(run_dir: Path, relpath: object, *, max_bytes: int = MAX_DATA_BYTES) -> BinaryIO:
    """`inside` and open it for reading; O_NOFOLLOW so a link swapped in after the check is refused, not followed."""
    target = inside(run_dir, relpath, max_bytes=max_bytes)
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise OutsideError(relpath, f"cannot be opened ({exc.strerror})") from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO or device between the check and the open
        fh.close()
        raise OutsideError(relpath, "not a regular file")
    return fh


def read_bytes_inside(run_dir: Path, relpath: object, *, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    with open_inside(run_dir, relpath, max_bytes=max_bytes) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise OutsideError(relpath, f"over the {max_bytes} bytes a reader accepts")
    return data


def read_text_inside(run_dir: Path, relpath: object, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    return read_bytes_inside(run_dir, relpath, max_bytes=max_bytes).decode("utf-8", errors="replace")
