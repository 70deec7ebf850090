"""A finding carries typed candidate steps beside its sentence, and they survive the archive's round trip."""

from __future__ import annotations

from llmplay.archive.convert import finding_from
from llmplay.archive.model import Candidate, to_plain
from llmplay.diagnose.rule import RunFacts, SchedulerFacts
from llmplay.diagnose.rules import memory, scheduler
from llmplay.engines.knobs import Direction, Remedy


def test_a_finding_names_its_remedies_cheapest_first_with_its_id_and_evidence() -> None:
    found = scheduler.CONCURRENCY_OVER_BATCH.check(RunFacts(scheduler=SchedulerFacts(max_batch=1, concurrency=4)))
    assert found is not None
    evidence = "concurrency 4 > max batch 1: 3 requests wait in the engine queue"
    assert found.candidates == (
        Candidate(Remedy.MAX_BATCH, Direction.RAISE, "sched.concurrency_over_batch", evidence),
        Candidate(Remedy.SCALE_OUT, Direction.RAISE, "sched.concurrency_over_batch", evidence),
    )
    assert found.suggestion.startswith("raise max batch")


def test_a_step_no_engine_knob_makes_gives_the_sentence_only() -> None:
    facts = RunFacts(telemetry={"engine.preemptions": 3.0})
    found = memory.PREEMPTIONS.check(facts)
    assert found is not None
    assert [c.remedy for c in found.candidates] == [Remedy.KV_MEMORY, Remedy.CONCURRENCY_CAP, Remedy.KV_DTYPE]
    assert "max_tokens" in found.suggestion  # S_MAX_TOKENS: a client change, no candidate


def test_candidates_round_trip_through_the_archive_and_unknown_remedies_are_left_out() -> None:
    found = scheduler.PREFIX_CACHE_OFF.check(
        RunFacts(summary={"prefix_reuse.expected": 0.5}, scheduler=SchedulerFacts(prefix_caching=False))
    )
    assert found is not None and found.candidates[0].remedy is Remedy.PREFIX_CACHING
    plain = to_plain(found)
    assert finding_from(plain) == found
    plain["candidates"].append({"remedy": "teleport", "direction": "raise", "finding_id": "x", "evidence": ""})
    assert finding_from(plain) == found
    old = {k: v for k, v in plain.items() if k != "candidates"}  # an archive from before candidates
    assert finding_from(old).candidates == ()
