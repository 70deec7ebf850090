"""Content hashes of files: archive integrity and build-cache keys use the same one."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def chain_hash(previous: int, role: str, text: str) -> int:
    """The hash of a prompt prefix one piece longer: `previous` (0 for none) followed by `text` under `role`.
    63 bits, so it fits a signed 64-bit column, and the same in every process (unlike hash())."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(previous.to_bytes(8, "little"))
    digest.update(role.encode())
    digest.update(b"\0")
    digest.update(text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest(), "little") >> 1
