"""Absent figures on the console: a trial without streamed requests, a trial where every request failed, and
a final configuration whose gate metric was never measured. The run goes to the end, every line says
"not measured (why)" where a figure is absent, and the exit code follows the gates.

Trials come through TuningRun's `measure_trial` seam from real request records (summarised, archived and
sampled by the real code), so no engine is needed; everything after the load generator is the real one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console

from llmplay.archive.convert import diagnosis_from, finding_from
from llmplay.archive.listing import list_runs
from llmplay.archive.model import TRIAL_FAILED, TRIAL_OK, GateResult, TrialRecord
from llmplay.archive.verify import verify
from llmplay.commands.ls import gates_cell, ls_command
from llmplay.commands.run import gate_line, print_diagnosis, print_outcome
from llmplay.diagnose.checklist import diagnose
from llmplay.errors import ExitCode
from llmplay.loadgen.records import RequestRecord
from llmplay.metrics import per_request_frame, summarize
from llmplay.playbook.load import load_playbook
from llmplay.tuning.progress import describe_trial
from llmplay.tuning.run import RunOptions, TuningRun
from llmplay.tuning.trial import TrialResult, trial_sample
from llmplay_testing.synthetic import scripted_trial

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000


def request(i: int, *, stream: bool, failed: bool = False, ttft_ms: float = 50.0) -> RequestRecord:
    """One measured request 100 ms after the previous one: streamed (8 chunks 10 ms apart), non-streamed (one
    body), or failed with a 503 before any byte came back."""
    sent = (1 + i) * 100 * MS
    if failed:
        return RequestRecord(
            i, False, stream, sent, sent, None, None, (), None, 64, 0, "usage", None, 503, "http_5xx", "503", 0.0
        )
    first = sent + int(ttft_ms * MS)
    chunks = tuple(first + k * 10 * MS for k in range(8)) if stream else (first,)
    return RequestRecord(
        i, False, stream, sent, sent, first, first, chunks, chunks[-1], 64, 8, "usage", "length", 200, None, None, 0.0
    )


class RecordedTrials:
    """`measure_trial` from request records: `kind(trial_id, role)` picks "streamed", "nonstreamed", "failed" or
    "thin" (two streamed requests) per trial; counts the trials measured. Like run_trial, a trial in which no
    request completed is a failed trial, its records archived all the same."""

    def __init__(self, playbook, kind: Callable[[str, str], str], n: int = 30):
        self.playbook, self.kind, self.n = playbook, kind, n
        self.measured: list[str] = []

    def __call__(self, config, *, trial_id, step, role, repeat) -> TrialResult:
        self.measured.append(trial_id)
        # Which side of a pair starts is drawn from the run id: a kind given by role needs no trial numbers.
        kind = self.kind(trial_id, role)
        n = 2 if kind in ("thin", "nonstreamed") else self.n
        ttft = 25.0 if config.engine.args.get("parallel") == 4 else 50.0
        records = [
            request(i, stream=kind != "nonstreamed", failed=kind == "failed", ttft_ms=ttft * (1 + 0.01 * (i % 5)))
            for i in range(n)
        ]
        duration_s = 0.1 * n + 0.2
        summary = dict(summarize(records, duration_s, self.playbook.goals.slo_s).as_dict())
        summary["duration_s"] = duration_s
        completed = summary.get("requests.completed", 0)
        trial = scripted_trial(
            config,
            trial_id=trial_id,
            step=step,
            role=role,
            repeat=repeat,
            summary=summary,
            status=TRIAL_OK if completed else TRIAL_FAILED,
            wall_s=duration_s,
            error=None if completed else f"no request completed ({summary['errors.count']} errors)",
        )
        frame = per_request_frame(records)
        return TrialResult(trial, frame, sample=trial_sample(self.playbook, config, trial, frame))


def playbook_file(tmp_path: Path, *, steps: list[dict] | None = None, gates: list[str] | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["runtime"] = "process"
    doc["trials"] = {"repeats": 2}
    doc["steps"] = [{"name": "parallel-4", "set": {"parallel": 4}}] if steps is None else steps
    if gates is not None:
        doc["goals"]["gates"] = gates
    path = tmp_path / "absent.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(tmp_path: Path, kind: Callable[[str], str], **playbook_args):
    playbook = load_playbook(playbook_file(tmp_path, **playbook_args))
    trials = RecordedTrials(playbook, kind)
    lines: list[str] = []
    outcome = TuningRun(
        playbook, RunOptions(archive_root=tmp_path / "r"), report=lines.append, measure_trial=trials
    ).execute()
    return outcome, lines, trials


def printed(outcome) -> str:
    buffer = io.StringIO()
    print_outcome(Console(file=buffer, width=400, highlight=False, soft_wrap=True), outcome)
    return buffer.getvalue()


def test_a_trial_without_streamed_requests_says_not_measured_and_the_run_finishes(tmp_path):
    # The case: the first trial's two measured requests happened to be non-streamed.
    outcome, lines, _ = run(tmp_path, lambda tid, role: "nonstreamed" if tid == "t001" else "streamed")
    assert outcome.status == "complete", lines
    first = next(line for line in lines if "trial t001" in line)
    assert "P95 TTFT not measured (no streamed request completed)" in first
    assert "P95 TPOT not measured (no streamed request produced more than one output token)" in first
    assert "error rate 0.0%" in first
    assert verify(outcome.run_dir) == []
    # the gates are judged on what was measured: the exit code is the gates', not an internal error's
    expected = ExitCode.OK if all(g.met for g in outcome.gates) else ExitCode.GATES
    assert outcome.exit_code == expected
    text = printed(outcome)
    assert "Tuning record" in text and "status complete" in text


def test_no_streamed_request_at_all_fails_the_ttft_gate_as_not_measured(tmp_path):
    outcome, lines, _ = run(tmp_path, lambda tid, role: "nonstreamed", steps=[])
    assert outcome.status == "complete", lines
    ttft_gate = next(g for g in outcome.gates if g.metric == "ttft.p95")
    assert ttft_gate.met is None and ttft_gate.observed is None
    assert outcome.exit_code == ExitCode.GATES
    text = printed(outcome)
    assert "gate ttft.p95 < 2s: observed not measured (no streamed request completed) -> not met (not measured)" in text
    assert "P95 TTFT not measured (no streamed request completed)" in text  # under the tuning record
    assert "None" not in text and "nan" not in text.lower()


def test_every_request_failed(tmp_path, capsys):
    outcome, lines, _ = run(tmp_path, lambda tid, role: "failed", steps=[])
    assert outcome.status == "complete", lines
    assert all("FAILED: no request completed (30 errors)" in line for line in lines if "trial t0" in line)
    assert all(g.met is None for g in outcome.gates)  # nothing measured: every gate is "not met (not measured)"
    assert outcome.exit_code == ExitCode.GATES
    text = printed(outcome)
    assert "baseline: not measured (all 2 trial(s) failed)" in text
    assert text.count("-> not met (not measured)") == len(outcome.gates)
    assert verify(outcome.run_dir) == []
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["exit_code"] == ExitCode.GATES
    assert ls_command(str(tmp_path / "r")) == ExitCode.OK
    assert "0/4 (4" in capsys.readouterr().out  # the cell folds inside the table's column
    assert gates_cell(list_runs(tmp_path / "r")[0]) == "0/4 (4 not measured)"


def test_every_candidate_request_failed(tmp_path):
    # Which side of a pair starts is drawn per pair from the run id, so the candidate's trials are named by role.
    outcome, lines, _ = run(tmp_path, lambda tid, role: "failed" if role == "candidate" else "streamed")
    assert outcome.status == "complete", lines
    (verdict,) = outcome.verdicts
    assert verdict.verdict == "failed"
    text = printed(outcome)
    assert "parallel-4: not measured (all 2 trial(s) failed)" in text
    assert outcome.final_config_id == "baseline"


def test_thin_samples_are_named_on_the_trial_line_the_record_and_the_gate(tmp_path):
    outcome, lines, _ = run(tmp_path, lambda tid, role: "thin", steps=[])
    first = next(line for line in lines if "trial t001" in line)
    assert first.endswith(
        "— P95 TTFT from 2 request(s) (needs at least 20); P95 TPOT from 2 request(s) (needs at least 20)"
    )
    text = printed(outcome)
    assert "baseline: * P50 TTFT" not in text  # a median needs no tail
    assert "baseline: * P95 TTFT from 4 request(s) (needs at least 20)" in text
    gate = next(line for line in text.splitlines() if line.startswith("gate ttft.p95"))
    assert gate.endswith("— P95 TTFT from 4 request(s) (needs at least 20)"), gate


def test_trial_line_of_an_empty_summary():
    trial = TrialRecord("t009", "baseline", None, "baseline", 0, TRIAL_OK, "2026-12-03T00:00:00Z", 1.0, summary={})
    line = describe_trial(trial)
    assert "output not measured (no request completed in the measured window)" in line
    assert "P95 TTFT not measured (no streamed request completed)" in line
    assert "error rate not measured" in line


def test_gate_line_without_an_observation():
    gate = GateResult("tpot.p95 < 50ms", "tpot.p95", "<", 0.05, None, None, None)
    assert gate_line(gate) == (
        "gate tpot.p95 < 50ms: observed not measured (no streamed request produced more than one output token) "
        "-> not met (not measured)"
    )


def test_diagnosis_print_accepts_missing_figures():
    buffer = io.StringIO()
    console = Console(file=buffer, width=300, highlight=False)
    print_diagnosis(  # as the archive reads them back: the figures a diagnosis lacks are None
        console,
        diagnosis_from(
            {
                "memory": {"device": "cpu", "weights_bytes": 2**20, "kv_share": None},
                "roofline": {"floor_s": 0.002, "achieved_tpot_s": None, "achieved_over_floor": None},
                "notes": ["no NVML: not found"],
            }
        ),
        [finding_from({"severity": "info", "title": "x"})],
    )
    text = buffer.getvalue()
    assert "weights 1.0 MiB, KV cache not measured, other not measured, peak not measured" in text
    assert "KV share not measured" in text
    assert "achieved not measured (no streamed request produced more than one output token)" in text
    assert "finding [info]" in text


def test_diagnosis_accepts_absent_and_non_finite_figures():
    findings = diagnose(
        {"ttft.p50": None, "ttft.p95": float("nan"), "errors.rate": None},
        {"engine.waiting_mean": 3.0, "engine.waiting_max": None, "gpu.util_mean": float("nan")},
        None,
        None,
        {},
    )
    queue = next(f for f in findings if f.id == "queue.persistent")
    assert queue.evidence == "mean 3.0 waiting"
    assert any(f.id == "gpu.not_evaluated" for f in findings)
    assert np.isfinite(len(findings))
