"""Whether an archive may be continued (`run --resume`), and whether the continued run may sign it.

Resuming writes the manifest again, with every earlier trial in it. Signing that manifest says "this key's holder
measured all of it", so a resumed run signs only what it can vouch for: an archive that verifies, signature
included, under the very key it signs with. The rules, in order:

- The archive must verify as `llmplay verify` verifies it, with the configured public key (`--public-key`, else
  $LLMPLAY_PUBLIC_KEY), else with the public half of $LLMPLAY_SIGNING_KEY when that is set: a run re-hashed after
  its TTFTs were divided by 10 fails on its stale signature and is refused.
- With $LLMPLAY_SIGNING_KEY set, the earlier manifest must be signed by that key: an unsigned archive, or one signed
  by another key, is refused (its earlier trials are no one's to vouch for now).
- `--unverified` continues an archive that fails any of this, after a warning, and the continued run is never
  signed; a signature already there is left as it was, so it no longer matches and `verify --public-key` keeps
  failing the run (the chain of custody is broken, and says so).
- Without any key, nothing is signed and nothing is claimed beyond integrity (as for any unsigned run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from llmplay.archive.layout import ENV_SIGNING_KEY, SIGNATURE_FILE
from llmplay.archive.signing import fingerprint, signing_key_from_env
from llmplay.archive.verify import Verification, check
from llmplay.errors import ArchiveError


@dataclass(frozen=True)
class ResumeTrust:
    """What verification said of an archive to be resumed, and whether the resumed run signs it."""

    verification: Verification
    sign: bool  # the continued run signs with $LLMPLAY_SIGNING_KEY
    warning: str | None  # printed first when --unverified continues an archive that failed


def resume_trust(run_dir: Path, *, allow_unverified: bool, public_key: Ed25519PublicKey | None) -> ResumeTrust:
    """The archive's verification and the signing decision for resuming it; ArchiveError (one line naming the run
    and what failed) when it may not be resumed and the caller did not pass --unverified."""
    signing_key = signing_key_from_env()  # a set but unusable key is an error here, before anything is read
    own = signing_key.public_key() if signing_key is not None else None
    if own is not None and not os.path.lexists(run_dir / SIGNATURE_FILE):
        verification = check(run_dir, public_key)
        problem = verification.one_line() if not verification.ok else None
        problem = problem or (
            f"{SIGNATURE_FILE}: missing; ${ENV_SIGNING_KEY} would sign earlier trials that no key signed (unset it "
            "to resume unsigned)"
        )
    else:
        verification = check(run_dir, public_key if public_key is not None else own)
        problem = verification.one_line() if not verification.ok else None
        if (
            problem is None
            and own is not None
            and public_key is not None
            and fingerprint(own) != fingerprint(public_key)
        ):
            problem = (
                f"{SIGNATURE_FILE}: signed by {fingerprint(public_key)}; ${ENV_SIGNING_KEY} ({fingerprint(own)}) signs "
                "a resumed run only when it signed its earlier trials"
            )
    if problem is None:
        return ResumeTrust(verification, sign=own is not None, warning=None)
    if not allow_unverified:
        raise ArchiveError(
            f"{run_dir}: fails verification: {problem}; `llmplay verify {run_dir}` lists every problem, "
            "--unverified resumes it anyway (unsigned)"
        )
    return ResumeTrust(
        verification,
        sign=False,
        warning=f"WARNING: {run_dir}: this archive failed verification: {problem}; resuming anyway, unsigned",
    )
