"""Where llmplay keeps what it builds or starts once per machine (llama-server, the tiny model, dockerd's log)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmplay.cache_dir import cache_root
from llmplay.errors import InfrastructureError

Log = Callable[[str], None]  # where a build step says what it does


def default_cache_dir() -> Path:
    """$LLMPLAY_CACHE, or ~/.cache/llmplay (cache_dir.cache_root: playbooks name it as ${cache})."""
    return cache_root()


@contextmanager
def cache_lock(cache: Path, name: str) -> Iterator[None]:
    """Hold `name`'s lock in the cache: builds that share a download or an extracted tree (setup builds the vLLM
    images beside llama-server, and both read the llama.cpp sdist's vocabulary) take turns writing it, and a reader
    never maps a file another process is still writing. The kernel drops the lock however its holder dies."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def content_key(*parts: object) -> str:
    """A short hash of what a cached build is made from: its folder or file name, so other inputs never share it."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_logged(
    argv: list[str],
    log_path: Path,
    what: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    ok_codes: tuple[int, ...] = (0,),
) -> None:
    """Run a build step with its output appended to `log_path`; an exit code outside `ok_codes` names the log and
    quotes its end. `env` adds to the environment."""
    with open(log_path, "ab") as log:
        log.write(f"\n$ {' '.join(argv)}\n".encode())
        log.flush()
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=os.environ | env if env else None)
    if rc not in ok_codes:
        tail = " | ".join(log_path.read_text(errors="replace").splitlines()[-5:])
        raise InfrastructureError(f"{what} failed (exit code {rc}); see {log_path}: {tail}")
