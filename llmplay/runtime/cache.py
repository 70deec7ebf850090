"""Where llmplay keeps what it builds or starts once per machine (llama-server, the tiny model, dockerd's log)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$LLMPLAY_CACHE, or ~/.cache/llmplay; read at each call so a test or a shell can point it elsewhere."""
    return Path(os.environ.get("LLMPLAY_CACHE", "~/.cache/llmplay")).expanduser()
