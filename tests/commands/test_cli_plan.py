"""`llmplay validate` and `llmplay plan` through click's runner, exactly as users call them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.commands.plan import describe_shortfall
from llmplay.plan import expected_requests, request_share, sample_shortfalls
from llmplay.spec import Goals, Objective, Trials, Workload

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yaml"))
# Shipped playbooks replaying the trace in ../shared beside the repository: they need --allow-outside-tree.
OUTSIDE_TREE = {"vllm-cpu-trace.yaml"}


def outside_flag(path: Path) -> list[str]:
    return ["--allow-outside-tree"] if path.name in OUTSIDE_TREE else []


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_validate_all_shipped_playbooks():
    # The GPU playbooks name model folders of a GPU host: --any-host checks what holds anywhere.
    inside = [p for p in PLAYBOOKS if p.name not in OUTSIDE_TREE]
    result = invoke("validate", "--any-host", *map(str, inside))
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok (") == len(inside)
    outside = [p for p in PLAYBOOKS if p.name in OUTSIDE_TREE]
    result = invoke("validate", "--any-host", "--allow-outside-tree", *map(str, outside))
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok (") == len(outside)
    # Without the flag the trace outside the playbook's tree is refused, with the flag named.
    refused = CliRunner().invoke(cli, ["validate", "--any-host", *map(str, outside)])
    assert refused.exit_code == 2 and "--allow-outside-tree" in refused.output


def test_validate_refuses_a_model_dir_missing_on_this_host(tmp_path):
    doc = yaml.safe_load((ROOT / "playbooks" / "vllm-cpu-tiny.yaml").read_text())
    doc["engine"]["model_dir"] = str(tmp_path / "no-such-model")
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{path}:" in result.output and "engine.model_dir" in result.output and "does not exist" in result.output
    assert invoke("validate", "--any-host", str(path)).exit_code == 0


def test_plan_prints_a_guard_in_points_as_points():
    out = invoke("plan", str(ROOT / "playbooks" / "cpu-tiny.yaml")).output
    assert "Guards: throughput.output_tok_s within 25%, errors.rate within 2pp" in out.splitlines()


def test_validate_bad_exits_2_without_traceback():
    bad = ROOT / "tests" / "data" / "bad" / "misspelled-top-key.yaml"
    result = invoke("validate", str(bad))
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "did you mean 'workload'?" in result.output


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_plan_every_playbook(path):
    result = invoke("plan", *outside_flag(path), str(path))
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


def low_rate_playbook(tmp_path: Path, **workload) -> Path:
    """The issue's first try: chat at 0.3 req/s for 12 s, three streamed requests in four, P95 goals."""
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    wl = doc["workload"]
    del wl["concurrency"]
    wl.update(api="chat", rate=0.3, duration="12s", streaming_fraction=0.75)
    wl.update(workload)
    for key in [k for k, v in wl.items() if v is None]:
        del wl[key]  # None: leave it out (rate=None for a closed loop)
    doc["goals"]["guards"].append({"metric": "e2el.p95", "tolerance": "10%"})
    doc["trials"] = {"repeats": 3}
    path = tmp_path / "low-rate.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_plan_warns_when_the_workload_measures_too_few_requests_for_its_percentiles(tmp_path):
    result = invoke("plan", str(low_rate_playbook(tmp_path)))
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: P95 TTFT (gate, objective) rests on about 2.7 streamed requests per trial "
        "(rate 0.3 req/s × 12 s × 75% streamed), about 8.1 over the 3 trial(s) pooled per configuration; "
        "it needs at least 20",
        "warning: P95 E2E latency (guard) rests on about 3.6 requests per trial (rate 0.3 req/s × 12 s), "
        "about 10.8 over the 3 trial(s) pooled per configuration; it needs at least 20",
    ]


def test_plan_says_what_a_count_depends_on_and_when_nothing_will_be_measured(tmp_path):
    budget = invoke("plan", str(low_rate_playbook(tmp_path, num_requests=2))).output  # ends before the 12 s do
    assert "P95 TTFT (gate, objective) rests on at most 1.5 streamed requests per trial (num_requests 2 × 75%" in budget
    silent = invoke("plan", str(low_rate_playbook(tmp_path, streaming_fraction=0.0))).output
    assert "warning: P95 TTFT (gate, objective) will not be measured: the workload sends no streamed requests" in silent
    closed = invoke("plan", str(low_rate_playbook(tmp_path, rate=None, concurrency=2))).output
    assert (
        "warning: P95 TTFT (gate, objective): how many streamed requests it rests on depends on the latency "
        "(concurrency 2 × 12 s ÷ mean latency × 75% streamed per trial); 3 trial(s) pooled per configuration "
        "reach the 20 it needs only if requests average under 2.7 s" in closed
    )
    roomy = invoke("plan", str(low_rate_playbook(tmp_path, rate=5, duration="60s"))).output
    assert "warning" not in roomy


def test_expected_requests_from_the_workload_as_written():
    w = Workload(rate=0.3, duration_s=12.0)
    assert expected_requests(w).count == pytest.approx(3.6) and expected_requests(w).bound == "about"
    both = expected_requests(Workload(rate=10.0, duration_s=60.0, num_requests=50))
    assert (both.count, both.bound, both.basis) == (50.0, "at most", "num_requests 50")
    closed = expected_requests(Workload(concurrency=4, duration_s=30.0, request_timeout_s=60.0))
    assert closed.count is None and closed.busy_s == 120.0 and closed.at_least == 2.0
    # a closed loop that would be enough even if every request ran to its timeout warns of nothing
    goals = Goals(objective=Objective("minimize", "ttft.p95"))
    assert sample_shortfalls(Workload(concurrency=64, duration_s=60, request_timeout_s=60), goals, Trials()) == []
    assert request_share("ttft_nonstream.p95", Workload(streaming_fraction=0.75)) == (0.25, "non-streamed")
    nonstream = Goals(objective=Objective("minimize", "ttft_nonstream.p95"))
    (short,) = sample_shortfalls(Workload(rate=10.0, duration_s=60.0), nonstream, Trials())
    assert describe_shortfall(short) == (
        "warning: P95 TTFT (non-streamed) (objective) will not be measured: "
        "the workload sends no non-streamed requests (streaming_fraction 1)"
    )
