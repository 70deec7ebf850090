"""Small playbooks written for a test, and the check that `llmplay validate` refuses one the way every bad input must
be refused: exit 2, one line naming FILE:LINE and the YAML path, no traceback."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from llmplay.cli import cli

# The least a valid playbook holds: a llama.cpp engine and a two-request closed loop.
MINIMAL_PLAYBOOK: dict[str, Any] = {
    "apiVersion": "llmplay/v1",
    "kind": "Playbook",
    "metadata": {"name": "p"},
    "engine": {"kind": "llamacpp", "model": "/models/tiny.gguf", "args": {"parallel": 1, "ctx_size": 4096}},
    "workload": {"concurrency": 1, "num_requests": 2, "input": {"fixed": 16}, "output": {"fixed": 8}},
}


def write_playbook(tmp_path: Path, **sections: Any) -> Path:
    """MINIMAL_PLAYBOOK with `sections` merged one level deep (a None value deletes the key), written block style
    to tmp_path/p.yaml."""
    doc = copy.deepcopy(MINIMAL_PLAYBOOK)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key].update(value)
            doc[key] = {k: v for k, v in doc[key].items() if v is not None}
        else:
            doc[key] = value
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def validate(*args: str) -> tuple[int, str]:
    """`llmplay validate ARGS`: its exit code and output."""
    result = CliRunner().invoke(cli, ["validate", *args], catch_exceptions=False)
    return result.exit_code, result.output


def assert_refused(path: Path, yaml_path: str, fragment: str, *flags: str) -> str:
    """validate exits 2 with a line `...p.yaml:LINE: YAML_PATH: ...fragment...` and no traceback; its output."""
    code, out = validate(str(path), *flags)
    assert code == 2, out
    assert "Traceback" not in out and "internal error" not in out
    pattern = rf"{re.escape(path.name)}:[1-9]\d*: {re.escape(yaml_path)}: .*{re.escape(fragment)}"
    assert re.search(pattern, out), out
    return out
