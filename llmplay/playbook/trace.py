"""Request traces read as a stream, windowed and scaled: the one reader `validate` and the load generator share.

Formats: Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`), the Azure LLM inference
trace CSV (`TIMESTAMP`, `ContextTokens`, `GeneratedTokens`) and BurstGPT's CSV (`Timestamp` s, `Request tokens`,
`Response tokens`). Only the window is kept in memory: reading stops where the window ends, so a 1 GB trace costs
the lines up to its window, never the whole file at once. Each bad line is told as FILE:LINE.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from llmplay import units
from llmplay.errors import PlaybookError
from llmplay.files import display_path, open_regular
from llmplay.playbook.document import TraceDoc, WorkloadDoc
from llmplay.playbook.problems import Problems, short_repr
from llmplay.playbook.source import YamlPath, one_line
from llmplay.spec import TraceFacts, TraceSpec, Workload

FORMATS = ("mooncake", "azure", "burstgpt")
EXPECTED = {
    "mooncake": 'a JSONL trace of {"timestamp": ms, "input_length": N, "output_length": N, "hash_ids": [...]} lines',
    "azure": "an Azure LLM inference trace CSV with columns TIMESTAMP, ContextTokens, GeneratedTokens",
    "burstgpt": "a BurstGPT CSV with columns Timestamp, Request tokens, Response tokens",
}
# (timestamp, input, output) column names of the CSV formats, as their releases spell them.
CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
MAX_LINE_BYTES = 16 << 20  # one Mooncake line of a 10M-token prompt holds ~20k hash ids: far below this
MAX_PROBLEM_LINES = 10
MAX_LENGTH_TOKENS = 10_000_000  # the playbook schema's `tokens` maximum
# Keys a trace decides for itself: written alongside workload.trace they would be silently ignored.
TRACE_OWNS = {
    "input": "the trace gives each request's input length",
    "output": "the trace gives each request's output length",
    "dataset": "the trace's prompts are synthesised from its lengths and hash ids",
    "prefix_tokens": "shared prefixes come from the trace's hash ids",
    "prefix_groups": "shared prefixes come from the trace's hash ids",
    "turns": "each trace row is one request",
    "concurrency": "a trace is replayed open loop at its timestamps",
    "arrival": "the trace's timestamps are the arrivals",
    "burst": "the trace's timestamps are the arrivals",
}


@dataclass(frozen=True)
class TraceRow:
    """One request as the file has it: arrival in trace seconds, lengths in tokens, the prompt's block ids."""

    line: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None  # None: the format has none, every block is the request's own


@dataclass(frozen=True)
class ScaledRequest:
    """One request of the window after scaling: arrival in trace seconds after the window's first request, and
    the prompt as blocks of (hash id, tokens); a None id is a block no other request shares."""

    line: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[tuple[int | None, int], ...]


class TraceProblems(PlaybookError):
    """Every problem found in a trace's window, one `FILE:LINE: problem` line each."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


# ------------------------------------------------------------------------------------------------------ reading
def _lines(path: Path, expected: str) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line, read in chunks; a line longer than MAX_LINE_BYTES is refused."""
    shown = display_path(str(path))
    fd = open_regular(path, expected)
    with os.fdopen(fd, "rb") as handle:
        for lineno, line in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(line) > MAX_LINE_BYTES:
                raise TraceProblems(
                    [f"{shown}:{lineno}: line is more than {MAX_LINE_BYTES} bytes; expected {expected}"]
                )
            yield lineno, line


def _whole_tokens(value: object, what: str) -> int | str:
    """A token count >= 0, or the problem with it (BurstGPT writes counts as floats such as 12.0)."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return f"{what}: found {short_repr(value)}; expected a whole number of tokens"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{what}: found {short_repr(value)}; expected a whole number of tokens"
    if value != int(value):
        return f"{what}: found {value!r}; expected a whole number of tokens"
    if value < 0:
        return f"{what}: found {int(value)}; expected a length of 0 tokens or more"
    if value > MAX_LENGTH_TOKENS:
        return f"{what}: found {int(value)}; expected at most {MAX_LENGTH_TOKENS} tokens"
    return int(value)


def _mooncake_row(lineno: int, raw: bytes) -> TraceRow | str | None:
    if not raw.strip():
        return None
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return f"invalid JSON ({one_line(str(exc))}); expected one JSON object per line"
    if not isinstance(item, dict):
        return f"found {type(item).__name__}; expected an object"
    missing = [k for k in ("timestamp", "input_length", "output_length") if k not in item]
    if missing:
        return f"no {', '.join(repr(k) for k in missing)}; expected {EXPECTED['mooncake']}"
    stamp = item["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) or stamp < 0:
        return f'"timestamp": found {short_repr(stamp)}; expected milliseconds >= 0'
    tokens = [_whole_tokens(item[k], f'"{k}"') for k in ("input_length", "output_length")]
    for t in tokens:
        if isinstance(t, str):
            return t
    ids = item.get("hash_ids")
    if ids is not None and (not isinstance(ids, list) or not all(type(h) is int for h in ids)):
        return f'"hash_ids": found {short_repr(ids)}; expected a list of whole numbers'
    return TraceRow(lineno, stamp / 1000.0, int(tokens[0]), int(tokens[1]), tuple(ids) if ids else None)


def _timestamp_s(text: str) -> float | None:
    """Seconds from a number (BurstGPT) or a date and time (Azure: `2023-11-16 18:15:46.6805900`)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    # A time without a zone is read as UTC, not local time: a daylight-saving jump must not open a gap.
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def _csv_rows(path: Path, fmt: str, problems: list[str]) -> Iterator[TraceRow]:
    shown = display_path(str(path))
    stamp_col, in_col, out_col = CSV_COLUMNS[fmt]
    lines = _lines(path, EXPECTED[fmt])
    # Spreadsheet exports open with a UTF-8 byte order mark, which would otherwise stick to the first column's name.
    text = (raw.decode("utf-8-sig" if lineno == 1 else "utf-8", "replace") for lineno, raw in lines)
    reader = csv.reader(text)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        problems.append(f"{shown}:1: unreadable CSV ({one_line(str(exc))}); expected {EXPECTED[fmt]}")
        return
    if header is None:
        return
    columns = {name.strip(): i for i, name in enumerate(header)}
    absent = [c for c in (stamp_col, in_col, out_col) if c not in columns]
    if absent:
        problems.append(
            f"{shown}:1: no column {', '.join(repr(c) for c in absent)} in the header; expected {EXPECTED[fmt]}"
        )
        return
    picks = [columns[stamp_col], columns[in_col], columns[out_col]]
    while True:
        try:
            cells = next(reader, None)
        except csv.Error as exc:
            problems.append(
                f"{shown}:{reader.line_num}: unreadable CSV ({one_line(str(exc))}); expected {EXPECTED[fmt]}"
            )
            return
        if cells is None:
            return
        lineno = reader.line_num
        if len(problems) >= MAX_PROBLEM_LINES:
            return  # a file of garbage is told in a few lines, not read to its end
        if not cells or not any(c.strip() for c in cells):
            continue
        if len(cells) <= max(picks):
            problems.append(f"{shown}:{lineno}: {len(cells)} columns; expected {len(header)} as the header has")
            continue
        stamp = _timestamp_s(cells[picks[0]])
        if stamp is None:
            problems.append(f"{shown}:{lineno}: {stamp_col}: found {short_repr(cells[picks[0]])}; expected a time")
            continue
        lengths = [_whole_tokens(cells[i], c) for i, c in ((picks[1], in_col), (picks[2], out_col))]
        bad = next((t for t in lengths if isinstance(t, str)), None)
        if bad is not None:
            problems.append(f"{shown}:{lineno}: {bad}")
            continue
        yield TraceRow(lineno, stamp, int(lengths[0]), int(lengths[1]), None)


def _jsonl_rows(path: Path, problems: list[str]) -> Iterator[TraceRow]:
    shown = display_path(str(path))
    for lineno, raw in _lines(path, EXPECTED["mooncake"]):
        got = _mooncake_row(lineno, raw)
        if isinstance(got, str):
            problems.append(f"{shown}:{lineno}: {got}")
            if len(problems) >= MAX_PROBLEM_LINES:
                return  # a file of garbage is told in a few lines, not read to its end
        elif got is not None:
            yield got


def read_window(spec: TraceSpec, max_requests: int | None = None) -> tuple[TraceRow, ...]:
    """The rows of the window (start, duration, at most `max_requests`), in order; reading stops at its end.

    TraceProblems for bad or out-of-order lines up to there, an empty file, or an empty window."""
    path = Path(spec.file)
    shown = display_path(spec.file)
    problems: list[str] = []
    rows = _csv_rows(path, spec.format, problems) if spec.format in CSV_COLUMNS else _jsonl_rows(path, problems)
    window: list[TraceRow] = []
    first: float | None = None
    last: TraceRow | None = None
    seen = 0
    try:
        for row in rows:
            seen += 1
            if last is not None and row.arrival_s < last.arrival_s:
                problems.append(
                    f"{shown}:{row.line}: arrives {last.arrival_s - row.arrival_s:.6g} s before line {last.line}; "
                    "expected rows in time order"
                )
            last = row
            if len(problems) >= MAX_PROBLEM_LINES:
                break
            first = row.arrival_s if first is None else first
            offset = row.arrival_s - first
            if offset < spec.start_s:
                continue
            if spec.duration_s is not None and offset >= spec.start_s + spec.duration_s:
                break
            window.append(row)
            if max_requests is not None and len(window) >= max_requests:
                break
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()
    if problems:
        raise TraceProblems(problems[:MAX_PROBLEM_LINES])
    if seen == 0:
        raise TraceProblems([f"{shown}:1: no requests in the file; expected {EXPECTED[spec.format]}"])
    if not window:
        assert first is not None and last is not None
        raise TraceProblems(
            [
                f"{shown}:{last.line}: no request in the window (start {spec.start_s:g} s); the trace spans "
                f"{last.arrival_s - first:g} s; expected a start inside it"
            ]
        )
    return tuple(window)


# ------------------------------------------------------------------------------------------------------ scaling
def scaled_length(tokens: int, scale: float, cap: int | None) -> int:
    """A length after scaling and capping; at least one token (a request asks for something)."""
    value = max(1, round(tokens * scale))
    return min(value, cap) if cap is not None else value


def scaled_block_tokens(spec: TraceSpec) -> int:
    """Tokens per hash id after scaling: scaled with the lengths, so a shared prefix stays a shared prefix."""
    return max(1, round(spec.block_tokens * spec.input_scale))


def scale_window(rows: Sequence[TraceRow], spec: TraceSpec) -> tuple[ScaledRequest, ...]:
    """Lengths scaled and capped, the prompt cut into scaled blocks; arrivals in trace seconds from the first."""
    block = scaled_block_tokens(spec)
    start = rows[0].arrival_s if rows else 0.0
    out = []
    for row in rows:
        n_in = scaled_length(row.input_tokens, spec.input_scale, spec.max_input_tokens)
        n_out = scaled_length(row.output_tokens, spec.output_scale, spec.max_output_tokens)
        ids: Sequence[int | None] = row.hash_ids or [None] * math.ceil(n_in / block)
        blocks: list[tuple[int | None, int]] = []
        left = n_in
        for i, hid in enumerate(ids):
            if left <= 0:
                break
            # Rounding can leave a few tokens past the last id's block: they are the request's own tail.
            take = left if i == len(ids) - 1 else min(block, left)
            blocks.append((hid, take))
            left -= take
        out.append(ScaledRequest(row.line, row.arrival_s - start, n_in, n_out, tuple(blocks)))
    return tuple(out)


def prefix_reuse(requests: Sequence[ScaledRequest]) -> float:
    """The share of input tokens that repeat a prefix an earlier request sent (the hash ids say which): what a
    prefix cache of unbounded size could reuse, nothing more."""
    seen: set[int] = set()
    total = reused = 0
    for r in requests:
        chain, shared = 0, True
        for hid, n in r.blocks:
            total += n
            if hid is None:
                shared = False
                continue
            chain = hash((chain, hid, n))
            if shared and chain in seen:
                reused += n
            else:
                shared = False
            seen.add(chain)
    return reused / total if total else 0.0


def replay_time_scale(requests: int, span_s: float, rate: float | None, time_scale: float) -> float:
    """The factor on every trace gap: the one that gives a window of `requests` over `span_s` trace seconds a mean
    rate of `rate` req/s (a step or a capacity search changes the rate), else the playbook's time_scale."""
    if rate is None or span_s <= 0 or requests < 2:
        return time_scale
    return (requests - 1) / (span_s * rate)


def window_facts(requests: Sequence[ScaledRequest]) -> TraceFacts:
    longest = max(requests, key=lambda r: r.input_tokens + r.output_tokens)
    n = len(requests)
    return TraceFacts(
        requests=n,
        span_s=requests[-1].arrival_s,
        input_mean_tokens=sum(r.input_tokens for r in requests) / n,
        output_mean_tokens=sum(r.output_tokens for r in requests) / n,
        longest_input_tokens=max(r.input_tokens for r in requests),
        longest_output_tokens=max(r.output_tokens for r in requests),
        longest_line=longest.line,
        longest_tokens=longest.input_tokens + longest.output_tokens,
        prefix_reuse=prefix_reuse(requests),
    )


# ------------------------------------------------------------------------------------------------------ validate
def _duration(raw: Mapping[str, object], key: str, path: YamlPath, problems: Problems) -> float | None:
    if key not in raw:
        return None
    try:
        return units.parse_duration_s(raw[key])
    except units.UnitError as exc:
        problems.add((*path, key), str(exc))
        return None


def trace_spec(raw: TraceDoc, file: Path, path: YamlPath, problems: Problems) -> TraceSpec:
    """workload.trace as written (the file already resolved and found inside the playbook's tree)."""
    return TraceSpec(
        file=str(file),
        format=raw["format"],
        start_s=_duration(raw, "start", path, problems) or 0.0,
        duration_s=_duration(raw, "duration", path, problems),
        time_scale=raw.get("time_scale", 1.0),
        input_scale=raw.get("input_scale", 1.0),
        output_scale=raw.get("output_scale", 1.0),
        max_input_tokens=raw.get("max_input_tokens"),
        max_output_tokens=raw.get("max_output_tokens"),
        block_tokens=raw.get("block_tokens", 512),
    )


def apply_trace(
    workload: Workload, raw: WorkloadDoc, file: Path | None, path: YamlPath, problems: Problems
) -> Workload:
    """The workload with its trace read: the window's facts, its mean rate (workload.rate, from trace.time_scale
    when not written) and its request count (num_requests, the window's when not written). `raw` is the workload
    mapping; `path` its YAML path. Each bad line of the trace is a problem at the trace's FILE:LINE."""
    tpath = (*path, "trace")
    traw = raw["trace"]
    for key, why in TRACE_OWNS.items():
        if key in raw:
            problems.add((*path, key), f"{why}; expected no {key} alongside workload.trace")
    if "rate" in raw and "time_scale" in traw:
        problems.add(
            (*tpath, "time_scale"),
            "both workload.rate and trace.time_scale are set; expected one: rate (the window's mean req/s) "
            "or time_scale (a factor on the trace's gaps)",
        )
    if file is None:
        return workload
    spec = trace_spec(traw, file, tpath, problems)
    wanted = workload.warmup_requests + workload.num_requests if workload.num_requests is not None else None
    try:
        rows = read_window(spec, wanted)
    except TraceProblems as exc:
        for line in exc.lines:
            problems.add((*tpath, "file"), line)
        return workload
    except PlaybookError as exc:
        problems.add((*tpath, "file"), str(exc))
        return workload
    requests = scale_window(rows, spec)
    facts = window_facts(requests)
    spec = replace(spec, facts=facts)
    shown = display_path(spec.file)
    if wanted is not None and facts.requests < wanted:
        problems.add(
            (*path, "num_requests"),
            f"the trace's window holds {facts.requests} requests ({shown}); expected at least {wanted} "
            "(warmup_requests + num_requests): widen trace.duration or lower num_requests",
        )
        return workload
    if facts.requests < 2 or facts.span_s <= 0:
        problems.add(
            tpath,
            f"the window of {shown} holds {facts.requests} request(s) arriving at one instant; expected a window "
            "that spans some time, so it has a rate",
        )
        return workload
    num_requests = workload.num_requests
    if num_requests is None:
        num_requests = facts.requests - workload.warmup_requests
        if num_requests < 1:
            problems.add(
                (*path, "warmup_requests"),
                f"the trace's window holds {facts.requests} requests, all of them warm-up; expected fewer "
                "warmup_requests or a wider window",
            )
            return workload
    rate = workload.rate if workload.rate is not None else (facts.requests - 1) / (facts.span_s * spec.time_scale)
    return replace(workload, trace=spec, rate=rate, num_requests=num_requests)


def describe_trace(workload: Workload) -> str:
    """The plan's line for a replayed trace: the file, the window, the replay rate, scaled lengths, reuse."""
    spec = workload.trace
    if spec is None or spec.facts is None:
        return ""
    f = spec.facts
    scale = replay_time_scale(f.requests, f.span_s, workload.rate, spec.time_scale)
    caps = []
    if spec.max_input_tokens is not None:
        caps.append(f"input capped at {spec.max_input_tokens}")
    if spec.max_output_tokens is not None:
        caps.append(f"output capped at {spec.max_output_tokens}")
    window = f"from {spec.start_s:g} s" + (f" for {spec.duration_s:g} s" if spec.duration_s is not None else "")
    return (
        f"trace {display_path(spec.file)} ({spec.format}), window {window}: {f.requests} requests over "
        f"{f.span_s:g} s of trace time, replayed at {workload.rate or 0:.4g} req/s (time scale {scale:.4g}, "
        f"{f.span_s * scale:.4g} s); input mean {f.input_mean_tokens:.1f} max {f.longest_input_tokens} tokens, "
        f"output mean {f.output_mean_tokens:.1f} max {f.longest_output_tokens} tokens "
        f"(scaled x{spec.input_scale:g} / x{spec.output_scale:g}{', ' + ', '.join(caps) if caps else ''}), "
        f"prefix reuse {f.prefix_reuse:.0%} (blocks of {scaled_block_tokens(spec)} tokens)"
    )
