"""Capacity under SLO: the search against the instrument's M/M/c queue (a known boundary), the loader's rules,
the `llmplay capacity` command, and a capacity A/B on real llama.cpp."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from llmplay.archive.capacity import ABOVE_BOUNDS, BELOW_BOUNDS, FOUND, UNDECIDED, CapacityResult, ProbeVerdict
from llmplay.archive.convert import capacity_from
from llmplay.archive.reader import ArchivedRun
from llmplay.errors import PlaybookError
from llmplay.loadgen.tokenizer import make_tokenizer
from llmplay.metrics import Attainment, usd_per_1m_tokens
from llmplay.playbook.load import load_playbook
from llmplay.spec import CapacitySpec, LengthDist, Workload
from llmplay.stats.capacity import crossing
from llmplay.tuning.capacity import ProbeRun, capacity_summary, search_capacity
from llmplay.tuning.trial import capacity_search
from llmplay_testing.instrument import InstrumentServer
from llmplay_testing.queueing import mmc_attainment, mmc_capacity

# Timed against the instrument: a raised CPU priority (tests/conftest.py).
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]
# The instrument's queue: 4 servers, 100 ms mean service (40 req/s at most); TTFT = wait + 10 ms, so a TTFT SLO of
# 210 ms is a 200 ms bound on the wait, met by 90% of requests up to the Erlang C boundary (about 31.3 req/s).
# Waits of hundreds of ms keep the CPU scheduling jitter of a shared 2-core machine (tens of ms) small beside them.
SERVERS, SERVICE_S, TTFT_S, WAIT_S, TARGET = 4, 0.10, 0.010, 0.200, 0.90
TRUTH = mmc_capacity(SERVERS, SERVICE_S, WAIT_S, TARGET)
WORKLOAD = Workload(
    input=LengthDist("fixed", value=8), output=LengthDist("fixed", value=4), rate=1.0, duration_s=1.0, warmup_s=2.0
)


@pytest.fixture(scope="module")
def instrument():
    # A process of its own: the load generator and the server must not share one GIL at 30+ req/s.
    with InstrumentServer(process=True) as server:
        yield server


def queue_url(server: InstrumentServer, qseed: int = 0) -> str:
    return server.url_for(
        ttft_ms=TTFT_S * 1000, itl_ms=2, tokens=4, servers=SERVERS, service_ms=SERVICE_S * 1000, qseed=qseed
    )


def search(server: InstrumentServer, spec: CapacitySpec, slo_s: dict, qseed: int = 0) -> CapacityResult:
    _, result = capacity_search(queue_url(server, qseed), "instrument", WORKLOAD, spec, slo_s, make_tokenizer("word"))
    return result


def test_the_truth_is_the_erlang_c_boundary():
    assert mmc_attainment(TRUTH, SERVERS, SERVICE_S, WAIT_S) == pytest.approx(TARGET, abs=1e-6)
    assert 30 < TRUTH < 33


def within_the_time_cap(result: CapacityResult, spec: CapacitySpec) -> bool:
    """The cap is checked before each run (the first always runs): a run starts only while the load spent so far,
    a settle and one more probe fit. Every run lasts at least its probe, so however slowly a busy machine ran them,
    no more runs than that were made. (The last run may end past the cap by its warm-up and drain.)"""
    return result.runs * spec.probe_s + (result.runs - 1) * spec.settle_s <= spec.max_engine_s


def scripted_search(spec: CapacitySpec, capacity: float, *, share_near: float | None = None) -> CapacityResult:
    """The search on scripted probes: every one of a probe's 200 requests meets the SLO below `capacity` and misses
    it above; `share_near` instead makes every load's share exactly that (a boundary noise never lets through).
    Each run takes its probe plus a 2 s warm-up of engine time, as a real one does."""

    def measure(load: float, replicate: int) -> ProbeRun:
        share = share_near if share_near is not None else float(load < capacity)
        met = np.zeros(200)
        met[: round(200 * share)] = 1.0
        attainment = Attainment(met, {"ttft": share}, {"ttft": 0.1 if share >= spec.attainment else 0.5}, 10.0, load)
        return ProbeRun(load, replicate, attainment, spec.probe_s, spec.probe_s + 2.0, None)  # type: ignore[arg-type]

    result, _ = search_capacity(spec, {"ttft": 0.2}, measure, settle=lambda _s: None)
    return result


def test_each_outcome_of_the_search_is_reported_as_such_on_scripted_probes():
    """What the search does with what it measured, free of any machine's noise: the probe order, the bracket and
    its interval, and each outcome in words. (The instrument tests below run the same search on real requests.)"""
    spec = CapacitySpec("rate", 4, 128, attainment=0.9, precision=0.25, probe_s=3, settle_s=0.5, max_engine_s=200)
    found = scripted_search(spec, TRUTH)
    assert found.status == FOUND, found.as_dict()
    assert list(found.run_loads[:4]) == [4, 8, 16, 32]  # doubling from the lower bound until a probe misses
    assert found.feasible_max is not None and found.infeasible_min is not None
    assert found.feasible_max < TRUTH <= found.infeasible_min <= found.feasible_max * (1 + spec.precision)
    assert found.feasible_max <= found.capacity <= found.infeasible_min
    assert found.ci[0] <= found.capacity <= found.ci[1]
    assert found.binding == "ttft" and "TTFT breaks at" in found.binding_sentence()
    assert "one engine start for the whole search" in found.order and within_the_time_cap(found, spec)

    above = scripted_search(CapacitySpec("rate", 2, 8, attainment=0.9, probe_s=2, max_engine_s=30), TRUTH)
    assert above.status == ABOVE_BOUNDS and above.capacity == 8 and above.censored
    assert above.boundary_text().startswith("≥ 8 req/s") and max(above.run_loads) == 8

    below = scripted_search(CapacitySpec("rate", 60, 120, attainment=0.9, probe_s=2, max_engine_s=30), TRUTH)
    assert below.status == BELOW_BOUNDS and below.capacity is None
    assert set(below.run_loads) == {60} and below.boundary_text().startswith("< 60 req/s")  # nothing below it

    # Out of engine time before any probe missed (5 s a run: no third run fits 12 s): indeterminate, no number.
    capped = CapacitySpec("rate", 4, 128, attainment=0.9, precision=0.25, probe_s=3, settle_s=0, max_engine_s=12)
    out_of_time = scripted_search(capped, TRUTH)
    assert out_of_time.status == UNDECIDED and out_of_time.capacity is None and out_of_time.run_loads == (4, 8)
    assert out_of_time.boundary_text().startswith("indeterminate")
    assert "not pinned within ±25%: the time cap (12 s of load) ran out" in out_of_time.notes
    assert within_the_time_cap(out_of_time, capped)
    figures = capacity_summary(out_of_time, usd_per_hour=1.0)
    assert "capacity.rate" not in figures and "cost.usd_per_1m_tokens_at_slo" not in figures

    # A share on the target at every load: no probe is ever decided, and the search says so.
    noisy = CapacitySpec("rate", 16, 64, attainment=0.9, precision=0.02, probe_s=1, replicates=2, max_engine_s=60)
    within_noise = scripted_search(noisy, TRUTH, share_near=0.9)
    assert within_noise.status == UNDECIDED and within_noise.capacity is None
    assert any(note.startswith("not pinned within ±2%: attainment near the target") for note in within_noise.notes)


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_search_brackets_the_known_boundary_in_its_probe_order(instrument):
    """The search's shape on real requests against a known truth: from the lower bound up, a bracket with an
    interval around its answer, or, when the machine's noise kept it from pinning the boundary in its time cap, an
    indeterminate result that says so. Whether it pins in 90 s, and how close it lands, are measurements
    (benchmarks/capacity.py, RESULTS.md "Capacity under SLO"), made there on long probes; the probe order and each
    outcome's wording are checked on scripted probes above."""
    spec = CapacitySpec(
        "rate", 4, 128, attainment=TARGET, precision=0.25, probe_s=3, settle_s=0.2, max_engine_s=90, replicates=1
    )
    result = search(instrument, spec, {"ttft": TTFT_S + WAIT_S})
    assert result.status in (FOUND, UNDECIDED), result.as_dict()
    assert result.run_loads[0] == spec.low  # the exponential probe starts at the lower bound
    assert "one engine start for the whole search" in result.order
    assert within_the_time_cap(result, spec), result.as_dict()
    assert result.runs == len(result.run_loads)
    if result.status == UNDECIDED:
        assert result.capacity is None and any("not pinned" in note for note in result.notes), result.as_dict()
        return
    assert result.binding == "ttft" and "TTFT breaks at" in result.binding_sentence()
    assert result.feasible_max < result.infeasible_min
    assert result.ci[0] <= result.capacity <= result.ci[1]
    # The machine's noise only delays requests, so it can only make the search answer low: past the queue's 40 req/s
    # no probe can meet the SLO, and an answer above that would be llmplay mis-measuring.
    assert result.capacity <= TRUTH * 1.6, (result.capacity, TRUTH)


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_binding_slo_is_the_one_that_breaks_first(instrument):
    # E2EL = wait + 10 ms + 3 gaps of 2 ms: a 116 ms E2EL SLO bounds the wait at 100 ms, tighter than TTFT's 400 ms.
    spec = CapacitySpec(
        "rate", 8, 128, attainment=TARGET, precision=0.25, probe_s=3, settle_s=0.2, max_engine_s=60, replicates=1
    )
    result = search(instrument, spec, {"ttft": TTFT_S + 0.400, "e2el": 0.016 + 0.100}, qseed=1)
    assert result.binding == "e2el", result.as_dict()
    assert result.binding_value_s > 0.116
    sentence = result.binding_sentence()
    assert sentence.startswith("E2EL breaks at"), sentence
    assert "TTFT would hold until" in sentence


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_noise_within_the_time_cap_answers_indeterminate_not_a_number(instrument):
    # Half-second probes hold ~30 requests: no interval near the boundary can clear a 90% target, and a 2%
    # precision in 15 s of load cannot be met.
    spec = CapacitySpec(
        "rate", 16, 64, attainment=TARGET, precision=0.02, probe_s=0.5, settle_s=0.1, max_engine_s=15, replicates=2
    )
    result = search(instrument, spec, {"ttft": TTFT_S + WAIT_S}, qseed=2)
    assert result.status == UNDECIDED, result.as_dict()
    assert result.capacity is None
    assert result.boundary_text().startswith("indeterminate")
    figures = capacity_summary(result, usd_per_hour=1.0)
    assert "capacity.rate" not in figures and "cost.usd_per_1m_tokens_at_slo" not in figures
    assert any("not pinned" in note for note in result.notes)


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_meeting_the_slo_at_the_upper_bound_says_so(instrument):
    spec = CapacitySpec("rate", 2, 8, attainment=TARGET, precision=0.1, probe_s=2, settle_s=0.1, max_engine_s=30)
    result = search(instrument, spec, {"ttft": TTFT_S + WAIT_S}, qseed=3)
    assert max(result.run_loads) == 8  # never probed past the bound
    # 8 req/s is far below the queue's boundary, but "met" at 90% needs all 48 requests of three probes within the SLO:
    # one request held 200 ms by a busy machine leaves the top load undecided, which the search must then say.
    assert result.status in (ABOVE_BOUNDS, UNDECIDED), result.as_dict()
    if result.status == UNDECIDED:
        assert result.capacity is None and result.boundary_text().startswith("indeterminate")
        return
    assert result.capacity == 8 and result.censored
    assert result.boundary_text().startswith("≥ 8 req/s")


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_missing_the_slo_at_the_lower_bound_says_so(instrument):
    # 60 req/s is well past the queue's 40 req/s: it fails at once, and nothing below the bound is probed.
    spec = CapacitySpec("rate", 60, 120, attainment=TARGET, precision=0.1, probe_s=2, settle_s=0.1, max_engine_s=30)
    result = search(instrument, spec, {"ttft": TTFT_S + WAIT_S}, qseed=4)
    assert result.status == BELOW_BOUNDS
    assert result.capacity is None
    assert min(result.run_loads) == 60
    assert result.boundary_text().startswith("< 60 req/s")


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_concurrency_search_probes_whole_users(instrument):
    # Closed loop: each user waits for its answer, so past 4 users the queue holds the rest; whole users only.
    spec = CapacitySpec(
        "concurrency", 1, 64, attainment=TARGET, precision=0.25, probe_s=2, settle_s=0.1, max_engine_s=40, replicates=1
    )
    result = search(instrument, spec, {"ttft": TTFT_S + WAIT_S}, qseed=8)
    assert all(float(x).is_integer() for x in result.run_loads), result.run_loads
    assert result.unit == "users"
    assert result.infeasible_min is not None and result.infeasible_min <= 64
    if result.capacity is not None:
        assert float(result.capacity).is_integer()
        assert "capacity.concurrency" in capacity_summary(result, usd_per_hour=1.0)


def test_isotonic_crossing_interpolates_on_log_load():
    def probe(load: float, attainment: float) -> ProbeVerdict:
        return ProbeVerdict(load, 0, 1, 100, attainment, 0.0, 1.0, "indeterminate", {}, {}, None, None, 0.0)

    # 0.95 at 10, 0.85 at 20: 0.90 is crossed half way on the log scale, at sqrt(200).
    assert crossing([probe(10, 0.95), probe(20, 0.85)], 0.90) == pytest.approx(math.sqrt(200))
    # A violation of monotonicity is pooled, not believed: 0.80 then 0.95 fit to 0.875 both.
    assert crossing([probe(5, 0.99), probe(10, 0.80), probe(20, 0.95), probe(40, 0.1)], 0.90) is not None
    assert crossing([probe(10, 0.99), probe(20, 0.95)], 0.90) is None


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_result_round_trips_through_its_archived_form(instrument):
    spec = CapacitySpec("rate", 2, 8, attainment=TARGET, precision=0.1, probe_s=1, settle_s=0.1, max_engine_s=10)
    result = search(instrument, spec, {"ttft": TTFT_S + WAIT_S}, qseed=5)
    again = capacity_from(json.loads(json.dumps(result.as_dict())))
    assert again.as_dict() == result.as_dict()


# ------------------------------------------------------------------------------------------------ bad input
def write(tmp_path: Path, goals: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: p}\nengine: {kind: llamacpp, model: m}\n"
        "workload: {rate: 1, duration: 5s}\n" + goals
    )
    return path


@pytest.mark.parametrize(
    ("goals", "message"),
    [
        (
            "goals:\n  slo: {ttft: 1s}\n  capacity:\n    search: rate\n    bounds: [1, 8]\n    attainment: 0\n",
            "p.yaml:11: goals.capacity.attainment: found 0; expected a share of requests in (0, 1], e.g. 95% or 0.95",
        ),
        (
            "goals:\n  slo: {ttft: 1s}\n  capacity:\n    search: rate\n    bounds: [1, 8]\n    attainment: 150%\n",
            "p.yaml:11: goals.capacity.attainment: found '150%'; expected a share of requests in (0, 1], "
            "e.g. 95% or 0.95",
        ),
        (
            "goals:\n  slo: {ttft: 1s}\n  capacity:\n    search: rate\n    bounds: [8, 1]\n",
            "p.yaml:10: goals.capacity.bounds: found [8, 1]; expected [low, high] with low < high",
        ),
        (
            "goals:\n  objective: {maximize: capacity.rate}\n  capacity: {search: rate, bounds: [1, 8]}\n",
            "p.yaml:7: goals.objective.maximize: capacity.rate is measured under SLOs, found no goals.slo; "
            "expected e.g. slo: {ttft: 500ms, tpot: 50ms}",
        ),
        (
            "goals:\n  objective: {maximize: capacity.rate}\n  slo: {ttft: 1s}\n",
            "p.yaml:7: goals.objective.maximize: capacity.rate needs a capacity search, found no goals.capacity; "
            "expected e.g. capacity: {search: rate, bounds: [0.5, 16]}",
        ),
        (
            "goals:\n  slo: {ttft: 1s}\n  capacity: {search: concurrency, bounds: [1.5, 8]}\n",
            "p.yaml:8: goals.capacity.bounds: found [1.5, 8]; expected whole numbers of users for a concurrency search",
        ),
    ],
    ids=[
        "attainment-zero",
        "attainment-above-one",
        "bounds-reversed",
        "objective-no-slo",
        "objective-no-capacity",
        "fractional-users",
    ],
)
def test_bad_capacity_goals_are_one_line_with_file_and_line(tmp_path, goals, message):
    with pytest.raises(PlaybookError) as info:
        load_playbook(write(tmp_path, goals))
    lines = str(info.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith(message), lines[0]


def test_capacity_block_loads_with_its_defaults(tmp_path):
    pb = load_playbook(
        write(tmp_path, "goals:\n  slo: {ttft: 1s}\n  capacity: {search: rate, bounds: [0.5, 16], probe: 4s}\n")
    )
    cap = pb.goals.capacity
    assert cap is not None
    assert (cap.search, cap.low, cap.high, cap.probe_s) == ("rate", 0.5, 16.0, 4.0)
    assert (cap.attainment, cap.precision, cap.engine) == (0.95, 0.05, "shared")


def test_capacity_metrics_are_gates_and_guards_like_any_metric(tmp_path):
    pb = load_playbook(
        write(
            tmp_path,
            "goals:\n  slo: {ttft: 1s}\n  capacity: {search: rate, bounds: [0.5, 16]}\n"
            "  gates: ['capacity.rate > 2', 'cost.usd_per_1m_tokens_at_slo < $5']\n"
            "  guards: [{metric: capacity.output_tok_s, tolerance: 10%}]\n",
        )
    )
    assert [g.metric for g in pb.goals.gates] == ["capacity.rate", "cost.usd_per_1m_tokens_at_slo"]
    assert pb.goals.gates[1].value == 5.0
    assert pb.goals.guards[0].direction == "maximize"


# ------------------------------------------------------------------------------------- the command, end to end
@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
@pytest.mark.parametrize("engine", ["shared", "fresh"])
def test_capacity_command_against_an_endpoint_prints_the_boundary_and_archives_it(tmp_path, instrument, engine):
    doc = {
        "apiVersion": "llmplay/v1",
        "kind": "Playbook",
        "metadata": {"name": "cap-instrument"},
        "engine": {"kind": "vllm", "model": "instrument", "health": {"path": "/health"}},
        "runtime": {"kind": "endpoint", "url": queue_url(instrument, qseed=6)},
        "workload": {"input": 8, "output": 4, "rate": 1, "duration": "1s", "warmup": "0.5s"},
        "goals": {
            "slo": {"ttft": "210ms"},
            "capacity": {
                "search": "rate",
                "bounds": [4, 16],
                "attainment": "90%",
                "precision": "20%",
                "probe": "1s",
                "settle": "0.1s",
                "max_engine_time": "20s",
                "engine": engine,
            },
        },
        "cost": {"host_usd_per_hour": 1.0},
    }
    path = tmp_path / "cap.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "llmplay", "capacity", str(path), "--archive", str(tmp_path / "reports")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Capacity under SLO" in proc.stdout
    run_dir = next((tmp_path / "reports" / "cap-instrument").iterdir())
    archived = ArchivedRun.open(run_dir)
    (trial,) = archived.trials()
    # 16 req/s is far below the queue's boundary; whether all of the top load's requests meet the SLO on a busy
    # machine is noise (see test_meeting_the_slo_at_the_upper_bound_says_so). What is printed is what is archived.
    status = archived.capacity_search(trial.trial_id).status
    assert status in (ABOVE_BOUNDS, UNDECIDED) and status in proc.stdout, proc.stdout
    if status == ABOVE_BOUNDS:
        assert "≥ 16 req/s" in proc.stdout and "binding: no SLO broke within the bounds" in proc.stdout
        assert trial.summary["capacity.rate"] == 16
    else:
        assert "indeterminate" in proc.stdout and "capacity.rate" not in trial.summary
    assert ("fresh engine start per probe" in " ".join(trial.notes)) == (engine == "fresh")
    html = (run_dir / "report.html").read_text()
    assert 'id="capacity"' in html and "SLO attainment against load" in html
    assert "throughput against P90 TTFT" in html


@pytest.mark.slow  # a capacity search: probes of real seconds against the instrument
def test_bench_capacity_searches_a_running_endpoint(tmp_path, instrument):
    doc = {
        "apiVersion": "llmplay/v1",
        "kind": "Playbook",
        "metadata": {"name": "bench-cap"},
        "engine": {"kind": "vllm", "model": "instrument"},
        "workload": {"input": 8, "output": 4, "rate": 1, "duration": "1s", "warmup": "0.5s"},
        "goals": {
            "slo": {"ttft": "210ms"},
            "capacity": {"search": "rate", "bounds": [60, 120], "attainment": "90%", "probe": "1s"},
        },
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "cap.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmplay",
            "bench",
            "--url",
            queue_url(instrument, qseed=7),
            "--workload",
            str(path),
            "--capacity",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Well past the queue's 40 req/s at the lower bound: it says so, with no number.
    assert "below_bounds" in proc.stdout and "< 60 req/s" in proc.stdout
    assert json.loads(out.read_text())["status"] == BELOW_BOUNDS


# ------------------------------------------------------------------------------------------- real llama.cpp
def test_llamacpp_capacity_ab_parallel_4_beats_parallel_1(tmp_path, cpu_engine, docker_client):
    """A capacity objective makes the step a capacity A/B: both sides searched interleaved, one boundary per trial,
    the paired interval on their log ratio, archived and reported with the cost at the SLO.

    Whether four slots are *shown* to take more users than one on this machine's noise is a measurement, not
    something llmplay controls: benchmarks/RESULTS.md carries that claim. Here the pipeline must produce a capacity
    verdict from real boundaries (kept, or inconclusive with the pairs that would settle it), never a wrong sign.

    The shipped cpu-tiny-capacity playbook, searched closed loop: with one slot every user waits for the requests
    ahead of it, so TTFT grows with each user; with four, a user waits only once all four slots are busy. The
    boundary is whole users, which keeps the per-pair ratio steady on a machine shared with other work."""
    from llmplay.report import publish_report
    from llmplay.tuning.run import RunOptions, run_playbook

    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny-capacity.yaml").read_text())
    doc["metadata"]["name"] = "cpu-capacity-ab"
    doc["goals"]["objective"] = {"maximize": "capacity.concurrency", "min_effect": "10%"}
    doc["goals"]["gates"] = ["capacity.concurrency >= 1", "cost.usd_per_1m_tokens_at_slo < $1"]
    doc["goals"]["slo"] = {"ttft": "300ms"}
    # A coarse search: the test checks the pipeline, not the boundary's last user. Up to 12 users, to 50% (one slot's
    # boundary has been 4-6 users here, four slots' 8-9): a search took 36-42 s of load on a quiet machine and 44-50 s
    # beside two busy loops, where 16 users to 25% took 56-62 s quiet and ran into 75 s beside an engine test.
    doc["goals"]["capacity"].update(search="concurrency", bounds=[1, 12], precision="50%", max_engine_time="60s")
    doc["workload"].pop("rate")
    doc["workload"]["concurrency"] = 4
    # Two pairs: the least that gives a paired interval (one degree of freedom); whether it clears zero is noise.
    doc["trials"]["repeats"] = 2
    path = tmp_path / "cpu-capacity-ab.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    pb = load_playbook(path)
    outcome = run_playbook(
        pb,
        RunOptions(archive_root=tmp_path / "reports", preflight=False),
        publish=publish_report,
        report=lambda _: None,
    )
    assert outcome.status == "complete", outcome
    (verdict,) = outcome.verdicts
    assert verdict.objective is not None and verdict.objective.metric == "capacity.concurrency"
    assert verdict.verdict in ("kept", "inconclusive"), verdict.reason
    # A side whose search ran out of engine time before pinning its boundary leaves its pair out of the interval,
    # and the verdict names it; how many pairs pin in 75 s on a shared machine is noise, not llmplay's to assert.
    units = verdict.objective.units or 0  # None: no pair had a boundary on both sides, so there is no interval
    assert 0 <= units <= 2
    if units < 2:
        assert "left out, their capacity search pinned no boundary" in verdict.reason, verdict.reason
        assert verdict.verdict == "inconclusive", verdict.reason
    # Four slots never hold fewer users than one: the point estimate has the sign the queueing dictates.
    if verdict.objective.rel_change is not None:
        assert verdict.objective.rel_change >= 0, verdict.objective
    archived = ArchivedRun.open(outcome.run_dir)
    price = pb.cost.host_usd_per_hour
    for trial in archived.trials():
        s = trial.summary
        assert archived.capacity_search(trial.trial_id) is not None
        if "capacity.concurrency" in s and "capacity.output_tok_s" not in s:
            # a boundary whose throughput the search could not estimate has no cost at it: not measured, not guessed
            assert "cost.usd_per_1m_tokens_at_slo" not in s
        elif "capacity.concurrency" in s:
            # cost at the SLO is the price over the tokens the capacity produces in an hour
            assert s["cost.usd_per_1m_tokens_at_slo"] == pytest.approx(
                usd_per_1m_tokens(price, s["capacity.output_tok_s"])
            )
            assert s["cost.usd_per_1m_tokens_at_slo"] == pytest.approx(
                price / (s["capacity.output_tok_s"] * 3600) * 1e6
            )
    html = (outcome.run_dir / "report.html").read_text()
    assert 'id="capacity"' in html and "$ / 1M tok at SLO" in html
