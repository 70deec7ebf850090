"""A lean HTTP/1.1 keep-alive transport for httpx that stamps each body piece with its arrival time.

Why not httpcore: its pool re-scans every connection on every request and response event, which
is O(connections²) and caps a 2-core client at ~1k chunks/s with 256 streams. Here a connection
is an asyncio.Protocol whose `data_received` stamps `time.perf_counter_ns()` the moment bytes reach
the process and hands them to llhttp (`httptools`) at once, so the timestamps do not include the
time the consuming task waits for the event loop. Body pieces are `StampedBytes` (bytes with
`.t_ns`); httpx passes them through `aiter_raw()` unchanged. Plain http:// only; anything else goes
to httpx's own transport. The connection limit is the transport's own (`limits=`): httpx hands a
custom transport no limits of its client.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import weakref
from collections.abc import AsyncIterator, Callable

import httptools
import httpx

from llmplay.loadgen.clock import now_ns

Feed = Callable[[bytes, int], None]  # (body payload, arrival ns)


class StampedBytes(bytes):
    """Bytes of a response body plus when the last of them arrived (time.perf_counter_ns)."""

    t_ns: int


def _stamped(data: bytes, t_ns: int) -> StampedBytes:
    b = StampedBytes(data)
    b.t_ns = t_ns
    return b


class _Conn(asyncio.Protocol):
    """One TCP connection and the one response being read on it, parsed by llhttp as bytes arrive."""

    def __init__(self, key: tuple[str, int], on_close: Callable[[_Conn], None]):
        self.key = key
        self._on_close = on_close
        self.transport: asyncio.Transport | None = None
        # llhttp calls on_body once per body piece; collecting them with the list's own append
        # saves a Python frame per chunk on the hot path (httptools looks the callback up once).
        self._pieces: list[bytes] = []
        self.on_body = self._pieces.append
        self._parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.sink: Feed | None = None  # set while a body is fed straight from data_received
        self.sink_error: BaseException | None = None
        self.eof = False
        self.exc: BaseException | None = None
        self.reused = False
        self.released = False  # the transport's connection count no longer includes it
        self.idle_since_ns = 0
        self.pending: collections.deque[StampedBytes] = collections.deque()  # body not yet consumed
        self._begin_exchange()

    def _begin_exchange(self) -> None:
        self.expecting = False  # a request was written: bytes now belong to its response (until complete)
        self.head_only = False  # the request was a HEAD: its response has no body whatever it says
        self.stray = False  # bytes came that belong to no request: never reuse the connection
        self.received = 0  # bytes received since the request was written
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False  # the body has no length and no chunking: it ends with the connection
        self.framing = "length"  # "length" | "chunked" | "close", for error messages
        self.parse_error: httpx.RemoteProtocolError | None = None
        self._own_pieces = -1  # where the body pieces of a stray message start (-1: none came)
        self.pending.clear()
        self._pieces.clear()

    def start_exchange(self, payload: bytes, head_only: bool) -> None:
        """Write a request."""
        self._begin_exchange()
        self.expecting = True
        self.head_only = head_only
        assert self.transport is not None
        self.transport.write(payload)

    # --- protocol callbacks ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t_ns = now_ns()
        self.received += len(data)
        if not self.expecting or self.complete or self.parse_error is not None:
            self.stray = True
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.parse_error = httpx.RemoteProtocolError(f"malformed HTTP response: {exc}")
        pieces = self._pieces
        if self._own_pieces >= 0:
            del pieces[self._own_pieces :]
            self._own_pieces = -1
        if pieces:
            # One payload per read, as the bytes of one read arrived together.
            payload = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            sink = self.sink
            if sink is not None and self.sink_error is None:
                try:
                    sink(payload, t_ns)
                except Exception as exc:  # handed to the awaiting request, which records it
                    self.sink_error = exc
            else:
                self.pending.append(_stamped(payload, t_ns))
        if self.sink is not None and not self.complete and self.parse_error is None and self.sink_error is None:
            return  # a fed body wakes its task once, at the end, not once per read
        self._wake()

    def on_message_begin(self) -> None:
        if self.complete:  # more bytes after the response: a message nobody asked for
            self.stray = True
            self._own_pieces = len(self._pieces)

    def on_status(self, reason: bytes) -> None:
        if not self.stray:
            self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.stray:
            self.headers.append((name, value))  # every header, repeated ones too, in order

    def on_headers_complete(self) -> None:
        if self.stray:
            return
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        framing = "close"
        for name, value in self.headers:
            lname = name.lower()
            if lname == b"transfer-encoding" and b"chunked" in value.lower():
                framing = "chunked"
            elif lname == b"content-length" and framing == "close":
                framing = "length"
        no_body = self.status in (204, 304) or 100 <= self.status < 200
        self.framing = "length" if no_body else framing
        self.until_close = self.framing == "close"
        if self.until_close:
            self.keep_alive = False
        self.head_done = True
        if self.head_only:
            # llhttp cannot be told that a HEAD response has no body: end it here, never reuse the connection.
            self.complete, self.keep_alive = True, False

    def on_message_complete(self) -> None:
        if not self.stray:
            self.complete = True

    def eof_received(self) -> bool:
        self.eof = True
        self._end_by_close()
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.exc = exc
        self._end_by_close()
        self._mark_closed()
        self._wake()

    def _end_by_close(self) -> None:
        if self.head_done and self.until_close and self.exc is None:
            self.complete = True

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _mark_closed(self) -> None:
        if not self.released:
            self.released = True
            self._on_close(self)

    # --- consumer side ---
    async def wait(self) -> None:
        """Until more bytes, EOF or loss."""
        if self.eof:
            return
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def failure(self, what: str) -> httpx.TransportError | None:
        """Why this response cannot go on (a parse error, or the peer gone before its end); None if it can."""
        if self.parse_error is not None:
            return self.parse_error
        if not self.eof or self.complete:
            return None
        if isinstance(self.exc, (ConnectionResetError, BrokenPipeError)):
            return httpx.ReadError(f"connection reset by peer {what}")
        return httpx.RemoteProtocolError(f"peer closed connection {what}")

    def reusable(self) -> bool:
        return (
            self.complete
            and self.keep_alive
            and not self.stray
            and not self.pending
            and self.parse_error is None
            and not self.closed()
        )

    def closed(self) -> bool:
        return self.eof or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.eof = True
        self._mark_closed()


def _body_cut(conn: _Conn) -> str:
    if conn.framing == "chunked":
        return "without sending complete message body (incomplete chunked read)"
    return "without sending complete message body"


class BodyStream(httpx.AsyncByteStream):
    def __init__(self, transport: StreamingTransport, conn: _Conn):
        self._t = transport
        self._conn = conn
        self._complete = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        pending = conn.pending
        while True:
            while pending:
                yield pending.popleft()
            if conn.complete:
                break
            err = conn.failure(_body_cut(conn))
            if err is not None:
                raise err
            await conn.wait()
        self._complete = True

    async def feed_into(self, feed: Feed) -> None:
        """Call feed(payload, arrival_ns) from the protocol callback itself, and return when the body ends.

        The fast path for streams: no task switch and no async-iterator hop per chunk, so one
        process keeps up with a thousand streams.
        """
        conn = self._conn
        while conn.pending:  # what arrived with the head
            piece = conn.pending.popleft()
            feed(piece, piece.t_ns)
        conn.sink = feed
        try:
            while True:
                if conn.sink_error is not None:
                    raise conn.sink_error
                if conn.complete:
                    break
                err = conn.failure(_body_cut(conn))
                if err is not None:
                    raise err
                await conn.wait()
        finally:
            conn.sink = None
        self._complete = True

    async def aclose(self) -> None:
        if self._complete and self._conn.reusable():
            self._t._release(self._conn)
        else:
            self._conn.close()


class StreamingTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over asyncio protocols: one connection per in-flight request, idle ones reused.

    limits: max_connections open at once (a request waits for a free one, up to the pool timeout;
    None: unbounded), max_keepalive_connections idle ones kept per host, keepalive_expiry seconds an
    idle one may wait before it is closed instead of reused.
    """

    def __init__(self, *, limits: httpx.Limits | None = None, fallback: httpx.AsyncBaseTransport | None = None):
        limits = limits or httpx.Limits(max_connections=None, max_keepalive_connections=4096, keepalive_expiry=None)
        self._max_open = limits.max_connections
        self._max_idle = limits.max_keepalive_connections if limits.max_keepalive_connections is not None else 1 << 30
        self._expiry_ns = int(limits.keepalive_expiry * 1e9) if limits.keepalive_expiry is not None else None
        self._idle: dict[tuple[str, int], collections.deque[_Conn]] = collections.defaultdict(collections.deque)
        self._fallback = fallback
        self._all: weakref.WeakSet[_Conn] = weakref.WeakSet()
        self._open = 0  # connections open or being opened
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def open_connections(self) -> int:
        return self._open

    def _release(self, conn: _Conn) -> None:
        idle = self._idle[conn.key]
        if len(idle) < self._max_idle:
            conn.reused = True
            conn.idle_since_ns = now_ns()
            idle.append(conn)
            self._wake_slot_waiter()
        else:
            conn.close()

    def _closed(self, conn: _Conn) -> None:
        self._open -= 1
        self._wake_slot_waiter()

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            w = self._slot_waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _take_idle(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle[key]
        while idle:
            conn = idle.pop()
            if self._expiry_ns is not None and now_ns() - conn.idle_since_ns > self._expiry_ns:
                conn.close()
            elif not conn.closed() and not conn.stray:
                return conn
            else:
                conn.close()
        return None

    def _close_one_idle(self) -> bool:
        """At the limit: an idle connection to another host gives its slot up."""
        for idle in self._idle.values():
            if idle:
                idle.popleft().close()
                return True
        return False

    async def _acquire(self, host: str, port: int, timeouts: dict[str, float | None]) -> _Conn:
        key = (host, port)
        conn = self._take_idle(key)
        if conn is not None:
            return conn
        if self._max_open is not None:
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    while self._open >= self._max_open:
                        if self._close_one_idle():
                            continue
                        waiter = asyncio.get_running_loop().create_future()
                        self._slot_waiters.append(waiter)
                        try:
                            await waiter
                        except BaseException:
                            if waiter.done() and not waiter.cancelled():
                                self._wake_slot_waiter()  # the slot it was given goes to the next one
                            raise
                        conn = self._take_idle(key)  # released while we waited
                        if conn is not None:
                            self._wake_slot_waiter()
                            return conn
            except TimeoutError:
                raise httpx.PoolTimeout(f"no free connection within the pool timeout ({self._max_open} open)") from None
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                _, proto = await loop.create_connection(lambda: _Conn(key, self._closed), host, port)
        except TimeoutError:
            self._open -= 1
            self._wake_slot_waiter()
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            self._open -= 1
            self._wake_slot_waiter()
            raise httpx.ConnectError(f"{exc.strerror or exc} ({host}:{port})") from None
        except BaseException:
            self._open -= 1
            self._wake_slot_waiter()
            raise
        self._all.add(proto)
        return proto

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The response's extensions carry "llmplay.sent_ns": when the request reached the transport, before a
        connection was acquired, on every path (a new connection's connect and TLS handshake count, as in
        vllm bench serve, so a cold https request and a warm http one are timed alike)."""
        url = request.url
        if url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            sent_ns = now_ns()
            response = await self._fallback.handle_async_request(request)
            response.extensions["llmplay.sent_ns"] = sent_ns
            return response
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = [f"{request.method} ".encode() + url.raw_path + b" HTTP/1.1\r\n"]
        head += [k + b": " + v + b"\r\n" for k, v in request.headers.raw]
        payload = b"".join(head) + b"\r\n" + body
        port = url.port or 80
        sent_ns = now_ns()
        for attempt in range(2):
            conn = await self._acquire(url.host, port, timeouts)
            reused = conn.reused
            conn.start_exchange(payload, head_only=request.method == "HEAD")
            try:
                async with asyncio.timeout(timeouts.get("read")):
                    await self._read_head(conn)
            except httpx.TransportError:
                conn.close()
                # A reused connection the server had already closed while idle: retry once, fresh.
                if reused and attempt == 0 and conn.received == 0:
                    continue
                raise
            except TimeoutError:
                conn.close()
                raise httpx.ReadTimeout("no response headers within the read timeout") from None
            except BaseException:
                conn.close()
                raise
            break
        return httpx.Response(
            conn.status,
            headers=conn.headers,
            stream=BodyStream(self, conn),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": conn.reason, "llmplay.sent_ns": sent_ns},
        )

    @staticmethod
    async def _read_head(conn: _Conn) -> None:
        while not conn.head_done:
            if conn.parse_error is not None:
                raise conn.parse_error
            if conn.eof:
                if conn.received or isinstance(conn.exc, (ConnectionResetError, BrokenPipeError)):
                    err = conn.failure("before the response headers were complete")
                    assert err is not None
                    raise err
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            await conn.wait()

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the loop run the transports' close callbacks before it ends
        if self._fallback is not None:
            await self._fallback.aclose()
