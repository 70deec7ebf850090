"""Each checklist rule alone: its condition at the edge, the finding it makes, and the table the report lists."""

from __future__ import annotations

import re

import pytest

from llmplay.archive.model import Finding
from llmplay.diagnose import checklist
from llmplay.diagnose.memory import MemoryBreakdown
from llmplay.diagnose.roofline import decode_roofline
from llmplay.diagnose.rule import Rule, RunFacts, SchedulerFacts
from llmplay.diagnose.rules import gpu, memory, roofline, scheduler

GiB = 2**30


def breakdown(peak_frac: float | None = 0.5, kv_share: float | None = 0.3, device: str = "gpu") -> MemoryBreakdown:
    capacity = 80 * GiB
    peak = None if peak_frac is None else peak_frac * capacity
    kv = (kv_share or 0) * (peak or 0)
    return MemoryBreakdown(14e9, 131072, kv / 131072, kv, 1e9, peak, capacity, kv_share, peak_frac, device)


def fires(rule: Rule, facts: RunFacts) -> bool:
    return rule.check(facts) is not None


def finding(rule: Rule, facts: RunFacts) -> Finding:
    found = rule.check(facts)
    assert found is not None, f"{rule.id} did not fire"
    assert found.id == rule.id and found.checklist_ref == rule.section
    return found


# -- the table ---------------------------------------------------------------------------------------------------------

SECTION_OF_PREFIX = {"memory": "§4", "roofline": "§5", "sched": "§6", "queue": "§6", "gpu": "§6"}


def test_every_rule_has_a_unique_id_named_after_its_checklist_section():
    ids = [rule.id for rule in checklist.RULES]
    assert len(ids) == len(set(ids)) == 20
    for rule in checklist.RULES:
        assert SECTION_OF_PREFIX[rule.id.split(".")[0]] == rule.section, rule.id
        assert rule.title, rule.id


def test_the_listing_names_every_rule_checked_fired_or_not():
    listing = checklist.rule_listing()
    assert [row["id"] for row in listing] == [rule.id for rule in checklist.RULES]
    assert all(set(row) == {"id", "section", "title"} for row in listing)


def test_findings_come_out_most_severe_first_in_checklist_order_within_a_severity():
    found = checklist.diagnose(
        {"errors.rate": 0.05},
        {"gpu.util_mean": 0.3, "engine.preemptions": 2.0},
        breakdown(peak_frac=0.95, kv_share=0.7),
        None,
    )
    assert [f.id for f in found] == [
        "memory.peak_high",
        "memory.errors_at_full_memory",
        "memory.preemptions",
        "memory.kv_share_high",
        "memory.breakdown",
        "gpu.low_util_undecided",
    ]


def test_a_scheduler_dict_from_an_archive_reads_into_scheduler_facts():
    facts = SchedulerFacts.from_mapping(
        {"continuous_batching": False, "max_batch": 4.0, "concurrency": "8", "prefix_caching": None, "odd": 1}
    )
    assert facts == SchedulerFacts(continuous_batching=False, max_batch=4, concurrency=8)
    assert SchedulerFacts.from_mapping({"max_batch": "many", "kv_preallocated_frac": True}) == SchedulerFacts()
    assert "kv_preallocated_frac" not in SchedulerFacts().as_mapping()
    assert SchedulerFacts(kv_preallocated_frac=0.9).as_mapping()["kv_preallocated_frac"] == 0.9


# -- §4 memory ---------------------------------------------------------------------------------------------------------


def test_memory_not_evaluated_without_a_breakdown():
    assert finding(memory.NOT_EVALUATED, RunFacts()).severity == "info"
    assert not fires(memory.NOT_EVALUATED, RunFacts(breakdown=breakdown()))


def test_memory_breakdown_names_where_the_peak_went():
    found = finding(memory.BREAKDOWN, RunFacts(breakdown=breakdown(device="cpu")))
    assert found.title == "Memory breakdown (host memory (RSS))"
    assert "weights 13.04 GiB" in found.evidence and "capacity 80.00 GiB" in found.evidence
    assert not fires(memory.BREAKDOWN, RunFacts())


@pytest.mark.parametrize("frac, fired", [(0.90, False), (0.9001, True), (None, False)])
def test_memory_peak_high_above_ninety_percent(frac: float | None, fired: bool):
    facts = RunFacts(breakdown=breakdown(peak_frac=frac))
    assert fires(memory.PEAK_HIGH, facts) is fired
    if fired:
        assert finding(memory.PEAK_HIGH, facts).severity == "critical"


def test_memory_peak_high_is_by_design_where_the_engine_preallocates():
    reserved = SchedulerFacts(kv_preallocated_frac=0.9)
    by_design = finding(memory.PEAK_HIGH, RunFacts(breakdown=breakdown(peak_frac=0.92), scheduler=reserved))
    assert by_design.severity == "info" and "reserves 90.0% up front" in by_design.evidence
    beyond = finding(memory.PEAK_HIGH, RunFacts(breakdown=breakdown(peak_frac=0.93), scheduler=reserved))
    assert beyond.severity == "critical"


@pytest.mark.parametrize("share, fired", [(0.60, False), (0.61, True), (None, False)])
def test_memory_kv_share_high_above_sixty_percent(share: float | None, fired: bool):
    facts = RunFacts(breakdown=breakdown(kv_share=share))
    assert fires(memory.KV_SHARE_HIGH, facts) is fired
    if fired:
        assert "61.0% > 60.0%" in finding(memory.KV_SHARE_HIGH, facts).evidence


@pytest.mark.parametrize(
    "errors, peak, fired", [(0.05, 0.95, True), (0.0, 0.95, False), (None, 0.95, False), (0.05, 0.5, False)]
)
def test_memory_errors_at_full_memory(errors: float | None, peak: float, fired: bool):
    summary = {} if errors is None else {"errors.rate": errors}
    facts = RunFacts(summary=summary, breakdown=breakdown(peak_frac=peak))
    assert fires(memory.ERRORS_AT_FULL_MEMORY, facts) is fired
    if fired:
        assert finding(memory.ERRORS_AT_FULL_MEMORY, facts).evidence == "error rate 5.0% with peak memory at 95.0%"


@pytest.mark.parametrize("count, fired", [(None, False), (0.0, False), (1.0, True)])
def test_memory_preemptions_any_is_critical(count: float | None, fired: bool):
    telemetry = {} if count is None else {"engine.preemptions": count, "engine.kv_cache_usage_max": 0.99}
    assert fires(memory.PREEMPTIONS, RunFacts(telemetry=telemetry)) is fired
    if fired:
        found = finding(memory.PREEMPTIONS, RunFacts(telemetry=telemetry))
        assert found.severity == "critical" and found.evidence.endswith("peak KV-cache usage 99.0%")


# -- §5 roofline -------------------------------------------------------------------------------------------------------

NO_TPOT = decode_roofline(14e9, 0, 3.35e12, None)
ABOVE = decode_roofline(14e9, 0, 3.35e12, 0.0063)  # 1.51× the floor
AT = decode_roofline(14e9, 0, 3.35e12, 0.0062)  # 1.48× the floor


def test_roofline_floor_only_without_a_measured_tpot():
    assert "floor 4.2 ms/token" in finding(roofline.FLOOR, RunFacts(roofline=NO_TPOT)).evidence
    assert not fires(roofline.FLOOR, RunFacts(roofline=ABOVE)) and not fires(roofline.FLOOR, RunFacts())


def test_roofline_headroom_above_one_and_a_half_times_the_floor():
    found = finding(roofline.HEADROOM, RunFacts(roofline=ABOVE, telemetry={"gpu.mem_bw_util_mean": 0.7}))
    assert "1.51× floor" in found.evidence and found.evidence.endswith("memory-bandwidth utilization 70.0%")
    assert not fires(roofline.HEADROOM, RunFacts(roofline=AT)) and not fires(
        roofline.HEADROOM, RunFacts(roofline=NO_TPOT)
    )


def test_roofline_at_floor_within_one_and_a_half_times():
    assert finding(roofline.AT_FLOOR, RunFacts(roofline=AT)).suggestion.startswith("FP8")
    assert not fires(roofline.AT_FLOOR, RunFacts(roofline=ABOVE)) and not fires(roofline.AT_FLOOR, RunFacts())


def test_roofline_prefill_mfu_when_measured():
    assert "prefill MFU 42.0%" in finding(roofline.PREFILL_MFU, RunFacts(prefill_mfu_frac=0.42)).evidence
    assert not fires(roofline.PREFILL_MFU, RunFacts())


# -- §6 scheduler ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("on, fired", [(False, True), (True, False), (None, False)])
def test_sched_no_continuous_batching(on: bool | None, fired: bool):
    assert fires(scheduler.NO_CONTINUOUS_BATCHING, RunFacts(scheduler=SchedulerFacts(continuous_batching=on))) is fired


@pytest.mark.parametrize("batch, users, fired", [(4, 8, True), (8, 8, False), (None, 8, False), (4, None, False)])
def test_sched_concurrency_over_batch(batch: int | None, users: int | None, fired: bool):
    facts = RunFacts(scheduler=SchedulerFacts(max_batch=batch, concurrency=users))
    assert fires(scheduler.CONCURRENCY_OVER_BATCH, facts) is fired
    if fired:
        assert (
            "concurrency 8 > max batch 4: 4 requests wait" in finding(scheduler.CONCURRENCY_OVER_BATCH, facts).evidence
        )


@pytest.mark.parametrize("caching, shared, fired", [(False, 512, True), (False, 0, False), (True, 512, False)])
def test_sched_prefix_cache_off(caching: bool, shared: int, fired: bool):
    facts = RunFacts(scheduler=SchedulerFacts(prefix_caching=caching, shared_prefix_tokens=shared))
    assert fires(scheduler.PREFIX_CACHE_OFF, facts) is fired


@pytest.mark.parametrize(
    "hit, shared, fired", [(0.02, 512, True), (0.1, 512, False), (0.02, 0, False), (None, 512, False)]
)
def test_sched_prefix_cache_misses_below_ten_percent(hit: float | None, shared: int, fired: bool):
    telemetry = {} if hit is None else {"engine.prefix_cache_hit_rate": hit}
    facts = RunFacts(telemetry=telemetry, scheduler=SchedulerFacts(prefix_caching=True, shared_prefix_tokens=shared))
    assert fires(scheduler.PREFIX_CACHE_MISSES, facts) is fired
    if fired:
        assert finding(scheduler.PREFIX_CACHE_MISSES, facts).evidence == (
            "prefix-cache hit rate 2.0% where 512 shared prefix tokens per request"
        )


@pytest.mark.parametrize(
    "expected, achieved, caching, fired",
    [(0.4, 0.1, True, True), (0.4, 0.3, True, False), (0.04, 0.0, True, False), (0.4, 0.1, False, False)],
)
def test_sched_prefix_cache_misses_against_the_workloads_own_reuse(
    expected: float, achieved: float, caching: bool, fired: bool
):
    summary = {"prefix_reuse.expected": expected, "prefix_reuse.achieved": achieved}
    facts = RunFacts(summary=summary, scheduler=SchedulerFacts(prefix_caching=caching))
    assert fires(scheduler.PREFIX_CACHE_MISSES, facts) is fired
    if fired:
        assert finding(scheduler.PREFIX_CACHE_MISSES, facts).evidence == (
            "prefix-cache hit rate 10.0% where the workload repeats 40.0% of its prompt tokens"
        )
    off = RunFacts(summary=summary, scheduler=SchedulerFacts(prefix_caching=False))
    assert fires(scheduler.PREFIX_CACHE_OFF, off) is (expected >= 0.05)


@pytest.mark.parametrize(
    "telemetry, evidence",
    [
        (
            {"engine.waiting_nonzero_frac": 0.5, "engine.waiting_mean": 2.0},
            "waiting queue > 0 in 50.0% of samples; mean 2.0 waiting",
        ),
        ({"engine.waiting_nonzero_frac": 0.49, "engine.waiting_mean": 2.0}, None),  # the share decides when measured
        ({"engine.waiting_mean": 1.0, "engine.waiting_max": 3.0}, "mean 1.0, max 3 waiting"),
        ({"engine.waiting_mean": 0.9}, None),
        ({}, None),
    ],
)
def test_queue_persistent(telemetry: dict[str, float], evidence: str | None):
    facts = RunFacts(telemetry=telemetry)
    assert fires(scheduler.QUEUE_PERSISTENT, facts) is (evidence is not None)
    if evidence is not None:
        assert finding(scheduler.QUEUE_PERSISTENT, facts).evidence == evidence


# -- §6 GPU utilization ------------------------------------------------------------------------------------------------


def test_gpu_not_evaluated_quotes_why():
    found = finding(gpu.NOT_EVALUATED, RunFacts(notes=("sampled", "no NVML: library not found")))
    assert found.evidence.startswith("no NVML: library not found; ")
    assert not fires(gpu.NOT_EVALUATED, RunFacts(telemetry={"gpu.util_mean": 0.1}))


@pytest.mark.parametrize("util, tpot_limit, fired", [(0.80, 0.04, True), (0.79, 0.04, False), (0.95, 0.06, False)])
def test_gpu_busy_and_slow_against_a_latency_gate(util: float, tpot_limit: float, fired: bool):
    facts = RunFacts(summary={"tpot.p95": 0.05}, telemetry={"gpu.util_mean": util}, targets={"tpot.p95": tpot_limit})
    assert fires(gpu.BUSY_AND_SLOW, facts) is fired
    if fired:
        assert "tpot.p95 50.0 ms > 40.0 ms" in finding(gpu.BUSY_AND_SLOW, facts).evidence


def test_gpu_busy_and_slow_without_a_gate_reads_the_ttft_tail():
    busy = {"gpu.util_mean": 0.9}
    assert fires(gpu.BUSY_AND_SLOW, RunFacts(summary={"ttft.p50": 0.1, "ttft.p95": 0.35}, telemetry=busy))
    assert not fires(gpu.BUSY_AND_SLOW, RunFacts(summary={"ttft.p50": 0.1, "ttft.p95": 0.25}, telemetry=busy))
    assert not fires(gpu.BUSY_AND_SLOW, RunFacts(telemetry=busy))  # latency not measured


def test_gpu_rules_prefer_sm_activity_over_nvml_utilization():
    facts = RunFacts(telemetry={"gpu.util_mean": 0.99, "gpu.sm_activity_mean": 0.3})
    assert facts.gpu_utilization() == (0.3, "SM activity (GPM)")
    assert "SM activity (GPM) 30.0%" in finding(gpu.LOW_UTIL_UNDECIDED, facts).evidence


@pytest.mark.parametrize(
    "util, tok_s, rule",
    [(0.49, 1000.0, gpu.BATCH_TOO_SMALL), (0.49, 3000.0, gpu.BANDWIDTH_BOUND), (0.50, 1000.0, None)],
)
def test_gpu_low_utilization_against_a_throughput_gate(util: float, tok_s: float, rule: Rule | None):
    facts = RunFacts(
        summary={"throughput.output_tok_s": tok_s},
        telemetry={"gpu.util_mean": util},
        targets={"throughput.output_tok_s": 3000},
    )
    low_rules = (gpu.BATCH_TOO_SMALL, gpu.BANDWIDTH_BOUND, gpu.LOW_UTIL_UNDECIDED)
    assert [r for r in low_rules if fires(r, facts)] == ([rule] if rule else [])


def test_gpu_low_utilization_without_a_gate_reads_the_roofline():
    idle = {"gpu.util_mean": 0.3}
    near = decode_roofline(14e9, 0, 3.35e12, 0.0083)  # 50.4% of the roofline
    far = decode_roofline(14e9, 0, 3.35e12, 0.0090)
    assert re.search(
        r"decode uses 50\.\d% of the bandwidth roofline",
        finding(gpu.BANDWIDTH_BOUND, RunFacts(telemetry=idle, roofline=near)).evidence,
    )
    assert fires(gpu.BATCH_TOO_SMALL, RunFacts(telemetry=idle, roofline=far))
    assert finding(gpu.LOW_UTIL_UNDECIDED, RunFacts(telemetry=idle)).evidence.endswith(
        "no throughput gate and no roofline: set a throughput gate to decide batch-too-small vs bandwidth-bound"
    )


# -- a run's diagnosis -------------------------------------------------------------------------------------------------


def test_a_runs_diagnosis_lists_every_rule_and_its_scheduler_facts():
    from types import SimpleNamespace

    from llmplay.diagnose.from_trials import diagnose_run, scheduler_facts
    from llmplay.spec import Config, EngineSpec, Goals, Workload

    engine = EngineSpec("vllm", "m", args={"max_num_seqs": 4, "prefix_caching": False})
    config = Config("baseline", engine, Workload(concurrency=8, prefix_tokens=256, num_requests=10))
    facts = scheduler_facts(config)
    assert facts == SchedulerFacts(True, 4, 8, None, False, 256, 0.9)
    findings, diagnosis = diagnose_run(SimpleNamespace(goals=Goals()), config, [], {})
    assert [(r.id, r.section, r.title) for r in diagnosis.rules or ()] == [
        (r["id"], r["section"], r["title"]) for r in checklist.rule_listing()
    ]
    assert diagnosis.scheduler == facts.as_mapping()
    assert {"sched.concurrency_over_batch", "sched.prefix_cache_off"} <= {f.id for f in findings}
    llama = Config("baseline", EngineSpec("llamacpp", "m", args={"parallel": 2}), config.workload)
    assert scheduler_facts(llama).kv_preallocated_frac is None and scheduler_facts(llama).max_batch == 2
