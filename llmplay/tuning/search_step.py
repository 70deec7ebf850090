"""A search step in the run: the values of its one knob raced against the incumbent (stats.search), round by round
through the run's scheduler, and what the race decided archived as the step's verdict with its search record.

Every arm of a round is one trial with the round's number as its repeat, so all of them send the same request
sequence (the workload seed is the playbook's plus the repeat) and each value is paired with the incumbent's trial
of that round. Each trial is archived before the search counts it, and the search is deterministic given its seed
(drawn from the run id and the step) and its trials, so --resume replays the archived rounds without measuring them
again and goes on from the first round that is missing.

How long it races: trials.repeats (at least 2) rounds before a value can be kept or dropped, at most
trials.max_repeats rounds per value (the search's sequential boundary is calibrated over exactly those looks), then
3 confirmation pairs of the winner. Raise trials.max_repeats for searches that must separate close values (the
procedure's benchmark figures assume 12); the playbook's value is used as written so a CPU demo stays short.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Sequence
from dataclasses import replace

from llmplay.archive.model import (
    FAILED,
    INCONCLUSIVE,
    KEPT,
    MetricDelta,
    SearchRecord,
    SearchValue,
    StepVerdict,
    TrialRecord,
)
from llmplay.catalog import RECORD_METRICS
from llmplay.playbook.search import SEARCH_FORM
from llmplay.playbook.step_forms import StepForm
from llmplay.spec import Change, ChangeEffect, Config, Scalar, SearchSpace, Step, apply_change, current_value
from llmplay.stats.decide import Decision, TrialSample, decide_step, pooled_summary
from llmplay.stats.intervals import Effect
from llmplay.stats.search import Arm, Round, SearchDesign, SearchResult, ValueSearch
from llmplay.tuning.book import ConfigTrials, TrialSlot
from llmplay.tuning.progress import verdict_line
from llmplay.tuning.quality import judge_quality, speed_goals
from llmplay.tuning.step_kind import Loop


def search_seed(run_id: str, step: str) -> int:
    """The seed of the arms' order within each round: from the run id (archived) and the step, so a resumed run
    draws the same rounds."""
    return int.from_bytes(hashlib.sha256(f"{run_id}\0{step}\0search".encode()).digest()[:8], "big")


def value_config_id(step: str, value: Scalar) -> str:
    """The configuration a search step measures at one value: "parallel=4"."""
    return f"{step}={value}"


def _knob_value(value: object) -> Scalar:
    """The incumbent's value as the archive can hold it (a knob not set is None: the engine default)."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def _figures(samples: Sequence[TrialSample]) -> dict[str, float]:
    """A configuration's pooled figures over its ok trials, for the value and Pareto charts."""
    summary = pooled_summary(samples) if samples else {}
    return {m: float(v) for m in RECORD_METRICS if isinstance(v := summary.get(m), (int, float)) and math.isfinite(v)}


class SearchStepRun:
    """One search step: measured by `measure`, then `conclude` archives its verdict and says what is carried."""

    def __init__(self, loop: Loop, index: int, step: Step, best: ConfigTrials):
        assert isinstance(step.choice, SearchSpace)  # SEARCH_KIND runs the steps read by SEARCH_FORM only
        self.loop, self.index, self.step, self.space = loop, index, step, step.choice
        pb = loop.playbook
        self.design = SearchDesign.from_trials(pb.trials)
        self.seed = search_seed(loop.book.archive.run_id, step.name)
        self.current = _knob_value(current_value(best.config, self.space.target))
        self.search = ValueSearch(
            self.space.values,
            speed_goals(pb.goals),  # quality guards are judged from the probes afterwards, as for any step
            self.design,
            ordered=self.space.ordered,
            seed=self.seed,
            current=self.current,
            has_current=True,
        )
        self.incumbent = ConfigTrials(best.config)  # its own trials of this step, as a reference side is
        self.arms: dict[Scalar, ConfigTrials] = {}

    def _measured(self, arm: Arm) -> ConfigTrials:
        if arm.incumbent:
            return self.incumbent
        if arm.value not in self.arms:
            changed = apply_change(self.incumbent.config, Change(self.space.target, arm.value))
            config = Config(value_config_id(self.step.name, arm.value), changed.engine, changed.workload)
            self.loop.write_config(config)
            self.arms[arm.value] = ConfigTrials(config)
        return self.arms[arm.value]

    def measure(self) -> None:
        """Every round the search asks for, each as one group (one machine, its arms in the search's order)."""
        while (rnd := self.search.next_round()) is not None:
            self._measure_round(rnd)

    def _measure_round(self, rnd: Round) -> None:
        by_key: dict[tuple[str, str, int, str], Arm] = {}
        group = []
        for arm in rnd.arms:
            role = "baseline" if arm.incumbent else "candidate"
            slot = TrialSlot(self._measured(arm).config, self.step.name, role, rnd.number)
            by_key[slot.key] = arm
            group.append(slot)

        def take(slot: TrialSlot, trial: TrialRecord, sample: TrialSample | None) -> None:
            arm = by_key[slot.key]
            self.search.record(rnd.number, arm, sample, engine_s=trial.wall_s)
            self.loop.count(self._measured(arm), trial, sample)  # last: it may stop the run (on_failure: stop)

        self.loop.scheduler.run([group], take)

    # ---------------------------------------------------------------------------------------------- the verdict
    def _shown(self, result: SearchResult) -> Scalar | None:
        """The value the verdict compares with the incumbent: the winner, else the best measured value."""
        if result.winner is not None:
            return result.winner.value
        sign = -1.0 if self.loop.playbook.goals.objective.direction == "minimize" else 1.0
        scored = [
            (sign * o.effect.rel_change, i)
            for i, o in enumerate(result.values)
            if o.effect is not None and o.effect.rel_change is not None
        ]
        if scored:
            return result.values[max(scored)[1]].value
        measured = [o.value for o in result.values if o.value in self.arms]
        return measured[0] if measured else None

    def _decision(self, result: SearchResult, cand: ConfigTrials | None) -> Decision:
        """The winner against the incumbent at the search's familywise level; for no winner, the shown value's pairs
        at the step's own level (its deltas only: the verdict and reason are the search's)."""
        decision = result.decision
        if decision is None:
            a, b = self._pairs(cand)
            pb = self.loop.playbook
            decision = decide_step(
                a, b, speed_goals(pb.goals), pb.trials, failed_candidate_trials=cand.failed if cand else 0
            )
        return replace(decision, verdict=result.verdict, reason=result.reason)

    def _pairs(self, cand: ConfigTrials | None) -> tuple[list[TrialSample], list[TrialSample]]:
        """The shown value's trials and the incumbent's of the same rounds (paired by the round's number)."""
        value = next((v for v, measured in self.arms.items() if measured is cand), None)
        if cand is None or value is None:
            return [], []
        mine = {s.repeat: s for s in self.search.samples_of(Arm(value))}
        theirs = {s.repeat: s for s in self.search.samples_of(Arm(None, incumbent=True))}
        common = sorted(r for r in set(mine) & set(theirs) if r is not None)
        return [theirs[r] for r in common], [mine[r] for r in common]

    def conclude(self, *, finished: bool = True) -> ConfigTrials:
        """The step's verdict archived (a stopped search: what it measured, inconclusive); what is carried."""
        result = self.search.result()
        if not finished:
            result = replace(
                result,
                verdict=INCONCLUSIVE,
                reason=f"the run stopped during round {result.rounds} of the search; --resume goes on from there",
                decision=None,
            )
        shown = self._shown(result)
        cand = self.arms.get(shown) if shown is not None else None
        decision = self._decision(result, cand)
        effects = (ChangeEffect(self.space.target, self.current, shown),) if shown is not None else ()
        if cand is not None:
            decision = judge_quality(decision, self.loop.playbook.goals, self.incumbent.probes, cand.probes, effects)
        carry = self.step.carry
        carried = finished and (
            (carry == "always" and decision.verdict != FAILED) or (carry == "if_kept" and decision.verdict == KEPT)
        )
        verdict = StepVerdict(
            step=self.step.name,
            index=self.index,
            verdict=decision.verdict,
            reason=decision.reason,
            changes=tuple(e.describe() for e in effects),
            bundle=self.step.bundle,
            baseline_config=self.incumbent.config.label,
            candidate_config=cand.config.label if cand is not None else self.incumbent.config.label,
            objective=decision.objective,
            guards=decision.guards,
            deltas=decision.deltas,
            trials_baseline=tuple(self.incumbent.trial_ids),
            trials_candidate=tuple(t for arm in self.arms.values() for t in arm.trial_ids),
            more_trials_needed=decision.more_trials_needed,
            carried=carried and cand is not None,
            search=self._record(result, shown, finished),
        )
        self.loop.book.archive.write_verdict(verdict)
        self.loop.verdicts.append(verdict)
        if not finished:
            return self.incumbent
        for metric, noise in decision.noise.items():
            self.loop.noise.setdefault(metric, []).append(noise)
        narrator = self.loop.book.narrator
        narrator.say(f"the verdict line of step {self.step.name}", lambda: verdict_line(decision))
        narrator.say(f"the engine time of search {self.step.name}", lambda: engine_line(result))
        self.loop.add_record_rows(self.index, self.incumbent, cand, verdict)
        return cand if verdict.carried and cand is not None else self.incumbent

    def _record(self, result: SearchResult, shown: Scalar | None, finished: bool) -> SearchRecord:
        d = self.design
        values = tuple(
            SearchValue(
                value=o.value,
                config_id=value_config_id(self.step.name, o.value),
                pairs=o.pairs,
                effect=o.effect,
                status=o.status,
                left_at_round=o.left_at_round,
                reason=o.reason,
                trials=tuple(self.arms[o.value].trial_ids) if o.value in self.arms else (),
                metrics=_figures(self.arms[o.value].samples) if o.value in self.arms else {},
            )
            for o in result.values
        )
        return SearchRecord(
            target=self.space.target,
            incumbent_value=self.current,
            incumbent_config=self.incumbent.config.label,
            incumbent_metrics=_figures(self.incumbent.samples),
            values=values,
            chosen=shown,
            seed=self.seed,
            rounds=result.rounds,
            trials=result.trials,
            first_rounds=d.first_rounds,
            max_rounds=d.max_rounds,
            confirm_rounds=d.confirm_rounds,
            gain=_gain_delta(self.loop.playbook.goals.objective.metric, result.gain),
            gain_method=result.gain_method,
            engine_s=result.engine_s,
            grid_engine_s=result.grid_engine_s,
            grid_max_rounds_engine_s=result.grid_max_rounds_engine_s,
            unimodal=result.unimodal,
            familywise=result.familywise,
            finished=finished,
        )


def _gain_delta(metric: str, gain: Effect | None) -> MetricDelta | None:
    if gain is None:
        return None
    return MetricDelta(
        metric, None, None, gain.rel, gain.low, gain.high, units=gain.units, method=gain.method, confidence=gain.level
    )


def engine_line(result: SearchResult) -> str:
    """What the race cost against measuring every value as often (the console's second line of a search step)."""
    saved = 1.0 - result.engine_s / result.grid_engine_s if result.grid_engine_s > 0 else 0.0
    return (
        f"     search: {result.trials} trials over {result.rounds} rounds, {result.engine_s:.0f} engine-s "
        f"vs {result.grid_engine_s:.0f} s for a full grid ({saved:.0%} saved)"
    )


def search_header(head: str, space: SearchSpace, current: Scalar) -> str:
    values = ", ".join(map(repr, space.values))
    return f"{head}: search {space.target} over [{values}] (now {current!r})"


class SearchKind:
    """`search:`: the values of one knob raced against the configuration so far (SearchStepRun). A run stopped
    mid-search still archives the search's record of what it measured, then stops as any run does."""

    @property
    def form(self) -> StepForm:
        return SEARCH_FORM

    def run(self, loop: Loop, index: int, step: Step, best: ConfigTrials) -> ConfigTrials:
        run = SearchStepRun(loop, index, step, best)
        head = f"step {index}/{len(loop.playbook.steps)} {step.name}"
        loop.book.narrator.say(
            f"the header line of step {step.name}", lambda: search_header(head, run.space, run.current)
        )
        try:
            run.measure()
        except BaseException:
            with contextlib.suppress(Exception):  # the stop itself is what the run reports
                run.conclude(finished=False)
            raise
        return run.conclude()


SEARCH_KIND = SearchKind()
