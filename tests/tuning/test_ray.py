"""Trials on a real Ray cluster (a head and worker nodes on this machine, each worker declaring one GPU of type T4):
pairs pinned to a node and fanned over nodes, the node of every trial in the archive and the report, a lost node's
trial re-run elsewhere with no engine left behind, a driver killed and resumed, a playbook no node can host refused in
seconds. Every Ray process a test starts is stopped whatever happens (cluster.shutdown, ray.shutdown, ray stop)."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

pytest.importorskip("ray")

from llmplay.archive.verify import verify
from llmplay.playbook.load import load_playbook
from llmplay.report import publish_report
from llmplay.runtime.labels import LABEL_PID, LABEL_RUN
from llmplay.tuning.run import RunOptions, RunOutcome, TuningRun, run_playbook
from llmplay_testing.cpu_runs import (
    cli,
    containers_of,
    reap_cli_processes,
    run_dir_of,
    tiny_playbook,
    wait_for,
    wait_for_the_measured_window,
)
from llmplay_testing.ray_cluster import FixedTrials, kill_raylet, local_cluster, node_running, replace_node

ROOT = Path(__file__).resolve().parents[2]
GPU_TYPE = {"accelerator_type:T4": 1}


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(workers=2, cpus=1, gpus=1, resources=GPU_TYPE) as c:
        yield c


@pytest.fixture(autouse=True)
def _reap():
    yield
    reap_cli_processes()


def ray_playbook(tmp_path: Path, *, repeats: int = 2, steps: list | None = None, **runtime) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["trials"] = {"repeats": repeats}
    # 30 requests a trial cannot show an error rate within a few points: these tests are about scheduling.
    doc["goals"]["guards"] = [g for g in doc["goals"]["guards"] if g["metric"] != "errors.rate"]
    doc["steps"] = steps if steps is not None else [{"name": "parallel-4", "set": {"parallel": 4}}]
    doc["runtime"] = {"kind": "ray", "address": "auto", **runtime}
    path = tmp_path / "cpu-tiny-ray.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def used_pairs_on_one_node(m: dict) -> dict[int, str]:
    """Every pair the verdict used ran both its trials on one node: repeat -> node id."""
    (verdict,) = m["verdicts"]
    used = set(verdict["trials_baseline"]) | set(verdict["trials_candidate"])
    nodes: dict[int, set[str]] = {}
    for t in m["trials"]:
        if t["trial_id"] in used:
            assert t["superseded"] is None and t["node"]["id"] and t["node"]["address"], t
            nodes.setdefault(t["repeat"], set()).add(t["node"]["id"])
    assert all(len(n) == 1 for n in nodes.values()), nodes
    return {r: n.pop() for r, n in nodes.items()}


def run_meeting(tmp_path: Path, **playbook: object) -> tuple[RunOutcome, Path]:
    """Trials of a fixed 2 s, 2 pairs a step on T4 nodes, each trial waiting to meet one started on the other node
    (FixedTrials' meet_nodes): the completed run and the folder where every trial wrote its node and whom it met."""
    pb = load_playbook(ray_playbook(tmp_path, repeats=2, accelerator_type="T4", **playbook))
    started = tmp_path / "started"
    started.mkdir()
    lines: list[str] = []
    outcome = TuningRun(
        pb,
        RunOptions(archive_root=tmp_path / "r"),
        report=lines.append,
        measure_trial=FixedTrials(pb, 2.0, started_dir=str(started), meet_nodes=2),
    ).execute()
    assert outcome.status == "complete", lines
    return outcome, started


def test_pairs_fan_out_over_nodes_and_each_pair_stays_on_one_node(cluster, tmp_path):
    """Scheduling alone (trials of a fixed 2 s): two pairs on two nodes run at once, each pair on one node."""
    outcome, started = run_meeting(tmp_path)
    m = manifest(outcome.run_dir)
    assert len(m["trials"]) == 4 and all(t["status"] == "ok" for t in m["trials"])
    nodes = used_pairs_on_one_node(m)
    assert len(set(nodes.values())) == 2  # the two pairs ran on the two workers
    # At once, not one after the other: every trial, once started, met a trial started on the other node (each
    # waits for it, however long a busy machine takes to start a node's worker process). Run one pair after the
    # other, the first pair's trials would have waited for the second in vain. Overlapping timestamps would say the
    # same only while the two workers start within a trial's length of each other, which is the machine's noise.
    for t in m["trials"]:
        node, _, *met = (started / t["trial_id"]).read_text().split()
        assert node == t["node"]["id"]
        assert met == ["met"], (t["trial_id"], sorted(f.read_text() for f in started.iterdir()))
    (verdict,) = m["verdicts"]
    assert verdict["verdict"] == "kept"
    assert "each pair on one node" in verdict["objective"]["method"]
    assert set(nodes.values()) <= {n["id"] for n in m["environment"]["cluster"]["nodes"]}
    assert verify(outcome.run_dir) == []


def test_raced_steps_run_their_pairs_at_once_on_separate_nodes(cluster, tmp_path):
    """Two `carry: race` steps (what a tune.race round writes), each against the baseline: their first pairs start
    together, one step's on each worker, each pair on one node; the kept one is carried, the other is not."""
    steps = [
        {"name": "parallel-4", "set": {"parallel": 4}, "carry": "race"},
        {"name": "parallel-2", "set": {"parallel": 2}, "carry": "race"},
    ]
    outcome, started = run_meeting(tmp_path, steps=steps)
    m = manifest(outcome.run_dir)
    assert len(m["trials"]) == 8 and all(t["status"] == "ok" for t in m["trials"])
    pairs: dict[tuple[str, int], set[str]] = {}
    for t in m["trials"]:
        pairs.setdefault((t["step"], t["repeat"]), set()).add(t["node"]["id"])
    assert all(len(nodes) == 1 for nodes in pairs.values()), pairs  # every pair on one node
    assert pairs[("parallel-4", 0)] != pairs[("parallel-2", 0)], pairs  # the two steps' first pairs: two nodes
    for step in ("parallel-4", "parallel-2"):  # and at once: each step's first trial met one on the other node
        first = min(t["trial_id"] for t in m["trials"] if t["step"] == step and t["repeat"] == 0)
        assert (started / first).read_text().split()[2:] == ["met"], (
            first,
            sorted(f.read_text() for f in started.iterdir()),
        )
    verdicts = {v["step"]: v for v in m["verdicts"]}
    assert verdicts["parallel-4"]["verdict"] == "kept" and verdicts["parallel-4"]["carried"]
    assert not verdicts["parallel-2"]["carried"]
    assert verdicts["parallel-2"]["baseline_config"] == verdicts["parallel-4"]["baseline_config"] == "baseline"
    assert outcome.final_config_id == verdicts["parallel-4"]["candidate_config"]
    assert verify(outcome.run_dir) == []


@pytest.mark.docker
def test_cpu_tiny_on_the_cluster_same_archive_and_report_as_one_machine(cluster, cpu_engine, docker_client, tmp_path):
    """cpu-tiny with repeats 2, real llama.cpp containers started by each node through its dockerd."""
    path = tiny_playbook(
        tmp_path,
        steps=[{"name": "parallel-4", "set": {"parallel": 4}}],
        repeats=2,
        duration="2s",
        warmup="0.5s",
        runtime={"kind": "ray", "address": "auto", "inner": "docker", "accelerator_type": "T4"},
    )
    lines: list[str] = []
    outcome = run_playbook(
        load_playbook(path), RunOptions(archive_root=tmp_path / "r"), publish=publish_report, report=lines.append
    )
    assert outcome.status == "complete", lines
    m = manifest(outcome.run_dir)
    assert len(m["trials"]) == 4 and all(t["status"] == "ok" for t in m["trials"]), m["trials"]
    nodes = used_pairs_on_one_node(m)
    # Both nodes measured a pair: the pairs were handed out at once (one node holds one pair at a time). Whether the
    # two nodes' first trials also *started* first depends on how fast each worker process and engine start on a busy
    # machine; that they run at once is shown by test_pairs_fan_out_over_nodes_and_each_pair_stays_on_one_node.
    assert len(set(nodes.values())) == 2, nodes
    for t in m["trials"]:  # the same records, telemetry and logs come back as on one machine
        assert t["summary"]["requests.completed"] > 0 and t["files"]["records"] and t["files"]["log"]
        assert t["engine_describe"]["runtime"] == "docker"
    (verdict,) = m["verdicts"]
    assert "each pair on one node" in verdict["objective"]["method"]
    assert verify(outcome.run_dir) == []
    html = (outcome.run_dir / "report.html").read_text()
    assert "<th>node</th>" in html and m["trials"][0]["node"]["id"][:8] in html
    assert containers_of(docker_client, run_id=m["run_id"]) == []


def test_process_inner_runtime_runs_the_engine_inside_the_node(cluster, cpu_binary, tmp_path):
    """A node that is itself the engine's image (a KubeRay worker): the engine starts as a process on the node."""
    path = tiny_playbook(
        tmp_path,
        steps=[{"name": "parallel-4", "set": {"parallel": 4}}],
        duration="2s",
        warmup="0.5s",
        engine={"model": str(cpu_binary.model_path), "executable": str(cpu_binary.binary)},
        runtime={"kind": "ray", "address": "auto", "inner": "process"},
    )
    doc = yaml.safe_load(path.read_text())
    doc["engine"].pop("image")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    lines: list[str] = []
    outcome = run_playbook(load_playbook(path), RunOptions(archive_root=tmp_path / "r"), report=lines.append)
    assert outcome.status == "complete", lines
    m = manifest(outcome.run_dir)
    assert [t["status"] for t in m["trials"]] == ["ok", "ok"], m["trials"]
    assert all(t["engine_describe"]["runtime"] == "process" for t in m["trials"])
    assert all(t["engine_describe"]["command"][0] == str(cpu_binary.binary) for t in m["trials"])
    used_pairs_on_one_node(m)
    assert verify(outcome.run_dir) == []
    pids = [t["engine_describe"]["pid"] for t in m["trials"]]
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 30, "the engines' processes gone")


def test_a_pair_whose_node_is_lost_after_its_first_trial_is_measured_again_whole(cluster, tmp_path):
    """The node dies during the pair's second trial: the first (ok) is kept in the archive but superseded, so the
    decision never pairs trials of two machines; the report lists both, used nowhere."""
    pb = load_playbook(ray_playbook(tmp_path, repeats=1))
    started = tmp_path / "started"
    started.mkdir()
    lines: list[str] = []
    result: dict = {}
    trials = FixedTrials(pb, 4.0, started_dir=str(started))
    runner = threading.Thread(
        target=lambda: result.update(
            outcome=run_playbook(
                pb,
                RunOptions(archive_root=tmp_path / "r"),
                publish=publish_report,
                report=lines.append,
                measure_trial=trials,
            )
        )
    )
    runner.start()
    node = None
    try:
        second = wait_for(lambda: (started / "t002").is_file() and (started / "t002").read_text(), 60, "t002 started")
        node = next(n for n in cluster.worker_nodes if n.node_id == second.split()[0])
        time.sleep(0.5)
        kill_raylet(node)
    finally:
        runner.join(timeout=120)
        if node is not None:
            replace_node(cluster, node)
    outcome = result["outcome"]
    assert outcome.status == "complete", lines
    m = manifest(outcome.run_dir)
    by_id = {t["trial_id"]: t for t in m["trials"]}
    assert by_id["t001"]["status"] == "ok" and "measured again" in by_id["t001"]["superseded"]
    assert by_id["t002"]["status"] == "failed" and by_id["t002"]["superseded"]
    assert by_id["t001"]["node"]["id"] == by_id["t002"]["node"]["id"] == node.node_id
    (verdict,) = m["verdicts"]
    assert {*verdict["trials_baseline"], *verdict["trials_candidate"]} == {"t003", "t004"}
    assert verdict["objective"]["units"] == 1  # the one complete pair, both on the other node
    assert used_pairs_on_one_node(m)[0] != node.node_id
    assert verify(outcome.run_dir) == []
    html = (outcome.run_dir / "report.html").read_text()
    assert ">superseded<" in html and "t001" in html and "t002" in html


def test_an_unreachable_head_and_an_endpoint_runtime_are_one_line_each(tmp_path):
    path = tiny_playbook(tmp_path, steps=[])
    proc = cli("run", str(path), "--archive", str(tmp_path / "reports"), "--ray", "127.0.0.1:1")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    # At once: the error is llmplay's own reachability check's (its words), not the end of Ray's join, which retries
    # for minutes. How many seconds a busy machine takes to start the CLI and import Ray is not llmplay's to assert.
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: cannot join the Ray cluster at 127.0.0.1:1: "), out
    assert last.endswith("expected its head there (ray start --head --port PORT), reachable from this machine"), out
    endpoint = tiny_playbook(tmp_path, steps=[], runtime={"kind": "endpoint", "url": "http://127.0.0.1:9"})
    proc = cli("run", str(endpoint), "--archive", str(tmp_path / "reports"), "--ray", "127.0.0.1:1")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "error: --ray: runtime endpoint measures one engine that is already running" in out


@pytest.mark.docker
def test_a_node_lost_mid_trial_reruns_its_pair_elsewhere_and_leaves_no_engine(
    cluster, cpu_engine, docker_client, tmp_path
):
    """A worker's raylet SIGKILLed while its trial's engine serves: that trial is failed with the cause, its pair is
    measured again on the other node, the verdict rests on complete pairs, and no container is left. (The cluster
    then gets a fresh worker node in place of the lost one, for the tests after this one.)"""
    path = tiny_playbook(
        tmp_path,
        steps=[{"name": "parallel-4", "set": {"parallel": 4}}],
        repeats=2,
        duration="3s",
        warmup="0.5s",
        runtime={"kind": "ray", "address": "auto"},
    )
    pb = load_playbook(path)
    lines: list[str] = []
    result: dict = {}
    runner = threading.Thread(
        target=lambda: result.update(
            outcome=run_playbook(pb, RunOptions(archive_root=tmp_path / "r"), report=lines.append)
        )
    )
    runner.start()
    node = None
    try:

        def engine_on_a_worker():
            for c in docker_client.containers.list(filters={"label": LABEL_RUN}, ignore_removed=True):
                on = node_running(cluster, int(c.labels.get(LABEL_PID, "0")))
                if on is not None:
                    return c, on
            return None

        container, node = wait_for(engine_on_a_worker, 180, "an engine started by a worker node")
        # Inside its measured window, told by the engine's counters: a fixed 1.5 s after the container ran could
        # land before the engine was healthy on a busy machine, or after a 3 s trial on a quick one.
        wait_for_the_measured_window(container, path)
        kill_raylet(node)
    finally:
        runner.join(timeout=400)
        if node is not None:
            replace_node(cluster, node)
    assert not runner.is_alive()
    outcome = result["outcome"]
    assert outcome.status == "complete", lines
    m = manifest(outcome.run_dir)
    lost = [t for t in m["trials"] if t["status"] == "failed"]
    assert len(lost) == 1, m["trials"]
    assert lost[0]["node"]["id"] == node.node_id and "mid-trial" in lost[0]["error"], lost[0]["error"]
    assert lost[0]["superseded"]
    nodes = used_pairs_on_one_node(m)
    assert len(nodes) == 2 and node.node_id not in nodes.values()  # both pairs complete, none on the lost node
    (verdict,) = m["verdicts"]
    assert len(verdict["trials_baseline"]) == 2 and len(verdict["trials_candidate"]) == 2
    assert verify(outcome.run_dir) == []
    # The lost node's worker (or its watchdog, should the worker die) removes the engine it started.
    wait_for(lambda: containers_of(docker_client, run_id=m["run_id"]) == [], 90, "no engine left of the run")


@pytest.mark.docker
def test_driver_killed_then_resumed_loses_nothing_and_leaves_no_engine(cluster, cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(
        tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="3s", warmup="0.5s", repeats=2
    )
    archive = tmp_path / "reports"
    proc = cli("run", str(path), "--archive", str(archive), "--ray", cluster.address)

    def some_trial_archived_and_engines_running():
        run_dir = run_dir_of(archive)
        if run_dir is None:
            return False
        try:
            done = manifest(run_dir)["trials"]
        except (json.JSONDecodeError, KeyError):
            return False
        return len(done) >= 1 and containers_of(docker_client, run_id=manifest(run_dir)["run_id"])

    wait_for(some_trial_archived_and_engines_running, 180, "an archived trial while engines run")
    proc.kill()
    proc.wait(timeout=30)
    run_dir = run_dir_of(archive)
    before = manifest(run_dir)["trials"]
    resumed = cli("run", "--resume", str(run_dir), str(path))  # --ray comes from the archived run
    out, _ = resumed.communicate(timeout=400)
    assert resumed.returncode in (0, 3), out
    m = manifest(run_dir)
    assert m["status"] == "complete" and m["overrides"]["ray"] == cluster.address
    ids = {t["trial_id"] for t in m["trials"]}
    assert {t["trial_id"] for t in before} <= ids  # nothing archived before the kill was measured again or lost
    used_pairs_on_one_node(m)
    assert verify(run_dir) == []
    wait_for(lambda: containers_of(docker_client, run_id=m["run_id"]) == [], 90, "no engine left of the run")


@pytest.mark.docker
def test_sigint_to_the_driver_stops_every_engine_on_every_node(cluster, cpu_engine, docker_client, tmp_path):
    path = tiny_playbook(tmp_path, steps=[{"name": "parallel-4", "set": {"parallel": 4}}], duration="30s", repeats=2)
    archive = tmp_path / "reports"
    proc = cli("run", str(path), "--archive", str(archive), "--ray", cluster.address)

    def engines_on_both_nodes():
        run_dir = run_dir_of(archive)
        if run_dir is None:
            return False
        return len(containers_of(docker_client, run_id=manifest(run_dir)["run_id"])) == 2

    wait_for(engines_on_both_nodes, 180, "an engine on each node")
    # Both engines serving (30 s trials): the interrupt lands mid-trial on each node, told by the engines' counters.
    for container in containers_of(docker_client, run_id=manifest(run_dir_of(archive))["run_id"]):
        wait_for_the_measured_window(container, path)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    m = manifest(run_dir_of(archive))
    assert m["status"] == "interrupted"
    assert containers_of(docker_client, run_id=m["run_id"]) == []  # stopped by the trials themselves, not later


@pytest.mark.parametrize(
    ("engine", "runtime", "reason"),
    [
        ({"gpus": 2}, {}, "needs 1 CPU and 2 GPU on one node"),
        ({"gpus": 1}, {"accelerator_type": "H100"}, "needs 1 CPU and 1 GPU of type H100 on one node"),
    ],
    ids=["two-gpus", "gpu-model"],
)
def test_a_playbook_no_node_can_host_fails_in_seconds_with_the_reason(cluster, tmp_path, engine, runtime, reason):
    path = tiny_playbook(tmp_path, steps=[], engine=engine, runtime={"kind": "docker", **runtime} if runtime else None)
    if runtime:  # accelerator_type is a ray runtime key: name it there, and still join with --ray
        doc = yaml.safe_load(path.read_text())
        doc["runtime"] = {"kind": "ray", "address": cluster.address, **runtime}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = cli("run", str(path), "--archive", str(tmp_path / "reports"), "--ray", cluster.address)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    # Refused by llmplay's own check of the nodes' resources before anything is submitted (its words, no archive):
    # a task Ray cannot place would wait forever, and communicate's timeout would say so. How many seconds a busy
    # machine takes to start the CLI and join the cluster is not llmplay's to assert.
    assert "error: no node of the Ray cluster" in out and reason in out, out
    assert "Traceback" not in out
    assert run_dir_of(tmp_path / "reports") is None  # refused before any archive was made
