"""A token server used as a measuring instrument: OpenAI-style SSE chunks at known, logged times, plus faults.

Behaviour is chosen per request by a path prefix, so one server serves every scenario:
``{url}/c/ttft_ms=50+itl_ms=10+tokens=8+usage=0+fault=close+fault_after=3/v1/completions``.

Keys: ttft_ms (20), itl_ms (5: the gap between text chunks), tokens (default: the request's max_tokens),
per_chunk (1: tokens per text chunk, as servers that batch their stream send), usage (1: send the
usage chunk when asked), done (1: send [DONE]), role (chat streams start with a role-only chunk; 1: written
with the first token, as vLLM and llama.cpp do; 2: on admission, right after the headers; 0: none),
fault: none | 500 | 400 | close (FIN mid-stream) | stall (stop sending) | reset (TCP RST) | garbage,
cache (0; 1: a word-level prefix cache: usage.prompt_tokens_details.cached_tokens counts the prompt's leading
words that repeat an earlier prompt, or an earlier prompt and its reply, as engines report prefix-cache hits),
fault_after (text chunks sent before the fault; 0 = before the response headers), fault_from (0: how
many requests of this scenario, counted per path prefix since the last GET /_log, are served before
the fault starts: one fast request and one that times out in the same run).
Queueing (a known capacity): servers (0: off) and service_ms put each request through a virtual M/M/c queue
per path prefix: it waits for the first of `servers` virtual servers to free, holds it for an exponential
service time of mean service_ms (seeded by qseed), and its first chunk comes ttft_ms after its service starts.
Under Poisson arrivals its TTFT minus ttft_ms is then the M/M/c waiting time, whose law (Erlang C) gives the true
capacity under a TTFT SLO (llmplay_testing.queueing).

Every text chunk's actual write time (time.perf_counter_ns, the same clock the client uses) is logged
per request, keyed by the prompt (or the last user message), with the request's messages or prompt and its
headers as sent; GET /_log returns and clears the log.
Streams are driven by one timer heap instead of a task per stream, so 1,000+ concurrent
streams cost little CPU and chunk times stay close to the script.

Run in-process (`InstrumentServer()` context manager, thread) or as a process
(`python tests/instrument.py --port 0`, prints the port) so it does not share the client's GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULTS: dict[str, Any] = {
    "ttft_ms": 20.0,
    "itl_ms": 5.0,
    "tokens": None,
    "per_chunk": 1,
    "usage": 1,
    "done": 1,
    "role": 1,
    "fault": "none",
    "fault_after": 0,
    "fault_from": 0,
    "servers": 0,
    "service_ms": 100.0,
    "qseed": 0,
    "cache": 0,
}


def parse_config(segment: str) -> dict[str, Any]:
    cfg = dict(DEFAULTS)
    for item in filter(None, segment.replace("+", ",").split(",")):
        key, _, value = item.partition("=")
        if key not in DEFAULTS:
            raise ValueError(f"unknown instrument key {key!r}")
        cfg[key] = value if key == "fault" else float(value)
    return cfg


def scenario_url(base_url: str, **cfg: Any) -> str:
    """The base URL a client uses to get this behaviour."""
    # "+" between keys: some clients split a --url on commas.
    return f"{base_url}/c/" + "+".join(f"{k}={v}" for k, v in cfg.items())


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: Any) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_DONE = _chunk(b"data: [DONE]\n\n")
_ROLE = _sse(
    {
        "id": "instrument",
        "object": "chat.completion.chunk",
        "model": "instrument",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
    }
)
_LAST = b"0\r\n\r\n"
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(status, "X")
    return f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


@dataclass
class _Stream:
    writer: asyncio.StreamWriter
    cfg: dict[str, Any]
    chat: bool
    stream: bool
    n_tokens: int
    usage: dict | None
    recv_ns: int
    log: dict
    finished: asyncio.Future
    sent: int = 0
    queue_ns: int = 0  # the virtual queue's wait before service starts

    def deadline_ns(self, k: int) -> int:
        return self.recv_ns + self.queue_ns + int(self.cfg["ttft_ms"] * 1e6) + int(k * self.cfg["itl_ms"] * 1e6)


class InstrumentCore:
    """The server logic, bound to one event loop."""

    def __init__(self) -> None:
        self.log: list[dict] = []
        self._heap: list[tuple[int, int, _Stream]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._vocab: dict[str, int] = {}
        self._words: list[str] = []
        self._seq = itertools.count()
        self._served: dict[str, int] = {}  # requests per scenario segment, for fault_from
        # Per scenario segment: the virtual servers' free times (a heap) and the service-time generator.
        self._queues: dict[str, tuple[list[int], random.Random]] = {}
        self._chunks: dict[tuple[bool, int, bool, int], bytes] = {}
        self._cached: list[list[str]] = []  # cache=1: the word sequences an engine would hold (prompt, prompt+reply)

    # --- connection handling -------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                recv_ns = time.perf_counter_ns()
                keep = await self.dispatch(method, path, body, recv_ns, reader, writer, headers)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if not writer.is_closing():
                writer.close()

    async def dispatch(
        self,
        method: str,
        path: str,
        body: bytes,
        recv_ns: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        headers: dict[str, str] | None = None,
    ) -> bool:
        cfg, segment = dict(DEFAULTS), ""
        if path.startswith("/c/"):
            segment, _, rest = path[3:].partition("/")
            cfg = parse_config(segment)
            path = "/" + rest
        if path == "/_log":
            entries, self.log = self.log, []
            self._served.clear()
            self._queues.clear()
            self._cached.clear()
            writer.write(_response(200, json.dumps(entries).encode()))
            return True
        if path == "/health":
            writer.write(_response(200, b'{"status":"ok"}'))
            return True
        if path == "/v1/models":
            writer.write(_response(200, b'{"object":"list","data":[{"id":"instrument","object":"model"}]}'))
            return True
        if path in ("/tokenize", "/detokenize"):
            writer.write(_response(200, json.dumps(self.tokenize(path, json.loads(body or b"{}"))).encode()))
            return True
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            writer.write(_response(404, b'{"error":{"message":"not found"}}'))
            return True
        req = json.loads(body)
        chat = path.endswith("chat/completions")
        key = req["messages"][-1]["content"] if chat else req.get("prompt", "")
        prompt_tokens = (
            sum(len(str(m.get("content", "")).split()) for m in req["messages"]) if chat else len(str(key).split())
        )
        n_tokens = int(cfg["tokens"] if cfg["tokens"] is not None else req.get("max_tokens") or 16)
        stream = bool(req.get("stream"))
        want_usage = (not stream) or bool((req.get("stream_options") or {}).get("include_usage"))
        usage: dict[str, Any] | None = (
            {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens, "total_tokens": prompt_tokens + n_tokens}
            if cfg["usage"] and want_usage
            else None
        )
        log = {
            "key": key,
            "recv_ns": recv_ns,
            "send_ns": [],
            "stream": stream,
            "tokens": n_tokens,
            "ttft_ms": cfg["ttft_ms"],
            "itl_ms": cfg["itl_ms"],
            "fault": cfg["fault"],
            "headers_ns": None,
            "messages": req.get("messages") if chat else None,
            "prompt": None if chat else req.get("prompt"),
            "headers": headers or {},
        }
        if cfg["cache"] and usage is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self._cache_hit(req, chat, n_tokens)}
        self.log.append(log)
        ordinal = self._served.get(segment, 0)
        self._served[segment] = ordinal + 1
        if ordinal < cfg["fault_from"]:
            cfg["fault"] = log["fault"] = "none"
        fault = cfg["fault"]
        if fault in ("500", "400"):
            status = int(fault)
            writer.write(
                _response(
                    status, json.dumps({"error": {"message": f"instrument fault {status}", "code": status}}).encode()
                )
            )
            return True
        if fault in ("reset", "close", "stall") and cfg["fault_after"] == 0:
            return await self._fault(fault, reader, writer)
        loop = asyncio.get_running_loop()
        st = _Stream(writer, cfg, chat, stream, n_tokens, usage, recv_ns, log, loop.create_future())
        if cfg["servers"] > 0:
            st.queue_ns = self._enqueue(segment, cfg, recv_ns)
            log["queue_ms"] = st.queue_ns / 1e6
        if stream:
            writer.write(_STREAM_HEAD)
            log["headers_ns"] = time.perf_counter_ns()
            if chat and cfg["role"] == 2:
                writer.write(_ROLE)
        self._push(st, st.deadline_ns(0) if stream else st.deadline_ns(n_tokens - 1))
        outcome = await st.finished
        if outcome in ("close", "reset", "stall"):
            return await self._fault(outcome, reader, writer)
        return True

    def _enqueue(self, segment: str, cfg: dict[str, Any], recv_ns: int) -> int:
        """FCFS on `servers` virtual servers: the wait until the first one frees; it is then held for an
        exponential service time."""
        if segment not in self._queues:
            self._queues[segment] = ([0] * int(cfg["servers"]), random.Random(int(cfg["qseed"])))
        free, rng = self._queues[segment]
        start = max(recv_ns, heapq.heappop(free))
        heapq.heappush(free, start + int(rng.expovariate(1.0 / cfg["service_ms"]) * 1e6))
        return start - recv_ns

    async def _fault(self, fault: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if fault == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        elif fault == "close":
            writer.close()
        else:  # stall: send nothing more; the client gives up and closes
            with contextlib.suppress(ConnectionError):
                await reader.read(1)
        return False

    # --- the timer heap: one callback writes every due chunk -----------------------------------
    def _push(self, st: _Stream, deadline_ns: int) -> None:
        heapq.heappush(self._heap, (deadline_ns, next(self._seq), st))
        if self._timer is None or deadline_ns < self._timer_at:
            self._arm(deadline_ns)

    def _arm(self, deadline_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9)
        self._timer_at = deadline_ns
        self._timer = loop.call_at(loop.time() + delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        heap = self._heap
        # Only what is due by now (+100 us, spun to the exact time): a tick that kept re-reading the
        # clock would never return under load and starve reading new requests.
        horizon = time.perf_counter_ns() + 100_000
        while heap and heap[0][0] <= horizon:
            deadline, _, st = heapq.heappop(heap)
            while time.perf_counter_ns() < deadline:
                pass
            self._step(st)
        if heap:
            self._arm(heap[0][0])

    def _step(self, st: _Stream) -> None:
        if st.writer.is_closing():
            if not st.finished.done():
                st.finished.set_result("gone")
            return
        cfg = st.cfg
        if not st.stream:
            text = "".join(f" t{i}" for i in range(st.n_tokens))
            if st.chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            else:
                choice = {"index": 0, "text": text, "finish_reason": "length"}
            obj: dict = {
                "id": "instrument",
                "object": "chat.completion" if st.chat else "text_completion",
                "model": "instrument",
                "choices": [choice],
            }
            if st.usage:
                obj["usage"] = st.usage
            body = json.dumps(obj).encode()
            t = time.perf_counter_ns()
            st.writer.write(_response(200, body))
            st.log["send_ns"].append(t)
            st.finished.set_result("ok")
            return
        k = st.sent
        per_chunk = max(1, int(cfg["per_chunk"]))
        last = (k + 1) * per_chunk >= st.n_tokens
        data = self._text_chunk(st.chat, k * per_chunk, last, min(per_chunk, st.n_tokens - k * per_chunk))
        if k == 0 and st.chat and cfg["role"] == 1:
            data = _ROLE + data
        t = time.perf_counter_ns()
        st.writer.write(data)
        st.log["send_ns"].append(t)
        st.sent += 1
        fault = cfg["fault"]
        if fault in ("close", "reset", "stall") and st.sent >= cfg["fault_after"]:
            st.finished.set_result(fault)
            return
        if fault == "garbage" and st.sent >= cfg["fault_after"]:
            st.writer.write(_chunk(b"data: {not json\n\n"))
        if not last:
            self._push(st, st.deadline_ns(st.sent))
            return
        tail = b""
        if st.usage:
            tail += _sse(
                {
                    "id": "instrument",
                    "object": "text_completion",
                    "model": "instrument",
                    "choices": [],
                    "usage": st.usage,
                }
            )
        if cfg["done"]:
            tail += _DONE
        st.writer.write(tail + _LAST)
        st.finished.set_result("ok")

    def _text_chunk(self, chat: bool, first: int, last: bool, n_tokens: int = 1) -> bytes:
        """The chunk carrying tokens first .. first + n_tokens - 1."""
        # Encoded once per (api, position, size): the instrument must cost little per chunk.
        key = (chat, first, last, n_tokens)
        data = self._chunks.get(key)
        if data is None:
            finish = "length" if last else None
            # One word per token (the /tokenize stand-in splits on spaces): " t8 t9 t10 t11" is 4 tokens.
            text = "".join(f" t{first + i}" for i in range(n_tokens))
            if chat:
                data = _sse(self._chat_obj({"content": text}, finish))
            else:
                data = _sse(
                    {
                        "id": "instrument",
                        "object": "text_completion",
                        "model": "instrument",
                        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
                    }
                )
            self._chunks[key] = data
        return data

    @staticmethod
    def _chat_obj(delta: dict, finish: str | None) -> dict:
        return {
            "id": "instrument",
            "object": "chat.completion.chunk",
            "model": "instrument",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def _cache_hit(self, req: dict, chat: bool, n_tokens: int) -> int:
        """Leading prompt words already held (a prompt, or a prompt and its reply, seen before); remembers this one."""
        pieces = [str(m.get("content", "")) for m in req["messages"]] if chat else [str(req.get("prompt", ""))]
        words = " ".join(pieces).split()
        hit = 0
        for held in self._cached:
            n = 0
            for a, b in zip(held, words, strict=False):
                if a != b:
                    break
                n += 1
            hit = max(hit, n)
        reply = "".join(f" t{i}" for i in range(n_tokens)).split()
        self._cached = [*self._cached[-255:], words, words + reply]
        return hit

    # --- a word-level stand-in for llama.cpp's /tokenize and /detokenize -----------------------
    def tokenize(self, path: str, req: dict) -> dict:
        if path == "/tokenize":
            ids = []
            for word in str(req.get("content", "")).split():
                if word not in self._vocab:
                    self._vocab[word] = len(self._words)
                    self._words.append(word)
                ids.append(self._vocab[word])
            return {"tokens": ids}
        return {"content": " ".join(self._words[i] for i in req.get("tokens", []))}


class InstrumentServer:
    """The instrument on 127.0.0.1, in a thread (default) or a subprocess (`process=True`)."""

    def __init__(self, *, process: bool = False, use_uvloop: bool = False):
        self.process = process
        self.use_uvloop = use_uvloop
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, **cfg: Any) -> str:
        return scenario_url(self.url, **cfg)

    def fetch_log(self) -> list[dict]:
        return httpx.get(f"{self.url}/_log", timeout=30).json()

    def __enter__(self) -> InstrumentServer:
        if self.process:
            args = [sys.executable, __file__, "--port", "0"] + (["--uvloop"] if self.use_uvloop else [])
            self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
            assert self._proc.stdout is not None
            self.port = int(self._proc.stdout.readline().strip())
            return self
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)

            async def main() -> None:
                self._stop = asyncio.Event()
                core = InstrumentCore()
                server = await asyncio.start_server(core.handle, "127.0.0.1", 0, backlog=4096)
                self.port = server.sockets[0].getsockname()[1]
                ready.set()
                async with server:
                    await self._stop.wait()
                    server.close()

            loop.run_until_complete(main())
            # Cancel connection handlers still waiting so nothing warns about pending tasks.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="instrument", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
            if self._proc.stdout:
                self._proc.stdout.close()
        elif self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            assert self._thread is not None
            self._thread.join(10)


async def _serve(port: int) -> None:
    core = InstrumentCore()
    server = await asyncio.start_server(core.handle, "127.0.0.1", port, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(_serve(args.port))
    else:
        asyncio.run(_serve(args.port))


if __name__ == "__main__":
    main()
