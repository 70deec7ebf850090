"""cpu-tiny-history run twice into one archive, simulated: how often the second run (`trials.noise: history`, with the
first run's step noise as its history) decides at least as many steps as the first in no more engine time.

The design is playbooks/cpu-tiny-history.yaml's, loaded through the product's loader: two steps, two A/B pairs at the
first look, then one more per inconclusive look up to four (sequential), P95 TTFT minimized with a 10 % minimum
effect, guards output tokens/s within 25 % and errors.rate within 2 points. Each step is decided by `decide_step` as
the runner drives it (benchmarks/verdicts.py `_run_step`: the same looks, the run's earlier steps' noise as
`borrowed`, the history as `history`); the first run's history is empty (the runner's HistoryNoise() when the archive
holds no comparable run: its own steps pooled, `moderate`), a later run's is every earlier run's recorded step noise
pooled per metric as tuning.history_noise pools an archive's (`pooled_noise`), checked against the run's own by
`with_history`'s F test. Each step's power line is `plan_text` over the noise the runner knows before the step.

The truth is the two real runs of 2026-12-06 (`--archive /tmp/twice5`, the README's pair): their per-pair log ratios
give the per-pair noise (`REAL`, printed first), their trials' measured requests the count each trial has (drawn per
trial: the errors.rate guard's count interval rests on them), and the steps' effects are parallel-4 about -55 % P95
TTFT and +5 % throughput, kv-cache-q8 about +40 % and -12 %. Engine time is proportional to pairs (a trial is a fixed
6 s of load plus the engine's start, about 11 s in both runs).

Per scenario, 1,000 repetitions (by default) of: a first run (no history); runs 2-6, each with the earlier ones as
history (the "1 earlier run" row is run 2, the README's line; "5 earlier runs" is run 6); the first run's own trials
decided again with an independent earlier run as history (what the history changes when the trials are the same); and
a run whose history is the true noise with 10^6 degrees of freedom (the oracle: the noise known exactly). Reported per
row: how often the second run decides at least as many steps, in no more pairs, both (the line); mean pairs and steps
decided; how often the F test refused the history; false decisions; the detectable effect the power lines printed.

    PYTHONPATH=. .venv/bin/python benchmarks/twice.py                 # the tables (about 4 minutes of one core)
    PYTHONPATH=. .venv/bin/python benchmarks/twice.py --reps 300      # quicker, noisier
    PYTHONPATH=. .venv/bin/python benchmarks/twice.py --requests-factor 2 --only pooled   # 12 s trials' requests
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.verdicts import Row, StepOutcome, _run_step
from llmplay.archive.model import KEPT, REJECTED
from llmplay.playbook.load import load_playbook
from llmplay.spec import Playbook
from llmplay.stats import decide, intervals
from llmplay.stats.intervals import Noise, pooled_noise, wilson_interval
from llmplay.stats.power import plan_text
from llmplay.tuning.quality import speed_goals

PLAYBOOK = Path(__file__).resolve().parents[1] / "playbooks" / "cpu-tiny-history.yaml"
TTFT, TOK_S = "ttft.p95", "throughput.output_tok_s"

# The two real runs' trial lines (/tmp/twice5, README): per step, per pair (P95 TTFT ms baseline, candidate, output
# tok/s baseline, candidate).
REAL: Mapping[str, Mapping[str, tuple[tuple[float, float, float, float], ...]]] = {
    "run 1": {
        "parallel-4": (
            (467.9, 211.4, 284.2, 272.9),
            (444.8, 187.3, 273.7, 320.9),
            (432.7, 132.7, 339.0, 359.6),
            (533.8, 223.6, 265.5, 282.3),
        ),
        "kv-cache-q8": ((190.8, 358.3, 358.1, 236.4), (136.5, 244.6, 300.6, 279.2)),
    },
    "run 2": {
        "parallel-4": (
            (472.4, 225.2, 254.1, 263.5),
            (458.5, 161.3, 292.8, 335.1),
            (363.6, 183.3, 347.9, 293.7),
            (458.2, 238.0, 293.6, 270.3),
        ),
        "kv-cache-q8": ((172.9, 380.8, 308.8, 242.6), (205.4, 205.2, 277.1, 247.8), (184.8, 228.6, 276.2, 265.7)),
    },
}
# Each trial's measured requests (after the warm-up) in the two runs, in trial order.
REAL_REQUESTS = (57, 52, 64, 55, 67, 72, 56, 54, 68, 48, 60, 56, 51, 52, 57, 64, 56, 68, 52, 58, 48, 60, 48, 53, 52, 52)


def real_noise(steps: Sequence[str] | None = None) -> dict[str, Noise]:
    """Per metric, the real runs' per-pair log-ratio variance, each (run, step) its own estimate, pooled."""
    found: dict[str, list[Noise]] = {TTFT: [], TOK_S: []}
    for run in REAL.values():
        for step, pairs in run.items():
            if steps is not None and step not in steps:
                continue
            for metric, (base, cand) in ((TTFT, (0, 1)), (TOK_S, (2, 3))):
                logs = np.log([p[cand] / p[base] for p in pairs])
                found[metric].append(Noise(float(logs.var(ddof=1)), len(logs) - 1))
    return {m: p for m, ns in found.items() if (p := pooled_noise(ns)) is not None}


@dataclass(frozen=True)
class StepTruth:
    name: str
    ttft: float  # true relative change of P95 TTFT
    tok_s: float  # true relative change of output tokens/s
    ttft_sd: float  # per-pair log-ratio SD
    tok_sd: float

    def row(self, requests: tuple[int, ...]) -> Row:
        """The step as benchmarks/verdicts.py simulates it: per-trial SDs (a pair's log ratio has twice a trial's
        variance), the guard's change in its worse direction, each trial's measured requests drawn from `requests`."""
        return Row(
            self.name,
            sigma=self.ttft_sd / math.sqrt(2),
            guard_sigma=self.tok_sd / math.sqrt(2),
            objective_effect=self.ttft,
            guard_effect=1.0 / (1.0 + self.tok_s) - 1.0,
            requests_drawn=requests,
        )

    def wrong(self, outcome: StepOutcome, min_effect: float) -> bool:
        """A false decision: a real gain rejected, a step without one kept, a guard that held rejected (every guard
        here truly holds), and in A/A an objective interval that excludes no change."""
        if outcome.through_guard:
            return True
        if self.ttft <= -min_effect:
            return outcome.verdict == REJECTED
        return outcome.verdict == KEPT or (self.ttft == 0 and outcome.objective_excludes_zero)


@dataclass(frozen=True)
class Scenario:
    label: str
    steps: tuple[StepTruth, ...]
    earlier: int = 5  # runs chained for the "more history" row
    requests: tuple[int, ...] = REAL_REQUESTS  # what each trial's measured requests are drawn from

    def exact_history(self) -> dict[str, Noise]:
        """The oracle's history: the steps' true paired variance (their mean where they differ), 10^6 df."""
        ttft = statistics.fmean(s.ttft_sd**2 for s in self.steps)
        tok = statistics.fmean(s.tok_sd**2 for s in self.steps)
        return {TTFT: Noise(ttft, 10**6), TOK_S: Noise(tok, 10**6)}


@dataclass(frozen=True)
class RunResult:
    outcomes: tuple[StepOutcome, ...]
    noise: tuple[Mapping[str, Noise], ...]  # each step's recorded noise (StepVerdict.noise)
    detectable: tuple[float | None, ...]  # the effect each step's power line said could not be told from noise

    @property
    def decided(self) -> int:
        return sum(o.verdict in (KEPT, REJECTED) for o in self.outcomes)

    @property
    def pairs(self) -> int:
        return sum(o.pairs for o in self.outcomes)


def cause(outcome: StepOutcome) -> str:
    """Why a step ended undecided: its objective within noise, or only a guard unsettled (the errors-rate guard, whose
    count interval no noise source narrows, or output tokens/s)."""
    if outcome.verdict in (KEPT, REJECTED):
        return "decided"
    if "not kept while a guard is unsettled" not in outcome.reason:
        return "objective"
    errors = re.search(r"guard error rate [^;]*not shown within", outcome.reason)
    return "errors guard" if errors else "throughput guard"


def refused(outcome: StepOutcome) -> bool:
    """The step's P95 TTFT interval did not use the history: its run's noise was larger beyond chance (F test)."""
    return bool(outcome.methods) and "history noise not used" in outcome.methods[0]


def history_of(runs: Sequence[RunResult], metrics: Sequence[str]) -> dict[str, Noise]:
    """Every earlier run's step noise pooled per metric, as tuning.history_noise pools an archive's comparable runs."""
    found: dict[str, list[Noise]] = {}
    for run in runs:
        for step in run.noise:
            for metric, noise in step.items():
                if metric in metrics and noise.df >= 1:
                    found.setdefault(metric, []).append(noise)
    return {m: p for m, ns in found.items() if (p := pooled_noise(ns)) is not None}


def _known(borrowed: Mapping[str, Sequence[Noise]], history: Mapping[str, Noise]) -> dict[str, Noise]:
    """The noise the runner knows before a step (StepLoop._known_noise): the run's earlier steps and the history."""
    known = {}
    for metric in {*history, *borrowed}:
        pooled = pooled_noise([*borrowed.get(metric, ()), *([history[metric]] if metric in history else [])])
        if pooled is not None:
            known[metric] = pooled
    return known


_DETECTABLE = re.compile(r"smaller than (\d+)%")


def printed_detectable(playbook: Playbook, known: Mapping[str, Noise]) -> float | None:
    """The effect on the objective the step's power line says could not be told from noise (StepLoop._power_line,
    through plan_text), None when it prints none (no noise known yet)."""
    found = _DETECTABLE.search(plan_text(playbook.goals, playbook.trials, known, "the history and this run"))
    return int(found.group(1)) / 100 if found else None


def simulate_run(
    seed: Sequence[int], scenario: Scenario, playbook: Playbook, history: Mapping[str, Noise], plan: bool = True
) -> RunResult:
    """One run of the playbook's steps; the same seed gives the same trials whatever the history. `plan`: read each
    step's power line (only the runs a row compares need it; it costs as much as the step's decisions)."""
    rng = np.random.default_rng(list(seed))
    goals, trials = speed_goals(playbook.goals), playbook.trials
    borrowed: dict[str, list[Noise]] = {}
    outcomes, noises, detectable = [], [], []
    for step in scenario.steps:
        detectable.append(printed_detectable(playbook, _known(borrowed, history)) if plan else None)
        row = step.row(scenario.requests)
        outcome, noise = _run_step(rng, row, trials, goals, row.sigma, borrowed, dict(history))
        outcomes.append(outcome)
        noises.append(noise)
        for metric, n in noise.items():
            borrowed.setdefault(metric, []).append(n)
    return RunResult(tuple(outcomes), tuple(noises), tuple(detectable))


# The second runs each repetition compares with its first: label -> index into the repetition's runs.
SECOND = ("1 earlier run (the README's pair)", "5 earlier runs", "same trials as the first, 1 earlier run", "oracle")


def repetition(rep: int, seed: int, scenario: Scenario, playbook: Playbook) -> dict[str, tuple[RunResult, RunResult]]:
    """The first run and, per row of SECOND, the run compared with it."""
    metrics = [playbook.goals.objective.metric, *(g.metric for g in playbook.goals.guards)]
    runs = [simulate_run((seed, rep, 1), scenario, playbook, {})]
    for k in range(2, scenario.earlier + 2):
        compared = k in (2, 6)
        runs.append(simulate_run((seed, rep, k), scenario, playbook, history_of(runs, metrics), plan=compared))
    again = simulate_run((seed, rep, 1), scenario, playbook, history_of(runs[1:2], metrics))
    oracle = simulate_run((seed, rep, 99), scenario, playbook, scenario.exact_history())
    first = runs[0]
    out = {SECOND[0]: (first, runs[1]), SECOND[2]: (first, again), SECOND[3]: (first, oracle)}
    if scenario.earlier >= 5:
        out[SECOND[1]] = (first, runs[5])
    return out


CAUSES = ("errors guard", "throughput guard", "objective")


@dataclass(frozen=True)
class StepFigures:
    """One step over the repetitions, the first run beside the second: decided, pairs, and why it stayed undecided."""

    name: str
    decided: tuple[float, float]
    pairs: tuple[float, float]
    pairs_hist: tuple[tuple[float, ...], tuple[float, ...]]  # share ending at 2, 3, 4 pairs
    undecided: tuple[tuple[float, ...], tuple[float, ...]]  # share undecided per CAUSES
    refused: float  # the second run's P95 TTFT interval did not use the history
    detectable: tuple[float | None, float | None]  # median effect the step's power line printed, first, second


def _median(values: Sequence[float | None]) -> float | None:
    shown = [v for v in values if v is not None]
    return statistics.median(shown) if shown else None


def step_figures(index: int, name: str, pairs: Sequence[tuple[RunResult, RunResult]]) -> StepFigures:
    sides = [[run.outcomes[index] for run in side] for side in zip(*pairs, strict=True)]

    def share(side: int, test: Callable[[StepOutcome], bool]) -> float:
        return float(np.mean([test(o) for o in sides[side]]))

    def both(test: Callable[[StepOutcome], bool]) -> tuple[float, float]:
        return share(0, test), share(1, test)

    most = max(o.pairs for side in sides for o in side)
    ends = [tuple(share(side, lambda o, k=k: o.pairs == k) for k in range(2, most + 1)) for side in (0, 1)]
    causes = [tuple(share(side, lambda o, c=c: cause(o) == c) for c in CAUSES) for side in (0, 1)]
    return StepFigures(
        name,
        decided=both(lambda o: o.verdict in (KEPT, REJECTED)),
        pairs=(float(np.mean([o.pairs for o in sides[0]])), float(np.mean([o.pairs for o in sides[1]]))),
        pairs_hist=(ends[0], ends[1]),
        undecided=(causes[0], causes[1]),
        refused=share(1, refused),
        detectable=(
            _median([run.detectable[index] for run, _ in pairs]),
            _median([run.detectable[index] for _, run in pairs]),
        ),
    )


@dataclass(frozen=True)
class Summary:
    scenario: str
    second: str
    n: int
    more_decided: float  # the second decides at least as many steps
    fewer_pairs: float  # in no more pairs
    both: float  # the line
    pairs: tuple[float, float]  # mean pairs first, second
    decided: tuple[float, float]
    refused: float  # share of the second run's steps whose P95 TTFT interval refused the history
    wrong: tuple[float, float]  # share of steps wrongly decided, first, second
    detectable: tuple[float | None, ...]  # median effect the second's power line printed, per step
    printed: float  # share of the second run's steps that printed one
    steps: tuple[StepFigures, ...]


def summarize(
    scenario: Scenario, second: str, pairs: Sequence[tuple[RunResult, RunResult]], min_effect: float
) -> Summary:
    def mean(f: Callable[[RunResult, RunResult], float]) -> float:
        return float(np.mean([f(a, b) for a, b in pairs]))

    steps = scenario.steps
    n_steps = len(pairs) * len(steps)
    wrong = [
        sum(s.wrong(r.outcomes[i], min_effect) for r in runs for i, s in enumerate(steps))
        for runs in zip(*pairs, strict=True)
    ]
    printed = [d for _, b in pairs for d in b.detectable]
    return Summary(
        scenario=scenario.label,
        second=second,
        n=len(pairs),
        more_decided=mean(lambda a, b: b.decided >= a.decided),
        fewer_pairs=mean(lambda a, b: b.pairs <= a.pairs),
        both=mean(lambda a, b: b.decided >= a.decided and b.pairs <= a.pairs),
        pairs=(mean(lambda a, _: a.pairs), mean(lambda _, b: b.pairs)),
        decided=(mean(lambda a, _: a.decided), mean(lambda _, b: b.decided)),
        refused=sum(refused(o) for _, b in pairs for o in b.outcomes) / n_steps,
        wrong=(wrong[0] / n_steps, wrong[1] / n_steps),
        detectable=tuple(_median([b.detectable[i] for _, b in pairs]) for i in range(len(steps))),
        printed=sum(d is not None for d in printed) / len(printed),
        steps=tuple(step_figures(i, s.name, pairs) for i, s in enumerate(steps)),
    )


def scenarios(requests_factor: float = 1.0) -> tuple[Scenario, ...]:
    """The real runs' noise: pooled over both steps, and per step (kv-cache-q8's P95 TTFT was noisier); with
    `requests_factor`, trials that measure that many times the real ones' requests (longer trials)."""
    pooled, first, second = real_noise(), real_noise(["parallel-4"]), real_noise(["kv-cache-q8"])
    ttft, tok = math.sqrt(pooled[TTFT].var), math.sqrt(pooled[TOK_S].var)
    ttft_1, ttft_2 = math.sqrt(first[TTFT].var), math.sqrt(second[TTFT].var)
    requests = tuple(round(r * requests_factor) for r in REAL_REQUESTS)
    more = f", {requests_factor:g}x the requests a trial" if requests_factor != 1 else ""
    return (
        Scenario(
            f"real effects, the two runs' noise pooled{more}",
            (StepTruth("parallel-4", -0.55, 0.05, ttft, tok), StepTruth("kv-cache-q8", 0.40, -0.12, ttft, tok)),
            requests=requests,
        ),
        Scenario(
            f"real effects, each step's own P95 TTFT noise{more}",
            (StepTruth("parallel-4", -0.55, 0.05, ttft_1, tok), StepTruth("kv-cache-q8", 0.40, -0.12, ttft_2, tok)),
            requests=requests,
        ),
        Scenario(
            f"A/A (both steps change nothing), pooled noise{more}",
            (StepTruth("null-1", 0.0, 0.0, ttft, tok), StepTruth("null-2", 0.0, 0.0, ttft, tok)),
            earlier=1,
            requests=requests,
        ),
    )


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _bound(share: float, n: int) -> str:
    """The share with its 95 % Monte-Carlo interval (Wilson)."""
    low, high = wilson_interval(round(share * n), n, 0.95)
    return f"{_pct(share)} [{low * 100:.1f}, {high * 100:.1f}]"


def table(summaries: Sequence[Summary]) -> str:
    lines = [
        "| scenario | second run | decides ≥ the first | pairs ≤ the first's | both (the line) | pairs first / second "
        "| steps decided first / second | history refused (F test, P95 TTFT) | false decisions first / second "
        "| detectable effect printed (median, per step) |",
        "|" + "---|" * 10,
    ]
    for s in summaries:
        shown = " / ".join("none" if d is None else f"{d:.0%}" for d in s.detectable)
        lines.append(
            f"| {s.scenario} | {s.second} | {_pct(s.more_decided)} | {_pct(s.fewer_pairs)} | {_bound(s.both, s.n)} "
            f"| {s.pairs[0]:.2f} / {s.pairs[1]:.2f} | {s.decided[0]:.2f} / {s.decided[1]:.2f} | {_pct(s.refused)} "
            f"| {_pct(s.wrong[0])} / {_pct(s.wrong[1])} | {shown} ({_pct(s.printed)} of steps) |"
        )
    return "\n".join(lines)


def step_table(summaries: Sequence[Summary]) -> str:
    lines = [
        "| scenario | second run | step | decided first / second | pairs first / second "
        "| ended at 2 / 3 / 4 pairs, first; second | undecided through the errors guard / throughput guard / "
        "objective, first; second | history refused (P95 TTFT) | detectable effect printed first / second (median) |",
        "|" + "---|" * 9,
    ]
    for s in summaries:
        for f in s.steps:
            ends = "; ".join(" / ".join(f"{x * 100:.0f}%" for x in side) for side in f.pairs_hist)
            why = "; ".join(" / ".join(f"{x * 100:.1f}%" for x in side) for side in f.undecided)
            lines.append(
                f"| {s.scenario} | {s.second} | {f.name} | {_pct(f.decided[0])} / {_pct(f.decided[1])} "
                f"| {f.pairs[0]:.2f} / {f.pairs[1]:.2f} | {ends} | {why} | {_pct(f.refused)} "
                f"| {' / '.join('none' if d is None else f'{d:.0%}' for d in f.detectable)} |"
            )
    return "\n".join(lines)


def refused_falls_back_to_run() -> None:
    """A variant of the rule, for comparison only: a step whose history the F test refuses takes the run's steps
    moderated (as the first run's steps do) instead of its own pairs alone (intervals.with_history)."""
    today = intervals.with_history

    def variant(own: Noise, run: Sequence[Noise], history: Noise) -> tuple[float, float, str]:
        var, df, method = today(own, run, history)
        if "history noise not used" in method and run:
            var, df = intervals.moderate(own, run)
        return var, df, method

    intervals.with_history = variant  # type: ignore[assignment]


def main(argv: Sequence[str] | None = None, say: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1000, help="repetitions (pairs of runs) per scenario")
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--only", default=None, help="the scenarios whose label contains this text")
    parser.add_argument(
        "--requests-factor",
        type=float,
        default=1.0,
        help="trials measuring this many times the real runs' requests (2: 12 s trials), for the errors-rate guard",
    )
    parser.add_argument(
        "--refused-falls-back",
        action="store_true",
        help="a variant of the rule: a refused history leaves the step the run's steps moderated, not its own pairs",
    )
    args = parser.parse_args(argv)
    # The tuning record's metrics (decide_step's `deltas`) never enter a verdict; leaving them out makes a look
    # about five times faster and changes no decision.
    decide.RECORD_METRICS = ()  # type: ignore[misc]
    if args.refused_falls_back:
        refused_falls_back_to_run()
    playbook = load_playbook(PLAYBOOK)
    noise = real_noise()
    say(
        "real per-pair log-ratio SD (pooled over both runs and steps): "
        + ", ".join(f"{m} {math.sqrt(n.var):.3f} (df {n.df})" for m, n in noise.items())
        + "; P95 TTFT per step: "
        + ", ".join(f"{s} {math.sqrt(real_noise([s])[TTFT].var):.3f}" for s in ("parallel-4", "kv-cache-q8"))
    )
    t0 = time.perf_counter()
    summaries = []
    for i, scenario in enumerate(scenarios(args.requests_factor)):
        if args.only is not None and args.only not in scenario.label:
            continue
        per_row: dict[str, list[tuple[RunResult, RunResult]]] = {}
        for rep in range(args.reps):
            for second, pair in repetition(rep, args.seed + i, scenario, playbook).items():
                per_row.setdefault(second, []).append(pair)
        min_effect = playbook.goals.objective.min_effect
        summaries += [summarize(scenario, k, per_row[k], min_effect) for k in SECOND if k in per_row]
        say(f"# {scenario.label}: done at {time.perf_counter() - t0:.0f} s")
    say(table(summaries))
    say("")
    say(step_table(summaries))
    say(f"\n{args.reps} pairs of runs per scenario; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
