"""A value search: one knob, several candidate values, raced in paired rounds against the incumbent.

The runner drives a `ValueSearch`: it asks `next_round()` which configurations to measure (the incumbent and the
values still in the race, in a seeded random order, all on the round's one request sequence), hands each trial back
with `record()`, and reads `result()` once `done`. Nothing here starts an engine or knows where a trial runs.

Statistics are the step's own (stats.decide, stats.intervals); this module only arranges them:
- Error control over candidates and looks: each value is judged against the incumbent by `decide_step` with a
  Bonferroni share of the run's error rate ((1 - confidence) / m for m candidates, the first step of Holm's
  procedure, which is all a single winner needs), inside the O'Brien-Fleming sequential boundary that
  `sequential_level` calibrates over every look of the race (first_rounds .. max_rounds). A
  value is kept only by that rule, so with no real gain anywhere a winner is declared at most (1 - confidence) / 2
  of the time, over all candidates and looks. Guards are judged inside the same call, as for any step.
- Racing (successive elimination): a value leaves the race when `decide_step` rejects it against the incumbent
  (a guard shown beyond its tolerance, or the objective shown worse), when its paired interval against the
  incumbent at drop_confidence shows it cannot reach min_effect, or when its paired interval against the current
  leader (the rounds both ran) shows it cannot beat the leader by min_effect: choosing either is then right within
  min_effect, the indifference zone of ranking and selection. Dropping a value costs power only, never the error
  rate of a keep (keeps are judged against the incumbent alone, at the familywise level), so drops use the plain
  drop_confidence at every look; a wrong drop of a value that was in fact better is measured by the benchmark's
  "right" column, not promised.
- Who may lead: "beats it" is always judged against the incumbent; "cannot beat the leader" only against a leader
  whose guards are shown to hold (every guard within its tolerance in its decision against the incumbent), since a
  leader whose guard is unsettled may yet be rejected on it. A value shown to beat the incumbent with its guards
  holding is dropped only for a leader shown to do the same; values dropped for a leader that then leaves the race
  against the incumbent rejoin it; and the winner is chosen among every value whose latest decision keeps it, in the
  race or dropped for a leader, so such a value is never lost to a leader later rejected.
- Ordered knobs (numbers) with at least BRACKET_FROM values are bracketed: the race starts with four values spread
  over the range, and a value joins when it neighbours the current leader, so a unimodal response is found
  without measuring its far side. The shape is checked every round: a value shown worse than a measured value on
  each side of it means more than one peak, and then every value joins (`unimodal` False in the result).
- Honest effect: once a value has won the race (kept against the incumbent, the others dropped), it runs
  `confirm_rounds` more pairs with the incumbent, a fixed number with no stopping rule, and the reported gain is
  estimated from those pairs only: they took no part in selecting it nor in keeping it, so the winner's curse
  does not reach them. With confirm_rounds 0 the gain comes from the selecting pairs, and the result says it is not
  corrected for selection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from llmplay.outcomes import FAILED, INCONCLUSIVE, KEPT, REJECTED, MetricDelta
from llmplay.spec import Goals, Scalar, Trials
from llmplay.stats.decide import (
    HOLDS,
    MIN_TRIALS_TO_DECIDE,
    Decision,
    TrialSample,
    compare_metric,
    decide_step,
    decision_level,
    guard_outcome,
    metric_value,
)
from llmplay.stats.intervals import Effect, paired_effect

# Ordered knobs with at least this many values are bracketed (SearchDesign.bracket).
BRACKET_FROM = 7
# Round phases: racing the candidates, then the winner's fixed confirmation pairs.
RACE, CONFIRM = "race", "confirm"
# Why a value left the race (ValueOutcome.status).
WINNER = "winner"
BEATS = "beats the incumbent"
DROPPED_VS_INCUMBENT = "rejected against the incumbent"
DROPPED_VS_LEADER = "shown worse than the leader"
UNMEASURED = "never measured (outside the bracket)"
IN_RACE = "in the race"


@dataclass(frozen=True)
class Arm:
    """One configuration of a round: the incumbent, or the knob at `value`."""

    value: Scalar
    incumbent: bool = False

    @property
    def label(self) -> str:
        return "incumbent" if self.incumbent else repr(self.value)


_INCUMBENT = Arm(None, incumbent=True)  # the incumbent's key where values key the others (never a knob's value)


@dataclass(frozen=True)
class Round:
    """Configurations to measure on one request sequence, in this order (seeded shuffle); `number` is the repeat
    every trial of the round carries, which pairs them."""

    number: int
    phase: str
    arms: tuple[Arm, ...]


@dataclass(frozen=True)
class SearchDesign:
    """How long the race may run. From the playbook's trials: first_rounds = repeats, max_rounds = max_repeats."""

    first_rounds: int = 2  # rounds every value gets before it can be dropped or kept
    max_rounds: int = 10  # most rounds one value is raced
    confirm_rounds: int = 3  # the winner's extra pairs its reported gain is estimated from
    confidence: float = 0.95
    bracket: bool = True  # ordered knobs: start with the ends and the middle
    # Level of the leader-versus-value intervals that drop values: a wrong drop costs power, never a false keep
    # (keeps are judged against the incumbent alone), so it needs no share of the run's error rate.
    drop_confidence: float = 0.95
    indifference: bool = True  # drop a value shown unable to beat the leader by min_effect, not only worse

    @classmethod
    def from_trials(cls, trials: Trials, confirm_rounds: int = 3) -> SearchDesign:
        first = max(trials.repeats, MIN_TRIALS_TO_DECIDE)
        return cls(first, max(trials.max_repeats, first), confirm_rounds, trials.confidence)


@dataclass(frozen=True)
class ValueOutcome:
    """One candidate value for the value chart: its change against the incumbent over every pair it ran (at the
    run's confidence, not corrected for selection), and what became of it."""

    value: Scalar
    pairs: int
    effect: MetricDelta | None
    status: str
    left_at_round: int | None = None
    reason: str = ""
    # The first round whose decision showed it beating the incumbent with its guards holding (None: never).
    beat_at_round: int | None = None


@dataclass(frozen=True)
class SearchResult:
    verdict: str  # kept (a winner), rejected (no value beats the incumbent), inconclusive, failed
    winner: Arm | None
    reason: str
    decision: Decision | None  # the winner (or the last value standing) against the incumbent, familywise level
    gain: Effect | None  # the reported gain of the winner (see gain_method)
    gain_method: str
    values: tuple[ValueOutcome, ...]
    rounds: int
    trials: int
    engine_s: float
    # What a full grid would have cost at this search's mean trial cost: every value and the incumbent measured as
    # often as the search measured its most-measured value (the same trials per value), and, for scale, as often
    # as the design allows one value (max_rounds, plus the confirmation pairs when there was a winner).
    grid_engine_s: float
    grid_max_rounds_engine_s: float
    unimodal: bool | None  # None: not an ordered knob, or too few values to tell
    familywise: str


def _objective(sample: TrialSample, metric: str) -> float | None:
    """A trial's objective where a log ratio can use it (finite, positive)."""
    value = metric_value([sample], metric)
    return value if value is not None and math.isfinite(value) and value > 0 else None


class ValueSearch:
    """The racing procedure for one search step; see the module docstring for its rules."""

    def __init__(
        self,
        values: Sequence[Scalar],
        goals: Goals,
        design: SearchDesign,
        *,
        ordered: bool,
        seed: int,
        current: Scalar | object = None,
        has_current: bool = False,
    ):
        """`current` (when `has_current`): the value the incumbent already runs; it is not raced against itself."""
        self.goals = goals
        self.design = design
        self.ordered = ordered
        self.values = tuple(v for v in values if not (has_current and v == current))
        self.metric = goals.objective.metric
        self.lower_better = goals.objective.direction == "minimize"
        # A value that cannot beat the leader by min_effect is not worth telling apart from it: choosing either is
        # right within min_effect (the indifference zone of ranking and selection).
        self.indifference = goals.objective.min_effect if design.indifference else 0.0
        self._rng = np.random.default_rng(seed)
        self._samples: dict[Scalar | Arm, dict[int, TrialSample]] = {}
        self._incumbent: dict[int, TrialSample] = {}
        # Each trial's objective by round, read once when recorded: the race's every look compares them again.
        self._objective: dict[Scalar | Arm, dict[int, float]] = {}
        self._engine_s = 0.0
        self._trials = 0
        self._round = 0
        self._pending: Round | None = None
        self._received: set[Arm] = set()
        self._entered: list[int] = []  # indexes into self.values, in the race or left it
        self._active: list[int] = []
        self._rounds_in = [0] * len(self.values)  # race rounds each value was scheduled in
        self._status: dict[int, tuple[str, int | None, str]] = {}
        self._winner: int | None = None
        self._confirm_from: int | None = None
        self._done = not self.values
        self._verdict: tuple[str, str] | None = None if self.values else (FAILED, "no value to search")
        self._decisions: dict[int, Decision] = {}
        # value -> the first round it was kept against the incumbent, and that decision: crossing the sequential
        # boundary once is the keep (the familywise level covers every look), so later looks do not undo it
        self._beat_at: dict[int, int] = {}
        self._keeping: dict[int, Decision] = {}
        self._dropped_for: dict[int, int] = {}  # value dropped against a leader -> that leader
        self.unimodal: bool | None = None
        self._enter(self._initial())

    # ------------------------------------------------------------------------------------------ the runner's side
    @property
    def done(self) -> bool:
        return self._done

    @property
    def candidates(self) -> int:
        return len(self.values)

    def next_round(self) -> Round | None:
        """The next round to measure (the same one again until every arm of it is recorded); None when done."""
        if self._done:
            return None
        if self._pending is None:
            self._round += 1
            if self._confirm_from is not None and self._winner is not None:
                arms = [Arm(None, incumbent=True), Arm(self.values[self._winner])]
                phase = CONFIRM
            else:
                racing = [i for i in self._active if self._rounds_in[i] < self.design.max_rounds]
                for i in racing:
                    self._rounds_in[i] += 1
                arms = [Arm(None, incumbent=True), *(Arm(self.values[i]) for i in racing)]
                phase = RACE
            order = self._rng.permutation(len(arms))
            self._pending = Round(self._round, phase, tuple(arms[int(i)] for i in order))
            self._received = set()
        return self._pending

    def samples_of(self, arm: Arm) -> tuple[TrialSample, ...]:
        """Every successful trial of `arm` so far, by round: what the gates, the tuning record and the value chart
        of that configuration are computed from."""
        store = self._incumbent if arm.incumbent else self._samples.get(arm.value, {})
        return tuple(store[r] for r in sorted(store))

    def record(self, number: int, arm: Arm, sample: TrialSample | None, engine_s: float | None = None) -> None:
        """One trial of round `number` (None: it failed; its pairs are left out). `engine_s`: the engine time it
        took (start to stop); its load duration when not given."""
        pending = self._pending
        if pending is None or number != pending.number or arm not in pending.arms or arm in self._received:
            raise ValueError(f"round {number} does not expect a trial of {arm.label} now")
        self._received.add(arm)
        self._trials += 1
        self._engine_s += engine_s if engine_s is not None else (sample.duration_s if sample else 0.0)
        if sample is not None:
            store = self._incumbent if arm.incumbent else self._samples.setdefault(arm.value, {})
            store[number] = replace(sample, repeat=number)
            value = _objective(sample, self.metric)
            if value is not None:
                self._objective.setdefault(_INCUMBENT if arm.incumbent else arm.value, {})[number] = value
        if len(self._received) == len(pending.arms):
            self._pending = None
            if pending.phase == CONFIRM:
                if self._confirm_from is not None and number - self._confirm_from + 1 >= self.design.confirm_rounds:
                    self._after_confirm()
            else:
                self._after_race(pending.number)

    # ------------------------------------------------------------------------------------------ bracketing
    def _initial(self) -> list[int]:
        """Every value, or for a long ordered range four spread over it: a value that joins late runs its first
        rounds after the others, so below BRACKET_FROM values bracketing costs more rounds than it saves."""
        k = len(self.values)
        if not (self.ordered and self.design.bracket) or k < BRACKET_FROM:
            return list(range(k))
        ranked = sorted(range(k), key=lambda i: self.values[i])  # type: ignore[arg-type, return-value]
        return sorted({ranked[round(x)] for x in np.linspace(0, k - 1, 4)})

    def _enter(self, indexes: Sequence[int]) -> None:
        for i in indexes:
            if i not in self._entered:
                self._entered.append(i)
                self._active.append(i)
                self._status[i] = (IN_RACE, None, "")

    def _order(self) -> list[int]:
        """Entered values by the knob's order (ordered knobs only)."""
        return sorted(self._entered, key=lambda i: self.values[i])  # type: ignore[arg-type, return-value]

    # ------------------------------------------------------------------------------------------ statistics
    def _pairs(self, i: int) -> tuple[list[TrialSample], list[TrialSample]]:
        mine = self._samples.get(self.values[i], {})
        common = sorted(set(mine) & set(self._incumbent))
        return [self._incumbent[r] for r in common], [mine[r] for r in common]

    def _race_trials(self) -> Trials:
        """Trials whose decision_level is this search's: a Bonferroni share of the error rate per candidate,
        inside one sequential boundary over every look the search may take."""
        d = self.design
        share = (1.0 - d.confidence) / len(self.values)
        return Trials(
            repeats=d.first_rounds,
            interleave=True,
            sequential=True,
            max_repeats=self.design.max_rounds,
            confidence=1.0 - share,
        )

    def _may_decide(self, a: Sequence[TrialSample], b: Sequence[TrialSample], trials: Trials) -> bool:
        """Whether decide_step could return more than inconclusive: always with guards; without them only when the
        objective's interval at the look's level already clears 0 or falls short of min_effect. A shortcut that
        saves the full decision (every recorded metric) at looks that cannot decide."""
        if self.goals.guards:
            return True
        xa = [metric_value([s], self.metric) for s in a]
        xb = [metric_value([s], self.metric) for s in b]
        if any(x is None for x in (*xa, *xb)):
            return True
        effect = paired_effect(xa, xb, decision_level(trials, len(a)))  # type: ignore[arg-type]
        if effect.low is None or effect.high is None:
            return True
        sign = -1.0 if self.lower_better else 1.0
        low, high = sorted((sign * effect.low, sign * effect.high))
        return low > 0 or high < self.goals.objective.min_effect

    def _futile(self, i: int) -> str | None:
        """Why value i cannot beat the incumbent by min_effect, shown at drop_confidence (None: not shown). Dropping
        for futility never makes a keep more likely, so, like a drop against the leader, it needs no share of the
        error rate; it costs power only, and the search's "rejected" rests on it."""
        a, b = self._objective.get(_INCUMBENT, {}), self._objective.get(self.values[i], {})
        common = sorted(set(a) & set(b))
        if len(common) < self.design.first_rounds:
            return None
        effect = paired_effect([a[r] for r in common], [b[r] for r in common], self.design.drop_confidence)
        if not self._shown_worse(effect, self.goals.objective.min_effect):
            return None
        return (
            f"{self.metric} {effect.rel:+.1%} [{effect.low:+.1%}, {effect.high:+.1%}] against the incumbent "
            f"({self.design.drop_confidence:.0%}): cannot reach the {self.goals.objective.min_effect:.0%} minimum effect"
        )

    def _gain_log(self, i: int) -> float | None:
        """The mean per-pair log ratio against the incumbent, in the good direction."""
        a, b = self._objective.get(_INCUMBENT, {}), self._objective.get(self.values[i], {})
        common = sorted(set(a) & set(b))
        if not common:
            return None
        mean = float(np.mean([math.log(b[r] / a[r]) for r in common]))
        return -mean if self.lower_better else mean

    def _versus(self, leader: int, other: int) -> Effect | None:
        """`other` relative to `leader` on the rounds both ran, at the sequential level of that many rounds."""
        a, b = self._objective.get(self.values[leader], {}), self._objective.get(self.values[other], {})
        common = sorted(set(a) & set(b))
        if len(common) < self.design.first_rounds:
            return None
        return paired_effect([a[r] for r in common], [b[r] for r in common], self.design.drop_confidence)

    def _shown_worse(self, effect: Effect | None, margin: float = 0.0) -> bool:
        """The interval shows the change below `margin` in the good direction (worse, when margin is 0)."""
        if effect is None or effect.low is None or effect.high is None:
            return False
        return effect.low > -margin if self.lower_better else effect.high < margin

    def _drop_reason(self, leader: int) -> str:
        if self.indifference > 0:
            return f"shown not to beat {self.values[leader]!r} by {self.indifference:.0%}"
        return f"shown worse than {self.values[leader]!r}"

    def _drop(self, i: int, status: str, number: int, reason: str) -> None:
        self._active.remove(i)
        self._status[i] = (status, number, reason)

    def _kept(self, i: int) -> bool:
        """Shown at some look to beat the incumbent with every guard within its tolerance, and not rejected since
        (a rejected value leaves the race and is never a candidate)."""
        return i in self._keeping

    def _guards_hold(self, i: int) -> bool:
        """Every guard shown within its tolerance in the value's latest decision against the incumbent (trivially
        without guards): only such a value may lead, since a leader with a guard unsettled may yet be rejected."""
        if not self.goals.guards:
            return True
        decision = self._decisions.get(i)
        if decision is None or len(decision.guards) != len(self.goals.guards):
            return False
        return all(
            guard_outcome(delta, g.direction == "minimize", g.tolerance, g.absolute) == HOLDS
            for g, delta in zip(self.goals.guards, decision.guards, strict=True)
        )

    def _leave_against_incumbent(self, i: int, number: int, reason: str) -> None:
        """Value i leaves the race against the incumbent; the values dropped only for it, as their leader, rejoin."""
        self._drop(i, DROPPED_VS_INCUMBENT, number, reason)
        for j, leader in list(self._dropped_for.items()):
            if leader == i:
                del self._dropped_for[j]
                self._active.append(j)
                self._status[j] = (IN_RACE, None, "")

    # ------------------------------------------------------------------------------------------ after a round
    def _judge(self, number: int, ready: Sequence[int], trials: Trials) -> None:
        """Each ready value against the incumbent: its decision, and its exit when rejected or futile."""
        for i in ready:
            a, b = self._pairs(i)
            if not self._may_decide(a, b, trials):
                self._decisions.pop(i, None)
                continue
            judged = decide_step(a, b, self.goals, trials)
            self._decisions[i] = judged
            if judged.verdict == KEPT:
                self._beat_at.setdefault(i, number)
                self._keeping.setdefault(i, judged)
            elif judged.verdict == REJECTED:
                self._keeping.pop(i, None)
                self._leave_against_incumbent(i, number, judged.reason)
        for i in [i for i in ready if i in self._active and i not in self._keeping]:
            futile = self._futile(i)
            if futile:
                self._leave_against_incumbent(i, number, futile)

    def _race_leader(self, number: int, ready: Sequence[int]) -> None:
        """Drop the values shown unable to beat the leader by min_effect: the best value whose guards are shown to
        hold; a value kept against the incumbent only for a leader kept as well."""
        scored = [(g, i) for i in self._active if self._guards_hold(i) and (g := self._gain_log(i)) is not None]
        if not scored:
            return
        leader = max(scored)[1]
        leader_kept = self._kept(leader)
        for i in list(self._active):
            if i == leader or i not in ready or (self._kept(i) and not leader_kept):
                continue
            if self._shown_worse(self._versus(leader, i), self.indifference):
                self._drop(i, DROPPED_VS_LEADER, number, self._drop_reason(leader))
                self._dropped_for[i] = leader

    def _after_race(self, number: int) -> None:
        trials = self._race_trials()
        ready = [i for i in self._active if len(self._pairs(i)[0]) >= self.design.first_rounds]
        self._judge(number, ready, trials)
        self._race_leader(number, ready)
        scored = [(g, i) for i in self._active if (g := self._gain_log(i)) is not None]
        leader = max(scored)[1] if scored else None
        if self.ordered and self.design.bracket:
            self._bracket(leader)
        if not self._active:
            self._finish(
                REJECTED,
                "no value beats the incumbent: each was shown worse or unable to reach the minimum effect",
                None,
            )
            return
        only = self._active[0] if len(self._active) == 1 and self._all_entered_or_bracketed() else None
        out_of_rounds = all(self._rounds_in[i] >= self.design.max_rounds for i in self._active)
        if only is None and not out_of_rounds:
            return
        # The winner: the best value whose latest decision keeps it, in the race or dropped only for a leader.
        kept = [
            (g, i)
            for i in (*self._active, *self._dropped_for)
            if self._kept(i) and (g := self._gain_log(i)) is not None
        ]
        pick = max(kept)[1] if kept else (only if only is not None else leader)
        if pick is None:
            self._finish(INCONCLUSIVE, "no value has a measured objective", None)
            return
        if not kept and self._decisions.get(pick) is None and self._pairs(pick)[0]:
            self._decisions[pick] = decide_step(*self._pairs(pick), self.goals, trials)  # its advice on more pairs
        if self._kept(pick):
            self._winner = pick
            if self.design.confirm_rounds > 0:
                self._confirm_from = self._round + 1
            else:
                self._after_confirm()
        elif self._rounds_in[pick] >= self.design.max_rounds:
            decision = self._decisions.get(pick)
            why = decision.reason if decision else "too few pairs"
            self._finish(INCONCLUSIVE, f"{self.values[pick]!r} leads but does not beat the incumbent: {why}", pick)

    def _all_entered_or_bracketed(self) -> bool:
        """A lone survivor wins the race only when no value could still join it (the bracket is closed)."""
        if not (self.ordered and self.design.bracket):
            return True
        return not self._joinable(self._active[0])

    def _joinable(self, leader: int) -> list[int]:
        """Unmeasured values next to the leader in the knob's order: where a unimodal peak could still be."""
        k = len(self.values)
        ranked = sorted(range(k), key=lambda i: self.values[i])  # type: ignore[arg-type, return-value]
        at = ranked.index(leader)
        out = []
        for step in (-1, 1):
            j = at + step
            while 0 <= j < k and ranked[j] not in self._entered:
                out.append(ranked[j])
                break
        return out

    def _bracket(self, leader: int | None) -> None:
        order = self._order()
        if len(order) >= 3 and self.unimodal is not False:
            for at, mid in enumerate(order):
                if any(self._shown_worse(self._versus(x, mid)) for x in order[:at]) and any(
                    self._shown_worse(self._versus(x, mid)) for x in order[at + 1 :]
                ):
                    self.unimodal = False  # a dip between two measured values: more than one peak
                    self._enter(range(len(self.values)))
                    return
            if len(self._entered) == len(self.values):
                self.unimodal = True
        if leader is not None:
            self._enter(self._joinable(leader))

    def _after_confirm(self) -> None:
        winner = self._winner
        assert winner is not None
        # The keep was decided by the race; the confirmation pairs only measure the gain, so that estimate is not
        # read only where it helped keep the value (which would bias it up whenever the keep was marginal).
        self._finish(KEPT, self._keeping[winner].reason, winner)

    def _finish(self, verdict: str, reason: str, pick: int | None) -> None:
        self._verdict = (verdict, reason)
        self._winner = pick
        self._done = True
        self._pending = None

    # ------------------------------------------------------------------------------------------ the result
    def _gain(self) -> tuple[Effect | None, str]:
        pick = self._winner
        if pick is None:
            return None, "no winner"
        a, b = self._pairs(pick)
        start = self._confirm_from
        if start is not None:
            a = [s for s in a if (s.repeat or 0) >= start]
            b = [s for s in b if (s.repeat or 0) >= start]
        xa = [metric_value([s], self.metric) for s in a]
        xb = [metric_value([s], self.metric) for s in b]
        kept = [(x, y) for x, y in zip(xa, xb, strict=True) if x is not None and y is not None]
        effect = paired_effect([x for x, _ in kept], [y for _, y in kept], self.design.confidence) if kept else None
        if start is not None:
            return effect, f"re-estimated from {len(kept)} pair(s) not used to select it"
        return effect, f"from the {len(kept)} pair(s) that selected it (not corrected for selection)"

    def result(self) -> SearchResult:
        verdict, reason = self._verdict or (INCONCLUSIVE, "the search has not finished")
        kept = verdict == KEPT
        outcomes = []
        for i, value in enumerate(self.values):
            a, b = self._pairs(i)
            effect = compare_metric(a, b, self.metric, level=self.design.confidence, paired=True) if a and b else None
            status, at, why = self._status.get(i, (UNMEASURED, None, ""))
            if i == self._winner and kept:
                status = WINNER
            elif status == IN_RACE and self._decisions.get(i) and self._decisions[i].verdict == KEPT:
                status = BEATS
            outcomes.append(ValueOutcome(value, len(a), effect, status, at, why, self._beat_at.get(i)))
        gain, method = self._gain() if kept else (None, "no winner")
        per_trial = self._engine_s / self._trials if self._trials else 0.0
        most = max((len(self._samples.get(v, {})) for v in self.values), default=0)
        d = self.design
        m = len(self.values)
        return SearchResult(
            verdict=verdict,
            winner=Arm(self.values[self._winner]) if kept and self._winner is not None else None,
            reason=reason,
            decision=(self._keeping if kept else self._decisions).get(self._winner)
            if self._winner is not None
            else None,
            gain=gain,
            gain_method=method,
            values=tuple(outcomes),
            rounds=self._round,
            trials=self._trials,
            engine_s=self._engine_s,
            grid_engine_s=(m + 1) * max(most, 1) * per_trial,
            grid_max_rounds_engine_s=(m + 1) * (d.max_rounds + (d.confirm_rounds if kept else 0)) * per_trial,
            unimodal=self.unimodal,
            familywise=(
                f"Bonferroni over {m} value(s) ({(1 - d.confidence) / max(m, 1):.2%} each), inside one "
                f"O'Brien-Fleming sequential boundary over rounds {d.first_rounds}..{d.max_rounds}"
            ),
        )
