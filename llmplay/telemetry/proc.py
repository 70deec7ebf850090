"""CPU seconds and memory of the engine: a Docker container (stats API) or a local process tree (psutil)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import psutil

from llmplay.jsonvalue import as_mapping, as_number
from llmplay.telemetry.sampler import Reading, add_note

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container


class ProcessSource:
    """A process and all its descendants. CPU seconds are kept per process (pid, create time), so a child
    that exits mid-window keeps its share instead of making the total drop."""

    name = "proc"

    def __init__(self, pid: int):
        self.pid = pid
        self.notes: list[str] = []
        self.info: dict[str, str] = {}
        self._proc: psutil.Process | None = None
        self._cpu_by_proc: dict[tuple[int, float], float] = {}
        self._gone = False

    def start(self) -> bool:
        try:
            self._proc = psutil.Process(self.pid)
            self.info["proc.cmdline"] = " ".join(self._proc.cmdline())[:300]
        except psutil.Error as e:
            add_note(self.notes, f"process {self.pid} not measured: {type(e).__name__}: {e}")
            return False
        return True

    def read(self) -> list[Reading]:
        if self._proc is None or self._gone:
            return []
        try:
            tree = [self._proc, *self._proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            self._gone = True
            add_note(self.notes, f"process {self.pid} exited during sampling")
            return []
        rss = 0.0
        for p in tree:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    key = (p.pid, p.create_time())
                    self._cpu_by_proc[key] = t.user + t.system
                    rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue  # exited between listing and reading; its last CPU time is kept
        return [Reading("proc.cpu_s", sum(self._cpu_by_proc.values())), Reading("proc.rss_bytes", rss)]

    def close(self) -> None:
        self._proc = None


def docker_memory_bytes(mem: Mapping[str, object]) -> float | None:
    """Container memory as `docker stats` shows it: usage minus inactive page cache (cgroup v2 / v1)."""
    usage = as_number(mem.get("usage"))
    if usage is None:
        return None
    stats = as_mapping(mem.get("stats"))
    cache = as_number(stats.get("inactive_file", stats.get("total_inactive_file", 0))) or 0.0
    return float(max(usage - cache, 0))


class DockerStatsSource:
    """`container` is a docker SDK Container (or its id/name with `client`). Reads one-shot stats, which
    skip the SDK's one-second wait for a second CPU sample."""

    name = "proc"

    def __init__(self, container: Container | str, client: DockerClient | None = None):
        self.container = container
        self.client = client
        self.notes: list[str] = []
        self.info: dict[str, str] = {}
        self._c: Container | None = None

    def start(self) -> bool:
        c = self.container
        if isinstance(c, str):
            try:
                import docker  # deferred: the docker SDK loads only when a container is named by id

                c = (self.client or docker.from_env()).containers.get(c)
            except Exception as e:
                add_note(self.notes, f"container {self.container} not measured: {type(e).__name__}: {e}")
                return False
        self._c = c
        self.info["proc.container"] = str(getattr(c, "name", c))
        return True

    def read(self) -> list[Reading]:
        container = self._c
        assert container is not None  # read only after start() found it
        try:
            st = container.stats(stream=False, one_shot=True)
        except TypeError:  # older docker SDK without one_shot
            st = container.stats(stream=False)
        out = []
        total_ns = ((st.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
        if total_ns is not None:
            out.append(Reading("proc.cpu_s", float(total_ns) / 1e9))
        mem = docker_memory_bytes(st.get("memory_stats") or {})
        if mem is not None:
            out.append(Reading("proc.rss_bytes", mem))
        if not out:
            add_note(self.notes, f"container {self.info.get('proc.container')}: stats carry no CPU/memory (stopped?)")
        return out

    def close(self) -> None:
        self._c = None
