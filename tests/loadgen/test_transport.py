"""The streaming transport against real local sockets: headers as sent, framing by llhttp, a connection limit that holds."""

import asyncio
import time

import httpx
import pytest

from llmplay.loadgen.transport import StreamingTransport


class Server:
    """A local HTTP/1.1 server answering every request with `reply(n)` (n: requests so far), counting connections."""

    def __init__(self, reply, *, hold_s=0.0, close_after=False):
        self.reply, self.hold_s, self.close_after = reply, hold_s, close_after
        self.requests = self.connections = self.open = self.peak_open = 0
        self.handlers: set[asyncio.Task] = set()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()

    async def _handle(self, reader, writer):
        task = asyncio.current_task()
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)
        self.connections += 1
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests += 1
                await asyncio.sleep(self.hold_s)
                writer.write(self.reply(self.requests))
                await writer.drain()
                if self.close_after:
                    return
        finally:
            self.open -= 1
            writer.close()


def ok(body=b"ok", extra=b""):
    return lambda n: b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_repeated_response_headers_are_all_kept_in_order():
    head = [(b"x-a", b"1"), (b"Set-Cookie", b"a=1"), (b"x-a", b"2"), (b"Set-Cookie", b"b=2"), (b"x-b", b"")]
    extra = b"".join(k + b": " + v + b"\r\n" for k, v in head)

    async def main():
        async with Server(ok(extra=extra)) as srv, httpx.AsyncClient(transport=StreamingTransport()) as client:
            through_client = await client.get(srv.url)
            transport = StreamingTransport()
            direct = await transport.handle_async_request(httpx.Request("GET", srv.url))
            await direct.aread()
            await transport.aclose()
            return through_client, direct

    for resp in asyncio.run(main()):
        assert resp.headers.raw[1:] == head  # after the content-length the reply starts with
        assert resp.headers.get_list("x-a") == ["1", "2"] and resp.content == b"ok"


def test_a_repeated_connection_header_saying_close_is_honoured():
    # "close" then "keep-alive": keeping only the last header reused a connection the server said it would close.
    reply = ok(extra=b"connection: close\r\nconnection: keep-alive\r\n")

    async def main():
        async with Server(reply) as srv, httpx.AsyncClient(transport=StreamingTransport()) as client:
            for _ in range(2):
                assert (await client.get(srv.url)).content == b"ok"
            return srv.connections

    assert asyncio.run(main()) == 2


def test_keep_alive_reuses_one_connection():
    async def main():
        async with Server(ok()) as srv, httpx.AsyncClient(transport=StreamingTransport()) as client:
            for _ in range(3):
                assert (await client.get(srv.url)).content == b"ok"
            return srv.connections

    assert asyncio.run(main()) == 1


def test_the_connection_limit_holds_and_every_request_is_answered():
    async def main():
        transport = StreamingTransport(limits=httpx.Limits(max_connections=3))
        async with Server(ok(), hold_s=0.03) as srv, httpx.AsyncClient(transport=transport) as client:
            responses = await asyncio.gather(*(client.get(srv.url) for _ in range(12)))
            return [r.content for r in responses], srv.peak_open, transport.open_connections

    bodies, peak_open, open_after = asyncio.run(main())
    assert bodies == [b"ok"] * 12
    assert peak_open == 3  # the limit was reached and never passed
    assert open_after <= 3


def test_the_connection_limit_holds_when_the_server_closes_every_connection():
    async def main():
        transport = StreamingTransport(limits=httpx.Limits(max_connections=2))
        async with (
            Server(ok(extra=b"connection: close\r\n"), hold_s=0.02, close_after=True) as srv,
            httpx.AsyncClient(transport=transport) as client,
        ):
            responses = await asyncio.gather(*(client.get(srv.url) for _ in range(8)))
            return [r.status_code for r in responses], srv.peak_open, srv.connections

    statuses, peak_open, connections = asyncio.run(main())
    assert statuses == [200] * 8 and peak_open <= 2 and connections == 8


def test_waiting_for_a_free_connection_ends_at_the_pool_timeout():
    async def main():
        transport = StreamingTransport(limits=httpx.Limits(max_connections=1))
        timeout = httpx.Timeout(5.0, pool=0.05)
        async with Server(ok(), hold_s=0.5) as srv, httpx.AsyncClient(transport=transport, timeout=timeout) as client:
            results = await asyncio.gather(client.get(srv.url), client.get(srv.url), return_exceptions=True)
            return results

    first, second = asyncio.run(main())
    assert isinstance(first, httpx.Response) and first.status_code == 200
    assert isinstance(second, httpx.PoolTimeout)


def test_the_request_clock_starts_before_a_connection_is_acquired():
    # One connection, two requests at once: the second waits ~0.1 s for it. vllm bench serve starts its clock before
    # aiohttp acquires a connection, so that wait (like a connect or TLS handshake) is part of TTFT and E2EL.
    async def main():
        transport = StreamingTransport(limits=httpx.Limits(max_connections=1))

        async def get(url):
            response = await transport.handle_async_request(httpx.Request("GET", url))
            await response.aread()  # frees the connection for the other request
            return response.extensions["llmplay.sent_ns"], time.perf_counter_ns()

        async with Server(ok(), hold_s=0.1) as srv:
            stamps = await asyncio.gather(get(srv.url), get(srv.url))
            await transport.aclose()
            return stamps

    (sent_a, done_a), (sent_b, done_b) = asyncio.run(main())
    # Both stamped on arrival, before either reply was read: not the second after the first's reply.
    assert max(sent_a, sent_b) < min(done_a, done_b)


def test_an_https_request_is_stamped_on_the_same_clock_as_an_http_one():
    async def main():
        transport = StreamingTransport()
        # https goes to httpx's own transport (standing in for it here: no TLS server in the tests)
        transport._fallback = httpx.MockTransport(lambda request: httpx.Response(200, content=b"ok"))
        before = time.perf_counter_ns()
        response = await transport.handle_async_request(httpx.Request("GET", "https://engine.invalid/"))
        return before, response.extensions.get("llmplay.sent_ns"), time.perf_counter_ns()

    before, sent_ns, after = asyncio.run(main())
    assert sent_ns is not None and before <= sent_ns <= after


def test_an_idle_connection_past_its_keepalive_expiry_is_not_reused(monkeypatch):
    # The transport's clock, moved by the test: "at once" and "expired" are then what the test says, not how long a
    # busy machine took between two requests (a 50 ms pause between them reads as an expiry on the real clock).
    now = [0]
    monkeypatch.setattr("llmplay.loadgen.transport.now_ns", lambda: now[0])

    async def main():
        transport = StreamingTransport(limits=httpx.Limits(max_connections=None, keepalive_expiry=0.05))
        async with Server(ok()) as srv, httpx.AsyncClient(transport=transport) as client:
            await client.get(srv.url)
            await client.get(srv.url)  # at once: reused
            now[0] += 50_000_000  # idle for exactly the expiry: still reused
            await client.get(srv.url)
            now[0] += 50_000_001  # past it: a new connection
            await client.get(srv.url)
            return srv.connections

    assert asyncio.run(main()) == 2


def test_bytes_after_a_complete_response_keep_the_connection_from_reuse():
    stray = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray"

    async def main():
        async with (
            Server(lambda n: ok()(n) + (stray if n == 1 else b"")) as srv,
            httpx.AsyncClient(transport=StreamingTransport()) as client,
        ):
            first = await client.get(srv.url)
            await asyncio.sleep(0.05)
            second = await client.get(srv.url)
            return first, second, srv.connections

    first, second, connections = asyncio.run(main())
    assert first.content == second.content == b"ok" and connections == 2


def test_a_body_without_length_ends_with_the_connection():
    async def main():
        async with (
            Server(lambda n: b"HTTP/1.1 200 OK\r\n\r\nuntil close", close_after=True) as srv,
            httpx.AsyncClient(transport=StreamingTransport()) as client,
        ):
            return (await client.get(srv.url)).content

    assert asyncio.run(main()) == b"until close"


@pytest.mark.parametrize(
    "reply, message",
    [
        (b"HTTP/1.1 abc OK\r\n\r\n", "malformed HTTP response"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "malformed HTTP response"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", "without sending complete message body"),
        (b"HTTP/1.1 200 OK\r\ncontent-le", "before the response headers were complete"),
        (b"", "Server disconnected without sending a response"),
    ],
)
def test_broken_responses_raise_protocol_errors(reply, message):
    async def main():
        async with (
            Server(lambda n: reply, close_after=True) as srv,
            httpx.AsyncClient(transport=StreamingTransport()) as client,
        ):
            with pytest.raises(httpx.RemoteProtocolError) as caught:
                await client.get(srv.url)
            return str(caught.value)

    assert message in asyncio.run(main())
