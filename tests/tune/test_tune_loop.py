"""The tuning loop end to end on a simulated engine (the run's `measure_trial` seam): the real run machinery,
statistics, diagnosis, ranking and archive; only the engine's response is known in advance."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from llmplay.archive.model import TRIAL_OK
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.verify import verify
from llmplay.cli import cli
from llmplay.playbook.load import load_playbook
from llmplay.spec import Scalar
from llmplay.tune import trail
from llmplay.tune.loop import TuneLoop
from llmplay.tuning import run as run_module
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
from llmplay_testing.simulated import Response, SimulatedEngine, slots_of
from llmplay_testing.tune_sessions import CtrlC, TwoPairsAtOnce, one_slot_chat, tune, tune_playbook, two_cures

# simulated engines: their data, and so each verdict, must not change with the run id
pytestmark = pytest.mark.usefixtures("draws_free_of_run_id")

ROOT = Path(__file__).resolve().parents[2]


def test_one_slot_for_four_users_keeps_more_slots_skips_prefix_caching_and_stops_with_its_reason(tmp_path):
    lines: list[str] = []
    outcome = tune(tmp_path, SimulatedEngine(one_slot_chat, seed=1), lines).execute()
    rounds = outcome.trail.rounds
    assert [r.number for r in rounds] == [0, 1]
    first = rounds[1]
    assert first.step == "tune-max-batch-parallel" and first.verdict == "kept", first.reason
    assert first.kept_args["parallel"] == 4
    skipped = {c.remedy.value: c.reason for c in first.ranked if c.skipped}
    assert skipped["prefix_caching"].startswith("prefix reuse already achieved: 39.0% of prompt tokens")
    assert outcome.trail.stop == "nothing left to try: no finding on the incumbent calls for a step"
    # tuned.yaml: the original playbook plus the kept step, loadable by the one loader; what was skipped is listed.
    text = outcome.tuned.read_text()
    assert "  # chosen by max_batch: queue.persistent: waiting queue > 0 in 90.0% of samples" in text
    assert "sched.concurrency_over_batch: concurrency 4 > max batch 1: 3 requests wait in the engine queue" in text
    assert "  # verdict: P95 TTFT -" in text
    assert "why: 'prefix reuse already achieved: 39.0% of prompt tokens" in text
    tuned = load_playbook(outcome.tuned)
    assert [(s.name, [(c.target, c.value) for c in s.changes]) for s in tuned.steps] == [
        ("tune-max-batch-parallel", [("args.parallel", 4)])
    ]
    assert tuned.engine.args["parallel"] == 1  # the baseline stays the baseline: the step re-measures the gain
    assert any("tune: stopped: nothing left to try" in line for line in lines)
    assert trail.load(outcome.tune_dir) == outcome.trail


def test_an_unreachable_ttft_gate_stops_after_the_unloaded_probe(tmp_path):
    engine = SimulatedEngine(one_slot_chat, seed=2)
    outcome = tune(tmp_path, engine, [], gates=["ttft.p95 < 50ms"]).execute()
    assert outcome.trail.infeasible and outcome.trail.rounds == ()
    # the simulated engine's true TTFT alone is 100 ms; the probe's median of 12 lands near it
    assert re.match(
        r"goal unreachable \(one request alone\): ttft\.p95 < 50ms: the limit 50 ms is below the (9\d|1[01]\d) ms one "
        r"request alone",
        outcome.trail.stop,
    ), outcome.trail.stop
    assert "one request alone takes on this engine (median of 12 requests sent one at a time)" in outcome.trail.stop
    assert engine.trials == 1  # far less than half of any budget: one short probe
    assert outcome.tuned is None


@pytest.mark.parametrize("steps", [1])
def test_the_step_budget_stops_the_loop(tmp_path, steps):
    def two_problems(args: Mapping[str, Scalar], users: int) -> Response:
        base = one_slot_chat(args, users)
        achieved = 0.05 if args.get("cache_reuse") in (None, 0) else 0.35
        return Response(**{**base.__dict__, "reuse_achieved": achieved})

    outcome = tune(tmp_path, SimulatedEngine(two_problems, seed=3), [], budget={"steps": steps}).execute()
    assert len([r for r in outcome.trail.rounds if r.step]) == 1
    assert outcome.trail.stop == "budget spent: 1 of 1 steps"


def test_dry_run_prints_the_first_ranking_from_an_archived_baseline_without_an_engine(tmp_path):
    path = tune_playbook(tmp_path)
    options = RunOptions(archive_root=tmp_path / "runs")
    baseline = run_playbook(
        load_playbook(path), options, report=lambda _l: None, measure_trial=SimulatedEngine(one_slot_chat, seed=4)
    )
    result = CliRunner().invoke(cli, ["tune", str(path), "--dry-run", "--baseline", str(baseline.run_dir)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"tune --dry-run: round 1 ranking from {baseline.run_dir} (final configuration ")
    assert lines[1].startswith("  #1 of 1: parallel → 2, 4 (value search); bears on ttft.p95")
    assert any(line.startswith("  skipped prefix_caching: prefix reuse already achieved") for line in lines)


def test_an_interrupted_session_resumes_with_the_same_ranking(tmp_path):
    engine = SimulatedEngine(one_slot_chat, seed=5)
    playbook = load_playbook(tune_playbook(tmp_path))
    calls: list[str] = []

    def run(pb, options: RunOptions) -> RunOutcome:
        calls.append(pb.steps[0].name if pb.steps else "no steps")
        if len(calls) == 3:  # the probe, round 0, then Ctrl-C in round 1
            raise KeyboardInterrupt
        return run_playbook(pb, options, report=lambda _l: None, measure_trial=engine)

    with pytest.raises(KeyboardInterrupt):
        TuneLoop(playbook, tmp_path / "tune", run, lambda _l: None).execute()
    state = trail.load(tmp_path / "tune")
    assert [r.number for r in state.rounds] == [0] and state.alone_run
    outcome = TuneLoop(playbook, tmp_path / "tune", run, lambda _l: None, state).execute()
    assert calls == ["no steps", "no steps", "tune-max-batch-parallel", "tune-max-batch-parallel"]
    assert outcome.trail.rounds[1].verdict == "kept" and outcome.trail.stop


def no_effect(args: Mapping[str, Scalar], users: int) -> Response:
    """The diagnosis calls for slots (users queue), but slots change nothing here."""
    return replace(one_slot_chat(args, users), ttft_s=0.3 if users > 1 else 0.1)


def test_a_knob_rejected_twice_before_on_this_engine_and_image_is_skipped_saying_so(tmp_path):
    path = tune_playbook(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}]
    earlier = tmp_path / "earlier.yaml"
    earlier.write_text(yaml.safe_dump(doc, sort_keys=False))
    root = tmp_path / "archive"
    for seed in (6, 7):
        run_playbook(
            load_playbook(earlier),
            RunOptions(archive_root=root),
            report=lambda _l: None,
            measure_trial=SimulatedEngine(no_effect, seed=seed),
        )
    engine = SimulatedEngine(no_effect, seed=8)

    def run(pb, options: RunOptions) -> RunOutcome:
        return run_playbook(pb, options, report=lambda _l: None, measure_trial=engine)

    loop = TuneLoop(load_playbook(path), tmp_path / "tune", run, lambda _l: None, archive_root=root)
    outcome = loop.execute()
    assert [r.step for r in outcome.trail.rounds] == [None]
    skipped = {c.remedy.value: c.reason for c in outcome.trail.final_ranking}
    assert skipped["max_batch"].startswith("parallel rejected 2 times before on this engine and image (run ")
    assert skipped["max_batch"].endswith("tune.retry_rejected tries it again")


def test_a_round_interrupted_mid_run_resumes_its_run_keeping_the_trials_it_archived(tmp_path):
    playbook = load_playbook(tune_playbook(tmp_path))
    step = "tune-max-batch-parallel"

    def runner(engine: CtrlC):
        return lambda pb, options: run_playbook(pb, options, report=lambda _l: None, measure_trial=engine)

    first, lines = CtrlC(SimulatedEngine(one_slot_chat, seed=5), step, at=5), []
    with pytest.raises(KeyboardInterrupt):
        TuneLoop(playbook, tmp_path / "tune", runner(first), lines.append).execute()
    state = trail.load(tmp_path / "tune")
    pending = state.pending
    assert [r.number for r in state.rounds] == [0] and pending is not None
    assert (pending.number, pending.step, Path(pending.playbook).name) == (1, step, "round-1.yaml")
    assert pending.ranked and pending.ranked[0].knob == "parallel"
    interrupted = Path(pending.run_dir)
    kept_before = {t.trial_id for t in ArchivedRun.open(interrupted).trials() if t.status == TRIAL_OK}
    assert len(kept_before) == 4, kept_before
    assert any(f"llmplay tune --resume {tmp_path / 'tune'}" in line for line in lines)

    again = CtrlC(SimulatedEngine(one_slot_chat, seed=6))
    outcome = TuneLoop(playbook, tmp_path / "tune", runner(again), lines.append, state).execute()
    resumed = outcome.trail.rounds[1]
    assert resumed.run_dir == str(interrupted) and resumed.step == step and resumed.verdict == "kept", resumed
    assert resumed.ranked == pending.ranked  # the same ranking, not ranked again
    trials = ArchivedRun.open(interrupted).trials()
    assert kept_before <= {t.trial_id for t in trials if t.status == TRIAL_OK}
    measured_first = {key for key in first.asked if key[0] == step}
    assert len(measured_first) == 4 and not measured_first & set(again.asked)  # none measured a second time
    later = {r.step for r in outcome.trail.rounds[2:]}  # rounds the resumed loop went on to, with their own trials
    assert all(key[0] == step or key[0] in later for key in again.asked), again.asked  # no new probe or baseline
    assert outcome.trail.pending is None and trail.load(tmp_path / "tune").pending is None
    assert verify(interrupted) == []


RACED = ["tune-max-batch-parallel", "tune-prefix-caching-cache-reuse"]  # two_cures' round 1, in rank order


def test_a_raced_round_runs_the_top_two_against_the_incumbent_carries_the_first_kept_and_records_both(
    tmp_path, monkeypatch
):
    """tune.race 2 with room for two pairs at once: round 1 races the two ranked candidates in one run, their pairs
    handed to the scheduler together; both are kept, the first ranked is carried, the other recorded as kept but
    not carried and, counted as tried with that verdict, run again on the new incumbent in round 2."""
    monkeypatch.setattr(run_module, "scheduler_for", lambda playbook, sharing: TwoPairsAtOnce(playbook, sharing))
    TwoPairsAtOnce.calls = []
    lines: list[str] = []
    rooms: list[str] = []

    def room(pb) -> int:
        rooms.append(pb.metadata.name)
        return 2

    outcome = tune(tmp_path, SimulatedEngine(two_cures, seed=11), lines, room=room, race=2).execute()
    first = outcome.trail.rounds[1]
    assert [(c.step, c.rank, c.knob) for c in first.raced] == [
        (RACED[0], 1, "parallel"),
        (RACED[1], 2, "cache_reuse"),
    ], "\n".join(lines)
    assert [(c.verdict, c.carried) for c in first.raced] == [("kept", True), ("kept", False)], first.raced
    # Ranking order decides which kept one is carried (queueing's own remedy first, as the findings order them): the
    # step a session without racing would have carried; the other is tried again on the new incumbent.
    assert first.raced[1].reason.endswith(f"; not carried: {RACED[0]}, before it in the race, was")
    assert first.step == RACED[0] and first.verdict == "kept" and first.rank == 1
    assert first.kept_args["parallel"] in (2, 4) and first.kept_args.get("cache_reuse") in (None, 0)
    assert first.race.startswith("2 candidates raced (tune.race; the cluster runs 2 pair(s) at once)")
    # The round's playbook: both steps with carry: race, against the same incumbent knobs.
    round_doc = yaml.safe_load((outcome.tune_dir / "round-1.yaml").read_text())
    assert [s.get("carry") for s in round_doc["steps"]] == ["race", "race"]
    # Their pairs reached the scheduler in one call, interleaved (each step's first group first).
    raced_calls = [c for c in TwoPairsAtOnce.calls if {g[0] for g in c} == set(RACED)]
    assert raced_calls, TwoPairsAtOnce.calls
    assert [g[0] for g in raced_calls[0][:2]] == RACED
    # The run archived the race: the first kept carried, the other's verdict saying why it was not.
    archived = {v.step: v for v in ArchivedRun.open(Path(first.run_dir)).verdicts()}
    assert archived[RACED[0]].carried and not archived[RACED[1]].carried
    # Round 2 counts both as tried: the kept-not-carried one is tried again on the new incumbent, alone.
    tried = outcome.trail.tried()
    assert [(t.knob, t.verdict, t.where) for t in tried[:2]] == [
        ("parallel", "kept", "round 1"),
        ("cache_reuse", "kept", "round 1"),
    ]
    second = outcome.trail.rounds[2]
    assert second.step == "tune-prefix-caching-cache-reuse-2" and second.raced == ()
    assert second.verdict == "kept", second.reason
    assert trail.load(outcome.tune_dir) == outcome.trail
    tuned = load_playbook(outcome.tuned)
    assert [s.name for s in tuned.steps] == [RACED[0], "tune-prefix-caching-cache-reuse-2"]
    assert all(s.carry == "if_kept" for s in tuned.steps)
    assert (
        "- step: tune-prefix-caching-cache-reuse\n  knob: cache_reuse\n  verdict: kept\n" in outcome.tuned.read_text()
    )


def test_a_raced_round_interrupted_mid_run_is_pending_and_resumes_its_run_racing_the_same_candidates(
    tmp_path, monkeypatch
):
    """Ctrl-C during a raced round's trials: trail.json holds the round as pending (every raced step and the race)
    with its run; --resume continues that run, the archived trials kept, and records the race as decided."""
    monkeypatch.setattr(run_module, "scheduler_for", lambda playbook, sharing: TwoPairsAtOnce(playbook, sharing))
    first, lines = CtrlC(SimulatedEngine(two_cures, seed=13), RACED[1], at=3), []
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, first, lines, room=lambda _pb: 2, race=2, budget={"steps": 2}).execute()
    state = trail.load(tmp_path / "tune")
    pending = state.pending
    assert [r.number for r in state.rounds] == [0] and pending is not None
    assert [(e.rank, e.step_document["name"], e.step_document["carry"]) for e in pending.raced] == [
        (1, RACED[0], "race"),
        (2, RACED[1], "race"),
    ]
    assert pending.step == RACED[0] and pending.race.startswith("2 candidates raced")
    interrupted = Path(pending.run_dir)
    kept_before = {t.trial_id for t in ArchivedRun.open(interrupted).trials() if t.status == TRIAL_OK}
    measured_first = {key for key in first.asked if key[0] in RACED}  # (step, role, repeat, configuration)
    assert len(measured_first) == len(kept_before) and {key[0] for key in measured_first} == set(RACED)

    again = CtrlC(SimulatedEngine(two_cures, seed=14))
    asked: list[str] = []

    def room(_pb) -> int:
        asked.append("room")
        return 2

    done = tune(tmp_path, again, lines, room=room, state=state, race=2, budget={"steps": 2}).execute()
    resumed = done.trail.rounds[1]
    assert resumed.run_dir == str(interrupted) and resumed.race == pending.race and asked == []  # not raced again
    assert [(c.step, c.verdict, c.carried) for c in resumed.raced] == [
        (RACED[0], "kept", True),
        (RACED[1], "kept", False),
    ], "\n".join(lines)
    assert any(f"round 1 was interrupted: it goes on with {', '.join(RACED)}" in line for line in lines)
    assert kept_before <= {t.trial_id for t in ArchivedRun.open(interrupted).trials() if t.status == TRIAL_OK}
    assert not measured_first & set(again.asked)  # none measured a second time
    assert all(step in RACED for step, *_ in again.asked)  # no new probe or baseline either
    assert done.trail.pending is None and done.trail.stop == "budget spent: 2 of 2 steps"
    assert verify(interrupted) == []


@pytest.mark.parametrize(("race", "room", "asks"), [(None, 2, 0), (2, 1, 1)])
def test_without_race_or_without_room_for_two_pairs_a_round_runs_one_candidate(tmp_path, race, room, asks):
    """tune.race absent (the cluster never asked), or a cluster with room for one pair at once: as before racing."""
    asked: list[int] = []

    def cluster_room(_pb) -> int:
        asked.append(1)
        return room

    section = {"budget": {"steps": 1}, **({"race": race} if race else {})}
    outcome = tune(tmp_path, SimulatedEngine(two_cures, seed=12), [], room=cluster_room, **section).execute()
    assert len(asked) == asks and outcome.trail.rounds[1].raced == ()
    steps = yaml.safe_load((outcome.tune_dir / "round-1.yaml").read_text())["steps"]
    assert steps == [{k: v for k, v in steps[0].items() if k != "carry"}]  # one ordinary step, carry if_kept
    assert [s["name"] for s in steps] == [RACED[0]]
    assert outcome.trail.stop == "budget spent: 1 of 1 steps"


def one_sequence_no_cache(args: Mapping[str, Scalar], users: int) -> Response:
    """vLLM-like, vllm-cpu-tune.yaml's baseline: users beyond max_num_seqs queue; with prefix caching on the long shared
    system prompt is served from cache and each request's prefill shrinks."""
    seqs = slots_of(args)
    cached = args.get("prefix_caching") is not False
    queue = max(0.0, users / seqs - 1)
    return Response(
        ttft_s=(0.06 if cached else 0.1) * (1 + 1.5 * queue),
        output_tok_s=100.0 * (1.1 if cached else 1.0),
        waiting_frac=0.9 if seqs < users else 0.0,
        waiting_mean=float(max(users - seqs, 0)),
        reuse_expected=0.9,
        reuse_achieved=0.85 if cached else 0.0,
    )


def test_vllm_from_one_sequence_and_no_cache_raises_the_cap_then_caches_with_the_reuse_in_its_record(tmp_path):
    doc = yaml.safe_load((ROOT / "playbooks" / "vllm-cpu-tune.yaml").read_text())
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 3, "max_repeats": 5, "sequential": True}
    path = tmp_path / "vllm-cpu-tune.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    engine = SimulatedEngine(one_sequence_no_cache, seed=9)

    def run(pb, options: RunOptions) -> RunOutcome:
        return run_playbook(pb, options, report=lambda _line: None, measure_trial=engine)

    lines: list[str] = []
    outcome = TuneLoop(load_playbook(path), tmp_path / "tune", run, lines.append).execute()
    rounds = outcome.trail.rounds
    assert [(r.step, r.verdict) for r in rounds] == [
        (None, None),
        ("tune-max-batch-max-num-seqs", "kept"),
        ("tune-prefix-caching-prefix-caching", "kept"),
    ], [r.reason for r in rounds]
    assert rounds[1].ranked[0].knob == "max_num_seqs" and rounds[1].ranked[1].knob == "prefix_caching"
    # The record: reuse achieved 0 at the baseline and on the capped incumbent, then the cached step's own.
    assert rounds[0].summary["prefix_reuse.achieved"] == 0.0
    assert rounds[2].step_summary["prefix_reuse.achieved"] == pytest.approx(0.85)
    assert "tune: round 0 incumbent: prefix reuse 90% expected, 0% achieved" in lines
    assert (
        "tune: round 2 prefix reuse: incumbent 0% achieved, tune-prefix-caching-prefix-caching 85% achieved "
        "(the workload repeats 90%)"
    ) in lines
    assert trail.load(outcome.tune_dir) == outcome.trail
