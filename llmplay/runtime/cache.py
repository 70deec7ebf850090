"""Where llmplay keeps what it builds or starts once per machine (llama-server, the tiny model, dockerd's log)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def default_cache_dir() -> Path:
    """$LLMPLAY_CACHE, or ~/.cache/llmplay; read at each call so a test or a shell can point it elsewhere."""
    return Path(os.environ.get("LLMPLAY_CACHE", "~/.cache/llmplay")).expanduser()


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
