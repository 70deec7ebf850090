"""Rendering to HTML: the jinja environment over report/templates, report.html of a run, and publishing it."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2
from markupsafe import Markup

from llmplay.archive.layout import REPORT_FILE
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.writer import RunArchive, atomic_write_text
from llmplay.errors import ArchiveError
from llmplay.report.context import build_context


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("llmplay", "report/templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["svg"] = lambda s: Markup(s) if s else ""  # our own matplotlib output: trusted markup
    return env


def render_html(template: str, context: Mapping[str, object]) -> str:
    return _environment().get_template(template).render(**context)


def render_report(run_dir: Path, *, unverified: Sequence[str] = ()) -> Path:
    """Write run_dir/report.html from the archive alone and return its path; the manifest is never touched.

    `unverified`: the problems verification found, for a run rendered anyway; the page opens with them."""
    archive = ArchivedRun.open(Path(run_dir))
    html = render_html("report.html.j2", build_context(archive, unverified=unverified))
    path = archive.run_dir / REPORT_FILE
    atomic_write_text(path, html)
    return path


def publish_report(run_dir: Path) -> Path:
    """The runner's last act on a run it wrote: report.html; a rendering bug never loses the run, and the manifest
    (written here only because this is still the run's writer) says why there is no report."""
    archive = RunArchive.open(Path(run_dir))
    try:
        path = render_report(archive.run_dir)
    except ArchiveError:
        raise
    except Exception as exc:  # any rendering bug: the measurements are safe on disk, so say how to retry
        archive.record_report_error(f"{type(exc).__name__}: {exc}")
        sys.stderr.write(
            f"warning: report.html not written ({type(exc).__name__}: {exc}); the archive is "
            f"complete, re-render with `llmplay report {archive.run_dir}`\n"
        )
        return archive.run_dir / REPORT_FILE
    return path
