"""The nightly CI examples in docs/ci/ (GitLab and GitHub Actions): every llmplay command line in them uses options
the command has, and the job keeps what the CI outputs write (JUnit files as reports, the summary, the metrics)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import yaml

from llmplay.cli import cli

ROOT = Path(__file__).resolve().parents[2]
GITLAB = ROOT / "docs" / "ci" / "nightly-retest.gitlab-ci.yml"
GITHUB = ROOT / "docs" / "ci" / "nightly-retest.github.yml"


def shell_lines(path: Path) -> list[str]:
    doc = yaml.safe_load(path.read_text())
    if path == GITLAB:
        job = doc["nightly-engine-retest"]
        return [*job["script"], *job.get("after_script", ())]
    steps = doc["jobs"]["retest"]["steps"]
    return [line for step in steps if "run" in step for line in step["run"].splitlines()]


def llmplay_calls(path: Path) -> list[list[str]]:
    """Each `.venv/bin/llmplay ...` as its words, up to a `||` or `;`."""
    calls = []
    for line in shell_lines(path):
        for m in re.finditer(r"\.venv/bin/llmplay ([^|;#]*)", line):
            calls.append(shlex.split(m.group(1)))
    return calls


def command_of(words: list[str]) -> click.Command:
    command: click.Command = cli
    while isinstance(command, click.Group):
        command = command.commands[words.pop(0)]
    return command


@pytest.mark.parametrize("path", [GITLAB, GITHUB], ids=lambda p: p.name)
def test_every_llmplay_command_in_the_ci_examples_has_its_options(path):
    calls = llmplay_calls(path)
    assert [c[0] for c in calls] == ["engine", "retest", "history"]
    for words in calls:
        name = " ".join(words[:2]) if words[0] == "engine" else words[0]
        command = command_of(list(words))
        known = {opt for param in command.params for opt in getattr(param, "opts", ())}
        unknown = [w for w in words if w.startswith("--") and w not in known]
        assert unknown == [], f"{path.name}: llmplay {name} has no {unknown}"
    retest, check = calls[1], calls[2]
    assert "--junit" in retest and "--summary" in retest
    assert "--check" in check and {"--junit", "--summary", "--metrics"} <= set(check)


def test_the_gitlab_job_reports_the_junit_files_it_writes():
    job = yaml.safe_load(GITLAB.read_text())["nightly-engine-retest"]
    written = [words[words.index("--junit") + 1] for words in llmplay_calls(GITLAB) if "--junit" in words]
    artifacts = job["artifacts"]
    assert artifacts["when"] == "always" and artifacts["reports"]["junit"] == written
    assert "summary.md" in artifacts["paths"] and artifacts["reports"]["metrics"] == "metrics.txt"


def test_the_github_workflow_writes_the_step_summary():
    for words in llmplay_calls(GITHUB)[1:]:
        assert words[words.index("--summary") + 1] == "$GITHUB_STEP_SUMMARY"
