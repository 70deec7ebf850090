"""Incremental parsing of OpenAI-style server-sent event streams into timestamped token chunks (no I/O)."""

from __future__ import annotations

from typing import NamedTuple

try:  # 5-10x faster per chunk; the load generator's hot path is this parse
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - a dependency, but a missing one must not stop the parse
    from json import loads as _loads  # type: ignore[assignment]

DONE, TEXT, ROLE, USAGE, ERROR, EMPTY = "done", "text", "role", "usage", "error", "empty"


class Event(NamedTuple):
    kind: str  # done | text | role (non-empty choices without text) | usage | error | empty
    content: str  # non-reasoning generated text
    reasoning: str  # reasoning_content / reasoning (reasoning models)
    finish_reason: str | None
    usage: dict[str, object] | None
    error: str | None


_EMPTY_EVENT = Event(EMPTY, "", "", None, None, None)
_DONE_EVENT = Event(DONE, "", "", None, None, None)


class SSEDecoder:
    """Splits a byte stream into the `data:` payloads of complete events; keeps partial bytes across feeds."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (kept for error messages)."""
        return self._buf

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        # A CR that ends a read may be the first half of a CRLF: it waits for the next byte, or the
        # pair would count as two line endings (an empty line, so an event cut in two).
        held = b"\r" if buf.endswith(b"\r") else b""
        if b"\r" in buf:
            if held:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            block = buf[start:end]
            start = end + 2
            if block.startswith(b"data:") and b"\n" not in block:
                # Fast path: one data line per event, as every OpenAI-compatible server sends.
                payload = block[5:]
                out.append(payload[1:] if payload.startswith(b" ") else payload)
                continue
            lines = [ln[5:].removeprefix(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if lines:  # comments (": ping") and event:/id: lines carry no payload
                out.append(b"\n".join(lines))
        self._buf = buf[start:] + held if held else buf[start:]
        return out


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def parse_event(payload: bytes | str) -> Event:
    """Classify one `data:` payload of /v1/completions or /v1/chat/completions."""
    if payload == b"[DONE]" or payload == "[DONE]":
        return _DONE_EVENT
    try:
        obj = _loads(payload)
    except ValueError:
        return Event(ERROR, "", "", None, None, f"not JSON: {payload[:200]!r}")
    if not isinstance(obj, dict):
        return Event(ERROR, "", "", None, None, f"not a JSON object: {payload[:200]!r}")
    if "error" in obj and not obj.get("choices"):
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        return Event(ERROR, "", "", None, None, str(msg)[:500])
    usage = obj.get("usage") or None
    choices = obj.get("choices")
    if not choices:
        return Event(USAGE, "", "", None, usage, None) if usage else _EMPTY_EVENT
    choice = choices[0]
    finish = choice.get("finish_reason")
    delta = choice.get("delta")
    if delta is not None:  # chat
        content = _text(delta.get("content"))
        reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
    else:  # completions
        content, reasoning = _text(choice.get("text")), ""
    if content or reasoning:
        return Event(TEXT, content, reasoning, finish, usage, None)
    return Event(ROLE, "", "", finish, usage, None)


class StreamState:
    """Feeds raw bytes stamped with their arrival time; accumulates what a RequestRecord needs.

    Every message with a non-empty `choices` is timestamped, text or not, as `vllm bench serve` does: a
    role-only first chunk starts TTFT, and an empty finish chunk (it carries the EOS token that usage
    counts) ends E2EL and is one more ITL gap. The first text (content or reasoning) and the first
    non-reasoning content are kept apart. Usage-only messages carry no token; nothing after [DONE] counts.
    """

    __slots__ = (
        "bytes_received",
        "chunk_ns",
        "contents",
        "decoder",
        "done",
        "end_ns",
        "error",
        "finish_reason",
        "first_chunk_ns",
        "first_content_ns",
        "first_text_ns",
        "n_events",
        "texts",
        "usage",
    )

    def __init__(self) -> None:
        self.decoder = SSEDecoder()
        self.first_chunk_ns: int | None = None  # first message with non-empty choices
        self.first_text_ns: int | None = None  # first content or reasoning text
        self.first_content_ns: int | None = None  # first non-reasoning content
        self.chunk_ns: list[int] = []
        self.end_ns: int | None = None
        self.texts: list[str] = []  # content, or reasoning where a chunk has no content: what output tokens count
        self.contents: list[str] = []  # non-reasoning content alone: the reply a conversation resends
        self.usage: dict[str, object] | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.error: str | None = None
        self.bytes_received = 0
        self.n_events = 0

    def feed(self, data: bytes, t_ns: int) -> None:
        self.bytes_received += len(data)
        if self.done or self.error is not None:
            return
        for payload in self.decoder.feed(data):
            self.n_events += 1
            ev = parse_event(payload)
            kind = ev.kind
            if kind in (TEXT, ROLE):
                if self.first_chunk_ns is None:
                    self.first_chunk_ns = t_ns
                self.chunk_ns.append(t_ns)
                self.end_ns = t_ns
                if kind == TEXT:
                    if self.first_text_ns is None:
                        self.first_text_ns = t_ns
                    if ev.content:
                        if self.first_content_ns is None:
                            self.first_content_ns = t_ns
                        self.contents.append(ev.content)
                    self.texts.append(ev.content or ev.reasoning)
            elif kind == DONE:
                self.done = True
                return
            elif kind == ERROR:
                self.error = ev.error
                return
            if ev.usage is not None:
                self.usage = ev.usage
            if ev.finish_reason is not None:
                self.finish_reason = ev.finish_reason

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def content(self) -> str:
        """The reply without its reasoning, as a chat client shows it and sends it back in the next turn."""
        return "".join(self.contents)

    def tail(self, n: int = 200) -> bytes:
        """The last bytes not yet parsed into an event: what an error message should show."""
        return self.decoder.pending[-n:]
