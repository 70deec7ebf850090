"""What earlier runs of the same playbook tried on the same engine and image, as the ranking's `Tried` (from the
archive's index and each run's verdicts): a knob rejected twice there is not tried a third time without saying so."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from llmplay.archive.index import ArchiveIndex
from llmplay.archive.reader import ArchivedRun
from llmplay.engines import get_engine
from llmplay.engines.knobs import Direction
from llmplay.errors import LlmplayError
from llmplay.spec import Playbook
from llmplay.tune.rank import Tried


def _direction(old: str, new: str) -> Direction:
    try:
        return Direction.RAISE if float(new) > float(old) else Direction.LOWER
    except ValueError:
        return Direction.QUANTIZE if new not in ("True", "true") else Direction.ENABLE


def tried_before(root: Path, playbook: Playbook, exclude: Collection[str] = ()) -> tuple[Tried, ...]:
    """Each step of an earlier run of this playbook on the same engine kind and image, as (remedy, knob, verdict);
    `exclude`: run directories of this session (its own rounds)."""
    kind = playbook.engine.kind
    engine = get_engine(kind)
    out: list[Tried] = []
    try:
        entries = ArchiveIndex(root, warn=lambda _m: None).runs(playbook.metadata.name)
    except (LlmplayError, OSError):
        return ()
    for entry in entries:
        run_dir = root / entry.path
        if str(run_dir) in exclude:
            continue
        try:
            run = ArchivedRun.open(run_dir)
            first = run.configs()[:1]
            if not first or (first[0].engine.kind, first[0].engine.image) != (kind, playbook.engine.image):
                continue
            verdicts = run.verdicts()
        except (LlmplayError, OSError, ValueError):
            continue
        for verdict in verdicts:
            for change in verdict.changes:  # "args.parallel: 1 -> 4"
                target, _, moves = change.partition(": ")
                old, _, new = moves.partition(" -> ")
                knob = target.removeprefix("args.")
                for spec in engine.knob_map:
                    if knob in (spec.knob, *spec.also) and spec.direction is _direction(old, new):
                        out.append(Tried(spec.remedy, spec.knob, verdict.verdict, f"run {entry.run_id}", False))
                        break
    return tuple(out)
