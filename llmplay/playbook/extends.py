"""`extends:`: a playbook merged over its base, key by key, inside the playbook's directory tree."""

from __future__ import annotations

import copy
import stat
from pathlib import Path
from typing import cast

from llmplay.files import display_path, file_kind
from llmplay.playbook.source import SourceMap, located_error, read_yaml

MAX_EXTENDS_DEPTH = 16


def deep_merge(base: object, override: object) -> object:
    """Mappings merge key by key; anything else in the override replaces the base."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = deep_merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(override)


def resolve_extends(
    path: Path, root_dir: Path, allow_outside: bool, chain: tuple[Path, ...]
) -> tuple[dict[str, object], SourceMap]:
    """The document at `path` merged over its bases, with every key's line; `chain` holds the files above it."""
    data, sources = read_yaml(path)
    if not isinstance(data, dict):
        raise located_error(
            str(path),
            1,
            f"found a {type(data).__name__}; expected a mapping with apiVersion, kind, metadata, engine, workload",
        )
    parent = data.get("extends")
    if parent is None:
        return data, sources
    where = sources.locate(("extends",))
    if not isinstance(parent, str) or not parent:
        raise located_error(
            str(path), where.line, f"extends: found {parent!r}; expected a relative path to a base playbook"
        )
    target = (path.parent / parent).resolve()
    if not allow_outside and not target.is_relative_to(root_dir):
        raise located_error(
            str(path),
            where.line,
            f"extends: '{parent}' points outside {display_path(str(root_dir))}; expected a base inside the "
            "playbook's directory tree (pass --allow-outside-tree to permit it)",
        )
    if target in chain:
        cycle = " -> ".join(display_path(str(p)) for p in (*chain, target))
        raise located_error(str(path), where.line, f"extends: cycle {cycle}; expected a chain that ends in a base")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise located_error(str(path), where.line, f"extends: chain longer than {MAX_EXTENDS_DEPTH}")
    try:
        mode = target.stat().st_mode
    except OSError:
        raise located_error(
            str(path), where.line, f"extends: '{parent}' does not exist (looked for {display_path(str(target))})"
        ) from None
    if not stat.S_ISREG(mode):  # a FIFO would block the read, a device never end it
        raise located_error(
            str(path),
            where.line,
            f"extends: '{parent}' is not a regular file ({file_kind(mode)}: {display_path(str(target))}); "
            "expected a base playbook YAML file",
        )
    base, base_sources = resolve_extends(target, root_dir, allow_outside, (*chain, target))
    base.pop("extends", None)
    merged = cast(
        dict[str, object], deep_merge(base, {k: v for k, v in data.items() if k != "extends"})
    )  # two mappings
    merged["extends"] = parent
    return merged, base_sources.overlay(sources)
