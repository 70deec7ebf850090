"""The tuning session's page (report.html beside trail.json): built through the loop on a simulated engine (the real
run machinery, statistics, diagnosis and archive), parsed with an HTML parser, and rebuilt from the archive alone."""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path

import pytest

from llmplay.playbook.load import load_playbook
from llmplay.report.html import render_report
from llmplay.tune import trail
from llmplay.tune.loop import TuneLoop
from llmplay.tune.page import write_page
from llmplay.tuning import run as run_module
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
from llmplay_testing.simulated import SimulatedEngine
from llmplay_testing.tune_sessions import CtrlC, TwoPairsAtOnce, one_slot_chat, tune, tune_playbook, two_cures

# simulated engines: their data, and so each verdict, must not change with the run id
pytestmark = pytest.mark.usefixtures("draws_free_of_run_id")


class Page(HTMLParser):
    """Each table row's cells as text, the text under each element with an id, every link, and the tags."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.links: list[str] = []
        self.tags: set[str] = set()
        self.sections: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []  # (tag, id) of each open element
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        found = dict(attrs)
        if tag not in ("br", "meta"):
            self._open.append((tag, found.get("id")))
        if found.get("id"):
            self.sections[str(found["id"])] = ""
        if tag == "a" and found.get("href"):
            self.links.append(str(found["href"]))
        if tag == "tr":
            self._row = []
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        for _, element_id in self._open:
            if element_id:
                self.sections[element_id] += data

    def text(self, element_id: str) -> str:
        return " ".join(self.sections[element_id].split())


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_the_session_page_shows_each_round_its_ranking_with_reasons_the_verdict_and_why_it_stopped(tmp_path):
    lines: list[str] = []
    outcome = tune(tmp_path, SimulatedEngine(one_slot_chat, seed=1), lines).execute()
    assert outcome.report == outcome.tune_dir / "report.html" and outcome.report.is_file()
    page = parse(outcome.report)
    assert not page.tags & {"script", "iframe", "img", "link"}  # self-contained: one file, no network
    first = outcome.trail.rounds[1]
    # the rounds, each linked to its run's own report
    assert {"round-0", "round-1", "stop", "final", "rounds"} <= set(page.sections)
    for r in outcome.trail.rounds:
        href = os.path.relpath(Path(r.run_dir) / "report.html", outcome.tune_dir)
        assert href in page.links
        assert f"llmplay report {r.run_dir}" in page.text(f"round-{r.number}")  # not rendered in this test
    # round 1: the findings it read with their evidence, its ranking with each reason, the skipped one with why
    round1 = page.text("round-1")
    for finding in outcome.trail.rounds[0].findings:
        assert " ".join(finding.evidence.split()) in round1
    ranked = [row for row in page.rows if row and row[0] == "#1"]
    assert ranked and ranked[0][1] == "max_batch: parallel → 2, 4" and ranked[0][4] == first.ranked[0].reason
    skipped = {row[1]: row[4] for row in page.rows if row and row[0] == "skipped"}
    assert skipped["prefix_caching: prefix_caching"].startswith("prefix reuse already achieved: 39.0% of prompt")
    # the step, its verdict with the interval, and the engine time it spent
    assert "Step chosen: tune-max-batch-parallel" in round1 and f"Verdict: kept {first.reason}" in round1
    assert f"{first.engine_s / 60:.1f} engine minutes" in round1
    objective = next(row for row in page.rows if row[:2] == ["P95 TTFT", "objective"])
    assert objective[5].startswith("[") and objective[4].startswith("-")
    # the final configuration against the baseline, with the kept step's interval on each figure
    final = {
        row[0]: row for row in page.rows if len(row) == 5 and row[0] in ("P95 TTFT", "P95 TPOT", "output tokens/s")
    }
    assert set(final) == {"P95 TTFT", "P95 TPOT", "output tokens/s"}
    assert final["P95 TTFT"][4].startswith("round 1: tune-max-batch-parallel -") and "[" in final["P95 TTFT"][4]
    assert ["parallel", "1", "4"] in page.rows
    # why it stopped, and the ranking it stopped on
    assert page.text("stop-reason") == outcome.trail.stop
    assert "tuned.yaml" in page.links


def test_the_page_is_rebuilt_from_trail_json_and_the_archives_alone(tmp_path):
    outcome = tune(tmp_path, SimulatedEngine(one_slot_chat, seed=2), []).execute()
    written = parse(outcome.report)
    for r in outcome.trail.rounds:
        render_report(Path(r.run_dir))  # what `llmplay tune` publishes after each run
    again = parse(write_page(trail.load(outcome.tune_dir), outcome.tune_dir, "cpu-tiny-tune"))
    assert again.rows == written.rows and again.text("stop") == written.text("stop")
    assert again.text("round-1") == written.text("round-1").replace(
        f" (not rendered yet: llmplay report {outcome.trail.rounds[1].run_dir})", ""
    )
    assert all("not rendered yet" not in again.text(f"round-{r.number}") for r in outcome.trail.rounds)


def test_an_unreachable_goal_says_which_bound_on_the_page(tmp_path):
    outcome = tune(tmp_path, SimulatedEngine(one_slot_chat, seed=3), [], gates=["ttft.p95 < 50ms"]).execute()
    page = parse(outcome.report)
    assert page.text("stop-reason").startswith("goal unreachable (one request alone): ttft.p95 < 50ms")
    assert "goal unreachable" in page.text("stop") and "One request alone" in page.text("stop")
    assert "No baseline was measured" in page.text("final") and "No round ran." in page.text("rounds")


def test_an_interrupted_session_writes_its_page_saying_how_to_resume(tmp_path):
    playbook = load_playbook(tune_playbook(tmp_path))
    engine = CtrlC(SimulatedEngine(one_slot_chat, seed=4), "tune-max-batch-parallel", at=3)

    def run(pb, options: RunOptions) -> RunOutcome:
        return run_playbook(pb, options, report=lambda _l: None, measure_trial=engine)

    with pytest.raises(KeyboardInterrupt):
        TuneLoop(playbook, tmp_path / "tune", run, lambda _l: None).execute()
    page = parse(tmp_path / "tune" / "report.html")
    pending = trail.load(tmp_path / "tune").pending
    assert pending is not None and pending.run_dir
    assert f"Interrupted. The run {pending.run_dir} stopped mid-round" in page.text("interrupted")
    assert f"llmplay tune --resume {tmp_path / 'tune'} continues it" in page.text("interrupted")
    assert "the session was interrupted" in page.text("stop") and "round-0" in page.sections


def test_a_raced_round_shows_each_candidate_with_its_verdict_and_which_was_carried_and_why(tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "scheduler_for", lambda playbook, sharing: TwoPairsAtOnce(playbook, sharing))
    loop = tune(tmp_path, SimulatedEngine(two_cures, seed=11), [], room=lambda _pb: 2, race=2, budget={"steps": 2})
    outcome = loop.execute()
    raced = outcome.trail.rounds[1].raced
    assert [(c.verdict, c.carried) for c in raced] == [("kept", True), ("kept", False)], raced
    page = parse(outcome.report)
    round1 = page.text("round-1")
    assert "Raced: 2 candidates, each against the incumbent" in round1
    assert outcome.trail.rounds[1].race in round1 and "the first kept in ranking order is carried" in round1
    rows = {row[1]: row for row in page.rows if len(row) == 7 and row[0] in ("#1", "#2")}
    carried, other = rows[raced[0].step], rows[raced[1].step]
    assert carried[:4] == ["#1", raced[0].step, "max_batch: parallel", "kept"]
    assert carried[5] == "carried: the first kept in ranking order" and carried[6] == raced[0].reason
    assert other[:4] == ["#2", raced[1].step, "prefix_caching: cache_reuse", "kept"]
    assert other[5] == "not carried" and other[6] == raced[1].reason and "before it in the race" in other[6]
    assert carried[4].startswith("-") and "[" in carried[4]  # its objective's change and interval
    assert f"Step carried: {raced[0].step}" in round1
    assert page.text("stop-reason") == "budget spent: 2 of 2 steps"
    assert "steps chosen2 engine time" in page.text("stop")  # each raced candidate counts, as in the budget
