"""The one entry to the playbook stage: a path becomes a checked, frozen Playbook.

Every problem becomes a `PlaybookError` whose lines read
`FILE:LINE: YAML.PATH: found X, expected Y (did you mean Z?)`; knob names and values are checked here,
against the engine adapter, so `validate` catches everything `plan` and `run` would.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import cast

from llmplay.engines import get_engine
from llmplay.files import display_path, read_bounded
from llmplay.playbook.convert import (
    PromptFiles,
    parse_cost,
    parse_engine,
    parse_runtime,
    parse_steps,
    parse_trials,
    parse_workload,
)
from llmplay.playbook.credentials import check_text
from llmplay.playbook.document import PlaybookDoc, WorkloadDoc
from llmplay.playbook.extends import resolve_extends
from llmplay.playbook.goals import parse_goals
from llmplay.playbook.knobs import check_knobs, knob_sites
from llmplay.playbook.limits import check_configurations
from llmplay.playbook.mounts import check_model_dir
from llmplay.playbook.problems import Problems
from llmplay.playbook.schema import schema_problems
from llmplay.playbook.source import API_VERSION, MAX_FILE_BYTES, located_error, read_yaml
from llmplay.playbook.step_forms import step_properties
from llmplay.playbook.tune import parse_tune
from llmplay.spec import Goals, Metadata, Playbook, Workload, frozen_map


def _check_api_version(doc: Mapping[str, object], problems: Problems) -> None:
    found = doc.get("apiVersion")
    if found != API_VERSION:
        hint = (
            " — this llmplay reads llmplay/v1 only; upgrade llmplay for newer formats"
            if isinstance(found, str) and found.startswith("llmplay/")
            else f" — add 'apiVersion: {API_VERSION}' as the first line"
        )
        problems.add(("apiVersion",), f"found {found!r}; expected '{API_VERSION}'{hint}")
        problems.raise_if_any()


def load_playbook(
    path: str | os.PathLike[str],
    *,
    allow_outside_extends: bool = False,
    archived: bool = False,
    on_this_host: bool = False,
    archive_root: Path | None = None,
) -> Playbook:
    """The one loader: CLI, runner, retest and tests all come through here.

    `on_this_host`: the playbook is to run here (run, capacity, retest, and `validate` unless --any-host), so what
    it needs from this host (engine.model_dir) must be here; `plan` and `validate --any-host` answer for any host,
    as for a playbook written for a GPU machine checked on a laptop. `archive_root`: where the run's archive goes
    (--archive), which engine.model_dir may not be or hold; default $LLMPLAY_ARCHIVE or ./reports."""
    file = Path(path).absolute()
    root_dir = file.parent.resolve()
    doc, sources = resolve_extends(file, root_dir, allow_outside_extends, (file.resolve(),))
    text = read_bounded(file, MAX_FILE_BYTES, "a playbook YAML file").decode("utf-8")
    problems = Problems(sources, display_path(str(file)))
    _check_api_version(doc, problems)
    schema_problems(doc, problems, step_properties())
    problems.raise_if_any()
    checked = cast(PlaybookDoc, doc)  # the schema found nothing: the document has the shape PlaybookDoc states
    base_dir = file.parent
    metadata = checked["metadata"]
    files = PromptFiles(None if allow_outside_extends else root_dir)
    workload = parse_workload(checked["workload"], base_dir, ("workload",), problems, files)
    playbook = Playbook(
        path=str(file),
        text=text,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        api_version=checked["apiVersion"],
        metadata=Metadata(
            name=metadata["name"],
            version=str(metadata.get("version", "0")),
            owner=metadata.get("owner", ""),
            description=metadata.get("description", ""),
            tags=tuple(metadata.get("tags", ())),
        ),
        goals=parse_goals(checked.get("goals", {}), problems, base_dir, workload.dataset, files, archived=archived),
        workload=workload,
        engine=parse_engine(checked["engine"], base_dir, ("engine",), problems),
        steps=parse_steps(checked.get("steps", []), ("steps",), problems),
        trials=parse_trials(checked.get("trials", {}), problems),
        cost=parse_cost(checked.get("cost", {}), problems),
        runtime=parse_runtime(checked.get("runtime"), problems),
        resolved=frozen_map(doc),
        tune=parse_tune(checked["tune"], checked["engine"].get("kind"), problems) if "tune" in checked else None,
    )
    if playbook.engine.model_dir is not None:
        written = checked["engine"]["model_dir"]
        check_model_dir(
            written, base_dir, playbook.engine.model_dir, playbook.runtime, on_this_host, problems, archive_root
        )
    problems.raise_if_any()
    check_knobs(playbook, sources)
    rows = files.rows.get(Path(workload.dataset), ()) if workload.dataset else ()
    check_configurations(playbook, get_engine(playbook.engine.kind), rows, problems)
    problems.raise_if_any()
    check_text(text, str(file), problems)  # last: a token the value checks named is not told twice
    problems.raise_if_any()
    return replace(playbook, sites=frozen_map(knob_sites(playbook, sources)))


def load_workload(path: str | os.PathLike[str], *, allow_outside_tree: bool = False) -> tuple[Workload, Goals]:
    """`llmplay bench --workload FILE`: a whole playbook, or a file holding just a workload mapping; its dataset
    stays inside the file's directory tree, as a playbook's does."""
    file = Path(path).absolute()
    data, sources = read_yaml(file)
    if isinstance(data, dict) and "apiVersion" in data:
        pb = load_playbook(file, allow_outside_extends=allow_outside_tree)
        return pb.workload, pb.goals
    problems = Problems(sources, display_path(str(file)))
    if not isinstance(data, dict):
        raise located_error(str(file), 1, f"found {type(data).__name__}; expected a playbook or a workload mapping")
    doc = data.get("workload", data)
    wrapper = {
        "apiVersion": API_VERSION,
        "kind": "Playbook",
        "metadata": {"name": "bench"},
        "engine": {"kind": "vllm", "model": "x"},
        "workload": doc,
    }
    schema_problems(wrapper, problems)
    problems.raise_if_any()
    checked = cast(WorkloadDoc, doc)  # the schema found nothing: the mapping has the shape WorkloadDoc states
    files = PromptFiles(None if allow_outside_tree else file.parent.resolve())
    workload = parse_workload(checked, file.parent, ("workload",) if "workload" in data else (), problems, files)
    problems.raise_if_any()
    return workload, Goals()
