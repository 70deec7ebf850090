"""What a load run leaves behind: one RequestRecord per request sent, the LoadResult, and their DataFrame codec."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any  # Any: a pandas cell's value (pandas ships no types)

if TYPE_CHECKING:
    import pandas as pd

ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "truncated", "protocol")


@dataclass(frozen=True)
class RequestRecord:
    """One request as it happened. Times are time.perf_counter_ns; None where it never happened."""

    index: int
    is_warmup: bool
    stream: bool
    scheduled_ns: int  # when the schedule wanted it sent (open loop) / when its user was free (closed)
    # When the request was handed to the transport, before it acquired a connection (a connect and TLS
    # handshake count, as in vllm bench serve); on every path, http or https, reused connection or new.
    sent_ns: int
    # First SSE message with non-empty choices, text or not (a role-only chunk counts): TTFT, as vLLM's.
    first_chunk_ns: int | None
    first_content_ns: int | None  # first chunk carrying non-reasoning content (TTFO)
    chunk_ns: tuple[int, ...]  # arrival of every message with non-empty choices (role-only, empty finish included)
    end_ns: int | None  # last message with non-empty choices (stream) or the full body (non-stream); not usage/[DONE]
    input_tokens: int  # usage.prompt_tokens, else the planned count
    output_tokens: int  # usage.completion_tokens, else counted from the text (see output_tokens_source)
    # "usage" | "counted" (the exact tokenizer counted the text) | "estimated" (an approximate tokenizer did)
    output_tokens_source: str
    finish_reason: str | None
    http_status: int | None
    error_kind: str | None  # None | connect | timeout | http_4xx | http_5xx | truncated | protocol
    error_message: str | None
    queue_wait_s: float  # time waiting for a client-side slot (semaphore) before scheduling
    bytes_received: int = 0
    conversation_id: int = 0
    turn: int = 0
    # When the client saw the request end, however it ended (last byte, error or timeout): a failed
    # request that never sent text still occupied the measured window until then.
    finished_ns: int | None = None
    # First chunk carrying generated text, content or reasoning (AIPerf's TTFT): ttft_content. Archives written
    # before it existed timed only text chunks, so their first_chunk_ns is this (records_from_dataframe).
    first_text_ns: int | None = None
    # Prompt tokens the engine said it served from its prefix cache (usage.prompt_tokens_details.cached_tokens, or
    # llama.cpp's timings.cache_n); None where it did not say.
    cached_tokens: int | None = None
    # The sent prompt's fingerprint, for the workload's own prefix reuse (metrics.prompt_prefix_reuse): a chained
    # hash at the end of each piece (system prompt, each message, the new text) and the characters up to there.
    prompt_hashes: tuple[int, ...] = ()
    prompt_chars: tuple[int, ...] = ()
    # The chained hash of the prompt followed by the reply: the prefix the conversation's next turn resends.
    reply_hash: int | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclass(frozen=True)
class LoadResult:
    records: tuple[RequestRecord, ...]
    mode: str  # "closed" | "open"
    start_ns: int  # measured window start (after warm-up)
    end_ns: int  # last measured request finished: its last text chunk (ok) or when its failure was seen
    duration_s: float  # benchmark duration: measured window, warm-up excluded
    warmup_duration_s: float
    schedule_lag_p50_s: float | None  # open loop: how late requests left vs the arrival schedule
    schedule_lag_p99_s: float | None
    schedule_lag_max_s: float | None
    tokenizer: str
    counted_tokens: bool  # some output_tokens were counted (or estimated) because the server sent no usage

    def measured(self) -> tuple[RequestRecord, ...]:
        return after_warmup(self.records)


def after_warmup(records: Iterable[RequestRecord]) -> tuple[RequestRecord, ...]:
    """The requests sent after the warm-up: what a trial's figures, its measured window and its schedule lag are
    over."""
    return tuple(r for r in records if not r.is_warmup)


RECORD_COLUMNS = tuple(f.name for f in fields(RequestRecord))
_NULLABLE_INT_COLUMNS = (
    "first_chunk_ns",
    "first_content_ns",
    "end_ns",
    "http_status",
    "finished_ns",
    "first_text_ns",
    "cached_tokens",
    "reply_hash",
)
_LIST_COLUMNS = ("chunk_ns", "prompt_hashes", "prompt_chars")


def records_to_dataframe(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """One row per request, one column per RequestRecord field; chunk_ns as a list column (Parquet keeps it).

    The archive's table adds each request's latencies to these columns: metrics.per_request_frame.
    """
    import pandas as pd  # deferred: pandas takes a second to import and only archiving needs it

    # Column by column: asdict() per record deep-copies every chunk tuple.
    columns: dict[str, list[object]] = {name: [getattr(r, name) for r in records] for name in RECORD_COLUMNS}
    for name in _LIST_COLUMNS:
        columns[name] = [list(getattr(r, name)) for r in records]
    df = pd.DataFrame(columns, columns=list(RECORD_COLUMNS))
    for col in _NULLABLE_INT_COLUMNS:
        df[col] = df[col].astype("Int64")
    return df


def records_from_dataframe(df: pd.DataFrame) -> tuple[RequestRecord, ...]:
    """Inverse of records_to_dataframe (for re-summarizing an archived run; Parquet or CSV-read frames).

    Columns that are no RequestRecord field (the archive's latency columns) are ignored. A frame without
    first_text_ns was written when only text chunks were timed: its first_chunk_ns, chunk_ns and end_ns are those of
    text chunks (TTFT then meant first text), so first_text_ns is its first_chunk_ns."""
    legacy = "first_text_ns" not in df.columns
    out = []
    for row in df.to_dict("records"):
        kw = {name: _none_if_na(row.get(name)) for name in RECORD_COLUMNS}
        if legacy:
            kw["first_text_ns"] = kw["first_chunk_ns"]
        for name in _LIST_COLUMNS:
            values = kw[name]
            if isinstance(values, str):  # a CSV round trip writes the list as text
                values = json.loads(values) if values.strip() else ()
            kw[name] = tuple(int(x) for x in (values if values is not None else ()))
        for name in _NULLABLE_INT_COLUMNS:
            kw[name] = None if kw[name] is None else int(kw[name])
        for name in (
            "index",
            "scheduled_ns",
            "sent_ns",
            "input_tokens",
            "output_tokens",
            "bytes_received",
            "conversation_id",
            "turn",
        ):
            kw[name] = int(kw[name] or 0)
        kw["is_warmup"], kw["stream"] = bool(kw["is_warmup"]), bool(kw["stream"])
        kw["queue_wait_s"] = float(kw["queue_wait_s"] or 0.0)
        kw["output_tokens_source"] = kw["output_tokens_source"] or "usage"
        out.append(RequestRecord(**kw))
    return tuple(out)


def _none_if_na(v: Any) -> Any:  # a pandas cell: its type is the column's, which pandas does not type
    if v is None or isinstance(v, (str, bytes, list, tuple)) or hasattr(v, "__len__"):
        return v
    import pandas as pd  # deferred: pandas takes a second to import and only archived frames reach here

    try:
        return None if pd.isna(v) else v
    except (TypeError, ValueError):
        return v
