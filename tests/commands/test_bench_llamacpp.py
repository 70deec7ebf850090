"""`llmplay bench` against a real llama.cpp server (the engines' `llama_endpoint` fixture)."""

from dataclasses import replace

import pytest

from llmplay.bench.sweep import discover_model, run_bench
from llmplay.commands.bench import format_summary_table
from llmplay.loadgen.tokenizer import LlamaCppTokenizer
from llmplay.spec import LengthDist, Workload

pytestmark = pytest.mark.docker

WORKLOAD = Workload(
    concurrency=2,
    num_requests=6,
    warmup_requests=1,
    input=LengthDist("fixed", value=16),
    output=LengthDist("fixed", value=8),
    ignore_eos=True,
    temperature=0.0,
    seed=1,
    request_timeout_s=60.0,
)


@pytest.fixture(scope="module")
def llama_url(llama_endpoint) -> str:
    return str(llama_endpoint.base_url).rstrip("/")


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_short_bench_gives_sane_numbers(llama_url, tmp_path, api):
    out = tmp_path / "bench.json"
    result = run_bench(llama_url, replace(WORKLOAD, api=api, streaming_fraction=0.5), json_path=out, progress=False)
    s = result.summary
    assert result.model == discover_model(llama_url)
    assert s["errors.count"] == 0 and s["requests.completed"] == 6
    assert s["ttft.p50"] is not None and s["ttft.p50"] > 0
    measured = result.load.measured()
    # p50s of TTFT (streamed only) and E2EL (all) describe different requests; per request, the last
    # token comes no earlier than the first (the same when all eight arrive in one read, as on a busy machine).
    assert all(r.end_ns >= r.first_chunk_ns > r.sent_ns for r in measured if r.stream)
    # ignore_eos: every request generates exactly max_tokens, counted by the server's usage.
    assert all(r.output_tokens == 8 and r.output_tokens_source == "usage" for r in measured)
    assert s["throughput.output_tok_s"] > 0
    assert result.tokenizer.startswith("llama.cpp")  # prompts sized by the model's own tokenizer
    if api == "completions":
        # usage.prompt_tokens counts the BOS token the server adds.
        assert all(16 <= r.input_tokens <= 17 for r in measured)
    assert out.read_text().startswith("{")
    assert format_summary_table(s).row_count > 5


def test_tokenizer_makes_exact_prompts(llama_url):
    tok = LlamaCppTokenizer(llama_url)
    try:
        for n in (1, 7, 64):
            assert tok.count(tok.make_text(n, n)) == n
    finally:
        tok.close()
