"""The playbooks the tuner writes: each round's (the incumbent's knobs and one chosen step), the unloaded probe's,
and `tuned.yaml` (the original playbook plus the kept steps as ordinary steps, each with a comment naming the finding
that chose it and its verdict; the rejected and skipped candidates under `tuned:`, which the loader ignores)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any  # Any: playbook documents as PyYAML reads and writes them (untyped)

import yaml

from llmplay.spec import Playbook, Scalar
from llmplay.tune.rank import Ranked

# A playbook document or part of one, as YAML reads and writes it: untyped until the loader checks it.
Doc = dict[str, Any]  # Any: YAML values (scalars, lists, mappings) before the schema
# Requests the unloaded probe sends one at a time: enough for a median, cheap beside any A/B step.
ALONE_REQUESTS = 12


@dataclass(frozen=True)
class KeptStep:
    """A step the tuner kept: the step as a playbook writes it, and why it was chosen and kept."""

    document: Mapping[str, object]
    finding: str  # the findings that called for it, with evidence
    verdict: str  # the verdict's sentence


def _base(playbook: Playbook) -> Doc:
    """The playbook as resolved (`extends:` merged), minus the tuner's own sections, with file paths absolute so the
    copy loads from the tuning directory."""
    doc = {k: v for k, v in _document(playbook.resolved).items() if k not in ("extends", "tune", "tuned")}
    workload = dict(doc.get("workload") or {})
    if playbook.workload.dataset:
        workload["dataset"] = playbook.workload.dataset
    if playbook.workload.trace is not None:
        workload["trace"] = {**dict(workload.get("trace") or {}), "file": playbook.workload.trace.file}
    doc["workload"] = workload
    return doc


def _document(mapping: Mapping[str, object]) -> Doc:
    """A mapping (the loader's frozen one included) as a plain dict YAML can write."""
    return {str(k): _plain(v) for k, v in mapping.items()}


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def step_document(ranked: Ranked, name: str) -> Doc:
    """The chosen candidate as a playbook step: a value search for several numeric values, else a fixed change."""
    description = f"llmplay tune: {ranked.remedy.value} ({ranked.direction.value}), for {', '.join(ranked.findings)}"
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in ranked.values)
    if len(ranked.values) > 1 and numeric:
        return {"name": name, "description": description, "search": {f"args.{ranked.knob}": list(ranked.values)}}
    # A switch, or the first of a choice's values (a GGUF file, a KV dtype): one fixed change.
    return {"name": name, "description": description, "set": {ranked.knob: ranked.values[0]}}


def step_name(ranked: Ranked, taken: Sequence[str]) -> str:
    base = f"tune-{ranked.remedy.value}-{ranked.knob}".replace("_", "-")[:60]
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def round_document(playbook: Playbook, args: Mapping[str, Scalar], steps: Sequence[Mapping[str, object]]) -> Doc:
    """One round: the incumbent's knobs as the engine's, and the chosen step as the only step."""
    doc = _base(playbook)
    doc["engine"] = {**dict(doc["engine"]), "args": dict(args)}
    doc["steps"] = [dict(s) for s in steps]
    return doc


def more_trials(playbook: Playbook) -> Doc:
    """The playbook's trials with twice the most repeats: for a step an earlier round left inconclusive."""
    trials = dict(_base(playbook).get("trials") or {})
    trials["max_repeats"] = 2 * playbook.trials.max_repeats
    return trials


def alone_document(playbook: Playbook) -> Doc:
    """The unloaded probe: the baseline engine, one user sending ALONE_REQUESTS requests one at a time, one trial."""
    doc = _base(playbook)
    dropped = ("rate", "sweep", "burst", "duration", "arrival", "warmup")
    workload = {k: v for k, v in doc["workload"].items() if k not in dropped}
    # A warm-up counted in requests: a warm-up in seconds could outlast a dozen short requests and leave none.
    workload.update(concurrency=1, num_requests=ALONE_REQUESTS, warmup_requests=2, turns=1)
    doc["workload"] = workload
    doc["steps"] = []
    doc["trials"] = {"repeats": 1, "max_repeats": 1, "sequential": False}
    goals = dict(doc.get("goals") or {})
    goals.pop("capacity", None)
    doc["goals"] = goals
    return doc


def write_document(path: Path, doc: Mapping[str, object], header: str = "") -> Path:
    path.write_text(header + yaml.safe_dump(_plain(doc), sort_keys=False, allow_unicode=True))
    return path


_TOP_KEY = re.compile(r"^[A-Za-z_]")


def _without_top_level(text: str, keys: Sequence[str]) -> str:
    """The YAML text without the named top-level blocks (comments elsewhere kept)."""
    out, skipping = [], False
    for line in text.splitlines():
        if _TOP_KEY.match(line):
            skipping = any(line.startswith(f"{key}:") for key in keys)
        if not skipping:
            out.append(line)
    return "\n".join(out).rstrip() + "\n"


def _comment(text: str) -> str:
    return "\n".join(f"  # {line}" for line in re.sub(r"\s+", " ", text).strip().split("\n"))


def tuned_text(playbook: Playbook, kept: Sequence[KeptStep], not_kept: Sequence[Mapping[str, object]]) -> str:
    """tuned.yaml: the original text (its comments kept) with the hand-written steps, then the kept ones, each with a
    comment naming the finding that chose it and its verdict; then `tuned:`, what was rejected or skipped and why.
    A playbook with `extends:` is written resolved, so the copy stands alone."""
    if "extends" in playbook.resolved:
        head = yaml.safe_dump(_base(playbook) | {"steps": None}, sort_keys=False, allow_unicode=True)
        head = _without_top_level(head, ("steps",))
    else:
        head = _without_top_level(playbook.text, ("steps", "tuned"))
    lines = [head.rstrip(), "steps:"]
    hand = _document(playbook.resolved).get("steps") or []
    for step in hand:
        lines.append(_indent_item(step))
    for step in kept:
        lines.append(_comment(f"chosen by {step.finding}"))
        lines.append(_comment(f"verdict: {step.verdict}"))
        lines.append(_indent_item(step.document))
    if not hand and not kept:
        lines[-1] = "steps: []"
    lines.append("# What llmplay tune tried and did not keep, or skipped, with why (the loader ignores `tuned:`).")
    lines.append(yaml.safe_dump({"tuned": list(not_kept)}, sort_keys=False, allow_unicode=True, width=120).rstrip())
    return "\n".join(lines) + "\n"


def _indent_item(item: Mapping[str, object]) -> str:
    body = yaml.safe_dump(_plain(item), sort_keys=False, allow_unicode=True, default_flow_style=None).rstrip()
    first, *rest = body.splitlines()
    return "\n".join([f"  - {first}", *(f"    {line}" for line in rest)])
