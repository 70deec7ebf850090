"""CI-native outputs (--junit, --summary, --metrics) of run, compare and history --check, each read back with a real
parser: junitparser for the JUnit XML, markdown-it for the summary, prometheus_client's OpenMetrics parser and
its Prometheus text parser (what node_exporter's textfile collector reads) for the metrics."""

from __future__ import annotations

import shutil
import stat
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite
from markdown_it import MarkdownIt
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus_text

from llmplay.archive.reader import ArchivedRun
from llmplay.cli import cli
from llmplay.errors import ExitCode
from llmplay.outputs.facts import run_section
from llmplay.outputs.files import OutputFiles
from llmplay.outputs.write import write_outputs
from llmplay_testing.instrument import InstrumentServer
from llmplay_testing.make_archive import make_archive


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Two runs of synthetic-tune in one archive: a reference whose gates hold, then one twelve times slower, whose
    P95 TTFT (about 2.6 s) and throughput (about 20 tok/s) gates fail and whose objective and guard regress."""
    base = tmp_path_factory.mktemp("outputs")
    reference = make_archive(base, seed=7)
    time.sleep(1.1)  # run ids are UTC seconds: the slower run is the newer one
    slower = make_archive(base, seed=11, slowdown=12.0)
    return base / "reports", reference, slower


def suites_of(path: Path) -> list[TestSuite]:
    return list(JUnitXml.fromfile(str(path)))


def cases_by_name(suite: TestSuite) -> dict[str, TestCase]:
    return {case.name: case for case in suite}


def outcome(case: TestCase) -> str:
    results = case.result
    if not results:
        return "passed"
    return {Failure: "failure", Skipped: "skipped", Error: "error"}[type(results[0])]


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in parse_openmetrics(text)}


def test_a_run_that_misses_gates_fails_exactly_those_cases(runs, tmp_path):
    _, _, slower = runs
    archived = ArchivedRun.open(slower)
    exit_code = archived.info.exit_code
    assert exit_code == ExitCode.GATES
    write_outputs(OutputFiles(junit=tmp_path / "j.xml"), [run_section(slower, exit_code)])
    [suite] = suites_of(tmp_path / "j.xml")
    cases = cases_by_name(suite)
    gates = archived.gates()
    missed = [g for g in gates if not g.met]
    assert missed and len(missed) < len(gates)
    assert suite.name == "llmplay run synthetic-tune" and suite.tests == len(gates) + len(archived.verdicts())
    assert suite.failures == len(missed) and suite.errors == 0
    for gate in gates:
        case = cases[f"gate {gate.gate}"]
        assert case.classname == "synthetic-tune.gates"
        assert outcome(case) == ("passed" if gate.met else "failure")
    ttft = cases["gate ttft.p95 < 2s"].result[0]
    # The figure and its spread over the final configuration's trials, with the margin.
    assert ttft.message.startswith("ttft.p95 < 2s: observed ")
    assert "per-trial " in ttft.message and "over 2 trials" in ttft.message and "-> FAILED (margin -" in ttft.message
    steps = {v.step: v for v in archived.verdicts()}
    assert outcome(cases["step 1 parallel-4"]) == "passed" and steps["parallel-4"].verdict == "kept"
    assert outcome(cases["step 2 flash-attention"]) == "passed"  # rejected is an answer, not a failure
    inconclusive = cases["step 3 kv-cache-q8"]
    assert outcome(inconclusive) == "skipped"
    assert inconclusive.result[0].message.startswith("inconclusive: output tokens/s") and "[" in inconclusive.system_out
    properties = {p.name: p.value for p in suite.properties()}
    assert properties["run_id"] == slower.name and properties["exit_code"] == "3"
    assert properties["report"] == str(slower / "report.html") and properties["final_configuration"] == "parallel-4"


def test_a_run_that_meets_its_gates_has_no_failure(runs, tmp_path):
    _, reference, _ = runs
    write_outputs(OutputFiles(junit=tmp_path / "j.xml"), [run_section(reference, 0)])
    [suite] = suites_of(tmp_path / "j.xml")
    assert suite.failures == 0 and suite.errors == 0 and suite.skipped == 1  # the inconclusive step


def test_metrics_parse_as_openmetrics_and_as_textfile_collector_text(runs, tmp_path):
    _, _, slower = runs
    archived = ArchivedRun.open(slower)
    path = tmp_path / "llmplay.prom"
    path.write_text("stale\n")
    write_outputs(OutputFiles(metrics=path), [run_section(slower, 3)])
    text = path.read_text()
    assert text.endswith("# EOF\n")
    # Replaced atomically: no temp file left beside it, none named like a *.prom file, readable by the collector.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llmplay.prom"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    parsed = families(text)
    final = next(r for r in archived.tuning_record() if r.config_id == "parallel-4")
    [ttft] = parsed["llmplay_ttft_p95_seconds"]
    assert ttft.value == pytest.approx(final.metrics["ttft.p95"])
    assert ttft.labels == {
        "playbook": "synthetic-tune",
        "engine": "llamacpp",
        "engine_version": "b4567 (abc123)",
        "image": "llmplay/llamacpp-cpu:local",
        "config": "parallel-4",
    }
    assert parsed["llmplay_throughput_output_tok_s"][0].value == pytest.approx(final.metrics["throughput.output_tok_s"])
    gates = {s.labels["gate"]: s.value for s in parsed["llmplay_gate_met"]}
    assert gates == {g.gate: float(bool(g.met)) for g in archived.gates()}
    assert parsed["llmplay_exit_code"][0].value == 3
    assert parsed["llmplay_run_info"][0].labels["run_id"] == slower.name
    assert {s.labels["verdict"]: s.value for s in parsed["llmplay_steps"]}["kept"] == 1
    # The same text in the Prometheus text format node_exporter's textfile collector and a Pushgateway read.
    classic = {f.name: f for f in parse_prometheus_text(text)}
    assert classic["llmplay_ttft_p95_seconds"].type == "gauge"
    assert classic["llmplay_ttft_p95_seconds"].samples[0].value == pytest.approx(final.metrics["ttft.p95"])


def test_summary_renders_its_tables_and_appends(runs, tmp_path):
    _, reference, slower = runs
    path = tmp_path / "step-summary.md"
    path.write_text("## earlier step\n")
    write_outputs(OutputFiles(summary=path), [run_section(slower, 3)])
    write_outputs(OutputFiles(summary=path), [run_section(reference, 0)])
    text = path.read_text()
    assert text.startswith("## earlier step\n\n### llmplay run · synthetic-tune · ❌ a gate failed (exit 3)")
    assert "### llmplay run · synthetic-tune · ✅ passed (exit 0)" in text
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert html.count("<table>") == 6  # per run: gates, steps, the final configuration's figures
    assert "<code>ttft.p95 &lt; 2s</code>" in html and "❌ FAILED" in html
    assert (
        "<strong>inconclusive</strong>" in html
        and "<strong>Final configuration:</strong> <code>parallel-4</code>" in html
    )
    assert f"report: <code>{slower / 'report.html'}</code>" in html
    assert "docker run --rm -e HF_TOKEN=*** llmplay/llamacpp-cpu:local" in text


def cli_with_outputs(*args: str, out: Path) -> tuple[int, str]:
    flags = ["--junit", str(out / "j.xml"), "--summary", str(out / "s.md"), "--metrics", str(out / "m.prom")]
    result = CliRunner().invoke(cli, [*args, *flags])
    return result.exit_code, result.output


def test_history_check_regression_is_a_failure_in_every_output(runs, tmp_path):
    root = tmp_path / "reports"
    shutil.copytree(runs[0], root)
    reference, slower = runs[1].name, runs[2].name
    assert (
        CliRunner().invoke(cli, ["history", "synthetic-tune", "--accept", reference, "--archive", str(root)]).exit_code
        == 0
    )
    code, output = cli_with_outputs("history", "--check", "--archive", str(root), out=tmp_path)
    assert code == ExitCode.REGRESSION, output
    [suite] = suites_of(tmp_path / "j.xml")
    cases = cases_by_name(suite)
    assert suite.name == "llmplay history --check synthetic-tune" and suite.errors == 0
    objective = cases["objective output tokens/s"].result[0]
    assert isinstance(objective, Failure) and "beyond its 5% tolerance" in objective.message
    assert "tok/s -> " in objective.message and "% [" in objective.message  # the figures and the interval
    gate = cases["gate ttft.p95 < 2s"].result[0]
    assert isinstance(gate, Failure) and gate.message.startswith("met in the reference, failed now: ttft.p95 < 2s")
    assert suite.failures == sum(outcome(c) == "failure" for c in suite) >= 3
    properties = {p.name: p.value for p in suite.properties()}
    assert properties["run_id"] == slower and properties["reference_run_id"] == reference
    metrics = families((tmp_path / "m.prom").read_text())
    assert metrics["llmplay_regression"][0].value == 1
    assert metrics["llmplay_regression"][0].labels["reference_run_id"] == reference
    change = {(s.labels["metric"], s.labels["bound"]): s.value for s in metrics["llmplay_relative_change_ratio"]}
    assert change[("throughput.output_tok_s", "high")] < -0.05
    summary = (tmp_path / "s.md").read_text()
    assert summary.startswith("### llmplay history --check · synthetic-tune · ❌ regression (exit 4)")
    assert f"Run `{slower}` against the reference `{reference}`" in summary and "❌ REGRESSION" in summary


def test_compare_of_a_run_with_itself_passes_in_every_output(runs, tmp_path):
    _, reference, _ = runs
    code, output = cli_with_outputs("compare", str(reference), str(reference), out=tmp_path)
    assert code == ExitCode.OK, output
    [suite] = suites_of(tmp_path / "j.xml")
    assert suite.name == "llmplay compare synthetic-tune" and suite.failures == 0 and suite.errors == 0
    assert families((tmp_path / "m.prom").read_text())["llmplay_regression"][0].value == 0
    assert "✅ passed (exit 0)" in (tmp_path / "s.md").read_text()


def test_outputs_that_cannot_be_written_fail_the_job(runs, tmp_path):
    _, reference, _ = runs
    (tmp_path / "not-a-dir").write_text("")
    result = CliRunner().invoke(
        cli, ["compare", str(reference), str(reference), "--junit", str(tmp_path / "not-a-dir" / "j.xml")]
    )
    assert result.exit_code == ExitCode.INFRA
    assert f"error: could not write --junit {tmp_path / 'not-a-dir' / 'j.xml'}: " in result.output


def test_history_writes_outputs_only_with_check(tmp_path):
    result = CliRunner().invoke(cli, ["history", "--archive", str(tmp_path), "--junit", str(tmp_path / "j.xml")])
    assert result.exit_code == 2 and "written by `history --check` only; add --check" in result.output
    assert not (tmp_path / "j.xml").exists()


ENDPOINT_PLAYBOOK = """\
    apiVersion: llmplay/v1
    kind: Playbook
    metadata: {{name: ci-endpoint, version: "1"}}
    goals:
      gates: [ttft.p95 < 10ms, errors.rate < 1%]
      objective: {{minimize: ttft.p95, min_effect: 5%}}
    workload: {{api: completions, input: {{fixed: 16}}, output: {{fixed: 8}}, concurrency: 2, duration: 1s, warmup: 0s, seed: 1}}
    trials: {{repeats: 2}}
    runtime: {{kind: endpoint, url: "{url}"}}
    engine: {{kind: llamacpp, model: tiny}}
    steps:
      - {{name: four-users, set: {{workload.concurrency: 4}}}}
    """


@pytest.mark.slow
def test_llmplay_run_writes_all_three(tmp_path):
    """The real command end to end against a running endpoint whose first token takes 30 ms: the 10 ms gate fails."""
    with InstrumentServer() as server:
        playbook = tmp_path / "ci-endpoint.yaml"
        playbook.write_text(textwrap.dedent(ENDPOINT_PLAYBOOK.format(url=server.url_for(ttft_ms=30, itl_ms=2))))
        code, output = cli_with_outputs("run", str(playbook), "--archive", str(tmp_path / "reports"), out=tmp_path)
    assert code == ExitCode.GATES, output
    [suite] = suites_of(tmp_path / "j.xml")
    cases = cases_by_name(suite)
    assert outcome(cases["gate ttft.p95 < 10ms"]) == "failure" and outcome(cases["gate errors.rate < 1%"]) == "passed"
    assert "step 1 four-users" in cases and suite.failures == 1
    metrics = families((tmp_path / "m.prom").read_text())
    assert metrics["llmplay_ttft_p95_seconds"][0].value > 0.010 and metrics["llmplay_exit_code"][0].value == 3
    assert "### llmplay run · ci-endpoint · ❌ a gate failed (exit 3)" in (tmp_path / "s.md").read_text()
