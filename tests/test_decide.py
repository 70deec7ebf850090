"""Statistics on synthetic samples with known effects: real effects found, null effects not kept, guards bite."""

from __future__ import annotations

import numpy as np
import pytest

from llmplay.archive.model import INCONCLUSIVE, KEPT, REJECTED, MetricDelta
from llmplay.loadgen.records import RequestRecord, records_to_dataframe
from llmplay.metrics import summarize
from llmplay.spec import Gate, Goals, Guard, Objective, Trials
from llmplay.tuning import decide
from llmplay.tuning.decide import (
    BEYOND,
    HOLDS,
    UNSETTLED,
    TrialSample,
    compare_metric,
    decide_step,
    evaluate_gates,
    guard_outcome,
    metric_value,
    regressed_beyond,
    sample_from_records,
)

TRIALS = Trials(repeats=3, bootstrap_samples=400)


def trial(rng, *, ttft_ms=100.0, tok_s=1000.0, n=200, duration=20.0, noise=0.03, errors=0):
    scale = 1 + rng.normal(0, noise)  # trial-to-trial drift
    ttft = rng.lognormal(np.log(ttft_ms / 1000 * scale), 0.3, n)
    out_tokens = np.full(n, tok_s * duration * scale / n)
    return TrialSample(
        duration_s=duration,
        n_requests=n + errors,
        n_errors=errors,
        values={
            "ttft": ttft,
            "tpot": ttft / 10,
            "e2el": ttft * 5,
            "itl": ttft / 10,
            "output_tokens": out_tokens,
            "total_tokens": out_tokens * 3,
            "good": np.ones(n),
        },
        price_usd_per_hour=1.0,
    )


def goals(direction="maximize", metric="throughput.output_tok_s", guards=()):
    return Goals(objective=Objective(direction, metric, 0.02), guards=tuple(guards))


def test_true_throughput_effect_is_kept():
    rng = np.random.default_rng(1)
    a = [trial(rng) for _ in range(3)]
    b = [trial(rng, tok_s=1300) for _ in range(3)]
    d = decide_step(a, b, goals(), TRIALS)
    assert d.verdict == KEPT, d.reason
    assert d.objective.ci_low > 0.15 and d.reason.startswith("output tokens/s +")
    assert d.reason.endswith("no guard regressed; kept")


def test_true_latency_effect_is_kept_when_minimizing():
    rng = np.random.default_rng(2)
    a = [trial(rng) for _ in range(3)]
    b = [trial(rng, ttft_ms=60) for _ in range(3)]
    d = decide_step(a, b, goals("minimize", "ttft.p95"), TRIALS)
    assert d.verdict == KEPT and d.objective.rel_change < -0.3


def test_null_effect_is_mostly_not_kept():
    kept = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        a = [trial(rng) for _ in range(3)]
        b = [trial(rng) for _ in range(3)]
        d = decide_step(a, b, goals(), TRIALS, seed=seed)
        kept += d.verdict == KEPT
        assert d.verdict in (KEPT, REJECTED, INCONCLUSIVE)
    assert kept <= 2


def test_inconclusive_says_how_many_more_trials():
    rng = np.random.default_rng(5)
    a = [trial(rng, noise=0.15) for _ in range(2)]
    b = [trial(rng, noise=0.15, tok_s=1080) for _ in range(2)]
    d = decide_step(a, b, goals(), TRIALS)
    if d.verdict == INCONCLUSIVE:
        assert d.more_trials_needed >= 1 and "more trial" in d.reason


def test_guard_regression_rejects_despite_objective_gain():
    rng = np.random.default_rng(3)
    a = [trial(rng) for _ in range(3)]
    b = [trial(rng, tok_s=1500, ttft_ms=200) for _ in range(3)]
    d = decide_step(a, b, goals(guards=[Guard("ttft.p95", 0.10, "minimize")]), TRIALS)
    assert d.verdict == REJECTED
    assert "beyond its 10% tolerance" in d.reason


def test_worse_objective_is_rejected():
    rng = np.random.default_rng(4)
    a = [trial(rng) for _ in range(3)]
    b = [trial(rng, tok_s=700) for _ in range(3)]
    assert decide_step(a, b, goals(), TRIALS).verdict == REJECTED


def test_all_candidate_trials_failed_is_failed():
    rng = np.random.default_rng(6)
    d = decide_step([trial(rng)], [], goals(), TRIALS, failed_candidate_trials=2)
    assert d.verdict == "failed" and "failed (2)" in d.reason


def test_metric_values_follow_definitions():
    rng = np.random.default_rng(7)
    s = trial(rng, n=100, duration=10, noise=0)
    assert metric_value([s], "throughput.output_tok_s") == pytest.approx(1000)
    assert metric_value([s], "throughput.req_s") == pytest.approx(10)
    assert metric_value([s], "ttft.p95") == pytest.approx(np.percentile(s.values["ttft"], 95))
    assert metric_value([s], "cost.usd_per_1m_tokens") == pytest.approx(1.0 / (1000 * 3600) * 1e6)
    errs = TrialSample(10, s.values, 110, 10)
    assert metric_value([errs], "errors.rate") == pytest.approx(10 / 110)


def test_gates_with_margins():
    results = evaluate_gates(
        [
            Gate("ttft.p95", "<", 0.5, "ttft.p95 < 500ms"),
            Gate("throughput.output_tok_s", ">", 3000, "throughput.output_tok_s > 3000"),
            Gate("memory.peak_frac", "<", 0.9, "memory.peak_frac < 90%"),
        ],
        {"ttft.p95": 0.4, "throughput.output_tok_s": 2400},
    )
    assert [r.met for r in results] == [True, False, None]
    assert results[0].margin == pytest.approx(0.2) and results[1].margin == pytest.approx(-0.2)


def test_compare_metric_zero_to_zero_is_no_change():
    rng = np.random.default_rng(8)
    d = compare_metric([trial(rng)], [trial(rng)], "errors.rate", n_boot=100)
    assert d.rel_change == 0.0 and d.better is None


def test_time_windows_give_throughput_a_real_interval_even_with_fixed_lengths():
    rng = np.random.default_rng(9)

    def windowed(tok_s):
        s = trial(rng, tok_s=tok_s, noise=0)
        per_window = rng.normal(tok_s * 2, tok_s * 0.2, 10)  # 10 windows of 2 s
        return TrialSample(20.0, {**s.values, "window_output_tokens": per_window}, s.n_requests, 0)

    d = compare_metric(
        [windowed(1000), windowed(1000)], [windowed(1000), windowed(1000)], "throughput.output_tok_s", n_boot=300
    )
    assert d.ci_low < 0 < d.ci_high and d.ci_high - d.ci_low > 0.02


def test_one_trial_per_side_never_decides():
    rng = np.random.default_rng(10)
    d = decide_step([trial(rng)], [trial(rng, tok_s=3000)], goals(), TRIALS)
    assert d.verdict == INCONCLUSIVE and "a single run misleads" in d.reason


def test_decision_goodput_follows_the_summary_definition():
    """Non-streamed requests: TTFT is their E2EL and TPOT is undefined, in the summary and the decision alike."""

    def rec(i, stream, ttft_ms, e2el_ms, out=10):
        sent = 1_000_000_000 + i * 1_000_000
        first = sent + int(ttft_ms * 1e6)
        return RequestRecord(
            index=i,
            is_warmup=False,
            stream=stream,
            scheduled_ns=sent,
            sent_ns=sent,
            first_chunk_ns=first,
            first_content_ns=first,
            chunk_ns=(first,),
            end_ns=sent + int(e2el_ms * 1e6),
            input_tokens=5,
            output_tokens=out,
            output_tokens_source="usage",
            finish_reason="length",
            http_status=200,
            error_kind=None,
            error_message=None,
            queue_wait_s=0.0,
        )

    # non-streamed: first text after 50 ms but the whole body after 400 ms -> its TTFT is 400 ms
    records = [rec(0, True, 50, 100), rec(1, False, 50, 400), rec(2, True, 50, 3000), rec(3, False, 50, 150)]
    slo = {"ttft": 0.2, "tpot": 0.1}
    summary = summarize(records, 10.0, slo).as_dict()
    sample = sample_from_records(records_to_dataframe(records), 10.0, summary, slo, 0.0)
    assert metric_value([sample], "goodput.req_s") == pytest.approx(summary["goodput.req_s"]) == pytest.approx(0.2)


def test_guard_rule_is_non_inferiority_and_any_worsening_from_zero_fails():
    """The one guard rule decide and compare share: a point beyond tolerance fails, the CI's worse bound within it
    holds, anything between is unsettled; from a baseline of 0 any worsening fails."""

    def delta(a, b, rel, lo, hi):
        return MetricDelta("ttft.p95", a, b, rel, lo, hi)

    assert guard_outcome(delta(1.0, 1.3, 0.3, 0.2, 0.4), True, 0.1) == BEYOND
    assert guard_outcome(delta(1.0, 1.3, 0.3, -0.05, 0.6), True, 0.1) == BEYOND  # a wide CI does not excuse it
    assert guard_outcome(delta(1.0, 1.05, 0.05, 0.04, 0.06), True, 0.1) == HOLDS
    assert guard_outcome(delta(1.0, 1.05, 0.05, -0.1, 0.2), True, 0.1) == UNSETTLED  # worse bound +20% > 10%
    assert guard_outcome(delta(1.0, 0.95, -0.05, -0.2, 0.1), False, 0.1) == UNSETTLED  # worse bound -20%
    assert guard_outcome(delta(1.0, 1.05, 0.05, None, None), True, 0.1) == UNSETTLED  # no interval: not shown
    assert guard_outcome(delta(1.0, 0.7, -0.3, -0.4, -0.2), False, 0.1) == BEYOND
    assert guard_outcome(delta(None, 0.05, None, None, None), True, 0.5) is None
    assert regressed_beyond(delta(1.0, 1.3, 0.3, None, None), lower_is_better=True, tolerance=0.1)
    assert not regressed_beyond(delta(1.0, 1.05, 0.05, -0.1, 0.2), lower_is_better=True, tolerance=0.1)
    assert regressed_beyond(delta(0.0, 0.05, None, None, None), lower_is_better=True, tolerance=0.5)
    assert not regressed_beyond(delta(0.0, 0.05, None, None, None), lower_is_better=False, tolerance=0.5)
    assert not regressed_beyond(delta(None, 0.05, None, None, None), lower_is_better=True, tolerance=0.5)


def _fixed(objective: MetricDelta, guards: tuple[MetricDelta, ...] = ()):
    """decide_step with its comparisons replaced by the given deltas (objective first, then guards in order)."""
    by_metric = {objective.metric: objective, **{g.metric: g for g in guards}}

    def compare(a, b, metric, **_):
        return by_metric.get(metric, MetricDelta(metric, None, None, None, None, None))

    return compare


def _decide_with_throughput_guard(monkeypatch, objective: MetricDelta, guard: MetricDelta):
    """decide_step on 3 trials a side whose objective and 15% throughput guard compare as given."""
    monkeypatch.setattr(decide, "compare_metric", _fixed(objective, (guard,)))
    rng = np.random.default_rng(1)
    g = Goals(
        objective=Objective("minimize", "ttft.p95", 0.02),
        guards=(Guard("throughput.output_tok_s", 0.15, "maximize"),),
    )
    return decide_step([trial(rng) for _ in range(3)], [trial(rng) for _ in range(3)], g, TRIALS)


def test_the_cpu_tiny_guard_case_is_rejected_not_kept(monkeypatch):
    """parallel-4 in a real cpu-tiny run: output tok/s -15.8% [-32.5%, +3.3%] against a 15% guard tolerance."""
    obj = MetricDelta("ttft.p95", 1.0, 0.6, -0.4, -0.5, -0.3)
    guard = MetricDelta("throughput.output_tok_s", 100.0, 84.2, -0.158, -0.325, 0.033)
    d = _decide_with_throughput_guard(monkeypatch, obj, guard)
    assert d.verdict == REJECTED and "no guard regressed" not in d.reason
    assert "output tokens/s -15.8% [-32.5%, +3.3%] beyond its 15% tolerance" in d.reason


def test_a_guard_whose_worse_bound_passes_the_tolerance_leaves_the_step_inconclusive(monkeypatch):
    obj = MetricDelta("ttft.p95", 1.0, 0.6, -0.4, -0.5, -0.3)
    guard = MetricDelta("throughput.output_tok_s", 100.0, 95.0, -0.05, -0.25, 0.15)
    d = _decide_with_throughput_guard(monkeypatch, obj, guard)
    assert d.verdict == INCONCLUSIVE, d.reason
    # Worse-side half-width 20 points against 10 points of room: 3 * 2^2 = 12 trials, so 9 more.
    assert (
        "guard output tokens/s -5.0% [-25.0%, +15.0%] not shown within its 15% tolerance (its worse bound -25.0%), "
        "about 9 more trial(s) per side would settle it" in d.reason
    )
    assert d.reason.endswith("not kept while a guard is unsettled") and d.more_trials_needed == 9


def test_more_trials_use_the_threshold_that_decides(monkeypatch):
    """Point +1.9%, CI [-3%, +7%], min_effect 2%: only the CI's top falling under 2% decides, 0.1 points away."""
    rng = np.random.default_rng(1)
    a, b = [trial(rng) for _ in range(3)], [trial(rng) for _ in range(3)]
    near = MetricDelta("throughput.output_tok_s", 100.0, 101.9, 0.019, -0.03, 0.07)
    monkeypatch.setattr(decide, "compare_metric", _fixed(near))
    d = decide_step(a, b, goals(), TRIALS)
    assert d.verdict == INCONCLUSIVE and "18 more" not in d.reason and d.more_trials_needed is None
    assert d.reason.endswith("within noise, not decidable within 50 more trial(s) per side")
    # Above min_effect, keeping needs the CI's bottom above zero: half-width 5 points against +4%: 3 * 1.25^2 = 4.7, so 2.
    far = MetricDelta("throughput.output_tok_s", 100.0, 104.0, 0.04, -0.01, 0.08)
    monkeypatch.setattr(decide, "compare_metric", _fixed(far))
    d = decide_step(a, b, goals(), TRIALS)
    assert d.verdict == INCONCLUSIVE and d.more_trials_needed == 2, d.reason
    assert "about 2 more trial(s) per side would decide it" in d.reason


def test_errors_from_zero_fail_the_errors_guard():
    rng = np.random.default_rng(5)
    a = [trial(rng) for _ in range(3)]
    b = [trial(rng, tok_s=1300, errors=20) for _ in range(3)]
    d = decide_step(a, b, goals(guards=(Guard("errors.rate", 0.5, "minimize"),)), TRIALS)
    assert d.verdict == REJECTED and "error rate from 0 to 9.1%, beyond its 50% tolerance" in d.reason


def test_cost_follows_price_and_throughput():
    rng = np.random.default_rng(6)
    sample = trial(rng, tok_s=1000.0)
    priced = TrialSample(sample.duration_s, sample.values, sample.n_requests, sample.n_errors, price_usd_per_hour=3.6)
    unpriced = TrialSample(sample.duration_s, sample.values, sample.n_requests, sample.n_errors)
    tok_s = metric_value([priced], "throughput.output_tok_s")
    assert metric_value([priced], "cost.usd_per_1m_tokens") == pytest.approx(3.6 / (tok_s * 3600) * 1e6)
    assert metric_value([unpriced], "cost.usd_per_1m_tokens") is None
