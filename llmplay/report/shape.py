"""The report's workload shape: what the load generator really sent (arrivals over time, input and output lengths,
prefix reuse expected beside achieved), against a replayed trace window's own figures, and for conversations the
session figures with TTFT by turn index per configuration. Read from the archived requests and summaries alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmplay.archive.model import TRIAL_OK, TrialRecord
from llmplay.catalog import SESSION_METRICS, fmt_value, label_of, turn_ttft_p50s
from llmplay.report import charts
from llmplay.report.data import Remarks, RunData, concat
from llmplay.report.method import describe_length
from llmplay.spec import TraceSpec, Workload

REUSE_METRICS = ("prefix_reuse.expected", "prefix_reuse.achieved", "engine.prefix_cache_hit_rate")
NONE = "—"


def _measured(run: RunData) -> list[TrialRecord]:
    return sorted(
        (t for t in run.trials.values() if t.status == TRIAL_OK and not t.superseded), key=lambda t: t.trial_id
    )


def _sends_s(run: RunData, trial_id: str) -> np.ndarray:
    """Each measured request's send time since the trial's first measured send (the gaps, summed)."""
    gaps = np.asarray(run.requests(trial_id).timeline["send_gap_s"], dtype=float)
    if not gaps.size and not run.requests(trial_id).timeline["input_tokens"].size:
        return np.array([], dtype=float)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _sent_rate(sends: np.ndarray) -> float | None:
    span = float(sends[-1]) if sends.size > 1 else 0.0
    return (sends.size - 1) / span if span > 0 else None


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _pooled(trials: Sequence[TrialRecord], metric: str) -> float | None:
    return _mean([t.summary[metric] for t in trials if metric in t.summary])


def _fmt(value: float | None, digits: str = ".1f", unit: str = "") -> str:
    return NONE if value is None else f"{value:{digits}}{unit}"


def _figures(run: RunData, workload: Workload, trials: Sequence[TrialRecord]) -> list[dict[str, str]]:
    """The sent workload's figures (mean over trials) beside what was asked: the trace window's own, or the
    playbook's distributions when no trace was replayed."""
    rates = [r for t in trials if (r := _sent_rate(_sends_s(run, t.trial_id))) is not None]
    lines = [run.requests(t.trial_id).timeline for t in trials]
    inputs = concat(line["input_tokens"] for line in lines)
    outputs = concat(line["output_tokens"] for line in lines)
    sent = {
        "rate": _fmt(_mean(rates), ".3g", " req/s"),
        "input": _fmt(float(inputs.mean()) if inputs.size else None, ".1f", " tokens"),
        "output": _fmt(float(outputs.mean()) if outputs.size else None, ".1f", " tokens"),
        "reuse": fmt_value("prefix_reuse.expected", _pooled(trials, "prefix_reuse.expected")),
    }
    spec = workload.trace
    if spec is not None and spec.facts is not None:
        asked = _trace_asked(workload, spec)
    else:
        asked = {
            "rate": _fmt(workload.rate, ".3g", " req/s") if workload.rate else "closed loop",
            "input": f"dataset {workload.dataset}" if workload.dataset else describe_length(workload.input),
            "output": "from the dataset" if workload.dataset else describe_length(workload.output),
            "reuse": f"{workload.prefix_tokens} shared tokens × {workload.prefix_groups}"
            if workload.prefix_tokens
            else NONE,
        }
    names = {"rate": "request rate", "input": "mean input", "output": "mean output", "reuse": "prefix reuse"}
    return [{"figure": names[k], "sent": sent[k], "asked": asked[k]} for k in names]


def _trace_asked(workload: Workload, spec: TraceSpec) -> dict[str, str]:
    facts = spec.facts
    assert facts is not None  # checked by the caller
    own = (facts.requests - 1) / facts.span_s if facts.span_s > 0 and facts.requests > 1 else None
    rate = _fmt(workload.rate, ".3g", " req/s")
    if own is not None:
        rate += f" (the window's own {own:.3g} req/s in trace time)"
    return {
        "rate": rate,
        "input": _fmt(facts.input_mean_tokens, ".1f", " tokens") + f" (max {facts.longest_input_tokens})",
        "output": _fmt(facts.output_mean_tokens, ".1f", " tokens") + f" (max {facts.longest_output_tokens})",
        "reuse": fmt_value("prefix_reuse.expected", facts.prefix_reuse),
    }


def _reuse_rows(run: RunData, trials: Sequence[TrialRecord]) -> list[dict[str, object]]:
    """Per configuration: the workload's reuse, the share the engine served from cache, its own hit rate."""
    rows: list[dict[str, object]] = []
    for config_id in dict.fromkeys(t.config_id for t in trials):
        mine = [t for t in trials if t.config_id == config_id]
        remarks = Remarks.new()
        cells = [remarks.cell(m, _pooled(mine, m), {}) for m in REUSE_METRICS]
        rows.append({"config_id": config_id, "cells": cells, "remarks": remarks.lines()})
    return rows


def _trace_line(spec: TraceSpec) -> str:
    window = f"from {spec.start_s:g} s" + (f" for {spec.duration_s:g} s" if spec.duration_s is not None else "")
    facts = spec.facts
    held = f": {facts.requests} requests over {facts.span_s:g} s of trace time" if facts else ""
    return (
        f"{spec.file.rsplit('/', 1)[-1]} ({spec.format}), window {window}{held}; lengths scaled "
        f"x{spec.input_scale:g} / x{spec.output_scale:g}"
    )


def workload_shape(run: RunData) -> dict[str, object] | None:
    """The run's sent workload against what it asked for; None when no trial measured a request."""
    trials = _measured(run)
    if not any(run.requests(t.trial_id).timeline["input_tokens"].size for t in trials):
        return None
    config = run.config("baseline") or run.config(run.final)
    workload = config.workload if config else Workload()
    lines = [run.requests(t.trial_id).timeline for t in trials]
    return {
        "trace": _trace_line(workload.trace) if workload.trace is not None else "",
        "figures": _figures(run, workload, trials),
        "reuse_columns": [label_of(m) for m in REUSE_METRICS],
        "reuse": _reuse_rows(run, trials),
        "arrivals": charts.arrivals([(t.role, t.trial_id, _sends_s(run, t.trial_id)) for t in trials], workload.rate),
        "histograms": charts.histograms(
            [
                ("input tokens per request", "tokens", concat(line["input_tokens"] for line in lines)),
                ("output tokens per request", "tokens", concat(line["output_tokens"] for line in lines)),
            ]
        ),
        "sessions": sessions(run, trials) if workload.turns > 1 else None,
    }


def sessions(run: RunData, trials: Sequence[TrialRecord]) -> dict[str, object] | None:
    """Conversations per configuration: the session figures and TTFT P50 by turn index (a column per turn)."""
    turns = sorted({k for t in trials for k, _ in turn_ttft_p50s(t.summary)})
    metrics = [*SESSION_METRICS, *(f"ttft_turn.{k}.p50" for k in turns)]
    rows, lines = [], []
    for config_id in dict.fromkeys(t.config_id for t in trials):
        mine = [t for t in trials if t.config_id == config_id]
        remarks = Remarks.new()
        rows.append(
            {
                "config_id": config_id,
                "cells": [remarks.cell(m, _pooled(mine, m), {}) for m in metrics],
                "remarks": remarks.lines(),
            }
        )
        measured = [(k, v) for k in turns if (v := _pooled(mine, f"ttft_turn.{k}.p50")) is not None]
        lines.append((config_id, [k for k, _ in measured], [v for _, v in measured]))
    return {"columns": [label_of(m) for m in metrics], "rows": rows, "chart": charts.by_turn(lines)}
