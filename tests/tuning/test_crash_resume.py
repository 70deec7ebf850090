"""A bug outside the measurement never loses a run: every trial is archived before anything looks at it, a
console line that fails to render costs only that line, and any other bug stops the run resumably, so
`--resume` continues it without measuring a finished trial again.

Trials come through TuningRun's `measure_trial` seam as real request records (archived and read back by the
real code on resume); the exceptions are injected by replacing one function the run calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.archive.verify import verify
from llmplay.loadgen.records import RequestRecord
from llmplay.metrics import per_request_frame, summarize
from llmplay.playbook.load import load_playbook
from llmplay.telemetry.sampler import TelemetrySeries
from llmplay.tuning import book as book_module
from llmplay.tuning import run as run_module
from llmplay.tuning import steps as steps_module
from llmplay.tuning.progress import describe_trial
from llmplay.tuning.run import RunOptions, TuningRun
from llmplay.tuning.trial import TrialResult, trial_sample
from llmplay_testing.instrument import InstrumentServer, scenario_url

# Timed against the instrument: a raised CPU priority (tests/conftest.py).
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000


class CountingTrials:
    """30 streamed requests per trial, TTFT halved by parallel 4; `measured` lists every trial it was asked for."""

    def __init__(self, playbook):
        self.playbook = playbook
        self.measured: list[str] = []

    def __call__(self, config, *, trial_id, step, role, repeat) -> TrialResult:
        self.measured.append(trial_id)
        ttft_ms = 25.0 if config.engine.args.get("parallel") == 4 else 50.0
        records = []
        for i in range(30):
            sent = (1 + i) * 100 * MS
            first = sent + int(ttft_ms * (1 + 0.02 * (i % 7)) * MS)
            chunks = tuple(first + k * 10 * MS for k in range(8))
            records.append(
                RequestRecord(
                    i,
                    False,
                    True,
                    sent,
                    sent,
                    first,
                    first,
                    chunks,
                    chunks[-1],
                    64,
                    8,
                    "usage",
                    "length",
                    200,
                    None,
                    None,
                    0.0,
                )
            )
        summary = dict(summarize(records, 3.2, self.playbook.goals.slo_s).as_dict())
        trial = TrialRecord(trial_id, config.label, step, role, repeat, TRIAL_OK, "2026-12-03T00:00:00Z", 3.2, summary)
        frame = per_request_frame(records)
        return TrialResult(trial, frame, sample=trial_sample(self.playbook, config, trial, frame))


def playbook(tmp_path: Path, steps: int = 2):
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2}
    # 60 requests a side cannot show an error rate within a few points: these tests are about the run, not rates.
    doc["goals"]["guards"] = [g for g in doc["goals"]["guards"] if g["metric"] != "errors.rate"]
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}, {"name": "noop", "set": {"env.NOOP": "1"}}][:steps]
    path = tmp_path / "crash.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_playbook(path)


def tuning_run(pb, options: RunOptions, trials: CountingTrials, lines: list[str], warnings: list[str]) -> TuningRun:
    return TuningRun(pb, options, report=lines.append, measure_trial=trials, warn=warnings.append)


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def resume(pb, run_dir: Path, tmp_path: Path) -> tuple[CountingTrials, object, list[str]]:
    again = CountingTrials(pb)
    lines: list[str] = []
    outcome = tuning_run(pb, RunOptions(archive_root=tmp_path / "r", resume=run_dir), again, lines, []).execute()
    return again, outcome, lines


def test_a_progress_line_that_fails_to_render_costs_only_that_line(tmp_path, monkeypatch, capsys):
    def breaks_on_t002(trial: TrialRecord) -> str:
        if trial.trial_id in ("t002", "t005"):
            return f"{trial.summary['no.such.figure'] * 1000:.1f}"  # the kind of bug: a KeyError here
        return describe_trial(trial)

    monkeypatch.setattr(book_module, "describe_trial", breaks_on_t002)
    pb = playbook(tmp_path)
    trials = CountingTrials(pb)
    lines: list[str] = []
    outcome = TuningRun(
        pb, RunOptions(archive_root=tmp_path / "r"), report=lines.append, measure_trial=trials
    ).execute()
    assert outcome.status == "complete" and len(trials.measured) == 8
    assert not any("trial t002" in line for line in lines) and any("trial t003" in line for line in lines)
    stderr = capsys.readouterr().err
    # warned once, on stderr; the second lost line is only noted in the diagnosis
    assert stderr.count("warning:") == 1
    assert "the progress line of trial t002 could not be shown (KeyError: 'no.such.figure')" in stderr
    notes = " ".join(manifest(outcome.run_dir)["diagnosis"]["notes"])
    assert "trial t002 (KeyError" in notes and "trial t005 (KeyError" in notes
    assert manifest(outcome.run_dir)["status"] == "complete"
    assert verify(outcome.run_dir) == []
    monkeypatch.undo()
    again, resumed, _ = resume(pb, outcome.run_dir, tmp_path)
    assert again.measured == []  # every trial was archived: nothing is measured twice
    assert resumed.status == "complete" and verify(outcome.run_dir) == []


def test_a_report_callable_that_fails_on_one_line(tmp_path):
    """The `report` seam itself raising (a console that cannot print one line) is the same presentation failure."""
    pb = playbook(tmp_path, steps=1)
    trials = CountingTrials(pb)
    shown: list[str] = []
    warnings: list[str] = []

    def report(line: str) -> None:
        if "trial t001" in line:
            raise UnicodeEncodeError("ascii", line, 0, 1, "the console cannot print this")
        shown.append(line)

    outcome = TuningRun(
        pb, RunOptions(archive_root=tmp_path / "r"), report=report, measure_trial=trials, warn=warnings.append
    ).execute()
    assert outcome.status == "complete" and len(trials.measured) == 4
    assert len(warnings) == 1 and "the progress line of trial t001 could not be shown" in warnings[0]
    assert any("-> kept" in line for line in shown)
    assert verify(outcome.run_dir) == []


@pytest.mark.parametrize("where", ["decide_step", "pooled_summary"])
def test_a_bug_after_archived_trials_stops_the_run_resumably(tmp_path, monkeypatch, where):
    """A bug past the trials (deciding step 1, or pooling its figures) stops the run: the archive is marked
    interrupted, and --resume measures only what was never measured."""
    real = getattr(steps_module, where)
    calls = {"n": 0}

    def breaks_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ZeroDivisionError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(steps_module, where, breaks_once)
    pb = playbook(tmp_path)
    trials = CountingTrials(pb)
    lines: list[str] = []
    with pytest.raises(ZeroDivisionError):  # the CLI turns it into its one "internal error" line
        tuning_run(pb, RunOptions(archive_root=tmp_path / "r"), trials, lines, []).execute()
    run_dir = next((tmp_path / "r").glob("*/*/"))
    assert trials.measured == ["t001", "t002", "t003", "t004"]
    stopped = manifest(run_dir)
    assert stopped["status"] == "interrupted" and stopped["exit_code"] == 1
    assert [t["trial_id"] for t in stopped["trials"]] == trials.measured
    assert verify(run_dir) == []
    assert any(f"continue with llmplay run --resume {run_dir}" in line for line in lines), lines

    again, outcome, resumed_lines = resume(pb, run_dir, tmp_path)
    assert "4 trial(s) already archived" in resumed_lines[0]
    assert again.measured == ["t005", "t006", "t007", "t008"]  # step 2 only; step 1's trials are not measured again
    assert outcome.status == "complete"
    assert {v.step: v.verdict for v in outcome.verdicts}["parallel-4"] == "kept"
    assert verify(run_dir) == [] and manifest(run_dir)["status"] == "complete"


def test_a_bug_in_the_diagnosis_costs_the_diagnosis_only(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("memory")

    monkeypatch.setattr(run_module, "diagnose_run", broken)
    pb = playbook(tmp_path, steps=1)
    warnings: list[str] = []
    outcome = tuning_run(pb, RunOptions(archive_root=tmp_path / "r"), CountingTrials(pb), [], warnings).execute()
    assert outcome.status == "complete" and outcome.exit_code == 0
    assert len(warnings) == 1 and "the diagnosis could not be made (KeyError: 'memory')" in warnings[0]
    assert manifest(outcome.run_dir)["diagnosis"]["notes"] == [
        "diagnosis not made because of a bug (KeyError: 'memory')"
    ]
    assert verify(outcome.run_dir) == []


def test_a_bug_in_telemetry_summarising_keeps_the_measured_trial(tmp_path, monkeypatch):
    """The real trial path (an engine at a URL: the instrument server) with the telemetry summary broken: the
    load's records and figures are kept and archived, the trial says its telemetry is not measured."""

    def broken(self, *args, **kwargs):
        raise RuntimeError("injected telemetry bug")

    monkeypatch.setattr(TelemetrySeries, "summary", broken)
    with InstrumentServer() as server:
        doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
        doc["runtime"] = {"kind": "endpoint", "url": scenario_url(server.url, ttft_ms=5, itl_ms=1)}
        doc["workload"].update(duration="1s", warmup="0s", concurrency=2)
        doc["trials"] = {"repeats": 1}
        doc["steps"] = []
        path = tmp_path / "endpoint.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        lines: list[str] = []
        outcome = TuningRun(load_playbook(path), RunOptions(archive_root=tmp_path / "r"), report=lines.append).execute()
    assert outcome.status == "complete", lines
    (trial,) = manifest(outcome.run_dir)["trials"]
    assert trial["status"] == "ok" and trial["summary"]["requests.completed"] > 0
    assert any(n.startswith("telemetry not summarised (RuntimeError: injected telemetry bug)") for n in trial["notes"])
    assert "records" in trial["files"] and "telemetry" not in trial["files"]
    assert verify(outcome.run_dir) == []
