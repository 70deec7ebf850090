"""Loading a playbook: safe YAML with line numbers, `extends:` merging, schema validation, typed result.

Every problem becomes a `PlaybookError` whose lines read
`FILE:LINE: YAML.PATH: found X, expected Y (did you mean Z?)`.
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema
import yaml

from llmplay import units
from llmplay.catalog import METRICS, metric_info
from llmplay.errors import PlaybookError
from llmplay.secrets import ENV_REF, SECRET_NAME
from llmplay.spec import (
    Change, Cost, EngineSpec, Gate, Goals, Guard, LengthDist, Metadata, Objective, Playbook,
    RuntimeSpec, Step, Trials, Workload, frozen_map,
)

API_VERSION = "llmplay/v1"
MAX_FILE_BYTES = 1 << 20
MAX_EXPANDED_NODES = 100_000  # aliases may not multiply a document past this (billion laughs)
MAX_EXTENDS_DEPTH = 16
ENGINE_FIELDS_SETTABLE = {"image", "gpus", "extra_args"}

YamlPath = tuple[str | int, ...]


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.$-]+$")


_LINE_BREAKS = {ord(c): c.encode("unicode_escape").decode() for c in "\n\r\t\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
    """Messages are one line each: line breaks inside untrusted keys or values are shown escaped."""
    return text.translate(_LINE_BREAKS)


def format_path(path: YamlPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, str) and not _PLAIN_KEY.match(part):
            part = one_line(repr(part))
            out += f"[{part}]"
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


@dataclass(frozen=True)
class Located:
    """Where a YAML path was written: the file and the 1-based line."""

    file: str
    line: int


class SourceMap:
    """YAML path -> where it was written, kept across `extends:` merges."""

    def __init__(self, entries: dict[YamlPath, Located] | None = None):
        self.entries = dict(entries or {})

    def overlay(self, other: "SourceMap") -> "SourceMap":
        merged = dict(self.entries)
        merged.update(other.entries)
        return SourceMap(merged)

    def locate(self, path: YamlPath) -> Located:
        for cut in range(len(path), -1, -1):
            hit = self.entries.get(tuple(path[:cut]))
            if hit:
                return hit
        return Located("?", 0)


class Problems:
    """Collects every problem found so the user fixes them in one pass, not one per run."""

    def __init__(self, sources: SourceMap, display_file: str):
        self.sources, self.display_file, self.lines = sources, display_file, []

    def add(self, path: YamlPath, problem: str, *, key_line: bool = False) -> None:
        where = self.sources.locate(path)
        file = _display(where.file) if where.file != "?" else self.display_file
        self.lines.append(f"{file}:{where.line}: {format_path(path)}: {one_line(problem)}")

    def raise_if_any(self) -> None:
        if self.lines:
            raise PlaybookError("\n".join(dict.fromkeys(self.lines)))


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("../..") else path
    except ValueError:
        return path


# ---------------------------------------------------------------- YAML with lines

def _fail(file: str, line: int, message: str) -> PlaybookError:
    return PlaybookError(f"{_display(file)}:{line}: {one_line(message)}")


def _check_nodes(node: yaml.Node, file: str) -> None:
    """Duplicate keys and alias blow-up are found on the node graph, before anything is built."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:  # iterative post-order: deep nesting must not hit Python's recursion limit here
        current, done = stack.pop()
        key = id(current)
        if key in sizes and not done:
            continue
        if isinstance(current, yaml.MappingNode):
            children = [n for pair in current.value for n in pair]
        elif isinstance(current, yaml.SequenceNode):
            children = list(current.value)
        else:
            children = []
        if not done:
            if isinstance(current, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for k, _ in current.value:
                    if isinstance(k, yaml.ScalarNode):
                        if k.value in seen:
                            raise _fail(file, k.start_mark.line + 1,
                                        f"duplicate key '{k.value}' (first at line {seen[k.value]}); "
                                        "expected each key once")
                        seen[k.value] = k.start_mark.line + 1
            stack.append((current, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
        else:
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[key] > MAX_EXPANDED_NODES:
                raise _fail(file, current.start_mark.line + 1,
                            f"document expands to more than {MAX_EXPANDED_NODES} nodes through aliases; "
                            "expected a plain playbook (no alias bombs)")


def _line_map(node: yaml.Node, file: str) -> SourceMap:
    entries: dict[YamlPath, Located] = {}
    stack: list[tuple[yaml.Node, YamlPath]] = [(node, ())]
    visited: set[tuple[int, YamlPath]] = set()
    while stack:
        current, path = stack.pop()
        if (id(current), path) in visited or len(entries) > MAX_EXPANDED_NODES:
            continue
        visited.add((id(current), path))
        entries.setdefault(path, Located(file, current.start_mark.line + 1))
        if isinstance(current, yaml.MappingNode):
            for k, v in current.value:
                child = path + (str(k.value),)
                entries[child] = Located(file, k.start_mark.line + 1)
                stack.append((v, child))
        elif isinstance(current, yaml.SequenceNode):
            for i, v in enumerate(current.value):
                entries[path + (i,)] = Located(file, v.start_mark.line + 1)
                stack.append((v, path + (i,)))
    return SourceMap(entries)


def read_yaml(path: Path) -> tuple[Any, SourceMap, str]:
    """Safe-load one file; returns (data, line map, text)."""
    file = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PlaybookError(f"{_display(file)}: no such file; expected a playbook YAML file") from None
    except OSError as exc:
        raise PlaybookError(f"{_display(file)}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise PlaybookError(f"{_display(file)}: file is {len(raw)} bytes; expected at most {MAX_FILE_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlaybookError(f"{_display(file)}: not UTF-8 text (byte {exc.start}); expected a YAML file") from None
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # the reader rejects control characters already here
        node = loader.get_single_node()
        if node is None:
            raise PlaybookError(f"{_display(file)}:1: the file is empty; expected a playbook mapping "
                                f"starting with 'apiVersion: {API_VERSION}'")
        _check_nodes(node, file)
        data = loader.construct_document(node)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise _fail(file, line, f"unsupported YAML tag ({exc.problem}); expected plain YAML: no tags, no code") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise _fail(file, line, f"YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise PlaybookError(f"{_display(file)}: YAML error: {one_line(str(exc))}") from None
    except RecursionError:
        raise PlaybookError(f"{_display(file)}: nesting is too deep; expected a plain playbook") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, _line_map(node, file), text


# ---------------------------------------------------------------- extends

def deep_merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else in the override replaces the base."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = deep_merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(override)


def _resolve_extends(path: Path, root_dir: Path, allow_outside: bool, chain: tuple[Path, ...]
                     ) -> tuple[dict, SourceMap]:
    data, sources, _ = read_yaml(path)
    if not isinstance(data, dict):
        raise _fail(str(path), 1, f"found a {type(data).__name__}; expected a mapping with "
                                  f"apiVersion, kind, metadata, engine, workload")
    parent = data.get("extends")
    if parent is None:
        return data, sources
    where = sources.locate(("extends",))
    if not isinstance(parent, str) or not parent:
        raise _fail(str(path), where.line, f"extends: found {parent!r}; expected a relative path to a base playbook")
    target = (path.parent / parent).resolve()
    if not allow_outside and not target.is_relative_to(root_dir):
        raise _fail(str(path), where.line,
                    f"extends: '{parent}' points outside {_display(str(root_dir))}; expected a base inside the "
                    "playbook's directory tree (pass --allow-outside-extends to permit it)")
    if target in chain:
        cycle = " -> ".join(_display(str(p)) for p in chain + (target,))
        raise _fail(str(path), where.line, f"extends: cycle {cycle}; expected a chain that ends in a base")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise _fail(str(path), where.line, f"extends: chain longer than {MAX_EXTENDS_DEPTH}")
    if not target.is_file():
        raise _fail(str(path), where.line, f"extends: '{parent}' does not exist (looked for {_display(str(target))})")
    base, base_sources = _resolve_extends(target, root_dir, allow_outside, chain + (target,))
    base.pop("extends", None)
    merged = deep_merge(base, {k: v for k, v in data.items() if k != "extends"})
    merged["extends"] = parent
    return merged, base_sources.overlay(sources)


# ---------------------------------------------------------------- schema

def _schema() -> dict:
    return json.loads(resources.files("llmplay").joinpath("schemas/playbook.v1.json").read_text())


def _is_strict_integer(checker: object, instance: object) -> bool:  # noqa: ARG001
    # JSON Schema counts 4.0 as an integer; a playbook that writes `concurrency: 4.0` meant something else.
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
)


def _known_properties(schema: dict, root: dict) -> list[str]:
    if "$ref" in schema:
        return _known_properties(_deref(schema["$ref"], root), root)
    names = list(schema.get("properties", {}))
    for branch in schema.get("oneOf", []) + schema.get("anyOf", []):
        names += _known_properties(branch, root)
    return names


def _deref(ref: str, root: dict) -> dict:
    node: Any = root
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return node


def _describe_expected(schema: dict, root: dict) -> str:
    if "$ref" in schema:
        schema = _deref(schema["$ref"], root)
    if "description" in schema:
        text = schema["description"].rstrip(".")
        return text[0].lower() + text[1:]
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    if "const" in schema:
        return repr(schema["const"])
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return " or ".join({"object": "a mapping", "array": "a list", "integer": "an integer"}.get(k, f"a {k}") for k in kinds)
    return "a value matching the schema"


def _hint(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _schema_problems(doc: dict, problems: Problems) -> None:
    root = _schema()
    validator = _StrictValidator(root)
    for err in sorted(validator.iter_errors(doc), key=lambda e: (list(map(str, e.absolute_path)), e.validator)):
        path: YamlPath = tuple(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = _known_properties(err.schema, root)
            for key in sorted(set(err.instance) - set(known), key=str):
                problems.add(path + (str(key),), f"unknown key '{key}'{_hint(str(key), known)}; "
                                                  f"expected one of: {', '.join(sorted(known))}")
        elif err.validator == "required":
            missing = err.message.split("'")[1] if "'" in err.message else err.message
            problems.add(path, f"missing required key '{missing}'")
        elif err.validator == "oneOf":
            problems.add(path, f"found {_short(err.instance)}; expected {_describe_expected(err.schema, root)}")
        elif err.validator in ("enum", "const") and path and path[-1] in ("kind", "apiVersion", "api", "arrival"):
            choices = err.validator_value if err.validator == "enum" else [err.validator_value]
            problems.add(path, f"found {_short(err.instance)}; expected one of: {', '.join(map(str, choices))}"
                               f"{_hint(str(err.instance), map(str, choices))}")
        else:
            problems.add(path, f"found {_short(err.instance)}; expected {_expected_from_error(err, root)}")


def _expected_from_error(err: jsonschema.ValidationError, root: dict) -> str:
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
    return err.message


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- semantic checks + conversion

def _parse_gate(raw: Any, path: YamlPath, problems: Problems) -> Gate | None:
    if isinstance(raw, str):
        m = re.match(r"^\s*([a-z_0-9]+\.[a-z_0-9]+)\s*(<=|>=|<|>)\s*(\S+)\s*$", raw)
        if not m:
            problems.add(path, f"found {raw!r}; expected 'metric op value' like 'ttft.p95 < 500ms'")
            return None
        metric, op, value_text = m.groups()
        text = raw.strip()
    else:
        metric, op, value_text = raw["metric"], raw["op"], raw["value"]
        text = f"{metric} {op} {value_text}"
    info = metric_info(metric)
    if info is None:
        problems.add(path, f"unknown metric '{metric}'{_hint(metric, METRICS)}; expected one of: "
                           "ttft.p95, tpot.p95, itl.p99, e2el.p95, throughput.output_tok_s, throughput.req_s, "
                           "goodput.req_s, cost.usd_per_1m_tokens, memory.peak_frac, errors.rate (and other stats)")
        return None
    try:
        value = info.parse_value(value_text)
    except units.UnitError as exc:
        problems.add(path, f"{metric}: found {exc.found!r}, expected {exc.expected}")
        return None
    return Gate(metric, op, value, text)


def _length(raw: Any, path: YamlPath, problems: Problems) -> LengthDist:
    if isinstance(raw, int):
        return LengthDist("fixed", value=raw)
    (kind, params), = raw.items()
    if kind == "fixed":
        return LengthDist("fixed", value=params)
    if kind == "choice":
        values, weights = tuple(params["values"]), tuple(params.get("weights", ()))
        if weights and len(weights) != len(values):
            problems.add(path + ("choice", "weights"),
                         f"found {len(weights)} weights for {len(values)} values; expected one weight per value")
        if weights and sum(weights) <= 0:
            problems.add(path + ("choice", "weights"), "weights sum to 0; expected a positive sum")
        return LengthDist("choice", values=values, weights=weights)
    lo, hi = params.get("min"), params.get("max")
    if lo is not None and hi is not None and lo > hi:
        problems.add(path + (kind, "min"), f"min {lo} is greater than max {hi}; expected min <= max")
    return LengthDist(kind, min=lo, max=hi, mean=params.get("mean"),
                      std=params.get("std", params.get("sigma")))


def _duration(section: Mapping, key: str, path: YamlPath, problems: Problems, default: float | None) -> float | None:
    if key not in section:
        return default
    try:
        return units.parse_duration_s(section[key])
    except units.UnitError as exc:
        problems.add(path + (key,), str(exc))
        return default


def _workload(raw: Mapping, base_dir: Path, path: YamlPath, problems: Problems) -> Workload:
    if raw.get("concurrency") is not None and raw.get("rate") is not None:
        problems.add(path + ("rate",), "both concurrency and rate are set; expected one: concurrency (closed loop) "
                                       "or rate (open loop, req/s)")
    if raw.get("concurrency") is None and raw.get("rate") is None:
        problems.add(path, "no load given; expected concurrency: N (closed loop) or rate: R req/s (open loop)")
    if raw.get("duration") is None and raw.get("num_requests") is None:
        problems.add(path, "no length given; expected duration: 60s or num_requests: N")
    if "arrival" in raw and raw.get("rate") is None:
        problems.add(path + ("arrival",), "arrival applies to open-loop load; expected rate: R alongside it")
    dataset = raw.get("dataset")
    if dataset is not None:
        resolved = (base_dir / dataset).resolve()
        if not resolved.is_file():
            problems.add(path + ("dataset",), f"dataset '{dataset}' not found (looked for {_display(str(resolved))}); "
                                              "expected a JSONL file")
        dataset = str(resolved)
    defaults = Workload()
    return Workload(
        api=raw.get("api", defaults.api),
        input=_length(raw["input"], path + ("input",), problems) if "input" in raw else defaults.input,
        output=_length(raw["output"], path + ("output",), problems) if "output" in raw else defaults.output,
        dataset=dataset,
        prefix_tokens=raw.get("prefix_tokens", 0),
        prefix_groups=raw.get("prefix_groups", 1),
        turns=raw.get("turns", 1),
        concurrency=raw.get("concurrency"),
        rate=raw.get("rate"),
        arrival=raw.get("arrival", "poisson"),
        burst=raw.get("burst", 1),
        sweep=tuple(raw.get("sweep", ())),
        streaming_fraction=raw.get("streaming_fraction", 1.0),
        max_tokens=raw.get("max_tokens"),
        ignore_eos=raw.get("ignore_eos", True),
        temperature=raw.get("temperature", 0.0),
        seed=raw.get("seed", 0),
        warmup_s=_duration(raw, "warmup", path, problems, 0.0) or 0.0,
        warmup_requests=raw.get("warmup_requests", 0),
        duration_s=_duration(raw, "duration", path, problems, None),
        num_requests=raw.get("num_requests"),
        request_timeout_s=_duration(raw, "request_timeout", path, problems, 120.0) or 120.0,
    )


def _engine(raw: Mapping, base_dir: Path, path: YamlPath, problems: Problems) -> EngineSpec:
    env = {str(k): str(v) if not isinstance(v, bool) else str(v).lower() for k, v in raw.get("env", {}).items()}
    for name, value in env.items():
        if SECRET_NAME.search(name) and not ENV_REF.fullmatch(value):
            problems.add(path + ("env", name), f"'{name}' looks like a secret written in the playbook; expected a "
                                               f"reference like ${{env:{name}}} so the value never enters the file")
    gpus_raw = raw.get("gpus", 0)
    gpus: int | tuple[str, ...] = tuple(str(g) for g in gpus_raw) if isinstance(gpus_raw, list) else gpus_raw
    health = raw.get("health", {})
    model_dir = raw.get("model_dir")
    if model_dir is not None:
        model_dir = str((base_dir / os.path.expanduser(model_dir)).resolve())
    return EngineSpec(
        kind=raw["kind"], model=raw["model"], image=raw.get("image"), model_dir=model_dir,
        served_model_name=raw.get("served_model_name"), gpus=gpus,
        args=frozen_map(raw.get("args", {})), extra_args=tuple(raw.get("extra_args", ())),
        env=frozen_map(env), port=raw.get("port"), health_path=health.get("path"),
        health_timeout_s=_duration(health, "timeout", path + ("health",), problems, 600.0) or 600.0,
        shm_size=raw.get("shm_size"), ipc_mode=raw.get("ipc"),
        network_mode=raw.get("network") if raw.get("network") == "host" else None,
        executable=raw.get("executable"),
    )


WORKLOAD_FIELDS = {"concurrency", "rate", "max_tokens", "streaming_fraction", "prefix_tokens", "prefix_groups",
                   "turns", "arrival", "burst", "temperature", "api"}


def _steps(raw: list, path: YamlPath, problems: Problems) -> tuple[Step, ...]:
    steps, names = [], set()
    for i, item in enumerate(raw):
        spath = path + (i,)
        if item["name"] in names:
            problems.add(spath + ("name",), f"step name '{item['name']}' is used twice; expected unique names")
        names.add(item["name"])
        changes = []
        for key, value in item["set"].items():
            key = str(key)
            if key in ENGINE_FIELDS_SETTABLE or key.startswith("env."):
                target = key
            elif key.startswith("workload."):
                field_name = key.split(".", 1)[1]
                if field_name not in WORKLOAD_FIELDS:
                    problems.add(spath + ("set", key), f"workload field '{field_name}' cannot be a step"
                                 f"{_hint(field_name, WORKLOAD_FIELDS)}; expected one of: {', '.join(sorted(WORKLOAD_FIELDS))}")
                target = key
            elif key.startswith("args."):
                target = key
            else:
                target = f"args.{key}"
            changes.append(Change(target, value))
        if not changes:
            problems.add(spath + ("set",), "the step changes nothing; expected exactly one knob, e.g. set: {prefix_caching: true}")
        elif len(changes) > 1 and not item.get("bundle", False):
            problems.add(spath + ("set",), f"the step changes {len(changes)} knobs ({', '.join(c.target for c in changes)}); "
                                           "expected one variable per step, or bundle: true to declare a bundle")
        steps.append(Step(name=item["name"], changes=tuple(changes), bundle=item.get("bundle", False),
                          carry=item.get("carry", "if_kept"), description=item.get("description", ""),
                          line=problems.sources.locate(spath).line))
    return tuple(steps)


def _goals(raw: Mapping, problems: Problems) -> Goals:
    path: YamlPath = ("goals",)
    gates = tuple(g for i, r in enumerate(raw.get("gates", ())) if (g := _parse_gate(r, path + ("gates", i), problems)))
    obj_raw = raw.get("objective", {"minimize": "ttft.p95"})
    directions = [d for d in ("minimize", "maximize") if d in obj_raw]
    if len(directions) != 1:
        problems.add(path + ("objective",), f"found {len(directions)} directions; expected exactly one of minimize or maximize")
        directions = directions or ["minimize"]
    direction = directions[0]
    metric = obj_raw.get(direction, "ttft.p95")
    min_effect = 0.02
    if "min_effect" in obj_raw:
        try:
            min_effect = units.parse_fraction(obj_raw["min_effect"])
        except units.UnitError as exc:
            problems.add(path + ("objective", "min_effect"), str(exc))
    info = metric_info(metric)
    if info and (direction == "minimize") != info.lower_is_better:
        problems.add(path + ("objective", direction), f"{direction} {metric} optimizes the wrong way; expected "
                     f"{'minimize' if info.lower_is_better else 'maximize'} for {metric}")
    guards = []
    for i, g in enumerate(raw.get("guards", ())):
        ginfo = metric_info(g["metric"])
        tol = 0.05
        if "tolerance" in g:
            try:
                tol = units.parse_fraction(g["tolerance"])
            except units.UnitError as exc:
                problems.add(path + ("guards", i, "tolerance"), str(exc))
        guards.append(Guard(g["metric"], tol, "minimize" if (ginfo is None or ginfo.lower_is_better) else "maximize"))
    slo = {}
    for key, value in raw.get("slo", {}).items():
        slo[key] = units.parse_duration_s(value)
    return Goals(gates=gates, objective=Objective(direction, metric, min_effect), guards=tuple(guards),
                 slo_s=frozen_map(slo))


def _trials(raw: Mapping, problems: Problems) -> Trials:
    d = Trials()
    t = Trials(
        repeats=raw.get("repeats", d.repeats), interleave=raw.get("interleave", d.interleave),
        sequential=raw.get("sequential", d.sequential), max_repeats=raw.get("max_repeats", d.max_repeats),
        confidence=raw.get("confidence", d.confidence), bootstrap_samples=raw.get("bootstrap_samples", d.bootstrap_samples),
        on_failure=raw.get("on_failure", d.on_failure),
        cooldown_s=_duration(raw, "cooldown", ("trials",), problems, 0.0) or 0.0,
    )
    if t.max_repeats < t.repeats:
        problems.add(("trials", "max_repeats"), f"max_repeats {t.max_repeats} < repeats {t.repeats}; expected max_repeats >= repeats")
    return t


def _cost(raw: Mapping, problems: Problems) -> Cost:
    values = {}
    for key in ("gpu_usd_per_hour", "host_usd_per_hour"):
        if key in raw:
            try:
                values[key] = units.parse_money_usd(raw[key])
            except units.UnitError as exc:
                problems.add(("cost", key), str(exc))
    return Cost(**values)


def _runtime(raw: Any, problems: Problems) -> RuntimeSpec:
    if raw is None:
        return RuntimeSpec()
    if isinstance(raw, str):
        raw = {"kind": raw}
    if raw["kind"] == "endpoint" and not raw.get("url"):
        problems.add(("runtime",), "runtime endpoint needs url: http://HOST:PORT of the running engine")
    return RuntimeSpec(kind=raw["kind"], url=raw.get("url"), docker_host=raw.get("docker_host"))


def _check_api_version(doc: dict, problems: Problems) -> None:
    found = doc.get("apiVersion")
    if found != API_VERSION:
        hint = (" — this llmplay reads llmplay/v1 only; upgrade llmplay for newer formats"
                if isinstance(found, str) and found.startswith("llmplay/") else
                f" — add 'apiVersion: {API_VERSION}' as the first line")
        problems.add(("apiVersion",), f"found {found!r}; expected '{API_VERSION}'{hint}")
        problems.raise_if_any()


def load_playbook(path: str | os.PathLike, *, allow_outside_extends: bool = False) -> Playbook:
    """The one loader: CLI, runner, retest and tests all come through here."""
    file = Path(path).absolute()
    root_dir = file.parent.resolve()
    doc, sources = _resolve_extends(file, root_dir, allow_outside_extends, (file.resolve(),))
    text = file.read_text(encoding="utf-8")
    problems = Problems(sources, _display(str(file)))
    _check_api_version(doc, problems)
    _schema_problems(doc, problems)
    problems.raise_if_any()
    base_dir = file.parent
    metadata = doc["metadata"]
    playbook = Playbook(
        path=str(file), text=text, sha256=hashlib.sha256(text.encode()).hexdigest(), api_version=doc["apiVersion"],
        metadata=Metadata(name=metadata["name"], version=str(metadata.get("version", "0")),
                          owner=metadata.get("owner", ""), description=metadata.get("description", ""),
                          tags=tuple(metadata.get("tags", ()))),
        goals=_goals(doc.get("goals", {}), problems),
        workload=_workload(doc["workload"], base_dir, ("workload",), problems),
        engine=_engine(doc["engine"], base_dir, ("engine",), problems),
        steps=_steps(doc.get("steps", []), ("steps",), problems),
        trials=_trials(doc.get("trials", {}), problems),
        cost=_cost(doc.get("cost", {}), problems),
        runtime=_runtime(doc.get("runtime"), problems),
        resolved=frozen_map(doc),
    )
    problems.raise_if_any()
    # Knob names depend on the engine kind; the check lives with the plan, which knows the adapters.
    from llmplay.plan import check_playbook_knobs
    check_playbook_knobs(playbook, sources)
    return playbook


def load_workload(path: str | os.PathLike) -> tuple[Workload, Goals]:
    """`llmplay bench --workload FILE`: a whole playbook, or a file holding just a workload mapping."""
    file = Path(path).absolute()
    data, sources, _ = read_yaml(file)
    if isinstance(data, dict) and "apiVersion" in data:
        pb = load_playbook(file)
        return pb.workload, pb.goals
    problems = Problems(sources, _display(str(file)))
    if not isinstance(data, dict):
        raise _fail(str(file), 1, f"found {type(data).__name__}; expected a playbook or a workload mapping")
    doc = data.get("workload", data)
    wrapper = {"apiVersion": API_VERSION, "kind": "Playbook", "metadata": {"name": "bench"},
               "engine": {"kind": "vllm", "model": "x"}, "workload": doc}
    _schema_problems(wrapper, problems)
    problems.raise_if_any()
    workload = _workload(doc, file.parent, ("workload",) if "workload" in data else (), problems)
    problems.raise_if_any()
    return workload, Goals()
