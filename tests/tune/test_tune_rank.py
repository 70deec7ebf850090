"""The tuner's ranking, on records alone: findings from the real checklist rules, the real engine knob maps."""

from __future__ import annotations

from dataclasses import replace

from llmplay.archive.model import Finding
from llmplay.diagnose.rule import RunFacts, SchedulerFacts
from llmplay.diagnose.rules import memory, scheduler
from llmplay.engines import get_engine
from llmplay.engines.knobs import Remedy
from llmplay.outcomes import GateResult
from llmplay.spec import Objective
from llmplay.tune.documents import step_document
from llmplay.tune.rank import RankInput, Tried, TunePolicy, binding_metric, next_step, rank

REUSED = {"prefix_reuse.expected": 0.4, "prefix_reuse.achieved": 0.39}
QUEUED = {"engine.waiting_nonzero_frac": 0.9, "engine.waiting_mean": 2.5}
TTFT = Objective("minimize", "ttft.p95", 0.1)


def one_slot_findings(summary: dict[str, float] = REUSED) -> list[Finding]:
    """What the diagnosis says of llama.cpp serving four users from one slot."""
    facts = RunFacts(summary=summary, telemetry=QUEUED, scheduler=SchedulerFacts(max_batch=1, concurrency=4))
    return [f for rule in scheduler.RULES if (f := rule.check(facts)) is not None]


def one_slot(**kw: object) -> RankInput:
    base = RankInput(one_slot_findings(), {"parallel": 1}, REUSED, (), TTFT, concurrency=4)
    return replace(base, **kw)  # type: ignore[arg-type]


def by_remedy(ranked: tuple) -> dict[Remedy, object]:
    return {r.remedy: r for r in ranked}


def test_one_slot_for_four_users_searches_the_slot_count_first() -> None:
    ranked = rank(one_slot(), get_engine("llamacpp"))
    first = next_step(ranked)
    assert first is not None and first.remedy is Remedy.MAX_BATCH
    assert first.knob == "parallel" and first.values == (2, 4)  # up to the load's four users, no further
    assert first.findings == ("sched.concurrency_over_batch", "queue.persistent")
    assert first.reason.startswith("#1 of 1: parallel → 2, 4 (value search); bears on ttft.p95 (objective")


def test_prefix_caching_is_skipped_with_the_measured_reuse_when_reuse_is_achieved() -> None:
    prefix = by_remedy(rank(one_slot(), get_engine("llamacpp")))[Remedy.PREFIX_CACHING]
    assert prefix.skipped
    assert prefix.reason == (
        "prefix reuse already achieved: 39.0% of prompt tokens served from cache where the workload repeats 40.0%"
    )


def test_missed_reuse_ranks_the_next_prefix_knob() -> None:
    missed = {"prefix_reuse.expected": 0.4, "prefix_reuse.achieved": 0.05}
    ranked = by_remedy(rank(one_slot(summary=missed, findings=one_slot_findings(missed)), get_engine("llamacpp")))
    prefix = ranked[Remedy.PREFIX_CACHING]
    assert not prefix.skipped and prefix.knob == "cache_reuse" and prefix.values == (64, 256)
    # Both answer the persistent queue (warn), which names the slots first: three of four users wait for a slot,
    # and a cached prompt only shortens each one's turn. §7 (prefix caching the cheaper) does not override it.
    assert (ranked[Remedy.MAX_BATCH].rank, prefix.rank) == (1, 2)
    assert "(warn; 2nd of queue.persistent's remedies)" in prefix.reason


def test_risky_remedies_wait_for_the_policy_that_allows_them() -> None:
    ranked = by_remedy(rank(one_slot(), get_engine("llamacpp")))
    assert "tried only with a quality guard" in ranked[Remedy.WEIGHT_QUANTIZATION].reason
    assert "needs more hardware" in ranked[Remedy.SCALE_OUT].reason
    allowed = by_remedy(
        rank(one_slot(), get_engine("llamacpp"), policy=TunePolicy(allow=frozenset({"scale_out", "parallel"})))
    )
    assert allowed[Remedy.SCALE_OUT].rank == 2 and allowed[Remedy.SCALE_OUT].values == (2, 4, 8)
    # A GGUF's quantization is a file, which the playbook has to name.
    guarded = by_remedy(rank(one_slot(), get_engine("llamacpp"), policy=TunePolicy(quality_guarded=True)))
    assert "name some in tune.values.model" in guarded[Remedy.WEIGHT_QUANTIZATION].reason


def test_what_was_tried_is_not_tried_again_and_twice_rejected_history_says_so() -> None:
    engine = get_engine("llamacpp")
    unsettled = [Tried(Remedy.MAX_BATCH, "parallel", "inconclusive", "round 1")]
    assert by_remedy(rank(one_slot(), engine, tried=unsettled))[Remedy.MAX_BATCH].rank == 1  # once more
    twice = by_remedy(rank(one_slot(), engine, tried=unsettled * 2))[Remedy.MAX_BATCH]
    assert twice.skipped and "parallel tried already (round 1: inconclusive)" in twice.reason
    once = [Tried(Remedy.MAX_BATCH, "parallel", "rejected", "round 1")]
    rejected = by_remedy(rank(one_slot(), engine, tried=once))[Remedy.MAX_BATCH]
    assert rejected.skipped and "parallel tried already (round 1: rejected)" in rejected.reason
    # Kept at 2 while users still queue: the next round goes on upwards from the kept value.
    kept = [Tried(Remedy.MAX_BATCH, "parallel", "kept", "round 1")]
    onward = by_remedy(rank(one_slot(args={"parallel": 2}), engine, tried=kept))[Remedy.MAX_BATCH]
    assert onward.rank == 1 and onward.values == (4,)
    history = [Tried(Remedy.MAX_BATCH, "parallel", "rejected", f"run r{i}", this_session=False) for i in (1, 2)]
    twice = by_remedy(rank(one_slot(), engine, tried=history))[Remedy.MAX_BATCH]
    assert twice.skipped and "rejected 2 times before on this engine and image (run r1, run r2)" in twice.reason
    again = rank(one_slot(), engine, tried=history, policy=TunePolicy(retry_rejected=True))
    assert next_step(again) is not None


def test_denied_or_not_allowed_knobs_are_skipped_by_name() -> None:
    engine = get_engine("llamacpp")
    denied = by_remedy(rank(one_slot(), engine, policy=TunePolicy(deny=frozenset({"parallel"}))))
    assert denied[Remedy.MAX_BATCH].skipped and "denied by tune.deny (parallel)" in denied[Remedy.MAX_BATCH].reason
    only = by_remedy(rank(one_slot(), engine, policy=TunePolicy(allow=frozenset({"prefix_caching"}))))
    assert "not in tune.allow" in only[Remedy.MAX_BATCH].reason


def test_the_slot_count_already_past_the_users_leaves_nothing_to_raise() -> None:
    ranked = by_remedy(rank(one_slot(args={"max_num_seqs": 16}), get_engine("llamacpp")))
    assert (
        ranked[Remedy.MAX_BATCH].skipped
        and "parallel is 16, past every value to try" in ranked[Remedy.MAX_BATCH].reason
    )


def test_the_binding_gate_ranks_its_remedies_first() -> None:
    preempted = memory.PREEMPTIONS.check(RunFacts(telemetry={"engine.preemptions": 5.0}))
    static = scheduler.NO_CONTINUOUS_BATCHING.check(RunFacts(scheduler=SchedulerFacts(continuous_batching=False)))
    assert preempted is not None and static is not None
    failing = GateResult("errors.rate < 1%", "errors.rate", "<", 0.01, 0.05, False, -4.0)
    met = GateResult("ttft.p95 < 2s", "ttft.p95", "<", 2.0, 1.0, True, 0.5)
    assert binding_metric([met, failing], TTFT) == ("errors.rate", "gate errors.rate < 1% fails")
    ranked = rank(
        RankInput([preempted, static, *one_slot_findings()], {"max_num_seqs": 256}, {}, [met, failing], TTFT, 4),
        get_engine("vllm"),
    )
    first = next_step(ranked)
    # Preemptions are critical and the failed error gate binds: more memory for the KV cache first (it costs the load
    # nothing), then a cap on the sequences.
    assert first is not None and first.remedy is Remedy.KV_MEMORY and first.values == (0.92, 0.95)
    assert by_remedy(ranked)[Remedy.CONCURRENCY_CAP].rank == 2
    assert by_remedy(ranked)[Remedy.CONTINUOUS_BATCHING].reason == "continuous_batching is always on in vllm"


def test_vllm_serving_one_sequence_with_caching_off_raises_the_sequence_cap_first_then_caches() -> None:
    """vllm-cpu-tune.yaml's baseline: four users queue for one sequence, a long shared prompt never hits a cache."""
    summary = {"prefix_reuse.expected": 0.9, "prefix_reuse.achieved": 0.0}
    facts = RunFacts(
        summary=summary,
        telemetry=QUEUED,
        scheduler=SchedulerFacts(max_batch=1, concurrency=4, prefix_caching=False),
    )
    findings = [f for rule in scheduler.RULES if (f := rule.check(facts)) is not None]
    assert {f.id for f in findings} == {"sched.concurrency_over_batch", "sched.prefix_cache_off", "queue.persistent"}
    args = {"max_num_seqs": 1, "prefix_caching": False}
    ranked = rank(RankInput(findings, args, summary, (), TTFT, concurrency=4), get_engine("vllm"))
    first, second = ranked[0], ranked[1]
    assert (first.knob, first.values, second.knob, second.values) == ("max_num_seqs", (64,), "prefix_caching", (True,))
    assert first.reason.startswith("#1 of 2: max_num_seqs → 64; bears on ttft.p95")
    assert "called for by sched.concurrency_over_batch, queue.persistent (warn); §7 order 3" in first.reason
    assert "called for by sched.prefix_cache_off, queue.persistent (warn; 2nd of queue.persistent's remedies)" in (
        second.reason
    )
    # Kept: nobody queues any more, and prefix caching (no reuse achieved) is next, alone.
    off = [f for f in findings if f.id == "sched.prefix_cache_off"]
    kept = [Tried(Remedy.MAX_BATCH, "max_num_seqs", "kept", "round 1")]
    then = next_step(rank(RankInput(off, {**args, "max_num_seqs": 64}, summary, (), TTFT, 4), get_engine("vllm"), kept))
    assert then is not None and then.knob == "prefix_caching" and then.reason.startswith("#1 of 1: prefix_caching")


def test_vllm_with_prefix_caching_off_on_a_shared_prefix_turns_it_on() -> None:
    facts = RunFacts(summary={"prefix_reuse.expected": 0.5}, scheduler=SchedulerFacts(prefix_caching=False))
    off = scheduler.PREFIX_CACHE_OFF.check(facts)
    assert off is not None
    first = next_step(rank(RankInput([off], {"prefix_caching": False}, {}, (), TTFT), get_engine("vllm")))
    assert first is not None and first.knob == "prefix_caching" and first.values == (True,)


def test_a_quantized_gguf_named_in_tune_values_is_a_model_step_under_a_quality_guard() -> None:
    policy = TunePolicy(quality_guarded=True, values={"model": ("/models/tiny-q8_0.gguf", "/models/tiny-q4_0.gguf")})
    quant = by_remedy(rank(one_slot(), get_engine("llamacpp"), policy=policy))[Remedy.WEIGHT_QUANTIZATION]
    assert not quant.skipped and quant.knob == "model"
    step = step_document(quant, "q")
    assert step["set"] == {"model": "/models/tiny-q8_0.gguf"}  # a choice: one fixed change, the first file
