"""Where a run's trials run: the TrialScheduler seam between the step loop and the machines.

The step loop (tuning.steps) asks for groups of trials (an A/B pair, or one baseline trial) and gets each trial
back through `take`, in the group's order; it knows nothing of where they ran. Two schedulers: local (one machine,
trials one at a time, interleaved A/B pairs) and ray (pairs pinned to a node of a Ray cluster, as many at once as
there are free nodes)."""

from __future__ import annotations

from llmplay.spec import Config, Playbook
from llmplay.tuning.schedule.base import MeasurementCrashed, Take, TrialScheduler
from llmplay.tuning.schedule.local import LocalScheduler
from llmplay.tuning.schedule.ray import RayScheduler
from llmplay.tuning.sharing import HostSharing


def scheduler_for(playbook: Playbook, sharing: HostSharing) -> TrialScheduler:
    """runtime ray: pairs on the cluster's nodes; any other runtime: trials on this machine (whose other llmplay
    runs each trial records)."""
    if playbook.runtime.kind == "ray":
        return RayScheduler(playbook)
    return LocalScheduler(playbook, sharing)


def pairs_at_once(playbook: Playbook) -> int:
    """How many A/B pairs of the playbook's baseline its runtime runs at once: a Ray cluster's room for them, asked
    of the cluster now; one on this machine."""
    if playbook.runtime.kind != "ray":
        return 1
    scheduler = RayScheduler(playbook)
    try:
        scheduler.join()
        return scheduler.batch([Config("baseline", playbook.engine, playbook.workload)])
    finally:
        scheduler.close()


__all__ = [
    "LocalScheduler",
    "MeasurementCrashed",
    "RayScheduler",
    "Take",
    "TrialScheduler",
    "pairs_at_once",
    "scheduler_for",
]
