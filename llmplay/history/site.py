"""The archive site: `<archive root>/index.html`, one static, self-contained, offline page over the whole archive.

Runs grouped by playbook, oldest first, with their headline figures and intervals; a trend chart per headline
metric (inline SVG); links to each run's report.html and to `compare` pages of consecutive comparable runs and of
the newest run against the accepted reference. The compare pages are written beside it (`compare/A--B.html`) once
and kept: a comparison of two archived runs never changes. Nothing is loaded from the network, there is no script.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from llmplay.archive.index import ArchiveIndex, Warn, warn_stderr
from llmplay.archive.layout import REPORT_FILE
from llmplay.archive.references import read_reference
from llmplay.archive.run_entry import RunEntry
from llmplay.archive.signing import public_key_from
from llmplay.archive.verify import check
from llmplay.archive.writer import atomic_write_text
from llmplay.catalog import label_of, metric_info
from llmplay.compare import compare_runs, render_comparison_html
from llmplay.errors import ArchiveError, LlmplayError
from llmplay.history.timeline import IMPROVEMENT, REGRESSION, PlaybookHistory, build_history
from llmplay.report import charts, publish_report
from llmplay.report.html import render_html

SITE_FILE = "index.html"
COMPARE_DIR = "compare"
# Compare pages read every request of two runs: the newest pairs of each playbook get one, and every flagged change.
RECENT_COMPARE_PAGES = 12
_SCALE = {"s": (1000.0, "ms"), "fraction": (100.0, "%")}


@dataclass(frozen=True)
class SiteResult:
    path: Path
    playbooks: int
    runs: int
    compare_pages: int


def histories(index: ArchiveIndex) -> list[PlaybookHistory]:
    """Every playbook's history from one query of the index."""
    by_playbook: dict[str, list[RunEntry]] = {}
    for entry in index.runs():
        by_playbook.setdefault(entry.playbook, []).append(entry)
    out = []
    for name, entries in sorted(by_playbook.items()):
        try:
            reference = read_reference(index.root, name)
        except LlmplayError:
            reference = None
        out.append(build_history(name, entries, reference))
    return out


def _compare_page(
    root: Path, a_path: str, b_path: str, a_id: str, b_id: str, warn: Warn, public_key: Ed25519PublicKey | None
) -> str | None:
    """The relative link of the compare page of two runs, written when missing from two runs that verify again from
    the archive (never on the index's word); None when it cannot be made."""
    rel = f"{COMPARE_DIR}/{a_id}--{b_id}.html"
    target = root / rel
    if target.is_file():
        return rel
    for run_id, path in ((a_id, a_path), (b_id, b_path)):
        verification = check(root / path, public_key)
        if not verification.ok:
            warn(f"no compare page for {a_id} -> {b_id}: {run_id} fails verification ({verification.one_line()})")
            return None
    try:
        render_comparison_html(compare_runs(root / a_path, root / b_path), target)
    except Exception as exc:  # a run the index calls verified but that cannot be compared: no link, a warning
        warn(f"no compare page for {a_id} -> {b_id} ({type(exc).__name__}: {exc})")
        return None
    return rel


def _pairs_to_compare(history: PlaybookHistory) -> list[tuple[str, str]]:
    """(previous, run) pairs that get a compare page: flagged ones, the newest ones, newest against the reference."""
    pairs = [(r.previous, r.entry.run_id) for r in history.rows if r.previous is not None]
    chosen = [p for p in pairs if any(f.previous_run_id == p[0] and f.run_id == p[1] for f in history.flags)]
    chosen += pairs[-RECENT_COMPARE_PAGES:]
    usable = [r.entry for r in history.rows if r.usable]
    newest = usable[-1].run_id if usable else None
    if (
        history.reference
        and newest not in (None, history.reference)
        and any(e.run_id == history.reference for e in usable)
    ):
        chosen.append((history.reference, newest))
    return list(dict.fromkeys((a, b) for a, b in chosen if a is not None))


def _unit(metric: str) -> tuple[float, str]:
    info = metric_info(metric)
    unit = info.unit if info else ""
    return _SCALE.get(unit, (1.0, unit))


def _playbook_view(
    root: Path, history: PlaybookHistory, warn: Warn, public_key: Ed25519PublicKey | None
) -> dict[str, object]:
    paths = {r.entry.run_id: r.entry.path for r in history.rows}
    links: dict[tuple[str, str], str] = {}
    for a, b in _pairs_to_compare(history):
        link = _compare_page(root, paths[a], paths[b], a, b, warn, public_key)
        if link is not None:
            links[(a, b)] = link
    rows = []
    for row in history.rows:
        e = row.entry
        report = f"{e.path}/{REPORT_FILE}"
        rows.append(
            {
                "id": e.run_id,
                "date": e.started_utc.replace("T", " ").rstrip("Z"),
                "kind": e.kind,
                "status": e.status,
                "engine": e.engine,
                "digest": e.image_digest[:19],
                "llmplay": e.llmplay_version,
                "host": f"{e.host} / {e.hardware}",
                "config": f"{e.config_id} #{e.config_fingerprint[:8]}",
                "figures": [row.figures[m].text() if m in row.figures else "—" for m in history.metrics],
                "marks": [m for m in row.marks if m != "first run"],
                "flags": [(f.direction, f.text()) for f in row.flags],
                "reference": row.reference,
                "verified": e.verified,
                "report": report if (root / report).is_file() else None,
                "compare_previous": links.get((row.previous, e.run_id)) if row.previous else None,
                "compare_reference": links.get((history.reference, e.run_id)) if history.reference else None,
            }
        )
    flagged = {(f.run_id, f.metric): f.direction for f in history.flags}
    charts_ = []
    for metric in history.metrics:
        scale, unit = _unit(metric)
        points = [
            charts.TrendPoint(
                date=r.entry.started_utc,
                value=float(r.figures[metric].value),
                low=float(r.figures[metric].low),
                high=float(r.figures[metric].high),
                engine=str(r.entry.engine_version or r.entry.engine or ""),
                config=r.entry.config_fingerprint,
                flag=flagged.get((r.entry.run_id, metric), ""),
                reference=r.reference,
            )
            for r in history.rows
            if r.usable and metric in r.figures
        ]
        role = history.roles.get(metric, "")
        title = f"{label_of(metric)}" + (f" ({role})" if role else "")
        charts_.append({"metric": metric, "svg": charts.trend(title, unit, points, scale)})
    return {
        "name": history.playbook,
        "anchor": "pb-" + "".join(c if c.isalnum() else "-" for c in history.playbook),
        "reference": history.reference,
        "metrics": [label_of(m) for m in history.metrics],
        "rows": rows,
        "charts": charts_,
        "notes": list(history.notes),
        "regressions": sum(1 for f in history.flags if f.direction == REGRESSION),
        "improvements": sum(1 for f in history.flags if f.direction == IMPROVEMENT),
        "ci_label": f"{history.confidence:.0%} CI over trials",
    }


def write_site(
    root: Path, *, out: Path | None = None, warn: Warn = warn_stderr, public_key: Ed25519PublicKey | None = None
) -> SiteResult:
    """Write the archive site (default `<root>/index.html`) from the index, runs verified with `public_key` when one
    is configured; returns where and what it covers."""
    root = Path(root)
    index = ArchiveIndex(root, warn, public_key)
    all_histories = histories(index)
    views = [_playbook_view(root, h, warn, public_key) for h in all_histories]
    unindexable = [{"path": u.path, "why": u.why} for u in index.unreadable()]
    html = render_html(
        "site.html.j2",
        {"root": str(root), "playbooks": views, "unindexable": unindexable},
    )
    path = Path(out) if out is not None else root / SITE_FILE
    if path.parent.resolve() != root.resolve():
        html = _rebase(html, os.path.relpath(root.resolve(), path.parent.resolve()))
    try:
        atomic_write_text(path, html)
    except OSError as exc:
        raise ArchiveError(
            f"{path}: cannot be written ({exc.strerror or exc}); expected a writable archive root with free space, "
            "or --out elsewhere"
        ) from None
    pages = sum(1 for _ in (root / COMPARE_DIR).glob("*.html")) if (root / COMPARE_DIR).is_dir() else 0
    return SiteResult(path, len(views), sum(len(h.rows) for h in all_histories), pages)


def _rebase(html: str, prefix: str) -> str:
    """A site written outside the archive root: its relative links point back into the root."""
    return html.replace('href="./', f'href="{prefix}/')


def publish_run(run_dir: Path) -> Path:
    """What a command runs on a finished archive: its report.html, then the archive site refreshed. A failure of the
    site only warns: the run and its report are complete, and `llmplay site` writes it again."""
    path = publish_report(run_dir)
    refresh_site(Path(run_dir).parent.parent)
    return path


def refresh_site(root: Path, warn: Callable[[str], None] = warn_stderr) -> None:
    try:
        write_site(root, warn=warn, public_key=public_key_from(None))
    except Exception as exc:  # the site is derived: never the reason a finished run reports a failure
        warn(f"{root / SITE_FILE} not refreshed ({type(exc).__name__}: {exc}); `llmplay site` writes it again")
