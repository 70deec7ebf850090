"""The report's first screen as a reader sees it in a browser: the tuning record's repeated "not measured" reasons
folded into one note each under the table, and the record, at its widest (a run of capacity searches adds four
columns), inside a 1,400-pixel window without a horizontal cut, measured in headless Chromium."""

from __future__ import annotations

import os
import re

import pytest

from llmplay_testing.html_checks import chromium, layout_in_chromium, screenshot_in_chromium
from llmplay_testing.make_archive import shared_archive


def record_section(html: str) -> str:
    return html[html.index('id="record"') : html.index("</section>", html.index('id="record"'))]


def test_repeated_reasons_are_one_note_each_under_the_record(tmp_path_factory):
    html = (shared_archive(tmp_path_factory) / "report.html").read_text()
    record = record_section(html)
    assert 'class="why remarks"' not in record  # no reason repeated under each row
    notes = re.findall(r"<li>(.*?)</li>", record[record.index('id="record-notes"') :])
    # KV share is measured in no configuration: one note says so, once, for all of them.
    kv = [n for n in notes if "KV-cache share of memory not measured" in n]
    assert kv == [
        "KV-cache share of memory not measured: no GPU memory telemetry (no NVML, or the engine exposed none) (every configuration)"
    ]
    assert len(notes) == len(set(notes))
    # A thin percentile's warning names the configurations it marks; each cell keeps its mark.
    assert "† P99 TTFT from 47 request(s) (needs at least 100): too few to mean much (flash-attention)" in notes
    assert record.count("not measured</td>") >= 4 * 3  # the cells still say so, never zero or blank


@pytest.mark.parametrize("capacity", [False, True], ids=["plain", "capacity-columns"])
def test_the_tuning_record_fits_a_1400_pixel_window(tmp_path_factory, tmp_path, capacity):
    if chromium() is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is not installed (CI=true: the report's layout must be checked in a browser)")
        pytest.skip("chromium is not installed (`scripts/setup.sh --test` installs it)")
    page = shared_archive(tmp_path_factory, capacity=capacity) / "report.html"
    html = page.read_text()
    assert ("capacity req/s" in html) is capacity
    layout = layout_in_chromium(page, 1400, "table.record")
    assert layout["page"] <= layout["viewport"], layout  # no horizontal scroll anywhere on the page
    [record, *_] = layout["tables"]
    assert record["scroll"] <= record["client"], layout  # nothing inside the table is cut
    assert record["right"] <= record["parent_right"] + 0.5 <= layout["viewport"], layout
    screenshot_in_chromium(page, tmp_path / "report-1400.png", 1400, 1500)  # for a person looking at a failure
    assert (tmp_path / "report-1400.png").stat().st_size > 10_000
