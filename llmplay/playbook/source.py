"""YAML with line numbers: a playbook file read safely, every YAML path mapped to the line it was written on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmplay.errors import PlaybookError
from llmplay.files import display_path, read_bounded

API_VERSION = "llmplay/v1"
MAX_FILE_BYTES = 1 << 20
MAX_EXPANDED_NODES = 100_000  # aliases may not multiply a document past this (billion laughs)
YamlPath = tuple[str | int, ...]  # keys and list indices from the document's root

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.$-]+$")
_LINE_BREAKS = {ord(c): c.encode("unicode_escape").decode() for c in "\n\r\t\v\f\x1c\x1d\x1e\x85\u2028\u2029"}


def one_line(text: str) -> str:
    """Messages are one line each: line breaks inside untrusted keys or values are shown escaped."""
    return text.translate(_LINE_BREAKS)


def format_path(path: YamlPath) -> str:
    """`workload.input`, `steps[0].set`; keys that are not plain words are quoted in brackets."""
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

    def overlay(self, other: SourceMap) -> SourceMap:
        """This map with `other`'s entries on top (a child playbook over its base)."""
        merged = dict(self.entries)
        merged.update(other.entries)
        return SourceMap(merged)

    def locate(self, path: YamlPath) -> Located:
        """Where `path` was written, or its nearest written ancestor; file "?" when nothing was."""
        for cut in range(len(path), -1, -1):
            hit = self.entries.get(tuple(path[:cut]))
            if hit:
                return hit
        return Located("?", 0)


def located_error(file: str, line: int, message: str) -> PlaybookError:
    """A one-line `FILE:LINE: message` error for problems found before there is a YAML path."""
    return PlaybookError(f"{display_path(file)}:{line}: {one_line(message)}")


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
                seen: dict[object, int] = {}
                for k, _ in current.value:
                    if isinstance(k, yaml.ScalarNode):
                        if k.value in seen:
                            raise located_error(
                                file,
                                k.start_mark.line + 1,
                                f"duplicate key '{k.value}' (first at line {seen[k.value]}); expected each key once",
                            )
                        seen[k.value] = k.start_mark.line + 1
            stack.append((current, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
        else:
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[key] > MAX_EXPANDED_NODES:
                raise located_error(
                    file,
                    current.start_mark.line + 1,
                    f"document expands to more than {MAX_EXPANDED_NODES} nodes through aliases; "
                    "expected a plain playbook (no alias bombs)",
                )


def _line_map(node: yaml.Node, file: str) -> SourceMap:
    """Every key and list item's line; shared (aliased) nodes are walked once per path, within the node cap."""
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
                child = (*path, str(k.value))
                entries[child] = Located(file, k.start_mark.line + 1)
                stack.append((v, child))
        elif isinstance(current, yaml.SequenceNode):
            for i, v in enumerate(current.value):
                entries[(*path, i)] = Located(file, v.start_mark.line + 1)
                stack.append((v, (*path, i)))
    return SourceMap(entries)


def read_yaml(path: Path) -> tuple[object, SourceMap]:
    """Safe-load one file: (data, line map); every failure is a one-line PlaybookError naming the file."""
    file = str(path)
    raw = read_bounded(path, MAX_FILE_BYTES, "a playbook YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlaybookError(f"{display_path(file)}: not UTF-8 text (byte {exc.start}); expected a YAML file") from None
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # the reader rejects control characters already here
        node = loader.get_single_node()
        if node is None:
            raise PlaybookError(
                f"{display_path(file)}:1: the file is empty; expected a playbook mapping "
                f"starting with 'apiVersion: {API_VERSION}'"
            )
        _check_nodes(node, file)
        data = loader.construct_document(node)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise located_error(
            file, line, f"unsupported YAML tag ({exc.problem}); expected plain YAML: no tags, no code"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise located_error(file, line, f"YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise PlaybookError(f"{display_path(file)}: YAML error: {one_line(str(exc))}") from None
    except RecursionError:
        raise PlaybookError(f"{display_path(file)}: nesting is too deep; expected a plain playbook") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, _line_map(node, file)
