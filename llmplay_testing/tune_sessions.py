"""Tuning sessions on simulated engines, for the tuner's tests: a llama.cpp-like chat engine whose users queue for one
slot (and one with a second cure, for racing), the tune playbook written for the process runtime, a TuneLoop over the
real run machinery, this machine's scheduler claiming room for two pairs at once, and Ctrl-C at a chosen trial."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import yaml

from llmplay.playbook.load import load_playbook
from llmplay.spec import Config, Playbook, Scalar
from llmplay.tune.loop import Room, TuneLoop
from llmplay.tune.trail import Trail
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
from llmplay.tuning.schedule import LocalScheduler
from llmplay.tuning.trial import TrialResult
from llmplay_testing.simulated import Response, SimulatedEngine, slots_of

ROOT = Path(__file__).resolve().parents[1]


def one_slot_chat(args: Mapping[str, Scalar], users: int) -> Response:
    """llama.cpp-like: users beyond the slots queue (TTFT grows with the queue); slots cost a little throughput;
    the shared system prompt is served from the prompt cache."""
    slots = slots_of(args)
    queue = max(0.0, users / slots - 1)
    return Response(
        ttft_s=0.1 * (1 + 1.5 * queue),
        output_tok_s=100.0 * (1 - 0.03 * (min(slots, users) - 1)),
        waiting_frac=0.9 if slots < users else 0.0,
        waiting_mean=float(max(users - slots, 0)),
        reuse_expected=0.4,
        reuse_achieved=0.39 if args.get("prefix_caching") is not False else 0.0,
    )


def two_cures(args: Mapping[str, Scalar], users: int) -> Response:
    """Queueing that more slots cure, and a prefix the cache misses that cache_reuse cures (TTFT -30%): two
    candidates that each beat the baseline on their own."""
    base = one_slot_chat(args, users)
    reused = args.get("cache_reuse") not in (None, 0)
    return replace(base, ttft_s=base.ttft_s * (0.7 if reused else 1.0), reuse_achieved=0.35 if reused else 0.05)


def tune_playbook(tmp_path: Path, gates: list[str] | None = None, **tune: object) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny-tune.yaml").read_text())
    doc["goals"]["gates"] = gates or doc["goals"]["gates"]
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 3, "max_repeats": 5, "sequential": True}
    doc["tune"] = {**doc["tune"], **tune}
    path = tmp_path / "cpu-tiny-tune.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def tune(
    tmp_path: Path,
    engine: SimulatedEngine | CtrlC,
    lines: list[str],
    gates: list[str] | None = None,
    room: Room | None = None,
    state: Trail | None = None,
    **tune_section: object,
) -> TuneLoop:
    playbook = load_playbook(tune_playbook(tmp_path, gates, **tune_section))

    def run(pb: Playbook, options: RunOptions) -> RunOutcome:
        return run_playbook(pb, options, report=lambda _line: None, measure_trial=engine)

    return TuneLoop(playbook, tmp_path / "tune", run, lines.append, state, room=room)


class TwoPairsAtOnce(LocalScheduler):
    """This machine's scheduler claiming room for two pairs at once (as a two-node cluster would): the pairs of
    `carry: race` steps then reach it together. `calls` records each call's groups as their trials' steps (install
    it as the run's `scheduler_for` and empty `calls` first)."""

    calls: ClassVar[list[list[list[str | None]]]] = []

    def batch(self, configs):
        return 2

    def run(self, groups, take):
        TwoPairsAtOnce.calls.append([[slot.step for slot in group] for group in groups])
        super().run(groups, take)


class CtrlC:
    """A simulated engine that raises KeyboardInterrupt (as SignalGuard does on Ctrl-C) at the `at`-th trial of
    `step`; `asked` lists every trial it measured as (step, role, repeat, configuration)."""

    def __init__(self, engine: SimulatedEngine, step: str | None = None, at: int = 0):
        self.engine, self.step, self.at = engine, step, at
        self.seen = 0
        self.asked: list[tuple[str | None, str, int, str]] = []

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult:
        if step is not None and step == self.step:
            self.seen += 1
            if self.seen == self.at:
                raise KeyboardInterrupt("Ctrl-C")
        self.asked.append((step, role, repeat, config.label))
        return self.engine(config, trial_id=trial_id, step=step, role=role, repeat=repeat)
