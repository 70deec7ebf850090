"""Trace replay: Mooncake, Azure and BurstGPT traces read, windowed, scaled, synthesised and sent at their times;
every bad trace refused at validate with the trace's FILE:LINE and the playbook's YAML path."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.errors import PlaybookError
from llmplay.loadgen.runner import run_load_sync
from llmplay.loadgen.tokenizer import LlamaCppTokenizer, WordRatioTokenizer
from llmplay.loadgen.trace import BlockTexts, iter_trace_prompts
from llmplay.loadgen.workload import build_requests
from llmplay.playbook.load import load_playbook, load_workload
from llmplay.playbook.trace import read_window, scale_window
from llmplay.spec import LengthDist, TraceSpec, Workload
from llmplay_testing.instrument import InstrumentServer
from llmplay_testing.text_reuse import prefix_reuse, sent_prefix_reuse

# Timed against the instrument: a raised CPU priority (tests/conftest.py).
pytestmark = pytest.mark.timing

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake-synthetic.jsonl"
if not SHARED.exists():  # a worktree sits beside the main checkout; both see /work/shared
    SHARED = Path("/work/shared/traces/mooncake-synthetic.jsonl")
TOK = WordRatioTokenizer()


def playbook(tmp_path: Path, trace: dict[str, object], *, ctx: int = 4096, extra: str = "") -> Path:
    """A playbook replaying `trace` (its mapping under workload.trace); the trace file line sits on line 7."""
    body = json.dumps(trace)
    f = tmp_path / "pb.yaml"
    f.write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: pb}\n"
        f"engine: {{kind: llamacpp, model: m, args: {{ctx_size: {ctx}}}}}\n"
        f"workload:\n  seed: 3\n  trace: {body}\n{extra}"
    )
    return f


def mooncake_lines(rows: list[tuple[int, int, int, list[int]]]) -> str:
    return "".join(
        json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n" for t, i, o, h in rows
    )


def load_error(path: Path, **kwargs: bool) -> str:
    with pytest.raises(PlaybookError) as info:
        load_playbook(path, **kwargs)
    return str(info.value)


# ----------------------------------------------------------------------------------------- the shared trace
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="the shared Mooncake trace is not on this machine")


@needs_shared
def test_shared_mooncake_trace_parses_windows_scales_and_synthesises_deterministically(tmp_path):
    f = playbook(tmp_path, {"file": str(SHARED), "format": "mooncake", "input_scale": 1 / 64, "output_scale": 0.5})
    # The trace lives outside the playbook's tree: refused unless the user says so, as a dataset is.
    assert "pass --allow-outside-tree" in load_error(f)
    w = load_playbook(f, allow_outside_extends=True).workload
    facts = w.trace.facts
    assert (facts.requests, w.num_requests) == (3993, 3993)
    assert facts.span_s == pytest.approx(1022.025)
    assert w.rate == pytest.approx(3992 / 1022.025)  # time_scale 1: the trace's own mean rate
    assert 0.60 < facts.prefix_reuse < 0.68  # the README: 64% of its blocks repeat an earlier one
    assert facts.longest_input_tokens == round(191378 / 64)

    # A window: from 5 minutes in, 2 minutes of trace time, replayed at a target mean rate.
    windowed = playbook(
        tmp_path,
        {"file": str(SHARED), "format": "mooncake", "start": "5m", "duration": "2m", "input_scale": 1 / 64},
        extra="  rate: 40\n",
    )
    w2 = load_playbook(windowed, allow_outside_extends=True).workload
    rows = read_window(w2.trace)
    assert rows[0].arrival_s >= 300 and rows[-1].arrival_s < 420
    reqs = build_requests(w2, TOK, "m")
    assert len(reqs) == w2.trace.facts.requests == len(rows)
    assert reqs[0].arrival_s == 0.0
    gaps = np.diff([r.arrival_s for r in reqs])
    assert (gaps >= 0).all()
    assert (len(reqs) - 1) / reqs[-1].arrival_s == pytest.approx(40)
    # Lengths as scaled: the word-level tokenizer counts exactly what was asked for.
    assert [r.input_tokens for r in reqs] == [max(1, round(row.input_tokens / 64)) for row in rows]
    assert [r.max_tokens for r in reqs] == [row.output_tokens for row in rows]
    # Deterministic from the seed; another seed, other text with the same structure.
    assert build_requests(w2, TOK, "m") == reqs
    other = build_requests(replace(w2, seed=4), TOK, "m")
    assert [r.prompt for r in other] != [r.prompt for r in reqs]
    assert [r.input_tokens for r in other] == [r.input_tokens for r in reqs]
    # Requests agreeing on their first k hash ids share their first k scaled blocks, word for word.
    scaled = scale_window(rows, w2.trace)
    by_prompt = {r.index: r.prompt.split() for r in reqs}
    checked = 0
    for a in range(len(scaled)):
        for b in range(a + 1, min(a + 40, len(scaled))):
            ids_a, ids_b = [h for h, _ in scaled[a].blocks], [h for h, _ in scaled[b].blocks]
            k = next(
                (i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y), min(len(ids_a), len(ids_b))
            )
            shared = sum(n for _, n in scaled[a].blocks[:k])
            if k and all(scaled[a].blocks[i] == scaled[b].blocks[i] for i in range(k)):
                assert by_prompt[a][:shared] == by_prompt[b][:shared]
                checked += 1
            elif not k and min(len(by_prompt[a]), len(by_prompt[b])) >= 3:
                assert by_prompt[a][:3] != by_prompt[b][:3]
    assert checked > 0
    # The workload's own reuse, from the prompts sent, agrees with the one the hash ids give.
    assert sent_prefix_reuse(reqs) == pytest.approx(w2.trace.facts.prefix_reuse, abs=0.02)


@needs_shared
def test_plan_prints_the_scaled_traces_key_figures(tmp_path):
    f = playbook(
        tmp_path,
        {"file": str(SHARED), "format": "mooncake", "input_scale": 0.01, "max_input_tokens": 1000},
        extra="  rate: 50\n  num_requests: 500\n",
    )
    out = CliRunner().invoke(cli, ["plan", "--allow-outside-tree", str(f)])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("Workload:"))
    assert "500 requests over" in line and "replayed at 50 req/s" in line
    assert "input mean" in line and "max 1000 tokens" in line and "prefix reuse" in line


# ----------------------------------------------------------------------------------------- CSV formats, replayed
AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:46.8805900,396,109\n"
    "2023-11-16 18:15:46.8805900,879,21\n"  # two requests at one instant
    "2023-11-16 18:15:47.4805900,91,12\n"
    "2023-11-16 18:15:48.0805900,120,40\n"
    "2023-11-16 18:15:48.1805900,2048,8\n"
)
BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "5.3,GPT-4,1087,0,1087,Conversation log\n"  # a failed request: 0 response tokens, still sent (1 token)
    "6.1,ChatGPT,260,150,410,API log\n"
    "6.15,ChatGPT,35.0,60.0,95.0,API log\n"
    "7.0,GPT-4,700,20,720,API log\n"
)


def assert_sent_on_schedule(result) -> None:
    """What llmplay controls of an open loop's timing: no request sent before its scheduled time, and the lag it
    reports is its measured records' own."""
    lag_s = np.array([(r.sent_ns - r.scheduled_ns) / 1e9 for r in result.records])
    assert (lag_s >= 0).all(), lag_s
    measured = np.array([(r.sent_ns - r.scheduled_ns) / 1e9 for r in result.measured()])
    assert result.schedule_lag_p99_s == pytest.approx(float(np.percentile(measured, 99)))


@pytest.mark.parametrize(
    ("fmt", "text", "gaps_s"),
    [
        ("azure", AZURE, [0.2, 0.0, 0.6, 0.6, 0.1]),
        ("burstgpt", BURSTGPT, [0.3, 0.8, 0.05, 0.85]),
    ],
)
def test_csv_trace_replays_with_its_timestamps_against_a_real_server(tmp_path, fmt, text, gaps_s):
    (tmp_path / "t.csv").write_text(text)
    with InstrumentServer() as srv:
        url = srv.url_for(ttft_ms=5, itl_ms=1)
        f = playbook(
            tmp_path, {"file": "t.csv", "format": fmt, "input_scale": 0.1, "output_scale": 0.2, "time_scale": 0.5}
        )
        w = load_playbook(f).workload
        assert w.num_requests == len(gaps_s) + 1
        tok = LlamaCppTokenizer(srv.url)  # the server's own /tokenize sizes the prompts
        # One token a word in its vocabulary: blocks are plain words, no call to the server per block.
        assert isinstance(BlockTexts(tok, 0).tokenizer, WordRatioTokenizer)
        reqs = build_requests(w, tok, "m")
        assert [r.input_tokens for r in reqs] == [r.input_tokens_target for r in reqs]
        result = run_load_sync(url, w, iter(reqs), tokenizer=tok)
        tok.close()
    records = sorted(result.records, key=lambda r: r.index)
    assert result.mode == "open" and len(records) == len(reqs) and all(r.ok for r in records)
    sched = np.diff([r.scheduled_ns for r in records]) / 1e9
    assert sched == pytest.approx([g * 0.5 for g in gaps_s], abs=1e-6)  # the trace's gaps, time-scaled
    # No request leaves before its time, and the lag reported is the records' own. When requests really left is the
    # machine's scheduling as much as llmplay's: the lag on a loaded or a quiet machine is benchmarks/trace_replay.py's
    # measurement (RESULTS.md, "Trace replay").
    assert_sent_on_schedule(result)
    assert [r.max_tokens for r in reqs] == [
        max(1, round(0.2 * int(float(line.split(",")[-1 if fmt == "azure" else 3])))) for line in text.splitlines()[1:]
    ]


def test_csv_window_by_request_count_and_warmup(tmp_path):
    (tmp_path / "t.csv").write_text(BURSTGPT)
    f = playbook(
        tmp_path,
        {"file": "t.csv", "format": "burstgpt", "start": "1s"},
        extra="  warmup_requests: 1\n  num_requests: 2\n",
    )
    w = load_playbook(f).workload
    reqs = build_requests(w, TOK, "m")
    assert [r.is_warmup for r in reqs] == [True, False, False]
    assert [r.input_tokens for r in reqs] == [260, 35, 700]  # from 6.1 s: one second after the first request


def test_bench_workload_file_takes_a_trace(tmp_path):
    (tmp_path / "t.csv").write_text(BURSTGPT)
    wf = tmp_path / "wl.yaml"
    wf.write_text("trace: {file: t.csv, format: burstgpt}\nrate: 10\n")
    w, _ = load_workload(wf)
    assert w.trace is not None and w.rate == 10 and w.num_requests == 5


# ----------------------------------------------------------------------------------------- synthesis
def test_blocks_are_the_same_text_after_eviction_and_prompts_fit_an_exact_tokenizer(tmp_path):
    rows = [(0, 40, 4, [1, 2, 3]), (10, 36, 4, [1, 2, 9]), (20, 50, 4, [7, 2, 3, 4])]
    (tmp_path / "m.jsonl").write_text(mooncake_lines(rows))
    spec = TraceSpec(str(tmp_path / "m.jsonl"), "mooncake", block_tokens=16)
    w = Workload(trace=spec, rate=1.0, num_requests=3)
    roomy = [p.text for p in iter_trace_prompts(w, TOK)]
    tight = [p.text for p in iter_trace_prompts(w, TOK, BlockTexts(TOK, w.seed, max_cached_tokens=1))]
    assert roomy == tight
    a, b, c = (t.split() for t in roomy)
    assert a[:32] == b[:32] and a[32:] != b[32:]  # ids 1, 2 shared; 3 vs 9 differ
    assert a[:16] != c[:16]  # same id 2 in second place, but after another first block: no shared prefix
    assert prefix_reuse(roomy) == pytest.approx(32 / 126, abs=0.01)


def test_synthesised_prompts_fit_the_engines_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from llmplay.loadgen.tokenizer import HfTokenizer, _random_words

    hf = Tokenizer(models.BPE(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [_random_words(50, np.random.default_rng(i)) for i in range(200)]
    hf.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = HfTokenizer(tmp_path / "tokenizer.json")
    assert BlockTexts(tok, 0).tokenizer is tok  # its 300 tokens split words: blocks are made exact, one by one
    rows = [(i * 100, 1000 + 37 * i, 10, [i % 3, 100 + i]) for i in range(12)]
    (tmp_path / "m.jsonl").write_text(mooncake_lines(rows))
    f = playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake", "input_scale": 0.1})
    reqs = build_requests(load_playbook(f).workload, tok, "m")
    for r in reqs:
        assert abs(r.input_tokens - r.input_tokens_target) <= 2, (r.input_tokens, r.input_tokens_target)


# ----------------------------------------------------------------------------------------- bad input at validate
def _check_located(message: str, trace_line: int | None, yaml_path: str, fragment: str) -> None:
    line = next((x for x in message.splitlines() if fragment in x), None)
    assert line is not None, message
    assert re.match(rf"^\S*pb\.yaml:\d+: {re.escape(yaml_path)}: ", line), line
    if trace_line is not None:
        assert re.search(rf"\b[tm]\.(jsonl|csv):{trace_line}: ", line), line


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        ("", 1, "no requests in the file"),
        ("\n\n", 1, "no requests in the file"),
        (mooncake_lines([(0, 10, 5, [1])]) + "{not json\n", 2, "invalid JSON"),
        (mooncake_lines([(0, 10, 5, [1]), (100, 10, 5, [2]), (50, 10, 5, [3])]), 3, "expected rows in time order"),
        (mooncake_lines([(0, 10, 5, [1]), (100, -4, 5, [2])]), 2, '"input_length": found -4'),
        (mooncake_lines([(0, 10, 5, [1]), (100, 10, -1, [2])]), 2, '"output_length": found -1'),
        ('{"timestamp": 0, "input_length": 3}\n', 1, "no 'output_length'"),
        ('{"timestamp": "soon", "input_length": 3, "output_length": 1}\n', 1, '"timestamp": found'),
        ("[1, 2]\n", 1, "found list; expected an object"),
        (
            mooncake_lines([(0, 10, 5, [1])])
            + '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": "x"}\n',
            2,
            '"hash_ids"',
        ),
    ],
)
def test_bad_mooncake_trace_fails_validate_with_file_line(tmp_path, content, line, fragment):
    (tmp_path / "m.jsonl").write_text(content)
    f = playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake"})
    message = load_error(f)
    _check_located(message, line, "workload.trace.file", fragment)
    result = CliRunner().invoke(cli, ["validate", str(f)])
    assert result.exit_code == 2 and fragment in result.output


@pytest.mark.parametrize(
    ("fmt", "content", "line", "fragment"),
    [
        ("azure", "TIMESTAMP,Context,GeneratedTokens\n", 1, "no column 'ContextTokens'"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", 2, "TIMESTAMP: found"),
        ("azure", AZURE + "2023-11-16 18:15:47.0,12,x\n", 8, "GeneratedTokens: found 'x'"),
        ("azure", AZURE + "2023-11-16 18:15:47.0,12,1\n", 8, "expected rows in time order"),
        ("burstgpt", BURSTGPT.replace("260,150", "-260,150"), 4, "Request tokens: found -260"),
        ("burstgpt", BURSTGPT.replace("260,150", "26.5,150"), 4, "expected a whole number"),
        ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n5,x,1\n", 2, "3 columns"),
        ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n", 1, "no requests in the file"),
    ],
)
def test_bad_csv_trace_fails_validate_with_file_line(tmp_path, fmt, content, line, fragment):
    (tmp_path / "t.csv").write_text(content)
    message = load_error(playbook(tmp_path, {"file": "t.csv", "format": fmt}))
    _check_located(message, line, "workload.trace.file", fragment)


def test_missing_trace_and_one_outside_the_tree(tmp_path):
    message = load_error(playbook(tmp_path, {"file": "gone.csv", "format": "azure"}))
    _check_located(message, None, "workload.trace.file", "trace 'gone.csv' not found")
    assert "expected an Azure LLM inference trace CSV" in message
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    outside.write_text(mooncake_lines([(0, 10, 5, [1]), (10, 10, 5, [1])]))
    try:
        _check_located(
            load_error(playbook(tmp_path, {"file": str(outside), "format": "mooncake"})),
            None,
            "workload.trace.file",
            "points outside",
        )
    finally:
        outside.unlink()


def test_trace_that_cannot_fit_the_context_after_scaling(tmp_path):
    rows = [(0, 100, 10, [1]), (100, 3000, 500, [2, 3, 4, 5, 6, 7]), (200, 50, 10, [8])]
    (tmp_path / "m.jsonl").write_text(mooncake_lines(rows))
    message = load_error(playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake", "input_scale": 0.5}, ctx=1024))
    _check_located(message, 2, "workload.trace", "a request holds 2000 tokens after scaling")
    assert "lower trace.input_scale" in message
    # Capped, it fits.
    fits = playbook(
        tmp_path, {"file": "m.jsonl", "format": "mooncake", "input_scale": 0.5, "max_input_tokens": 500}, ctx=1024
    )
    assert load_playbook(fits).workload.trace.facts.longest_tokens == 1000


def test_window_problems_and_keys_a_trace_owns(tmp_path):
    (tmp_path / "m.jsonl").write_text(mooncake_lines([(0, 10, 5, [1]), (1000, 10, 5, [2]), (2000, 10, 5, [3])]))
    message = load_error(playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake", "start": "1h"}))
    _check_located(message, 3, "workload.trace.file", "no request in the window")
    message = load_error(playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake"}, extra="  num_requests: 5\n"))
    _check_located(message, None, "workload.num_requests", "holds 3 requests")
    message = load_error(
        playbook(
            tmp_path,
            {"file": "m.jsonl", "format": "mooncake", "time_scale": 2},
            extra="  rate: 3\n  concurrency: 2\n  input: 100\n",
        )
    )
    _check_located(message, None, "workload.concurrency", "a trace is replayed open loop")
    _check_located(message, None, "workload.input", "the trace gives each request's input length")
    _check_located(message, None, "workload.trace.time_scale", "both workload.rate and trace.time_scale")
    message = load_error(playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake", "duration": "1s"}))
    _check_located(message, None, "workload.trace", "arriving at one instant")


def test_reading_stops_at_the_end_of_the_window(tmp_path):
    """Only the window is read: what lies past it (here, garbage) is never parsed, so a huge trace costs its window."""
    good = mooncake_lines([(i * 10, 20, 4, [i]) for i in range(50)])
    (tmp_path / "m.jsonl").write_text(good + "{garbage\n" * 1000)
    f = playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake", "duration": "0.2s"})
    assert load_playbook(f).workload.num_requests == 20
    f = playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake"}, extra="  num_requests: 30\n")
    assert load_playbook(f).workload.num_requests == 30
    assert "m.jsonl:51: invalid JSON" in load_error(playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake"}))


def test_a_rate_step_rescales_the_replay_and_chat_sends_one_user_message(tmp_path):
    import gc

    from llmplay.loadgen.trace import prefetch_requests
    from llmplay.plan import build_plan

    (tmp_path / "t.csv").write_text(BURSTGPT)
    f = playbook(
        tmp_path,
        {"file": "t.csv", "format": "burstgpt", "input_scale": 0.05},
        extra="  api: chat\nsteps:\n  - {name: faster, set: {workload.rate: 8}}\n",
    )
    pb = load_playbook(f)
    assert pb.workload.rate == pytest.approx(4 / 2.0)  # the trace's own mean rate: 4 gaps over 2 s
    faster = build_plan(pb).steps[0].cumulative.workload
    reqs = build_requests(faster, TOK, "m")
    assert reqs[-1].arrival_s == pytest.approx(0.5)  # 4 gaps at 8 req/s
    assert all(r.prompt is None and r.messages is not None and len(r.messages) == 1 for r in reqs)
    assert prefetch_requests(faster) == 5  # a small window is made before the clock starts
    with InstrumentServer() as srv:
        result = run_load_sync(srv.url_for(ttft_ms=1, itl_ms=1), faster, iter(reqs))
        # A capacity search over users sends the trace closed loop, in its order.
        users = replace(faster, concurrency=2, rate=None)
        closed = run_load_sync(srv.url_for(ttft_ms=1, itl_ms=1), users, iter(build_requests(users, TOK, "m")))
    assert all(r.ok for r in result.records) and gc.get_freeze_count() == 0  # the run leaves the collector as found
    assert closed.mode == "closed" and len(closed.records) == 5 and all(r.ok for r in closed.records)


def test_prefix_reuse_of_sent_prompts_for_any_workload():
    grouped = build_requests(
        Workload(concurrency=1, num_requests=20, prefix_tokens=50, input=LengthDist("fixed", value=50)), TOK, "m"
    )
    share = sent_prefix_reuse(grouped)
    assert share == pytest.approx(19 * 50 / (20 * 100), abs=0.02)  # every prefix but the first repeats
    assert sent_prefix_reuse(grouped, sent=[0]) == 0.0
    # Whole words only: "a b" of the second, "a" of the third (its "bc" is not the word "b").
    assert prefix_reuse(["a b c", "a b d", "a bc"]) == pytest.approx((3 + 1) / 14)


@pytest.mark.docker
def test_mooncake_trace_replays_against_llama_cpp(tmp_path, llama_endpoint):
    """The real engine: prompts sized by its own tokenizer arrive at about the trace's lengths, sent on time."""
    url = str(llama_endpoint.base_url).rstrip("/")
    rows = [(i * 150, 900 + 211 * (i % 4), 40, [0, 1, 100 + i] if i % 2 else [0, 2, 3, 200 + i]) for i in range(10)]
    (tmp_path / "m.jsonl").write_text(mooncake_lines(rows))
    f = playbook(
        tmp_path,
        {"file": "m.jsonl", "format": "mooncake", "input_scale": 0.1, "output_scale": 0.1},
        ctx=1024,
        extra="  rate: 4\n  warmup_requests: 1\n  request_timeout: 60s\n",
    )
    w = load_playbook(f).workload
    tok = LlamaCppTokenizer(url)
    try:
        reqs = build_requests(w, tok, llama_endpoint.model)
        result = run_load_sync(url, w, iter(reqs), tokenizer=tok)
    finally:
        tok.close()
    measured = [r for r in result.records if not r.is_warmup]
    assert len(measured) == 9 and all(r.ok for r in measured), [r.error_message for r in measured]
    targets = {r.index: r.input_tokens_target for r in reqs}
    # usage.prompt_tokens: the planned length, plus the BOS the server adds and a merge at a block edge or two.
    assert all(targets[r.index] <= r.input_tokens <= targets[r.index] + 3 for r in measured)
    assert all(r.output_tokens == 4 for r in measured)
    assert_sent_on_schedule(result)  # how soon after its time, beside a real engine on 2 cores, is noise


def test_a_trace_of_garbage_is_told_in_a_few_lines_without_reading_it_all(tmp_path):
    (tmp_path / "m.jsonl").write_text("{garbage\n" * 100_000)
    lines = load_error(playbook(tmp_path, {"file": "m.jsonl", "format": "mooncake"})).splitlines()
    assert len(lines) == 10 and lines[-1].endswith("expected one JSON object per line")
    (tmp_path / "t.csv").write_text("Timestamp,Request tokens,Response tokens\n" + "x,1,1\n" * 100_000)
    lines = load_error(playbook(tmp_path, {"file": "t.csv", "format": "burstgpt"})).splitlines()
    assert len(lines) == 10 and "t.csv:11: Timestamp: found 'x'" in lines[-1]


def test_llmplay_bench_replays_a_trace_workload_file(tmp_path):
    (tmp_path / "t.csv").write_text(AZURE)
    wf = tmp_path / "wl.yaml"
    wf.write_text("trace: {file: t.csv, format: azure, input_scale: 0.1, max_output_tokens: 4}\nrate: 20\n")
    out = tmp_path / "bench.json"
    with InstrumentServer() as srv:
        result = CliRunner().invoke(
            cli, ["bench", "--url", srv.url_for(ttft_ms=2, itl_ms=1), "--workload", str(wf), "--json", str(out)]
        )
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert summary["mode"] == "open" and summary["schedule_lag_p99_s"] is not None
    assert summary["metrics"]["requests.completed"] == 6 and summary["metrics"]["errors.count"] == 0


@needs_shared
@pytest.mark.docker
def test_a_tuning_run_replays_the_shared_trace_on_llama_cpp(tmp_path, cpu_engine, docker_client):
    """The whole path: a playbook replaying a window of the shared trace, one real trial each side of a step."""
    import yaml

    from llmplay.report import publish_report
    from llmplay.tuning.run import RunOptions, run_playbook

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["metadata"]["name"] = "trace-e2e"
    doc["goals"] = {"objective": {"minimize": "ttft.p95"}}
    doc["workload"] = {
        "trace": {
            "file": str(SHARED),
            "format": "mooncake",
            "start": "2m",
            "input_scale": 1 / 64,
            "max_output_tokens": 8,
        },
        "rate": 4,
        "warmup_requests": 2,
        "num_requests": 16,
        "seed": 5,
        "request_timeout": "60s",
    }
    doc["trials"] = {"repeats": 1, "interleave": True}
    doc["engine"]["health"]["timeout"] = "2m"  # generous: a start beside another engine test is slower
    doc["steps"] = [{"name": "faster", "set": {"workload.rate": 6}}]
    path = tmp_path / "trace-e2e.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    playbook = load_playbook(path, allow_outside_extends=True)
    lines: list[str] = []
    outcome = run_playbook(
        playbook, RunOptions(archive_root=tmp_path / "reports"), publish=publish_report, report=lines.append
    )
    assert outcome.status == "complete", lines
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    trials = manifest["trials"]
    assert len(trials) == 2 and all(t["status"] == "ok" for t in trials), trials
    assert all(t["summary"]["errors.rate"] == 0 and t["summary"]["requests.completed"] == 16 for t in trials)
    assert all(c["workload"]["trace"]["facts"]["requests"] == 18 for c in manifest["configs"])


def test_a_trace_requests_fingerprint_counts_its_shared_blocks(tmp_path):
    """The per-trial `prefix_reuse.expected` comes from each sent prompt's fingerprint: for a trace, block by block,
    so it agrees with the reuse the hash ids give (a whole-prompt fingerprint saw only identical prompts)."""
    from llmplay.loadgen.records import RequestRecord
    from llmplay.loadgen.send import _fingerprint
    from llmplay.metrics import prefix_reuse_figures

    windowed = playbook(
        tmp_path, {"file": str(SHARED), "format": "mooncake", "start": "5m", "duration": "1m", "input_scale": 1 / 64}
    )
    workload = load_playbook(windowed, allow_outside_extends=True).workload
    for api in ("completions", "chat"):
        reqs = build_requests(replace(workload, api=api), TOK, "m")
        records = []
        for r in reqs:
            text = r.prompt if r.prompt is not None else r.messages[0][1]
            fp = _fingerprint(r, [], "")
            records.append(
                RequestRecord(
                    index=r.index, is_warmup=False, stream=True, scheduled_ns=r.index, sent_ns=r.index,
                    first_chunk_ns=r.index + 1, first_content_ns=r.index + 1, chunk_ns=(r.index + 1,),
                    end_ns=r.index + 1, input_tokens=len(text.split()), output_tokens=1,
                    output_tokens_source="usage", finish_reason="length", http_status=200, error_kind=None,
                    error_message=None, queue_wait_s=0.0, **fp,
                )
            )  # fmt: skip
        expected = prefix_reuse_figures(records)["prefix_reuse.expected"]
        assert expected == pytest.approx(workload.trace.facts.prefix_reuse, abs=0.01), api
