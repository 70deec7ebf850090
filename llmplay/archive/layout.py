"""The run directory's layout: its path under the archive root, the file names in it, and the manifest's schema id.

`<root>/<playbook>/<UTC %Y%m%dT%H%M%SZ>-<6 hex>/` holds `playbook.yaml` (as run, redacted), `manifest.json`,
`trials/<trial_id>/{requests,telemetry}.{parquet,csv}` and `engine.log`, `report.html`, and `manifest.sig` when a
signing key is configured.
"""

from __future__ import annotations

import re

SCHEMA_ID = "llmplay/manifest.v1"
MANIFEST = "manifest.json"
PLAYBOOK_FILE = "playbook.yaml"
RESOLVED_FILE = "playbook.resolved.yaml"  # after `extends:`: loadable without the files it extended
REPORT_FILE = "report.html"  # rendered from the archive, so not hashed: `llmplay report` rewrites it
PROBES_FILE = "probes.json"  # a trial's greedy probe answers (goals.quality), under trials/<trial_id>/
SIGNATURE_FILE = "manifest.sig"  # detached Ed25519 signature over manifest.json's bytes (archive.signing)
STATUSES = ("running", "complete", "failed", "interrupted")
ENV_ARCHIVE = "LLMPLAY_ARCHIVE"
ENV_SIGNING_KEY = "LLMPLAY_SIGNING_KEY"  # PEM private key that signs each run's manifest as it is written
ENV_PUBLIC_KEY = "LLMPLAY_PUBLIC_KEY"  # PEM public key that verify, report, compare and retest check signatures with


def safe_name(name: str) -> str:
    """A playbook or trial name as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "playbook"
