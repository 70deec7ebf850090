"""Problem collection: every problem in a playbook, each as `FILE:LINE: YAML.PATH: found X, expected Y`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from llmplay.errors import PlaybookError
from llmplay.files import display_path
from llmplay.playbook.source import SourceMap, YamlPath, format_path, one_line


class Problems:
    """Collects every problem found so the user fixes them in one pass, not one per run."""

    def __init__(self, sources: SourceMap, display_file: str):
        self.sources = sources
        self.display_file = display_file  # for paths written nowhere (defaults, the document itself)
        self.lines: list[str] = []

    def add(self, path: YamlPath, problem: str) -> None:
        where = self.sources.locate(path)
        file = display_path(where.file) if where.file != "?" else self.display_file
        self.lines.append(f"{file}:{where.line}: {format_path(path)}: {one_line(problem)}")

    def raise_if_any(self) -> None:
        """One PlaybookError holding every line so far (each once, in the order found)."""
        if self.lines:
            raise PlaybookError("\n".join(dict.fromkeys(self.lines)))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the closest choice, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def short_repr(value: object) -> str:
    """repr() cut to 60 characters: untrusted values must not flood a one-line message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
