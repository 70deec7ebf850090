"""A step's `search:` form: one knob and its candidate values (a list, or an integer range), checked at the edge.

The knob's name and each value's type are checked against the engine with every other knob (playbook.knobs); here:
the step's shape (search or set, never both), the list (not empty, more than one value, one kind of value, no
repeats, at most max_candidates), the range (integers, a positive step, not more values than max_candidates), and
each value by the rule the same key obeys in a `set:`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from types import MappingProxyType
from typing import cast

from llmplay.jsonvalue import as_mapping
from llmplay.playbook.credentials import check_env_value, check_knob_value
from llmplay.playbook.document import StepDoc
from llmplay.playbook.problems import Problems, did_you_mean, short_repr
from llmplay.playbook.schema import value_problems
from llmplay.playbook.source import SourceMap, YamlPath
from llmplay.spec import Scalar, SearchSpace, Step

# A search is a race among its values; past this many the race costs more than a person would knowingly spend.
DEFAULT_MAX_CANDIDATES = 16
RANGE_KEYS = ("from", "to", "by")


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _range_values(raw: Mapping[str, object], path: YamlPath, limit: int, problems: Problems) -> list[Scalar] | None:
    unknown = [str(k) for k in raw if k not in RANGE_KEYS]
    for key in unknown:
        problems.add((*path, key), f"unknown key '{key}'{did_you_mean(key, RANGE_KEYS)}; expected from, to, by")
    bounds = {}
    for key, default in (("from", None), ("to", None), ("by", 1)):
        value = raw.get(key, default)
        if value is None:
            problems.add(path, f"a range needs '{key}'; expected {{from: 8, to: 128, by: 8}}")
        elif isinstance(value, bool) or not isinstance(value, int):
            problems.add((*path, key), f"found {short_repr(value)}; expected an integer (a range is for integer knobs)")
        else:
            bounds[key] = value
    if unknown or len(bounds) < 3:
        return None
    start, stop, step = bounds["from"], bounds["to"], bounds["by"]
    if step < 1:
        problems.add((*path, "by"), f"found {step}; expected a step of at least 1")
        return None
    if stop <= start:
        problems.add((*path, "to"), f"found to {stop} with from {start}; expected to above from")
        return None
    count = (stop - start) // step + 1
    if count > limit:
        problems.add(
            path,
            f"the range has {count} values; expected at most {limit} (max_candidates): a larger step, a narrower "
            "range, or a higher max_candidates",
        )
        return None
    if count < 2:
        problems.add(path, f"the range has one value ({start}); expected at least two to search, or set: for one")
        return None
    return list(range(start, stop + 1, step))


def _list_values(raw: list[object], path: YamlPath, limit: int, problems: Problems) -> list[Scalar] | None:
    if not raw:
        problems.add(path, "found an empty list; expected at least two values to search")
        return None
    if len(raw) == 1:
        problems.add(
            path, f"found one value ({short_repr(raw[0])}); expected at least two to search, or set: for one value"
        )
        return None
    if len(raw) > limit:
        problems.add(path, f"found {len(raw)} values; expected at most {limit} (max_candidates)")
        return None
    ok = True
    kinds = {_kind(v) for v in raw}
    if len(kinds) > 1:
        problems.add(path, f"found values of several kinds ({', '.join(sorted(kinds))}); expected one kind")
        ok = False
    for j, value in enumerate(raw):
        if isinstance(value, (list, dict)):
            problems.add(
                (*path, j), f"found {short_repr(value)}; expected a single value (a number, string or boolean)"
            )
            ok = False
        elif value in raw[:j]:
            problems.add((*path, j), f"found {short_repr(value)} twice; expected each value once")
            ok = False
    return [cast(Scalar, value) for value in raw] if ok else None  # each one checked above


def _target(key: str, path: YamlPath, workload_fields: Collection[str], problems: Problems) -> str | None:
    """The Change target a searched key names: an engine knob, env.NAME or workload.FIELD."""
    if key.startswith("workload."):
        field_name = key.split(".", 1)[1]
        if field_name not in workload_fields:
            problems.add(
                path,
                f"workload field '{field_name}' cannot be searched{did_you_mean(field_name, workload_fields)}; "
                f"expected one of: {', '.join(sorted(workload_fields))}",
            )
            return None
        return key
    if key.startswith("env."):
        return key
    if key in ("image", "gpus", "extra_args"):
        problems.add(path, f"'{key}' cannot be searched; expected an engine knob, env.NAME or workload.FIELD")
        return None
    return key if key.startswith("args.") else f"args.{key}"


def _check_value(target: str, value: Scalar, path: YamlPath, problems: Problems) -> None:
    """Each value by the rule the same key obeys in a step's `set:`."""
    if target.startswith("workload."):
        value_problems(value, f"#/$defs/workload/properties/{target.split('.', 1)[1]}", path, problems)
    elif target.startswith("env."):
        value_problems(value, "#/$defs/engine/properties/env/additionalProperties", path, problems)
        check_env_value(target.removeprefix("env."), value, path, problems)
    else:
        check_knob_value(value, path, problems)


def search_step(
    item: Mapping[str, object], path: YamlPath, workload_fields: Collection[str], problems: Problems
) -> Step:
    """A step written with `search:`."""
    item = cast(StepDoc, item)  # the schema has checked the step
    step = Step(
        name=item["name"],
        changes=(),
        bundle=item.get("bundle", False),
        carry=item.get("carry", "if_kept"),
        description=item.get("description", ""),
        line=problems.sources.locate(path).line,
    )
    spath = (*path, "search")
    if "set" in item:
        problems.add(
            spath,
            f"a search combined with set: ({', '.join(map(str, item['set']))}); expected one variable per step: the "
            "search's knob, with the rest as the configuration so far (put the set: in a step before it)",
        )
        return step
    if item.get("bundle"):
        problems.add((*path, "bundle"), "a search cannot be a bundle; expected one knob searched")
    raw = item["search"]
    if len(raw) != 1:
        found = f"{len(raw)} knobs ({', '.join(map(str, raw))})" if raw else "no knob"
        problems.add(
            spath, f"found {found}; expected exactly one knob to search, e.g. search: {{max_num_seqs: [8, 16]}}"
        )
        return step
    key, written = next(iter(raw.items()))
    key = str(key)
    kpath = (*spath, key)
    limit = int(item.get("max_candidates", DEFAULT_MAX_CANDIDATES))
    target = _target(key, kpath, workload_fields, problems)
    if isinstance(written, list):
        values = _list_values(written, kpath, limit, problems)
    else:
        values = _range_values(as_mapping(written), kpath, limit, problems)
    if target is None or values is None:
        return step
    for j, value in enumerate(values):
        _check_value(target, value, (*kpath, j) if isinstance(written, list) else kpath, problems)
    ordered = all(_kind(v) == "number" for v in values)
    return Step(
        name=step.name,
        changes=(),
        carry=step.carry,
        description=step.description,
        line=step.line,
        choice=SearchSpace(target, tuple(values), ordered),
    )


class SearchForm:
    """`search:` as a step form (playbook.step_forms)."""

    key = "search"
    schema: Mapping[str, object] = MappingProxyType({})  # its entries (search, max_candidates) ship in playbook.v1.json

    def parse(
        self, item: Mapping[str, object], path: YamlPath, workload_fields: Collection[str], problems: Problems
    ) -> Step:
        return search_step(item, path, workload_fields, problems)

    def knobs(self, index: int, step: Step, sources: SourceMap) -> Iterator[tuple[YamlPath, str, Scalar]]:
        """(YAML path, knob, value) of each value of step `index`'s search, for the engine's name and type checks:
        a list's values at their own lines, a range's at the range."""
        space = step.choice
        if not isinstance(space, SearchSpace) or not space.target.startswith("args."):
            return
        knob = space.target.removeprefix("args.")
        written = knob if ("steps", index, "search", knob) in sources.entries else space.target
        path: YamlPath = ("steps", index, "search", written)
        for j, value in enumerate(space.values):
            item = (*path, j)
            yield (item if item in sources.entries else path), knob, value


SEARCH_FORM = SearchForm()
