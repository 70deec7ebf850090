"""Signed archives: Ed25519 keys, the detached `manifest.sig` over the manifest's exact bytes, and checking it.

The manifest's own hash only catches accidents: anyone who can edit the file can recompute it. A signature by a
key that only the machines that run hold is what says a team's llmplay wrote these bytes. The manifest lists the
sha256 of every other archived file, so signing its bytes covers them all. The signature file names the key by
its fingerprint; checking uses the public key the verifier brings, never one the archive names.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from llmplay.archive.layout import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, MANIFEST, SIGNATURE_FILE
from llmplay.errors import ArchiveError
from llmplay.files import read_bounded

SIGNATURE_SCHEMA = "llmplay/manifest-signature.v1"
ALGORITHM = "ed25519"
MAX_KEY_BYTES = 64 << 10  # an Ed25519 PEM key is about 120 bytes; any real PEM file is far below this


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """`SHA256:<base64>` of the raw public key, as ssh-keygen -l prints one."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def _read_key_file(path: Path, what: str) -> bytes:
    # A key path comes from a flag or the environment: /dev/zero, a FIFO or a huge file is refused, never read.
    return read_bounded(Path(path), MAX_KEY_BYTES, f"the {what}: a PEM file from llmplay keygen", ArchiveError)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    data = _read_key_file(path, "signing key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ArchiveError(
            f"{path}: not an unencrypted PEM private key ({exc}); expected a key written by llmplay keygen"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ArchiveError(f"{path}: a {type(key).__name__}; expected an Ed25519 key (llmplay keygen)")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    data = _read_key_file(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ArchiveError(
            f"{path}: not a PEM public key ({exc}); expected the .pub file written by llmplay keygen"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ArchiveError(f"{path}: a {type(key).__name__}; expected an Ed25519 public key (llmplay keygen)")
    return key


def signing_key_from_env() -> Ed25519PrivateKey | None:
    """The team key named by $LLMPLAY_SIGNING_KEY, or None when unset; a set but unusable key is an error, so a
    run meant to be signed never silently goes unsigned."""
    path = os.environ.get(ENV_SIGNING_KEY)
    if not path:
        return None
    try:
        return load_private_key(Path(path))
    except ArchiveError as exc:
        raise ArchiveError(f"${ENV_SIGNING_KEY}: {exc}") from None


def keygen(private_path: Path) -> tuple[Path, Path, str]:
    """A new key pair: `private_path` (PEM, mode 0600, never overwritten) and `private_path`.pub (PEM).

    Each file is written whole to a temporary name and then linked to its own (a hard link fails when the name
    exists, so nothing is overwritten): a full disk or a crash leaves no empty or partial key that would block the
    next keygen, and a pair is written both or neither."""
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + ".pub")
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise ArchiveError(f"{path} already exists; expected a new file name (keys are never overwritten)")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    written: list[Path] = []
    try:
        private_path.parent.mkdir(parents=True, exist_ok=True)
        for path, data, mode in ((private_path, private_pem, 0o600), (public_path, public_pem, 0o644)):
            _write_new(path, data, mode)
            written.append(path)
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        if isinstance(exc, FileExistsError):
            raise ArchiveError(
                f"{exc.filename or private_path} already exists; expected a new file name (keys are never overwritten)"
            ) from None
        raise ArchiveError(f"{exc.filename or private_path}: cannot write the key ({exc.strerror})") from None
    return private_path, public_path, fingerprint(key.public_key())


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """`data` at `path`, which must not exist, all at once: written and synced under a temporary name first."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # O_EXCL with the mode given at creation: the key is never readable by others, not even for a moment
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(temp, mode)  # a umask can only remove bits, but say it outright
        os.link(temp, path)
    except OSError as exc:
        if exc.filename is None or exc.filename == str(temp):
            exc.filename = str(path)
        raise
    finally:
        temp.unlink(missing_ok=True)


def signature_document(manifest_bytes: bytes, key: Ed25519PrivateKey) -> bytes:
    """The contents of manifest.sig for these exact manifest bytes."""
    doc = {
        "schema": SIGNATURE_SCHEMA,
        "algorithm": ALGORITHM,
        "public_key_fingerprint": fingerprint(key.public_key()),
        "signed_file": MANIFEST,
        "signature": base64.b64encode(key.sign(manifest_bytes)).decode(),
    }
    return (json.dumps(doc, indent=1) + "\n").encode()


@dataclass(frozen=True)
class Signature:
    """A parsed manifest.sig: who claims to have signed, and the signature bytes."""

    fingerprint: str
    signature: bytes


def parse_signature(data: bytes) -> Signature:
    """manifest.sig's bytes as a Signature, or ArchiveError naming what is wrong with it."""
    try:
        doc: object = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArchiveError(f"{SIGNATURE_FILE}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SIGNATURE_SCHEMA or doc.get("algorithm") != ALGORITHM:
        raise ArchiveError(f"{SIGNATURE_FILE}: expected an {ALGORITHM} signature document ({SIGNATURE_SCHEMA})")
    fp, sig = doc.get("public_key_fingerprint"), doc.get("signature")
    if not isinstance(fp, str) or not isinstance(sig, str):
        raise ArchiveError(f"{SIGNATURE_FILE}: public_key_fingerprint and signature must be text")
    try:
        raw = base64.b64decode(sig, validate=True)
    except ValueError:
        raise ArchiveError(f"{SIGNATURE_FILE}: signature is not base64") from None
    return Signature(fp, raw)


def signature_problem(manifest_bytes: bytes, signature: Signature, public_key: Ed25519PublicKey) -> str | None:
    """Why `signature` is not a valid signature of these bytes by `public_key`; None when it is."""
    expected = fingerprint(public_key)
    if signature.fingerprint != expected:
        return f"{SIGNATURE_FILE}: signed by {signature.fingerprint}, expected {expected} (the --public-key)"
    try:
        public_key.verify(signature.signature, manifest_bytes)
    except InvalidSignature:
        return f"{SIGNATURE_FILE}: signature does not match {MANIFEST} (changed after it was signed)"
    return None


def public_key_from(path: Path | None) -> Ed25519PublicKey | None:
    """The public key a check uses: `path` (--public-key), else $LLMPLAY_PUBLIC_KEY, else None (integrity only)."""
    if path:
        return load_public_key(Path(path))
    chosen = os.environ.get(ENV_PUBLIC_KEY)
    if not chosen:
        return None
    try:
        return load_public_key(Path(chosen))
    except ArchiveError as exc:
        raise ArchiveError(f"${ENV_PUBLIC_KEY}: {exc}") from None
