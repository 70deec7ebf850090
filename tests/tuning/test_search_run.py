"""A search step in the run: its rounds through the scheduler, its verdict and search record in the archive, the
console's lines, the report's charts, and --resume after a stop mid-search. Only the measuring of one trial is
replaced (TuningRun's `measure_trial` seam, samples with a known response); the rest is the real run."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from llmplay.archive.reader import ArchivedRun
from llmplay.archive.verify import verify
from llmplay.cli import cli
from llmplay.playbook.load import load_playbook
from llmplay.report import publish_report, render_report
from llmplay.stats.decide import TrialSample
from llmplay.tuning.run import RunOptions, TuningRun, run_playbook
from llmplay.tuning.trial import TrialResult
from llmplay_testing.cpu_runs import tiny_playbook
from llmplay_testing.synthetic import scripted_trial

ROOT = Path(__file__).resolve().parents[2]
# P95 TTFT of each `parallel` value relative to parallel 1: 4 is the clear best.
RESPONSE = {1: 1.0, 2: 0.8, 4: 0.5}


class SearchTrials:
    """Synthetic trials with RESPONSE's TTFT; each round's drift is shared by its trials (the same request
    sequence). Keeps every trial asked for; the one numbered `interrupt_at` raises KeyboardInterrupt."""

    def __init__(self, interrupt_at: int | None = None):
        self.asked: list[tuple[str | None, str, int, str, int]] = []
        self.interrupt_at = interrupt_at
        self.rng = np.random.default_rng(0)

    def __call__(self, config, *, trial_id, step, role, repeat) -> TrialResult:
        if self.interrupt_at is not None and len(self.asked) + 1 == self.interrupt_at:
            raise KeyboardInterrupt("Ctrl-C")
        seed = config.workload.seed + repeat
        self.asked.append((step, role, repeat, config.label, seed))
        drift = np.random.default_rng(seed).normal(0, 0.03)
        level = RESPONSE[config.engine.args.get("parallel") or 1]
        ttft_s = 0.2 * level * np.exp(drift + self.rng.normal(0, 0.02))
        ttft = self.rng.lognormal(np.log(ttft_s), 0.2, 300)
        out = np.full(300, 32.0)
        values = {"ttft": ttft, "tpot": ttft / 20, "e2el": ttft * 3, "itl": ttft / 20, "output_tokens": out}
        values |= {"total_tokens": out * 4, "good": np.ones(300), "window_output_tokens": np.full(10, 960.0)}
        summary = {"ttft.p95": float(np.percentile(ttft, 95)), "throughput.output_tok_s": 960.0, "errors.rate": 0.0}
        trial = scripted_trial(
            config, trial_id=trial_id, step=step, role=role, repeat=repeat, summary=summary, wall_s=12.0
        )
        return TrialResult(trial, sample=TrialSample(10.0, values, 300, 0))


def search_playbook(tmp_path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2, "max_repeats": 4}
    doc["steps"] = [{"name": "parallel", "search": {"args.parallel": [1, 2, 4]}}]
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(tmp_path: Path, trials: SearchTrials, lines: list[str], resume: Path | None = None):
    options = RunOptions(archive_root=tmp_path / "r", resume=resume)
    return TuningRun(load_playbook(search_playbook(tmp_path)), options, report=lines.append, measure_trial=trials)


def test_a_search_step_races_its_values_and_archives_the_winner(tmp_path):
    trials, lines = SearchTrials(), []
    outcome = run(tmp_path, trials, lines).execute()
    verdict = outcome.verdicts[0]
    assert verdict.verdict == "kept" and verdict.carried
    assert verdict.candidate_config == "parallel=4" and outcome.final_config_id == "parallel=4"
    assert verdict.changes == ("args.parallel: 1 -> 4",)
    # every arm of a round sends the round's one request sequence, and each value is its own configuration
    rounds = defaultdict(set)
    for step, _role, repeat, _label, seed in trials.asked:
        assert step == "parallel"
        rounds[repeat].add(seed)
    assert all(len(seeds) == 1 for seeds in rounds.values())
    assert {label for *_, label, _ in trials.asked} >= {"baseline", "parallel=4"}
    search = ArchivedRun.open(outcome.run_dir).verdicts()[0].search
    assert search is not None and search.target == "args.parallel" and search.chosen == 4
    # the playbook already runs parallel 1: that is the incumbent, not raced against itself
    assert search.incumbent_value == 1 and [v.value for v in search.values] == [2, 4]
    winner = next(v for v in search.values if v.value == 4)
    assert winner.status == "winner" and winner.effect is not None and winner.metrics["ttft.p95"] > 0
    assert search.gain is not None and "not used to select" in search.gain_method
    assert 0 < search.engine_s <= search.grid_max_rounds_engine_s
    assert any("engine-s" in line and "full grid" in line for line in lines)
    assert any("search args.parallel" in line for line in lines)
    html = render_report(outcome.run_dir).read_text()
    assert "Search over args.parallel" in html and "not used to select" in html and "engine-seconds" in html
    assert "against args.parallel" in html  # the value chart
    assert html.count("<svg") >= 2
    assert verify(outcome.run_dir) == []


def test_a_search_stopped_mid_race_archives_what_it_measured_and_resumes_without_measuring_again(tmp_path):
    first = SearchTrials(interrupt_at=6)
    outcome = run(tmp_path, first, []).execute()
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    partial = manifest["verdicts"][0]
    assert partial["verdict"] == "inconclusive" and partial["search"]["finished"] is False
    archived = {t["trial_id"] for t in manifest["trials"] if t["status"] == "ok"}
    assert len(archived) == 5
    again = SearchTrials()
    resumed = run(tmp_path, again, [], resume=outcome.run_dir).execute()
    asked_again = {(step, role, repeat, label) for step, role, repeat, label, _ in again.asked}
    asked_first = {(step, role, repeat, label) for step, role, repeat, label, _ in first.asked}
    assert not asked_again & asked_first  # no archived trial measured a second time
    search = ArchivedRun.open(resumed.run_dir).verdicts()[0].search
    assert search is not None and search.finished and search.trials == len(first.asked) + len(again.asked)
    assert verify(resumed.run_dir) == []


@pytest.mark.docker
@pytest.mark.slow
def test_a_parallel_search_on_llamacpp_end_to_end(cpu_engine, tmp_path):
    """Real llama.cpp trials: the search record archived, both charts in the report, `llmplay verify` passes."""
    path = tiny_playbook(
        tmp_path,
        duration="2s",
        warmup="1s",
        repeats=2,
        steps=[{"name": "parallel", "search": {"args.parallel": [1, 2, 4]}}],
    )
    doc = yaml.safe_load(path.read_text())
    # At most 2 race rounds and 2 confirmation pairs: the pipeline end to end, not a settled winner (that is
    # benchmarks/search.py's measurement), in about a minute on 2 cores.
    doc["trials"]["max_repeats"] = 2
    doc["goals"]["guards"] = [{"metric": "throughput.output_tok_s", "tolerance": "35%"}]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    lines: list[str] = []
    outcome = run_playbook(
        load_playbook(path), RunOptions(archive_root=tmp_path / "reports"), publish=publish_report, report=lines.append
    )
    assert outcome.status == "complete", lines
    (verdict,) = ArchivedRun.open(outcome.run_dir).verdicts()
    search = verdict.search
    assert search is not None and search.target == "args.parallel" and search.incumbent_value == 1
    assert [v.value for v in search.values] == [2, 4] and search.trials > 0 and search.engine_s > 0
    assert any("full grid" in line for line in lines)
    html = (outcome.run_dir / "report.html").read_text()
    assert "Search over args.parallel" in html and "against args.parallel" in html
    assert "P95 TTFT against output tokens/s" in html  # the trade-off chart, against the first guard
    result = CliRunner().invoke(cli, ["verify", str(outcome.run_dir)])
    assert result.exit_code == 0, result.output
