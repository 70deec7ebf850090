"""The verdict rules of issue 24: guards reject only on evidence, Holm across a step's guards, rates in points with a
count interval, borrowed noise, and what a verdict is worth. Each through decide_step, the function the runner calls."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from llmplay.archive.model import INCONCLUSIVE, KEPT, REJECTED
from llmplay.archive.verdicts import error_rates_text
from llmplay.errors import PlaybookError
from llmplay.playbook.load import load_playbook
from llmplay.spec import Goals, Guard, Objective, Trials
from llmplay.stats.decide import TrialSample, decide_step
from llmplay.stats.intervals import Noise, holm, moderate, newcombe_difference, newcombe_p_above

ROOT = Path(__file__).resolve().parents[2]
PAIRED = Trials(repeats=3, interleave=True)


def sample(repeat: int, *, ttft: float, tok_s: float = 1000.0, tpot: float = 0.02, errors: int = 0, n: int = 600):
    ok = n - errors
    return TrialSample(
        duration_s=20.0,
        values={
            "ttft": np.full(8, ttft),
            "tpot": np.full(8, tpot),
            "output_tokens": np.full(ok, tok_s * 20.0 / ok),
            "total_tokens": np.full(ok, 2 * tok_s * 20.0 / ok),
        },
        n_requests=n,
        n_errors=errors,
        repeat=repeat,
    )


def ttft_goals(*guards: Guard) -> Goals:
    return Goals(objective=Objective("minimize", "ttft.p95", 0.02), guards=guards)


ERRORS_1PP = Guard("errors.rate", 0.01, "minimize", absolute=True)
NOISE = (0.97, 1.04, 0.99)


def test_newcombe_matches_the_published_example():
    # Newcombe (1998), Table II, example (a): 56/70 against 48/80, hybrid score interval 0.0524 to 0.3339.
    diff, low, high = newcombe_difference(48, 80, 56, 70, 0.95)
    assert diff == pytest.approx(0.8 - 0.6)
    assert low == pytest.approx(0.0524, abs=5e-4) and high == pytest.approx(0.3339, abs=5e-4)
    # Not degenerate at zero errors on both sides: 600 requests cannot show a rate within 0.5 points.
    _, low0, high0 = newcombe_difference(0, 600, 0, 600, 0.95)
    assert low0 < 0 < high0 and high0 > 0.005
    assert newcombe_p_above(0, 1800, 60, 1800, 0.01) < 0.025 < newcombe_p_above(0, 1800, 20, 1800, 0.01)


def test_one_failed_request_in_600_neither_rejects_nor_is_ignored():
    a = [sample(r, ttft=0.1 * NOISE[r]) for r in range(3)]
    b = [sample(r, ttft=0.07 * NOISE[r], errors=1 if r == 0 else 0) for r in range(3)]
    d = decide_step(a, b, ttft_goals(ERRORS_1PP), PAIRED)
    assert d.verdict == KEPT, d.reason
    error_delta = d.guards[0]
    assert error_delta.points == pytest.approx(1 / 1800) and error_delta.points_high < 0.01
    # Ten times the errors on the candidate: shown beyond a 1-point tolerance, rejected.
    b_bad = [sample(r, ttft=0.07 * NOISE[r], errors=24) for r in range(3)]
    bad = decide_step(a, b_bad, ttft_goals(ERRORS_1PP), PAIRED)
    assert bad.verdict == REJECTED and "error rate +4pp" in bad.reason and "beyond its 1pp tolerance" in bad.reason


def test_a_relative_tolerance_on_a_rate_is_refused_at_validate_with_the_fix(tmp_path):
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["goals"]["guards"] = [{"metric": "errors.rate", "tolerance": "0%"}]
    path = tmp_path / "rate.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(PlaybookError) as caught:
        load_playbook(path)
    message = str(caught.value)
    assert f"{path}:" in message and "goals.guards[0].tolerance" in message and "tolerance: 0.5pp" in message
    # An archived playbook of the old rule still loads (compare and retest judge it by the rule it ran with).
    guard = load_playbook(path, archived=True).goals.guards[0]
    assert guard.tolerance == 0.0 and not guard.absolute


def test_a_guard_past_its_tolerance_in_point_only_leaves_the_step_inconclusive():
    # Throughput -20% in point against a 15% tolerance, but the trials disagree: not shown beyond, not within.
    a = [sample(r, ttft=0.1 * NOISE[r]) for r in range(3)]
    b = [sample(r, ttft=0.07 * NOISE[r], tok_s=1000 * f) for r, f in enumerate((0.62, 0.95, 0.85))]
    d = decide_step(a, b, ttft_goals(Guard("throughput.output_tok_s", 0.15, "maximize")), PAIRED)
    assert d.verdict == INCONCLUSIVE and "not shown within its 15% tolerance" in d.reason


def test_holm_takes_the_steps_guards_together():
    assert holm([0.01, 0.04], 0.025) == [True, False]
    assert holm([0.02, 0.024], 0.025) == [False, False]  # each alone would pass at 0.025, together neither does
    assert holm([0.001, 0.012], 0.025) == [True, True]


def test_moderated_variance_borrows_when_steps_agree_and_keeps_its_own_when_they_do_not():
    alike = [Noise(0.010, 2), Noise(0.012, 2), Noise(0.009, 2), Noise(0.011, 2)]
    var, df = moderate(Noise(0.002, 2), alike)
    # pooled: all the steps' degrees of freedom, no more; the variance near theirs, far above this step's own
    assert df == pytest.approx(10) and 0.005 < var < 0.02
    apart = [Noise(1e-5, 2), Noise(1.0, 2), Noise(1e-4, 2), Noise(3.0, 2)]
    var2, df2 = moderate(Noise(0.05, 2), apart)
    assert df2 < 4 and var2 == pytest.approx(0.05, rel=0.6)
    assert moderate(Noise(0.05, 2), ()) == (0.05, 2.0)


def test_pool_noise_judges_a_step_on_the_runs_degrees_of_freedom():
    a = [sample(r, ttft=0.1 * f) for r, f in enumerate((1.0, 1.06, 0.95))]
    b = [sample(r, ttft=0.09 * f) for r, f in enumerate((1.02, 1.0, 0.97))]
    borrowed = {"ttft.p95": [Noise(0.0025, 2)] * 4}
    alone = decide_step(a, b, ttft_goals(), PAIRED, borrowed=borrowed)  # pool_noise off: borrowed is ignored
    pooled = decide_step(a, b, ttft_goals(), Trials(repeats=3, pool_noise=True), borrowed=borrowed)
    assert "moderated" not in (alone.objective.method or "") and "moderated over 5 steps" in pooled.objective.method
    width = lambda d: math.log1p(d.objective.ci_high) - math.log1p(d.objective.ci_low)  # noqa: E731
    assert width(pooled) < width(alone)
    assert pooled.noise["ttft.p95"].df == 2  # what later steps borrow is the step's own spread


def test_the_run_says_what_its_verdicts_are_worth():
    text = error_rates_text([KEPT, REJECTED, INCONCLUSIVE, KEPT], 0.95, True)
    assert text.startswith("4 step(s), 3 decided (2 kept, 1 rejected)")
    assert "wrong at most 5% of the time" in text and "sequential looks included" in text
    assert "at most 0.15 false decision(s) expected across the run" in text
