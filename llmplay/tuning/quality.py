"""The quality guard in the run: which steps it judges (the playbook's quality.* guards, or a knob known to risk
accuracy), a step's decision once its probes' answers are compared with the reference's (stats.quality), and
retest's line when an archived run's greedy outputs changed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from llmplay.archive.probes import archived_probes
from llmplay.catalog import QUALITY_METRICS, label_of
from llmplay.loadgen.probes import ProbeResult
from llmplay.spec import ChangeEffect, Goals, Guard, QualitySpec
from llmplay.stats.decide import Decision
from llmplay.stats.quality import (
    NO_PROBES,
    QualityFigure,
    apply_quality_guards,
    compare_probes,
    describe_quality,
    quality_delta,
    quality_figures,
)

# Knobs whose change can alter what the model says: a step setting one gets the quality guard by default.
ACCURACY_RISK_KNOBS: frozenset[str] = frozenset(
    {
        "kv_cache_dtype",
        "cache_type_k",
        "cache_type_v",
        "quantization",
        "dtype",
        "image",
        "speculative",
        "speculative_model",
        "draft_model",
        "num_speculative_tokens",
        "model",
    }
)


def risks_accuracy(knobs: Iterable[str]) -> bool:
    return any(k in ACCURACY_RISK_KNOBS for k in knobs)


def quality_guards_for(
    spec: QualitySpec | None, declared: Sequence[Guard], step_knobs: Iterable[str]
) -> tuple[tuple[Guard, ...], bool]:
    """The quality guards a step is judged by, and whether they were added by default (the report says so):
    the playbook's own quality.* guards, else, for a knob known to risk accuracy, the quality block's defaults."""
    own = tuple(g for g in declared if g.metric in QUALITY_METRICS)
    if spec is None or own:
        return own, False
    if risks_accuracy(step_knobs):
        return spec.default_guards, True
    return (), False


def speed_goals(goals: Goals) -> Goals:
    """The goals decide_step judges from the timed trials: quality.* guards are judged here, from the probes."""
    return replace(goals, guards=tuple(g for g in goals.guards if g.metric not in QUALITY_METRICS))


def judge_quality(
    decision: Decision,
    goals: Goals,
    baseline: Sequence[ProbeResult] | None,
    candidate: Sequence[ProbeResult] | None,
    effects: Iterable[ChangeEffect],
) -> Decision:
    """The step's decision once its outputs are compared with the reference's (goals.quality); unchanged without it.
    A check the engine cannot measure is named with why in the verdict sentence, never read as zero."""
    spec = goals.quality
    if spec is None:
        return decision
    knobs = [str(e.target).rpartition(".")[2] for e in effects]
    guards, by_default = quality_guards_for(spec, goals.guards, knobs)
    if baseline is None or candidate is None:
        figures = {m: QualityFigure(m, None, None, None, 0, NO_PROBES) for m in QUALITY_METRICS}
    else:
        figures = quality_figures(compare_probes(baseline, candidate))
    wanted = {*spec.checks, *(g.metric for g in guards)}
    deltas = {m: quality_delta(f) for m, f in figures.items() if m in wanted}
    absent = {m: f.absent for m, f in figures.items() if f.absent}
    judged = apply_quality_guards(decision, deltas, guards, by_default=by_default, absent=absent)
    unguarded = [m for m in absent if m in wanted and m not in {g.metric for g in guards}]
    notes = "".join(f"; {label_of(m)} not measured ({absent[m]})" for m in unguarded)
    return replace(judged, reason=judged.reason + notes) if notes else judged


def changed_outputs(old_run: Path, old_config: str, new_run: Path, new_config: str) -> str | None:
    """For retest: a line saying the greedy outputs changed between two archived runs ("exact match 2/3 ..."), or
    None when they are the same or either run took no probes."""
    old, new = archived_probes(old_run, old_config), archived_probes(new_run, new_config)
    if old is None or new is None:
        return None
    comparisons = compare_probes(old, new)
    figures = quality_figures(comparisons)
    if all(c.exact for c in comparisons):
        return None
    parts = [describe_quality(quality_delta(f)) for f in figures.values() if f.value is not None]
    first = next(c for c in comparisons if not c.exact)
    return (
        f"greedy outputs changed on {sum(not c.exact for c in comparisons)}/{len(comparisons)} probe(s): "
        + "; ".join(parts)
        + f"; first at probe {first.index + 1}, token {first.split_token}: {first.baseline!r} -> {first.candidate!r}"
    )
