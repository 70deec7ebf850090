"""The tuning loop end to end on a simulated engine (the run's `measure_trial` seam): the real run machinery,
statistics, diagnosis, ranking and archive; only the engine's response is known in advance."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.playbook.load import load_playbook
from llmplay.spec import Scalar
from llmplay.tune import trail
from llmplay.tune.loop import TuneLoop
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
from llmplay_testing.simulated import Response, SimulatedEngine, slots_of

ROOT = Path(__file__).resolve().parents[2]


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
    tmp_path: Path, engine: SimulatedEngine, lines: list[str], gates: list[str] | None = None, **tune_section: object
) -> TuneLoop:
    playbook = load_playbook(tune_playbook(tmp_path, gates, **tune_section))

    def run(pb, root: Path) -> RunOutcome:
        return run_playbook(pb, RunOptions(archive_root=root), report=lambda _line: None, measure_trial=engine)

    return TuneLoop(playbook, tmp_path / "tune", run, lines.append)


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
    assert outcome.trail.stop.startswith(
        "goal unreachable (one request alone): ttft.p95 < 50ms: the limit 50 ms is below the 98 ms one request alone"
    )
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

    def run(pb, root: Path) -> RunOutcome:
        calls.append(pb.steps[0].name if pb.steps else "no steps")
        if len(calls) == 3:  # the probe, round 0, then Ctrl-C in round 1
            raise KeyboardInterrupt
        return run_playbook(pb, RunOptions(archive_root=root), report=lambda _l: None, measure_trial=engine)

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

    def run(pb, archive: Path) -> RunOutcome:
        return run_playbook(pb, RunOptions(archive_root=archive), report=lambda _l: None, measure_trial=engine)

    loop = TuneLoop(load_playbook(path), tmp_path / "tune", run, lambda _l: None, archive_root=root)
    outcome = loop.execute()
    assert [r.step for r in outcome.trail.rounds] == [None]
    skipped = {c.remedy.value: c.reason for c in outcome.trail.final_ranking}
    assert skipped["max_batch"].startswith("parallel rejected 2 times before on this engine and image (run ")
    assert skipped["max_batch"].endswith("tune.retry_rejected tries it again")


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

    def run(pb, root: Path) -> RunOutcome:
        return run_playbook(pb, RunOptions(archive_root=root), report=lambda _line: None, measure_trial=engine)

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


def test_a_round_whose_run_was_interrupted_stops_the_session_for_resume_instead_of_failing_the_step(tmp_path):
    engine = SimulatedEngine(one_slot_chat, seed=10)
    playbook = load_playbook(tune_playbook(tmp_path))

    def interrupted_in_round_1(config, **kw):  # the run machinery catches Ctrl-C and returns an interrupted outcome
        if kw["step"] is not None:
            raise KeyboardInterrupt
        return engine(config, **kw)

    def run(pb, root: Path) -> RunOutcome:
        return run_playbook(
            pb, RunOptions(archive_root=root), report=lambda _l: None, measure_trial=interrupted_in_round_1
        )

    with pytest.raises(KeyboardInterrupt):
        TuneLoop(playbook, tmp_path / "tune", run, lambda _l: None).execute()
    state = trail.load(tmp_path / "tune")
    assert [r.number for r in state.rounds] == [0] and not state.stop  # round 1 not recorded as a failed step
