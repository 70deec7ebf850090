"""trials.noise: history: the archive's earlier runs comparable to this one, and the paired noise their steps
measured, for this run's steps to pool with their own while the two agree (stats.intervals.with_history).

Comparable: the same playbook (name, version and file, so the same workload and steps), the same engine image as
configured, and the same hardware class; finished and verifying. Each of their steps archived its own per-pair
noise per metric (StepVerdict.noise); a run archived before that was recorded has none and adds nothing. The
assumption is that a step here is as noisy as a step of those runs was: the runner checks it against this run's own
steps pooled, step by step, and the report lists the runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmplay.archive.index import INDEX_FILE, ArchiveIndex
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.run_entry import RunEntry
from llmplay.errors import LlmplayError
from llmplay.spec import Playbook
from llmplay.stats.intervals import Noise, pooled_noise


@dataclass(frozen=True)
class HistoryNoise:
    """Per metric, the comparable runs' step noise pooled; the runs it came from."""

    noise: Mapping[str, Noise] = field(default_factory=dict)
    runs: tuple[str, ...] = ()

    def describe(self) -> str:
        if not self.runs:
            return "noise: history; no earlier comparable run with recorded step noise yet (this run's steps pooled)"
        per_metric = ", ".join(f"{m} df {n.df}" for m, n in sorted(self.noise.items()))
        return f"noise: history of {len(self.runs)} comparable run(s) ({', '.join(self.runs)}): {per_metric}"


def comparable_to(entry: RunEntry, playbook: Playbook, sha256: str, hardware: str | None) -> bool:
    """Same playbook (name, version, file), engine image as configured, and hardware class (any when None)."""
    return (
        entry.usable
        and entry.playbook == playbook.metadata.name
        and entry.playbook_version == playbook.metadata.version
        and entry.playbook_sha256 == sha256
        and entry.engine.split(" ")[0] == (playbook.engine.image or playbook.engine.kind)
        and (hardware is None or entry.hardware == hardware)
    )


def history_noise(
    root: Path,
    playbook: Playbook,
    metrics: Sequence[str],
    *,
    sha256: str,
    hardware: str | None,
    exclude: str = "",
) -> HistoryNoise:
    """The noise of every earlier comparable run's steps under `root` (not `exclude`, the run asking), pooled per
    metric in `metrics`; `hardware` None (a plan, before any run) takes every hardware class."""
    if not (root / INDEX_FILE).exists() and not root.is_dir():
        return HistoryNoise()
    index = ArchiveIndex(root, lambda _: None)
    found: dict[str, list[Noise]] = {}
    runs = []
    for entry in index.runs(playbook.metadata.name):
        if entry.run_id == exclude or not comparable_to(entry, playbook, sha256, hardware):
            continue
        try:
            verdicts = ArchivedRun.open(root / entry.path).verdicts()
        except (LlmplayError, OSError):
            continue
        noises = [(m, Noise(var, df)) for v in verdicts for m, var, df in v.noise if m in metrics and df >= 1]
        if noises:
            runs.append(entry.run_id)
            for metric, noise in noises:
                found.setdefault(metric, []).append(noise)
    pooled = {m: p for m, ns in found.items() if (p := pooled_noise(ns)) is not None}
    return HistoryNoise(pooled, tuple(runs))
