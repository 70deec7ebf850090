"""What the runner hands the archive about the run itself, before any trial: where it measures and what the command
line overrode. The writer turns them into the manifest's `environment` and `overrides` objects; the reader reads
those back as archive.model's Environment and RunInfo (older shapes included, through archive.convert)."""

from __future__ import annotations

from dataclasses import dataclass

from llmplay.runtime.gpus import GpuInventory as GpuInventory
from llmplay.runtime.ray import ClusterFacts as ClusterFacts
from llmplay.runtime.ray import NodeFacts as NodeFacts


@dataclass(frozen=True)
class RunEnvironment:
    """The host a run measures on, as the runner found it ("": not given, as a test's archive maker leaves it)."""

    host: str = ""
    docker: str | None = None  # the daemon's version; None: not a Docker run, or the daemon did not say
    user: str = ""
    llmplay_version: str = ""
    python: str = ""
    platform: str = ""
    gpu: GpuInventory | None = None  # None: no NVML (a CPU machine); a Ray run: a node that runs the trials
    seed: int | None = None  # the workload's seed
    started_utc: str = ""  # "": the archive's creation time
    cluster: ClusterFacts | None = None  # the Ray cluster the trials ran on; None: this machine


@dataclass(frozen=True)
class RunOverrides:
    """The command-line overrides a run was started with (None, empty or False: not overridden)."""

    repeats: int | None = None
    duration_s: float | None = None
    warmup_s: float | None = None
    only: tuple[str, ...] = ()
    image: str | None = None
    ray: str | None = None  # --ray: the cluster's address
    capacity: bool = False  # `llmplay capacity`
