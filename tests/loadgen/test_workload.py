"""Workloads: seeded length distributions, datasets, shared prefixes, multi-turn history, tokenizers."""

import json

import numpy as np
import pytest

from llmplay.loadgen.tokenizer import LlamaCppTokenizer, WordRatioTokenizer, make_tokenizer
from llmplay.loadgen.workload import WorkloadError, build_requests, draw_length, iter_requests
from llmplay.spec import LengthDist, Workload
from llmplay_testing.instrument import InstrumentServer

# Timed against the instrument: a raised CPU priority (tests/conftest.py).
pytestmark = pytest.mark.timing

TOK = WordRatioTokenizer()


def test_seeded_workloads_are_identical_and_seed_matters():
    wl = Workload(
        concurrency=2,
        num_requests=30,
        input=LengthDist("uniform", min=5, max=50),
        output=LengthDist("lognormal", mean=40, std=0.5),
        streaming_fraction=0.5,
        seed=3,
    )
    a, b = build_requests(wl, TOK, "m"), build_requests(wl, TOK, "m")
    assert a == b
    c = build_requests(Workload(**{**wl.__dict__, "seed": 4}), TOK, "m")
    assert [r.prompt for r in a] != [r.prompt for r in c]
    assert {r.stream for r in a} == {True, False}


def test_lazy_duration_workload_matches_its_prefix():
    bounded = Workload(concurrency=1, num_requests=10, seed=9, input=LengthDist("fixed", value=8))
    endless = Workload(concurrency=1, duration_s=5, seed=9, input=LengthDist("fixed", value=8))
    with pytest.raises(WorkloadError, match="iter_requests"):
        build_requests(endless, TOK, "m")
    it = iter_requests(endless, TOK, "m")
    first = [next(it) for _ in range(10)]
    assert first == list(build_requests(bounded, TOK, "m"))


def test_length_distributions():
    rng = np.random.default_rng(0)
    n = 4000
    normal = [draw_length(LengthDist("normal", mean=100, std=30, min=80, max=130), rng) for _ in range(n)]
    assert min(normal) == 80 and max(normal) == 130
    logn = np.array([draw_length(LengthDist("lognormal", mean=200, std=0.6), rng) for _ in range(n)])
    assert abs(logn.mean() - 200) < 10  # `mean` is the mean of the lengths, not of their logs
    uni = [draw_length(LengthDist("uniform", min=3, max=5), rng) for _ in range(n)]
    assert set(uni) == {3, 4, 5}
    ch = [draw_length(LengthDist("choice", values=(10, 20), weights=(3, 1)), rng) for _ in range(n)]
    assert abs(ch.count(10) / n - 0.75) < 0.03
    assert draw_length(LengthDist("fixed", value=0), rng) == 1


def test_prefix_groups_share_prefix_text():
    wl = Workload(
        concurrency=1, num_requests=60, prefix_tokens=32, prefix_groups=3, input=LengthDist("fixed", value=10)
    )
    reqs = build_requests(wl, TOK, "m")
    by_group: dict[int, set[str]] = {}
    for r in reqs:
        by_group.setdefault(r.group_id, set()).add(" ".join(r.prompt.split("\n")[0].split()))
    assert set(by_group) == {0, 1, 2}
    assert all(len(p) == 1 for p in by_group.values())  # one prefix per group
    prefixes = [next(iter(p)) for p in by_group.values()]
    assert len(set(prefixes)) == 3 and all(len(p.split()) == 32 for p in prefixes)
    assert all(r.input_tokens == 42 and r.input_tokens_target == 42 for r in reqs)


def test_multi_turn_resends_history_chat():
    wl = Workload(
        api="chat",
        concurrency=1,
        num_requests=6,
        turns=3,
        prefix_tokens=4,
        input=LengthDist("fixed", value=5),
        output=LengthDist("fixed", value=7),
    )
    reqs = build_requests(wl, TOK, "m")
    assert [(r.conversation_id, r.turn) for r in reqs] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    t0, t1, t2 = reqs[:3]
    assert t0.messages[0][0] == "system" and len(t0.messages) == 2
    assert t1.messages[:2] == t0.messages and [m[0] for m in t1.messages] == ["system", "user", "assistant", "user"]
    assert t2.messages[:4] == t1.messages
    assert t2.input_tokens_target == 4 + (5 + 7) * 2 + 5
    body = t2.body(temperature=0.0, ignore_eos=True)
    assert body["messages"][0] == {"role": "system", "content": t0.messages[0][1]} and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_dataset_jsonl_and_sharegpt(tmp_path):
    plain = tmp_path / "p.jsonl"
    plain.write_text("\n".join(json.dumps({"prompt": f"question {i}", "output_tokens": 10 + i}) for i in range(4)))
    wl = Workload(concurrency=1, num_requests=8, dataset=str(plain))
    reqs = build_requests(wl, TOK, "m")
    assert sorted(r.prompt for r in reqs[:4]) == [f"question {i}" for i in range(4)]  # a seeded pass
    assert all(r.max_tokens == 10 + int(r.prompt.split()[1]) for r in reqs)
    share = tmp_path / "s.json"
    share.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "system", "value": "sys"},
                        {"from": "human", "value": "hi there"},
                        {"from": "gpt", "value": "one two three four"},
                    ]
                },
                {"conversations": [{"from": "gpt", "value": "no human turn"}]},
            ]
        )
    )
    reqs = build_requests(Workload(concurrency=1, num_requests=2, dataset=str(share)), TOK, "m")
    assert [(r.prompt, r.max_tokens, r.input_tokens) for r in reqs] == [("hi there", 4, 2)] * 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{broken\n')
    with pytest.raises(WorkloadError, match=r"bad.jsonl:2: invalid JSON"):
        build_requests(Workload(concurrency=1, num_requests=1, dataset=str(bad)), TOK, "m")


def test_llamacpp_tokenizer_makes_exact_lengths():
    # The instrument's /tokenize is word-level; the real llama.cpp server is covered in test_bench_llamacpp.
    with InstrumentServer() as srv:
        assert make_tokenizer("auto", srv.url).exact
        assert not make_tokenizer("auto", "http://127.0.0.1:9").exact  # nothing listening: word ratio
        tok = LlamaCppTokenizer(srv.url)
        for n in (1, 17, 300):
            text = tok.make_text(n, np.random.default_rng(n))
            assert tok.count(text) == n
        assert tok.make_text(17, 5) == tok.make_text(17, 5)
        tok.close()


def test_tokenizer_json_on_disk_gives_exact_prompt_lengths(tmp_path):
    """vLLM-style engines have no /tokenize: the model's own tokenizer.json builds exact prompts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from llmplay.loadgen.tokenizer import HfTokenizer, _random_words, make_tokenizer

    hf = Tokenizer(models.BPE(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [_random_words(50, np.random.default_rng(i)) for i in range(200)]
    hf.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = make_tokenizer("auto", None, model_dir=str(tmp_path))
    assert isinstance(tok, HfTokenizer) and tok.exact
    for n in (1, 17, 128):
        assert tok.count(tok.make_text(n, 7)) == n
    assert make_tokenizer("auto", None, model_dir=str(tmp_path / "nowhere")).exact is False
