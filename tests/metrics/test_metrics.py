"""Metric definitions (DESIGN.md) on hand-made records whose true values are known exactly."""

import json

import numpy as np
import pytest

from llmplay.loadgen.records import RequestRecord, records_from_dataframe
from llmplay.metrics import per_request_arrays, per_request_frame, summarize

MS = 1_000_000


def rec(
    index,
    *,
    sent=0,
    chunks_ms=(),
    out=None,
    stream=True,
    warm=False,
    error=None,
    inp=10,
    source="usage",
    scheduled=None,
):
    chunks = tuple(sent + int(c * MS) for c in chunks_ms)
    end = chunks[-1] if chunks else None
    return RequestRecord(
        index=index,
        is_warmup=warm,
        stream=stream,
        scheduled_ns=sent if scheduled is None else scheduled,
        sent_ns=sent,
        first_chunk_ns=chunks[0] if chunks else None,
        first_content_ns=chunks[0] if chunks else None,
        chunk_ns=chunks,
        end_ns=end,
        input_tokens=inp,
        output_tokens=len(chunks) if out is None else out,
        output_tokens_source=source,
        finish_reason="length" if error is None else None,
        http_status=200 if error is None else 500,
        error_kind=error,
        error_message=error,
        queue_wait_s=0.0,
    )


RECORDS = [
    rec(0, warm=True, chunks_ms=(1000, 2000)),  # warm-up: excluded everywhere
    rec(1, chunks_ms=(100, 110, 120, 130)),  # TTFT 100, ITL 10 x3, E2EL 130, TPOT 10
    rec(2, chunks_ms=(200, 240, 280)),  # TTFT 200, ITL 40 x2, E2EL 280, TPOT 40
    rec(3, chunks_ms=(300,), out=1),  # one token: no TPOT, no ITL
    rec(4, chunks_ms=(50, 60), out=5),  # usage says 5 tokens in 2 chunks: TPOT (60-50)/4
    rec(5, stream=False, chunks_ms=(400,), out=8),  # non-streamed: TTFT = E2EL = 400, reported apart
    rec(6, error="http_5xx"),
    rec(7, error="timeout", chunks_ms=(20,)),  # cut short: never a latency sample
]


def test_definitions_match_design():
    s = summarize(RECORDS, duration_s=2.0, slo_s={})
    ttft = np.array([0.100, 0.200, 0.300, 0.050])
    assert s["ttft.mean"] == pytest.approx(ttft.mean()) and s["ttft.std"] == pytest.approx(ttft.std())
    assert s["ttft.p90"] == pytest.approx(np.percentile(ttft, 90))  # linear interpolation
    assert s["ttft.p50"] == pytest.approx(0.150)
    tpot = np.array([0.010, 0.040, 0.010 / 4])
    assert s["tpot.mean"] == pytest.approx(tpot.mean()) and s["tpot.p99"] == pytest.approx(np.percentile(tpot, 99))
    itl = np.array([0.010] * 3 + [0.040] * 2 + [0.010])  # pooled over requests
    assert s["itl.mean"] == pytest.approx(itl.mean()) and s["itl.p50"] == pytest.approx(np.median(itl))
    e2el = np.array([0.130, 0.280, 0.300, 0.060, 0.400])  # non-streamed requests have an E2EL too
    assert s["e2el.p95"] == pytest.approx(np.percentile(e2el, 95))
    assert s["ttft_nonstream.p50"] == pytest.approx(0.400) and s["ttft_nonstream.std"] == 0.0
    assert s["requests.total"] == 7 and s["requests.completed"] == 5 and s["requests.streamed"] == 4
    assert s["requests.nonstreamed"] == 1
    # what each family's percentiles rest on: ITL counts requests, not the gaps it pools
    assert (s["ttft.n"], s["tpot.n"], s["itl.n"], s["e2el.n"], s["ttft_nonstream.n"]) == (4, 3, 3, 5, 1)
    assert s["errors.count"] == 2 and s["errors.rate"] == pytest.approx(2 / 7)
    assert s["errors.http_5xx"] == 1 and s["errors.timeout"] == 1 and s["errors.connect"] == 0
    out_tokens = 4 + 3 + 1 + 5 + 8
    assert s["throughput.req_s"] == pytest.approx(5 / 2.0)
    assert s["throughput.output_tok_s"] == pytest.approx(out_tokens / 2.0)
    assert s["throughput.total_tok_s"] == pytest.approx((out_tokens + 50) / 2.0)
    assert s["goodput.req_s"] == s["throughput.req_s"]  # no SLOs: every completed request is good


def test_goodput_needs_every_slo():
    s = summarize(RECORDS, 2.0, {"ttft": 0.150, "tpot": 0.020})
    # good: r1 (100 ms, 10 ms), r4 (50 ms, 2.5 ms); r2 fails TTFT and TPOT, r3 TTFT, r5 (TTFT=E2EL 400 ms).
    assert s["goodput.req_s"] == pytest.approx(2 / 2.0)
    s = summarize(RECORDS, 2.0, {"e2el": 0.3})
    assert s["goodput.req_s"] == pytest.approx(4 / 2.0)
    with pytest.raises(ValueError, match="unknown SLO keys"):
        summarize(RECORDS, 2.0, {"itl": 0.1})


def test_contract_keys_and_empty_input():
    keys = set(summarize([], 0.0, {}).as_dict())
    for metric in ("ttft", "tpot", "itl", "e2el", "ttft_nonstream"):
        assert {f"{metric}.{s}" for s in ("mean", "std", "p50", "p90", "p95", "p99")} <= keys
    assert {
        "throughput.req_s",
        "throughput.output_tok_s",
        "throughput.total_tok_s",
        "goodput.req_s",
        "errors.rate",
        "errors.count",
        "requests.completed",
        "requests.total",
        "queue_wait.p95",
    } <= keys
    empty = summarize([], 0.0, {})
    assert empty["ttft.p95"] is None and empty["throughput.req_s"] is None and empty["errors.rate"] == 0.0


def test_per_request_arrays_for_bootstrap():
    arr = per_request_arrays(RECORDS)
    assert arr["ttft"] == pytest.approx([0.1, 0.2, 0.3, 0.05])
    assert arr["tpot"] == pytest.approx([0.01, 0.04, 0.0025])
    assert len(arr["itl"]) == 6 and len(arr["e2el"]) == 5
    assert arr["ttft_nonstream"] == pytest.approx([0.4])


def test_counted_tokens_are_reported():
    s = summarize(
        [rec(1, chunks_ms=(1, 2), source="counted"), rec(2, chunks_ms=(1, 2))], 1.0, {}, tokenizer="word-ratio"
    )
    assert s.output_tokens_source == "mixed" and s["tokens.output_counted"] == 1
    assert s.to_json()["tokenizer"] == "word-ratio"
    assert s["tokens.output_estimated"] == 0  # the exact tokenizer counted: no estimate


def test_estimated_tokens_are_marked():
    # No usage and no exact tokenizer: the approximate count is marked, alone or beside exact counts.
    alone = summarize([rec(1, chunks_ms=(1, 2), out=8, source="estimated")], 1.0, {})
    assert alone.output_tokens_source == "estimated" and alone.to_json()["output_tokens_source"] == "estimated"
    assert alone["tokens.output_counted"] == 1 and alone["tokens.output_estimated"] == 1
    assert alone["tokens.output_total"] == 8 and alone["tpot.p50"] == pytest.approx(0.001 / 7)
    mixed = summarize([rec(1, chunks_ms=(1, 2), source="estimated"), rec(2, chunks_ms=(1, 2))], 1.0, {})
    assert mixed.output_tokens_source == "mixed" and mixed["tokens.output_estimated"] == 1
    assert summarize([rec(1, chunks_ms=(1, 2))], 1.0, {})["tokens.output_estimated"] == 0


def test_dataframe_and_parquet_round_trip(tmp_path):
    df = per_request_frame(RECORDS)
    path = tmp_path / "records.parquet"
    df.to_parquet(path)
    import pandas as pd

    back = pd.read_parquet(path)
    assert records_from_dataframe(back) == tuple(RECORDS)
    assert summarize(back, 2.0, {"ttft": 0.15}).as_dict() == summarize(RECORDS, 2.0, {"ttft": 0.15}).as_dict()
    assert back["ttft_s"][1] == pytest.approx(0.1)


# ------------------------------------------------------------------------------ parity with vllm bench serve
# (arrival ms, SSE bytes of that read): a chat stream whose role chunk comes 40 ms before the first token (a
# server that sends it on admission), reasoning before content, an empty finish chunk after the last token.
CHAT_READS = (
    (40, b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'),
    (80, b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"so"},"finish_reason":null}]}\n\n'),
    (95, b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'),
    (
        110,
        b'data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    ),
    (130, b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}\n\n'),
    (131, b"data: [DONE]\n\n"),
)
COMPLETION_READS = (
    (30, b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'),
    (45, b'data: {"choices":[{"index":0,"text":"","finish_reason":null}]}\n\n'),  # a special token: no text
    (70, b'data: {"choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n'),
    (
        90,
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}\n\ndata: [DONE]\n\n',
    ),
)


def streamed_record(reads, index=0):
    """The record send.py makes of these reads (request sent at 0), through the real SSE parser."""
    from llmplay.loadgen.sse import StreamState

    st = StreamState()
    for t_ms, data in reads:
        st.feed(data, t_ms * MS)
    return RequestRecord(
        index=index,
        is_warmup=False,
        stream=True,
        scheduled_ns=0,
        sent_ns=0,
        first_chunk_ns=st.first_chunk_ns,
        first_content_ns=st.first_content_ns,
        chunk_ns=tuple(st.chunk_ns),
        end_ns=st.end_ns,
        input_tokens=st.usage["prompt_tokens"],
        output_tokens=st.usage["completion_tokens"],
        output_tokens_source="usage",
        finish_reason=st.finish_reason,
        http_status=200,
        error_kind=None,
        error_message=None,
        queue_wait_s=0.0,
        first_text_ns=st.first_text_ns,
    )


def vllm_reference(reads):
    """What vllm bench serve's request function (vllm/benchmarks/lib/endpoint_request_func.py) records from these
    reads: the clock stops at every message with non-empty choices; TTFT at the first, one ITL per later one,
    latency at the last; a usage-only message only sets the token count."""
    ttft, itl, last, tokens = None, [], 0.0, None
    for t_ms, data in reads:
        for message in data.decode().split("\n\n"):
            chunk = message.strip().removeprefix("data: ")
            if not chunk or chunk == "[DONE]":
                continue
            obj = json.loads(chunk)
            t = t_ms / 1000
            if obj.get("choices"):
                if ttft is None:
                    ttft = t
                else:
                    itl.append(t - last)
                last = t
            elif obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    return {"ttft": ttft, "itl": itl, "e2el": last, "tpot": (last - ttft) / (tokens - 1)}


@pytest.mark.parametrize("reads", [CHAT_READS, COMPLETION_READS], ids=["chat", "completions"])
def test_ttft_itl_e2el_tpot_are_vllm_bench_serve_s_on_the_same_bytes(reads):
    want = vllm_reference(reads)
    got = per_request_arrays([streamed_record(reads)])
    assert got["ttft"] == pytest.approx([want["ttft"]])
    assert got["itl"] == pytest.approx(want["itl"])
    assert got["e2el"] == pytest.approx([want["e2el"]])
    assert got["tpot"] == pytest.approx([want["tpot"]])


def test_ttft_content_and_ttfo_time_the_first_text_and_the_first_answer():
    s = summarize([streamed_record(CHAT_READS)], 1.0, {})
    assert s["ttft.p50"] == pytest.approx(0.040)  # the role-only chunk (vLLM's trigger)
    assert s["ttft_content.p50"] == pytest.approx(0.080)  # first text, reasoning included (AIPerf TTFT)
    assert s["ttfo.p50"] == pytest.approx(0.095)  # first non-reasoning content (AIPerf TTFO)
    assert s["e2el.p50"] == pytest.approx(0.110)  # the empty finish chunk, not the usage chunk or [DONE]
    assert s["ttft_content.n"] == 1
    completion = summarize([streamed_record(COMPLETION_READS)], 1.0, {})
    assert completion["ttft.p50"] == completion["ttft_content.p50"] == pytest.approx(0.030)


def test_an_archive_from_before_ttft_content_reads_its_first_chunk_as_first_text():
    # Such archives timed text chunks only: first_chunk_ns was the first text, so ttft_content is their ttft.
    legacy = per_request_frame(RECORDS).drop(columns=["first_text_ns", "ttft_content_s"])
    back = records_from_dataframe(legacy)
    assert all(r.first_text_ns == r.first_chunk_ns for r in back)
    s = summarize(back, 2.0, {})
    assert s["ttft_content.p95"] == s["ttft.p95"] and s["ttft_content.n"] == s["ttft.n"] == 4
