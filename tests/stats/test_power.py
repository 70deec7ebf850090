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
