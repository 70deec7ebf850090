"""`llmplay tune`: the checklist's loop. A probe of one request alone (a bound on latency gates), the baseline and the
hand-written steps, then rounds: rank the incumbent's candidates, run the best as an ordinary step through the run
machinery (its statistics and guards decide it), carry it if kept, diagnose the new incumbent, until a stop reason.

Every round is an ordinary run archived under the tuning directory, its playbook written beside it (`round-N.yaml`);
`trail.json` holds the decisions; `tuned.yaml` is the playbook the loop ends with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from llmplay.archive.layout import MANIFEST
from llmplay.archive.model import Finding, RooflineFacts, StepVerdict
from llmplay.archive.reader import ArchivedRun
from llmplay.engines import get_engine
from llmplay.metrics import prefix_reuse_text
from llmplay.outcomes import INCONCLUSIVE, GateResult
from llmplay.playbook.load import load_playbook
from llmplay.spec import Playbook, Scalar, TuneSpec
from llmplay.stats.search import DROPPED_VS_LEADER
from llmplay.tune import documents, trail
from llmplay.tune.bounds import roofline_bound, unloaded_bound
from llmplay.tune.history import tried_before
from llmplay.tune.page import write_page
from llmplay.tune.rank import Ranked, RankInput, Tried, TunePolicy, next_step, rank
from llmplay.tune.trail import Raced, Round, Trail
from llmplay.tuning.resume import resumed_playbook
from llmplay.tuning.run import RunOptions, RunOutcome

# Runs one playbook as an ordinary run with these options (its archive root; the run to continue, on resume).
RunFn = Callable[[Playbook, RunOptions], RunOutcome]
INTERRUPTED = "interrupted"  # a run's status after a signal (or a bug), continued with --resume
Say = Callable[[str], None]
# How many A/B pairs the playbook's runtime runs at once (a Ray cluster's room; 1 on one machine).
Room = Callable[[Playbook], int]


@dataclass(frozen=True)
class TuneOutcome:
    tune_dir: Path
    trail: Trail
    tuned: Path | None  # tuned.yaml, None when the loop stopped before the baseline
    report: Path | None = None  # the session's report.html, None when it could not be rendered (the warning says why)


def policy_of(playbook: Playbook) -> TunePolicy:
    spec = playbook.tune or TuneSpec()
    guarded = playbook.goals.quality is not None or any(g.metric.startswith("quality.") for g in playbook.goals.guards)
    return TunePolicy(
        allow=frozenset(spec.allow),
        deny=frozenset(spec.deny),
        quality_guarded=guarded,
        values=dict(spec.values),
        retry_rejected=spec.retry_rejected,
    )


def rank_incumbent(
    playbook: Playbook,
    findings: Sequence[Finding],
    args: Mapping[str, Scalar],
    summary: Mapping[str, float],
    gates: Sequence[GateResult],
    tried: Sequence[Tried],
) -> tuple[Ranked, ...]:
    """The ranking for an incumbent of this playbook (the loop's and --dry-run's one call)."""
    rank_in = RankInput(findings, args, summary, gates, playbook.goals.objective, playbook.workload.concurrency)
    return rank(rank_in, get_engine(playbook.engine.kind), tried, policy_of(playbook))


def _final_args(run_dir: Path) -> dict[str, Scalar]:
    """The engine knobs of a run's final configuration, as archived."""
    run = ArchivedRun.open(run_dir)
    final = run.info.final_config_id
    for config in run.configs():
        if config.config_id == final:
            return dict(config.engine.args)
    return {}


class TuneLoop:
    """One tuning session in `tune_dir`; `run` measures a playbook, `say` prints a line."""

    def __init__(
        self,
        playbook: Playbook,
        tune_dir: Path,
        run: RunFn,
        say: Say,
        state: Trail | None = None,
        archive_root: Path | None = None,
        room: Room | None = None,
    ):
        """`archive_root`: where each round's run is archived (the tuning directory itself when None) and whose
        earlier runs of this playbook count as history. `room`: how many A/B pairs the playbook's runtime runs at
        once (a Ray cluster's free slots; 1 when None), what tune.race is bounded by."""
        self.playbook, self.tune_dir, self.run, self.say = playbook, tune_dir, run, say
        self.room: Room = room or (lambda _playbook: 1)
        self.trail = state or Trail(playbook=playbook.path)
        self.spec = playbook.tune or TuneSpec()
        self.archive = archive_root or tune_dir
        self.history = tried_before(self.archive, playbook) if archive_root is not None else ()

    def execute(self) -> TuneOutcome:
        self.tune_dir.mkdir(parents=True, exist_ok=True)
        if not self.trail.alone_run and self._probe_alone():
            return self._finish(None)
        if not self.trail.rounds:
            self._baseline()
            bound = roofline_bound(self.playbook.goals.gates, self._roofline())
            if bound is not None:
                self._stop(f"goal unreachable ({bound.bound}): {bound.message}", infeasible=True)
        while not self.trail.stop:
            self._next_round()
        return self._finish(self.tune_dir / trail.TUNED_FILE)

    # -- the parts
    def _probe_alone(self) -> bool:
        """Measure one request alone; True when a latency gate is below it (the loop then stops before the baseline)."""
        path = documents.write_document(self.tune_dir / "alone.yaml", documents.alone_document(self.playbook))
        self.say(f"tune: one request alone ({documents.ALONE_REQUESTS} requests, one at a time): {path}")
        outcome, spent = self._measure(self._resumable(trail.PROBE) or trail.Pending(trail.PROBE, str(path)))
        alone = {k: float(v) for k, v in outcome.final_summary.items() if isinstance(v, int | float)}
        self.trail = replace(self.trail, alone=alone, alone_run=str(outcome.run_dir), alone_s=spent)
        bound = unloaded_bound(self.playbook.goals.gates, alone, documents.ALONE_REQUESTS)
        if bound is None:
            trail.save(self.trail, self.tune_dir)
            return False
        self._stop(f"goal unreachable ({bound.bound}): {bound.message}", infeasible=True)
        return True

    def _baseline(self) -> None:
        self.say("tune: round 0, the baseline and the playbook's own steps")
        pending = self._resumable(0) or trail.Pending(0, self.playbook.path)
        outcome, spent = self._measure(pending, self.playbook)
        done = Round(
            0,
            str(outcome.run_dir),
            dict(self.playbook.engine.args),
            findings=tuple(outcome.findings),
            kept_args=_final_args(outcome.run_dir),
            engine_s=spent,
            summary=_figures(outcome.final_summary),
            gates_met=_all_met(outcome.gates),
        )
        self.trail = self.trail.with_round(done)
        if (reuse := prefix_reuse_text(done.summary)) is not None:
            self.say(f"tune: round 0 incumbent: {reuse}")
        trail.save(self.trail, self.tune_dir)

    def _next_round(self) -> None:
        last = self.trail.rounds[-1]
        number = len(self.trail.rounds)
        pending = self._resumable(number)
        if pending is None:
            ranked = self._ranking(last)
            self._print_ranking(number, ranked)
            chosen = next_step(ranked)
            stop = self._stop_reason(chosen, ranked, last)
            if stop:
                self._stop(stop, ranked=ranked)
                return
            assert chosen is not None and chosen.knob is not None  # _stop_reason
            pending = self._round_playbook(number, last, ranked)
        else:
            names = ", ".join(str(e.step_document["name"]) for e in _entrants(pending))
            self.say(f"tune: round {number} was interrupted: it goes on with {names} ({pending.playbook})")
        outcome, spent = self._measure(pending)
        self._record_round(number, last, pending, outcome, spent)

    def _round_playbook(self, number: int, last: Round, ranked: Sequence[Ranked]) -> trail.Pending:
        """Write round-N.yaml: the incumbent's knobs and the step ranked first (with tune.race on a cluster, the
        first ranked raced as `carry: race` steps); the round as it will be recorded."""
        raced, room = self._raced(ranked)
        taken = [c.step for r in self.trail.rounds for c in r.candidates]
        steps: list[documents.Doc] = []
        for candidate in raced:
            steps.append(documents.step_document(candidate, documents.step_name(candidate, taken)))
            taken.append(steps[-1]["name"])
            if len(raced) > 1:
                steps[-1]["carry"] = "race"  # each against the incumbent; the first kept (ranking order) carried
        doc = documents.round_document(self.playbook, last.kept_args, steps)
        unsettled = [c.knob for c in raced if any(t.knob == c.knob and t.verdict == INCONCLUSIVE for t in self.tried)]
        if unsettled:
            doc["trials"] = documents.more_trials(self.playbook)
            self.say(
                f"tune: {', '.join(map(str, unsettled))} inconclusive before: this round allows "
                f"{doc['trials']['max_repeats']} rounds"
            )
        path = documents.write_document(self.tune_dir / f"round-{number}.yaml", doc, _round_header(number, raced))
        names = [str(s["name"]) for s in steps]
        race = _race_note(names, room) if len(raced) > 1 else ""
        self.say(f"tune: round {number} runs {', '.join(names)} ({path.name}){': ' + race if race else ''}")
        entrants = tuple(trail.Entrant(c.rank or 1, step) for c, step in zip(raced, steps, strict=True))
        return trail.Pending(
            number,
            str(path),
            ranked=tuple(ranked),
            step=names[0],
            step_document=steps[0],
            raced=entrants if len(entrants) > 1 else (),
            race=race,
        )

    def _record_round(
        self, number: int, last: Round, pending: trail.Pending, outcome: RunOutcome, spent: float
    ) -> None:
        by_rank = {c.rank: c for c in pending.ranked if c.rank is not None}
        ran = [(by_rank[e.rank], dict(e.step_document)) for e in _entrants(pending)]
        done = _decided(number, last, pending.ranked, ran, outcome, spent)
        self.trail = self.trail.with_round(replace(done, race=pending.race))
        for c in done.raced:
            self.say(f"tune: round {number}: raced {c.step} {c.verdict}{' (carried)' if c.carried else ''}: {c.reason}")
        self.say(f"tune: round {number}: {done.step} {done.verdict}: {done.reason}")
        if (reuse := _reuse_change(last.summary, done.step_summary, done.step or "")) is not None:
            self.say(f"tune: round {number} {reuse}")
        trail.save(self.trail, self.tune_dir)

    @property
    def tried(self) -> tuple[Tried, ...]:
        return self.trail.tried()

    def _raced(self, ranked: Sequence[Ranked]) -> tuple[list[Ranked], int]:
        """The candidates this round runs, and the pairs the cluster runs at once: the first ranked alone, or with
        tune.race above 1 the first ranked up to as many as the cluster has room for pairs at once (never past the
        step budget, nor past the engine budget at the steps' mean cost so far)."""
        runnable = [c for c in ranked if not c.skipped]
        if self.spec.race <= 1 or len(runnable) <= 1:
            return runnable[:1], 1
        room = self.room(self.playbook)
        width = min(self.spec.race, room, len(runnable))
        taken = self._steps_taken()
        if self.spec.max_steps is not None:
            width = min(width, self.spec.max_steps - taken)
        budget = self.spec.engine_budget_s
        if budget is not None:
            per_step = self._per_step_s()
            if per_step > 0:
                width = min(width, int((budget - self.trail.engine_s) // per_step))
        return runnable[: max(1, width)], room

    def _ranking(self, last: Round) -> tuple[Ranked, ...]:
        """The incumbent's ranking; after a value search whose leader was rejected (a guard, say) while it had dropped
        other values only for trailing that leader, those values first, as their own search."""
        if last.retry_values:
            chosen = last.chosen
            values = ", ".join(map(repr, last.retry_values))
            why = (
                f"#1 of 1: {chosen.knob} → {values}; round {last.number}'s search dropped these values only for "
                "trailing its leader, which it then rejected: they race again without it"
            )
            return (replace(chosen, values=last.retry_values, reason=why),)
        gates = ArchivedRun.open(Path(last.run_dir)).gates()
        mine = {r.run_dir for r in self.trail.rounds}
        history = tuple(t for t in self.history if t.where.removeprefix("run ") not in {Path(d).name for d in mine})
        tried = (*self.trail.tried(), *history)
        return rank_incumbent(self.playbook, last.findings, last.kept_args, last.summary, gates, tried)

    def _steps_taken(self) -> int:
        return sum(len(r.candidates) for r in self.trail.rounds)

    def _per_step_s(self) -> float:
        """A step's engine time so far (a raced round's spread over its candidates); before any, the last round's."""
        taken = self._steps_taken()
        if not taken:
            return self.trail.rounds[-1].engine_s
        return sum(r.engine_s for r in self.trail.rounds if r.step) / taken

    def _stop_reason(self, chosen: Ranked | None, ranked: Sequence[Ranked], last: Round) -> str:
        steps_taken = self._steps_taken()
        if chosen is None:
            if not ranked:
                return "nothing left to try: no finding on the incumbent calls for a step"
            return f"nothing left to try: all {len(ranked)} candidates skipped (see the ranking)"
        if last.gates_met and not chosen.bears_on_binding:
            return (
                f"every gate met and no candidate left that bears on the objective (next would be {chosen.knob}, "
                f"{chosen.remedy.value})"
            )
        if self.spec.max_steps is not None and steps_taken >= self.spec.max_steps:
            return f"budget spent: {steps_taken} of {self.spec.max_steps} steps"
        budget = self.spec.engine_budget_s
        if budget is not None:
            expected = self._per_step_s()
            if self.trail.engine_s + expected > budget:
                return (
                    f"budget spent: {self.trail.engine_s / 60:.1f} of {budget / 60:.1f} engine minutes, and a round "
                    f"takes about {expected / 60:.1f}"
                )
        return ""

    # -- helpers
    def _measure(self, pending: trail.Pending, playbook: Playbook | None = None) -> tuple[RunOutcome, float]:
        """Run `pending` (`playbook`, else its file), recorded in trail.json before it starts and its run directory
        once it exists; a run archived before (an interrupted session) is continued as `run --resume` continues it,
        its archived trials kept. The outcome and its engine time: the wall time its trials archived (engine starts
        included). An interrupted run stops the session (KeyboardInterrupt), resumable with `tune --resume`."""
        self._record(pending)
        if pending.run_dir and (Path(pending.run_dir) / MANIFEST).is_file():
            resumed = resumed_playbook(Path(pending.run_dir), allow_outside_extends=True)
            if resumed.trust is not None and resumed.trust.warning:
                self.say(resumed.trust.warning)
            self.say(f"tune: continuing the interrupted run {pending.run_dir}")
            signs = resumed.trust is None or resumed.trust.sign
            options = RunOptions(self.archive, resume=Path(pending.run_dir), resume_signs=signs)
            playbook = resumed.playbook
        else:
            options = RunOptions(self.archive, on_archive=lambda d: self._record(replace(pending, run_dir=str(d))))
            playbook = playbook or load_playbook(Path(pending.playbook), allow_outside_extends=True)
        outcome = self.run(playbook, options)
        if outcome.status == INTERRUPTED:
            self._record(replace(pending, run_dir=str(outcome.run_dir)))
            self.say(
                f"tune: interrupted; the run's archived trials are kept ({outcome.run_dir}): continue with "
                f"`llmplay tune --resume {self.tune_dir}`"
            )
            self._page()
            raise KeyboardInterrupt(f"tune: {outcome.run_dir} interrupted")
        self.trail = replace(self.trail, pending=None)  # saved with what the run decided
        return outcome, sum(t.wall_s for t in ArchivedRun.open(outcome.run_dir).trials())

    def _record(self, pending: trail.Pending) -> None:
        self.trail = replace(self.trail, pending=pending)
        trail.save(self.trail, self.tune_dir)

    def _resumable(self, number: int) -> trail.Pending | None:
        """The interrupted run of this round (or of the probe), when the session stopped in it."""
        pending = self.trail.pending
        return pending if pending is not None and pending.number == number else None

    def _roofline(self) -> RooflineFacts | None:
        return ArchivedRun.open(Path(self.trail.rounds[-1].run_dir)).diagnosis().roofline

    def _stop(self, reason: str, *, infeasible: bool = False, ranked: Sequence[Ranked] = ()) -> None:
        self.trail = replace(self.trail, stop=reason, infeasible=infeasible, final_ranking=tuple(ranked))
        self.say(f"tune: stopped: {reason}")
        trail.save(self.trail, self.tune_dir)

    def _print_ranking(self, number: int, ranked: Sequence[Ranked]) -> None:
        self.say(f"tune: round {number} ranking")
        for line in ranking_lines(ranked):
            self.say(f"  {line}")

    def _finish(self, tuned: Path | None) -> TuneOutcome:
        if tuned is not None:
            tuned.write_text(documents.tuned_text(self.playbook, *self._kept_and_not()))
            self.say(f"tune: wrote {tuned}")
        return TuneOutcome(self.tune_dir, self.trail, tuned, self._page())

    def _page(self) -> Path | None:
        """The session's report.html; a rendering bug costs the page, never the session (trail.json is its record)."""
        try:
            return write_page(self.trail, self.tune_dir, self.playbook.metadata.name)
        except Exception as exc:
            self.say(
                f"warning: the session's report.html not written ({type(exc).__name__}: {exc}); trail.json is complete"
            )
            return None

    def _kept_and_not(self) -> tuple[list[documents.KeptStep], list[documents.Doc]]:
        kept: list[documents.KeptStep] = []
        not_kept: list[documents.Doc] = []
        for r in self.trail.rounds:
            for ran in r.candidates:
                if ran.carried:
                    chosen = r.chosen
                    kept.append(documents.KeptStep(_fixed(r), f"{chosen.remedy.value}: {chosen.evidence}", r.reason))
                else:
                    not_kept.append({"step": ran.step, "knob": ran.knob, "verdict": ran.verdict, "why": ran.reason})
        skipped: dict[str, documents.Doc] = {}  # by remedy: the last round's reason
        for ranked in [*(r.ranked for r in self.trail.rounds), self.trail.final_ranking]:
            for c in ranked:
                if c.skipped:
                    skipped[c.remedy.value] = {
                        "remedy": c.remedy.value,
                        "knob": c.knob,
                        "verdict": "skipped",
                        "why": c.reason,
                    }
        return kept, [*not_kept, *skipped.values()]


def _fixed(done: Round) -> documents.Doc:
    """A kept round's step as a fixed change: a value search's winner, read off the knobs the round ended with."""
    step = dict(done.step_document)
    step.pop("carry", None)  # a raced round's `race`: in tuned.yaml the kept step is an ordinary one
    search = step.pop("search", None)
    if search:
        target = next(iter(search))
        knob = target.removeprefix("args.")
        step["set"] = {knob: done.kept_args.get(knob)}
    return step


def _dropped_behind_leader(verdict: StepVerdict, tried: Sequence[Scalar]) -> tuple[Scalar, ...]:
    """A rejected search's values dropped only for trailing a leader (never judged against the incumbent)."""
    if verdict.search is None:
        return ()
    behind = tuple(v.value for v in verdict.search.values if v.status == DROPPED_VS_LEADER)
    return behind if behind and tuple(behind) != tuple(tried) else ()


def _step_figures(outcome: RunOutcome, step: str) -> dict[str, float]:
    """The pooled figures of the step's own configuration, as its run's tuning record has them."""
    row = next((r for r in outcome.tuning_record if r.step == step), None)
    return _figures(row.metrics) if row is not None else {}


def _reuse_change(incumbent: Mapping[str, float], step: Mapping[str, float], name: str) -> str | None:
    """ "prefix reuse: incumbent 0% achieved, tune-prefix-caching 93% achieved (the workload repeats 95%)", where
    either side measured any reuse."""
    before, after = prefix_reuse_text(incumbent), prefix_reuse_text(step)
    if before is None and after is None:
        return None

    def achieved(figures: Mapping[str, float]) -> str:
        value = figures.get("prefix_reuse.achieved")
        return f"{value:.0%} achieved" if value is not None else "achieved not measured"

    expected = step.get("prefix_reuse.expected", incumbent.get("prefix_reuse.expected"))
    repeats = f" (the workload repeats {expected:.0%})" if expected is not None else ""
    return f"prefix reuse: incumbent {achieved(incumbent)}, {name} {achieved(step)}{repeats}"


def _figures(summary: Mapping[str, object]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _all_met(gates: Sequence[GateResult]) -> bool:
    return all(g.met is True for g in gates)


def _round_header(number: int, raced: Sequence[Ranked]) -> str:
    if len(raced) == 1:
        return (
            f"# llmplay tune, round {number}: the incumbent's knobs and the step ranked first.\n# {raced[0].reason}\n"
        )
    reasons = "".join(f"# {c.reason}\n" for c in raced)
    return (
        f"# llmplay tune, round {number}: the incumbent's knobs and the {len(raced)} steps ranked first, raced (carry:"
        " race: each against the incumbent, the first kept carried).\n" + reasons
    )


def _entrants(pending: trail.Pending) -> tuple[trail.Entrant, ...]:
    """What a pending round runs: its raced candidates, or its one step (the first ranked)."""
    return pending.raced or (trail.Entrant(1, pending.step_document),)


def _race_note(names: Sequence[str], room: int) -> str:
    return (
        f"{len(names)} candidates raced (tune.race; the cluster runs {room} pair(s) at once), each against the "
        "incumbent; the first kept in ranking order is carried, the step a session without racing would have carried"
    )


def _decided(
    number: int,
    last: Round,
    ranked: tuple[Ranked, ...],
    raced: Sequence[tuple[Ranked, documents.Doc]],
    outcome: RunOutcome,
    spent: float,
) -> Round:
    """The round as its run decided it: its step is the one carried, else the first ranked; a raced round lists
    every candidate with its own verdict."""
    verdicts = {v.step: v for v in outcome.verdicts}
    records = []
    for candidate, step in raced:
        verdict = verdicts.get(str(step["name"]))
        records.append(
            Raced(
                str(step["name"]),
                candidate.rank or 0,
                candidate.remedy.value,
                candidate.knob or "",
                verdict.verdict if verdict else "failed",
                verdict.reason if verdict else f"the round's run ended {outcome.status}",
                verdict is not None and verdict.carried,
                step,
            )
        )
    at = next((i for i, r in enumerate(records) if r.carried), 0)
    candidate, step = raced[at]
    verdict = verdicts.get(str(step["name"]))
    kept = records[at].carried
    behind = () if kept or verdict is None else _dropped_behind_leader(verdict, candidate.values)
    return Round(
        number,
        str(outcome.run_dir),
        dict(last.kept_args),
        findings=tuple(outcome.findings),
        ranked=ranked,
        step=records[at].step,
        step_document=step,
        verdict=records[at].verdict,
        reason=records[at].reason,
        kept_args=_final_args(outcome.run_dir) if kept else dict(last.kept_args),
        engine_s=spent,
        summary=_figures(outcome.final_summary) if kept or outcome.final_summary else last.summary,
        gates_met=_all_met(outcome.gates),
        retry_values=behind,
        step_summary=_step_figures(outcome, records[at].step),
        rank=candidate.rank or 1,
        raced=tuple(records) if len(records) > 1 else (),
    )


def ranking_lines(ranked: Sequence[Ranked]) -> list[str]:
    """The ranking as the console and the trail show it: ranked ones first, then each skipped one with why."""
    lines = []
    for c in ranked:
        if c.skipped:
            lines.append(f"skipped {c.remedy.value}: {c.reason}")
        else:
            lines.append(c.reason)
    return lines or ["(no finding calls for a step)"]
