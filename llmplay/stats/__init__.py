"""The decision statistics: what a step's A/B trials, `compare` and `history` decide with.

A trial is the experimental unit (`samples`: its figures and the pooled counts); one metric's change and interval
(`comparison`, on `intervals`: paired or Welch t, Newcombe for rates, sequential levels, pooled noise); the guard
rule, a non-inferiority claim (`guards`); a step's verdict and the gates (`decide`). Imports nothing above
`metrics`; the records it makes (`MetricDelta`, `GateResult`, the verdict names) live in `llmplay.outcomes`.
"""

from llmplay.stats.decide import (
    BEYOND,
    HOLDS,
    UNSETTLED,
    Decision,
    TrialSample,
    compare_metric,
    decide_step,
    decision_level,
    describe_delta,
    evaluate_gates,
    guard_outcome,
    pooled_summary,
    regressed_beyond,
    sample_from_records,
)
from llmplay.stats.intervals import Effect, Noise, newcombe_difference, t_mean_interval, welch_effect, wilson_interval

__all__ = [
    "BEYOND",
    "HOLDS",
    "UNSETTLED",
    "Decision",
    "Effect",
    "Noise",
    "TrialSample",
    "compare_metric",
    "decide_step",
    "decision_level",
    "describe_delta",
    "evaluate_gates",
    "guard_outcome",
    "newcombe_difference",
    "pooled_summary",
    "regressed_beyond",
    "sample_from_records",
    "t_mean_interval",
    "welch_effect",
    "wilson_interval",
]
