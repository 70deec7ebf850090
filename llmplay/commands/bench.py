"""`llmplay bench`: one workload (or its sweep) against an already running endpoint, printed as summary tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from llmplay.bench.sweep import discover_model, run_sweep
from llmplay.catalog import absence_reason, thin_warning
from llmplay.errors import ExitCode
from llmplay.loadgen.tokenizer import make_tokenizer
from llmplay.metrics import Summary
from llmplay.playbook.load import load_workload
from llmplay.playbook.source import located_error
from llmplay.spec import Goals, Workload
from llmplay.tuning.trial import capacity_search


def bench_command(
    url: str,
    workload_file: Path,
    *,
    model: str | None,
    json_path: str | None,
    capacity: bool = False,
    allow_outside_tree: bool = False,
) -> int:
    """Run the workload file's workload against `url`; one summary table per sweep point (with `capacity`, a
    capacity search under the playbook's goals.slo and goals.capacity, and its boundary table)."""
    workload, goals = load_workload(workload_file, allow_outside_tree=allow_outside_tree)
    if capacity:
        return bench_capacity(url, workload_file, workload, goals, model=model, json_path=json_path)
    results = run_sweep(
        url, workload, model=model, json_path=json_path, slo_s=goals.slo_s, progress=sys.stderr.isatty()
    )
    console = Console(width=None if sys.stdout.isatty() else 120)  # pipes and CI logs: wide enough for the table
    for result in results:
        console.print(format_summary_table(result.summary))
    return ExitCode.OK


def _ms(value: float | int | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def _num(value: float | int | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def format_summary_table(summary: Summary) -> Table:
    """A rich Table of the headline metrics: latencies in ms, then counts and rates."""
    v = summary.values
    families = (
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("itl", "ITL"),
        ("e2el", "E2EL"),
        ("ttft_nonstream", "TTFT non-stream"),
    )
    stats = ("mean", "std", "p50", "p90", "p95", "p99")
    tokens_from = {"usage": "the server's usage", "counted": "the text, counted", "estimated": "the text, estimated"}
    source = tokens_from.get(summary.output_tokens_source, summary.output_tokens_source)
    caption = [f"tokenizer: {summary.tokenizer}; output tokens from {source}"]
    absent = [f"{label} ({absence_reason(name + '.p50')})" for name, label in families if v.get(f"{name}.p50") is None]
    if absent:
        caption.append("not measured: " + ", ".join(absent))
    thin = [w for name, _ in families for s in stats if (w := thin_warning(f"{name}.{s}", v)) is not None]
    if thin:
        caption.append("too few requests: " + "; ".join(thin))
    table = Table(title="llmplay bench (latencies in ms)", box=box.SIMPLE_HEAD, caption="\n".join(caption))
    table.add_column("metric", no_wrap=True)
    for col in stats:
        table.add_column(col, justify="right", no_wrap=True)
    for name, label in families:
        if v.get(f"{name}.p50") is not None:
            table.add_row(label, *(_ms(v.get(f"{name}.{s}")) for s in stats))
    table.add_section()
    rows = [
        ("completed / sent", f"{v['requests.completed']} / {v['requests.total']}"),
        ("errors", f"{v['errors.count']} ({(v['errors.rate'] or 0) * 100:.1f}%)"),
        ("duration s", _num(summary.duration_s)),
        ("req/s", _num(v["throughput.req_s"])),
        ("output tok/s", _num(v["throughput.output_tok_s"])),
        ("total tok/s", _num(v["throughput.total_tok_s"])),
        ("goodput req/s", _num(v["goodput.req_s"])),
    ]
    if v.get("schedule_lag.p99") is not None:
        rows.append(("sched. lag p99 ms", _ms(v["schedule_lag.p99"])))
    for label, value in rows:
        table.add_row(label, value, *([""] * 5))
    return table


def bench_capacity(
    url: str, workload_file: Path, workload: Workload, goals: Goals, *, model: str | None, json_path: str | None
) -> int:
    """One capacity search against a running endpoint (nothing archived: there is no engine of ours to record)."""
    from llmplay.commands.capacity import print_boundaries  # deferred: rich tables of the capacity command

    if goals.capacity is None:
        raise located_error(
            str(workload_file),
            1,
            "--capacity: found no goals.capacity; expected a playbook with goals.slo and goals.capacity",
        )
    model = model or discover_model(url)
    tokenizer = make_tokenizer("auto", url)
    try:
        _, result = capacity_search(
            url, model, workload, goals.capacity, goals.slo_s, tokenizer, progress=sys.stderr.isatty()
        )
    finally:
        tokenizer.close()
    console = Console(width=None if sys.stdout.isatty() else 160)
    print_boundaries(console, [(url, 0, result, {})])
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result.as_dict(), indent=2, sort_keys=True) + "\n")
    return ExitCode.OK
