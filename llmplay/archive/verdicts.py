"""What a run's verdicts are worth, in words: said by the runner on the console and by the report of any archive,
so the words live here, below both (the decision rules themselves are stats.decide's).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmplay.archive.model import KEPT, REJECTED

__all__ = ["error_rates_text", "kept_means"]


def kept_means(min_effect: float, confidence: float) -> str:
    """What "kept" promises, said next to each kept step."""
    return (
        f"kept means: the objective's {confidence:.0%} interval clears 0, its point is at least the {min_effect:.0%} "
        "minimum effect, and every guard's worse bound is within its tolerance; it does not mean the gain is at "
        "least the minimum effect with that confidence"
    )


def error_rates_text(verdicts: Sequence[str], confidence: float, sequential: bool) -> str:
    """The run's verdicts and what they are worth: each decision's error bound and the false decisions to expect.

    Per step, keeping a candidate with no real gain, rejecting one whose gain is at least min_effect with every guard
    within tolerance, and rejecting through a guard that is exactly at its tolerance each happen at most
    (1 - confidence) / 2 of the time (one tail of the interval; Holm across the guards; sequential looks inside the
    same boundary), so a step's verdict is wrong at most 1 - confidence of the time. An upper bound, for the worst
    true effects; at other effects the errors are rarer."""
    decided = [v for v in verdicts if v in (KEPT, REJECTED)]
    tail = (1.0 - confidence) / 2
    looks = ", sequential looks included" if sequential else ""
    return (
        f"{len(verdicts)} step(s), {len(decided)} decided ({decided.count(KEPT)} kept, {decided.count(REJECTED)} "
        f"rejected); each verdict is wrong at most {1 - confidence:.0%} of the time ({tail:.1%} for a keep without "
        f"a gain, {tail:.1%} for a rejection through a guard at its tolerance or of a gain at the minimum effect"
        f"{looks}): at most {len(decided) * (1 - confidence):.2g} false decision(s) expected across the run"
    )
