"""The results pipeline accepts whatever a load run can measure: records → summary → decision → archive → report →
compare and the console lines, with no exception, an archive that verifies, and every printed number finite or
"not measured".

Hypothesis generates each trial's per-request records (streamed or not, ok or any ERROR_KINDS failure, 0 to a
dozen requests, one-token outputs, counted tokens, durations from a nanosecond to weeks, empty chunk lists,
warm-up only). Only the measuring of a trial is replaced (TuningRun's `measure_trial` seam, the way run_trial
reduces a load run to its TrialResult); the runner, decisions, archive, report and compare are the real ones.
"""

from __future__ import annotations

import io
import json
import os
import re
import textwrap
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from rich.console import Console

from llmplay.archive.layout import MANIFEST, REPORT_FILE
from llmplay.archive.model import TRIAL_FAILED, TRIAL_OK, TrialRecord
from llmplay.archive.verify import verify
from llmplay.catalog import PEAK_MEMORY_COLUMN, REPORT_RECORD_COLUMNS, absence_reason, thin_sample
from llmplay.commands.run import print_diagnosis, print_gates, print_outcome
from llmplay.compare import compare_runs, format_comparison_table, render_comparison_html
from llmplay.loadgen.records import ERROR_KINDS, RequestRecord
from llmplay.metrics import per_request_frame, summarize, usd_per_1m_tokens
from llmplay.playbook.load import load_playbook
from llmplay.report import render_report
from llmplay.spec import Config, Playbook
from llmplay.tuning.run import RunOptions, RunOutcome, TuningRun
from llmplay.tuning.trial import TrialResult, price_per_hour, trial_sample

# Fixed and derandomized, so CI time is bounded and every run checks the same inputs; benchmarks/reliability.py
# reports this count beside the playbook fuzzers' ("results-pipeline examples" in the README's figures).
PIPELINE_EXAMPLES = 15
PIPELINE_SETTINGS = settings(
    max_examples=PIPELINE_EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=(
        Phase.explicit,
        Phase.generate,
    ),  # no shrinking: a failure prints its example at once, CI time stays bounded
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

PLAYBOOK = textwrap.dedent("""\
    apiVersion: llmplay/v1
    kind: Playbook
    metadata: {name: pipeline-fuzz}
    goals:
      gates:
        - ttft.p95 < 2s
        - tpot.p95 < 200ms
        - throughput.output_tok_s > 20
        - errors.rate < 1%
        - cost.usd_per_1m_tokens < $20
      objective: {minimize: ttft.p95, min_effect: 10%}
      guards:
        - {metric: throughput.output_tok_s, tolerance: 15%}
        - {metric: errors.rate, tolerance: 1pp}
        - {metric: itl.p99, tolerance: 50%}
      slo: {ttft: 2s, tpot: 200ms}
    workload:
      api: chat
      input: {fixed: 16}
      output: {fixed: 8}
      rate: 0.3
      streaming_fraction: 0.75
      seed: 1
      warmup: 0s
      duration: 12s
    trials: {repeats: 2, interleave: true}
    cost: {host_usd_per_hour: $0.10}
    runtime: process
    engine:
      kind: llamacpp
      model: /models/tiny
      model_dir: {model_dir}
      args: {parallel: 1}
    steps:
      - {name: parallel-4, set: {parallel: 4}}
    """)

TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "vocab_size": 256,
    "torch_dtype": "float16",
}
T0 = 10**12  # a perf_counter_ns-like origin
# Durations anywhere from one nanosecond to a week, with the boundaries hypothesis likes to try.
durations_ns = st.one_of(st.integers(0, 10), st.integers(0, 10**10), st.integers(0, 7 * 86400 * 10**9))
OUTCOMES = ("ok", "ok", "ok", *ERROR_KINDS)


@st.composite
def request_records(draw: st.DrawFn, index: int) -> RequestRecord:
    stream = draw(st.booleans())
    outcome = draw(st.sampled_from(OUTCOMES))
    sent = T0 + draw(durations_ns)
    ttft = draw(durations_ns)
    gaps = draw(st.lists(durations_ns, max_size=4))  # zero-length chunk lists included
    chunks: list[int] = []
    if stream:
        t = sent + ttft
        for gap in gaps:
            chunks.append(t)
            t += gap
    got_first = draw(st.booleans()) if outcome != "ok" else (not stream or bool(chunks) or draw(st.booleans()))
    first = (chunks[0] if chunks else sent + ttft) if got_first else None
    end = (chunks[-1] if chunks else (first if first is not None else sent + ttft)) if got_first else None
    if outcome == "ok" and end is None and draw(st.booleans()):
        end = sent + ttft  # an empty reply: complete, but without a text chunk
    return RequestRecord(
        index=index,
        is_warmup=draw(st.booleans()) and draw(st.booleans()),
        stream=stream,
        scheduled_ns=sent - draw(st.integers(0, 10**9)),
        sent_ns=sent,
        first_chunk_ns=first,
        first_content_ns=first if first is not None and draw(st.booleans()) else None,
        chunk_ns=tuple(chunks),
        end_ns=end,
        input_tokens=draw(st.integers(0, 10**6)),
        output_tokens=draw(st.one_of(st.sampled_from((0, 1, 2)), st.integers(0, 10**7))),
        output_tokens_source=draw(st.sampled_from(("usage", "counted"))),
        finish_reason=draw(st.sampled_from((None, "length", "stop"))),
        http_status=None if outcome in ("connect", "timeout") else (200 if outcome == "ok" else 500),
        error_kind=None if outcome == "ok" else outcome,
        error_message=None if outcome == "ok" else f"{outcome} injected",
        queue_wait_s=draw(st.floats(0, 1e6, allow_nan=False)),
    )


@st.composite
def trial_inputs(draw: st.DrawFn) -> tuple[list[RequestRecord], float] | None:
    """One trial's records and measured duration; None: the engine never started (a failed trial, no records)."""
    if draw(st.integers(0, 9)) == 0:
        return None
    n = draw(st.integers(0, 12))
    records = [draw(request_records(i)) for i in range(n)]
    duration_s = draw(st.one_of(st.just(0.0), st.floats(1e-9, 1e7, allow_nan=False, allow_infinity=False)))
    return records, duration_s


# A run of the one-step playbook asks for four trials: baseline, candidate, baseline, candidate.
runs = st.lists(trial_inputs(), min_size=4, max_size=4)


class ScriptedTrials:
    """TuningRun's `measure_trial`: each trial from the next generated record set, reduced the way run_trial does."""

    def __init__(self, playbook: Playbook, inputs: Sequence[tuple[list[RequestRecord], float] | None]):
        self.playbook = playbook
        self.inputs = list(inputs)

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult:
        drawn = self.inputs.pop(0) if self.inputs else None
        base = {
            "trial_id": trial_id,
            "config_id": config.label,
            "step": step,
            "role": role,
            "repeat": repeat,
            "started_utc": "2026-12-03T00:00:00Z",
            "wall_s": 1.0,
        }
        if drawn is None:
            event("trial: the engine never started")
            trial = TrialRecord(**base, status=TRIAL_FAILED, summary={}, error="engine exited with code 1")
            return TrialResult(trial, engine_log="error: injected start failure\n")
        records, duration_s = drawn
        summary = summarize(records, duration_s, self.playbook.goals.slo_s).as_dict()
        summary["duration_s"] = duration_s
        cost = usd_per_1m_tokens(price_per_hour(self.playbook, config), summary.get("throughput.output_tok_s"))
        if cost is not None:
            summary["cost.usd_per_1m_tokens"] = cost
        status, error = TRIAL_OK, None
        if not summary.get("requests.completed"):
            status, error = TRIAL_FAILED, f"no request completed ({summary.get('errors.count', 0):.0f} errors)"
        # What the generated trials covered, in --hypothesis-show-statistics (benchmarks/reliability.py shows it).
        if records and all(r.is_warmup for r in records):
            event("trial: warm-up only")
        elif status == TRIAL_FAILED:
            event("trial: no request completed")
        elif not summary["ttft.n"]:
            event("trial: ok, no streamed TTFT")
        elif summary["ttft.n"] < 20:
            event("trial: ok, P95 TTFT from fewer than 20 requests")
        trial = TrialRecord(**base, status=status, summary=summary, error=error, notes=("tokenizer: none",))
        frame = per_request_frame(records)
        return TrialResult(trial, frame, None, "", trial_sample(self.playbook, config, trial, frame))


def run_pipeline(playbook: Playbook, root: Path, inputs: Sequence[tuple[list[RequestRecord], float] | None]):
    """One tuning run on scripted trials, its report rendered; the run's outcome and its console lines."""
    lines: list[str] = []
    outcome = TuningRun(
        playbook,
        RunOptions(archive_root=root),
        report=lines.append,
        measure_trial=ScriptedTrials(playbook, inputs),
    ).execute()
    render_report(outcome.run_dir)  # not publish_report: that one would turn a rendering bug into a warning
    return outcome, lines


def console_text(outcome: RunOutcome) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=400, color_system=None, soft_wrap=True)
    print_outcome(console, outcome)
    print_gates(console, outcome.gates)
    print_diagnosis(console, outcome.diagnosis, outcome.findings)
    return buffer.getvalue()


class _Text(HTMLParser):
    """A page's visible text (style sheets left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag == "style"

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return " ".join(parser.parts)


# A number that is not one: NaN or infinity in any spelling, or a None that leaked into a format string.
NOT_A_NUMBER = re.compile(r"(?<![A-Za-z])(?i:nan|inf|infinity)(?![A-Za-z])|\bNone\b")


def assert_only_finite_numbers(where: str, text: str) -> None:
    bad = [text[max(0, m.start() - 60) : m.end() + 60] for m in NOT_A_NUMBER.finditer(text)]
    if bad:
        pytest.fail(f"{where}: {bad[:3]}", pytrace=False)


def assert_absent_and_thin_figures_are_explained(manifest: dict, html: str) -> None:
    """Each tuning-record row: an absent figure reads "not measured" with its reason, a thin percentile its warning."""
    record = html[html.index('id="record"') : html.index('id="steps"')]
    for row in manifest["tuning_record"]:
        for metric, _ in REPORT_RECORD_COLUMNS:
            if metric == PEAK_MEMORY_COLUMN:
                continue
            value = row["metrics"].get(metric)
            if value is None:
                assert f"not measured: {absence_reason(metric)}" in record, (row["config_id"], metric)
            elif warning := thin_sample(metric, row.get("samples") or {}):
                assert warning in record, (row["config_id"], metric)


@pytest.fixture(scope="module")
def playbook(tmp_path_factory) -> Playbook:
    """The playbook, its model a config.json (diagnosis reads it; the CPU image's GGUF takes seconds per read)."""
    folder = tmp_path_factory.mktemp("pb")
    (folder / "config.json").write_text(json.dumps(TINY_MODEL))
    path = folder / "pipeline-fuzz.yaml"
    path.write_text(PLAYBOOK.replace("{model_dir}", str(folder)))
    return load_playbook(path)


@pytest.fixture(scope="module")
def examples_run():
    """How many examples ran, appended to LLMPLAY_RELIABILITY_FIGURES for benchmarks/reliability.py."""
    count = [0]
    yield count
    if os.environ.get("LLMPLAY_RELIABILITY_FIGURES"):
        with open(os.environ["LLMPLAY_RELIABILITY_FIGURES"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": "results-pipeline", "pipeline_examples": count[0]}) + "\n")


@PIPELINE_SETTINGS
@pytest.mark.slow  # fifteen archives written, verified and rendered
@given(run_a=runs, run_b=runs)
def test_any_measured_data_goes_through_the_whole_pipeline(playbook, tmp_path_factory, examples_run, run_a, run_b):
    examples_run[0] += 1
    root = tmp_path_factory.mktemp("runs")
    outcome_a, lines_a = run_pipeline(playbook, root / "a", run_a)
    outcome_b, lines_b = run_pipeline(playbook, root / "b", run_b)
    for outcome in (outcome_a, outcome_b):
        assert outcome.status == "complete", outcome
        assert verify(outcome.run_dir) == []
        assert_only_finite_numbers("console", console_text(outcome))
        html = (outcome.run_dir / REPORT_FILE).read_text(encoding="utf-8")
        assert_only_finite_numbers("report", visible_text(html))
        manifest = json.loads((outcome.run_dir / MANIFEST).read_text())
        assert "report_error" not in manifest
        assert_absent_and_thin_figures_are_explained(manifest, html)
    assert_only_finite_numbers("progress lines", "\n".join(lines_a + lines_b))
    comparison = compare_runs(outcome_a.run_dir, outcome_b.run_dir)
    assert_only_finite_numbers("comparison", format_comparison_table(comparison))
    page = render_comparison_html(comparison, root / "compare.html")
    assert_only_finite_numbers("comparison page", visible_text(page.read_text(encoding="utf-8")))


def test_the_readme_states_this_example_count():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"| results-pipeline examples | {PIPELINE_EXAMPLES} per test run" in readme
