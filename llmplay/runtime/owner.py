"""Who owns a run or a container: one process, named by host, pid and start time, and whether it still lives.

A pid alone is not an identity: after a crash the kernel hands the same number to an unrelated process, and a
collector that trusted it would keep an orphan forever, or (worse, by the reverse mistake) take a live run's
engine for an orphan. Host, pid and the process's start time together name exactly one process.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

# Two readings of one process's start time differ by clock-tick rounding; a recycled pid starts after its
# predecessor ended, and an llmplay run lives for seconds at least, so its start differs by more than this.
START_TOLERANCE_S = 1.0


def process_started(pid: int) -> float | None:
    """When process `pid` on this host started (seconds since the epoch); None when there is no such process."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(process.create_time())
    except psutil.Error:
        return None


def _float(value: object) -> float:
    """float() of a stored number or numeral; TypeError for anything else, as float() raises."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"not a number: {value!r}")


def _int(value: object) -> int:
    """int() of a stored number or numeral; TypeError for anything else, as int() raises."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"not a number: {value!r}")


@dataclass(frozen=True)
class Owner:
    """A process on a host: the owner of a run's archive and of its engine containers."""

    host: str
    pid: int
    started: float  # the process's start time, seconds since the epoch

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, process_started(pid) or 0.0)

    @classmethod
    def from_fields(cls, host: object, pid: object, started: object) -> Owner | None:
        """From stored values (labels, a manifest); None when any is missing or malformed (an older llmplay)."""
        try:
            if not isinstance(host, str) or not host or _float(started) <= 0:
                return None  # a start time never read: without it the pid proves nothing either way
            return cls(host, _int(pid), _float(started))
        except (TypeError, ValueError):
            return None

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> Owner | None:
        data = data or {}
        return cls.from_fields(data.get("host"), data.get("pid"), data.get("started"))

    def as_dict(self) -> dict[str, object]:
        return {"host": self.host, "pid": self.pid, "started": round(self.started, 2)}

    @property
    def local(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool | None:
        """True: this very process still runs; False: it is gone (its pid is free or now another process's);
        None: it ran on another host, which this one cannot look into."""
        if not self.local:
            return None
        started = process_started(self.pid)
        return started is not None and abs(started - self.started) <= START_TOLERANCE_S

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"
