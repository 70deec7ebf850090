"""Statistics on synthetic samples with known effects: real effects found, null effects not kept, guards bite."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from llmplay.archive.model import INCONCLUSIVE, KEPT, REJECTED, MetricDelta
from llmplay.loadgen.records import RequestRecord, records_to_dataframe
from llmplay.metrics import summarize
from llmplay.spec import Gate, Goals, Guard, Objective, Trials
from llmplay.stats import decide
from llmplay.stats.decide import (
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
from llmplay.stats.intervals import PAIRED_LOG, Effect, paired_effect, sequential_level, sequential_levels

TRIALS = Trials(repeats=3)


def trial(rng, *, ttft_ms=100.0, tok_s=1000.0, n=200, duration=20.0, noise=0.03, errors=0, repeat=None, scale=None):
    scale = 1 + rng.normal(0, noise) if scale is None else scale  # trial-to-trial drift
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
        repeat=repeat,
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
        d = decide_step(a, b, goals(), TRIALS)
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
    d = compare_metric([trial(rng), trial(rng)], [trial(rng), trial(rng)], "errors.rate")
    assert d.rel_change == 0.0 and d.better is None and (d.ci_low, d.ci_high) == (0.0, 0.0)


def test_one_trial_per_side_never_decides():
    rng = np.random.default_rng(10)
    d = decide_step([trial(rng)], [trial(rng, tok_s=3000)], goals(), TRIALS)
    assert d.verdict == INCONCLUSIVE and "at least 2 are needed to decide" in d.reason


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
    # A point beyond with a wide CI is not evidence: the regression may be within tolerance.
    assert guard_outcome(delta(1.0, 1.3, 0.3, -0.05, 0.6), True, 0.1) == UNSETTLED
    assert guard_outcome(delta(1.0, 1.05, 0.05, 0.04, 0.06), True, 0.1) == HOLDS
    assert guard_outcome(delta(1.0, 1.05, 0.05, -0.1, 0.2), True, 0.1) == UNSETTLED  # worse bound +20% > 10%
    assert guard_outcome(delta(1.0, 0.95, -0.05, -0.2, 0.1), False, 0.1) == UNSETTLED  # worse bound -20%
    assert guard_outcome(delta(1.0, 1.05, 0.05, None, None), True, 0.1) == UNSETTLED  # no interval: not shown
    assert guard_outcome(delta(1.0, 0.7, -0.3, -0.4, -0.2), False, 0.1) == BEYOND
    assert guard_outcome(delta(None, 0.05, None, None, None), True, 0.5) is None
    assert not regressed_beyond(delta(1.0, 1.3, 0.3, None, None), lower_is_better=True, tolerance=0.1)
    assert not regressed_beyond(delta(1.0, 1.05, 0.05, -0.1, 0.2), lower_is_better=True, tolerance=0.1)
    assert regressed_beyond(delta(0.0, 0.05, None, None, None), lower_is_better=True, tolerance=0.5)
    assert not regressed_beyond(delta(0.0, 0.05, None, None, None), lower_is_better=False, tolerance=0.5)
    assert not regressed_beyond(delta(None, 0.05, None, None, None), lower_is_better=True, tolerance=0.5)


def _effect_of(delta: MetricDelta, units: int = 3, level: float = 0.95) -> Effect:
    """The paired log-ratio interval a delta with this change and CI would come from (units pairs)."""
    lo, hi = math.log1p(delta.ci_low), math.log1p(delta.ci_high)
    se = (hi - lo) / 2 / stats.t.ppf(0.5 + level / 2, units - 1)
    return Effect(delta.rel_change, delta.ci_low, delta.ci_high, units, PAIRED_LOG, level, se, units - 1)


def _fixed(objective: MetricDelta, guards: tuple[MetricDelta, ...] = ()):
    """decide_step with its comparisons replaced by the given deltas (objective first, then guards in order)."""
    by_metric = {objective.metric: objective, **{g.metric: g for g in guards}}

    def compare(a, b, metric, *_):
        delta = by_metric.get(metric, MetricDelta(metric, None, None, None, None, None))
        return delta, (_effect_of(delta) if delta.ci_low is not None else None)

    return compare


def _decide_with_throughput_guard(monkeypatch, objective: MetricDelta, guard: MetricDelta):
    """decide_step on 3 trials a side whose objective and 15% throughput guard compare as given."""
    monkeypatch.setattr(decide, "compare_trials", _fixed(objective, (guard,)))
    rng = np.random.default_rng(1)
    g = Goals(
        objective=Objective("minimize", "ttft.p95", 0.02),
        guards=(Guard("throughput.output_tok_s", 0.15, "maximize"),),
    )
    return decide_step([trial(rng) for _ in range(3)], [trial(rng) for _ in range(3)], g, TRIALS)


def test_the_cpu_tiny_guard_case_is_neither_kept_nor_rejected(monkeypatch):
    """parallel-4 in a real cpu-tiny run: output tok/s -15.8% [-32.5%, +3.3%] against a 15% guard tolerance. Its point
    is past the tolerance, but the interval reaches +3.3%: no regression beyond 15% is shown, nor is one ruled out."""
    obj = MetricDelta("ttft.p95", 1.0, 0.6, -0.4, -0.5, -0.3)
    guard = MetricDelta("throughput.output_tok_s", 100.0, 84.2, -0.158, -0.325, 0.033)
    d = _decide_with_throughput_guard(monkeypatch, obj, guard)
    assert d.verdict == INCONCLUSIVE and "no guard regressed" not in d.reason
    assert "output tokens/s -15.8% [-32.5%, +3.3%] not shown within its 15% tolerance" in d.reason


def test_a_guard_whose_better_bound_is_past_the_tolerance_rejects(monkeypatch):
    obj = MetricDelta("ttft.p95", 1.0, 0.6, -0.4, -0.5, -0.3)
    guard = MetricDelta("throughput.output_tok_s", 100.0, 70.0, -0.30, -0.40, -0.20)
    d = _decide_with_throughput_guard(monkeypatch, obj, guard)
    assert d.verdict == REJECTED
    assert "output tokens/s -30.0% [-40.0%, -20.0%] beyond its 15% tolerance" in d.reason


def test_a_guard_whose_worse_bound_passes_the_tolerance_leaves_the_step_inconclusive(monkeypatch):
    obj = MetricDelta("ttft.p95", 1.0, 0.6, -0.4, -0.5, -0.3)
    guard = MetricDelta("throughput.output_tok_s", 100.0, 95.0, -0.05, -0.25, 0.15)
    d = _decide_with_throughput_guard(monkeypatch, obj, guard)
    assert d.verdict == INCONCLUSIVE, d.reason
    # On the log scale the worse half-width is 0.214 against 0.111 of room to -15%; t_2 = 4.30 falls to t_4 = 2.78 as
    # pairs are added, so 5 pairs suffice (2.78 * 0.0861 / sqrt(5) = 0.107): 2 more, where 1/sqrt(n) alone says 9.
    assert d.more_trials_needed == 2
    assert (
        "guard output tokens/s -5.0% [-25.0%, +15.0%] not shown within its 15% tolerance (its worse bound -25.0%), "
        "about 2 more trial(s) per side would settle it" in d.reason
    )
    assert d.reason.endswith("not kept while a guard is unsettled")


def test_more_trials_use_the_threshold_that_decides(monkeypatch):
    """Point +1.9%, CI [-3%, +7%], min_effect 2%: only the CI's top falling under 2% decides, 0.1 points away."""
    rng = np.random.default_rng(1)
    a, b = [trial(rng) for _ in range(3)], [trial(rng) for _ in range(3)]
    near = MetricDelta("throughput.output_tok_s", 100.0, 101.9, 0.019, -0.03, 0.07)
    monkeypatch.setattr(decide, "compare_trials", _fixed(near))
    d = decide_step(a, b, goals(), TRIALS)
    assert d.verdict == INCONCLUSIVE and "18 more" not in d.reason and d.more_trials_needed is None
    assert "within noise, not decidable within 50 more trial(s) per side; an effect smaller than" in d.reason
    # Above min_effect, keeping needs the CI's bottom above zero: the half-width must shrink from ~5 points to 4.
    far = MetricDelta("throughput.output_tok_s", 100.0, 104.0, 0.04, -0.01, 0.08)
    monkeypatch.setattr(decide, "compare_trials", _fixed(far))
    d = decide_step(a, b, goals(), TRIALS)
    assert d.verdict == INCONCLUSIVE and d.more_trials_needed == 1, d.reason
    assert "about 1 more trial(s) per side would decide it" in d.reason


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


# ---------------------------------------------------------------- the trial (or the A/B pair) is the unit
def _pairs(rng, n_pairs, *, effect=1.0, metric_noise=0.015, shared=None, **kw):
    """n_pairs interleaved A/B pairs; `shared` drift moves both trials of a pair alike (the machine's minute)."""
    a, b = [], []
    for r in range(n_pairs):
        common = shared[r] if shared is not None else 1.0
        a.append(trial(rng, scale=common * (1 + rng.normal(0, metric_noise)), repeat=r, **kw))
        b_kw = {**kw, "tok_s": kw.get("tok_s", 1000.0) * effect}
        b.append(trial(rng, scale=common * (1 + rng.normal(0, metric_noise)), repeat=r, **b_kw))
    return a, b


def test_the_paired_interval_is_the_t_interval_of_per_pair_log_ratios():
    rng = np.random.default_rng(20)
    a, b = _pairs(rng, 4)
    d = compare_metric(a, b, "throughput.output_tok_s", level=0.95, paired=True)
    ratios = np.log([metric_value([y], d.metric) / metric_value([x], d.metric) for x, y in zip(a, b, strict=True)])
    half = stats.t.ppf(0.975, 3) * ratios.std(ddof=1) / 2
    assert d.rel_change == pytest.approx(math.expm1(ratios.mean()))
    assert (d.ci_low, d.ci_high) == pytest.approx((math.expm1(ratios.mean() - half), math.expm1(ratios.mean() + half)))
    assert (d.units, d.method, d.confidence) == (4, PAIRED_LOG, 0.95)


def test_a_throughput_interval_reflects_the_spread_between_trials_not_ramp_windows():
    """Between-trial CV 1.5%: the A/A interval is a few percent wide (time windows with ramp-up and drain made it
    [-21%, +20%])."""
    rng = np.random.default_rng(21)
    a, b = _pairs(rng, 3)
    d = compare_metric(a, b, "throughput.output_tok_s", paired=True)
    assert d.ci_low < 0 < d.ci_high and d.ci_high - d.ci_low < 0.15


def test_long_trials_with_drift_get_an_interval_as_wide_as_the_drift():
    """2,000 requests per trial and 5% per-trial drift: the spread of trials, not the request count, sets the width."""
    covered = 0
    for seed in range(200):
        rng = np.random.default_rng(1000 + seed)
        a = [trial(rng, n=2000, noise=0.05, repeat=r) for r in range(3)]
        b = [trial(rng, n=2000, noise=0.05, repeat=r) for r in range(3)]
        d = compare_metric(a, b, "ttft.p95", paired=True)
        covered += d.ci_low <= 0 <= d.ci_high
    assert 0.91 <= covered / 200 <= 0.99  # resampling requests inside trials covered 82.5%


def test_itl_percentiles_are_one_value_per_trial():
    """ITL gaps cluster by request; a trial's P99 over its own gaps is the unit, whatever the number of gaps."""
    rng = np.random.default_rng(22)
    a, b = _pairs(rng, 3, metric_noise=0.05)
    d = compare_metric(a, b, "itl.p99", paired=True)
    per_pair = np.log([metric_value([y], "itl.p99") / metric_value([x], "itl.p99") for x, y in zip(a, b, strict=True)])
    assert d.units == 3 and d.rel_change == pytest.approx(math.expm1(per_pair.mean()))


def test_drift_shared_by_a_pair_cancels_when_paired():
    """The machine slows by 20% and speeds up again; both trials of each pair see it. Paired: a 10% gain is kept;
    the same trials unpaired cannot tell it from the drift."""
    rng = np.random.default_rng(23)
    a, b = _pairs(rng, 3, effect=1.1, metric_noise=0.005, shared=[0.8, 1.0, 1.2], noise=0.0)
    paired = decide_step(a, b, goals(), TRIALS)
    assert paired.verdict == KEPT, paired.reason
    unpaired = decide_step(a, b, goals(), Trials(repeats=3, interleave=False))
    assert unpaired.verdict == INCONCLUSIVE, unpaired.reason
    assert unpaired.objective.method.startswith("Welch")


def test_a_pair_with_a_failed_trial_is_left_out_whole():
    rng = np.random.default_rng(24)
    a, b = _pairs(rng, 3)
    d = compare_metric(a, [b[0], b[2]], "throughput.output_tok_s", paired=True)
    assert d.units == 2


def test_paired_t_covers_at_three_pairs():
    rng = np.random.default_rng(25)
    hits = 0
    for _ in range(3000):
        a = np.exp(rng.normal(0, 0.05, 3))
        b = a * np.exp(0.1 + rng.normal(0, 0.05, 3))
        e = paired_effect(a, b, 0.95)
        hits += e.low <= math.expm1(0.1) <= e.high
    assert 0.935 <= hits / 3000 <= 0.965


def test_sequential_looks_keep_their_error_rate():
    """Looking after 3, 4, ... 8 pairs at the confidence level each time is wrong about a quarter more often than
    the level says; at sequential_levels the chance of any false decision over all looks stays at 5%, strict at
    the first looks and near the fixed design's level at the last (O'Brien-Fleming's shape)."""
    levels = sequential_levels(0.95, 3, 8)
    assert len(levels) == 6 and all(x > y for x, y in itertools.pairwise(levels))
    assert levels[0] > 0.99 and 0.95 < levels[-1] < 0.975 and sequential_levels(0.95, 3, 3) == (0.95,)
    rng = np.random.default_rng(26)
    naive = corrected = 0
    for _ in range(1500):
        d = rng.normal(0, 1, 8)
        a, b = np.ones(8), np.exp(d * 0.05)

        def decides(lv, a=a, b=b):
            for n in range(3, 9):
                e = paired_effect(a[:n], b[:n], lv if isinstance(lv, float) else lv[n - 3])
                if e.low > 0 or e.high < 0:
                    return True
            return False

        naive += decides(0.95)
        corrected += decides(levels)
    assert corrected / 1500 <= 0.065 and naive / 1500 > 0.08


def test_the_stopping_check_and_the_verdict_are_one_computation():
    """Sequential mode: decide_step at the design's level, no seeds; called twice on the same trials, one answer."""
    rng = np.random.default_rng(27)
    a, b = _pairs(rng, 4, effect=1.03)
    seq = Trials(repeats=3, sequential=True, max_repeats=8)
    first, again = decide_step(a, b, goals(), seq), decide_step(a, b, goals(), seq)
    assert (first.verdict, first.reason) == (again.verdict, again.reason)
    assert first.objective.confidence == pytest.approx(sequential_level(0.95, 3, 8, 4))


def test_a_capacity_pair_whose_search_pinned_nothing_is_left_out_and_named():
    """A capacity search that ran out of time unpinned has no value to pair: the verdict rests on the other pairs
    and names the ones it left out, so a short search on a busy machine reads as such, never as a gain or loss."""
    rng = np.random.default_rng(7)

    def with_capacity(repeat, users):
        base = trial(rng, repeat=repeat)
        scalars = {} if users is None else {"capacity.concurrency": users}
        return TrialSample(base.duration_s, base.values, base.n_requests, base.n_errors, scalars, 1.0, repeat)

    a = [with_capacity(0, 2.0), with_capacity(1, 2.1), with_capacity(2, 1.9)]
    b = [with_capacity(0, 6.0), with_capacity(1, None), with_capacity(2, 5.8)]
    capacity = goals(metric="capacity.concurrency")
    verdict = decide_step(a, b, capacity, TRIALS)
    assert verdict.objective is not None and verdict.objective.units == 2
    assert "1 of 3 pair(s) left out" in verdict.reason and "pair 1 (candidate)" in verdict.reason

    none_pinned = [with_capacity(0, None), with_capacity(1, None)]
    verdict = decide_step(a[:2], none_pinned, capacity, TRIALS)
    assert verdict.verdict == INCONCLUSIVE
    assert "2 of 2 pair(s) left out" in verdict.reason, verdict.reason
    assert verdict.objective is not None and not verdict.objective.units  # no pair left to rest an interval on
