"""Runs the reliability suite (tests/tuning/test_reliability.py, the playbook fuzzers, the results-pipeline fuzzer, the
signal/kill tests of tests/tuning/test_run_cpu.py) and prints the README's reliability figures: faults injected by kind,
inputs fuzzed, results-pipeline examples, containers leaked, records lost.

    .venv/bin/python benchmarks/reliability.py            # all of it (needs dockerd and the CPU engine image)
    .venv/bin/python benchmarks/reliability.py --no-docker

Figures come from the tests themselves: each appends a JSON line (faults it injected, requests it sent,
records it got back) to LLMPLAY_RELIABILITY_FIGURES; hypothesis reports how many examples each fuzzer ran.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from llmplay.runtime import dockerd
from llmplay.runtime.docker import LABEL_RUN, ORPHAN, judge

ROOT = Path(__file__).resolve().parents[1]
PIPELINE_FUZZER = "tests/report/test_results_pipeline.py"
SUITE = [
    "tests/tuning/test_reliability.py",
    "tests/playbook/test_fuzz_playbook.py",
    "tests/playbook/test_playbook.py",
    PIPELINE_FUZZER,
]
RUN_CPU = "tests/tuning/test_run_cpu.py"
# Faults injected by tests this script does not instrument: one per passing test, by name.
FAULTS_BY_TEST = {
    "test_signal_mid_trial_leaves_no_container[SIGINT]": "SIGINT mid-trial",
    "test_signal_mid_trial_leaves_no_container[SIGTERM]": "SIGTERM mid-trial",
    "test_kill9_then_resume_completes_and_verifies": "kill -9 of llmplay mid-run",
    "test_engine_killed_mid_trial_is_a_failed_trial_and_the_run_goes_on": "engine killed mid-trial",
}
KIND_LABELS = {
    "engine_oom_at_start": "engine OOM at start",
    "engine_stall": "engine frozen (docker pause)",
    "http_500": "HTTP 500",
    "connection_reset": "connection reset (RST)",
    "reset_before": "connection reset (RST)",
    "reset_mid": "connection reset (RST)",
    "connection_closed": "connection closed unanswered",
    "close_before": "connection closed unanswered",
    "exception_in_trial": "exception inside a trial",
}


def orphans() -> list[str]:
    """llmplay containers on this host whose llmplay process is gone: what a leak looks like."""
    client = dockerd.client()
    try:
        found = client.containers.list(all=True, filters={"label": LABEL_RUN})
        return [c.name for c in found if judge(c.labels or {})[0] == ORPHAN]
    finally:
        client.close()


def hypothesis_examples(stdout: str) -> tuple[int, int]:
    """Examples hypothesis ran (passing + invalid, from --hypothesis-show-statistics): the playbook fuzzers', and the
    results-pipeline fuzzer's, each test's statistics under its own `path::test:` heading."""
    playbook = pipeline = 0
    for heading, body in re.findall(r"^(\S+::\S+):\s*$(.*?)(?=^\S+::\S+:\s*$|\Z)", stdout, re.M | re.S):
        # "150 passing, 0 failing, and 16 invalid test cases" (older hypothesis: "150 passing examples, ...")
        passing = sum(int(x) for x in re.findall(r"(\d+) passing\b", body))
        invalid = sum(int(x) for x in re.findall(r"(\d+) invalid\b", body))
        if heading.startswith(PIPELINE_FUZZER):
            pipeline += passing  # an invalid draw there never reached the pipeline
        else:
            playbook += passing + invalid  # how this figure has always been counted
    return playbook, pipeline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docker", action="store_true", help="skip the container tests")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures_path, junit = Path(tmp) / "figures.jsonl", Path(tmp) / "junit.xml"
        targets = SUITE + (
            []
            if args.no_docker
            else [
                RUN_CPU + "::test_signal_mid_trial_leaves_no_container",
                RUN_CPU + "::test_kill9_then_resume_completes_and_verifies",
                RUN_CPU + "::test_engine_killed_mid_trial_is_a_failed_trial_and_the_run_goes_on",
            ]
        )
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--hypothesis-show-statistics",
            f"--junitxml={junit}",
            *targets,
        ]
        if args.no_docker:
            argv += ["-m", "not docker"]
        started = time.perf_counter()
        proc = subprocess.run(
            argv,
            cwd=ROOT,
            env={**os.environ, "LLMPLAY_RELIABILITY_FIGURES": str(figures_path)},
            capture_output=True,
            text=True,
        )
        wall_s = time.perf_counter() - started
        lines = [json.loads(x) for x in figures_path.read_text().splitlines()] if figures_path.exists() else []
        cases = ET.parse(junit).getroot().iter("testcase") if junit.exists() else []
        passed, failed = [], []
        for case in cases:
            (
                failed
                if any(c.tag in ("failure", "error") for c in case)
                else passed
                if not any(c.tag == "skipped" for c in case)
                else []
            ).append(case.get("name"))
    faults: Counter[str] = Counter()
    for line in lines:
        for kind, n in (line.get("faults") or {}).items():
            faults[KIND_LABELS.get(kind, kind)] += n
    for name, label in FAULTS_BY_TEST.items():
        if name in passed:
            faults[label] += 1
    examples, pipeline_examples = hypothesis_examples(proc.stdout)
    fixed_inputs = sum(
        1
        for name in passed
        if name.startswith(("test_python_tags", "test_docker_options", "test_huge_numbers", "test_billion_laughs"))
    )
    sent = sum(line.get("requests_sent", 0) for line in lines)
    records = sum(line.get("records", 0) for line in lines)
    leaked = orphans() if not args.no_docker else []
    figures = {
        "faults_injected": dict(sorted(faults.items())),
        "faults_injected_total": sum(faults.values()),
        "inputs_fuzzed": examples + fixed_inputs,
        "hypothesis_examples": examples,
        "results_pipeline_examples": pipeline_examples,
        "adversarial_inputs": fixed_inputs,
        "requests_sent": sent,
        "records": records,
        "records_lost": sent - records,
        "containers_leaked": len(leaked) + sum(line.get("leaked", 0) for line in lines),
        "manifest_reads_while_writing": sum(line.get("manifest_reads", 0) for line in lines),
        "torn_manifest_reads": sum(line.get("torn_reads", 0) for line in lines),
        "secrets_leaked": sum(line.get("leaked_secrets", 0) for line in lines),
        "tests_passed": len(passed),
        "tests_failed": failed,
        "wall_s": round(wall_s, 1),
    }
    print("| figure | value |\n|---|---|")
    for kind, n in figures["faults_injected"].items():
        print(f"| faults injected: {kind} | {n:,} |")
    print(f"| faults injected, total | {figures['faults_injected_total']:,} |")
    print(
        f"| inputs fuzzed (hypothesis examples + adversarial playbooks) | {figures['inputs_fuzzed']:,} "
        f"({examples:,} + {fixed_inputs}) |"
    )
    print(
        f"| results-pipeline examples (records → summary → decision → archive → report → compare) "
        f"| {pipeline_examples:,} |"
    )
    print(f"| requests sent under faults / records | {sent:,} / {records:,} |")
    print(f"| records lost | {figures['records_lost']} |")
    print(f"| containers leaked | {figures['containers_leaked']} |")
    print(
        f"| manifest reads during writes / torn | {figures['manifest_reads_while_writing']:,} / "
        f"{figures['torn_manifest_reads']} |"
    )
    print(f"| secrets found in archive or console | {figures['secrets_leaked']} |")
    print(f"\n{len(passed)} tests passed, {len(failed)} failed, {wall_s:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
