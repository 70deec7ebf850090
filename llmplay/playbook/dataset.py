"""Prompt files (workload datasets, quality probes) read and checked once, with the line each row is on.

The same reader runs when the playbook loads (so `validate` names every bad line) and when the load generator
builds requests, so a file that validates is a file that loads: JSONL of `{prompt, output_tokens}` lines or
ShareGPT conversations, or a JSON array of either (ShareGPT's own form).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llmplay.errors import PlaybookError
from llmplay.files import display_path, read_bounded
from llmplay.playbook.problems import short_repr
from llmplay.playbook.source import one_line

# ShareGPT's cleaned split, the largest dataset serving benchmarks use, is about 650 MB as one JSON array.
MAX_DATASET_BYTES = 1 << 30
MAX_PROBLEM_LINES = 10  # a file with a million bad rows is told in a few lines, not a million
EXPECTED = 'a JSONL file of {"prompt": ..., "output_tokens": N} lines or ShareGPT conversations'


@dataclass(frozen=True)
class DatasetRow:
    """One usable row: its prompt, the output length it asks for (None: the workload's), the reference reply's
    text (ShareGPT; the load generator counts its tokens), and the line it starts on. A ShareGPT conversation's
    later human turns, each with the reply that followed it (None: none did), are the turns a multi-turn
    workload sends after the first."""

    line: int
    prompt: str
    output_tokens: int | None
    reply: str | None = None
    later_turns: tuple[tuple[str, str | None], ...] = ()


class DatasetProblems(PlaybookError):
    """Every problem found in one prompt file, one `FILE:LINE: problem` line each."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


def read_dataset(path: str | Path) -> tuple[DatasetRow, ...]:
    """Every usable row of a prompt file (perhaps none: the caller says what an empty file means there);
    DatasetProblems listing each bad line."""
    file = Path(path)
    shown = display_path(str(file))
    raw = read_bounded(file, MAX_DATASET_BYTES, EXPECTED)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DatasetProblems([f"{shown}:{line}: not UTF-8 text (byte {exc.start}); expected {EXPECTED}"]) from None
    problems: list[str] = []
    rows: list[DatasetRow] = []
    for line, item in _items(text, shown, problems):
        row = _row(item, line, shown, problems)
        if row is not None:
            rows.append(row)
    if len(problems) > MAX_PROBLEM_LINES:
        problems = [*problems[:MAX_PROBLEM_LINES], f"{shown}: ... and {len(problems) - MAX_PROBLEM_LINES} more"]
    if problems:
        raise DatasetProblems(problems)
    return tuple(rows)


def _items(text: str, shown: str, problems: list[str]) -> list[tuple[int, object]]:
    """(line, parsed value) of each JSONL line, or of each element of a JSON array."""
    if text.lstrip().startswith("["):
        return _array_items(text, shown, problems)
    items = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append((lineno, json.loads(line)))
        except ValueError as exc:
            problems.append(f"{shown}:{lineno}: invalid JSON ({one_line(str(exc))}); expected one JSON object per line")
        except RecursionError:
            problems.append(f"{shown}:{lineno}: nesting is too deep; expected one flat object per line")
    return items


def _array_items(text: str, shown: str, problems: list[str]) -> list[tuple[int, object]]:
    # Element by element, so each row knows its line (json.loads of the whole array would not say).
    decoder = json.JSONDecoder()
    items: list[tuple[int, object]] = []
    pos = text.index("[") + 1
    while True:
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == "]" and not items:
            pos += 1
            break
        try:
            value, end = decoder.raw_decode(text, pos)
        except ValueError as exc:
            problems.append(f"{shown}:{text.count(chr(10), 0, pos) + 1}: invalid JSON array ({one_line(str(exc))})")
            return items
        except RecursionError:
            problems.append(f"{shown}:{text.count(chr(10), 0, pos) + 1}: nesting is too deep; expected flat rows")
            return items
        items.append((text.count("\n", 0, pos) + 1, value))
        pos = _skip_space(text, end)
        if pos < len(text) and text[pos] == ",":
            pos += 1
            continue
        if pos < len(text) and text[pos] == "]":
            pos += 1
            break
        problems.append(f"{shown}:{text.count(chr(10), 0, pos) + 1}: invalid JSON array (expected ',' or ']')")
        return items
    if _skip_space(text, pos) != len(text):
        problems.append(f"{shown}:{text.count(chr(10), 0, pos) + 1}: text after the JSON array; expected the end")
    return items


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _row(item: object, line: int, shown: str, problems: list[str]) -> DatasetRow | None:
    if not isinstance(item, dict):
        problems.append(f"{shown}:{line}: found {type(item).__name__}; expected an object ({EXPECTED})")
        return None
    if "prompt" in item:
        prompt, out = item["prompt"], item.get("output_tokens")
        if not isinstance(prompt, str) or not prompt.strip():
            problems.append(f'{shown}:{line}: "prompt": found {short_repr(prompt)}; expected non-empty text')
            return None
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or not 1 <= out <= 10_000_000):
            problems.append(
                f'{shown}:{line}: "output_tokens": found {short_repr(out)}; expected a whole number of tokens '
                "from 1 to 10000000 (or no output_tokens: the workload's output length)"
            )
            return None
        return DatasetRow(line, prompt, out)
    conv = item.get("conversations", item.get("conversation"))
    if not isinstance(conv, list):
        problems.append(f'{shown}:{line}: no "prompt" or "conversations"; expected {EXPECTED}')
        return None
    human = next(
        (i for i, t in enumerate(conv) if isinstance(t, dict) and t.get("from", t.get("role")) in ("human", "user")),
        None,
    )
    if human is None:
        return None  # no human turn: nothing to send (ShareGPT has such rows)
    prompt = conv[human].get("value", conv[human].get("content", ""))
    if not isinstance(prompt, str):
        problems.append(f"{shown}:{line}: the first human turn holds {short_repr(prompt)}; expected text")
        return None
    if not prompt.strip():
        return None  # an empty first turn: nothing to send, like a row without a human turn
    turns = _human_turns(conv, human)
    return DatasetRow(line, prompt, None, turns[0][1], turns[1:])


def _human_turns(conv: list[object], first: int) -> tuple[tuple[str, str | None], ...]:
    """Each human turn from `first` on with the reply right after it (None when none follows); a human turn without
    text ends the conversation there, as nothing after it could be sent."""
    turns: list[tuple[str, str | None]] = []
    for i in range(first, len(conv)):
        turn = conv[i]
        if not isinstance(turn, dict) or turn.get("from", turn.get("role")) not in ("human", "user"):
            continue
        text = turn.get("value", turn.get("content"))
        if not isinstance(text, str) or not text.strip():
            break
        reply = conv[i + 1] if i + 1 < len(conv) else None
        reply_text = reply.get("value", reply.get("content")) if isinstance(reply, dict) else None
        turns.append((text, reply_text if isinstance(reply_text, str) else None))
    return tuple(turns)
