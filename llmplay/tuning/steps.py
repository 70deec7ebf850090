"""The step loop: the baseline, then each step's A/B pairs, its verdict, and what is carried forward.

It asks its scheduler for pairs of trials and knows nothing of where they run; the book archives every trial before
the loop counts it, so an interrupted run resumes without measuring an archived trial again."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from llmplay.archive.model import FAILED, KEPT, TRIAL_FAILED, TRIAL_OK, MetricDelta, StepVerdict, TrialRecord, TuningRow
from llmplay.archive.probes import load_probes
from llmplay.catalog import CAPACITY_METRICS, RECORD_METRICS, SAMPLE_COUNT_KEYS
from llmplay.spec import ChangeEffect, Config, Playbook, Step, Trials
from llmplay.stats.decide import Decision, TrialSample, decide_step, pooled_summary
from llmplay.stats.intervals import Noise, pooled_noise
from llmplay.stats.power import auto_pairs, plan_text
from llmplay.tuning.book import ConfigTrials, TrialBook, TrialSlot
from llmplay.tuning.history_noise import HistoryNoise
from llmplay.tuning.kinds import kind_of
from llmplay.tuning.progress import step_line, verdict_line
from llmplay.tuning.quality import judge_quality, speed_goals
from llmplay.tuning.schedule import TrialScheduler
from llmplay.tuning.schedule.race import RacingScheduler
from llmplay.tuning.signals import StopRun


def candidate_first(run_id: str, step: str, repeat: int) -> bool:
    """Which side of pair `repeat` starts, drawn per pair from the run id (archived): alternating A B | B A puts the
    candidates of consecutive pairs next to each other, so trials that drift together make those pairs alike and
    their spread too small; a random order leaves any advantage of starting second as noise, not as an effect."""
    digest = hashlib.sha256(f"{run_id}\0{step}\0{repeat}".encode()).digest()
    return bool(digest[0] & 1)


class StepLoop:
    """One pass over the playbook's steps. `verdicts`, `noise` and `record_rows` grow as it goes, so a run stopped
    half-way still archives what it decided."""

    def __init__(
        self,
        playbook: Playbook,
        book: TrialBook,
        scheduler: TrialScheduler,
        write_config: Callable[[Config], None],
        history: HistoryNoise | None = None,
    ):
        self.playbook, self.book, self.scheduler, self.write_config = playbook, book, scheduler, write_config
        self.history = history  # earlier comparable runs' step noise (trials.noise: history)
        self.trials = playbook.trials  # the step's own: max_repeats sized per step when auto
        self._wall_s: list[float] = []  # each measured trial's engine time, what a budget is spent in
        self.verdicts: list[StepVerdict] = []
        # Each decided step's own noise per metric, what later steps borrow when trials.pool_noise is on.
        self.noise: dict[str, list[Noise]] = {}
        self.record_rows: list[TuningRow] = []

    def run(self, best: ConfigTrials) -> ConfigTrials:
        """The baseline (alone when there are no steps) and each step's A/B pairs and verdict; the final config."""
        steps = self.playbook.steps
        if not steps:
            slots = [[TrialSlot(best.config, None, "baseline", r)] for r in range(self.playbook.trials.repeats)]
            self.scheduler.run(slots, lambda _, trial, sample: self.count(best, trial, sample))
            self.record_rows.append(_record_row(best, None))
        index = 1
        while index <= len(steps):
            raced = _race_from(steps, index - 1)
            if raced:
                best = self._race(index, raced, best)
                index += len(raced)
            else:
                best = self._step(index, steps[index - 1], best)
                index += 1
        return best

    def _race(self, first: int, raced: Sequence[Step], best: ConfigTrials) -> ConfigTrials:
        """Consecutive `carry: race` steps, each measured against `best` (their pairs at once where the scheduler has
        room for more than one pair: a cluster; one after the other otherwise), then the first of them kept (in the
        playbook's order) carried; a later kept one's verdict says which step was carried instead."""
        as_kept = [replace(step, carry="if_kept") for step in raced]
        runs = [partial(self._step, first + i, step, best) for i, step in enumerate(as_kept)]
        if len(runs) > 1 and self.scheduler.batch([best.config]) > 1:
            racing: RacingScheduler[ConfigTrials] = RacingScheduler(self.scheduler)
            self.scheduler = racing
            try:
                results = racing.race(runs)
            finally:
                self.scheduler = racing.inner
        else:
            results = [run() for run in runs]
        carried: tuple[str, ConfigTrials] | None = None
        for step, result in zip(raced, results, strict=True):
            verdict = next(v for v in reversed(self.verdicts) if v.step == step.name)
            if not verdict.carried:
                continue
            if carried is None:
                carried = (step.name, result)
                continue
            self._not_carried(verdict, f"; not carried: {carried[0]}, before it in the race, was")
        return carried[1] if carried is not None else best

    def _not_carried(self, verdict: StepVerdict, why: str) -> None:
        """A raced step kept but not carried: its verdict (archived, and in this loop's lists) says so."""
        changed = replace(verdict, carried=False, reason=verdict.reason + why)
        self.book.archive.write_verdict(changed)
        self.verdicts = [changed if v is verdict else v for v in self.verdicts]
        self.record_rows = [
            replace(r, reason=changed.reason) if r.step == verdict.step else r for r in self.record_rows
        ]

    def _step(self, index: int, step: Step, best: ConfigTrials) -> ConfigTrials:
        return kind_of(step).run(self, index, step, best)

    def measure_candidate(
        self, index: int, step: Step, best: ConfigTrials, candidate: Config, effects: Sequence[ChangeEffect]
    ) -> ConfigTrials:
        """`candidate` against `best` in A/B pairs, decided (quality guards from the probes), its verdict archived;
        the configuration carried on by the step's carry rule."""
        self.write_config(candidate)
        cand, reference = ConfigTrials(candidate), ConfigTrials(best.config)
        head = f"step {index}/{len(self.playbook.steps)} {step.name}"
        self.book.narrator.say(f"the header line of step {step.name}", lambda: step_line(head, effects))
        self.book.narrator.say(f"the power line of step {step.name}", self._power_line)
        # The step's own trials (not only self.trials): raced steps are measured side by side.
        trials = self.trials = self._sized()
        self._measure_pair(reference, cand, step, trials)
        decision = self._decide(reference, cand, trials)
        decision = judge_quality(decision, self.playbook.goals, reference.probes, cand.probes, effects)
        carried = (step.carry == "always" and decision.verdict != FAILED) or (
            step.carry == "if_kept" and decision.verdict == KEPT
        )
        verdict = StepVerdict(
            step=step.name,
            index=index,
            verdict=decision.verdict,
            reason=decision.reason,
            changes=tuple(e.describe() for e in effects),
            bundle=step.bundle,
            baseline_config=reference.config.label,
            candidate_config=candidate.label,
            objective=decision.objective,
            guards=decision.guards,
            deltas=decision.deltas,
            trials_baseline=tuple(reference.trial_ids),
            trials_candidate=tuple(cand.trial_ids),
            more_trials_needed=decision.more_trials_needed,
            carried=carried,
            noise=tuple((m, n.var, n.df) for m, n in decision.noise.items()),
            noise_runs=self.history.runs if self.history is not None and _pooled_history(decision) else (),
        )
        self.book.archive.write_verdict(verdict)
        self.verdicts.append(verdict)
        for metric, noise in decision.noise.items():
            self.noise.setdefault(metric, []).append(noise)
        self.book.narrator.say(f"the verdict line of step {step.name}", lambda: verdict_line(decision))
        self.add_record_rows(index, reference, cand, verdict)
        return cand if carried else reference

    def add_record_rows(
        self, index: int, reference: ConfigTrials, cand: ConfigTrials | None, verdict: StepVerdict
    ) -> None:
        """The tuning record's rows of a decided step: the configuration it started from (first step only), and
        the one it measured against it."""
        if index == 1:
            self.record_rows.append(_record_row(reference, None))
        if cand is not None:
            self.record_rows.append(_record_row(cand, verdict))

    def _measure_pair(self, reference: ConfigTrials, cand: ConfigTrials, step: Step, trials: Trials) -> None:
        """A B, B A, B A, A B ... in an order drawn per pair (candidate_first), or A A B B; in sequential mode, more
        pairs until the verdict is no longer inconclusive. A pair is the unit a scheduler keeps on one machine."""
        sides = [(reference, "baseline"), (cand, "candidate")]

        def pair(r: int) -> list[TrialSlot]:
            drawn = trials.interleave and candidate_first(self.book.archive.run_id, step.name, r)
            return [TrialSlot(m.config, step.name, role, r) for m, role in (sides[::-1] if drawn else sides)]

        def take(slot: TrialSlot, trial: TrialRecord, sample: TrialSample | None) -> None:
            self.count(reference if slot.role == "baseline" else cand, trial, sample)

        self.scheduler.run([pair(r) for r in range(trials.repeats)], take)
        rep = trials.repeats
        while trials.sequential and rep < trials.max_repeats:
            if self._decide(reference, cand, trials).verdict != "inconclusive":
                break
            # One look per batch: a pair per free node on a cluster, one pair on one machine. Looking less often
            # than after every pair only leaves the sequential level (calibrated for every pair) conservative.
            batch = min(self.scheduler.batch([reference.config, cand.config]), trials.max_repeats - rep)
            self.scheduler.run([pair(r) for r in range(rep, rep + batch)], take)
            rep += batch

    def _decide(self, reference: ConfigTrials, cand: ConfigTrials, trials: Trials) -> Decision:
        """The verdict from the timed trials: one call for sequential mode's stopping check and the final verdict,
        so the two agree (quality.* guards are judged from the probes afterwards, judge_quality)."""
        decision = decide_step(
            reference.samples,
            cand.samples,
            speed_goals(self.playbook.goals),
            trials,
            failed_candidate_trials=cand.failed,
            borrowed=self.noise,
            history=self.history.noise if self.history is not None else None,
        )
        return _node_blocks(decision, reference, cand)

    def _power_line(self) -> str:
        """What the planned pairs can show, from the noise known before the step: the history's, else the run's
        earlier steps' (stats.power.plan_text)."""
        source = "the history and this run" if self.history is not None and self.history.runs else "this run's steps"
        return "     " + plan_text(self.playbook.goals, self.playbook.trials, self._known_noise(), source)

    def _known_noise(self) -> dict[str, Noise]:
        history = self.history.noise if self.history is not None else {}
        known = {}
        for metric in {*history, *self.noise}:
            pooled = pooled_noise([*self.noise.get(metric, ()), *([history[metric]] if metric in history else [])])
            if pooled is not None:
                known[metric] = pooled
        return known

    def _sized(self) -> Trials:
        """The step's trials: the playbook's, with max_repeats sized for power when it is auto."""
        trials = self.playbook.trials
        if not trials.max_repeats_auto:
            return trials
        trial_s = sum(self._wall_s) / len(self._wall_s) if self._wall_s else 0.0
        pairs, why = auto_pairs(self.playbook.goals, trials, self._known_noise(), trial_s)
        self.book.narrator.say("the pairs max_repeats auto sized", lambda: f"     {why}")
        return replace(trials, max_repeats=pairs)

    def count(self, target: ConfigTrials, trial: TrialRecord, sample: TrialSample | None) -> None:
        """One measured trial counted into its configuration (and the run stopped if the playbook says so)."""
        target.trial_ids.append(trial.trial_id)
        if trial.wall_s:
            self._wall_s.append(float(trial.wall_s))
        if trial.node is not None and trial.node.id:
            target.nodes[trial.repeat] = trial.node.id
        if target.probes is None and trial.status == TRIAL_OK:
            target.probes = load_probes(self.book.archive.run_dir, trial.trial_id)
        if sample is None:
            target.failed += 1
        else:
            target.samples.append(sample)
        if trial.status == TRIAL_FAILED and self.playbook.trials.on_failure == "stop":
            raise StopRun(f"trial {trial.trial_id} failed and on_failure is stop: {trial.error}")


def _race_from(steps: Sequence[Step], start: int) -> Sequence[Step]:
    """The `carry: race` steps that follow one another from `start` (none when that step does not race)."""
    end = start
    while end < len(steps) and steps[end].carry == "race":
        end += 1
    return steps[start:end]


def _pooled_history(decision: Decision) -> bool:
    """Whether a paired interval of the decision pooled the history's noise (its method says so)."""
    return any("history's" in (d.method or "") for d in (decision.objective, *decision.guards) if d is not None)


def _node_blocks(decision: Decision, reference: ConfigTrials, cand: ConfigTrials) -> Decision:
    """On a cluster every A/B pair ran on one node, so each pair's log ratio is free of node-to-node differences: the
    node is a block of the paired design. Said in each paired interval's method, for the archive and the report."""
    common = set(reference.nodes) & set(cand.nodes)
    if not common or any(reference.nodes[r] != cand.nodes[r] for r in common):
        return decision

    def blocked(delta: MetricDelta) -> MetricDelta:
        if not (delta.method or "").startswith("paired"):
            return delta
        return replace(delta, method=f"{delta.method}, each pair on one node ({len(set(cand.nodes.values()))} nodes)")

    return replace(
        decision,
        objective=blocked(decision.objective) if decision.objective is not None else None,
        guards=tuple(map(blocked, decision.guards)),
        deltas=tuple(map(blocked, decision.deltas)),
    )


def _record_row(measured: ConfigTrials, verdict: StepVerdict | None) -> TuningRow:
    return tuning_record_row(measured.config.label, measured.trial_ids, measured.failed, measured.samples, verdict)


def tuning_record_row(
    config_id: str,
    trial_ids: Sequence[str],
    failed_trials: int,
    samples: Sequence[TrialSample],
    verdict: StepVerdict | None,
) -> TuningRow:
    """One row of the tuning record: a configuration's pooled figures and, for a step, its verdict."""
    summary = pooled_summary(samples)
    row = TuningRow(
        config_id=config_id,
        trials=tuple(trial_ids),
        metrics={m: summary[m] for m in (*RECORD_METRICS, *CAPACITY_METRICS) if m in summary},
        failed_trials=failed_trials,
        samples={k: int(summary[k]) for k in SAMPLE_COUNT_KEYS if k in summary},  # what the percentiles rest on
    )
    if verdict is None:
        return row
    return replace(
        row,
        step=verdict.step,
        verdict=verdict.verdict,
        reason=verdict.reason,
        compared_with=verdict.baseline_config,
        changes=tuple(verdict.changes),
    )
