"""CPU priority for tests that time an instrument: with two test workers, an engine test on the other worker (a
vLLM CPU engine's threads on both cores) can keep the instrument's timers or the load generator off the CPU for
longer than the margins those tests measure. A benchmark host reserves cores for the same reason."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TIMING_NICE = -10  # about ten times a default task's CPU share under contention (CFS weights)


def _threads() -> list[int]:
    # Linux keeps a nice value per thread: setpriority(PRIO_PROCESS, 0) would change the calling thread only.
    return [int(tid) for tid in os.listdir(Path("/proc/self/task"))]


def _set_nice(nice: int) -> bool:
    changed = False
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            changed = True
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except PermissionError:
            return False  # not root: the tests run at the default priority
    return changed


@contextmanager
def timing_priority(nice: int = TIMING_NICE) -> Iterator[bool]:
    """Every thread of this process, and what it starts meanwhile (instrument processes, CLI subprocesses), at
    `nice`; back to the priority it had after. Yields whether the priority could be raised (root only)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)  # a suite started under `nice` goes back to that, not to 0
    raised = _set_nice(nice)
    try:
        yield raised
    finally:
        if raised:
            _set_nice(before)
