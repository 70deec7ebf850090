"""End to end on the CPU: real dockerd, real llama.cpp containers, real measurements, real verdicts."""

from __future__ import annotations

import json
import signal

import pytest
import yaml
from click.testing import CliRunner

from llmplay.archive.model import KEPT
from llmplay.archive.verify import verify
from llmplay.cli import cli as main_cli
from llmplay.playbook.load import load_playbook
from llmplay.report import publish_report
from llmplay.tuning.run import RunOptions, run_playbook
from llmplay_testing.cpu_runs import (
    cli,
    containers_of,
    engine_containers,
    reap_cli_processes,
    run_dir_of,
    tiny_playbook,
    wait_for,
    wait_for_the_measured_window,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def llmplay_containers(docker_client, *, pid: int | None = None, run_id: str | None = None) -> list:
    return containers_of(docker_client, pid=pid, run_id=run_id)


def test_tuning_run_decides_from_real_measurements(cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(
        tmp_path,
        duration="4s",
        warmup="1s",
        # Three pairs: the interval is a t on per-pair log ratios, and with two pairs (one degree of freedom) its
        # multiplier is 12.7, so even a 59% TTFT cut came out inconclusive.
        repeats=3,
        steps=[
            {"name": "parallel-4", "set": {"parallel": 4}},
            {
                "name": "useless-env",
                "description": "changes nothing the engine reads",
                "set": {"env.LLMPLAY_NOOP": "1"},
            },
        ],
    )
    # A guard holds only when its interval's worse bound is inside the tolerance (non-inferiority): three 4 s trials
    # a side bound throughput to about +-20%, so this test's guard allows 35% where cpu-tiny's allows 15%.
    doc = yaml.safe_load(path.read_text())
    # On a busy machine three pairs can leave even a large cut undecided: sequential mode adds pairs (up to five)
    # while undecided, at a per-look level that keeps the overall error rate.
    doc["trials"].update({"sequential": True, "max_repeats": 4})
    doc["goals"]["guards"] = [
        {"metric": "throughput.output_tok_s", "tolerance": "35%"},
        {"metric": "errors.rate", "tolerance": "2pp"},
    ]
    # The median, where cpu-tiny minimizes the P95: a 4 s trial holds about 50 requests, so its P95 is its third
    # slowest, which an engine test on the other worker decides. CI once measured the P95 of four slots +1.5% against
    # one slot's (the means 253 ms against 315 ms) where a pair beside two busy loops here gave P50 88 ms against 294 ms.
    doc["goals"]["objective"] = {"minimize": "ttft.p50", "min_effect": "10%"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    playbook = load_playbook(path)
    lines: list[str] = []
    outcome = run_playbook(
        playbook, RunOptions(archive_root=tmp_path / "reports"), publish=publish_report, report=lines.append
    )
    assert outcome.status == "complete", lines
    by_step = {v.step: v for v in outcome.verdicts}
    parallel = by_step["parallel-4"]
    objective = parallel.objective
    assert objective.metric == "ttft.p50" and objective.rel_change is not None
    # Four slots serve four users at once, where one slot queues each behind the other three: the median request's
    # wait has the sign the queueing dictates, inside its own interval. How large a cut a loaded 2-core machine shows
    # is a measurement (README's demo), not llmplay's to assert.
    assert objective.rel_change < 0, objective
    assert objective.ci_low is not None and objective.ci_high is not None
    assert objective.ci_low <= objective.rel_change <= objective.ci_high, objective
    # The verdict follows from the archived trials; whether a guard settles within four pairs on a loaded 2-core
    # machine is noise, not llmplay (README's demo counts how often it does). A wrong-signed verdict never is, and a
    # keep is only ever a shown gain: an interval wholly on the better side.
    assert parallel.verdict in (KEPT, "inconclusive"), parallel.reason
    if parallel.verdict == KEPT:
        assert objective.ci_high < 0, objective
    assert parallel.reason
    # A step that changes nothing is an A/A: kept 2.5% of the time by design (benchmarks/RESULTS.md's real A/A),
    # so only its verdict's shape is checked here.
    assert by_step["useless-env"].objective is not None and by_step["useless-env"].objective.units >= 3
    assert outcome.final_config_id in {v.candidate_config for v in outcome.verdicts if v.carried} | {"baseline"}
    assert [row.config_id for row in outcome.tuning_record] == ["baseline", "parallel-4", "useless-env"]
    assert outcome.exit_code in (0, 3) and len(outcome.gates) == 4
    assert verify(outcome.run_dir) == []
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert 12 <= len(manifest["trials"]) <= 16 and all(t["status"] == "ok" for t in manifest["trials"])
    first = manifest["trials"][0]["summary"]
    assert first["ttft.p95"] > 0 and first["errors.rate"] == 0
    assert (outcome.run_dir / "report.html").is_file()
    assert llmplay_containers(docker_client, run_id=manifest["run_id"]) == []


@pytest.fixture(autouse=True)
def _reap():
    yield
    reap_cli_processes()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_trial_leaves_no_container(cpu_engine, docker_client, tmp_path, sig):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="30s")
    proc = cli("run", str(path), "--archive", str(tmp_path / "reports"))
    (container,) = wait_for(lambda: engine_containers(docker_client, pid=proc.pid), 120, "the engine container")
    # Signal once the client has recorded a measured request, counted on the engine: a fixed wait after /health
    # held none when an engine test on the other worker had the cores.
    wait_for_the_measured_window(container, path, recorded=True)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    assert llmplay_containers(docker_client, pid=proc.pid) == []
    run_dir = run_dir_of(tmp_path / "reports")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    # what the cut-short trial had measured is kept, marked interrupted so --resume measures it again
    (trial,) = manifest["trials"]
    assert trial["status"] == "interrupted" and "finished request(s) kept" in trial["error"]
    assert trial["summary"]["requests.completed"] > 0 and trial["files"]["records"]
    assert verify(run_dir) == []


def test_kill9_then_resume_completes_and_verifies(cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="3s", repeats=2)
    archive = tmp_path / "reports"
    proc = cli("run", str(path), "--archive", str(archive))

    def two_trials_archived():
        run_dir = run_dir_of(archive)
        if run_dir is None:
            return False
        try:
            return len(json.loads((run_dir / "manifest.json").read_text())["trials"]) >= 2
        except (json.JSONDecodeError, KeyError):
            return False  # never expected: writes are atomic; the assertion below would catch a torn file

    wait_for(lambda: engine_containers(docker_client, pid=proc.pid), 120, "the first engine container")
    # `llmplay gc` (every llmplay container on this host) while the run is going removes nothing of it.
    run_id = run_dir_of(archive).name
    swept = CliRunner().invoke(main_cli, ["gc"]).output
    assert not [line for line in swept.splitlines() if line.startswith("removed ") and f"(run {run_id}" in line], swept
    wait_for(two_trials_archived, 300, "two archived trials")
    out = CliRunner().invoke(main_cli, ["ls", "--archive", str(archive)]).output
    assert " running " in out and "shown interrupted" not in out, out
    proc.kill()
    proc.wait(timeout=30)
    run_dir = run_dir_of(archive)
    done_before = json.loads((run_dir / "manifest.json").read_text())["trials"]
    out = CliRunner().invoke(main_cli, ["ls", "--archive", str(archive)]).output
    assert " interrupted " in out and "1 run(s) shown interrupted" in out, out  # the manifest still says running
    resumed = cli("run", "--resume", str(run_dir), str(path))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode in (0, 3), out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert len(manifest["trials"]) == 4 and all(t["status"] == "ok" for t in manifest["trials"]), manifest["trials"]
    assert [t["trial_id"] for t in manifest["trials"][: len(done_before)]] == [t["trial_id"] for t in done_before]
    assert verify(run_dir) == []
    assert llmplay_containers(docker_client, pid=resumed.pid) == []
    # the container orphaned by kill -9 was found and removed when the resumed run started
    assert llmplay_containers(docker_client, pid=proc.pid) == []


def test_engine_killed_mid_trial_is_a_failed_trial_and_the_run_goes_on(cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="8s", repeats=1)
    archive = tmp_path / "reports"
    proc = cli("run", str(path), "--archive", str(archive))
    container = wait_for(lambda: engine_containers(docker_client, pid=proc.pid), 120, "the engine container")[0]
    wait_for(lambda: run_dir_of(archive), 60, "the archive")
    # Inside the measured window, told by the engine's counters: a fixed 4 s after the archive appeared killed the
    # engine before it was healthy when the machine was busy, which is a start failure, not this test's case.
    wait_for_the_measured_window(container, path)
    container.kill()
    out, _ = proc.communicate(timeout=300)
    manifest = json.loads((run_dir_of(archive) / "manifest.json").read_text())
    trials = manifest["trials"]
    assert trials[0]["status"] == "failed", out
    assert trials[0]["error"]
    assert len(trials) == 2 and trials[1]["status"] == "ok"  # the run went on
    assert manifest["verdicts"][0]["verdict"] == "failed"
    assert trials[0]["files"]["log"].endswith("engine.log")  # the engine's own last words are archived
    assert llmplay_containers(docker_client, pid=proc.pid) == []


def test_sigint_then_resume_measures_the_interrupted_trial_again(cpu_engine, docker_client, tmp_path):
    # 5 s trials: the interrupt lands in the first one's measured window, however slowly the engine started.
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="5s", repeats=2)
    archive = tmp_path / "reports"
    proc = cli("run", str(path), "--archive", str(archive))
    (container,) = wait_for(lambda: engine_containers(docker_client, pid=proc.pid), 120, "the engine container")
    # Mid-trial, told by the engine's counters (a fixed 1.5 s after the container appeared landed in the engine's
    # start or in its measured window: two different cases, decided by the machine's speed).
    wait_for_the_measured_window(container, path)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    run_dir = run_dir_of(archive)
    interrupted = [t["trial_id"] for t in json.loads((run_dir / "manifest.json").read_text())["trials"]]
    resumed = cli("run", "--resume", str(run_dir), str(path))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode in (0, 3), out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    statuses = [t["status"] for t in manifest["trials"]]
    assert statuses.count("ok") == 4 and statuses.count("interrupted") == 1, statuses
    # the interrupted trial is kept as it was, and its place measured again by another
    assert [t["trial_id"] for t in manifest["trials"][: len(interrupted)]] == interrupted
    assert manifest["status"] == "complete" and verify(run_dir) == []
