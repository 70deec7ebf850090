"""Every playbook key the README and docs/ name is one the schema accepts: the YAML examples validate, every dotted
key path (`workload.num_requests`) resolves, and the reference table names each row's own keys bare and any other
key with its path (the README once listed `num_requests` under `workload.trace`, which refuses it)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from llmplay.catalog import metric_info
from llmplay.playbook.schema import playbook_schema

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCHEMA = playbook_schema()
MANIFEST_SCHEMA = json.loads((ROOT / "llmplay" / "schemas" / "manifest.v1.json").read_text())
TOP_KEYS = set(SCHEMA["properties"])
COMMANDS = {"validate", "plan", "run", "capacity", "bench", "report", "compare", "retest", "history", "ls", "site"}
# Bare words in a reference row that name another key on purpose, as its own syntax writes it: a step's `set`
# targets are written as the step writes them (`set: {image: ...}`).
BARE_ELSEWHERE = {("steps[]", "image"), ("steps[]", "gpus"), ("steps[]", "extra_args"), ("steps[]", "model")}


def _deref(node: Any, root: dict[str, Any] = SCHEMA) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        target: Any = root
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _branches(node: Any, root: dict[str, Any]) -> list[dict[str, Any]]:
    node = _deref(node, root)
    if not isinstance(node, dict):
        return []
    return [node, *(b for key in ("oneOf", "anyOf", "allOf") for x in node.get(key, ()) for b in _branches(x, root))]


def resolve(path: str, root: dict[str, Any] = SCHEMA) -> list[Any]:
    """The schema nodes a key path names (`steps[].set`, `engine.env.NAME`); empty when the schema refuses it."""
    nodes: list[Any] = [root]
    for part in re.findall(r"[^.\[\]]+|\[\]", path):
        found = []
        for branch in (b for n in nodes for b in _branches(n, root)):
            if part == "[]":
                found += [branch["items"]] if "items" in branch else []
            elif part in branch.get("properties", {}):
                found.append(branch["properties"][part])
            elif part.isupper() and (branch.get("properties") or isinstance(branch.get("additionalProperties"), dict)):
                found.append(branch)  # a placeholder (FIELD, NAME): any key of this object
            elif isinstance(branch.get("additionalProperties"), dict):
                found.append(branch["additionalProperties"])
        nodes = found
        if not nodes:
            return []
    return nodes


def words_under(node: Any) -> tuple[set[str], set[str]]:
    """Every property name and every enum or const value in the schema below `node`."""
    props: set[str] = set()
    values: set[str] = set()
    stack, seen = [node], 0
    while stack and seen < 10_000:
        seen += 1
        item = _deref(stack.pop())
        if not isinstance(item, dict):
            continue
        props |= set(item.get("properties", {}))
        values |= {str(v) for v in item.get("enum", ())} | ({str(item["const"])} if "const" in item else set())
        stack += list(item.get("properties", {}).values())
        stack += [item[k] for k in ("items", "additionalProperties") if isinstance(item.get(k), dict)]
        stack += [b for k in ("oneOf", "anyOf", "allOf") for b in item.get(k, ())]
    return props, values


ALL_PROPS = words_under(SCHEMA)[0]


def code_blocks(text: str, lang: str) -> Iterator[tuple[int, str]]:
    for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.M | re.S):
        yield text[: m.start()].count("\n") + 1, m.group(1)


def yaml_examples() -> Iterator[tuple[str, Any]]:
    for doc in DOCS:
        for line, block in code_blocks(doc.read_text(), "ya?ml"):
            yield f"{doc.relative_to(ROOT)}:{line}", yaml.safe_load(block)


def _merged(base: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in fragment.items():
        out[key] = _merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
    return out


MINIMAL = {
    "apiVersion": "llmplay/v1",
    "kind": "Playbook",
    "metadata": {"name": "docs"},
    "workload": {"duration": "10s", "concurrency": 1},
    "engine": {"kind": "llamacpp", "model": "/models/tiny.gguf"},
}


@pytest.mark.parametrize(("where", "example"), list(yaml_examples()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_yaml_example_validates_against_the_schema(where, example):
    assert isinstance(example, dict) and set(example) <= TOP_KEYS, f"{where}: not a playbook or a part of one"
    document = example if "apiVersion" in example else _merged(MINIMAL, example)
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(document)
    ]
    assert errors == [], f"{where}: {errors}"


def dotted_keys() -> Iterator[tuple[str, str]]:
    """Each `a.b` in backticks whose first part is a top-level playbook key, alternatives (`a|b`) apart."""
    for doc in DOCS:
        for m in re.finditer(
            r"`((?:" + "|".join(sorted(TOP_KEYS)) + r")(?:\[\])?\.[A-Za-z0-9_.*|\[\]]+)`", doc.read_text()
        ):
            head, _, tail = m.group(1).rpartition(".")
            for alternative in tail.split("|"):
                yield f"{doc.relative_to(ROOT)}", f"{head}.{alternative}"


def test_every_dotted_key_the_docs_name_is_in_the_schema():
    unresolved = []
    for where, path in dotted_keys():
        if path.endswith((".yaml", ".yml", ".json")):
            continue  # a file named after a key (`tuned.yaml`), not a key
        if metric_info(path) is not None or path.endswith(".*"):
            continue  # a metric path (`cost.usd_per_1m_tokens`, `engine.preemptions`), or "any field of"
        module = ROOT / "llmplay" / Path(*path.split(".")[:-1]).with_suffix(".py")
        if module.is_file() or resolve(path, MANIFEST_SCHEMA):
            continue  # a function's module path (`runtime.docker.judge`), or a key of the run's manifest
        if not resolve(path):
            unresolved.append(f"{where}: {path}")
    assert unresolved == []
    assert resolve("workload.num_requests") and not resolve("workload.trace.num_requests")


def reference_rows() -> Iterator[tuple[list[str], str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index("### Reference (every key of the schema)")
    table = text[start : text.index("\n\n", text.index("| --- |", start))]
    for line in table.splitlines()[3:]:
        key_cell, _, meaning = line.strip("|").partition(" | ")
        yield re.findall(r"`([^`]+)`", key_cell), meaning


def test_the_reference_table_names_other_keys_with_their_path():
    misplaced = []
    rows = list(reference_rows())
    assert len(rows) > 40
    for keys, meaning in rows:
        own_props: set[str] = set()
        own_values: set[str] = set()
        for key in keys:
            nodes = resolve(key)
            assert nodes, f"reference row `{key}`: not in the schema"
            for node in nodes:
                props, values = words_under(node)
                own_props |= props | {key.rsplit(".", 1)[-1].removesuffix("[]")}
                own_values |= values
        for word in sorted(set(re.findall(r"`([a-z_]+)`", meaning))):
            elsewhere = word in ALL_PROPS and word not in own_props | own_values | TOP_KEYS | COMMANDS
            if elsewhere and (keys[0], word) not in BARE_ELSEWHERE:
                misplaced.append(f"row `{keys[0]}`: `{word}` is not a key of it; write the key with its path")
    assert misplaced == []
