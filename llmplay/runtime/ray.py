"""A Ray cluster as a place to run engines: joining it, its live nodes and what they can host, tasks pinned to one
node, and the cleanup of engines a lost worker left behind.

It knows nothing of trials or decisions: the tuning run's Ray scheduler (llmplay.tuning.schedule.ray) hands it a
function and a job, and gets back what the function returned, or why it did not return. Ray itself is imported only
here and only when a run asks for it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar  # Any: Ray's object refs and remote functions, untyped until run time

from llmplay.errors import InfrastructureError
from llmplay.runtime.gpus import GpuInventory
from llmplay.spec import Config, RuntimeSpec, gpu_count

# Tasks Ray queues for a node that never frees up are legitimate waits on a shared cluster; a node that cannot host
# the task at all is refused before anything is submitted. How often the driver asks the cluster which nodes live:
LIVENESS_POLL_S = 1.0
RAY_NAMESPACE = "llmplay"

Job = TypeVar("Job")


@dataclass(frozen=True)
class Needs:
    """What one task holds on its node while it runs."""

    gpus: int
    cpus: float
    accelerator_type: str | None = None

    def resources(self) -> dict[str, float]:
        out = {"CPU": self.cpus}
        if self.gpus:
            out["GPU"] = float(self.gpus)
        if self.accelerator_type:
            out[f"accelerator_type:{self.accelerator_type}"] = 0.001  # Ray's own convention for "this GPU model"
        return out

    def describe(self) -> str:
        parts = [f"{self.cpus:g} CPU"]
        if self.gpus:
            parts.append(f"{self.gpus} GPU" + (f" of type {self.accelerator_type}" if self.accelerator_type else ""))
        elif self.accelerator_type:
            parts.append(f"accelerator type {self.accelerator_type}")
        return " and ".join(parts)

    def merge(self, other: Needs) -> Needs:
        """Both sides of a pair run on one node: it must host the larger of the two."""
        return Needs(max(self.gpus, other.gpus), max(self.cpus, other.cpus), self.accelerator_type)


def needs_of(config: Config, runtime: RuntimeSpec) -> Needs:
    return Needs(gpu_count(config.engine.gpus), runtime.cpus_per_trial, runtime.accelerator_type)


def pair_needs(configs: Sequence[Config], runtime: RuntimeSpec) -> Needs:
    needs = needs_of(configs[0], runtime)
    for config in configs[1:]:
        needs = needs.merge(needs_of(config, runtime))
    return needs


@dataclass(frozen=True)
class NodeFacts:
    """One live node of the cluster as the archive header keeps it."""

    id: str
    address: str
    hostname: str
    cpus: float
    gpus: float
    accelerator_types: tuple[str, ...]


@dataclass(frozen=True)
class ClusterFacts:
    """The Ray cluster a run's trials ran on, as the archive header keeps it."""

    address: str | None
    ray_version: str
    inner_runtime: str
    accelerator_type: str | None
    cpus_per_trial: float
    nodes: tuple[NodeFacts, ...]


@dataclass(frozen=True)
class Node:
    id: str
    address: str
    hostname: str
    resources: Mapping[str, float]

    def slots(self, needs: Needs) -> int:
        """How many such tasks fit on this node at once."""
        fits = [math.floor(self.resources.get(name, 0.0) / amount + 1e-9) for name, amount in needs.resources().items()]
        return max(0, min(fits))

    def describe(self) -> NodeFacts:
        gpu_types = sorted(k.split(":", 1)[1] for k in self.resources if k.startswith("accelerator_type:"))
        return NodeFacts(
            self.id,
            self.address,
            self.hostname,
            self.resources.get("CPU", 0.0),
            self.resources.get("GPU", 0.0),
            tuple(gpu_types),
        )

    def label(self) -> dict[str, str]:
        return {"id": self.id, "address": self.address, "hostname": self.hostname}


@dataclass(frozen=True)
class NodeLost:
    """A task that did not come back: its node died, or Ray could no longer place it on its node."""

    cause: str


@dataclass(frozen=True)
class TaskCrashed:
    """The task's own code raised on the node (a bug, or an error the caller stops on)."""

    error: BaseException


def here() -> dict[str, str]:
    """The node a task runs on, as a record names it (called on the node)."""
    import ray  # deferred: runs on a cluster node only

    return {
        "id": ray.get_runtime_context().get_node_id(),
        "address": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]  # ray leaves it unannotated
        "hostname": socket.gethostname(),
    }


def granted_gpus() -> tuple[str, ...]:
    """The GPUs Ray granted the task running here (called on the node)."""
    import ray  # deferred: runs on a cluster node only

    return tuple(str(g) for g in ray.get_gpu_ids())


def _apply(task: Callable[[Job], object], job: Job) -> object:
    return task(job)


@dataclass
class RayCluster(Generic[Job]):
    """The driver's handle on the cluster for one run: nodes, tasks pinned to a node, and what came back."""

    spec: RuntimeSpec
    _inflight: dict[Any, tuple[Job, str]] = field(default_factory=dict)  # ref -> (job, node id)
    _owns_connection: bool = False
    _remote: Any = None  # Ray's remote function: typed by Ray at run time only
    _nodes: dict[str, Node] = field(default_factory=dict)
    _checked_s: float = 0.0

    # ---------------------------------------------------------------- connection
    def connect(self) -> None:
        try:
            import ray  # deferred: Ray is optional and slow to import; only runtime ray needs it
        except ImportError:
            raise InfrastructureError(
                "runtime ray needs Ray on the driver: pip install 'llmplay[ray]' (the same Ray version as the cluster)"
            ) from None
        if not ray.is_initialized():
            self._check_reachable()
            try:
                ray.init(
                    address=self.spec.address,
                    namespace=RAY_NAMESPACE,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    configure_logging=False,
                )
            except Exception as exc:
                raise InfrastructureError(
                    f"cannot join the Ray cluster at {self.spec.address}: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}; expected a running cluster (ray start --head)"
                ) from None
            self._owns_connection = True
        self._remote = ray.remote(max_retries=0)(_apply)
        self.refresh(force=True)

    def _check_reachable(self) -> None:
        """A head that does not answer is one line at once: Ray's own join retries for minutes before it gives up."""
        address = self.spec.address or ""
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if not host or not port.isdigit():
            return  # "auto": Ray finds the cluster this host has joined, or says there is none
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as exc:
            raise InfrastructureError(
                f"cannot join the Ray cluster at {address}: {exc.strerror or type(exc).__name__}; expected its head "
                "there (ray start --head --port PORT), reachable from this machine"
            ) from None

    def close(self) -> None:
        self.cancel_all()
        if self._owns_connection:
            import ray  # deferred: see connect

            ray.shutdown()
            self._owns_connection = False

    def describe(self) -> ClusterFacts:
        import ray  # deferred: see connect

        return ClusterFacts(
            address=self.spec.address,
            ray_version=str(ray.__version__),
            inner_runtime=self.spec.inner,
            accelerator_type=self.spec.accelerator_type,
            cpus_per_trial=self.spec.cpus_per_trial,
            nodes=tuple(n.describe() for n in self._nodes.values()),
        )

    # ---------------------------------------------------------------- nodes
    def refresh(self, *, force: bool = False) -> dict[str, Node]:
        """The live nodes (asked of the cluster at most once a second)."""
        if force or time.monotonic() - self._checked_s >= LIVENESS_POLL_S:
            import ray  # deferred: see connect

            self._nodes = {
                n["NodeID"]: Node(
                    n["NodeID"],
                    str(n.get("NodeManagerAddress", "")),
                    str(n.get("NodeManagerHostname", "")),
                    dict(n.get("Resources") or {}),
                )
                for n in ray.nodes()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
                if n.get("Alive")
            }
            self._checked_s = time.monotonic()
        return self._nodes

    def alive(self, node_id: str) -> bool:
        return node_id in self.refresh()

    def node(self, node_id: str) -> Node | None:
        return self._nodes.get(node_id)

    def label(self, node_id: str) -> dict[str, str]:
        """The node as a record names it; its id alone once the cluster has forgotten it."""
        known = self.node(node_id)
        return known.label() if known else {"id": node_id}

    def check_placeable(self, needs: Needs, what: str) -> None:
        """Refuse at once (not a task pending forever) when no live node can host `needs`."""
        nodes = self.refresh(force=True)
        if any(n.slots(needs) for n in nodes.values()):
            return
        have = "; ".join(
            f"{n.address} {n.resources.get('CPU', 0):g} CPU {n.resources.get('GPU', 0):g} GPU"
            + "".join(f" {k.split(':', 1)[1]}" for k in n.resources if k.startswith("accelerator_type:"))
            for n in nodes.values()
        )
        raise InfrastructureError(
            f"no node of the Ray cluster at {self.spec.address} can run {what}: it needs {needs.describe()} on one "
            f"node; the cluster has {len(nodes)} live node(s): {have or 'none'}"
        )

    def free_node(self, needs: Needs, busy: Mapping[str, int]) -> Node | None:
        """A live node with a free slot, the least busy first (ties by id, so a run's placement is repeatable)."""
        open_nodes = [n for n in self.refresh().values() if n.slots(needs) > busy.get(n.id, 0)]
        return min(open_nodes, key=lambda n: (busy.get(n.id, 0), n.id), default=None)

    def slots(self, needs: Needs) -> int:
        return sum(n.slots(needs) for n in self.refresh().values())

    # ---------------------------------------------------------------- tasks
    def submit(self, task: Callable[[Job], object], job: Job, *, name: str, node_id: str, needs: Needs) -> None:
        """Run `task(job)` on `node_id`, holding `needs` there; what it returns comes back from wait()."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # deferred: see connect

        resources = needs.resources()
        ref = self._remote.options(
            num_cpus=resources.pop("CPU"),
            num_gpus=resources.pop("GPU", 0.0),
            resources=resources,
            # soft=False: a task pinned to a node runs there or not at all (then NodeLost)
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            name=name,
        ).remote(task, job)
        self._inflight[ref] = (job, node_id)

    def busy(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, node_id in self._inflight.values():
            out[node_id] = out.get(node_id, 0) + 1
        return out

    def wait(self, timeout_s: float = LIVENESS_POLL_S) -> list[tuple[Job, str, object]]:
        """Tasks that finished, failed or lost their node since the last call (empty after `timeout_s`): each job,
        its node and what its task returned, or NodeLost, or TaskCrashed."""
        import ray  # deferred: see connect

        if not self._inflight:
            return []
        ready, rest = ray.wait(list(self._inflight), num_returns=1, timeout=timeout_s)
        if ready and rest:  # whatever else has finished too, without waiting again
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        out: list[tuple[Job, str, object]] = []
        for ref in ready:
            job, node_id = self._inflight.pop(ref)
            out.append((job, node_id, self._outcome(ref, node_id)))
        live = self.refresh()
        for ref, (job, node_id) in list(self._inflight.items()):
            if node_id not in live:
                # A raylet that dies leaves its worker running the task; the cluster no longer vouches for that
                # node, so the task is lost (an engine it started is removed by the node's watchdog or its finally).
                del self._inflight[ref]
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
                out.append((job, node_id, NodeLost(f"node {short(node_id)} was marked dead by the cluster mid-trial")))
        return out

    def _outcome(self, ref: Any, node_id: str) -> object:  # ref: Ray's ObjectRef, typed by Ray at run time
        import ray  # deferred: see connect
        import ray.exceptions  # deferred: see connect

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            return TaskCrashed(cause)
        except ray.exceptions.TaskCancelledError as exc:
            return TaskCrashed(KeyboardInterrupt(f"trial cancelled: {exc}"))
        except ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return NodeLost(f"node {short(node_id)} lost mid-trial ({type(exc).__name__}: {first[:200]})")

    def cancel_all(self, grace_s: float = 15.0) -> None:
        """Ask every running task to stop (an engine stops in its own finally), then force what is left."""
        if not self._inflight:
            return
        import ray  # deferred: see connect

        refs = list(self._inflight)
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=False)
        pending = refs
        with contextlib.suppress(Exception):
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        # Only what is still running is forced: force-cancelling a task whose reply is already on its way trips a
        # fatal check in Ray's core worker ("Tried to complete task that was not pending"), which killed the
        # interrupted driver with exit code 1 instead of 130.
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        self._inflight.clear()

    def ask_node(self, needs: Needs, probe: Callable[[], GpuInventory | None]) -> GpuInventory | None:
        """`probe()` run on a node that could host `needs` (the GPU model, driver and CUDA of a node the trials run
        on, for the archive header: the driver's own may have none), its node id added; None from a CPU node."""
        import ray  # deferred: see connect
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # deferred: see connect

        node = self.free_node(needs, {})
        if node is None:
            return None
        task = ray.remote(max_retries=0, num_cpus=0)(probe)
        ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False)).remote()
        try:
            found: GpuInventory | None = ray.get(ref, timeout=60)
        except Exception as exc:  # the header then says why; the trials report real failures themselves
            return GpuInventory(error=f"GPU inventory of node {short(node.id)} failed: {type(exc).__name__}")
        return None if found is None else found.on_node(node.id)

    def collect_orphans(self, run_id: str, docker_host: str | None) -> None:
        """On every live node: remove the engines of `run_id` whose worker died (a resumed run's earlier driver)."""
        import ray  # deferred: see connect
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # deferred: see connect

        gc_task = ray.remote(max_retries=0, num_cpus=0)(collect_orphans_here)
        refs = [
            gc_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.id, soft=False)).remote(
                run_id, docker_host
            )
            for n in self.refresh(force=True).values()
        ]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=60)


def collect_orphans_here(run_id: str, docker_host: str | None) -> list[str]:
    """On this node: remove the engines of `run_id` whose worker died (a driver killed and resumed, a lost raylet).
    A node without a dockerd that answers runs no containers to collect (a trial reports a dockerd that does not)."""
    from llmplay.runtime.docker import connect, gc  # deferred: the docker SDK on a node of the docker runtime only

    try:
        client = connect(docker_host, timeout_s=30)
    except Exception:
        return []
    try:
        return gc(client, run_id=run_id).removed_names()
    except Exception:
        return []
    finally:
        client.close()


def short(node_id: str) -> str:
    return node_id[:8]
