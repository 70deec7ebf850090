"""Power of the decisions' t intervals (stats.power) and what an undecided step says it could still hide."""

from __future__ import annotations

import math

import pytest

from llmplay.stats.intervals import paired_effect
from llmplay.stats.power import detectable, hidden_effect, t_power, units_for, z_power

# A true -10 % at per-trial log-SD .05 with 3 pairs: a pair's log ratio has SD .05 * sqrt 2.
GAP = -math.log(0.9)
SE = 0.05 * math.sqrt(2) / math.sqrt(3)


@pytest.mark.parametrize(("df", "power"), [(10, 0.644), (20, 0.690), (30, 0.705)])
def test_t_power_is_the_oracle_results_md_quotes(df, power):
    assert t_power(GAP, SE, df, 0.95) == pytest.approx(power, abs=0.002)


def test_the_known_variance_ceiling_and_the_inverse():
    assert z_power(GAP, SE, 0.95) == pytest.approx(0.734, abs=0.002)
    gap = detectable(SE, 10, 0.95)
    assert t_power(gap, SE, 10, 0.95) == pytest.approx(0.8, abs=1e-6)
    n = units_for(GAP, 0.05 * math.sqrt(2), 0.95)
    assert n is not None and t_power(GAP, 0.05 * math.sqrt(2 / n), n - 1, 0.95) >= 0.8
    assert t_power(GAP, 0.05 * math.sqrt(2 / (n - 1)), n - 2, 0.95) < 0.8


def test_an_undecided_step_says_what_it_could_hide_and_what_would_show_its_minimum_effect():
    base = [0.100, 0.104, 0.097, 0.101, 0.099]
    ratios = [0.97, 1.12, 0.88, 1.05, 0.93]  # -3 % mean, spread about 10 % a pair
    effect = paired_effect(base, [a * r for a, r in zip(base, ratios, strict=True)], 0.95)
    text = hidden_effect(effect, 0.10, True, 0.95)
    assert text is not None and text.startswith("an effect smaller than ")
    assert "could not be told from noise with these 5 pairs; " in text and text.endswith("pairs would show 10%")
    smallest = float(text.split("smaller than ")[1].split("%")[0]) / 100
    assert t_power(-math.log1p(-smallest), effect.se, effect.df, 0.95) == pytest.approx(0.8, abs=0.01)
    pairs = int(text.split("; ")[1].split(" ")[0])
    assert pairs > 5


def test_auto_sizes_a_step_for_its_minimum_effect_and_guards_within_the_budget():
    from llmplay.spec import Goals, Guard, Objective, Trials
    from llmplay.stats.intervals import Noise
    from llmplay.stats.power import auto_pairs

    trials = Trials(repeats=3, sequential=True, max_repeats=6, max_repeats_auto=True)
    goals = Goals(objective=Objective("minimize", "ttft.p95", 0.10))
    assert auto_pairs(goals, trials, {}, 0.0) == (6, "max_repeats auto: no noise known yet, 6 pairs at most")
    alone, why = auto_pairs(goals, trials, {"ttft.p95": Noise(2 * 0.05**2, 30)}, 0.0)
    assert 5 <= alone <= 9 and why.endswith("power at the 10% minimum effect")
    assert 75 <= int(why.split(" pairs for ")[1].split("%")[0]) <= 85
    guarded = Goals(objective=goals.objective, guards=(Guard("throughput.output_tok_s", 0.15, "maximize"),))
    noise = {"ttft.p95": Noise(2 * 0.05**2, 30), "throughput.output_tok_s": Noise(2 * 0.15**2, 30)}
    more, _ = auto_pairs(guarded, trials, noise, 0.0)
    assert more > 3 * alone  # the guard, not the objective, sets the size
    capped, why = auto_pairs(guarded, Trials(**{**vars(trials), "budget_s": 600.0}), noise, 30.0)
    assert capped == 10 and f"{more} pairs would give 80% power; the 10 min budget affords 10 (30 s a trial)" in why


def test_auto_takes_the_size_whose_power_is_nearest_80_percent_when_whole_pairs_jump_past_it():
    from llmplay.spec import Goals, Objective, Trials
    from llmplay.stats.intervals import Noise
    from llmplay.stats.power import auto_pairs

    # 20 % at sigma .05: 3 pairs show it 78 % of the time, 4 pairs 96 % (benchmarks/planning.py); 3 is nearer 80 %.
    trials = Trials(repeats=3, sequential=True, max_repeats=6, max_repeats_auto=True)
    goals = Goals(objective=Objective("minimize", "ttft.p95", 0.20))
    size, why = auto_pairs(goals, trials, {"ttft.p95": Noise(2 * 0.05**2, 30)}, 0.0)
    assert size == 3 and why == "max_repeats auto: 3 pairs for 78% power at the 20% minimum effect"


@pytest.mark.parametrize(
    ("trials", "problem"),
    [
        ("{repeats: 3, max_repeats: auto}", "max_repeats: auto without sequential: true"),
        ("{repeats: 3, sequential: true, budget: 10m}", "budget without max_repeats: auto"),
        ("{noise: step, pool_noise: true}", "noise: step with pool_noise: true"),
        ("{noise: often}", "noise"),
    ],
)
def test_bad_trials_noise_and_auto_are_refused(tmp_path, trials, problem):
    from llmplay.errors import PlaybookError
    from llmplay.playbook.load import load_playbook

    path = tmp_path / "p.yaml"
    path.write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: p}\n"
        "engine: {kind: llamacpp, model: /models/tiny.gguf}\nworkload: {concurrency: 1, num_requests: 3}\n"
        f"trials: {trials}\n"
    )
    with pytest.raises(PlaybookError, match="trials"):
        load_playbook(path)
    try:
        load_playbook(path)
    except PlaybookError as exc:
        assert problem in str(exc) and "p.yaml:" in str(exc)


def test_noise_history_and_auto_load(tmp_path):
    from llmplay.playbook.load import load_playbook

    path = tmp_path / "p.yaml"
    path.write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: p}\n"
        "engine: {kind: llamacpp, model: /models/tiny.gguf}\nworkload: {concurrency: 1, num_requests: 3}\n"
        "trials: {repeats: 3, sequential: true, max_repeats: auto, budget: 30m, noise: history}\n"
    )
    t = load_playbook(path).trials
    assert t.noise == "history" and t.pool_noise and t.max_repeats_auto and t.budget_s == 1800 and t.max_repeats == 6
    path.write_text(path.read_text().replace(", max_repeats: auto, budget: 30m, noise: history", ", pool_noise: true"))
    t = load_playbook(path).trials
    assert t.noise == "run" and not t.max_repeats_auto  # a playbook of before: pool_noise is noise: run
