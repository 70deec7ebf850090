"""Choosing the tuner's next step: a pure function of the incumbent's findings, its figures and gates, the engine's
knob map, what was tried already and the tune policy, returning every candidate ranked or skipped, each with its
reason. Nothing here runs an engine; the loop runs what this returns.

The order (issue 39, CHECKLIST §7): first whether the remedy bears on the binding gate (the failed gate furthest
from its threshold, else the objective); then the bottleneck the findings show: how severe the most severe finding
calling for it is, and its place in that finding's own suggestion (a persistent queue names the batch before prefix
caching: the queue is what a batch cures, caching only shortens each request's turn); then the checklist's
cost-effectiveness order, between remedies standing equally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmplay.archive.model import Finding
from llmplay.engines.base import Engine
from llmplay.engines.knobs import CHECKLIST_ORDER, Direction, KnobSpec, Remedy, Risk, knobs_for
from llmplay.outcomes import INCONCLUSIVE, KEPT, REJECTED, GateResult
from llmplay.spec import Objective, Scalar

# Which metric families (a metric path's first part) each remedy can move: a remedy for the binding one ranks first.
_QUEUEING = frozenset({"ttft", "e2el", "throughput", "requests", "cost", "errors"})
HELPS: Mapping[Remedy, frozenset[str]] = {
    Remedy.CONTINUOUS_BATCHING: _QUEUEING,
    Remedy.PREFIX_CACHING: frozenset({"ttft", "e2el", "throughput", "requests", "cost"}),
    Remedy.MAX_BATCH: _QUEUEING,
    Remedy.CONCURRENCY_CAP: frozenset({"errors", "tpot", "itl", "e2el", "memory"}),
    Remedy.KV_MEMORY: frozenset({"errors", "ttft", "e2el", "throughput", "memory"}),
    Remedy.CHUNKED_PREFILL: frozenset({"itl", "tpot", "ttft"}),
    Remedy.CONTEXT_LENGTH: frozenset({"errors", "memory", "throughput"}),
    Remedy.CUDA_GRAPHS: frozenset({"tpot", "itl", "e2el", "throughput"}),
    Remedy.KV_DTYPE: frozenset({"throughput", "ttft", "e2el", "errors", "cost", "memory"}),
    Remedy.WEIGHT_QUANTIZATION: frozenset({"tpot", "itl", "e2el", "ttft", "throughput", "cost", "memory"}),
    Remedy.SCALE_OUT: frozenset({"ttft", "tpot", "itl", "e2el", "throughput", "requests", "errors", "memory"}),
}
_SEVERITY = {"critical": 0, "warn": 1, "info": 2}
# Achieved prefix reuse at least this share of what the workload offers: prefix caching has nothing left to win.
REUSE_ACHIEVED_SHARE = 0.8


@dataclass(frozen=True)
class Tried:
    """A remedy's knob tried before: in this tuning session ("round 2") or, from the archive, an earlier run on the
    same engine and image ("run 20261206T…")."""

    remedy: Remedy
    knob: str
    verdict: str  # kept | rejected | inconclusive | failed
    where: str
    this_session: bool = True


@dataclass(frozen=True)
class TunePolicy:
    """What the playbook's `tune:` section allows (names are knobs or remedies; an empty allow list allows all)."""

    allow: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()
    quality_guarded: bool = False  # the playbook judges outputs (goals.quality or a quality.* guard)
    values: Mapping[str, tuple[Scalar, ...]] = field(default_factory=dict)  # per-knob values replacing the map's
    retry_rejected: bool = False  # try a remedy rejected twice before (in history) once more


@dataclass(frozen=True)
class RankInput:
    """Everything the ranking reads about the incumbent."""

    findings: Sequence[Finding]
    args: Mapping[str, Scalar]  # the incumbent engine's knobs as set (absent: the engine's default)
    summary: Mapping[str, float]  # its pooled figures (prefix_reuse.*, ...)
    gates: Sequence[GateResult]
    objective: Objective
    concurrency: int | None = None  # closed-loop users of the load, the most slots worth having


@dataclass(frozen=True)
class Ranked:
    """One candidate step: ranked (`rank` 1 is tried next) or skipped, with why either way."""

    remedy: Remedy
    direction: Direction
    knob: str | None  # None: no knob of this engine implements it
    values: tuple[Scalar, ...]  # one: a fixed change; several (numeric): a value search
    findings: tuple[str, ...]  # the ids of the findings calling for it
    evidence: str
    reason: str
    rank: int | None = None  # None: skipped
    risk: Risk = Risk.SAFE
    bears_on_binding: bool = False

    @property
    def skipped(self) -> bool:
        return self.rank is None


def binding_metric(gates: Sequence[GateResult], objective: Objective) -> tuple[str, str]:
    """(metric, why): the failed gate furthest from its threshold, else the objective."""
    failed = [g for g in gates if g.met is False]
    if failed:
        worst = min(failed, key=lambda g: g.margin if g.margin is not None else 0.0)
        return worst.metric, f"gate {worst.gate} fails"
    return objective.metric, f"objective: {objective.direction} {objective.metric}"


@dataclass
class _Called:
    """A remedy as the findings call for it: by whom, and its standing in the most severe one (severity, then its
    place in that finding's suggestion)."""

    direction: Direction
    findings: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    standing: tuple[int, int] = (9, 99)
    standing_in: str = ""  # the finding that standing is in

    @property
    def standing_text(self) -> str:
        """ "warn" for a finding's first remedy, "warn; 2nd of queue.persistent's" further down its suggestion."""
        severity = {v: k for k, v in _SEVERITY.items()}.get(self.standing[0], "info")
        place = self.standing[1] + 1
        if place == 1:
            return severity
        nth = {2: "2nd", 3: "3rd"}.get(place, f"{place}th")
        return f"{severity}; {nth} of {self.standing_in}'s remedies"


def _called_for(findings: Sequence[Finding]) -> dict[Remedy, _Called]:
    called: dict[Remedy, _Called] = {}
    for finding in findings:
        for position, cand in enumerate(finding.candidates):
            entry = called.setdefault(cand.remedy, _Called(cand.direction))
            if finding.id not in entry.findings:
                entry.findings.append(finding.id)
                entry.evidence.append(f"{finding.id}: {cand.evidence}")
            standing = (_SEVERITY.get(finding.severity, 2), position)
            if standing < entry.standing:
                entry.standing, entry.standing_in = standing, finding.id
    return called


def _current(spec: KnobSpec, args: Mapping[str, Scalar]) -> Scalar:
    for name in (spec.knob, *spec.also):
        if args.get(name) is not None:
            return args[name]
    return spec.default


def _name_in(spec: KnobSpec, args: Mapping[str, Scalar]) -> str:
    """The knob's name as the incumbent sets it (llama.cpp's `max_num_seqs` for `parallel`), so a step changes that."""
    return next((name for name in (spec.knob, *spec.also) if args.get(name) is not None), spec.knob)


def _onward(spec: KnobSpec, current: Scalar, values: tuple[Scalar, ...], users: int | None) -> tuple[Scalar, ...]:
    """The values worth trying from `current` in the remedy's direction (a raise stops at the load's users)."""
    if not spec.numeric or not isinstance(current, int | float) or isinstance(current, bool) or current < 0:
        return tuple(v for v in values if v != current)
    if spec.direction is Direction.LOWER:
        return tuple(v for v in values if isinstance(v, int | float) and v < current)
    above = [v for v in values if isinstance(v, int | float) and v > current]
    if users and spec.remedy is Remedy.MAX_BATCH:
        enough = [v for v in above if v >= users]
        above = [v for v in above if v < users] + enough[:1]
    return tuple(above)


def _refusal(
    spec: KnobSpec, remedy: Remedy, policy: TunePolicy, tried: Sequence[Tried], rank_in: RankInput
) -> str | None:
    """Why this knob is not tried for this remedy, or None."""
    names = {spec.knob, remedy.value}
    if names & policy.deny:
        return f"denied by tune.deny ({', '.join(sorted(names & policy.deny))})"
    if policy.allow and not names & policy.allow:
        return f"not in tune.allow (neither {spec.knob} nor {remedy.value})"
    if spec.risk is Risk.QUALITY and not policy.quality_guarded:
        return f"{spec.knob} may change outputs: tried only with a quality guard (goals.quality)"
    if spec.risk is Risk.HARDWARE and not names & policy.allow:
        return f"{spec.knob} needs more hardware than the baseline's: name it in tune.allow to try it"
    # A kept step whose finding persists goes on in the same direction (its values start past the kept one); any
    # other verdict ends the knob for this session.
    # An inconclusive step (too few trials to settle it) runs once more, with twice the trials (the loop's part).
    here = [t for t in tried if t.this_session and t.knob == spec.knob and t.remedy is remedy]
    unsettled = [t for t in here if t.verdict == INCONCLUSIVE]
    if here and here[-1].verdict != KEPT and not (here[-1].verdict == INCONCLUSIVE and len(unsettled) == 1):
        return f"{spec.knob} tried already ({here[-1].where}: {here[-1].verdict})"
    rejected = [t for t in tried if not t.this_session and t.knob == spec.knob and t.verdict == REJECTED]
    if len(rejected) >= 2 and not policy.retry_rejected:
        return f"{spec.knob} rejected {len(rejected)} times before on this engine and image ({', '.join(t.where for t in rejected)}); tune.retry_rejected tries it again"
    return None


def _already_achieved(remedy: Remedy, summary: Mapping[str, float]) -> str | None:
    """Why a remedy's aim is met already, measured (prefix reuse achieved ≈ what the workload offers), or None."""
    if remedy is not Remedy.PREFIX_CACHING:
        return None
    expected, achieved = summary.get("prefix_reuse.expected"), summary.get("prefix_reuse.achieved")
    if expected is None or achieved is None or achieved < REUSE_ACHIEVED_SHARE * expected:
        return None
    return (
        f"prefix reuse already achieved: {achieved:.1%} of prompt tokens served from cache where the workload "
        f"repeats {expected:.1%}"
    )


def _choose_knob(
    remedy: Remedy, engine: Engine, rank_in: RankInput, policy: TunePolicy, tried: Sequence[Tried]
) -> tuple[KnobSpec | None, tuple[Scalar, ...], str]:
    """The first knob of the engine's map for `remedy` that is worth trying, its values, or why none is."""
    specs = knobs_for(engine.knob_map, remedy)
    if remedy in engine.built_in:
        return None, (), f"{remedy.value} is always on in {engine.kind}"
    if not specs:
        return None, (), f"no knob of {engine.kind} implements {remedy.value}"
    achieved = _already_achieved(remedy, rank_in.summary)
    if achieved is not None:
        return specs[0], (), achieved
    reasons: list[str] = []
    for spec in specs:
        current = _current(spec, rank_in.args)
        refused = _refusal(spec, remedy, policy, tried, rank_in)
        if refused is None and spec.already_when is not None and current == spec.already_when:
            refused = f"{spec.knob} is already {current!r}"
        if refused is None:
            values = _onward(spec, current, policy.values.get(spec.knob, spec.values), rank_in.concurrency)
            if values:
                return spec, values, ""
            refused = (
                f"{spec.knob} has no value to try: name some in tune.values.{spec.knob}"
                if not spec.values and spec.knob not in policy.values
                else f"{spec.knob} is {current!r}, past every value to try"
            )
        reasons.append(refused)
    return specs[0], (), "; ".join(reasons)


def rank(
    rank_in: RankInput,
    engine: Engine,
    tried: Sequence[Tried] = (),
    policy: TunePolicy = TunePolicy(),
) -> tuple[Ranked, ...]:
    """Every remedy the findings call for: the ranked ones first (rank 1 is next), then the skipped, each with why."""
    binding, binding_why = binding_metric(rank_in.gates, rank_in.objective)
    family = binding.split(".")[0]
    called = _called_for(rank_in.findings)
    ranked: list[tuple[tuple[int, int, int, int], Ranked, str]] = []
    skipped: list[Ranked] = []
    for remedy, entry in called.items():
        spec, values, refused = _choose_knob(remedy, engine, rank_in, policy, tried)
        bears = family in HELPS[remedy]
        base = Ranked(
            remedy,
            entry.direction,
            _name_in(spec, rank_in.args) if spec else None,
            values,
            tuple(entry.findings),
            "; ".join(entry.evidence),
            refused,
            risk=spec.risk if spec else Risk.SAFE,
            bears_on_binding=bears,
        )
        if not values:
            skipped.append(base)
            continue
        key = (0 if bears else 1, *entry.standing, CHECKLIST_ORDER.index(remedy))
        ranked.append((key, base, entry.standing_text))
    ranked.sort(key=lambda kv: kv[0])
    out = [
        _with_rank(r, i, (binding, binding_why), standing, len(ranked)) for i, (_, r, standing) in enumerate(ranked, 1)
    ]
    return (*out, *skipped)


def _with_rank(r: Ranked, rank_no: int, binding_on: tuple[str, str], standing: str, of: int) -> Ranked:
    """`standing`: how the findings call for it ("warn", "warn; 2nd of queue.persistent's remedies")."""
    binding, binding_why = binding_on
    bears = (
        f"bears on {binding} ({binding_why})" if r.bears_on_binding else f"does not bear on {binding} ({binding_why})"
    )
    what = f"{r.knob} → {', '.join(map(repr, r.values))}" + (" (value search)" if len(r.values) > 1 else "")
    reason = (
        f"#{rank_no} of {of}: {what}; {bears}; called for by {', '.join(r.findings)} ({standing}); "
        f"§7 order {CHECKLIST_ORDER.index(r.remedy) + 1} of {len(CHECKLIST_ORDER)}"
    )
    return Ranked(
        r.remedy, r.direction, r.knob, r.values, r.findings, r.evidence, reason, rank_no, r.risk, r.bears_on_binding
    )


def next_step(ranked: Sequence[Ranked]) -> Ranked | None:
    """The candidate the loop runs next: rank 1, or None when every candidate was skipped."""
    return next((r for r in ranked if r.rank == 1), None)


def kept_before(tried: Sequence[Tried]) -> tuple[Tried, ...]:
    return tuple(t for t in tried if t.verdict == KEPT)
