"""The report's tuning record (one row per configuration, the catalog's columns) and its capacity searches."""

from __future__ import annotations

from collections.abc import Mapping

from llmplay.archive.capacity import CapacityResult
from llmplay.archive.model import TuningRow
from llmplay.catalog import (
    PEAK_MEMORY_COLUMN,
    REPORT_RECORD_COLUMNS,
    fmt_bytes,
    fmt_ci,
    fmt_full,
    fmt_pct,
    fmt_value,
    label_of,
)
from llmplay.report import charts
from llmplay.report.data import NOT_MEASURED, Remarks, RunData, arrow, folded_remarks, pooled_samples, value_of

# Tuning-record columns a run with capacity searches adds: cost at the SLO beside cost at the playbook's load.
CAPACITY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("capacity.rate", "capacity req/s"),
    ("capacity.concurrency", "capacity users"),
    ("capacity.output_tok_s", "tok/s at SLO"),
    ("cost.usd_per_1m_tokens_at_slo", "$ / 1M tok at SLO"),
)


def record_columns(run: RunData) -> list[tuple[str, str]]:
    """The tuning record's columns: the catalog's, plus the capacity figures some trial of this run measured."""
    measured = {m for t in run.trials.values() for m in t.summary}
    return [*REPORT_RECORD_COLUMNS, *((m, label) for m, label in CAPACITY_COLUMNS if m in measured)]


def _peak_memory(run: RunData, config_id: str, metrics: Mapping[str, float]) -> str:
    trials = run.trials_of(config_id)
    peak = max((t.summary["memory.peak_bytes"] for t in trials if "memory.peak_bytes" in t.summary), default=None)
    frac = value_of(metrics, "memory.peak_frac")
    if peak is not None:
        return fmt_bytes(peak) + (f" ({frac * 100:.0f}%)" if frac is not None else "")
    rss = max((t.summary["proc.rss_peak_bytes"] for t in trials if "proc.rss_peak_bytes" in t.summary), default=None)
    if rss is not None:
        return fmt_bytes(rss) + " RSS"
    return fmt_value("memory.peak_frac", frac) if frac is not None else NOT_MEASURED


def _row(run: RunData, row: TuningRow, columns: list[tuple[str, str]], remarks: Remarks) -> dict[str, object]:
    samples = row.samples or pooled_samples(run.trials[t] for t in row.trials if t in run.trials)
    cells = []
    for metric, _ in columns:
        if metric == PEAK_MEMORY_COLUMN:
            text = _peak_memory(run, row.config_id, row.metrics)
            if text == NOT_MEASURED:
                remarks.cell("memory.peak_bytes", None, samples)
        else:
            text = remarks.cell(metric, value_of(row.metrics, metric), samples)
        cells.append(text)
    verdict = next((v for v in run.verdicts if v.step == row.step), None) if row.step else None
    objective = verdict.objective if verdict is not None else None
    return {
        "config_id": row.config_id,
        "cells": cells,
        "verdict": row.verdict or "baseline",
        "reason": row.reason,
        "compared_with": row.compared_with,
        "changes": [arrow(c) for c in row.changes],
        "failed_trials": row.failed_trials,
        "trials": len(row.trials),
        "objective": None
        if objective is None
        else {
            "label": label_of(objective.metric),
            "delta": fmt_pct(objective.rel_change),
            "ci": fmt_ci(objective.ci_low, objective.ci_high),
        },
        "rebuilt": row.rebuilt,
        "final": row.config_id == run.final,
    }


def record_table(run: RunData) -> tuple[list[dict[str, object]], list[str]]:
    """The tuning record's rows, and the notes under it: why a figure is not measured, once per reason."""
    columns = record_columns(run)
    rows = run.archive.tuning_record() or run.archive.rebuilt_record()
    remarks = [(row.config_id, Remarks.new()) for row in rows]
    shown = [_row(run, row, columns, mine) for row, (_, mine) in zip(rows, remarks, strict=True)]
    return shown, folded_remarks(remarks)


def _search_row(run: RunData, config: str, trial_id: str, search: CapacityResult) -> dict[str, object]:
    trial = run.trials[trial_id]
    cost = value_of(trial.summary, "cost.usd_per_1m_tokens_at_slo")
    return {
        "config_id": config,
        "trial_id": trial_id,
        "repeat": trial.repeat + 1,
        "status": search.status,
        "boundary": search.boundary_words,
        "binding": search.binding_words,
        "probes": search.runs,
        "engine_min": f"{search.engine_s / 60:.1f}",
        "cost": fmt_full("cost.usd_per_1m_tokens_at_slo", cost) if cost is not None else NOT_MEASURED,
        "order": search.order,
        "notes": list(search.notes),
    }


def capacity(run: RunData) -> dict[str, object] | None:
    """Per configuration: its searches' attainment against load and throughput against latency, the binding
    constraint in words, and each search's bracket; None when no trial ran a capacity search."""
    by_config: dict[str, list[tuple[str, CapacityResult]]] = {}
    for tid, trial in run.trials.items():
        found = run.archive.capacity_search(tid) if trial.files.get("capacity") else None
        if found is not None:
            by_config.setdefault(trial.config_id, []).append((tid, found))
    if not by_config:
        return None
    first = next(iter(by_config.values()))[0][1]
    configs = [(config, [search for _, search in searches]) for config, searches in by_config.items()]
    rows = [
        _search_row(run, config, tid, search)
        for config, searches in by_config.items()
        for tid, search in sorted(searches, key=lambda s: run.trials[s[0]].repeat)
    ]
    slo_text = ", ".join(f"{k.upper()} ≤ {fmt_full('ttft.p95', v)}" for k, v in first.slo_s.items())
    return {
        "target": f"{first.target:.0%} of requests within {slo_text}",
        "unit": first.unit,
        "rows": rows,
        "attainment_chart": charts.capacity_attainment(configs, first.target, first.unit),
        "knee_chart": charts.capacity_knee(configs, first.slo_s, first.target),
    }
