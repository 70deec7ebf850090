"""A fault-injecting HTTP/1.1 server for the reliability suite: a token server that resets connections at
random, or a proxy in front of a real engine that answers 500s and resets connections in bursts.

Run it in-process (`FaultServer(...).start()` serves from a thread) or as a subprocess:
`python -m tests.fault_server server --seed 1 --fault-rate 0.3` prints `LISTENING <port>` and serves until
SIGTERM. `GET /stats` answers the counts as JSON and is never faulted or counted.

Faults (the kind names are the keys of `stats["faults"]`):
- `reset_before`: TCP RST (SO_LINGER 0) after reading the request, before any response byte;
- `reset_mid`: the 200 headers and a few SSE events, then RST;
- `http_500`: a complete `500 Internal Server Error` with a JSON body, connection kept alive;
- `close_before`: a clean FIN without a response (the client may retry a reused connection once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import socket
import struct
import sys
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

FAULTS = ("reset_before", "reset_mid", "http_500", "close_before")
MAX_HEAD_BYTES = 64 * 1024


@dataclass
class Stats:
    requests: int = 0  # requests read (POSTs to /v1/...), faulted or not
    ok: int = 0  # responses written completely (server: whole stream; proxy: upstream relayed to its end)
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    passthrough: int = 0  # proxy: non-/v1 requests relayed unfaulted (health, metrics, props)
    connections: int = 0
    open_connections: int = 0
    peak_connections: int = 0  # most connections open at once: the concurrency the client really reached

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "ok": self.ok,
            "faults": dict(self.faults),
            "faults_total": sum(self.faults.values()),
            "passthrough": self.passthrough,
            "connections": self.connections,
            "peak_connections": self.peak_connections,
        }


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort with RST rather than FIN: what a crashed or overloaded peer looks like to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
    """(request line + headers as received, lower-cased headers, body); None at a clean EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    except asyncio.LimitOverrunError:
        return None
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    length = int(headers.get(b"content-length", b"0") or 0)
    if length:
        try:
            body = await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
    return head, headers, body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse_events(prompt_tokens: int, tokens: int) -> list[bytes]:
    events = []
    for i in range(tokens):
        finish = "length" if i == tokens - 1 else None
        choice = {"index": 0, "text": f" t{i}", "finish_reason": finish}
        events.append(
            b"data: " + json.dumps({"id": "f", "object": "text_completion", "choices": [choice]}).encode() + b"\n\n"
        )
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
    events.append(b"data: " + json.dumps({"id": "f", "choices": [], "usage": usage}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    b"connection: keep-alive\r\n\r\n"
)
ERROR_BODY = b'{"error": {"message": "injected fault", "type": "server_error", "code": 500}}'
ERROR_RESPONSE = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: keep-alive\r\n\r\n%s" % (len(ERROR_BODY), ERROR_BODY)
)


class FaultServer:
    """mode "server": answers completions itself, faulting each request with probability fault_rate.
    mode "proxy": relays to `upstream`; requests n with n % burst_every < burst_len (n counts POSTs) are
    faulted, the kind cycling per burst through `faults`."""

    def __init__(
        self,
        mode: str = "server",
        *,
        upstream: str | None = None,
        seed: int = 0,
        fault_rate: float = 0.3,
        faults: tuple[str, ...] = FAULTS,
        tokens: int = 8,
        burst_every: int = 20,
        burst_len: int = 4,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        if mode not in ("server", "proxy"):
            raise ValueError(f"mode {mode!r}: expected server or proxy")
        if mode == "proxy" and not upstream:
            raise ValueError("proxy mode needs upstream")
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; expected some of {FAULTS}")
        self.mode, self.seed, self.fault_rate, self.faults, self.tokens = mode, seed, fault_rate, faults, tokens
        self.burst_every, self.burst_len = burst_every, burst_len
        self.host, self.port = host, port
        self.upstream = urlsplit(upstream) if upstream else None
        self.stats = Stats()
        self._rng = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()

    # ---------------------------------------------------------------- decisions
    def _choose(self) -> str | None:
        n = self.stats.requests
        self.stats.requests += 1
        if self.mode == "server":
            if self._rng.random() < self.fault_rate:
                return self._rng.choice(self.faults)
            return None
        if n % self.burst_every < self.burst_len:
            return self.faults[(n // self.burst_every) % len(self.faults)]
        return None

    # ---------------------------------------------------------------- connections
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        self.stats.open_connections += 1
        self.stats.peak_connections = max(self.stats.peak_connections, self.stats.open_connections)
        self._writers.add(writer)
        try:
            while True:
                got = await _read_request(reader)
                if got is None:
                    break
                head, _headers, body = got
                target = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
                if target == b"/stats":
                    payload = json.dumps(self.stats.as_dict()).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                        % (len(payload), payload)
                    )
                    await writer.drain()
                    continue
                faulted = target.startswith(b"/v1/")
                if self.mode == "proxy" and not faulted:
                    self.stats.passthrough += 1
                    await self._relay(head, body, writer)
                    break
                fault = self._choose()
                if fault is not None:
                    self.stats.faults[fault] += 1
                if not await self._answer(fault, head, body, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.stats.open_connections -= 1
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _answer(self, fault: str | None, head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Write one answer; False when the connection is done."""
        if fault == "reset_before":
            _reset(writer)
            return False
        if fault == "close_before":
            writer.close()
            return False
        if fault == "http_500":
            writer.write(ERROR_RESPONSE)
            await writer.drain()
            return True
        if self.mode == "proxy":
            if fault == "reset_mid":
                writer.write(STREAM_HEAD + _chunk(_sse_events(1, 2)[0]))
                await writer.drain()
                _reset(writer)
                return False
            await self._relay(head, body, writer)
            self.stats.ok += 1
            return False  # the upstream answered `connection: close`
        try:
            prompt_tokens = len(str(json.loads(body).get("prompt", "")).split())
        except (ValueError, AttributeError):
            prompt_tokens = 0
        events = _sse_events(prompt_tokens, self.tokens)
        writer.write(STREAM_HEAD)
        for i, event in enumerate(events):
            if fault == "reset_mid" and i == 2:
                await writer.drain()
                _reset(writer)
                return False
            writer.write(_chunk(event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.stats.ok += 1
        return True

    async def _relay(self, head: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        """Forward one request to the upstream with `connection: close` and copy its answer until EOF."""
        assert self.upstream is not None
        lines = [line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")]
        request = b"\r\n".join(lines) + b"\r\nconnection: close\r\n\r\n" + body
        up_reader, up_writer = await asyncio.open_connection(self.upstream.hostname, self.upstream.port)
        try:
            up_writer.write(request)
            await up_writer.drain()
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            up_writer.close()
        writer.close()

    # ---------------------------------------------------------------- lifecycle
    async def serve(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, backlog=4096, limit=MAX_HEAD_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        async with self._server:
            await self._server.serve_forever()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultServer:
        """Serve from a daemon thread with its own event loop; returns once listening."""

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self.serve())
            except asyncio.CancelledError:
                pass
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="fault-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault server did not start listening")
        return self

    def stop(self) -> None:
        server = self._server
        if self._loop is None or server is None:
            return

        async def shutdown() -> None:
            server.close()
            for w in list(self._writers):
                w.transport.abort()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("server", "proxy"))
    parser.add_argument("--upstream")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-rate", type=float, default=0.3)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = FaultServer(
        args.mode,
        upstream=args.upstream,
        seed=args.seed,
        fault_rate=args.fault_rate,
        faults=tuple(f for f in args.faults.split(",") if f),
        tokens=args.tokens,
        port=args.port,
    )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(server.serve())
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        while not server._ready.is_set():
            await asyncio.sleep(0.01)
        print(f"LISTENING {server.port}", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        print(json.dumps(server.stats.as_dict()), flush=True)

    asyncio.run(run())
    sys.exit(0)


if __name__ == "__main__":
    main()
