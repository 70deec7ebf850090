"""Sending one planned request and turning its response into a RequestRecord; the state a load run's senders share."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TypedDict

import httpx

from llmplay.hashing import chain_hash
from llmplay.loadgen.clock import now_ns
from llmplay.loadgen.records import RequestRecord
from llmplay.loadgen.sse import StreamState
from llmplay.loadgen.transport import BodyStream, StampedBytes, StreamingTransport
from llmplay.loadgen.workload import PlannedRequest, prompt_segments
from llmplay.spec import Workload


@dataclass(slots=True)
class _Exchange:
    """What one request's HTTP exchange produced, filled in as it goes."""

    sent_ns: int
    status: int | None = None
    error_kind: str | None = None
    error_message: str | None = None
    body: bytes = b""  # the whole body of a non-streamed or failed response
    end_ns: int | None = None  # non-streamed: when the last body byte so far arrived
    body_done_ns: int | None = None  # non-streamed: when the whole body had arrived
    finished_ns: int | None = None  # when the exchange ended, however it ended (a timeout included)

    def fail(self, kind: str, message: str) -> None:
        self.error_kind, self.error_message = kind, message


@dataclass(slots=True)
class _Reply:
    """What the response said, streamed or not."""

    text: str = ""  # what output tokens are counted on: content, and reasoning where a chunk has no content
    content: str = ""  # the reply alone, without reasoning: what the conversation's next turn resends
    usage: dict[str, object] | None = None
    finish_reason: str | None = None
    first_ns: int | None = None
    end_ns: int | None = None
    timings: dict[str, object] | None = None  # llama.cpp's per-request timings (a non-streamed body's)


class LoadSender:
    """Sends the requests of one load run, one task each, and keeps their records and live counters.

    transport: the StreamingTransport the client was built on, to send straight to it (pass it only
    when nothing sits between them: no auth, hooks, cookies or mounts); None sends through the client.
    """

    def __init__(
        self, client: httpx.AsyncClient, base_url: str, workload: Workload, transport: StreamingTransport | None = None
    ):
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.workload = workload
        self.records: list[RequestRecord] = []
        self.texts: dict[int, str] = {}  # generated text of requests without usage, counted afterwards
        self.inflight = 0
        self.out_tokens = 0
        self.errors = 0
        # Multi-turn: each conversation's (user text, reply as the server returned it) turns so far. The arrival
        # loops run a conversation's turns one after another, so turn k finds turn k-1's reply here.
        self._history: dict[int, list[tuple[str, str]]] = {}
        self._direct = transport
        self._urls = {
            api: httpx.URL(self.base_url + path)
            for api, path in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions"))
        }
        self._headers = httpx.Headers({**dict(client.headers), "content-type": "application/json"})
        self._timeout_ext = {"timeout": client.timeout.as_dict()}

    async def send(
        self, planned: PlannedRequest, scheduled_ns: int, warmup: bool, queue_wait_s: float = 0.0
    ) -> RequestRecord:
        """Send one request (a later turn with its conversation's real history) and record it."""
        history: list[tuple[str, str]] = []
        if planned.turn > 0:
            history = self._history.get(planned.conversation_id, [])
            planned = planned.resend(history)
        rec, reply = await self._send(planned, scheduled_ns, warmup, queue_wait_s, history)
        if not planned.final_turn:
            # Whatever the server returned is the history, a cut-off reply included: a client would show that.
            self._history.setdefault(planned.conversation_id, history)
            history.append((planned.user_text, reply))
        else:
            self._history.pop(planned.conversation_id, None)
        return rec

    async def _send(
        self,
        planned: PlannedRequest,
        scheduled_ns: int,
        warmup: bool,
        queue_wait_s: float,
        history: list[tuple[str, str]],
    ) -> tuple[RequestRecord, str]:
        request = self._build_request(planned)
        state = StreamState()
        self.inflight += 1
        exchange = _Exchange(sent_ns=now_ns())
        try:
            await self._exchange(request, planned.stream, state, exchange)
        finally:
            exchange.finished_ns = now_ns()
            self.inflight -= 1
        reply = _stream_reply(state, exchange) if planned.stream else _body_reply(exchange)
        if exchange.error_kind is None and reply.first_ns is None:
            # As vllm bench serve: a reply is one once a message with non-empty choices came, even without text
            # (an immediate EOS); a stream of usage and [DONE] alone has no first token to time.
            exchange.fail("protocol", "response carried no token (no message with non-empty choices)")
        fingerprint = _fingerprint(planned, history, reply.content)
        rec = self._record(planned, scheduled_ns, warmup, queue_wait_s, exchange, reply, state, fingerprint)
        self.records.append(rec)
        if rec.error_kind is None:
            self.out_tokens += rec.output_tokens
        else:
            self.errors += 1
        return rec, reply.content

    def _build_request(self, planned: PlannedRequest) -> httpx.Request:
        wl = self.workload
        body = json.dumps(planned.body(temperature=wl.temperature, ignore_eos=wl.ignore_eos)).encode()
        url = self._urls["chat" if planned.messages is not None else "completions"]
        # The same value on every turn of a conversation, so a router that pins sessions keeps it on one replica.
        session = {wl.session_header: f"{wl.seed}-{planned.conversation_id}"} if wl.session_header else {}
        if self._direct is not None:
            headers = httpx.Headers({**self._headers, **session}) if session else self._headers
            return httpx.Request("POST", url, content=body, headers=headers, extensions=self._timeout_ext)
        return self.client.build_request(
            "POST", url, content=body, headers={"content-type": "application/json", **session}
        )

    async def _exchange(self, request: httpx.Request, stream: bool, state: StreamState, exchange: _Exchange) -> None:
        """Send, read the whole response into state (stream) or exchange.body; failures go to exchange."""
        timeout_s = self.workload.request_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                if self._direct is not None:
                    # Straight to our transport: when 1,024 users resend at once, every microsecond
                    # spent in the client's layers delays reading chunks that have already arrived.
                    response = await self._direct.handle_async_request(request)
                else:
                    response = await self.client.send(request, stream=True)
                # The transport stamps when it took the request, before acquiring a connection, on every path;
                # httpx's own bookkeeping before that is not latency. Every other transport keeps our stamp.
                exchange.sent_ns = response.extensions.get("llmplay.sent_ns", exchange.sent_ns)
                try:
                    exchange.status = response.status_code
                    if response.status_code >= 400:
                        await _read_error_body(response, exchange)
                    elif stream:
                        await _read_stream(response, state, exchange)
                    else:
                        await _read_body(response, exchange)
                finally:
                    await response.aclose()
        except TimeoutError:
            exchange.fail("timeout", f"no complete response within request_timeout {timeout_s:g}s")
        except httpx.TimeoutException as exc:
            exchange.fail("timeout", f"{type(exc).__name__}: {exc}")
        except httpx.ConnectError as exc:
            exchange.fail("connect", f"cannot connect to {self.base_url}: {exc}")
        except (httpx.TransportError, httpx.StreamError) as exc:
            # After the headers the response was cut short; before them the connection failed.
            exchange.fail("truncated" if exchange.status is not None else "connect", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # anything else still leaves a record, never a lost request
            exchange.fail("protocol", f"unexpected {type(exc).__name__}: {exc}")

    def _record(
        self,
        planned: PlannedRequest,
        scheduled_ns: int,
        warmup: bool,
        queue_wait_s: float,
        exchange: _Exchange,
        reply: _Reply,
        state: StreamState,
        fingerprint: Fingerprint,
    ) -> RequestRecord:
        usage = reply.usage
        completion = usage.get("completion_tokens") if usage else None
        if isinstance(completion, int):
            out_tokens, source = int(completion), "usage"
        else:
            # Chunks stand in only for the live progress counter: the runner counts the text after the run.
            out_tokens, source = len(state.chunk_ns) if planned.stream else 0, "counted"
            self.texts[planned.index] = reply.text
        prompt_tokens = usage.get("prompt_tokens") if usage else None
        in_tokens = int(prompt_tokens) if isinstance(prompt_tokens, int) else planned.input_tokens
        end_ns = reply.end_ns
        if planned.stream:
            first_content_ns, chunk_ns, received = state.first_content_ns, tuple(state.chunk_ns), state.bytes_received
            first_text_ns = state.first_text_ns
        else:
            first_content_ns, chunk_ns = reply.first_ns, ((end_ns,) if end_ns is not None else ())
            first_text_ns, received = reply.first_ns, len(exchange.body)
        return RequestRecord(
            index=planned.index,
            is_warmup=warmup or planned.is_warmup,
            stream=planned.stream,
            scheduled_ns=scheduled_ns,
            sent_ns=exchange.sent_ns,
            first_chunk_ns=reply.first_ns,
            first_content_ns=first_content_ns,
            chunk_ns=chunk_ns,
            end_ns=end_ns,
            input_tokens=in_tokens,
            output_tokens=out_tokens,
            output_tokens_source=source,
            finish_reason=reply.finish_reason,
            http_status=exchange.status,
            error_kind=exchange.error_kind,
            error_message=exchange.error_message,
            queue_wait_s=queue_wait_s,
            bytes_received=received,
            conversation_id=planned.conversation_id,
            turn=planned.turn,
            finished_ns=exchange.finished_ns,
            first_text_ns=first_text_ns,
            cached_tokens=_cached_tokens(usage, reply.timings),
            **fingerprint,
        )


async def _read_error_body(response: httpx.Response, exchange: _Exchange) -> None:
    status = response.status_code
    exchange.body = await response.aread()
    exchange.fail(
        "http_4xx" if status < 500 else "http_5xx", f"HTTP {status}: {exchange.body[:300].decode('utf-8', 'replace')}"
    )


async def _read_stream(response: httpx.Response, state: StreamState, exchange: _Exchange) -> None:
    if type(response.stream) is BodyStream:
        # Parsed as each read lands, inside the transport's protocol callback.
        await response.stream.feed_into(state.feed)
    else:
        feed = state.feed
        async for data in response.aiter_raw():
            # Stamped on arrival (by the transport, or here), before any parsing.
            feed(data, data.t_ns if type(data) is StampedBytes else now_ns())
    if state.error is not None:
        exchange.fail("protocol", f"error event in stream: {state.error}")
    elif not state.done:
        exchange.fail("truncated", f"stream ended without [DONE] after {len(state.chunk_ns)} token chunks")


async def _read_body(response: httpx.Response, exchange: _Exchange) -> None:
    pieces = []
    async for data in response.aiter_raw():
        pieces.append(data)
        exchange.end_ns = data.t_ns if type(data) is StampedBytes else now_ns()
    exchange.body = b"".join(pieces)
    exchange.body_done_ns = exchange.end_ns


def _stream_reply(state: StreamState, exchange: _Exchange) -> _Reply:
    if exchange.error_kind is not None and state.bytes_received:
        exchange.error_message = (
            f"{exchange.error_message}; {state.bytes_received} bytes received, unparsed tail {state.tail()!r}"
        )
    return _Reply(
        text=state.text,
        content=state.content,
        usage=state.usage,
        finish_reason=state.finish_reason,
        first_ns=state.first_chunk_ns,
        end_ns=state.end_ns,
    )


def _body_reply(exchange: _Exchange) -> _Reply:
    """A non-streamed completion: its text, usage and finish reason; a body that is none fails the exchange."""
    reply = _Reply(first_ns=exchange.body_done_ns, end_ns=exchange.end_ns)
    if exchange.error_kind is not None:
        return reply
    try:
        obj = json.loads(exchange.body)
        choice = obj["choices"][0]
        reply.text = reply.content = choice.get("text") or (choice.get("message") or {}).get("content") or ""
        timings = obj.get("timings")
        reply.timings = timings if isinstance(timings, dict) else None
        reply.finish_reason, reply.usage = choice.get("finish_reason"), obj.get("usage")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        exchange.fail("protocol", f"bad completion body ({exc}): {exchange.body[:200]!r}")
    return reply


def _cached_tokens(usage: dict[str, object] | None, timings: dict[str, object] | None) -> int | None:
    """Prompt tokens the engine served from its prefix cache, where it says: usage.prompt_tokens_details
    (vLLM with --enable-prompt-tokens-details, llama.cpp, OpenAI), else llama.cpp's timings.cache_n."""
    details = (usage or {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and timings is not None:
        cached = timings.get("cache_n")
    return int(cached) if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else None


class Fingerprint(TypedDict):
    """A request's prompt as chained piece hashes with their character counts, and its reply's hash."""

    prompt_hashes: tuple[int, ...]
    prompt_chars: tuple[int, ...]
    reply_hash: int


def _fingerprint(planned: PlannedRequest, history: list[tuple[str, str]], reply: str) -> Fingerprint:
    """The sent prompt's chained piece hashes and character counts, and the hash of the prompt followed by its
    reply (what the next turn resends): the workload's own prefix reuse is computed from these afterwards."""
    chat = planned.messages is not None
    if planned.blocks:  # a trace's request: the blocks its hash ids share with other requests
        pieces = (("user" if chat else "", planned.blocks[0]), *(("", b) for b in planned.blocks[1:]))
    elif planned.messages is not None:
        pieces = planned.messages
    elif planned.user_text or planned.prefix:
        pieces = prompt_segments(False, planned.prefix, history, planned.user_text)
    else:  # a request planned elsewhere, its prompt written whole
        pieces = (("", planned.prompt or ""),)
    hashes, chars = [], []
    h = n = 0
    for role, text in pieces:
        h = chain_hash(h, role, text)
        n += len(text) + 1
        hashes.append(h)
        chars.append(n)
    return {
        "prompt_hashes": tuple(hashes),
        "prompt_chars": tuple(chars),
        "reply_hash": chain_hash(h, "assistant" if chat else "", reply),
    }
