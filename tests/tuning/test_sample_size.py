"""Sample size is part of the answer: what each percentile rests on, and saying so where it is too few requests.

The catalog's wording, the pooled counts of a configuration, decisions and gates that rest on thin or absent
percentiles, and a synthetic tuning run whose archive keeps all of it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from llmplay.archive.model import INCONCLUSIVE, KEPT
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.verify import verify
from llmplay.catalog import absence_reason, min_samples, thin_comparison, thin_sample
from llmplay.playbook.load import load_playbook
from llmplay.spec import Gate, Goals, Guard, Objective, Trials
from llmplay.stats.decide import TrialSample, decide_step, evaluate_gates, pooled_counts, pooled_summary
from llmplay.tuning.run import RunOptions, TuningRun
from llmplay.tuning.trial import TrialResult
from llmplay_testing.synthetic import scripted_trial

ROOT = Path(__file__).resolve().parents[2]
TRIALS = Trials(repeats=2)


def sample(rng, *, n=200, ttft_ms=100.0, tok_s=1000.0, streamed=True, scalars=None):
    """A trial of n completed requests; streamed=False: none streamed, so TTFT, TPOT and ITL are absent."""
    ttft = rng.lognormal(np.log(ttft_ms / 1000), 0.2, n)
    out = np.full(n, tok_s * 10.0 / max(n, 1))
    none = np.array([])
    return TrialSample(
        duration_s=10.0,
        values={
            "ttft": ttft if streamed else none,
            "tpot": ttft / 10 if streamed else none,
            "itl": ttft / 10 if streamed else none,
            "e2el": ttft * 5,
            "ttft_nonstream": none if streamed else ttft * 5,
            "output_tokens": out,
            "total_tokens": out * 3,
            "good": np.ones(n),
        },
        n_requests=n,
        n_errors=0,
        scalars=dict(scalars or {}),
    )


# ---------------------------------------------------------------------------------------------- the catalog
def test_thin_sample_names_the_percentile_its_count_and_the_minimum():
    assert thin_sample("ttft.p95", {"ttft.n": 2}) == "P95 TTFT from 2 request(s) (needs at least 20)"
    assert thin_sample("itl.p99", {"itl.n": 99}) == "P99 ITL from 99 request(s) (needs at least 100)"
    assert thin_sample("tpot.p90", {"tpot.n": 9}) == "P90 TPOT from 9 request(s) (needs at least 10)"
    assert thin_sample("ttft.p95", {"ttft.n": 20}) is None  # enough
    assert thin_sample("ttft.p50", {"ttft.n": 2}) is None  # a median needs no tail
    assert thin_sample("ttft.p95", {"ttft.n": 0}) is None  # absent, not thin: absence_reason's job
    assert thin_sample("ttft.p95", {}) is None  # no count known
    assert thin_sample("throughput.output_tok_s", {"ttft.n": 1}) is None


def test_thin_comparison_counts_per_side():
    assert thin_comparison("ttft.p95", 12, 12) == "P95 TTFT rests on 12 requests per side (needs at least 20)"
    assert thin_comparison("e2el.p99", 40, 120) == "P99 E2E latency rests on 40 vs 120 requests (needs at least 100)"
    assert thin_comparison("ttft.p95", 20, 25) is None
    assert thin_comparison("ttft.p95", None, 5) is None
    assert thin_comparison("ttft.mean", 1, 1) is None
    assert min_samples("ttft.p99") == 100 and min_samples("throughput.req_s") is None


def test_absence_reasons_say_why():
    assert absence_reason("ttft.p95") == "no streamed request completed"
    assert absence_reason("tpot.p95") == "no streamed request produced more than one output token"
    assert absence_reason("ttft_nonstream.p50") == "no non-streamed request completed"
    assert absence_reason("e2el.p95") == "no request completed"
    assert "measured window" in absence_reason("throughput.output_tok_s")
    assert "/metrics" in absence_reason("engine.kv_cache_usage_max")
    assert "NVML" in absence_reason("memory.peak_frac")
    assert "price" in absence_reason("cost.usd_per_1m_tokens")
    assert absence_reason("nonsense") == "no data"


# ---------------------------------------------------------------------------------------------- pooled counts
def test_pooled_counts_sum_each_family_over_the_trials():
    rng = np.random.default_rng(0)
    counts = {"itl.n": 11, "requests.completed": 12, "requests.streamed": 9, "requests.nonstreamed": 3}
    a, b = sample(rng, n=12, scalars=counts), sample(rng, n=12, scalars=counts)
    pooled = pooled_counts([a, b])
    assert pooled["ttft.n"] == 24 and pooled["e2el.n"] == 24 and pooled["ttft_nonstream.n"] == 0
    assert pooled["itl.n"] == 22  # from the trials' request counts, not the pooled chunk gaps
    assert pooled["requests.streamed"] == 18 and pooled["requests.nonstreamed"] == 6
    assert "requests.total" not in pooled  # no trial said: left out, never guessed
    summary = pooled_summary([a, b])
    assert summary["ttft.n"] == 24 and summary["requests.completed"] == 24
    # one trial without its counts: that count is unknown for the configuration
    assert "itl.n" not in pooled_counts([a, sample(rng, n=12)])
    assert pooled_counts([]) == {}


# ---------------------------------------------------------------------------------------------- decisions
def test_a_decision_on_a_thin_percentile_says_so():
    rng = np.random.default_rng(1)
    a = [sample(rng, n=6) for _ in range(2)]
    b = [sample(rng, n=6, ttft_ms=50) for _ in range(2)]
    d = decide_step(a, b, Goals(objective=Objective("minimize", "ttft.p95", 0.02)), TRIALS)
    assert d.reason.endswith("; P95 TTFT rests on 12 requests per side (needs at least 20)"), d.reason
    assert (d.objective.n_baseline, d.objective.n_candidate) == (12, 12)
    # a thin guard too, once, and the verdict itself is still the statistics' own
    goals = Goals(
        objective=Objective("minimize", "ttft.p95", 0.02),
        guards=(Guard("e2el.p99", 0.5, "minimize"), Guard("ttft.p95", 0.5, "minimize")),
    )
    d2 = decide_step(a, b, goals, TRIALS)
    assert d2.reason.count("P95 TTFT rests on") == 1 and "P99 E2E latency rests on 12 requests per side" in d2.reason
    assert d2.verdict == d.verdict


def test_a_decision_on_enough_requests_says_nothing_of_sample_size():
    rng = np.random.default_rng(2)
    a = [sample(rng) for _ in range(2)]
    b = [sample(rng, ttft_ms=50) for _ in range(2)]
    d = decide_step(a, b, Goals(objective=Objective("minimize", "ttft.p95", 0.02)), TRIALS)
    assert d.verdict == KEPT and "rests on" not in d.reason
    assert d.objective.n_baseline == 400


def test_an_objective_not_measured_is_inconclusive_with_the_reason():
    rng = np.random.default_rng(3)
    a = [sample(rng) for _ in range(2)]
    b = [sample(rng, streamed=False) for _ in range(2)]
    d = decide_step(a, b, Goals(objective=Objective("minimize", "ttft.p95", 0.02)), TRIALS)
    assert d.verdict == INCONCLUSIVE
    assert "P95 TTFT not measured on the candidate (no streamed request completed)" in d.reason
    both = decide_step(b, b, Goals(objective=Objective("minimize", "tpot.p95", 0.02)), TRIALS)
    assert both.verdict == INCONCLUSIVE and "not measured on either side" in both.reason


def test_a_guard_not_measured_keeps_a_step_from_being_kept():
    rng = np.random.default_rng(4)
    a = [sample(rng) for _ in range(2)]
    b = [sample(rng, tok_s=1500, streamed=False) for _ in range(2)]
    goals = Goals(
        objective=Objective("maximize", "throughput.output_tok_s", 0.02), guards=(Guard("tpot.p95", 0.1, "minimize"),)
    )
    d = decide_step(a, b, goals, TRIALS)
    assert d.verdict == INCONCLUSIVE, d.reason
    assert "guard P95 TPOT not measured on the candidate (no streamed request produced more than one" in d.reason
    assert d.reason.endswith("not kept while a guard is not measured") and "no guard regressed" not in d.reason
    measured = decide_step(a, [sample(rng, tok_s=1500) for _ in range(2)], goals, TRIALS)
    assert measured.verdict == KEPT


# ---------------------------------------------------------------------------------------------- gates
def test_gates_note_thin_and_absent_percentiles():
    gates = [
        Gate("ttft.p95", "<", 0.5, "ttft.p95 < 500ms"),
        Gate("e2el.p95", "<", 2.0, "e2el.p95 < 2s"),
        Gate("tpot.p95", "<", 0.05, "tpot.p95 < 50ms"),
        Gate("throughput.output_tok_s", ">", 10, "throughput.output_tok_s > 10"),
        Gate("ttft.p99", "<", 1.0, "ttft.p99 < 1s"),
    ]
    summary = {"ttft.p95": 0.3, "ttft.n": 2, "e2el.p95": 1.0, "e2el.n": 50, "throughput.output_tok_s": 20.0}
    summary["ttft.p99"] = math.inf  # never judged as a number: not measured
    ttft, e2el, tpot, tok_s, p99 = evaluate_gates(gates, summary)
    assert ttft.met is True and ttft.note == "P95 TTFT from 2 request(s) (needs at least 20)"
    assert e2el.met is True and e2el.note is None
    assert tpot.met is None and tpot.observed is None
    assert tpot.note == "no streamed request produced more than one output token"
    assert tok_s.met is True and tok_s.note is None
    assert p99.met is None and p99.observed is None and p99.note == "no streamed request completed"


# ---------------------------------------------------------------------------------------------- a whole run
class ThinTrials:
    """Trials of six streamed requests each: P95 TTFT from 12 requests per configuration (of 2 trials)."""

    def __init__(self):
        self.rng = np.random.default_rng(5)

    def __call__(self, config, *, trial_id, step, role, repeat) -> TrialResult:
        faster = config.engine.args.get("parallel") == 4
        counts = {"ttft.n": 6, "itl.n": 6, "requests.streamed": 6, "requests.nonstreamed": 0, "requests.completed": 6}
        s = sample(self.rng, n=6, ttft_ms=100 if faster else 200, scalars=counts)
        summary = {"ttft.p95": float(np.percentile(s.values["ttft"], 95)), "errors.rate": 0.0, **counts}
        trial = scripted_trial(
            config,
            trial_id=trial_id,
            step=step,
            role=role,
            repeat=repeat,
            summary=summary,
        )
        return TrialResult(trial, sample=s)


def test_a_run_on_thin_samples_records_the_counts_and_says_so(tmp_path):
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2}
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}]
    path = tmp_path / "thin.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    outcome = TuningRun(
        load_playbook(path),
        RunOptions(archive_root=tmp_path / "r"),
        report=lambda line: None,
        measure_trial=ThinTrials(),
    ).execute()
    assert verify(outcome.run_dir) == []
    (verdict,) = outcome.verdicts
    assert "P95 TTFT rests on 12 requests per side (needs at least 20)" in verdict.reason
    gate = next(g for g in outcome.gates if g.metric == "ttft.p95")
    assert gate.note == "P95 TTFT from 12 request(s) (needs at least 20)"
    rows = outcome.tuning_record
    assert all(row.samples["ttft.n"] == 12 and row.samples["requests.streamed"] == 12 for row in rows)
    # the archive keeps the notes and counts, and reads them back
    archived = ArchivedRun.open(outcome.run_dir)
    assert next(g for g in archived.gates() if g.metric == "ttft.p95").note == gate.note
    assert archived.verdicts()[0].objective.n_candidate == 12
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert manifest["tuning_record"][0]["samples"]["ttft.n"] == 12


@pytest.mark.parametrize("n", [0, 1, 19])
def test_decisions_never_fail_on_few_or_no_requests(n):
    rng = np.random.default_rng(n)
    a = [sample(rng, n=n) for _ in range(2)]
    b = [sample(rng, n=n, streamed=False) for _ in range(2)]
    goals = Goals(objective=Objective("minimize", "ttft.p99", 0.02), guards=(Guard("tpot.p95", 0.1, "minimize"),))
    d = decide_step(a, b, goals, TRIALS)
    assert d.verdict == INCONCLUSIVE and d.reason


def test_an_objective_from_a_zero_baseline_is_inconclusive_and_says_why():
    rng = np.random.default_rng(6)
    a = [sample(rng) for _ in range(2)]
    b = [TrialSample(10.0, s.values, 200, 20) for s in (sample(rng), sample(rng))]  # errors from none
    d = decide_step(a, b, Goals(objective=Objective("minimize", "errors.rate", 0.02)), TRIALS)
    assert d.verdict == INCONCLUSIVE
    assert d.reason.startswith("error rate not comparable: the objective has no relative change or interval")


def test_pooled_counts_from_samples_and_from_archived_summaries_agree():
    """One rule for pooled counts (samples.summed_counts): the run's samples and the report's trial summaries."""
    from llmplay.loadgen.records import RequestRecord, records_to_dataframe
    from llmplay.metrics import summarize
    from llmplay.stats.decide import sample_from_records, summed_counts

    def rec(i: int, *, stream: bool = True, warmup: bool = False, error: str | None = None) -> RequestRecord:
        sent = 1_000_000_000 + i * 10_000_000
        done = error is None
        return RequestRecord(
            index=i,
            is_warmup=warmup,
            stream=stream,
            scheduled_ns=sent,
            sent_ns=sent,
            first_chunk_ns=sent + 5_000_000 if done else None,
            first_content_ns=sent + 5_000_000 if done else None,
            chunk_ns=(sent + 5_000_000, sent + 6_000_000, sent + 7_000_000) if done and stream else (),
            end_ns=sent + 7_000_000 if done else None,
            input_tokens=5,
            output_tokens=3 if done else 0,
            output_tokens_source="usage",
            finish_reason="length" if done else None,
            http_status=200 if done else 500,
            error_kind=error,
            error_message=error,
            queue_wait_s=0.0,
        )

    trials = [
        [rec(0, warmup=True), rec(1), rec(2, stream=False), rec(3, error="http_5xx")],
        [rec(0), rec(1), rec(2), rec(3, stream=False), rec(4, error="timeout")],
    ]
    summaries = [summarize(records, 1.0).as_dict() for records in trials]
    samples = [
        sample_from_records(records_to_dataframe(records), 1.0, summary, {}, 0.0)
        for records, summary in zip(trials, summaries, strict=True)
    ]
    from_samples = pooled_counts(samples)
    assert from_samples == summed_counts(summaries)
    assert (
        from_samples["ttft.n"] == 4 and from_samples["requests.total"] == 8 and from_samples["requests.completed"] == 6
    )
    assert [s.n_errors for s in samples] == [1, 1] and [s.n_requests for s in samples] == [3, 5]
    assert summed_counts([summaries[0], {}]) == {} and summed_counts([]) == {}
