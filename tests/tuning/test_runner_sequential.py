"""The run's orchestration on synthetic trials: interleaving order, sequential stopping, carry-forward.

Only the measuring of one trial is replaced, through TuningRun's `measure_trial` seam (by samples with
known effects); the plan, decisions, archive and report are the real ones.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from llmplay.archive.verify import verify
from llmplay.commands.plan import plan_command
from llmplay.playbook.load import load_playbook
from llmplay.report.html import render_report
from llmplay.stats.decide import TrialSample
from llmplay.tuning.run import RunOptions, TuningRun
from llmplay.tuning.steps import candidate_first
from llmplay.tuning.trial import TrialResult
from llmplay_testing.synthetic import scripted_trial

ROOT = Path(__file__).resolve().parents[2]


class SyntheticTrials:
    """TTFT p95 of a configuration is 200 ms, halved by parallel 4; `env.NOOP` changes nothing.

    Handed to TuningRun as its `measure_trial`; records the order in which the run asked for trials."""

    def __init__(self):
        self.order: list[tuple[str | None, str]] = []
        self.rng = np.random.default_rng(0)

    def __call__(self, config, *, trial_id, step, role, repeat) -> TrialResult:
        self.order.append((step, role))
        ttft_s = 0.2 * (0.5 if config.engine.args.get("parallel") == 4 else 1.0) * (1 + self.rng.normal(0, 0.05))
        ttft = self.rng.lognormal(np.log(ttft_s), 0.2, 300)
        out = np.full(300, 32.0)
        sample = TrialSample(
            10.0,
            {
                "ttft": ttft,
                "tpot": ttft / 20,
                "e2el": ttft * 3,
                "itl": ttft / 20,
                "output_tokens": out,
                "total_tokens": out * 4,
                "good": np.ones(300),
                "window_output_tokens": self.rng.normal(960, 50, 10),
            },
            300,
            0,
        )
        summary = {
            "ttft.p95": float(np.percentile(ttft, 95)),
            "throughput.output_tok_s": 960.0,
            "errors.rate": 0.0,
            "duration_s": 10.0,
        }
        trial = scripted_trial(
            config,
            trial_id=trial_id,
            step=step,
            role=role,
            repeat=repeat,
            summary=summary,
        )
        return TrialResult(trial, sample=sample)


def synthetic_playbook(tmp_path: Path, **trials) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2, **trials}
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}, {"name": "noop", "set": {"env.NOOP": "1"}}]
    path = tmp_path / "synthetic.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_interleaved_trials_and_carry_forward(tmp_path):
    trials = SyntheticTrials()
    run = TuningRun(
        load_playbook(synthetic_playbook(tmp_path, repeats=3)),
        RunOptions(archive_root=tmp_path / "r"),
        report=lambda line: None,
        measure_trial=trials,
    )
    outcome = run.execute()
    # Each pair's order is drawn from the run id (archived), so it can be told again; an advantage of going second
    # is noise, and consecutive pairs do not meet on one side as A B | B A made them.
    run_id = outcome.run_dir.name
    pairs = len({v.step: v for v in outcome.verdicts}["parallel-4"].trials_candidate)
    expected = []
    for rep in range(pairs):
        first_two = (
            ["candidate", "baseline"] if candidate_first(run_id, "parallel-4", rep) else ["baseline", "candidate"]
        )
        expected += first_two
    assert [role for _, role in trials.order[: 2 * pairs]] == expected
    verdicts = {v.step: v for v in outcome.verdicts}
    assert verdicts["parallel-4"].verdict == "kept" and verdicts["parallel-4"].carried
    # the kept step is the reference of the next one, re-measured beside it
    assert verdicts["noop"].baseline_config == "parallel-4"
    assert verdicts["noop"].verdict != "kept"
    assert outcome.final_config_id == "parallel-4"
    assert verify(outcome.run_dir) == []


def test_sequential_mode_stops_as_soon_as_decided(tmp_path):
    run = TuningRun(
        load_playbook(synthetic_playbook(tmp_path, sequential=True, max_repeats=5)),
        RunOptions(archive_root=tmp_path / "r"),
        report=lambda line: None,
        measure_trial=SyntheticTrials(),
    )
    outcome = run.execute()
    verdicts = {v.step: v for v in outcome.verdicts}
    # A halved TTFT is decided at the first look whose interval can be narrow: two pairs leave one degree of
    # freedom, and the level corrected for up to four looks makes that t quantile enormous, so three pairs.
    # The null step either settles or runs to max_repeats.
    assert len(verdicts["parallel-4"].trials_candidate) == 3
    noop_trials = len(verdicts["noop"].trials_candidate)
    assert 2 <= noop_trials <= 5
    if verdicts["noop"].verdict == "inconclusive":
        assert noop_trials == 5


class PairedTrials(SyntheticTrials):
    """The same trials, each sample carrying its pair's repeat as the runner's real samples do."""

    def __call__(self, config, *, trial_id, step, role, repeat) -> TrialResult:
        result = super().__call__(config, trial_id=trial_id, step=step, role=role, repeat=repeat)
        return replace(result, sample=replace(result.sample, repeat=repeat))


def test_history_noise_from_an_earlier_run_of_the_same_playbook(tmp_path, monkeypatch, capsys):
    """trials.noise: history: the first run has no history (its steps pool their own noise, as noise: run) and
    archives each step's noise; the second run in the same archive names the first as its history, prints what
    each step's pairs can show before measuring it, and pools the history's noise while its own agrees."""
    path = synthetic_playbook(tmp_path, repeats=3, noise="history")
    lines: list[str] = []
    outcomes = []
    for _ in range(2):
        lines.clear()
        run = TuningRun(
            load_playbook(path),
            RunOptions(archive_root=tmp_path / "r"),
            report=lines.append,
            measure_trial=PairedTrials(),
        )
        outcomes.append(run.execute())
    first, second = outcomes
    assert all(v.noise and {m for m, _, _ in v.noise} >= {"ttft.p95"} for v in first.verdicts)
    assert not any(v.noise_runs for v in first.verdicts)
    assert f"noise: history of 1 comparable run(s) ({first.run_dir.name})" in "\n".join(lines)
    power = [line for line in lines if "power (80%, noise from the history and this run)" in line]
    assert len(power) == 2 and "could not be told from noise" in power[0], lines
    # Each step's objective interval either pooled the history or says why not (the F test is at 10%: the
    # run ids draw each pair's order, so which happens varies from run to run).
    methods = [v.objective.method or "" for v in second.verdicts]
    assert all("pooled with the history's" in m or "history noise not used" in m for m in methods), methods
    assert any(v.noise_runs == (first.run_dir.name,) for v in second.verdicts)
    assert verify(second.run_dir) == []
    report = render_report(second.run_dir).read_text()
    assert "noise source" in report and first.run_dir.name in report  # the method section lists the runs
    monkeypatch.setenv("LLMPLAY_ARCHIVE", str(tmp_path / "r"))
    plan_command(path)
    planned = capsys.readouterr().out
    assert (
        "Power (80%, noise from 2 earlier run(s) of this playbook): with 3 pair(s) an effect on P95 TTFT" in planned
    ), planned[:900]
