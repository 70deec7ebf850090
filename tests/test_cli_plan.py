"""`llmplay validate` and `llmplay plan` through click's runner, exactly as users call them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmplay.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yaml"))


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_validate_all_shipped_playbooks():
    result = invoke("validate", *map(str, PLAYBOOKS))
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok (") == len(PLAYBOOKS)


def test_validate_bad_exits_2_without_traceback():
    bad = ROOT / "tests" / "data" / "bad" / "misspelled-top-key.yaml"
    result = invoke("validate", str(bad))
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "did you mean 'workload'?" in result.output


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_plan_every_playbook(path):
    result = invoke("plan", str(path))
    assert result.exit_code == 0, result.output
    assert "Baseline" in result.output and "$ docker run" in result.output


def test_plan_chat_7b_has_five_single_variable_steps():
    out = invoke("plan", str(ROOT / "playbooks" / "chat-7b.yaml")).output
    for i, name in enumerate(["prefix-caching", "max-num-seqs-256", "fp8-weights", "fp8-kv-cache", "cuda-graphs"], 1):
        assert f"Step {i}: {name}" in out
    assert out.count("  changes ") == 5
    assert out.count("$ docker run") == 6
    assert "ttft.p95 < 500ms" in out and "cost.usd_per_1m_tokens < $0.5" in out
    assert "--gpus 1" in out and "vllm/vllm-openai" in out


def test_plan_user_error_is_one_line_and_exit_2(tmp_path):
    result = invoke("plan", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and "no such file" in result.output


def test_version():
    assert invoke("--version").output.startswith("llmplay, version ")
