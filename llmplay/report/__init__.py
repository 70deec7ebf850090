"""The HTML report of one archived run, rendered from the archive alone (jinja2 + inline matplotlib SVG)."""

from __future__ import annotations

from llmplay.report.html import publish_report, render_report

__all__ = ["publish_report", "render_report"]
