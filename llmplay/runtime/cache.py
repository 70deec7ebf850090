"""Where llmplay keeps what it builds or starts once per machine (llama-server, the tiny model, dockerd's log)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmplay.cache_dir import cache_root


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
