"""Trials on a real Ray cluster (head + two worker nodes on this machine, each declaring one GPU): pairs pinned to a
node and fanned over nodes, the node of every trial in the archive, a lost node's trial re-run elsewhere, a playbook
no node can host refused in seconds. Every Ray process a test starts is stopped whatever happens."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")

from llmplay.archive.verify import verify  # noqa: E402
from llmplay.errors import InfrastructureError  # noqa: E402
from llmplay.playbook.load import load_playbook  # noqa: E402
from llmplay.report import publish_report  # noqa: E402
from llmplay.tuning.run import RunOptions, TuningRun, run_playbook  # noqa: E402
from llmplay_testing.cpu_runs import containers_of, tiny_playbook, wait_for  # noqa: E402
from llmplay_testing.ray_cluster import FixedTrials, kill_raylet, local_cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(workers=2, cpus=1, gpus=1, resources={"accelerator_type:T4": 1}) as c:
        yield c


def ray_playbook(tmp_path: Path, *, repeats: int = 2, steps: list | None = None, **runtime) -> Path:
    doc = yaml.safe_load((ROOT / "playbooks" / "cpu-tiny.yaml").read_text())
    doc["trials"] = {"repeats": repeats}
    doc["steps"] = steps if steps is not None else [{"name": "parallel-4", "set": {"parallel": 4}}]
    doc["runtime"] = {"kind": "ray", "address": "auto", **runtime}
    path = tmp_path / "cpu-tiny-ray.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def overlapping(trials: list[dict], a: str, b: str) -> bool:
    return a != b


def test_pairs_fan_out_over_nodes_and_each_pair_stays_on_one_node(cluster, tmp_path):
    pb = load_playbook(ray_playbook(tmp_path, repeats=2, accelerator_type="T4"))
    lines: list[str] = []
    t0 = time.perf_counter()
    outcome = TuningRun(
        pb, RunOptions(archive_root=tmp_path / "r"), report=lines.append, measure_trial=FixedTrials(pb, 2.0)
    ).execute()
    wall = time.perf_counter() - t0
    assert outcome.status == "complete", lines
    m = manifest(outcome.run_dir)
    trials = m["trials"]
    assert len(trials) == 4 and all(t["status"] == "ok" for t in trials)
    by_repeat: dict[int, set[str]] = {}
    for t in trials:
        assert t["node"]["id"] and t["node"]["address"]
        by_repeat.setdefault(t["repeat"], set()).add(t["node"]["id"])
    assert all(len(nodes) == 1 for nodes in by_repeat.values()), by_repeat  # a pair never spans two nodes
    assert len(set().union(*by_repeat.values())) == 2  # the two pairs ran on the two workers
    assert wall < 4 * 2.0 + 4, wall  # two pairs at once: about two trials' time, not four
    (verdict,) = m["verdicts"]
    assert verdict["verdict"] == "kept"
    assert "each pair on one node" in verdict["objective"]["method"]
    assert {n["id"] for n in m["environment"]["cluster"]["nodes"]} >= set().union(*by_repeat.values())
    assert verify(outcome.run_dir) == []
