"""SSE parsing with byte fixtures: what is timestamped, what is skipped, where the stream ends."""

from llmplay.loadgen.sse import DONE, ERROR, ROLE, TEXT, USAGE, SSEDecoder, StreamState, parse_event

COMPLETION = (
    b'data: {"choices":[{"index":0,"text":" Hello","finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"text":" world","finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n'
    b"data: [DONE]\n\n"
)
CHAT = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def test_decoder_handles_any_split_and_crlf():
    whole = SSEDecoder().feed(COMPLETION)
    assert len(whole) == 4 and whole[-1] == b"[DONE]"
    for size in (1, 3, 7, 50):
        dec = SSEDecoder()
        got = []
        for i in range(0, len(COMPLETION), size):
            got += dec.feed(COMPLETION[i : i + size])
        assert got == whole
    assert SSEDecoder().feed(COMPLETION.replace(b"\n", b"\r\n")) == whole


def test_a_crlf_split_between_reads_ends_one_line_not_two():
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    assert dec.feed(b"\ndata: b\r\n\r\n") == [b"a\nb"]


# Multi-line events in every line-ending style, with a comment and an event:/id: block between them.
MULTILINE = (
    b"data: a\r\ndata: b\r\n\r\n: ping\r\n\r\nevent: x\rid: 3\rdata: c\rdata: d\r\r"
    b"data: e\ndata: f\n\ndata: [DONE]\r\n\r\n"
)


def test_decoder_gives_the_same_events_whatever_two_or_three_reads_the_stream_arrives_in():
    whole = SSEDecoder().feed(MULTILINE)
    assert whole == [b"a\nb", b"c\nd", b"e\nf", b"[DONE]"]
    n = len(MULTILINE)
    for i in range(n + 1):
        dec = SSEDecoder()
        got = dec.feed(MULTILINE[:i]) + dec.feed(MULTILINE[i:])
        assert got == whole, f"split at byte {i}: {MULTILINE[:i][-8:]!r} | {MULTILINE[i:][:8]!r}"
        for j in range(i, n + 1):
            dec = SSEDecoder()
            got = dec.feed(MULTILINE[:i]) + dec.feed(MULTILINE[i:j]) + dec.feed(MULTILINE[j:])
            assert got == whole, f"split at bytes {i} and {j}"


def test_decoder_skips_comments_and_joins_multiline_data():
    dec = SSEDecoder()
    assert dec.feed(b": ping\n\nevent: x\nid: 3\ndata: a\ndata: b\n\ndata: tail") == [b"a\nb"]
    assert dec.pending == b"data: tail"


def test_parse_event_kinds():
    assert parse_event(b"[DONE]").kind == DONE
    assert parse_event(b'{"choices":[{"delta":{"role":"assistant"}}]}').kind == ROLE
    assert parse_event(b'{"choices":[],"usage":{"completion_tokens":3}}').kind == USAGE
    ev = parse_event(b'{"choices":[{"text":"x","finish_reason":"stop"}]}')
    assert (ev.kind, ev.content, ev.finish_reason) == (TEXT, "x", "stop")
    ev = parse_event(b'{"choices":[{"delta":{"reasoning_content":"r"}}]}')
    assert (ev.kind, ev.content, ev.reasoning) == (TEXT, "", "r")
    assert parse_event(b'{"error":{"message":"boom"}}').error == "boom"
    assert parse_event(b"{oops").kind == ERROR


def test_stream_state_times_every_message_with_choices_as_vllm_does():
    st = StreamState()
    events = CHAT.split(b"\n\n")
    for t, ev in enumerate(events[:-1], start=1):  # one event per feed, at t = 1, 2, ...
        st.feed(ev + b"\n\n", t * 100)
    assert st.first_chunk_ns == 100  # TTFT: the role-only chunk has non-empty choices (vllm bench serve)
    assert st.first_text_ns == 200  # first text, reasoning included (AIPerf TTFT): ttft_content
    assert st.first_content_ns == 300  # first non-reasoning content (TTFO)
    assert st.chunk_ns == [100, 200, 300, 400]  # ITL: the role and the empty finish chunk are gaps too
    assert st.end_ns == 400  # E2EL ends at the empty finish chunk (it carries the EOS token); [DONE] does not move it
    assert st.finish_reason == "stop" and st.done and st.text == "hmmHi"


# llama.cpp's server: the role chunk and the first token in one write, an empty finish chunk after the last token,
# then the usage-only chunk.
LLAMACPP_CHAT = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"A"},"finish_reason":null}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"B"},"finish_reason":null}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}\n\ndata: [DONE]\n\n',
)


def test_reads_of_a_llamacpp_stream_stamp_its_messages_as_vllm_would():
    st = StreamState()
    for t, data in zip((10, 20, 30, 40), LLAMACPP_CHAT, strict=True):
        st.feed(data, t)
    assert (st.first_chunk_ns, st.first_text_ns, st.first_content_ns) == (10, 10, 10)
    assert st.chunk_ns == [10, 10, 20, 30]  # role and first token read together: a gap of 0, as vLLM counts it
    assert st.end_ns == 30 and st.usage["completion_tokens"] == 2 and st.text == "AB"


def test_a_reply_of_only_an_eos_token_has_a_first_token_but_no_text():
    st = StreamState()
    st.feed(b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n', 7)
    assert st.first_chunk_ns == 7 and st.end_ns == 7 and st.chunk_ns == [7]
    assert st.first_text_ns is None and st.first_content_ns is None and st.text == ""


def test_stream_state_usage_chunk_is_not_a_token_and_done_stops():
    st = StreamState()
    st.feed(COMPLETION[:80], 10)
    st.feed(COMPLETION[80:] + b'data: {"choices":[{"text":"late"}]}\n\n', 20)
    assert st.chunk_ns == [10, 20] and st.end_ns == 20
    assert st.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert st.done and st.text == " Hello world"  # nothing after [DONE]
    assert st.bytes_received == len(COMPLETION) + len(b'data: {"choices":[{"text":"late"}]}\n\n')


def test_stream_state_keeps_bytes_of_a_cut_stream():
    st = StreamState()
    st.feed(COMPLETION[:100], 5)
    assert not st.done
    assert st.bytes_received == 100
    first_event_end = COMPLETION.index(b"\n\n") + 2
    assert st.tail() == COMPLETION[first_event_end:100] and st.chunk_ns == [5]


def test_stream_state_error_event():
    st = StreamState()
    st.feed(b'data: {"choices":[{"text":"a"}]}\n\ndata: {"error":{"message":"overloaded"}}\n\n', 1)
    assert st.error == "overloaded" and st.chunk_ns == [1]
