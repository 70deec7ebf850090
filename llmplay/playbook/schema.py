"""The playbook's JSON Schema (shipped in the wheel) and the messages its violations become."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from importlib import resources
from typing import cast

import jsonschema

from llmplay.jsonvalue import as_list, as_mapping
from llmplay.playbook.problems import Problems, did_you_mean, short_repr
from llmplay.playbook.source import YamlPath


def playbook_schema() -> dict[str, object]:
    """The JSON Schema of apiVersion llmplay/v1, read from the installed package."""
    schema: dict[str, object] = json.loads(resources.files("llmplay").joinpath("schemas/playbook.v1.json").read_text())
    return schema


def _is_strict_integer(checker: object, instance: object) -> bool:
    # JSON Schema counts 4.0 as an integer; a playbook that writes `concurrency: 4.0` meant something else.
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
)


def _known_properties(schema: Mapping[str, object], root: Mapping[str, object]) -> list[str]:
    if "$ref" in schema:
        return _known_properties(_deref(str(schema["$ref"]), root), root)
    names = [str(name) for name in as_mapping(schema.get("properties"))]
    for branch in as_list(schema.get("oneOf")) + as_list(schema.get("anyOf")):
        names += _known_properties(as_mapping(branch), root)
    return names


def _deref(ref: str, root: Mapping[str, object]) -> Mapping[str, object]:
    node = root
    for part in ref.lstrip("#/").split("/"):
        node = as_mapping(node[part])
    return node


def _describe_expected(schema: Mapping[str, object], root: Mapping[str, object]) -> str:
    if "$ref" in schema:
        schema = _deref(str(schema["$ref"]), root)
    if "description" in schema:
        text = str(schema["description"]).rstrip(".")
        return text[0].lower() + text[1:]
    if "enum" in schema:
        return "one of " + ", ".join(map(str, as_list(schema["enum"])))
    if "const" in schema:
        return repr(schema["const"])
    if "type" in schema:
        kinds = as_list(schema["type"]) if isinstance(schema["type"], list) else [schema["type"]]
        return " or ".join(
            {"object": "a mapping", "array": "a list", "integer": "an integer"}.get(str(k), f"a {k}") for k in kinds
        )
    return "a value matching the schema"


def schema_problems(
    doc: dict[str, object], problems: Problems, step_properties: Mapping[str, object] | None = None
) -> None:
    """Every schema violation in `doc` as a problem: unknown keys with a suggestion, found vs expected otherwise.
    `step_properties`: the step keys registered step kinds add (playbook.step_forms), checked like the shipped ones."""
    root = playbook_schema()
    shipped_steps = as_mapping(as_mapping(as_mapping(root["$defs"]).get("step")).get("properties"))
    cast(dict[str, object], shipped_steps).update(step_properties or {})  # the parsed schema's own dict
    if _non_finite_problems(doc, (), problems):
        return  # JSON Schema has no word for NaN: `.nan` passes every bound, so nothing below may see one
    validator = _StrictValidator(root)
    for err in sorted(validator.iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.validator)):
        _add_problem(err, problems, root)


def value_problems(value: object, pointer: str, path: YamlPath, problems: Problems) -> None:
    """`value`, written at `path`, checked against the schema's definition at `pointer` (e.g. a step's
    `workload.concurrency` against `#/$defs/workload/properties/concurrency`): one rule for base and step values."""
    root = playbook_schema()
    if _non_finite_problems(value, path, problems):
        return
    validator = _StrictValidator({"$defs": root["$defs"], "$ref": pointer})
    for err in sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.absolute_path)), e.validator)):
        _add_problem(err, problems, root, path)


def option_problem(value: object, pointer: str) -> str | None:
    """Why a command-line value breaks the rule the playbook key at `pointer` obeys (`--image` against
    `#/$defs/engine/properties/image`), or None: a flag is held to the same rule as the key it overrides."""
    root = playbook_schema()
    validator = _StrictValidator({"$defs": root["$defs"], "$ref": pointer})
    error = next(iter(validator.iter_errors(value)), None)
    return None if error is None else f"found {short_repr(value)}; expected {_expected_from_error(error, root)}"


def _non_finite_problems(value: object, path: YamlPath, problems: Problems) -> bool:
    """A problem for every `.nan` or `.inf` anywhere in `value`; True when there was one."""
    found = False
    stack: list[tuple[object, YamlPath]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            problems.add(where, f"found {node}; expected a finite number")
            found = True
        elif isinstance(node, dict):
            stack.extend((v, (*where, str(k))) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(node))
    return found


def _mapping_branch_errors(
    err: jsonschema.ValidationError, root: dict[str, object]
) -> list[jsonschema.ValidationError]:
    """A mapping that fails `oneOf: [a short form, {a mapping}]` failed the mapping: its own errors say what is wrong
    (an unknown key, a wrong value) where "expected a value matching the schema" would not; a oneOf that describes
    itself keeps its own message."""
    if not isinstance(err.instance, dict) or "description" in err.schema:
        return []
    branches = [_deref(b["$ref"], root) if "$ref" in b else b for b in err.validator_value]
    mappings = [i for i, b in enumerate(branches) if b.get("type") == "object"]
    if len(mappings) != 1:
        return []
    return [e for e in err.context or () if e.relative_schema_path and e.relative_schema_path[0] == mappings[0]]


def _add_problem(
    err: jsonschema.ValidationError, problems: Problems, root: dict[str, object], prefix: YamlPath = ()
) -> None:
    path: YamlPath = (*prefix, *err.absolute_path)
    if err.validator == "oneOf" and (inner := _mapping_branch_errors(err, root)):
        for sub in inner:
            _add_problem(sub, problems, root, prefix)
        return
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = _known_properties(err.schema, root)
        for key in sorted(set(err.instance) - set(known), key=str):
            problems.add(
                (*path, str(key)),
                f"unknown key '{key}'{did_you_mean(str(key), known)}; expected one of: {', '.join(sorted(known))}",
            )
    elif err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        problems.add(path, f"missing required key '{missing}'")
    elif err.validator == "oneOf":
        problems.add(path, f"found {short_repr(err.instance)}; expected {_describe_expected(err.schema, root)}")
    elif err.validator in ("enum", "const") and path and path[-1] in ("kind", "apiVersion", "api", "arrival"):
        choices = err.validator_value if err.validator == "enum" else [err.validator_value]
        problems.add(
            path,
            f"found {short_repr(err.instance)}; expected one of: {', '.join(map(str, choices))}"
            f"{did_you_mean(str(err.instance), map(str, choices))}",
        )
    else:
        problems.add(path, f"found {short_repr(err.instance)}; expected {_expected_from_error(err, root)}")


def _expected_from_error(err: jsonschema.ValidationError, root: dict[str, object]) -> str:
    v, value = err.validator, err.validator_value
    if v == "type":
        return _describe_expected({"type": value}, root)
    if v in ("minimum", "exclusiveMinimum"):
        return f"a number {'>=' if v == 'minimum' else '>'} {value}"
    if v in ("maximum", "exclusiveMaximum"):
        return f"a number {'<=' if v == 'maximum' else '<'} {value}"
    if v == "pattern":
        return _describe_expected(err.schema, root) if "description" in err.schema else f"text matching {value}"
    if v == "enum":
        return "one of " + ", ".join(map(str, value))
    if v == "const":
        return repr(value)
    if v in ("minItems", "minLength", "minProperties"):
        return f"at least {value} item(s)" if v != "minLength" else "a non-empty string"
    return str(err.message)
