"""The build cache shared by builds that run side by side (setup builds the vLLM images beside llama-server): a file
one build has extracted is never written again under another build's reader, and the cache lock serialises."""

from __future__ import annotations

import io
import multiprocessing
import tarfile
import time
from pathlib import Path

from llmplay.runtime.cache import cache_lock
from llmplay.runtime.cpu_image import VOCAB_FILE, _extract, sdist_name


def _sdist(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in ((VOCAB_FILE, b"vocabulary" * 100), ("vendor/llama.cpp/CMakeLists.txt", b"project(x)")):
            info = tarfile.TarInfo(f"{sdist_name()}/{name}")
            info.size = len(text)
            tf.addfile(info, io.BytesIO(text))
    return path


def test_extracting_the_whole_tree_leaves_an_extracted_file_as_it_was(tmp_path) -> None:
    tarball = _sdist(tmp_path / "sdist.tar.gz")
    vocab = _extract(tarball, tmp_path / "src", VOCAB_FILE)
    before = vocab.stat()
    time.sleep(0.01)
    tree = _extract(tarball, tmp_path / "src", "vendor/llama.cpp")
    assert (tree / "CMakeLists.txt").read_bytes() == b"project(x)"
    after = vocab.stat()
    # The same inode, never truncated: a reader that mapped the vocabulary keeps reading it.
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def _hold(cache: str, started: multiprocessing.synchronize.Event) -> None:
    with cache_lock(Path(cache), "sdist"):
        started.set()
        time.sleep(0.5)
        (Path(cache) / "released").touch()  # the last thing done under the lock


def test_the_cache_lock_makes_a_second_build_wait(tmp_path) -> None:
    started = multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold, args=(str(tmp_path), started))
    holder.start()
    assert started.wait(30)
    with cache_lock(tmp_path, "sdist"):
        assert (tmp_path / "released").exists()  # got the lock only after the holder was done with it
    holder.join(30)
