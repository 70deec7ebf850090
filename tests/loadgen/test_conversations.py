"""Conversations with the model's real replies, think time and session headers; prefix reuse expected (the
workload's own, from what was sent) against achieved (what the engine says it served from its cache)."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.loadgen.records import RequestRecord, records_from_dataframe
from llmplay.loadgen.runner import make_client, run_load, run_load_sync
from llmplay.loadgen.sse import SSEDecoder, parse_event
from llmplay.loadgen.tokenizer import WordRatioTokenizer, make_tokenizer
from llmplay.loadgen.transport import StreamingTransport
from llmplay.loadgen.workload import build_requests, iter_requests
from llmplay.metrics import engine_prefix_reuse, per_request_frame, prefix_reuse_text, prompt_prefix_reuse, summarize
from llmplay.spec import LengthDist, ThinkTime, Workload
from llmplay_testing.instrument import InstrumentServer

# Timed against the instrument: a raised CPU priority (tests/conftest.py).
pytestmark = pytest.mark.timing

TOK = WordRatioTokenizer()
CHAT = Workload(
    api="chat",
    concurrency=2,
    num_requests=6,
    turns=3,
    prefix_tokens=8,
    input=LengthDist("fixed", value=5),
    output=LengthDist("fixed", value=4),
    request_timeout_s=10.0,
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def srv():
    with InstrumentServer(process=True) as server:
        yield server


def run(srv, wl, **cfg):
    srv.fetch_log()  # clear (and forget what the instrument's prefix cache held)
    result = run_load_sync(srv.url_for(**cfg) if cfg else srv.url, wl, build_requests(wl, TOK, "instrument"))
    return result, srv.fetch_log()


def _reply(n_tokens: int) -> str:
    return "".join(f" t{i}" for i in range(n_tokens))  # what the instrument streams for n tokens


def _by_conversation(entries: list[dict[str, Any]], api: str) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The instrument's log grouped per conversation (its first request's prompt or first user message), in order."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for entry in sorted(entries, key=lambda e: e["recv_ns"]):
        if api == "chat":
            first_user = next(m["content"] for m in entry["messages"] if m["role"] == "user")
            groups.setdefault((first_user,), []).append(entry)
        else:
            groups.setdefault((entry["prompt"].split("\n")[1],), []).append(entry)
    return groups


@pytest.mark.parametrize("stream", [1.0, 0.0], ids=["streamed", "non-streamed"])
def test_a_later_turn_resends_the_replies_as_the_server_returned_them_chat(srv, stream):
    res, log = run(srv, replace(CHAT, streaming_fraction=stream), tokens=3)
    assert len(res.records) == 6 and all(r.ok for r in res.records)
    convs = _by_conversation(log, "chat")
    assert len(convs) == 2 and all(len(turns) == 3 for turns in convs.values())
    for turns in convs.values():
        first, second, third = (t["messages"] for t in turns)
        assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
        # The server's text, not the planned 4-token stand-in: the instrument was told to answer 3 tokens.
        assert second[2] == {"role": "assistant", "content": _reply(3)}
        assert third[:4] == second and third[4] == {"role": "assistant", "content": _reply(3)}
        assert second[:2] == first


def test_a_later_turn_resends_the_reply_completions(srv):
    wl = replace(CHAT, api="completions", turns=2, num_requests=4)
    res, log = run(srv, wl, tokens=2)
    assert all(r.ok for r in res.records)
    for first, second in _by_conversation(log, "completions").values():
        assert second["prompt"] == first["prompt"] + "\n" + _reply(2) + "\n" + second["prompt"].rsplit("\n", 1)[1]


def test_a_cut_off_reply_is_resent_as_received(srv):
    # The stream closes after 2 chunks: the next turn carries the two words that came, as a chat client shows them.
    wl = replace(CHAT, turns=2, num_requests=2, concurrency=1)
    res, log = run(srv, wl, tokens=5, fault="close", fault_after=2)
    assert [r.error_kind for r in sorted(res.records, key=lambda r: r.index)] == ["truncated", "truncated"]
    second = sorted(log, key=lambda e: e["recv_ns"])[1]
    assert second["messages"][2] == {"role": "assistant", "content": _reply(2)}


def test_think_time_is_drawn_from_the_seed_and_waited(srv):
    think = ThinkTime("exponential", mean_s=0.5, max_s=2.0)
    a = [r.think_s for r in itertools.islice(iter_requests(replace(CHAT, think_time=think), TOK, "m"), 12)]
    b = [r.think_s for r in itertools.islice(iter_requests(replace(CHAT, think_time=think), TOK, "m"), 12)]
    c = [r.think_s for r in itertools.islice(iter_requests(replace(CHAT, think_time=think, seed=1), TOK, "m"), 12)]
    assert a == b != c and a[0] == a[3] == 0.0 and all(0 < t <= 2.0 for i, t in enumerate(a) if i % 3)
    # Without think time the plan is the one it always was: the pauses draw from a stream of their own.
    plain = build_requests(CHAT, TOK, "m")
    assert [r.messages for r in build_requests(replace(CHAT, think_time=think), TOK, "m")] == [
        r.messages for r in plain
    ]
    wl = replace(CHAT, think_time=ThinkTime("fixed", value_s=0.15), num_requests=3, concurrency=1)
    res, _ = run(srv, wl, tokens=2, ttft_ms=5, itl_ms=1)
    turns = sorted(res.records, key=lambda r: r.turn)
    for prev, nxt in itertools.pairwise(turns):
        assert nxt.sent_ns - prev.end_ns >= 0.15e9  # the user read the reply before answering
        assert nxt.scheduled_ns - prev.end_ns >= 0.15e9 and nxt.queue_wait_s == 0  # not client queueing


def test_every_request_of_a_conversation_carries_its_session_header(srv):
    wl = replace(CHAT, session_header="x-session-id", seed=7)
    res, log = run(srv, wl)
    assert all(r.ok for r in res.records)
    for turns in _by_conversation(log, "chat").values():
        assert len({t["headers"]["x-session-id"] for t in turns}) == 1
    assert sorted({e["headers"]["x-session-id"] for e in log}) == ["7-0", "7-1"]
    res, log = run(srv, CHAT)
    assert not any("x-session-id" in e["headers"] for e in log)


def test_open_loop_conversations_arrive_as_sessions(srv):
    # 3-turn conversations at rate 30 req/s: 10 conversations a second, each turn after the previous reply.
    wl = replace(CHAT, concurrency=None, rate=30.0, arrival="constant", num_requests=12)
    res, log = run(srv, wl, tokens=3, ttft_ms=30, itl_ms=5)
    assert len(res.records) == 12 and all(r.ok for r in res.records)
    by_conv: dict[int, list[RequestRecord]] = {}
    for r in res.records:
        by_conv.setdefault(r.conversation_id, []).append(r)
    starts = sorted(min(r.scheduled_ns for r in turns) for turns in by_conv.values())
    assert [round((b - a) / 1e8) for a, b in itertools.pairwise(starts)] == [1, 1, 1]  # 0.1 s apart
    for turns in by_conv.values():
        assert all(b.sent_ns >= a.end_ns for a, b in itertools.pairwise(sorted(turns, key=lambda r: r.turn)))
    for turns in _by_conversation(log, "chat").values():
        assert turns[1]["messages"][2]["content"] == _reply(3)


def test_warm_up_ending_mid_conversation_hands_the_rest_to_the_measured_phase(srv):
    wl = replace(CHAT, turns=2, num_requests=4, warmup_requests=1, concurrency=2)
    res, log = run(srv, wl, tokens=2)
    assert len(res.records) == 5 and [r.is_warmup for r in res.records] == [True, False, False, False, False]
    assert len(res.measured()) == 4 and all(r.ok for r in res.records)
    warm_turn, measured_turn = (r for r in res.records if r.conversation_id == 0)
    assert measured_turn.sent_ns >= warm_turn.end_ns
    convs = list(_by_conversation(log, "chat").values())
    assert [len(turns) for turns in convs] == [2, 2, 1]  # 5 requests: the last conversation is cut at its first turn
    for turns in convs[:2]:
        assert turns[1]["messages"][2]["content"] == _reply(2)


def test_session_figures_and_ttft_by_turn(srv):
    res, _ = run(srv, CHAT, tokens=3)
    s = summarize(res.records, res.duration_s).as_dict()
    assert s["session.count"] == 2 and s["session.turns_mean"] == 3.0
    assert s["session.duration_s.p50"] > 0 and s["session.duration_s.p95"] >= s["session.duration_s.p50"]
    assert {k for k in s if k.startswith("ttft_turn.")} == {
        f"ttft_turn.{k}.{st}" for k in (1, 2, 3) for st in ("p50", "mean", "n")
    }
    assert s["ttft_turn.1.n"] == 2
    single = summarize(run(srv, replace(CHAT, turns=1))[0].records, 1.0).as_dict()
    assert not any(k.startswith(("session.", "ttft_turn.")) for k in single)


def test_prefix_reuse_expected_from_what_was_sent_and_achieved_from_the_engine(srv):
    res, _ = run(srv, CHAT, tokens=3, cache=1)
    s = summarize(res.records, res.duration_s).as_dict()
    # The instrument caches words as an engine caches tokens: both figures count the same repeats.
    assert 0.4 < s["prefix_reuse.expected"] < 0.95
    assert s["prefix_reuse.achieved"] == pytest.approx(s["prefix_reuse.expected"], abs=0.1)
    assert prefix_reuse_text(s).startswith("prefix reuse ") and "achieved" in prefix_reuse_text(s)
    # Fresh random prompts repeat nothing; an engine that says nothing of its cache leaves achieved unmeasured.
    res, _ = run(srv, replace(CHAT, turns=1, prefix_tokens=0))
    s = summarize(res.records, res.duration_s).as_dict()
    assert s["prefix_reuse.expected"] == 0.0 and "prefix_reuse.achieved" not in s
    assert prefix_reuse_text(s) is None
    # /metrics counters fill in where the responses did not say; the responses win where they did.
    assert engine_prefix_reuse({**s, "engine.prefix_cache_hit_rate": 0.25}) == {"prefix_reuse.achieved": 0.25}
    assert engine_prefix_reuse({"prefix_reuse.achieved": 0.5, "engine.prefix_cache_hit_rate": 0.25}) == {}
    # Caching off, vLLM looks nothing up (no hit rate) yet counts its hits: a measured 0 served from cache.
    off = {"engine.prefix_cache_hits": 0.0, "engine.prompt_tokens": 4000.0}
    assert engine_prefix_reuse({**s, **off}) == {"prefix_reuse.achieved": 0.0}
    assert engine_prefix_reuse({**s, **off, "engine.prompt_tokens": 0.0}) == {}  # nothing prefilled: nothing said
    assert engine_prefix_reuse({**s, "engine.prompt_tokens": 4000.0}) == {}  # no hit counter: not measured


def test_fingerprints_survive_the_archive(srv):
    res, _ = run(srv, CHAT, tokens=3, cache=1)
    back = records_from_dataframe(per_request_frame(res.records))
    assert back == res.records and all(r.prompt_hashes and r.cached_tokens is not None for r in back)
    assert (prompt_prefix_reuse(back) == prompt_prefix_reuse(res.records)).all()
    old = per_request_frame(res.records).drop(columns=["prompt_hashes", "prompt_chars", "reply_hash", "cached_tokens"])
    s = summarize(old, res.duration_s).as_dict()  # an archive from before fingerprints
    assert "prefix_reuse.expected" not in s and "prefix_reuse.achieved" not in s


def _record(i: int, hashes: tuple[int, ...], chars: tuple[int, ...], tokens: int, reply: int | None = None):
    return RequestRecord(
        index=i, is_warmup=False, stream=True, scheduled_ns=i, sent_ns=i, first_chunk_ns=i + 1, first_content_ns=i + 1,
        chunk_ns=(i + 1,), end_ns=i + 1, input_tokens=tokens, output_tokens=1, output_tokens_source="usage",
        finish_reason="length", http_status=200, error_kind=None, error_message=None, queue_wait_s=0.0,
        prompt_hashes=hashes, prompt_chars=chars, reply_hash=reply,
    )  # fmt: skip


def test_prompt_prefix_reuse_counts_whole_pieces_in_send_order():
    recs = [
        _record(0, (1, 2), (100, 200), 40, reply=3),  # system prompt + question
        _record(1, (1, 5), (100, 300), 60),  # same system prompt: its 100 of 300 chars
        _record(2, (1, 2, 3, 4), (100, 200, 300, 400), 80),  # the next turn: everything up to its new question
        _record(3, (9,), (50,), 10),
    ]
    assert list(prompt_prefix_reuse(recs)) == [0.0, 20.0, 60.0, 0.0]
    # Order is by sending, not by index: the longer prompt sent first reuses nothing, and covers the shorter one.
    swapped = [replace(recs[0], sent_ns=5), replace(recs[2], sent_ns=0)]
    assert list(prompt_prefix_reuse(swapped)) == [40.0, 0.0]


def _playbook(tmp_path: Path, **workload: Any) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["workload"] = {k: v for k, v in doc["workload"].items() if k not in ("prefix_tokens", "prefix_groups", "turns")}
    doc["workload"].update(workload)
    doc["steps"] = [{"name": "cache", "set": {"prefix_caching": False}}]
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_plan_names_a_prefix_caching_step_on_a_workload_without_reuse(tmp_path):
    out = CliRunner().invoke(cli, ["plan", str(_playbook(tmp_path))], catch_exceptions=False).output
    assert "note: a prefix-caching step on a workload with no prefix reuse" in out
    out = CliRunner().invoke(cli, ["plan", str(_playbook(tmp_path, turns=3, think_time="2s"))]).output
    assert "prefix reuse" not in out and "3 turns, think time 2s" in out
    out = CliRunner().invoke(cli, ["plan", str(_playbook(tmp_path, prefix_tokens=64))]).output
    assert "prefix reuse" not in out


def test_think_time_and_session_header_in_the_playbook(tmp_path):
    from llmplay.playbook.load import load_playbook

    pb = load_playbook(_playbook(tmp_path, turns=2, think_time={"lognormal": {"mean": "1.5s", "sigma": 0.5}}))
    assert pb.workload.think_time == ThinkTime("lognormal", mean_s=1.5, sigma=0.5)
    pb = load_playbook(_playbook(tmp_path, turns=2, think_time={"uniform": {"min": "500ms", "max": 2}}))
    assert pb.workload.think_time == ThinkTime("uniform", min_s=0.5, max_s=2.0)
    pb = load_playbook(_playbook(tmp_path, turns=2, session_header="x-session-id"))
    assert pb.workload.session_header == "x-session-id" and pb.workload.think_time == ThinkTime()
    result = CliRunner().invoke(
        cli, ["validate", str(_playbook(tmp_path, think_time={"uniform": {"min": 3, "max": 1}}))]
    )
    assert (
        result.exit_code == 2
        and "workload.think_time.uniform.min" in result.output
        and "Traceback" not in result.output
    )


# ---------------------------------------------------------------------------------------------- the real engine
class RecordingTransport(httpx.AsyncBaseTransport):
    """The load generator's own transport, keeping every request body and the response bytes as they arrived."""

    def __init__(self, inner: StreamingTransport):
        self.inner = inner
        self.exchanges: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        entry: dict[str, Any] = {"body": json.loads(request.content), "response": b""}
        self.exchanges.append(entry)
        response = await self.inner.handle_async_request(request)
        inner_stream = response.stream

        class Tee(httpx.AsyncByteStream):
            async def __aiter__(self):
                async for data in inner_stream:  # type: ignore[union-attr]
                    entry["response"] += bytes(data)
                    yield data

            async def aclose(self) -> None:
                await inner_stream.aclose()  # type: ignore[union-attr]

        return httpx.Response(
            response.status_code, headers=response.headers, stream=Tee(), extensions=response.extensions
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def _streamed_content(raw: bytes) -> str:
    decoder = SSEDecoder()
    return "".join(parse_event(payload).content for payload in decoder.feed(raw))


@pytest.mark.parametrize("stream", [1.0, 0.0], ids=["streamed", "non-streamed"])
def test_llama_server_second_turn_carries_the_first_reply_exactly(llama_endpoint, stream):
    wl = replace(
        CHAT, turns=2, num_requests=2, concurrency=1, prefix_tokens=16, streaming_fraction=stream,
        output=LengthDist("fixed", value=6), ignore_eos=True, request_timeout_s=60.0, seed=int(stream) + 11,
    )  # fmt: skip
    tokenizer = make_tokenizer("auto", endpoint_url := llama_endpoint.base_url)
    requests = tuple(iter_requests(wl, tokenizer, llama_endpoint.model))

    async def main() -> Any:
        recorder = RecordingTransport(StreamingTransport())
        async with make_client(wl, recorder) as client:  # type: ignore[arg-type]
            result = await run_load(client, endpoint_url, wl, requests, tokenizer=tokenizer)
        return result, recorder.exchanges

    result, exchanges = asyncio.run(main())
    assert len(exchanges) == 2 and all(r.ok for r in result.records), [r.error_message for r in result.records]
    first, second = exchanges
    reply = (
        _streamed_content(first["response"])
        if stream
        else json.loads(first["response"])["choices"][0]["message"]["content"]
    )
    assert reply  # the tiny model always says something with ignore_eos
    assert second["body"]["messages"][:2] == first["body"]["messages"]
    assert second["body"]["messages"][2] == {"role": "assistant", "content": reply}
    # llama.cpp says how much of the prompt it served from its cache: the second turn reuses all of the first's
    # (the first shares at most the chat template's opening with the other test's prompts on this engine).
    first_rec, second_rec = sorted(result.records, key=lambda r: r.index)
    assert first_rec.cached_tokens is not None and second_rec.cached_tokens is not None
    assert second_rec.cached_tokens >= 0.9 * first_rec.input_tokens > first_rec.cached_tokens
    s = summarize(result.records, result.duration_s).as_dict()
    assert s["prefix_reuse.expected"] > 0.3 and s["prefix_reuse.achieved"] > 0.3


def test_sharegpt_conversations_send_every_human_turn(srv, tmp_path):
    share = tmp_path / "share.json"
    share.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "system", "value": "sys"},
                        {"from": "human", "value": "first question"},
                        {"from": "gpt", "value": "one two three"},
                        {"from": "human", "value": "second question"},
                        {"from": "gpt", "value": "a b c d e"},
                        {"from": "human", "value": "third question"},
                    ]
                },
                {"conversations": [{"from": "human", "value": "only question"}, {"from": "gpt", "value": "x y"}]},
            ]
        )
    )
    wl = replace(CHAT, dataset=str(share), prefix_tokens=0, turns=5, num_requests=4, concurrency=1, seed=3)
    planned = build_requests(wl, TOK, "m")
    by_conv = {}
    for r in planned:
        by_conv.setdefault(r.conversation_id, []).append(r)
    long = next(turns for turns in by_conv.values() if len(turns) == 3)
    assert [r.user_text for r in long] == ["first question", "second question", "third question"]
    assert [r.max_tokens for r in long[:2]] == [3, 5] and [r.final_turn for r in long] == [False, False, True]
    assert all(len(turns) in (1, 3) for turns in by_conv.values())  # each conversation ends with its human turns
    # turns: 1 keeps the first human turn alone, as always.
    assert all(r.turn == 0 for r in build_requests(replace(wl, turns=1), TOK, "m"))
    res, log = run(srv, wl, tokens=2)
    assert len(res.records) == 4 and all(r.ok for r in res.records)
    sent = [e["messages"] for e in sorted(log, key=lambda e: e["recv_ns"]) if len(e["messages"]) > 1]
    assert sent and all(m[1] == {"role": "assistant", "content": _reply(2)} for m in sent)  # the server's reply
    assert sent[-1][-1] == {"role": "user", "content": "third question"}
