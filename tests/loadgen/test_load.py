"""The load runner against the instrument server: timing equals the scripted truth, errors never vanish."""

import asyncio
import itertools
import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from scipy import stats

from llmplay.loadgen.records import records_from_dataframe
from llmplay.loadgen.runner import make_client, run_load, run_load_sync
from llmplay.loadgen.tokenizer import LlamaCppTokenizer, WordRatioTokenizer
from llmplay.loadgen.transport import StreamingTransport
from llmplay.loadgen.workload import build_requests, iter_requests
from llmplay.metrics import per_request_frame, summarize
from llmplay.spec import LengthDist, Workload
from llmplay_testing.fault_server import STREAM_HEAD, _chunk, _sse_events
from llmplay_testing.instrument import InstrumentServer

# Timed against the instrument: a raised CPU priority (tests/conftest.py).
pytestmark = pytest.mark.timing

TOK = WordRatioTokenizer()
BASE = Workload(
    concurrency=4,
    num_requests=8,
    input=LengthDist("fixed", value=6),
    output=LengthDist("fixed", value=6),
    request_timeout_s=5.0,
)


@pytest.fixture(scope="module")
def srv():
    # A separate process, like a real server: in a thread it would wait for the client's GIL.
    with InstrumentServer(process=True) as server:
        yield server


def run(srv, wl, **cfg):
    reqs = build_requests(wl, TOK, "instrument")
    srv.fetch_log()  # clear
    result = run_load_sync(srv.url_for(**cfg), wl, reqs)
    return reqs, result, {e["key"]: e for e in srv.fetch_log()}


def _check_against_the_server_log(reqs, res, log) -> None:
    """What llmplay controls of its stamps, checked against what the server really wrote (its log of send times, same
    clock, another process): one stamp per token message, none before its bytes were written, no TTFT shorter than
    the script's. How close the stamps land to the writes on a busy 2-core machine (the client's precision) is
    benchmarks/loadgen.py's measurement (RESULTS.md, "TTFT err" and "ITL err"); that each chunk is stamped at the
    read that brought it is test_each_chunk_is_stamped_with_the_clock_of_the_read_that_brought_it's, on a clock the
    test sets."""
    for planned, rec in zip(reqs, res.records, strict=True):
        key = planned.messages[-1][1] if planned.messages else planned.prompt
        truth = np.array(log[key]["send_ns"])
        # Chat: the role-only chunk, written with the first token, is a token message too (vllm bench serve's rule).
        role = 1 if planned.messages else 0
        assert len(rec.chunk_ns) == len(truth) + role and len(truth) == 6
        chunks = np.array(rec.chunk_ns[role:])
        assert (chunks >= truth).all(), (chunks - truth) / 1e6  # no chunk stamped before the server wrote it
        assert (np.diff(np.array(rec.chunk_ns)) >= 0).all()
    s = summarize(res.records, res.duration_s, {})
    # The server never writes a first token before its script's 40 ms: a shorter TTFT would be llmplay's error.
    assert s["ttft.p50"] >= 0.040, s["ttft.p50"]
    assert s["itl.p50"] is not None and s["tpot.p50"] is not None


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_timing_matches_scripted_truth(srv, api):
    wl = replace(BASE, api=api, num_requests=16, warmup_requests=2)
    reqs, res, log = run(srv, wl, ttft_ms=40, itl_ms=10)
    assert len(res.records) == 18 and all(r.ok for r in res.records)
    assert [r.is_warmup for r in res.records] == [True] * 2 + [False] * 16
    s = summarize(res.records, res.duration_s, {})
    assert s["requests.completed"] == 16 and s["errors.count"] == 0
    assert s["throughput.output_tok_s"] == pytest.approx(16 * 6 / res.duration_s)
    assert s["tokens.output_counted"] == 0 and not res.counted_tokens
    _check_against_the_server_log(reqs, res, log)


def test_a_role_chunk_sent_on_admission_starts_ttft_but_not_ttft_content(srv):
    # A server that acknowledges a chat request before prefill: vLLM's TTFT stops at that role-only chunk, the
    # first text comes the scripted 40 ms later.
    wl = replace(BASE, api="chat")
    reqs, res, log = run(srv, wl, ttft_ms=40, itl_ms=5, role=2)
    assert all(r.ok and len(r.chunk_ns) == 7 for r in res.records)
    s = summarize(res.records, res.duration_s, {})
    # Checked against what the server wrote and when (its log), not its script: on a loaded machine the role chunk
    # may be read late, and the first text written late, but neither is stamped before it was written.
    for planned, rec in zip(reqs, res.records, strict=True):
        entry = log[planned.messages[-1][1]]
        assert entry["headers_ns"] <= rec.first_chunk_ns < rec.first_text_ns
        assert entry["send_ns"][0] <= rec.first_text_ns and entry["send_ns"][0] >= entry["recv_ns"] + 40e6
    # TTFT is the role chunk's, TTFT-content the first text's, each stamped no earlier than its write (above); how
    # soon after it on a busy machine is benchmarks/loadgen.py's measurement.
    assert s["ttft_content.p50"] >= 0.040 and s["ttft.p50"] < s["ttft_content.p50"]
    assert s["ttfo.p50"] == s["ttft_content.p50"]  # no reasoning: the first text is the answer


def test_counted_tokens_when_server_sends_no_usage(srv):
    reqs, res, _ = run(srv, BASE, ttft_ms=5, itl_ms=1, usage=0, tokens=5)
    # No tokenizer given: the word-ratio estimate counts the text, and the records say it is an estimate.
    assert all(r.output_tokens == 5 and r.output_tokens_source == "estimated" for r in res.records)
    assert all(r.input_tokens == 6 for r in res.records)  # the planned count stands in for usage
    assert res.counted_tokens
    s = summarize(res.records, res.duration_s, {})
    assert s.output_tokens_source == "estimated" and s["tokens.output_estimated"] == 1
    # With an exact tokenizer the generated text is counted after the run, not the chunks.
    tok = LlamaCppTokenizer(srv.url)
    res = run_load_sync(srv.url_for(ttft_ms=5, itl_ms=1, usage=0, tokens=5), BASE, reqs, tokenizer=tok)
    assert [r.output_tokens for r in res.records] == [5] * 8 and res.tokenizer.startswith("llama.cpp")
    assert {r.output_tokens_source for r in res.records} == {"counted"}
    assert summarize(res.records, res.duration_s, {})["tokens.output_estimated"] == 0
    tok.close()


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("streaming_fraction", [1.0, 0.0])
def test_tokens_per_chunk_are_counted_not_chunks_when_usage_is_missing(srv, api, streaming_fraction):
    # 4 tokens per chunk, no usage, no exact tokenizer: counting chunks made TPOT 4x too long.
    wl = replace(BASE, api=api, streaming_fraction=streaming_fraction)
    _, res, _ = run(srv, wl, ttft_ms=5, itl_ms=20, usage=0, tokens=8, per_chunk=4)
    assert all(r.ok for r in res.records)
    if streaming_fraction:
        assert all(len(r.chunk_ns) == 2 + (api == "chat") for r in res.records)  # chat: + its role chunk
    # The prompts' approximate tokenizer (the calibrated estimate's stand-in here) counts the 8 words.
    reqs = build_requests(wl, TOK, "instrument")
    srv.fetch_log()  # clear
    res = run_load_sync(srv.url_for(ttft_ms=5, itl_ms=20, usage=0, tokens=8, per_chunk=4), wl, reqs, tokenizer=TOK)
    log = {e["key"]: e for e in srv.fetch_log()}
    assert all(r.output_tokens == 8 and r.output_tokens_source == "estimated" for r in res.records)
    s = summarize(res.records, res.duration_s, {})
    assert s.output_tokens_source == "estimated"
    assert s["tokens.output_counted"] == 1 and s["tokens.output_estimated"] == 1
    assert s["tokens.output_total"] == 64
    if streaming_fraction:
        # The time from the first chunk to the last over the 7 tokens after the first: a seventh of the gap between
        # the two chunks the server wrote, not the whole gap of one token per chunk. (How close the client's stamps
        # come to the server's writes is benchmarks/loadgen.py's measurement, not this test's.)
        per_request = [(r.end_ns - r.first_chunk_ns) / 7 / 1e9 for r in res.records]
        assert s["tpot.p50"] == pytest.approx(float(np.median(per_request)))
        for p, r in zip(reqs, res.records, strict=True):
            assert r.end_ns >= log[p.messages[-1][1] if p.messages else p.prompt]["send_ns"][-1]


def test_calibrated_estimate_counts_output_when_the_tokenizer_is_gone():
    # An engine tokenizer that failed leaves the ratio calibrated against it, never chunks.
    from llmplay.loadgen.runner import _estimator
    from llmplay.loadgen.tokenizer import FallbackTokenizer

    class Halves:
        name, exact = "halves", True

        def count(self, text):
            return 2 * len(text.split())

        def make_text(self, n_tokens, rng):
            return ""

    fb = FallbackTokenizer(Halves())
    assert _estimator(fb).count("a b c") == 6 and _estimator(fb) is fb.estimate
    assert _estimator(TOK) is TOK and _estimator(None).count("a b c") == 3


def test_throughput_window_covers_a_request_that_timed_out(srv):
    # One fast request, then one the server never answers: the window ends when the timeout is seen.
    wl = replace(BASE, concurrency=1, num_requests=2, request_timeout_s=1.0)
    _, res, _ = run(srv, wl, ttft_ms=5, itl_ms=5, fault="stall", fault_after=0, fault_from=1)
    assert [r.error_kind for r in res.records] == [None, "timeout"]
    assert res.records[1].first_chunk_ns is None and res.records[1].finished_ns is not None
    # The 1 s timeout starts a little before sent_ns (stamped when the bytes were written).
    assert res.end_ns >= res.records[1].finished_ns >= res.records[1].sent_ns + 0.95e9
    assert res.end_ns == res.records[1].finished_ns and res.duration_s == (res.end_ns - res.start_ns) / 1e9
    s = summarize(res.records, res.duration_s, {})
    # One completed request over the whole window (>= the 1 s timeout), not over a window ending at the first reply.
    assert res.duration_s >= 0.95 and s["throughput.req_s"] == pytest.approx(1 / res.duration_s)
    assert s["throughput.output_tok_s"] == pytest.approx(6 / res.duration_s)


def test_usage_tokens(srv):
    _, res, _ = run(srv, BASE, ttft_ms=5, itl_ms=1, tokens=3)
    assert all(r.output_tokens == 3 and r.output_tokens_source == "usage" and r.input_tokens == 6 for r in res.records)
    assert all(r.finish_reason == "length" for r in res.records)


def test_non_streamed_requests(srv):
    wl = replace(BASE, streaming_fraction=0.0, api="chat")
    reqs, res, log = run(srv, wl, ttft_ms=30, itl_ms=4)
    assert all(r.ok and not r.stream for r in res.records)
    s = summarize(res.records, res.duration_s, {"ttft": 0.001})
    assert s["ttft.p50"] is None and s["tpot.p50"] is None and s["itl.p50"] is None
    # TTFT = E2EL for non-streamed: the body, written at least 30 ms + 5 × 4 ms after the request came (the
    # server's log), ends it; stamped after that write (how soon after on a busy machine: benchmarks/loadgen.py).
    for planned, rec in zip(reqs, res.records, strict=True):
        (written_ns,) = log[planned.messages[-1][1]]["send_ns"]
        assert rec.sent_ns <= log[planned.messages[-1][1]]["recv_ns"] and written_ns <= rec.end_ns
    assert s["ttft_nonstream.p50"] >= 0.050 and s["e2el.p50"] == s["ttft_nonstream.p50"]
    assert s["goodput.req_s"] == 0.0  # 50 ms misses a 1 ms TTFT SLO


ERROR_CASES = [
    ({"fault": "500"}, "http_5xx", 500),
    ({"fault": "400"}, "http_4xx", 400),
    ({"fault": "close", "fault_after": 2}, "truncated", 200),
    ({"fault": "reset", "fault_after": 2}, "truncated", 200),
    ({"fault": "reset", "fault_after": 0}, "connect", None),
    ({"fault": "stall", "fault_after": 1}, "timeout", 200),
    ({"fault": "garbage", "fault_after": 1}, "protocol", 200),
    ({"done": 0}, "truncated", 200),
]


@pytest.mark.parametrize(("cfg", "kind", "status"), ERROR_CASES, ids=[c[1] + "-" + str(c[0]) for c in ERROR_CASES])
def test_every_error_kind_is_counted(srv, cfg, kind, status):
    wl = replace(BASE, request_timeout_s=0.3)
    _, res, _ = run(srv, wl, ttft_ms=5, itl_ms=2, **cfg)
    assert len(res.records) == 8
    assert {r.error_kind for r in res.records} == {kind}
    assert {r.http_status for r in res.records} == {status}
    assert all(r.error_message for r in res.records)
    s = summarize(res.records, res.duration_s, {})
    assert s["errors.count"] == 8 and s["errors.rate"] == 1.0 and s[f"errors.{kind}"] == 8
    assert s["requests.total"] == 8 and s["requests.completed"] == 0
    if cfg.get("fault_after"):
        assert all(r.bytes_received > 0 and len(r.chunk_ns) == cfg["fault_after"] for r in res.records)


def test_connect_error_when_nothing_listens():
    reqs = build_requests(BASE, TOK, "m")
    res = run_load_sync("http://127.0.0.1:9", BASE, reqs)
    assert len(res.records) == 8 and {r.error_kind for r in res.records} == {"connect"}


def test_mixed_errors_are_not_dropped(srv):
    # Half the requests fail: the sample keeps all of them and the rate says so.
    ok = build_requests(BASE, TOK, "m")
    res_ok = run_load_sync(srv.url_for(ttft_ms=2, itl_ms=1), BASE, ok)
    res_bad = run_load_sync(srv.url_for(fault="500"), BASE, ok)
    s = summarize(list(res_ok.records) + list(res_bad.records), res_ok.duration_s, {})
    assert s["requests.total"] == 16 and s["errors.rate"] == 0.5 and s["requests.completed"] == 8


def test_poisson_arrivals_match_the_rate(srv):
    wl = Workload(
        rate=400.0,
        arrival="poisson",
        num_requests=400,
        seed=11,
        input=LengthDist("fixed", value=2),
        output=LengthDist("fixed", value=1),
    )
    _, res, _ = run(srv, wl, ttft_ms=1, itl_ms=1)
    assert all(r.ok for r in res.records)
    sched = np.sort(np.array([r.scheduled_ns for r in res.records])) / 1e9
    gaps = np.diff(sched)
    assert abs(1 / gaps.mean() - 400) / 400 < 0.1
    assert stats.kstest(gaps, "expon", args=(0, 1 / 400)).pvalue > 0.01
    # No request leaves before its time, and the lag reported is the records' own; how closely a loaded machine
    # keeps the schedule is benchmarks/loadgen.py's measure, not this test's.
    lag_s = np.array([(r.sent_ns - r.scheduled_ns) / 1e9 for r in res.records])
    assert (lag_s >= 0).all()
    assert res.schedule_lag_p50_s == pytest.approx(float(np.percentile(lag_s, 50)))
    assert res.schedule_lag_p99_s == pytest.approx(float(np.percentile(lag_s, 99)))


def test_constant_arrivals_with_bursts(srv):
    wl = Workload(
        rate=200.0,
        arrival="constant",
        burst=4,
        num_requests=40,
        input=LengthDist("fixed", value=2),
        output=LengthDist("fixed", value=1),
    )
    _, res, _ = run(srv, wl, ttft_ms=1, itl_ms=1)
    sched = np.array(sorted(r.scheduled_ns for r in res.records))
    groups = sched.reshape(10, 4)
    assert (groups == groups[:, :1]).all()  # four requests per arrival
    assert np.allclose(np.diff(groups[:, 0]) / 1e9, 4 / 200, atol=1e-6)


def test_duration_bound_closed_loop_with_warmup_seconds(srv):
    wl = Workload(
        concurrency=3,
        duration_s=0.4,
        warmup_s=0.1,
        input=LengthDist("fixed", value=2),
        output=LengthDist("fixed", value=2),
    )
    res = run_load_sync(srv.url_for(ttft_ms=10, itl_ms=5), wl, iter_requests(wl, TOK, "m"))
    warm = [r for r in res.records if r.is_warmup]
    meas = [r for r in res.records if not r.is_warmup]
    assert warm and meas and all(r.ok for r in res.records)
    assert all(r.sent_ns < res.start_ns for r in warm) and all(r.sent_ns >= res.start_ns for r in meas)
    # llmplay decides on the schedule stamp; the write follows it by however long a busy machine takes.
    assert all(r.scheduled_ns < res.start_ns + 0.4e9 and r.scheduled_ns <= r.sent_ns for r in meas)
    # The window runs from the end of warm-up to the last measured request's end, however late a busy machine ran.
    assert res.warmup_duration_s >= 0.1 and res.end_ns == max(r.end_ns for r in meas)
    assert res.duration_s == (res.end_ns - res.start_ns) / 1e9
    # At most what the server allows: 3 users, each starting requests of at least 15 ms for 0.4 s (27 each). Whether
    # every user's warm-up request ended inside the 0.4 s window, so that each user was measured, is the machine's
    # speed; that the requests measured were scheduled inside it is llmplay's (above).
    assert 1 <= len(meas) <= 3 * 27
    assert sorted(r.index for r in res.records) == list(range(len(res.records)))


def test_dataframe_round_trip(srv):
    _, res, _ = run(srv, replace(BASE, streaming_fraction=0.5), ttft_ms=2, itl_ms=1)
    df = per_request_frame(res.records)
    assert len(df) == 8 and list(df["chunk_ns"][0]) == list(res.records[0].chunk_ns)
    assert records_from_dataframe(df) == res.records
    a = summarize(df, res.duration_s, {"ttft": 1.0}).as_dict()
    b = summarize(res.records, res.duration_s, {"ttft": 1.0}).as_dict()
    assert a == b


def test_multi_turn_turns_follow_each_other(srv):
    wl = Workload(
        concurrency=4, num_requests=12, turns=3, input=LengthDist("fixed", value=3), output=LengthDist("fixed", value=3)
    )
    _, res, _ = run(srv, wl, ttft_ms=10, itl_ms=2)
    assert all(r.ok for r in res.records)
    by_conv: dict[int, list] = {}
    for r in res.records:
        by_conv.setdefault(r.conversation_id, []).append(r)
    for turns in by_conv.values():
        turns.sort(key=lambda r: r.turn)
        # Each turn is sent only after the previous one (whose reply it resends) has finished.
        assert all(b.sent_ns >= a.end_ns for a, b in itertools.pairwise(turns))
        # ... by the same user, whose next turn is due when the reply ends (no think time here).
        assert all(b.scheduled_ns >= a.end_ns for a, b in itertools.pairwise(turns))
    # A conversation is one user's: its turns never wait in the client for another user to free up.
    assert all(r.queue_wait_s == 0 for r in res.records)


def test_run_load_with_a_caller_supplied_client(srv):
    # The contract takes any httpx.AsyncClient (here httpx's own transport): arrival is stamped in the loop.
    import asyncio

    import httpx

    from llmplay.loadgen.runner import run_load

    async def main():
        async with httpx.AsyncClient() as client:
            return await run_load(client, srv.url_for(ttft_ms=5, itl_ms=2), BASE, build_requests(BASE, TOK, "m"))

    res = asyncio.run(main())
    assert len(res.records) == 8 and all(r.ok and len(r.chunk_ns) == 6 for r in res.records)


def test_run_load_goes_through_the_client_unless_handed_its_transport(srv):
    # The client's layers (here an event hook) are skipped only when the caller passes the transport itself.
    import asyncio

    import httpx

    from llmplay.loadgen.runner import run_load
    from llmplay.loadgen.transport import StreamingTransport

    hooked: list[httpx.Request] = []

    async def hook(request):
        hooked.append(request)

    async def main():
        transport = StreamingTransport()
        async with httpx.AsyncClient(transport=transport, event_hooks={"request": [hook]}) as client:
            url = srv.url_for(ttft_ms=2, itl_ms=1)
            through = await run_load(client, url, BASE, build_requests(BASE, TOK, "m"))
            sent_through = len(hooked)
            direct = await run_load(client, url, BASE, build_requests(BASE, TOK, "m"), transport=transport)
            return through, sent_through, direct

    through, sent_through, direct = asyncio.run(main())
    assert sent_through == 8 and len(hooked) == 8
    assert all(r.ok and len(r.chunk_ns) == 6 for r in through.records + direct.records)


def test_open_loop_warmup_requests_outlast_warmup_seconds(srv):
    wl = Workload(
        rate=100.0,
        num_requests=10,
        warmup_requests=10,
        warmup_s=0.01,
        input=LengthDist("fixed", value=2),
        output=LengthDist("fixed", value=1),
    )
    _, res, _ = run(srv, wl, ttft_ms=1, itl_ms=1)
    warm = [r for r in res.records if r.is_warmup]
    assert len(warm) == 10 and all(r.sent_ns < res.start_ns for r in warm)
    assert sum(1 for r in res.records if not r.is_warmup) == 10


def test_transport_reassembles_a_byte_by_byte_chunked_body_and_retries_a_stale_connection():
    import asyncio

    import httpx

    from llmplay.loadgen.transport import StreamingTransport

    body = b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\nx-trailer: 1\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"

    async def main():
        served = 0
        handlers_done: list[int] = []

        async def handle(reader, writer):
            nonlocal served
            await reader.readuntil(b"\r\n\r\n")
            served += 1
            for i in range(len(head + body)):
                writer.write((head + body)[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0)
            if served == 2:
                await reader.read()  # keep the second connection open until the client closes it
            writer.close()  # after the first: the client's idle keep-alive connection goes stale
            await writer.wait_closed()
            handlers_done.append(served)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        async with httpx.AsyncClient(transport=StreamingTransport()) as client:
            async with client.stream("GET", url) as resp:
                first = b"".join([piece async for piece in resp.aiter_raw()])
            await asyncio.sleep(0.05)
            resp = await client.send(client.build_request("GET", url), stream=True)  # reused, stale: retried
            got = []
            await resp.stream._stream.feed_into(lambda data, t_ns: got.append(data))
            await resp.aclose()
        while len(handlers_done) < 2:
            await asyncio.sleep(0.01)
        server.close()
        await server.wait_closed()
        return first, b"".join(got), served

    first, second, served = asyncio.run(main())
    assert first == second == b"abcdefg" and served == 2


@pytest.mark.parametrize(
    ("stream", "ok"),
    [
        # An immediate EOS: one token message without text. vllm bench serve counts it a success, so does llmplay.
        (b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n', True),
        # Usage and [DONE] without any token message: nothing to time a first token by.
        (b"", False),
    ],
    ids=["eos-only", "no-token"],
)
def test_a_reply_is_complete_once_a_token_message_came_text_or_not(stream, ok):
    import asyncio

    import httpx

    from llmplay.loadgen.runner import run_load

    usage = b'data: {"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":1,"total_tokens":7}}\n\n'
    body = stream + usage + b"data: [DONE]\n\n"
    response = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    handlers = []

    async def serve(reader, writer):  # every request on the connection gets `body`
        handlers.append(asyncio.current_task())
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with httpx.AsyncClient() as client:
            result = await run_load(client, url, BASE, build_requests(BASE, TOK, "m"))
        await asyncio.gather(*handlers)  # they end on the client's closed connections
        server.close()
        await server.wait_closed()
        return result

    records = asyncio.run(main()).records
    assert all(r.ok == ok for r in records)
    if ok:
        assert all(r.first_chunk_ns is not None and r.first_text_ns is None and r.output_tokens == 1 for r in records)
        s = summarize(records, 1.0, {})
        assert s["ttft.n"] == 8 and s["ttft_content.n"] == 0 and s["ttft_content.p50"] is None
    else:
        assert {r.error_kind for r in records} == {"protocol"}
        assert "no message with non-empty choices" in records[0].error_message


def test_each_chunk_is_stamped_with_the_clock_of_the_read_that_brought_it(monkeypatch):
    """What the load generator controls, free of any machine's noise: every token chunk carries the transport's
    clock at the read that brought its bytes, one read per chunk here. The clock is the test's: the server (in the
    same event loop) moves it before writing each chunk and writes the next only once the client has read. How
    close such a stamp lands to the server's write on a real, busy machine is benchmarks/loadgen.py's measurement
    (RESULTS.md, "TTFT err" and "ITL err" against the instrument's logged writes)."""
    clock, reads = [0], []

    def now_ns() -> int:
        reads.append(clock[0])
        return clock[0]

    monkeypatch.setattr("llmplay.loadgen.transport.now_ns", now_ns)
    written: list[list[int]] = []

    async def until_read(since: int) -> None:
        for _ in range(10_000):  # 10 s at most: the client's read wakes it on the next loop turn
            if len(reads) > since:
                return
            await asyncio.sleep(0.001)
        raise AssertionError("the client never read the chunk")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(re.search(rb"content-length: *(\d+)", head, re.IGNORECASE).group(1)))
        writer.write(STREAM_HEAD)
        stamps = []
        for event in _sse_events(6, 4):
            clock[0] += 1_000_000
            stamps.append(clock[0])
            since = len(reads)
            writer.write(_chunk(event))
            await writer.drain()
            await until_read(since)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        written.append(stamps)
        writer.close()

    wl = replace(BASE, concurrency=1, num_requests=2, streaming_fraction=1.0, request_timeout_s=30.0)

    async def main() -> Any:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with make_client(wl, StreamingTransport()) as client:
                return await run_load(client, url, wl, build_requests(wl, TOK, "m"))
        finally:
            server.close()
            await server.wait_closed()

    res = asyncio.run(main())
    records = sorted(res.records, key=lambda r: r.index)
    assert len(records) == 2 and all(r.ok for r in records), [r.error_message for r in records]
    for rec, stamps in zip(records, written, strict=True):
        # four token chunks, then the usage chunk (no choices) and [DONE]: neither is a token message
        assert list(rec.chunk_ns) == stamps[:4], (rec.chunk_ns, stamps)
        assert rec.first_chunk_ns == rec.first_text_ns == stamps[0]
    s = summarize(records, res.duration_s, {})
    assert s["itl.p50"] == pytest.approx(0.001) and s["tpot.p50"] == pytest.approx(0.001)
