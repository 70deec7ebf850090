"""compare: a planted regression is caught by run A's guards and objective, noise is not, and the exit codes hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmplay.archive.layout import MANIFEST
from llmplay.archive.writer import RunArchive
from llmplay.cli import cli
from llmplay.compare import compare_runs, format_comparison_table, render_comparison_html
from llmplay_testing.html_checks import assert_self_contained
from llmplay_testing.make_archive import shared_archive


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A, a re-run of A's configuration with other random draws, and an 80% slower re-run."""
    return (
        shared_archive(tmp_path_factory),
        shared_archive(tmp_path_factory, seed=11),
        shared_archive(tmp_path_factory, slowdown=1.8),
    )


def test_same_configuration_again_is_no_regression(runs):
    a, again, _ = runs
    comparison = compare_runs(a, again)
    assert not comparison.has_regression, comparison.regressions
    assert comparison.a.config_id == comparison.b.config_id == "parallel-4"
    assert len(comparison.a.trials) == 6  # every successful trial of the final configuration, in any role
    objective = comparison.objective
    assert objective is not None and objective.metric == "throughput.output_tok_s" and objective.tolerance == 0.05
    assert objective.ci_low < objective.rel_change < objective.ci_high
    assert "no regression" in format_comparison_table(comparison)


def test_planted_regression_is_flagged_by_objective_and_guard(runs):
    a, _, slow = runs
    comparison = compare_runs(a, slow)
    assert comparison.has_regression
    flagged = {m.metric: m for m in comparison.metrics if m.regression}
    assert set(flagged) >= {"throughput.output_tok_s", "ttft.p95"}
    ttft = flagged["ttft.p95"]
    assert ttft.role == "guard" and ttft.tolerance == 0.5 and ttft.rel_change > 0.5 and ttft.better is False
    assert not any(m.regression for m in comparison.metrics if m.role == "")  # only the playbook's metrics fail it
    table = format_comparison_table(comparison)
    assert "REGRESSION: objective output tokens/s" in table and "guard P95 TTFT" in table


def test_gate_met_in_a_and_failed_in_b_is_a_regression(runs, tmp_path):
    a, again, _ = runs
    b = tmp_path / again.name
    shutil.copytree(again, b)
    archive = RunArchive.open(b)
    gates = archive.manifest()["gates"]
    gates[1].update(met=False, margin=-0.2)
    archive._manifest["gates"] = gates
    archive._save()
    comparison = compare_runs(a, b)
    assert comparison.regressions == ["gate throughput.output_tok_s > 20: met in A, failed in B"]


def test_compare_command_exit_codes_and_html(runs, tmp_path):
    a, again, slow = runs
    runner = CliRunner()
    ok = runner.invoke(cli, ["compare", str(a), str(again)])
    assert ok.exit_code == 0, ok.output
    out = tmp_path / "cmp.html"
    bad = runner.invoke(cli, ["compare", str(a), str(slow), "--html", str(out)])
    assert bad.exit_code == 4, bad.output
    assert "REGRESSION" in bad.output and f"comparison: {out}" in bad.output
    html = out.read_text()
    assert_self_contained(html)
    assert "regression" in html and html.count("<svg") == 1
    missing = runner.invoke(cli, ["compare", str(a), str(tmp_path)])
    assert missing.exit_code == 1 and missing.output.startswith("error: ")


def test_unloadable_playbook_falls_back_to_gates(runs, tmp_path):
    a, _, slow = runs
    a2 = tmp_path / a.name
    shutil.copytree(a, a2)
    for name in ("playbook.yaml", "playbook.resolved.yaml"):
        (a2 / name).write_text("not: a playbook\n")
    manifest = json.loads((a2 / MANIFEST).read_text())
    manifest["playbook"]["path"] = str(tmp_path / "gone.yaml")
    (a2 / MANIFEST).write_text(json.dumps(manifest))
    comparison = compare_runs(a2, slow)
    assert any("could not be loaded" in n for n in comparison.notes)
    assert not comparison.has_regression  # no tolerances known, and the slow run still meets every gate


def test_html_renders_to_the_given_path(runs, tmp_path):
    a, again, _ = runs
    path = render_comparison_html(compare_runs(a, again), tmp_path / "sub" / "c.html")
    assert path.is_file() and "no regression" in path.read_text()


def test_a_metric_absent_on_one_side_is_not_measured_never_a_regression(runs, tmp_path_factory):
    a, _, _ = runs
    unstreamed = shared_archive(tmp_path_factory, streamed=False)  # no streamed request: no TTFT at all
    for first, second, side in ((a, unstreamed, "B"), (unstreamed, a, "A")):
        comparison = compare_runs(first, second)
        ttft = next(m for m in comparison.metrics if m.metric == "ttft.p95")
        assert ttft.role == "guard" and not ttft.regression and ttft.better is None
        assert ttft.note == f"not measured on {side}: no streamed request completed"
        assert not any(m.regression for m in comparison.metrics if m.a is None or m.b is None)
        table = format_comparison_table(comparison)
        assert "not measured" in table and "nan" not in table.lower()
        assert "every guard" not in table  # nothing was judged on the absent guard
        assert "not judged: guard P95 TTFT (not measured on " in table.splitlines()[-1]


def test_no_p_value_in_the_comparison(runs, tmp_path):
    a, again, _ = runs
    comparison = compare_runs(a, again)
    assert all(not hasattr(m, "p_value") for m in comparison.metrics)
    html = render_comparison_html(comparison, tmp_path / "c.html").read_text()
    for text in (format_comparison_table(comparison), html):
        assert "Mann" not in text and "p-value" not in text and "p_value" not in text
