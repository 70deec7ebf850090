"""The async load generator: sends PlannedRequests closed-loop (N users) or open-loop (R req/s) and records each one."""
from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from dataclasses import dataclass, fields
from typing import Any, Iterable, Iterator, Sequence

import httpx
import numpy as np

from llmplay.spec import Workload
from llmplay.loadgen.sse import StreamState
from llmplay.loadgen.tokenizer import Tokenizer, WordRatioTokenizer
from llmplay.loadgen.transport import StampedBytes, StreamingTransport, BodyStream
from llmplay.loadgen.workload import PlannedRequest

ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "truncated", "protocol")
_now = time.perf_counter_ns  # the one clock


@dataclass(frozen=True)
class RequestRecord:
    """One request as it happened. Times are time.perf_counter_ns; None where it never happened."""

    index: int
    is_warmup: bool
    stream: bool
    scheduled_ns: int  # when the schedule wanted it sent (open loop) / when its user was free (closed)
    sent_ns: int  # just before the request left the client
    first_chunk_ns: int | None  # first chunk carrying generated text (content or reasoning): TTFT
    first_content_ns: int | None  # first chunk carrying non-reasoning content (TTFO)
    chunk_ns: tuple[int, ...]  # arrival of every text-bearing chunk
    end_ns: int | None  # last text-bearing chunk (stream) or full body (non-stream); not usage/[DONE]
    input_tokens: int  # usage.prompt_tokens, else the planned count
    output_tokens: int  # usage.completion_tokens, else counted (see output_tokens_source)
    output_tokens_source: str  # "usage" | "counted"
    finish_reason: str | None
    http_status: int | None
    error_kind: str | None  # None | connect | timeout | http_4xx | http_5xx | truncated | protocol
    error_message: str | None
    queue_wait_s: float  # time waiting for a client-side slot (semaphore) before scheduling
    bytes_received: int = 0
    conversation_id: int = 0
    turn: int = 0

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclass(frozen=True)
class LoadResult:
    records: tuple[RequestRecord, ...]
    mode: str  # "closed" | "open"
    start_ns: int  # measured window start (after warm-up)
    end_ns: int  # last measured request finished
    duration_s: float  # benchmark duration: measured window, warm-up excluded
    warmup_duration_s: float
    schedule_lag_p50_s: float | None  # open loop: how late requests left vs the arrival schedule
    schedule_lag_p99_s: float | None
    schedule_lag_max_s: float | None
    tokenizer: str
    counted_tokens: bool  # some output_tokens were counted because the server sent no usage

    def measured(self) -> tuple[RequestRecord, ...]:
        return tuple(r for r in self.records if not r.is_warmup)

    def to_dataframe(self) -> Any:
        return records_to_dataframe(self.records)


RECORD_COLUMNS = tuple(f.name for f in fields(RequestRecord))


def records_to_dataframe(records: Sequence[RequestRecord]) -> Any:
    """One row per request; chunk_ns as a list column (Parquet keeps it), plus derived seconds."""
    import pandas as pd

    # Column by column: asdict() per record deep-copies every chunk tuple.
    columns: dict[str, list] = {name: [getattr(r, name) for r in records] for name in RECORD_COLUMNS}
    columns["chunk_ns"] = [list(r.chunk_ns) for r in records]
    df = pd.DataFrame(columns, columns=list(RECORD_COLUMNS))
    for col in ("first_chunk_ns", "first_content_ns", "end_ns", "http_status"):
        df[col] = df[col].astype("Int64")
    sent = df["sent_ns"].astype("Int64")
    df["ttft_s"] = ((df["first_chunk_ns"] - sent) / 1e9).astype("Float64")
    df["e2el_s"] = ((df["end_ns"] - sent) / 1e9).astype("Float64")
    df["schedule_lag_s"] = (df["sent_ns"] - df["scheduled_ns"]) / 1e9
    return df


def records_from_dataframe(df: Any) -> tuple[RequestRecord, ...]:
    """Inverse of records_to_dataframe (for re-summarizing an archived run; Parquet or CSV-read frames)."""
    out = []
    for row in df.to_dict("records"):
        kw = {name: _none_if_na(row.get(name)) for name in RECORD_COLUMNS}
        chunks = kw["chunk_ns"]
        if isinstance(chunks, str):  # a CSV round trip writes the list as text
            chunks = json.loads(chunks) if chunks.strip() else ()
        kw["chunk_ns"] = tuple(int(x) for x in (chunks if chunks is not None else ()))
        for name in ("first_chunk_ns", "first_content_ns", "end_ns", "http_status"):
            kw[name] = None if kw[name] is None else int(kw[name])
        for name in ("index", "scheduled_ns", "sent_ns", "input_tokens", "output_tokens", "bytes_received",
                     "conversation_id", "turn"):
            kw[name] = int(kw[name] or 0)
        kw["is_warmup"], kw["stream"] = bool(kw["is_warmup"]), bool(kw["stream"])
        kw["queue_wait_s"] = float(kw["queue_wait_s"] or 0.0)
        kw["output_tokens_source"] = kw["output_tokens_source"] or "usage"
        out.append(RequestRecord(**kw))
    return tuple(out)


def _none_if_na(v: Any) -> Any:
    if v is None or isinstance(v, (str, bytes, list, tuple)) or hasattr(v, "__len__"):
        return v
    try:
        import pandas as pd

        return None if pd.isna(v) else v
    except (TypeError, ValueError):
        return v


class _Feed:
    """Hands out planned requests; a lazy iterator is drawn ahead in a thread so prompt building
    (which may call the engine's tokenizer) never blocks the event loop mid-measurement."""

    def __init__(self, requests: Iterable[PlannedRequest], ahead: int):
        self._ahead = max(16, ahead)
        self._seq: Sequence[PlannedRequest] | None = None
        self._pos = 0
        self._buf: collections.deque[PlannedRequest] = collections.deque()
        self._it: Iterator[PlannedRequest] | None = None
        self._exhausted = False
        self._refill: asyncio.Future | None = None
        if isinstance(requests, (list, tuple)):
            self._seq = requests
        else:
            self._it = iter(requests)
            self._draw(self._ahead)  # before the clock starts

    def _draw(self, n: int) -> list[PlannedRequest]:
        assert self._it is not None
        got = []
        for _ in range(n):
            try:
                got.append(next(self._it))
            except StopIteration:
                self._exhausted = True
                break
        self._buf.extend(got)
        return got

    def peek(self) -> PlannedRequest | None:
        if self._seq is not None:
            return self._seq[self._pos] if self._pos < len(self._seq) else None
        return self._buf[0] if self._buf else None

    async def next(self) -> PlannedRequest | None:
        if self._seq is not None:
            if self._pos >= len(self._seq):
                return None
            self._pos += 1
            return self._seq[self._pos - 1]
        while not self._buf:
            if self._exhausted:
                return None
            await self._start_refill()
        item = self._buf.popleft()
        if len(self._buf) < self._ahead // 2 and not self._exhausted:
            await self._start_refill(wait=False)
        return item

    async def _start_refill(self, wait: bool = True) -> None:
        if self._refill is None or self._refill.done():
            self._refill = asyncio.ensure_future(asyncio.to_thread(self._draw, self._ahead))
        if wait:
            await self._refill

    async def aclose(self) -> None:
        if self._refill is not None and not self._refill.done():
            await self._refill


class _Run:
    """State shared by the tasks of one load run."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, workload: Workload):
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.workload = workload
        self.records: list[RequestRecord] = []
        self.texts: dict[int, str] = {}  # generated text of requests without usage, counted afterwards
        self.inflight = 0
        self.out_tokens = 0
        self.errors = 0
        # Multi-turn: turn k of a conversation waits for turn k-1 (its history) to finish.
        self._turn_done: dict[tuple[int, int], asyncio.Event] = {}
        self._direct = _direct_transport(client)
        self._urls = {api: httpx.URL(self.base_url + path) for api, path in
                      (("chat", "/v1/chat/completions"), ("completions", "/v1/completions"))}
        self._headers = httpx.Headers({**dict(client.headers), "content-type": "application/json"})
        self._timeout_ext = {"timeout": client.timeout.as_dict()}

    def _turn_event(self, conversation: int, turn: int) -> asyncio.Event:
        return self._turn_done.setdefault((conversation, turn), asyncio.Event())

    async def send(self, planned: PlannedRequest, scheduled_ns: int, warmup: bool,
                   queue_wait_s: float = 0.0) -> RequestRecord:
        if planned.turn > 0:
            t_wait = _now()
            await self._turn_event(planned.conversation_id, planned.turn - 1).wait()
            del self._turn_done[(planned.conversation_id, planned.turn - 1)]
            queue_wait_s += (_now() - t_wait) / 1e9
        try:
            return await self._send(planned, scheduled_ns, warmup, queue_wait_s)
        finally:
            if self.workload.turns > 1:
                self._turn_event(planned.conversation_id, planned.turn).set()

    async def _send(self, planned: PlannedRequest, scheduled_ns: int, warmup: bool,
                    queue_wait_s: float) -> RequestRecord:
        wl = self.workload
        body = json.dumps(planned.body(temperature=wl.temperature, ignore_eos=wl.ignore_eos)).encode()
        url = self._urls["chat" if planned.messages is not None else "completions"]
        if self._direct is not None:
            request = httpx.Request("POST", url, content=body, headers=self._headers, extensions=self._timeout_ext)
        else:
            request = self.client.build_request("POST", url, content=body, headers={"content-type": "application/json"})
        state = StreamState()
        status: int | None = None
        kind: str | None = None
        message: str | None = None
        usage: dict | None = None
        finish: str | None = None
        raw = b""
        self.inflight += 1
        sent_ns = _now()
        end_ns: int | None = None
        first_ns: int | None = None
        try:
            async with asyncio.timeout(wl.request_timeout_s):
                if self._direct is not None:
                    # Straight to our transport: when 1,024 users resend at once, every microsecond
                    # spent in the client's layers delays reading chunks that have already arrived.
                    response = await self._direct.handle_async_request(request)
                else:
                    response = await self.client.send(request, stream=True)
                # The transport knows when the bytes were written; httpx's own bookkeeping is not latency.
                sent_ns = response.extensions.get("llmplay.sent_ns", sent_ns)
                try:
                    status = response.status_code
                    if status >= 400:
                        raw = await response.aread()
                        kind = "http_4xx" if status < 500 else "http_5xx"
                        message = f"HTTP {status}: {raw[:300].decode('utf-8', 'replace')}"
                    elif planned.stream:
                        if type(response.stream) is BodyStream:
                            # Parsed as each read lands, inside the transport's protocol callback.
                            await response.stream.feed_into(state.feed)
                        else:
                            feed = state.feed
                            async for data in response.aiter_raw():
                                # Stamped on arrival (by the transport, or here), before any parsing.
                                feed(data, data.t_ns if type(data) is StampedBytes else _now())
                        if state.error is not None:
                            kind, message = "protocol", f"error event in stream: {state.error}"
                        elif not state.done:
                            kind = "truncated"
                            message = f"stream ended without [DONE] after {len(state.chunk_ns)} text chunks"
                    else:
                        pieces = []
                        async for data in response.aiter_raw():
                            pieces.append(data)
                            end_ns = data.t_ns if type(data) is StampedBytes else _now()
                        raw = b"".join(pieces)
                        first_ns = end_ns
                finally:
                    await response.aclose()
        except TimeoutError:
            kind = "timeout"
            message = f"no complete response within request_timeout {wl.request_timeout_s:g}s"
        except httpx.TimeoutException as exc:
            kind, message = "timeout", f"{type(exc).__name__}: {exc}"
        except httpx.ConnectError as exc:
            kind, message = "connect", f"cannot connect to {self.base_url}: {exc}"
        except (httpx.TransportError, httpx.StreamError) as exc:
            # After the headers the response was cut short; before them the connection failed.
            kind = "truncated" if status is not None else "connect"
            message = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - anything else still leaves a record, never a lost request
            kind, message = "protocol", f"unexpected {type(exc).__name__}: {exc}"
        finally:
            self.inflight -= 1
        text = ""
        if planned.stream:
            usage, finish = state.usage, state.finish_reason
            first_ns, end_ns = state.first_chunk_ns, state.end_ns
            if kind is not None and state.bytes_received:
                message = f"{message}; {state.bytes_received} bytes received, unparsed tail {state.tail()!r}"
            text = state.text
        elif kind is None:
            try:
                obj = json.loads(raw)
                choice = obj["choices"][0]
                text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
                finish, usage = choice.get("finish_reason"), obj.get("usage")
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                kind, message = "protocol", f"bad completion body ({exc}): {raw[:200]!r}"
        if kind is None and first_ns is None:
            kind, message = "protocol", "response carried no generated text"
        if usage and isinstance(usage.get("completion_tokens"), int):
            out_tokens, source = int(usage["completion_tokens"]), "usage"
        else:
            out_tokens, source = len(state.chunk_ns) if planned.stream else 0, "counted"
            self.texts[planned.index] = text
        in_tokens = int(usage["prompt_tokens"]) if usage and isinstance(usage.get("prompt_tokens"), int) \
            else planned.input_tokens
        rec = RequestRecord(
            index=planned.index, is_warmup=warmup or planned.is_warmup, stream=planned.stream,
            scheduled_ns=scheduled_ns, sent_ns=sent_ns, first_chunk_ns=first_ns,
            first_content_ns=state.first_content_ns if planned.stream else first_ns,
            chunk_ns=tuple(state.chunk_ns) if planned.stream else ((end_ns,) if end_ns is not None else ()),
            end_ns=end_ns, input_tokens=in_tokens, output_tokens=out_tokens, output_tokens_source=source,
            finish_reason=finish, http_status=status, error_kind=kind, error_message=message,
            queue_wait_s=queue_wait_s, bytes_received=state.bytes_received if planned.stream else len(raw),
            conversation_id=planned.conversation_id, turn=planned.turn,
        )
        self.records.append(rec)
        if kind is None:
            self.out_tokens += out_tokens
        else:
            self.errors += 1
        return rec


def _direct_transport(client: httpx.AsyncClient) -> StreamingTransport | None:
    """The client's StreamingTransport when nothing (mounts, auth, hooks, cookies) sits between them."""
    transport = getattr(client, "_transport", None)
    if not isinstance(transport, StreamingTransport):
        return None
    if getattr(client, "_mounts", None) or getattr(client, "auth", None) is not None:
        return None
    hooks = getattr(client, "event_hooks", {})
    if any(hooks.get(k) for k in ("request", "response")) or len(client.cookies):
        return None
    return transport


async def _closed_phase(run: _Run, feed: _Feed, users: int, *, warmup: bool, until_ns: int | None) -> None:
    async def user() -> None:
        while True:
            now = _now()
            if warmup:
                nxt = feed.peek()
                if nxt is None or (not nxt.is_warmup and (until_ns is None or now >= until_ns)):
                    return
            elif until_ns is not None and now >= until_ns:
                return
            planned = await feed.next()
            if planned is None:
                return
            await run.send(planned, _now(), warmup)

    await asyncio.gather(*(user() for _ in range(users)))


async def _open_phase(run: _Run, feed: _Feed, rng: np.random.Generator, *, warmup: bool,
                      until_ns: int | None) -> None:
    wl = run.workload
    assert wl.rate is not None and wl.rate > 0
    burst = max(1, wl.burst)
    mean_gap_s = burst / wl.rate  # rate counts requests, so bursts arrive rate/burst times a second
    tasks: set[asyncio.Task] = set()
    t0 = _now()
    offset_s = 0.0
    first = True
    while True:
        if not first:
            offset_s += float(rng.exponential(mean_gap_s)) if wl.arrival == "poisson" else mean_gap_s
        first = False
        at_ns = t0 + int(offset_s * 1e9)
        if warmup:
            # Warm-up lasts while planned warm-up requests remain or warmup_s has not passed.
            nxt = feed.peek()
            if nxt is None or (not nxt.is_warmup and (until_ns is None or at_ns >= until_ns)):
                break
        elif until_ns is not None and at_ns >= until_ns:
            break
        # Re-check after waking: the loop's timers round to the millisecond and may fire early.
        while (delay_ns := at_ns - _now()) > 0:
            await asyncio.sleep(delay_ns / 1e9)
        stop = False
        for _ in range(burst):
            planned = await feed.next()
            if planned is None:
                stop = True
                break
            task = asyncio.ensure_future(run.send(planned, at_ns, warmup))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if stop:
            break
    if tasks:
        await asyncio.gather(*tasks)


async def _progress_loop(run: _Run, total: int | None, duration_s: float | None, t0: int) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    cols = [TextColumn("[bold]load"), BarColumn(), TextColumn("{task.completed}/{task.total} req" if total
                                                              else "{task.completed:.0f}s"),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn()]
    with Progress(*cols, transient=True) as bar:
        task = bar.add_task("load", total=total or duration_s or None, stats="")
        while True:
            await asyncio.sleep(0.5)
            el = max((_now() - t0) / 1e9, 1e-9)
            done = len(run.records)
            stats = (f"{done / el:.1f} req/s  {run.out_tokens / el:.0f} tok/s  {run.errors} errors  "
                     f"{run.inflight} in flight")
            bar.update(task, completed=done if total else min(el, duration_s or el), stats=stats)


class LoadInterrupted(BaseException):
    """The load was cancelled (a signal): `partial` holds every request that had finished by then.

    A BaseException, like the cancellation it replaces, so nothing between here and the runner swallows it."""

    def __init__(self, partial: LoadResult):
        super().__init__("load interrupted")
        self.partial = partial


async def run_load(client: httpx.AsyncClient, base_url: str, workload: Workload,
                   requests: Iterable[PlannedRequest], *, progress: bool = False,
                   tokenizer: Tokenizer | None = None) -> LoadResult:
    """Warm-up phase (warmup_requests and/or warmup_s, flagged), then the measured phase until
    num_requests are done or duration_s has passed. Every request sent yields exactly one record."""
    if (workload.concurrency is None) == (workload.rate is None):
        raise ValueError("workload needs exactly one of concurrency (closed loop) or rate (open loop)")
    mode = "closed" if workload.concurrency is not None else "open"
    ahead = (workload.concurrency or 0) * 4 + int((workload.rate or 0) * 4) + workload.warmup_requests
    feed = _Feed(requests, ahead)
    run = _Run(client, base_url, workload)
    arrival_rng = np.random.default_rng([workload.seed, 7])
    show = progress and sys.stderr.isatty()
    bar: asyncio.Task | None = None
    t_warm = start_ns = _now()
    interrupted = False
    try:
        if workload.warmup_requests or workload.warmup_s:
            until = t_warm + int(workload.warmup_s * 1e9) if workload.warmup_s else None
            if mode == "closed":
                await _closed_phase(run, feed, workload.concurrency or 1, warmup=True, until_ns=until)
            else:
                await _open_phase(run, feed, arrival_rng, warmup=True, until_ns=until)
        start_ns = _now()
        until = start_ns + int(workload.duration_s * 1e9) if workload.duration_s is not None else None
        if show:
            bar = asyncio.ensure_future(_progress_loop(run, workload.num_requests, workload.duration_s, start_ns))
        if mode == "closed":
            await _closed_phase(run, feed, workload.concurrency or 1, warmup=False, until_ns=until)
        else:
            await _open_phase(run, feed, arrival_rng, warmup=False, until_ns=until)
        end_wall = _now()
    except asyncio.CancelledError:
        interrupted, end_wall = True, _now()
    finally:
        if bar is not None:
            bar.cancel()
            await asyncio.gather(bar, return_exceptions=True)
        try:
            await feed.aclose()
        except asyncio.CancelledError:
            interrupted = True
    # Interrupted: no more calls to the engine (its tokenizer may be the reason we stop); keep what finished.
    records = list(run.records) if interrupted else _count_missing_tokens(run.records, run.texts, tokenizer)
    measured = [r for r in records if not r.is_warmup]
    ends = [r.end_ns for r in measured if r.end_ns is not None]
    end_ns = max(ends) if ends else end_wall
    lag = np.array([(r.sent_ns - r.scheduled_ns) / 1e9 for r in measured]) if mode == "open" else np.array([])
    result = LoadResult(
        records=tuple(sorted(records, key=lambda r: r.index)), mode=mode, start_ns=start_ns, end_ns=end_ns,
        duration_s=max(end_ns - start_ns, 0) / 1e9, warmup_duration_s=(start_ns - t_warm) / 1e9,
        schedule_lag_p50_s=float(np.percentile(lag, 50)) if lag.size else None,
        schedule_lag_p99_s=float(np.percentile(lag, 99)) if lag.size else None,
        schedule_lag_max_s=float(lag.max()) if lag.size else None,
        tokenizer=tokenizer.name if tokenizer is not None else "none",
        counted_tokens=any(r.output_tokens_source == "counted" and r.ok for r in measured),
    )
    if interrupted:
        raise LoadInterrupted(result)
    return result


def _count_missing_tokens(records: list[RequestRecord], texts: dict[int, str],
                          tokenizer: Tokenizer | None) -> list[RequestRecord]:
    """Server sent no usage: count the generated text with the tokenizer (after the timed run), or
    fall back to one token per text chunk (streams) / the word ratio (non-streamed)."""
    from dataclasses import replace

    out = []
    fallback = WordRatioTokenizer()
    for r in records:
        if r.output_tokens_source == "counted" and r.index in texts:
            text = texts[r.index]
            if tokenizer is not None and tokenizer.exact and text:
                r = replace(r, output_tokens=tokenizer.count(text))
            elif not r.stream:
                r = replace(r, output_tokens=fallback.count(text))
        out.append(r)
    return out


def client_limits(workload: Workload) -> httpx.Limits:
    """One connection per user (closed loop); unbounded for open loop so no request queues in the pool."""
    if workload.concurrency is not None:
        n = workload.concurrency
        return httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=30)
    return httpx.Limits(max_connections=None, max_keepalive_connections=max(64, int((workload.rate or 1) * 4)),
                        keepalive_expiry=30)


def make_client(workload: Workload) -> httpx.AsyncClient:
    t = workload.request_timeout_s
    return httpx.AsyncClient(transport=StreamingTransport(), limits=client_limits(workload),
                             timeout=httpx.Timeout(t, connect=min(t, 10.0)), trust_env=False)


def run_load_sync(base_url: str, workload: Workload, requests: Iterable[PlannedRequest], *,
                  progress: bool = False, tokenizer: Tokenizer | None = None) -> LoadResult:
    """run_load with its own AsyncClient sized to the load, on uvloop where installed."""

    async def main() -> LoadResult:
        async with make_client(workload) as client:
            return await run_load(client, base_url, workload, requests, progress=progress, tokenizer=tokenizer)

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())
