"""A real multi-node Ray cluster on this machine for tests and benchmarks, always torn down, and a trial of fixed
duration that runs on its nodes (scheduling measured without the engine's own noise)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.loadgen.records import RequestRecord
from llmplay.metrics import per_request_frame, summarize
from llmplay.spec import Config, Playbook
from llmplay.tuning.trial import TrialResult, trial_sample

ROOT = Path(__file__).resolve().parents[1]
MB = 2**20
MS = 1_000_000
# A lost raylet is noticed within about 1.5 s instead of the default 15 s or more.
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
}


def _ray_stop_force() -> None:
    """The safety net: every Ray process of this machine's session, whatever a test left behind."""
    ray_bin = Path(sys.executable).parent / "ray"
    with contextlib.suppress(Exception):
        subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, timeout=60, check=False)


@contextlib.contextmanager
def local_cluster(
    workers: int = 2,
    *,
    cpus: float = 1,
    gpus: int = 1,
    resources: dict[str, float] | None = None,
    object_store_mb: int = 80,
) -> Iterator[Any]:
    """A head (no CPUs, so it runs no trial) and `workers` worker nodes, each declaring `cpus` CPUs and `gpus` GPUs;
    the driver is connected. Worker processes import llmplay from this tree (PYTHONPATH is inherited)."""
    import ray  # deferred: Ray is an optional install
    from ray.cluster_utils import Cluster  # deferred: see above

    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "num_gpus": 0,
                "object_store_memory": object_store_mb * MB,
                "include_dashboard": False,
                "_system_config": FAST_HEALTH_CHECKS,
            },
        )
        worker_args: dict[str, Any] = {
            "num_cpus": cpus,
            "num_gpus": gpus,
            "resources": dict(resources or {}),
            "object_store_memory": object_store_mb * MB,
        }
        cluster.llmplay_worker_args = worker_args  # type: ignore[attr-defined]  # replace_node adds one like these
        for _ in range(workers):
            cluster.add_node(**worker_args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.shutdown()
        _ray_stop_force()


def node_running(cluster: Any, pid: int) -> Any:
    """The cluster node whose raylet started worker process `pid` (a container's llmplay.pid label), or None."""
    try:
        parent = psutil.Process(pid).ppid()
    except psutil.Error:
        return None
    return next((n for n in cluster.worker_nodes if n.all_processes["raylet"][0].process.pid == parent), None)


def replace_node(cluster: Any, node: Any) -> Any:
    """After a node was killed: whatever is left of it gone, and a fresh worker node like the others in its place."""
    with contextlib.suppress(Exception):
        cluster.remove_node(node, allow_graceful=False)
    fresh = cluster.add_node(**cluster.llmplay_worker_args)
    cluster.wait_for_nodes()
    return fresh


def kill_raylet(node: Any) -> int:
    """SIGKILL one node's raylet, as a crashed or lost host would; its pid."""
    proc = node.all_processes["raylet"][0].process
    proc.kill()
    return int(proc.pid)


def _write_whole(path: Path, text: str) -> None:
    """Other nodes' trials read these lines while this one writes: a rename shows them the old line or the new, never
    the empty file an in-place rewrite leaves for a moment (a reader that saw it once failed a run)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)


@dataclass
class FixedTrials:
    """A trial that holds its node for `duration_s` and returns `requests` synthetic streamed requests; TTFT is
    `ttft_ms`, or `fast_ttft_ms` when the engine's `parallel` knob is 4, so a step has a known effect."""

    playbook: Playbook
    duration_s: float = 2.0
    requests: int = 30
    ttft_ms: float = 50.0
    fast_ttft_ms: float = 25.0
    started_dir: str | None = None  # each trial writes `NODE_ID UNIX_TIME` to STARTED_DIR/TRIAL_ID as it starts
    # With started_dir: a trial waits (up to `meet_timeout_s`) until trials on this many nodes have started, and adds
    # ` met` to its line when they had. Trials that run at once meet whatever a busy machine's worker start-up costs;
    # trials run one after the other never can, so concurrency is shown by an event, not by overlapping timestamps.
    meet_nodes: int = 0
    meet_timeout_s: float = 120.0

    def _meet(self, started: Path) -> bool:
        deadline = time.monotonic() + self.meet_timeout_s
        while time.monotonic() < deadline:
            nodes = {
                words[0] for f in started.iterdir() if not f.name.startswith(".") and (words := f.read_text().split())
            }
            if len(nodes) >= self.meet_nodes:
                return True
            time.sleep(0.05)
        return False

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult:
        start = time.perf_counter()
        if self.started_dir:
            import ray  # deferred: Ray is an optional install

            node = ray.get_runtime_context().get_node_id()
            line = Path(self.started_dir) / trial_id
            _write_whole(line, f"{node} {time.time()}")
            if self.meet_nodes:
                met = self._meet(Path(self.started_dir))
                _write_whole(line, f"{node} {time.time()}{' met' if met else ''}")
                start = time.perf_counter()  # the trial's own duration starts once the wait is over
        ttft_ms = self.fast_ttft_ms if config.engine.args.get("parallel") == 4 else self.ttft_ms
        records = []
        for i in range(self.requests):
            sent = (1 + i) * 100 * MS
            first = sent + int(ttft_ms * (1 + 0.02 * ((i + repeat) % 7)) * MS)
            chunks = tuple(first + k * 10 * MS for k in range(8))
            fields = (i, False, True, sent, sent, first, first, chunks, chunks[-1], 64, 8, "usage", "length", 200)
            records.append(RequestRecord(*fields, None, None, 0.0))
        time.sleep(max(0.0, self.duration_s - (time.perf_counter() - start)))
        summary: dict[str, Any] = dict(summarize(records, 3.2, self.playbook.goals.slo_s).as_dict())
        summary["duration_s"] = 3.2
        trial = TrialRecord(
            trial_id, config.label, step, role, repeat, TRIAL_OK, "2026-12-04T00:00:00Z", self.duration_s, summary
        )
        frame = per_request_frame(records)
        return TrialResult(trial, frame, sample=trial_sample(self.playbook, config, trial, frame))
