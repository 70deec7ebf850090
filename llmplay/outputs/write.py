"""Writing every CI output a command was asked for, from its sections."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmplay.outputs.facts import Section
from llmplay.outputs.files import OutputFiles
from llmplay.outputs.junit import write_junit
from llmplay.outputs.openmetrics import write_metrics
from llmplay.outputs.summary import append_summary


def write_outputs(files: OutputFiles, sections: Sequence[Section]) -> list[Path]:
    """The JUnit XML and the metrics replace their files (atomically); the summary is appended to its file."""
    written = []
    if files.junit is not None:
        written.append(write_junit(files.junit, sections))
    if files.summary is not None:
        written.append(append_summary(files.summary, sections))
    if files.metrics is not None:
        written.append(write_metrics(files.metrics, sections))
    return written
