"""The report's workload shape: the sent workload against a replayed trace window's own figures, prefix reuse
expected beside achieved (in the tuning record too), and for conversations the sessions panel with TTFT by turn."""

from __future__ import annotations

import html as markup
import re

import pytest

from llmplay.archive.reader import ArchivedRun
from llmplay_testing.html_checks import assert_self_contained, parse_page
from llmplay_testing.make_archive import TRACE_FACTS, shared_archive


def _section(html: str, anchor: str) -> str:
    start = html.index(f'<section id="{anchor}">')
    return html[start : html.index("</section>", start)]


def _text(html: str) -> str:
    return markup.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


@pytest.fixture(scope="module")
def trace_report(tmp_path_factory) -> str:
    return (shared_archive(tmp_path_factory, shape="trace") / "report.html").read_text()


@pytest.fixture(scope="module")
def chat_report(tmp_path_factory) -> str:
    return (shared_archive(tmp_path_factory, shape="chat") / "report.html").read_text()


def test_trace_workload_is_compared_with_its_window(tmp_path_factory, trace_report):
    assert_self_contained(trace_report)
    assert "shape" in parse_page(trace_report).ids
    shape = _section(trace_report, "shape")
    text = _text(shape)
    assert "mooncake.jsonl (mooncake), window from 0 s for 20 s: 76 requests over 19.556 s" in text
    assert "trace window" in text
    # The window's own figures beside the sent ones: rate, mean lengths, reuse.
    assert "2 req/s (the window's own 3.84 req/s in trace time)" in text
    assert f"{TRACE_FACTS.input_mean_tokens:.1f} tokens (max {TRACE_FACTS.longest_input_tokens})" in text
    assert f"{TRACE_FACTS.output_mean_tokens:.1f} tokens (max {TRACE_FACTS.longest_output_tokens})" in text
    assert re.search(r"prefix reuse \S+% \S+%", text), text  # sent, then the window's
    assert shape.count("<svg") == 2  # arrivals over time, length histograms
    assert "requests sent over time" in shape and "input tokens per request" in shape
    assert "Sessions" not in shape  # one turn per request
    # The archived trace is a typed record, its facts included.
    run = ArchivedRun.open(shared_archive(tmp_path_factory, shape="trace"))
    (config,) = [c for c in run.configs() if c.config_id == "baseline"]
    assert config.workload.trace is not None and config.workload.trace.facts == TRACE_FACTS


def test_reuse_expected_beside_achieved_in_record_and_shape(trace_report):
    record = _text(_section(trace_report, "record"))
    assert "reuse expected" in record and "reuse achieved" in record
    # baseline (no cache): achieved 0; the cached configurations 90% of the 5% the trace repeats.
    assert "5.0% 0.0%" in record and "5.0% 4.5%" in record, record
    reuse = _text(_section(trace_report, "shape"))
    assert "prefix reuse expected" in reuse and "prefix reuse achieved" in reuse


def test_conversations_get_a_sessions_panel(chat_report):
    assert_self_contained(chat_report)
    shape = _section(chat_report, "shape")
    assert 'id="sessions"' in shape
    text = _text(shape)
    for label in ("conversations", "turns per conversation", "P50 conversation time", "P50 TTFT of turn 3"):
        assert label in text, label
    assert "P50 TTFT by turn of the conversation" in shape
    assert shape.count("<svg") == 3
    # No trace: the sent workload is compared with what the playbook asked for.
    assert "asked" in text and "trace window" not in text


def test_a_plain_workload_has_no_sessions_panel(tmp_path_factory):
    html = (shared_archive(tmp_path_factory) / "report.html").read_text()
    shape = _section(html, "shape")
    assert 'id="sessions"' not in shape and "asked" in _text(shape)
