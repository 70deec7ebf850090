"""Reading a file someone else named: the one rule that reads only regular files, never blocks, and stays bounded.

A playbook, a dataset, a trace or a key file is named by a user or a shared file: /dev/zero (or a link to it) would
be read without end, a FIFO would block the open itself, and a huge file would fill memory. So the type is checked
after resolving links and before opening, the open cannot block (O_NONBLOCK), the opened descriptor is checked
again (the path may have been swapped in between), and no more than limit + 1 bytes are ever read (a /proc file
says 0 bytes and holds more). Files inside a run archive have their own rule (llmplay.archive.paths), which also
keeps them inside the run directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from llmplay.errors import LlmplayError, PlaybookError


def display_path(path: str) -> str:
    """The path relative to the working directory when that is shorter to read; as given otherwise."""
    try:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("../..") else path
    except ValueError:
        return path


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in a few words ("a FIFO", "a character device")."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: Path, expected: str, error: type[LlmplayError] = PlaybookError) -> int:
    """A read-only descriptor on a regular file (after links), opened without blocking and checked again once open,
    so neither a FIFO nor a device swapped in between is ever read; anything else is a one-line `error`."""
    shown = display_path(str(path))
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise error(f"{shown}: not a regular file ({file_kind(before.st_mode)}); expected {expected}")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{shown}: no such file; expected {expected}") from None
    except OSError as exc:
        raise error(f"{shown}: cannot read ({exc.strerror}); expected {expected}") from None
    try:
        opened = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise error(f"{shown}: cannot read ({exc.strerror}); expected {expected}") from None
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise error(f"{shown}: not a regular file ({file_kind(opened.st_mode)}); expected {expected}")
    return fd


def read_bounded(path: Path, limit: int, expected: str, error: type[LlmplayError] = PlaybookError) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; anything else is a one-line `error` naming the file."""
    shown = display_path(str(path))
    fd = open_regular(path, expected, error)
    try:
        opened = os.fstat(fd)
        if opened.st_size > limit:
            raise error(f"{shown}: file is {opened.st_size} bytes; expected at most {limit} ({expected})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise error(f"{shown}: cannot read ({exc.strerror}); expected {expected}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise error(f"{shown}: file is more than {limit} bytes; expected at most {limit} ({expected})")
    return b"".join(chunks)
