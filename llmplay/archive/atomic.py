"""The one way the archive replaces a file: readers (another command, a second process indexing the same root) never
see half of one, and a link in its place is replaced, never written through."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

TMP_PREFIX = ".tmp-"


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` fills a temp file beside `path`; os.replace then swaps it in (a symlink at `path` is replaced
    itself). The temp file is removed on any failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix="-" + path.name, dir=path.parent)
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
