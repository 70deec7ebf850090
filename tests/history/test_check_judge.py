"""history --check's decision (history.judge) on index entries: gates with an interval, the detectable regression."""

from __future__ import annotations

from dataclasses import replace

from llmplay.archive.run_entry import Goals, GuardGoal, RunEntry
from llmplay.history.judge import AT_RISK, FAILED, HISTORY, MET, NOT_JUDGED, GateLimit, judge

GOALS = Goals(GuardGoal("ttft.p95", 0.10, True, False), (), 0.95, ("ttft.p95",), 0)
GATE = GateLimit("ttft.p95 < 2s", "ttft.p95", "<", 2.0, True)


def entry(run_id: str, ttft: tuple[float, ...], hour: int) -> RunEntry:
    return RunEntry(
        run_id=run_id,
        path=f"p/{run_id}",
        playbook="p",
        playbook_version="1",
        playbook_sha256="",
        kind="run",
        status="complete",
        started_utc=f"2026-01-01T{hour:02d}:00:00Z",
        engine="e",
        engine_version="1",
        image_digest="sha256:aa",
        llmplay_version="0.1",
        host="h",
        hardware="CPU only",
        config_id="baseline",
        config_fingerprint="f",
        config={},
        goals=GOALS,
        gates=(),
        verified=True,
        problems=(),
        figures={"ttft.p95": ttft},
    )


REFERENCE = entry("r", (1.80, 1.85, 1.82), 1)


def test_a_gate_is_failed_only_when_its_interval_shows_it_and_at_risk_when_it_straddles():
    straddles = judge(REFERENCE, entry("n", (1.90, 2.05, 1.97), 2), [GATE])
    assert [g.state for g in straddles.gates] == [AT_RISK] and not straddles.regressions
    failed = judge(REFERENCE, entry("n", (2.50, 2.62, 2.55), 2), [GATE])
    assert [g.state for g in failed.gates] == [FAILED]
    assert any("gate ttft.p95 < 2s: FAILED" in r for r in failed.regressions)
    held = judge(REFERENCE, entry("n", (1.50, 1.52, 1.49), 2), [GATE])
    assert [g.state for g in held.gates] == [MET]
    unmet_before = judge(REFERENCE, entry("n", (2.50, 2.62, 2.55), 2), [replace(GATE, reference_met=False)])
    assert not [r for r in unmet_before.regressions if r.startswith("gate")]  # the reference failed it too


def test_one_trial_is_not_judged_on_its_own_and_is_against_comparable_runs():
    newest = entry("n", (1.83,), 9)
    alone = judge(REFERENCE, newest, [GATE])
    assert alone.goals[0].outcome is None and "too few trials" in alone.goals[0].why
    assert [g.state for g in alone.gates] == [NOT_JUDGED] and alone.unjudged
    earlier = [REFERENCE, *(entry(f"e{i}", (1.81 + i / 100, 1.84, 1.79), 2 + i) for i in range(5))]
    other_image = replace(entry("x", (9.0, 9.1, 9.2), 8), image_digest="sha256:bb")  # never in the baseline
    judged = judge(REFERENCE, newest, [GATE], noise=HISTORY, entries=[*earlier, other_image, newest])
    assert judged.noise == HISTORY and not judged.unjudged and not judged.regressions
    assert judged.goals[0].detectable is not None and 0.10 < judged.goals[0].detectable < 0.2
    assert "7 run(s)" in judged.notes[0] and "the baseline: 6 run(s)" in judged.notes[0]


def test_a_noisier_night_does_not_borrow_a_quieter_history():
    earlier = [REFERENCE, *(entry(f"e{i}", (1.82, 1.83, 1.82), 2 + i) for i in range(5))]
    noisy = entry("n", (1.2, 2.6, 1.9), 9)
    judged = judge(REFERENCE, noisy, [], noise=HISTORY, entries=[*earlier, noisy])
    assert judged.noise != HISTORY and "not used" in " ".join(judged.notes)
