"""A step's `set:` form: the one knob it changes (several only with bundle: true), each key checked by the rule the
same key obeys in the base; bare keys are engine knobs."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from types import MappingProxyType
from typing import cast

from llmplay.playbook.credentials import check_args, check_env_value, check_knob_value
from llmplay.playbook.document import StepDoc
from llmplay.playbook.problems import Problems, did_you_mean
from llmplay.playbook.schema import value_problems
from llmplay.playbook.source import SourceMap, YamlPath
from llmplay.spec import Change, Scalar, Step

# What a step may set besides engine knobs (args.*), env.* and workload fields. `model`: another file of the same
# model (a quantized GGUF is llama.cpp's weight quantization).
ENGINE_FIELDS_SETTABLE = {"image", "gpus", "extra_args", "model"}


def set_step(item: Mapping[str, object], path: YamlPath, workload_fields: Collection[str], problems: Problems) -> Step:
    """A step written with `set:`: its changes, each value checked where it is written."""
    item = cast(StepDoc, item)  # the schema has checked the step
    changes = []
    for key, value in item["set"].items():
        key = str(key)
        # A step's value obeys the rule the same key obeys in the base (workload.concurrency: 0 is refused
        # in a step as it is in workload:), so the schema's definition of that key checks it.
        if key in ENGINE_FIELDS_SETTABLE:
            target = key
            value_problems(value, f"#/$defs/engine/properties/{key}", (*path, "set", key), problems)
            if key == "extra_args" and isinstance(value, list):
                check_args(value, (*path, "set", key), problems)
        elif key.startswith("env."):
            target = key
            value_problems(value, "#/$defs/engine/properties/env/additionalProperties", (*path, "set", key), problems)
            check_env_value(key.removeprefix("env."), value, (*path, "set", key), problems)
        elif key.startswith("workload."):
            field_name = key.split(".", 1)[1]
            if field_name not in workload_fields:
                problems.add(
                    (*path, "set", key),
                    f"workload field '{field_name}' cannot be a step"
                    f"{did_you_mean(field_name, workload_fields)}; expected one of: {', '.join(sorted(workload_fields))}",
                )
            else:
                value_problems(value, f"#/$defs/workload/properties/{field_name}", (*path, "set", key), problems)
            target = key
        elif key.startswith("args."):
            target = key
            check_knob_value(value, (*path, "set", key), problems)
        else:
            target = f"args.{key}"
            check_knob_value(value, (*path, "set", key), problems)
        changes.append(Change(target, value))
    if not changes:
        problems.add(
            (*path, "set"), "the step changes nothing; expected exactly one knob, e.g. set: {prefix_caching: true}"
        )
    elif len(changes) > 1 and not item.get("bundle", False):
        problems.add(
            (*path, "set"),
            f"the step changes {len(changes)} knobs ({', '.join(c.target for c in changes)}); "
            "expected one variable per step, or bundle: true to declare a bundle",
        )
    return Step(
        name=item["name"],
        changes=tuple(changes),
        bundle=item.get("bundle", False),
        carry=item.get("carry", "if_kept"),
        description=item.get("description", ""),
        line=problems.sources.locate(path).line,
    )


class SetForm:
    """`set:` as a step form (playbook.step_forms): its changes are the Step's own, which every check reads already."""

    key = "set"
    schema: Mapping[str, object] = MappingProxyType({})  # its entry ships in playbook.v1.json

    def parse(
        self, item: Mapping[str, object], path: YamlPath, workload_fields: Collection[str], problems: Problems
    ) -> Step:
        return set_step(item, path, workload_fields, problems)

    def knobs(self, index: int, step: Step, sources: SourceMap) -> Iterator[tuple[YamlPath, str, Scalar]]:
        return iter(())


SET_FORM = SetForm()
