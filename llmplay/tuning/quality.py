"""The quality guard: greedy probes sent to a running engine, per-probe comparison with the baseline's outputs,
the quality.* figures with confidence intervals over probes, and their say in a step's verdict."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from llmplay.archive.layout import MANIFEST, safe_name
from llmplay.archive.model import INCONCLUSIVE, KEPT, REJECTED, MetricDelta
from llmplay.archive.paths import MAX_MANIFEST_BYTES, OutsideError, read_bytes_inside, read_text_inside
from llmplay.catalog import QUALITY_METRICS, fmt_full, label_of
from llmplay.errors import ArchiveError
from llmplay.spec import Goals, Guard, QualitySpec
from llmplay.stats.decide import Decision
from llmplay.stats.guards import BEYOND, HOLDS, guard_outcome
from llmplay.stats.intervals import t_mean_interval, wilson_interval

# Why the logprob shift can be missing, in the words the verdict and the report use.
NO_LOGPROBS = "the engine returned no log-probabilities for the probes"
NO_PROBES = "no probe result on one side (its trials failed, or the engine answered no probe)"

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


@dataclass(frozen=True)
class ProbeResult:
    """One probe's greedy answer: its text, its tokens and, where the engine gives them, their log-probabilities."""

    prompt: str
    text: str
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...] | None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "text": self.text,
            "tokens": list(self.tokens),
            "logprobs": None if self.logprobs is None else list(self.logprobs),
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ProbeResult:
        lp = raw.get("logprobs")
        return cls(
            raw["prompt"], raw["text"], tuple(raw["tokens"]), None if lp is None else tuple(lp), raw.get("error")
        )


def _probe_request(api: str, model: str, prompt: str, max_tokens: int, top: int) -> tuple[str, dict[str, Any]]:
    # temperature 0 and a fixed seed: greedy decoding, so any change in the answer comes from the configuration.
    common: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0}
    if api == "chat":
        body = {**common, "messages": [{"role": "user", "content": prompt}], "logprobs": True, "top_logprobs": top}
        return "/v1/chat/completions", body
    return "/v1/completions", {**common, "prompt": prompt, "logprobs": top}


def _parse_answer(api: str, prompt: str, doc: Mapping[str, Any]) -> ProbeResult:
    choice = (doc.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") if api == "chat" else choice.get("text")
    text = text or ""
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if content:
        tokens = tuple(str(c.get("token", "")) for c in content)
        values = [c.get("logprob") for c in content]
        logprobs = tuple(float(v) for v in values) if all(isinstance(v, (int, float)) for v in values) else None
        return ProbeResult(prompt, text, tokens, logprobs)
    legacy = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else None
    if legacy and legacy.get("tokens"):  # the OpenAI completions shape: parallel tokens / token_logprobs lists
        values = legacy.get("token_logprobs") or []
        ok = len(values) == len(legacy["tokens"]) and all(isinstance(v, (int, float)) for v in values)
        return ProbeResult(prompt, text, tuple(legacy["tokens"]), tuple(values) if ok else None)
    # No token list: the text's characters stand in for tokens, so agreement still means "reproduced up to here".
    return ProbeResult(prompt, text, tuple(text), None)


def run_probes(
    client: httpx.Client, api: str, model: str, prompts: Sequence[str], max_tokens: int, top_logprobs: int = 1
) -> list[ProbeResult]:
    """Each prompt once, greedily, in order; a probe the engine refuses is kept with its error, never dropped."""
    results = []
    for prompt in prompts:
        path, body = _probe_request(api, model, prompt, max_tokens, top_logprobs)
        try:
            response = client.post(path, json=body)
            response.raise_for_status()
            results.append(_parse_answer(api, prompt, response.json()))
        except (httpx.HTTPError, ValueError) as exc:
            results.append(ProbeResult(prompt, "", (), None, error=f"{type(exc).__name__}: {exc}"[:300]))
    return results


# ---------------------------------------------------------------------------------------------- per probe
@dataclass(frozen=True)
class ProbeComparison:
    """One probe on both sides: same answer?, the share of the baseline's tokens reproduced before the first
    divergence, and the mean |Δ logprob| over that agreed prefix (None where a side has no log-probabilities)."""

    index: int
    prompt: str
    baseline: str
    candidate: str
    exact: bool
    agreement: float
    split_token: int | None  # index of the first differing token; None when they agree throughout
    logprob_shift: float | None


def compare_probe(index: int, a: ProbeResult, b: ProbeResult) -> ProbeComparison:
    n = 0
    for ta, tb in zip(a.tokens, b.tokens, strict=False):
        if ta != tb:
            break
        n += 1
    same = a.text == b.text and a.tokens == b.tokens
    agreement = 1.0 if not a.tokens else n / len(a.tokens)
    split = None if same else n
    shift = None
    if a.logprobs is not None and b.logprobs is not None:
        # Up to the split both sides scored the same tokens, so their log-probabilities compare one to one; at
        # least the first token is always shared context (the same prompt), so a shift exists for every probe.
        k = max(1, min(n + (0 if same else 1), len(a.logprobs), len(b.logprobs)))
        if len(a.logprobs) and len(b.logprobs):
            shift = float(np.mean(np.abs(np.array(a.logprobs[:k]) - np.array(b.logprobs[:k]))))
    return ProbeComparison(index, a.prompt, a.text, b.text, same, agreement, split, shift)


def compare_probes(baseline: Sequence[ProbeResult], candidate: Sequence[ProbeResult]) -> list[ProbeComparison]:
    """Probe by probe, in order; probes that errored on either side are left out (they say nothing of outputs)."""
    return [
        compare_probe(i, a, b)
        for i, (a, b) in enumerate(zip(baseline, candidate, strict=False))
        if a.error is None and b.error is None
    ]


# ---------------------------------------------------------------------------------------------- over probes
@dataclass(frozen=True)
class QualityFigure:
    """A quality.* figure of a candidate against its baseline: the value, its CI over probes, or why it is absent."""

    metric: str
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n_probes: int
    absent: str | None = None


def t_interval(values: Sequence[float], confidence: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """Student-t interval of a mean over probes (the probes are the experimental unit), clipped to `bounds`."""
    low, high = t_mean_interval(values, confidence)
    return max(bounds[0], low), min(bounds[1], high)


def quality_figures(comparisons: Sequence[ProbeComparison], confidence: float = 0.95) -> dict[str, QualityFigure]:
    """quality.exact_match (Wilson), quality.token_agreement and quality.logprob_shift (t over probes)."""
    n = len(comparisons)
    if n == 0:
        return {m: QualityFigure(m, None, None, None, 0, NO_PROBES) for m in QUALITY_METRICS}
    hits = sum(c.exact for c in comparisons)
    lo, hi = wilson_interval(hits, n, confidence)
    out = {"quality.exact_match": QualityFigure("quality.exact_match", hits / n, lo, hi, n)}
    agreement = [c.agreement for c in comparisons]
    lo, hi = t_interval(agreement, confidence, (0.0, 1.0))
    out["quality.token_agreement"] = QualityFigure("quality.token_agreement", float(np.mean(agreement)), lo, hi, n)
    shifts = [c.logprob_shift for c in comparisons if c.logprob_shift is not None]
    if len(shifts) < n:
        out["quality.logprob_shift"] = QualityFigure("quality.logprob_shift", None, None, None, n, NO_LOGPROBS)
    else:
        lo, hi = t_interval(shifts, confidence, (0.0, math.inf))
        out["quality.logprob_shift"] = QualityFigure("quality.logprob_shift", float(np.mean(shifts)), lo, hi, n)
    return out


# The baseline compared with itself: every probe identical, no shift. The guard's reference point.
_SELF = {"quality.exact_match": 1.0, "quality.token_agreement": 1.0, "quality.logprob_shift": 0.0}


def quality_delta(figure: QualityFigure) -> MetricDelta:
    """A quality figure as the MetricDelta guards and the archive take. The baseline side is the baseline against
    itself (100% match, no shift); the change is absolute, in the metric's own unit (a share, or nats for the
    shift), since a relative change from 0 nats means nothing. Its CI is the figure's CI over probes."""
    base = _SELF[figure.metric]
    if figure.value is None:
        return MetricDelta(figure.metric, base, None, None, None, None, n_baseline=figure.n_probes)
    lo = None if figure.ci_low is None else figure.ci_low - base
    hi = None if figure.ci_high is None else figure.ci_high - base
    change = figure.value - base
    better = None if change == 0 else change < 0 if figure.metric == "quality.logprob_shift" else change > 0
    return MetricDelta(
        figure.metric,
        base,
        figure.value,
        change,
        lo,
        hi,
        better=better,
        n_baseline=figure.n_probes,
        n_candidate=figure.n_probes,
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


def _describe(delta: MetricDelta) -> str:
    """The candidate's figure with its CI over probes, e.g. "... 62.0% [48.1%, 75.9%]"."""
    text = f"{label_of(delta.metric)} {fmt_full(delta.metric, delta.candidate)}"
    if delta.ci_low is None or delta.ci_high is None or delta.baseline is None:
        return text
    low, high = (fmt_full(delta.metric, bound + delta.baseline) for bound in (delta.ci_low, delta.ci_high))
    return f"{text} [{low}, {high}]"


def apply_quality_guards(
    decision: Decision,
    quality_deltas: Mapping[str, MetricDelta],
    guards: Sequence[Guard],
    *,
    by_default: bool = False,
    absent: Mapping[str, str] | None = None,
) -> Decision:
    """The step decision with its quality guards applied: a quality regression beyond tolerance rejects the step
    and is named as the reason; a quality guard that is not measured keeps the step from being kept (nobody saw
    the outputs stay the same). Tolerances are absolute, in the metric's unit (5% agreement, 0.05 nats)."""
    checked = [quality_deltas[g.metric] for g in guards if g.metric in quality_deltas]
    deltas = (*decision.deltas, *(d for d in quality_deltas.values() if d not in decision.deltas))
    out = replace(decision, guards=(*decision.guards, *checked), deltas=deltas)
    if decision.verdict not in (KEPT, INCONCLUSIVE, REJECTED) or not guards:
        return out
    note = " (quality guard added by default: the knob can change outputs)" if by_default else ""
    beyond, missing = [], []
    for g in guards:
        delta = quality_deltas.get(g.metric)
        lower = g.metric == "quality.logprob_shift"
        # guard_outcome takes relative changes; ours are absolute, so hand it the absolute change as "relative".
        outcome = None if delta is None else guard_outcome(delta, lower, g.tolerance)
        if outcome == BEYOND:
            beyond.append(f"{_describe(delta)} beyond its {g.tolerance:g} tolerance")  # type: ignore[arg-type]
        elif outcome is None:
            missing.append(f"{label_of(g.metric)} not measured ({(absent or {}).get(g.metric, NO_PROBES)})")
        elif outcome != HOLDS and decision.verdict == KEPT:
            missing.append(f"{_describe(delta)} not yet within its {g.tolerance:g} tolerance")  # type: ignore[arg-type]
    if beyond:
        return replace(out, verdict=REJECTED, reason=f"quality regressed: {'; '.join(beyond)}{note}; {decision.reason}")
    if missing and decision.verdict == KEPT:
        return replace(out, verdict=INCONCLUSIVE, reason=f"quality guard unsettled: {'; '.join(missing)}{note}")
    if note:
        return replace(out, reason=decision.reason + note)
    return out


def speed_goals(goals: Goals) -> Goals:
    """The goals decide_step judges from the timed trials: quality.* guards are judged here, from the probes."""
    return replace(goals, guards=tuple(g for g in goals.guards if g.metric not in QUALITY_METRICS))


def judge_quality(
    decision: Decision,
    goals: Goals,
    baseline: Sequence[ProbeResult] | None,
    candidate: Sequence[ProbeResult] | None,
    effects: Iterable[Any],
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


PROBES_FILE = "probes.json"


def load_probes(run_dir: Path, trial_id: str) -> tuple[ProbeResult, ...] | None:
    """The probe answers a trial archived (RunArchive.write_probes); None when it took none."""
    try:  # the trial id comes from a manifest: the path it makes must stay inside the run (archive.paths)
        text = read_text_inside(Path(run_dir), f"trials/{safe_name(trial_id)}/{PROBES_FILE}")
    except OutsideError as exc:
        if exc.missing:
            return None
        raise ArchiveError(f"{run_dir}: {exc}") from None
    return tuple(ProbeResult.from_dict(row) for row in json.loads(text))


def archived_probes(run_dir: Path, config_id: str) -> tuple[ProbeResult, ...] | None:
    """The probe answers of `config_id`'s first ok trial that took them in an archived run; None when there are none."""
    try:
        manifest = json.loads(read_bytes_inside(Path(run_dir), MANIFEST, max_bytes=MAX_MANIFEST_BYTES))
    except OutsideError as exc:
        raise ArchiveError(f"{run_dir}: {exc}") from None
    except ValueError as exc:
        raise ArchiveError(f"{run_dir}: {MANIFEST}: not readable JSON ({exc})") from None
    trials = manifest.get("trials") if isinstance(manifest, dict) else None
    for trial in trials if isinstance(trials, list) else []:
        if not isinstance(trial, dict):
            continue
        if trial.get("config_id") == config_id and trial.get("status") == "ok":
            found = load_probes(Path(run_dir), str(trial["trial_id"]))
            if found is not None:
                return found
    return None


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
    parts = [_describe(quality_delta(f)) for f in figures.values() if f.value is not None]
    first = next(c for c in comparisons if not c.exact)
    return (
        f"greedy outputs changed on {sum(not c.exact for c in comparisons)}/{len(comparisons)} probe(s): "
        + "; ".join(parts)
        + f"; first at probe {first.index + 1}, token {first.split_token}: {first.baseline!r} -> {first.candidate!r}"
    )
