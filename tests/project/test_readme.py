"""The README's references are checked against the schema and the CLI, so they cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

from llmplay.cli import cli
from llmplay.playbook.schema import playbook_schema

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SCHEMA = playbook_schema()  # the copy that ships in the wheel, which the loader reads


def _properties(node: dict, prefix: str, out: set[str]) -> None:
    if "$ref" in node:
        target = SCHEMA
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    for branch in node.get("oneOf", []):
        _properties(branch, prefix, out)
    for key, child in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        out.add(path)
        if prefix.count(".") < 1 and key not in ("input", "output"):
            _properties(child, path + ".", out)


def test_every_schema_key_is_in_the_playbook_reference():
    paths: set[str] = set()
    _properties(SCHEMA, "", paths)
    missing = []
    for path in sorted(paths):
        leaf = path.split(".")[-1]
        if f"`{path}" not in README and f"`{leaf}`" not in README and f"`{leaf}:" not in README:
            missing.append(path)
    assert not missing, f"README's playbook reference lacks: {missing}"


def test_every_command_is_in_the_command_table():
    table = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    for name in cli.commands:
        assert re.search(rf"`llmplay {name}\b", table), name


def test_first_lines_give_the_two_fresh_machine_commands():
    block = README.split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    assert lines[0].startswith("bash scripts/setup.sh && .venv/bin/llmplay run playbooks/cpu-tiny.yaml")
    assert lines[1].startswith("bash .ci/run")
    # The test command named beside it is the one .ci/run calls after set-up.
    test_command = re.search(r"\((\.venv/bin/python -m pytest [^)]*)\)", lines[1])
    assert test_command, lines[1]
    assert test_command.group(1) in (ROOT / ".ci" / "run").read_text()
