"""The HTML report: every section and step present, self-contained (no script, no external URL), nothing unrendered."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from llmplay.archive.layout import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, MANIFEST
from llmplay.archive.reader import ArchivedRun, requests_from
from llmplay.archive.signing import keygen, load_public_key
from llmplay.archive.verify import manifest_sha256, verify
from llmplay.archive.writer import RunArchive
from llmplay.catalog import fmt_value
from llmplay.cli import cli
from llmplay.compare import compare_runs
from llmplay.playbook.load import load_playbook
from llmplay.report import publish_report, render_report
from llmplay.tuning.run import RunOptions, run_playbook
from llmplay_testing.html_checks import assert_self_contained, parse_page
from llmplay_testing.make_archive import SECRETS, shared_archive


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str]:
    run_dir = shared_archive(tmp_path_factory)
    return run_dir, (run_dir / "report.html").read_text()


def test_report_is_self_contained(report):
    _, html = report
    assert_self_contained(html)
    assert html.count("<svg") >= 3 * 4 + 3  # four charts per step, plus memory, roofline and workload shape


def test_report_has_every_section_and_header_fact(report):
    _, html = report
    ids = parse_page(html).ids
    assert {"glance", "record", "steps", "diagnosis", "method", "audit", "step-1", "step-2", "step-3"} <= ids
    for fact in (
        "synthetic-tune",
        "v2.1",
        "tester@bench-01",
        "llmplay/llamacpp-cpu:local",
        "b4567 (abc123)",
        "sha256:" + "ab" * 32,
        "NVIDIA H100 80GB HBM3 · driver 550.54.15 · CUDA 12.4",
        "llmplay 0.1.0",
        "GPU-hours",
        "Overridden run",
        "repeats=2",
    ):
        assert fact in html, fact


def test_tuning_record_has_every_row_and_verdict_sentence(report):
    run_dir, html = report
    manifest = json.loads((run_dir / MANIFEST).read_text())
    record = html[html.index('id="record"') : html.index('id="steps"')]
    for row in manifest["tuning_record"]:
        assert f"<td>{row['config_id']}" in record
    for verdict in manifest["verdicts"]:
        reason = verdict["reason"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        assert reason in record, reason
        assert html.count(reason) >= 2  # in the record and in the step's own section
        for change in verdict["changes"]:
            assert change.replace(" -> ", " → ") in html
    for label in (
        "TTFT P50",
        "TTFT P95",
        "TTFT P99",
        "TPOT P95",
        "ITL P99",
        "E2EL P95",
        "output tok/s",
        "req/s",
        "goodput req/s",
        "peak memory",
        "KV share",
        "$ / 1M tok",
        "errors",
    ):
        assert f'<th class="num">{label}</th>' in record
    assert "★" in record and "About 4 more trials per side would decide it." in html


def test_failed_trial_shows_its_log_tail_and_missing_telemetry_says_not_measured(report):
    _, html = report
    assert "Trial t006 failed" in html and "error: flash attention not supported on this build" in html
    assert "not measured" in html  # e.g. KV-cache share, never shown as 0
    assert "no NVML: libnvidia-ml.so.1 not found" in html
    for secret in SECRETS:
        assert secret not in html


def test_gates_with_margins_and_chosen_command(report):
    run_dir, html = report
    glance = html[html.index('id="glance"') : html.index('id="record"')]
    assert glance.count('class="badge met"') == 3
    gates = json.loads((run_dir / MANIFEST).read_text())["gates"]
    assert gates and all(g["margin"] is not None for g in gates)
    for gate in gates:  # each gate's row ends with its own headroom, signed, in percent
        assert f'<td class="num">{gate["margin"] * 100:+.1f}%</td></tr>' in glance, gate
    assert "docker run --rm -e HF_TOKEN=*** llmplay/llamacpp-cpu:local" in glance
    assert "--parallel=4" in glance


def test_report_command_rerenders_and_keeps_the_archive_verifying(tmp_path_factory, tmp_path):
    src = shared_archive(tmp_path_factory)
    run_dir = tmp_path / src.name
    shutil.copytree(src, run_dir)
    (run_dir / "report.html").unlink()
    result = CliRunner().invoke(cli, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(run_dir / "report.html")
    assert verify(run_dir) == []
    assert_self_contained((run_dir / "report.html").read_text())
    result = CliRunner().invoke(cli, ["report", str(tmp_path)])
    assert result.exit_code == 1 and result.output.startswith("error: ") and result.output.count("\n") == 1


def test_interrupted_run_without_record_still_renders(tmp_path_factory, tmp_path):
    src = shared_archive(tmp_path_factory)
    run_dir = tmp_path / src.name
    shutil.copytree(src, run_dir)
    archive = RunArchive.open(run_dir)
    manifest = archive.manifest()
    archive._manifest.update(
        status="interrupted", tuning_record=[], verdicts=manifest["verdicts"][:1], gates=[], findings=[], diagnosis={}
    )
    archive._save()
    html = render_report(run_dir).read_text()
    assert_self_contained(html)
    assert "did not complete (interrupted" in html and "rebuilt from trial summaries" in html
    assert "trials without a verdict" in html and "No gates were declared" in html


def test_trials_without_streamed_ttft_say_not_measured_with_the_reason(tmp_path_factory):
    run_dir = shared_archive(tmp_path_factory, streamed=False)
    assert verify(run_dir) == []
    html = (run_dir / "report.html").read_text()
    assert_self_contained(html)
    record = html[html.index('id="record"') : html.index('id="steps"')]
    cells = re.findall(r'<td class="num">([^<]*)</td>', record)
    assert cells.count("not measured") >= 3 * 3  # TTFT P50/P95/P99 of every configuration, never "0" or "—"
    assert "P50 TTFT, P95 TTFT, P99 TTFT not measured: no streamed request completed" in record
    glance = html[html.index('id="glance"') : html.index('id="record"')]
    assert "not measured" in glance and "no streamed request completed" in glance  # the ttft.p95 gate
    steps = html[html.index('id="steps"') : html.index('id="diagnosis"')]
    assert "baseline not measured: no streamed request completed" in steps  # the ttft.p95 guard's row
    assert "TTFT CDF" in steps and "not measured: no streamed request" in steps  # the empty charts say so
    for absent in ("nan", "None"):
        assert f">{absent}<" not in html


def test_thin_percentiles_are_marked_in_the_record_and_the_step_sections(tmp_path_factory, tmp_path):
    src = shared_archive(tmp_path_factory)
    html = (src / "report.html").read_text()
    record = html[html.index('id="record"') : html.index('id="steps"')]
    # each configuration's TTFT P99 pools 2 trials x 48 requests: fewer than the 100 a P99 needs
    assert re.search(r'<td class="num">[\d.]+ †</td>', record)
    assert "† P99 TTFT from 96 request(s) (needs at least 100): too few to mean much" in record
    run_dir = tmp_path / src.name
    shutil.copytree(src, run_dir)
    archive = RunArchive.open(run_dir)
    manifest = archive.manifest()
    manifest["verdicts"][0]["guards"][0].update(n_baseline=5, n_candidate=40)
    manifest["gates"][0]["note"] = "P95 TTFT from 5 request(s) (needs at least 20)"
    archive._manifest.update(verdicts=manifest["verdicts"], gates=manifest["gates"])
    archive._save()
    html = render_report(run_dir).read_text()
    step = html[html.index('id="step-1"') : html.index('id="step-2"')]
    assert "† baseline: P95 TTFT from 5 request(s) (needs at least 20)" in step
    assert re.search(r'<td class="num">[\d.]+ ms †</td>', step)
    glance = html[html.index('id="glance"') : html.index('id="record"')]
    assert "P95 TTFT from 5 request(s) (needs at least 20)" in glance


def test_trial_requests_tolerate_missing_and_extra_columns():
    df = pd.DataFrame({"sent_ns": [0, 10**9], "end_ns": [5 * 10**8, 2 * 10**9], "extra": ["x", "y"]})
    requests = requests_from(df)
    assert requests.timeline["done_s"].tolist() == [0.5, 2.0] and requests.timeline["send_gap_s"].tolist() == [1.0]
    assert requests.latency_s["itl"].size == 0 and requests.latency_s["ttft"].size == 0
    assert requests_from(pd.DataFrame()).latency_s["ttft"].size == 0
    assert requests_from(None).timeline["done_s"].size == 0


def test_cell_formats():
    assert fmt_value("ttft.p95", 0.2254) == "225"
    assert fmt_value("ttft.p95", 0.01234) == "12.3"
    assert fmt_value("errors.rate", 0.0) == "0.0%"
    assert fmt_value("memory.kv_share", None) == "—"
    assert fmt_value("throughput.output_tok_s", 232.44) == "232.4"


@pytest.mark.docker
@pytest.mark.slow
def test_report_from_a_real_cpu_run(cpu_engine, tmp_path, monkeypatch):
    """A real llama.cpp run (one step, one repeat): its report holds every row and verdict, and renders offline;
    signed as it is written, and a tampered copy fails verification before and after `llmplay report`."""
    private, public, _ = keygen(tmp_path / "keys" / "team.key")
    monkeypatch.setenv(ENV_SIGNING_KEY, str(private))
    monkeypatch.delenv(ENV_PUBLIC_KEY, raising=False)
    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["metadata"]["name"] = "cpu-report"
    doc["steps"] = [{"name": "parallel-4", "description": "four slots", "set": {"parallel": 4}}]
    doc["trials"] = {"repeats": 1, "interleave": True}
    doc["workload"].update({"duration": "3s", "warmup": "1s"})
    path = tmp_path / "cpu-report.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    outcome = run_playbook(
        load_playbook(path),
        RunOptions(archive_root=tmp_path / "reports"),
        publish=publish_report,
        report=lambda _: None,
    )
    assert outcome.status == "complete"
    assert verify(outcome.run_dir) == []
    html = (outcome.run_dir / "report.html").read_text()
    assert_self_contained(html)
    record = html[html.index('id="record"') : html.index('id="steps"')]
    for row in outcome.tuning_record:
        assert f"<td>{row.config_id}" in record
    for verdict in outcome.verdicts:
        assert verdict.reason.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in record
    assert html.count("<svg") >= 5 and "CPU only" in html and "step-1" in html
    assert not compare_runs(outcome.run_dir, outcome.run_dir).has_regression
    assert verify(outcome.run_dir, load_public_key(public)) == []

    copy = tmp_path / "copy" / outcome.run_dir.name
    shutil.copytree(outcome.run_dir, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["verdicts"][0]["verdict"] = "rejected" if manifest["verdicts"][0]["verdict"] == "kept" else "kept"
    (copy / MANIFEST).write_text(json.dumps(manifest, indent=1))
    assert CliRunner().invoke(cli, ["verify", str(copy)]).exit_code == 1
    result = CliRunner().invoke(cli, ["report", str(copy)])
    assert result.exit_code == 1 and "fails verification" in result.output
    assert CliRunner().invoke(cli, ["verify", str(copy)]).exit_code == 1
    manifest["manifest_sha256"] = manifest_sha256(manifest)  # re-sealed by hand: only the signature tells
    (copy / MANIFEST).write_text(json.dumps(manifest, indent=1))
    monkeypatch.setenv(ENV_PUBLIC_KEY, str(public))
    assert CliRunner().invoke(cli, ["verify", str(copy)]).exit_code == 1
    assert CliRunner().invoke(cli, ["report", str(copy)]).exit_code == 1
    assert CliRunner().invoke(cli, ["verify", str(copy)]).exit_code == 1
    assert CliRunner().invoke(cli, ["verify", str(outcome.run_dir)]).exit_code == 0

    (outcome.run_dir / "trials" / "t001" / "requests.parquet").write_bytes(b"tampered")
    assert verify(outcome.run_dir) == ["trials/t001/requests.parquet: changed (sha256 differs from manifest.json)"]


def test_no_p_value_is_shown_and_an_archive_with_old_p_values_still_loads_and_verifies(tmp_path_factory, tmp_path):
    """Mann-Whitney p-values ignored clustering within trials; runs archived with them still load, render and verify."""
    src = shared_archive(tmp_path_factory)
    run_dir = tmp_path / src.name
    shutil.copytree(src, run_dir)
    archive = RunArchive.open(run_dir)
    verdicts = archive.manifest()["verdicts"]
    assert verdicts and "p_value" not in json.dumps(verdicts)  # new runs do not write one
    for verdict in verdicts:
        for delta in [verdict.get("objective"), *verdict.get("guards", []), *verdict.get("deltas", [])]:
            if delta is not None:
                delta["p_value"] = 2.59e-66
    archive._manifest["verdicts"] = verdicts  # as llmplay wrote runs before the p-value was dropped
    archive._save()
    assert "p_value" in (run_dir / MANIFEST).read_text()
    assert verify(run_dir) == []
    html = render_report(run_dir).read_text()
    assert_self_contained(html)
    for shown in ("Mann", "p-value", "2.59e-66", '<th class="num">p ('):
        assert shown not in html, shown
    steps = html[html.index('id="steps"') : html.index('id="diagnosis"')]
    # the header names the interval's level: 95% for a fixed design, wider when sequential looks spend alpha
    assert re.search(r'<th class="num">\d+(\.\d)?% CI</th><th>direction</th>', steps), re.findall(
        r"<th class=.num.>[^<]*</th><th>direction", steps
    )


def test_method_lists_the_checklist_rules_the_diagnosis_evaluated(report):
    run_dir, html = report
    method = html[html.index('id="method"') : html.index('id="audit"')]
    assert "Checklist rules evaluated" in method
    assert "§5 decode-far-from-roofline" in method and "Decode far above its bandwidth floor" in method
    # An archive from before the rules were listed has none: no heading, nothing invented.
    manifest = json.loads((run_dir / MANIFEST).read_text())
    del manifest["diagnosis"]["rules"]
    assert ArchivedRun(run_dir, manifest).diagnosis().rules is None
