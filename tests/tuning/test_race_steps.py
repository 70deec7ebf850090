"""`carry: race` steps in the real step loop on a simulated engine (the run's `measure_trial` seam): each raced step
against the same configuration, the first kept carried and a later kept one saying so; on one machine one after the
other, with room for more than one pair their asks reach the scheduler as one call; a stop mid-race ends every
raced step and leaves no thread behind."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from llmplay.archive.reader import ArchivedRun
from llmplay.playbook.load import load_playbook
from llmplay.spec import Scalar
from llmplay.tuning import run as run_module
from llmplay.tuning.run import RunOptions, run_playbook
from llmplay_testing.simulated import Response, SimulatedEngine, slots_of
from llmplay_testing.tune_sessions import TwoPairsAtOnce

# simulated engines: their data, and so each verdict, must not change with the run id
pytestmark = pytest.mark.usefixtures("draws_free_of_run_id")

ROOT = Path(__file__).resolve().parents[2]


def queueing(args: Mapping[str, Scalar], users: int) -> Response:
    """Users beyond the slots queue: 2 slots and 4 slots both cut TTFT far below one slot's."""
    slots = slots_of(args)
    return Response(ttft_s=0.1 * (1 + 1.5 * max(0.0, users / slots - 1)), output_tok_s=100.0)


def raced_playbook(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny-tune.yaml").read_text())
    doc.pop("tune")
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 3, "max_repeats": 5, "sequential": True}
    doc["steps"] = [
        {"name": "parallel-2", "set": {"parallel": 2}, "carry": "race"},
        {"name": "parallel-4", "set": {"parallel": 4}, "carry": "race"},
        {"name": "then-threads", "set": {"threads": 2}},
    ]
    path = tmp_path / "raced.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_raced_steps_on_one_machine_each_meet_the_baseline_and_the_first_kept_is_carried(tmp_path):
    outcome = run_playbook(
        load_playbook(raced_playbook(tmp_path)),
        RunOptions(archive_root=tmp_path / "runs"),
        report=lambda _l: None,
        measure_trial=SimulatedEngine(queueing, seed=21),
    )
    assert outcome.status == "complete"
    verdicts = {v.step: v for v in outcome.verdicts}
    assert verdicts["parallel-2"].baseline_config == verdicts["parallel-4"].baseline_config == "baseline"
    assert verdicts["parallel-2"].verdict == verdicts["parallel-4"].verdict == "kept"
    assert verdicts["parallel-2"].carried and not verdicts["parallel-4"].carried
    assert verdicts["parallel-4"].reason.endswith("; not carried: parallel-2, before it in the race, was")
    # The step after the race starts from the carried one; the archive holds the same verdicts.
    assert verdicts["then-threads"].baseline_config == verdicts["parallel-2"].candidate_config
    archived = {v.step: v for v in ArchivedRun.open(outcome.run_dir).verdicts()}
    assert archived["parallel-4"] == verdicts["parallel-4"]
    # On one machine (room for one pair) the raced steps run one after the other, as any steps do.
    steps = [t.step for t in ArchivedRun.open(outcome.run_dir).trials()]
    assert steps.index("parallel-4") > max(i for i, s in enumerate(steps) if s == "parallel-2")


def test_with_room_for_two_pairs_the_raced_steps_asks_are_one_call_and_a_stop_ends_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "scheduler_for", lambda playbook, sharing: TwoPairsAtOnce(playbook, sharing))
    TwoPairsAtOnce.calls = []
    outcome = run_playbook(
        load_playbook(raced_playbook(tmp_path)),
        RunOptions(archive_root=tmp_path / "runs"),
        report=lambda _l: None,
        measure_trial=SimulatedEngine(queueing, seed=22),
    )
    assert outcome.status == "complete"
    # Interleaved: each step's first pair first; the step after the race runs alone.
    steps_of = [[group[0] for group in call] for call in TwoPairsAtOnce.calls]
    assert steps_of[0] == ["parallel-2", "parallel-4"] * 3
    assert steps_of[-1] == ["then-threads"] * len(steps_of[-1])
    verdicts = {v.step: v for v in outcome.verdicts}
    assert verdicts["parallel-2"].carried and not verdicts["parallel-4"].carried

    # Ctrl-C during the race's trials: the run stops interrupted, resumable, and no raced step's thread is left.
    engine = SimulatedEngine(queueing, seed=23)

    def interrupted(config, *, trial_id, step, role, repeat):
        if step == "parallel-4" and repeat == 1:
            raise KeyboardInterrupt
        return engine(config, trial_id=trial_id, step=step, role=role, repeat=repeat)

    stopped = run_playbook(
        load_playbook(raced_playbook(tmp_path)),
        RunOptions(archive_root=tmp_path / "stopped"),
        report=lambda _l: None,
        measure_trial=interrupted,
    )
    assert stopped.status == "interrupted" and stopped.verdicts == ()
    assert not [t for t in threading.enumerate() if t.name.startswith("llmplay-race-")]
