"""Where a command writes its CI outputs; light to import, so the command line can build it before a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OutputFiles:
    """--junit, --summary and --metrics as given; None: not asked for."""

    junit: Path | None = None
    summary: Path | None = None
    metrics: Path | None = None

    @property
    def wanted(self) -> bool:
        return any(p is not None for p in (self.junit, self.summary, self.metrics))

    @property
    def named(self) -> str:
        """The options given, as a user wrote them ("--junit j.xml, --metrics m.prom")."""
        given = (("--junit", self.junit), ("--summary", self.summary), ("--metrics", self.metrics))
        return ", ".join(f"{flag} {path}" for flag, path in given if path is not None)


NO_OUTPUTS = OutputFiles()  # a command's default: nothing asked for
