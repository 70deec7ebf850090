"""A lean HTTP/1.1 keep-alive transport for httpx that stamps each body piece with its arrival time.

Why not httpcore: its pool re-scans every connection on every request and response event, which
is O(connections²) and caps a 2-core client at ~1k chunks/s with 256 streams. Here a connection
is an asyncio.Protocol; `data_received` stamps `time.perf_counter_ns()` the moment bytes reach the
process, so the timestamps do not include the time the consuming task waits for the event loop.
Body pieces are `StampedBytes` (bytes with `.t_ns`); httpx passes them through `aiter_raw()`
unchanged. Plain http:// only; anything else goes to httpx's own transport.
"""
from __future__ import annotations

import asyncio
import collections
import socket
import time
import weakref
from typing import AsyncIterator, Callable

import httpx

_now = time.perf_counter_ns


class StampedBytes(bytes):
    """Bytes of a response body plus when the last of them arrived (time.perf_counter_ns)."""

    t_ns: int


def _stamped(data: bytes, t_ns: int) -> StampedBytes:
    b = StampedBytes(data)
    b.t_ns = t_ns
    return b


class _Conn(asyncio.Protocol):
    """One TCP connection: a receive buffer with per-arrival timestamps, and one waiter."""

    def __init__(self, key: tuple[str, int]):
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.base = 0  # absolute stream offset of buf[0]
        self.marks: collections.deque[tuple[int, int]] = collections.deque()  # (end offset, arrival ns)
        self.waiter: asyncio.Future | None = None
        self.eof = False
        self.exc: BaseException | None = None
        self.reused = False
        self.sink: Callable[[], None] | None = None  # set while a body is fed from data_received

    # --- protocol callbacks ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        t = _now()
        self.buf += data
        self.marks.append((self.base + len(self.buf), t))
        if self.sink is not None:
            self.sink()
            return
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.exc = exc
        self._wake()

    def _wake(self) -> None:
        if self.sink is not None:
            self.sink()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

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

    def arrival_of(self, end_offset: int) -> int:
        """When the byte just before absolute end_offset arrived; drops marks no longer needed."""
        marks = self.marks
        while len(marks) > 1 and marks[0][0] < end_offset:
            marks.popleft()
        return marks[0][1] if marks else _now()

    def consume(self, n: int) -> None:
        del self.buf[:n]
        self.base += n

    def closed(self) -> bool:
        return self.eof or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.eof = True


def _raise_cut(conn: _Conn, what: str) -> None:
    if isinstance(conn.exc, (ConnectionResetError, BrokenPipeError)):
        raise httpx.ReadError(f"connection reset by peer {what}")
    raise httpx.RemoteProtocolError(f"peer closed connection {what}")


class BodyStream(httpx.AsyncByteStream):
    def __init__(self, transport: "StreamingTransport", conn: _Conn, mode: str, length: int, keep_alive: bool):
        self._t = transport
        self._conn = conn
        self._mode = mode  # "chunked" | "length" | "close"
        self._left = length
        self._keep = keep_alive
        self._complete = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if self._mode == "chunked":
            async for piece in self._chunked():
                yield piece
        else:
            while True:
                if conn.buf:
                    take = len(conn.buf) if self._mode == "close" else min(self._left, len(conn.buf))
                    end = conn.base + take
                    piece = _stamped(bytes(conn.buf[:take]), conn.arrival_of(end))
                    conn.consume(take)
                    self._left -= take
                    yield piece
                if self._mode == "length" and self._left <= 0:
                    break
                if conn.eof:
                    if self._mode == "close":
                        break
                    _raise_cut(conn, "without sending complete message body")
                await conn.wait()
        self._complete = True

    def _take_chunks(self) -> tuple[bytes | None, int, bool]:
        """Complete chunks at the head of the buffer: (their payload or None, arrival ns, body done)."""
        conn = self._conn
        buf = conn.buf
        pos = 0
        out: list[bytes] = []
        done = False
        last_end = 0
        while True:
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                break
            try:
                size = int(bytes(buf[pos:nl]).split(b";", 1)[0], 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad chunk size line {bytes(buf[pos:nl])[:40]!r}") from None
            if size == 0:
                # Trailers end with an empty line; almost always just "\r\n".
                end = buf.find(b"\r\n\r\n", nl)
                if end < 0:
                    break
                pos = end + 4
                done = True
                break
            if len(buf) < nl + 2 + size + 2:
                break
            out.append(bytes(buf[nl + 2:nl + 2 + size]))
            pos = nl + 2 + size + 2
            last_end = pos
        t_ns = conn.arrival_of(conn.base + last_end) if out else 0
        conn.consume(pos)
        if not out:
            return None, 0, done
        return (out[0] if len(out) == 1 else b"".join(out)), t_ns, done

    async def _chunked(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            payload, t_ns, done = self._take_chunks()
            if payload is not None:
                yield _stamped(payload, t_ns)
            if done:
                return
            if conn.eof:
                _raise_cut(conn, "without sending complete message body (incomplete chunked read)")
            await conn.wait()

    async def feed_into(self, feed: Callable[[bytes, int], None]) -> None:
        """Call feed(payload, arrival_ns) from the protocol callback itself, and return when the body ends.

        The fast path for streams: no task switch and no async-iterator hop per chunk, so one
        process keeps up with a thousand streams.
        """
        if self._mode != "chunked":
            async for piece in self:
                feed(piece, piece.t_ns)  # type: ignore[attr-defined]
            return
        self._sink_feed = feed
        self._sink_done: asyncio.Future = asyncio.get_running_loop().create_future()
        conn = self._conn
        conn.sink = self._on_data
        try:
            self._on_data()  # what is already buffered
            await self._sink_done
        finally:
            conn.sink = None
        self._complete = True

    def _on_data(self) -> None:
        fut = self._sink_done
        if fut.done():
            return
        try:
            payload, t_ns, done = self._take_chunks()
            if payload is not None:
                self._sink_feed(payload, t_ns)
            if done:
                fut.set_result(None)
            elif self._conn.eof:
                _raise_cut(self._conn, "without sending complete message body (incomplete chunked read)")
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting request, which records it
            fut.set_exception(exc)

    async def aclose(self) -> None:
        if self._complete and self._keep and not self._conn.closed() and not self._conn.buf:
            self._t._release(self._conn)
        else:
            self._conn.close()


class StreamingTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over asyncio protocols: one connection per in-flight request, idle ones reused."""

    def __init__(self, *, max_idle_per_host: int = 4096, fallback: httpx.AsyncBaseTransport | None = None):
        self._idle: dict[tuple[str, int], collections.deque[_Conn]] = collections.defaultdict(collections.deque)
        self._max_idle = max_idle_per_host
        self._fallback = fallback
        self._all: weakref.WeakSet[_Conn] = weakref.WeakSet()

    def _release(self, conn: _Conn) -> None:
        idle = self._idle[conn.key]
        if len(idle) < self._max_idle:
            conn.reused = True
            idle.append(conn)
        else:
            conn.close()

    async def _acquire(self, host: str, port: int, connect_timeout: float | None) -> _Conn:
        idle = self._idle[(host, port)]
        while idle:
            conn = idle.pop()
            if not conn.closed() and not conn.buf:
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(lambda: _Conn((host, port)), host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"{exc.strerror or exc} ({host}:{port})") from None
        self._all.add(conn)
        return conn  # type: ignore[return-value]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = [f"{request.method} ".encode() + url.raw_path + b" HTTP/1.1\r\n"]
        head += [k + b": " + v + b"\r\n" for k, v in request.headers.raw]
        payload = b"".join(head) + b"\r\n" + body
        port = url.port or 80
        for attempt in range(2):
            conn = await self._acquire(url.host, port, timeouts.get("connect"))
            reused = conn.reused
            assert conn.transport is not None
            offset_before = conn.base + len(conn.buf)  # absolute stream position: has anything arrived since?
            sent_ns = _now()
            conn.transport.write(payload)
            try:
                async with asyncio.timeout(timeouts.get("read")):
                    status, reason, headers, end = await self._read_head(conn)
            except httpx.TransportError:
                # A reused connection the server had already closed while idle: retry once, fresh.
                if reused and attempt == 0 and conn.base + len(conn.buf) == offset_before:
                    conn.close()
                    continue
                conn.close()
                raise
            except TimeoutError:
                conn.close()
                raise httpx.ReadTimeout("no response headers within the read timeout") from None
            break
        conn.consume(end)
        lower = {k.lower(): v for k, v in headers}
        keep = lower.get(b"connection", b"").lower() != b"close"
        if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            mode, length = "length", 0
        elif b"chunked" in lower.get(b"transfer-encoding", b"").lower():
            mode, length = "chunked", 0
        elif b"content-length" in lower:
            mode, length = "length", int(lower[b"content-length"])
        else:
            mode, length, keep = "close", 0, False
        return httpx.Response(status, headers=headers, stream=BodyStream(self, conn, mode, length, keep),
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason,
                                          "llmplay.sent_ns": sent_ns})

    @staticmethod
    async def _read_head(conn: _Conn) -> tuple[int, bytes, list[tuple[bytes, bytes]], int]:
        while True:
            end = conn.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if conn.eof:
                if conn.buf or isinstance(conn.exc, (ConnectionResetError, BrokenPipeError)):
                    _raise_cut(conn, "before the response headers were complete")
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            await conn.wait()
        lines = bytes(conn.buf[:end]).split(b"\r\n")
        try:
            _, code, *rest = lines[0].split(b" ", 2)
            status = int(code)
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad status line {lines[0][:80]!r}") from None
        headers = []
        for ln in lines[1:]:
            k, sep, v = ln.partition(b":")
            if sep:
                headers.append((k.strip(), v.strip()))
        return status, (rest[0] if rest else b""), headers, end + 4

    async def aclose(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the loop run the transports' close callbacks before it ends
        if self._fallback is not None:
            await self._fallback.aclose()
