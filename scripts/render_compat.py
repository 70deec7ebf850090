"""Render compatibility: build a corpus of archives with one llmplay, render it with another, compare the bytes.

    python scripts/render_compat.py corpus CORPUS [REAL_RUN_DIR ...]   # with the code before a change
    python scripts/render_compat.py render CORPUS OUT                  # once with each llmplay; then diff -r

`corpus` writes the test archives (every llmplay_testing.make_archive variant, a history of six runs, a search
step's run through the real run with scripted trials) and copies the given real run directories beside them.
`render` writes each run's report.html text and the history site (with its compare pages) under OUT, never into
the runs (a report names its run directory, so both renders read the same corpus). Run it from the checkout whose code should render (PYTHONPATH=. python scripts/render_compat.py ...).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

VARIANTS: dict[str, dict[str, object]] = {
    "make-default": {},
    "make-unstreamed": {"streamed": False},
    "make-trace": {"shape": "trace"},
    "make-chat": {"shape": "chat"},
    "make-capacity": {"capacity": True},
    "make-slow": {"slowdown": 1.3, "seed": 11},
}


def corpus(out: Path, real_runs: list[str]) -> None:
    from llmplay_testing.history_archive import make_history_archive
    from llmplay_testing.make_archive import make_archive
    from tests.tuning.test_search_run import SearchTrials
    from tests.tuning.test_search_run import run as search_run

    shutil.rmtree(out, ignore_errors=True)
    runs, work = out / "runs", out / "work"
    runs.mkdir(parents=True)
    for name, kwargs in VARIANTS.items():
        shutil.copytree(make_archive(work / name, **kwargs), runs / name)
    make_history_archive(work / "history", 6)
    shutil.copytree(work / "history", out / "history-root")
    (work / "search").mkdir(parents=True)
    shutil.copytree(search_run(work / "search", SearchTrials(), []).execute().run_dir, runs / "search-step")
    for src in map(Path, real_runs):
        shutil.copytree(src, runs / f"real-{src.parent.name}-{src.name}")


def render(corpus_dir: Path, out: Path) -> None:
    from llmplay.archive.reader import ArchivedRun
    from llmplay.history.site import write_site
    from llmplay.report.context import build_context
    from llmplay.report.html import render_html

    out.mkdir(parents=True, exist_ok=True)
    for run in sorted((corpus_dir / "runs").iterdir()):
        (out / f"{run.name}.html").write_text(render_html("report.html.j2", build_context(ArchivedRun.open(run))))
    site = corpus_dir / "site-work"  # inside the corpus: the site names its root, the same for either llmplay
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(corpus_dir / "history-root", site)
    write_site(site, out=site / "index.html", warn=lambda _: None)
    shutil.copy(site / "index.html", out / "history-site.html")
    for page in sorted((site / "compare").glob("*.html")):
        shutil.copy(page, out / f"history-compare-{page.name}")
    shutil.rmtree(site)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "corpus":
        corpus(Path(args[0]), args[1:])
    else:
        render(Path(args[0]), Path(args[1]))
