"""The report's steps: each step's verdict, its metric deltas with their intervals, its trials, and its charts
(latency CDFs, the objective per trial, requests over time, telemetry); trials without a verdict come last."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from llmplay.archive.model import KEPT, TRIAL_OK, MetricDelta, StepVerdict, TrialRecord
from llmplay.catalog import (
    absence_reason,
    fmt_ci,
    fmt_full,
    fmt_pct,
    label_of,
    metric_info,
    sample_count_key,
    thin_sample,
)
from llmplay.report import charts
from llmplay.report.data import THIN_MARK, Remarks, RunData, arrow, concat, value_of
from llmplay.report.search import search_section

LOG_TAIL_LINES = 60
_URL = re.compile(r"https?://[^\s,;]+")


def _lines(
    run: RunData, trial_ids: Sequence[str], metric: str, scale: float = 1.0, gpu_sum: bool = False
) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    out = []
    for tid in trial_ids:
        frame = run.telemetry(tid)
        if frame is None or not len(frame) or "metric" not in frame.columns:
            continue
        rows = frame[frame["metric"] == metric]
        if not len(rows):
            continue
        if gpu_sum:
            rows = rows.groupby("t_s", as_index=False)["value"].sum()
        out.append(
            (run.trials[tid].role, tid, rows["t_s"].to_numpy(dtype=float), rows["value"].to_numpy(dtype=float) * scale)
        )
    return out


def _telemetry_chart(run: RunData, trial_ids: Sequence[str]) -> str:
    memory = _lines(run, trial_ids, "memory.used_bytes", 1 / 2**30, gpu_sum=True)
    memory_title = "GPU memory used"
    if not memory:
        memory = _lines(run, trial_ids, "proc.rss_bytes", 1 / 2**30)
        memory_title = "engine RSS (no GPU memory measured)" if memory else "memory"
    panels = [
        ("GPU utilization", "%", _lines(run, trial_ids, "gpu.util_frac", 100.0)),
        (memory_title, "GiB", memory),
        ("KV-cache usage", "%", _lines(run, trial_ids, "engine.kv_cache_usage_frac", 100.0)),
        ("waiting requests", "requests", _lines(run, trial_ids, "engine.waiting")),
    ]
    return charts.telemetry_panels(panels)


def _tail(text: str | None, lines: int = LOG_TAIL_LINES) -> str:
    if not text:
        return "(no engine log was captured)"
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _section_charts(run: RunData, trial_ids: Sequence[str], objective: str | None) -> dict[str, str]:
    by_role: dict[str, list[str]] = {}
    for tid in trial_ids:
        if tid in run.trials and run.trials[tid].status == TRIAL_OK:
            by_role.setdefault(run.trials[tid].role, []).append(tid)
    cdf_panels = []
    for name, attr in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl")):
        cdf_panels.append(
            (
                f"{name} CDF",
                {role: concat(run.requests(t).latency_s[attr] for t in tids) for role, tids in by_role.items()},
            )
        )
    out = {"cdf": charts.latency_cdfs(cdf_panels)}
    objective = objective or "throughput.output_tok_s"
    info = metric_info(objective)
    scale, unit = (
        (1000.0, "ms")
        if info and info.unit == "s"
        else ((100.0, "%") if info and info.unit == "fraction" else (1.0, info.unit if info else ""))
    )
    points = [
        (run.trials[t].role, t, run.trials[t].summary[objective])
        for tids in by_role.values()
        for t in tids
        if objective in run.trials[t].summary
    ]
    out["points"] = charts.trial_points(f"{label_of(objective)} per trial", unit, points, scale=scale)
    series = [
        (run.trials[t].role, t, line["done_s"], line["output_tokens"], line["ttft"])
        for tids in by_role.values()
        for t in tids
        for line in (run.requests(t).timeline,)
    ]
    out["time"] = charts.over_time(series)
    out["telemetry"] = _telemetry_chart(run, [t for tids in by_role.values() for t in tids])
    return out


def _trial_rows(run: RunData, trial_ids: Sequence[str], objective: str | None) -> list[dict[str, object]]:
    rows = []
    for tid in trial_ids:
        t = run.trial(tid)
        if t is None:
            continue
        remarks = Remarks.new()

        def cell(metric: str, t: TrialRecord = t, remarks: Remarks = remarks) -> str:
            if t.status != TRIAL_OK or t.superseded:  # measured nothing, or nothing used; its error says why
                return "—"
            return remarks.cell(metric, value_of(t.summary, metric), t.summary)

        superseded = t.superseded and t.status == TRIAL_OK

        rows.append(
            {
                "id": t.trial_id,
                "role": t.role,
                "repeat": t.repeat + 1,
                "config": t.config_id,
                "status": "superseded" if superseded else t.status,
                "wall": f"{t.wall_s:.1f} s",
                "error": (t.superseded if superseded else t.error) or "",
                "node": t.node_label,
                "objective": cell(objective) if objective else "",
                "ttft": cell("ttft.p95"),
                "tok_s": cell("throughput.output_tok_s"),
                "errors": cell("errors.rate"),
                "log": _tail(run.archive.load_log(tid)) if t.status != TRIAL_OK else "",
                "remarks": remarks.lines(),
            }
        )
    return rows


def _direction(d: MetricDelta) -> str:
    """Better/worse only when the CI clears zero; a point estimate alone is noise until shown otherwise."""
    if d.better is None or d.rel_change is None:
        return "—"
    if d.ci_low is not None and d.ci_high is not None and d.ci_low <= 0 <= d.ci_high:
        return "within noise"
    return "better" if d.better else "worse"


def delta_rows(verdict: StepVerdict) -> list[dict[str, object]]:
    """A step's metric changes with their intervals, objective and guards first (the run's report and the tuning
    session's)."""
    rows: list[dict[str, object]] = []
    guard_metrics = {g.metric for g in verdict.guards}
    seen = set()
    for d in ([verdict.objective] if verdict.objective else []) + list(verdict.guards) + list(verdict.deltas):
        if d is None or d.metric in seen:
            continue
        seen.add(d.metric)
        role = (
            "objective"
            if verdict.objective and d.metric == verdict.objective.metric
            else ("guard" if d.metric in guard_metrics else "")
        )
        remarks: list[str] = []
        shown: dict[str, str] = {}
        key = sample_count_key(d.metric)
        for side, value, n in (("baseline", d.baseline, d.n_baseline), ("candidate", d.candidate, d.n_candidate)):
            shown[side] = fmt_full(d.metric, value)
            if value is None:
                remarks.append(f"{side} not measured: {absence_reason(d.metric)}")
            elif key and n is not None and (warning := thin_sample(d.metric, {key: n})):
                shown[side] += f" {THIN_MARK}"
                remarks.append(f"{THIN_MARK} {side}: {warning}")
        rows.append(
            {
                "metric": label_of(d.metric),
                "path": d.metric,
                "role": role,
                "baseline": shown["baseline"],
                "candidate": shown["candidate"],
                "remarks": "; ".join(remarks),
                "delta": fmt_pct(d.rel_change),
                "ci": fmt_ci(d.ci_low, d.ci_high),
                "better": _direction(d),
            }
        )
    return rows


def _notes(run: RunData, trial_ids: Sequence[str]) -> list[str]:
    notes: dict[str, None] = {}
    for tid in trial_ids:
        for note in run.trials[tid].notes if tid in run.trials else ():
            # each trial's engine has its own port: one note per kind of fact, not per trial
            notes[_URL.sub(lambda m: "the engine" + (":" if m.group(0).endswith(":") else ""), note)] = None
    return list(notes)


def _interval_note(verdict: StepVerdict) -> str:
    """What the step's intervals rest on, from the objective's delta: the unit, how many, the method, the level."""
    d = verdict.objective
    if d is None or d.method is None or d.units is None:
        return ""
    unit = "A/B pair(s)" if d.method.startswith("paired") else "trial(s) per side"
    level = f"{d.confidence:.1%}" if d.confidence is not None else "?"
    return (
        f"Intervals: {d.method} over {d.units} {unit}, each trial one value (its requests are not independent "
        f"draws); two-sided level {level}."
    )


def ci_header(verdict: StepVerdict) -> str:
    d = verdict.objective
    return f"{d.confidence:.1%} CI".replace(".0%", "%") if d is not None and d.confidence is not None else "CI"


def steps(run: RunData, descriptions: Mapping[str, str], kept_text: str) -> list[dict[str, object]]:
    out = []
    # Trials a lost cluster node made measure again: listed under their step, used nowhere.
    superseded = {t.trial_id: t.step for t in run.trials.values() if t.superseded}
    for v in sorted(run.verdicts, key=lambda v: v.index):
        used = [*v.trials_baseline, *v.trials_candidate]
        trial_ids = sorted([*used, *(tid for tid, step in superseded.items() if step == v.step)])
        objective = v.objective.metric if v.objective else None
        out.append(
            {
                "index": v.index,
                "step": v.step,
                "verdict": v.verdict,
                "reason": v.reason,
                "kept_means": kept_text if v.verdict == KEPT else "",
                "changes": [arrow(c) for c in v.changes],
                "bundle": v.bundle,
                "carried": v.carried,
                "baseline": v.baseline_config,
                "candidate": v.candidate_config,
                "description": value_of(descriptions, v.step) or "",
                "more_trials": v.more_trials_needed,
                "interval": _interval_note(v),
                "ci_header": ci_header(v),
                "deltas": delta_rows(v),
                "search": search_section(v),
                "trials": _trial_rows(run, trial_ids, objective),
                "charts": _section_charts(run, sorted(used), objective),
                "notes": _notes(run, trial_ids),
                "anchor": f"step-{v.index}",
                "nodes": any(run.trials[t].node for t in trial_ids if t in run.trials),
            }
        )
    stepped = {t for v in run.verdicts for t in (*v.trials_baseline, *v.trials_candidate)}
    stepped |= {tid for tid, step in superseded.items() if any(v.step == step for v in run.verdicts)}
    loose = sorted(t for t in run.trials if t not in stepped)
    if loose:  # a baseline-only run, or trials of a step whose verdict never came (interrupted)
        out.append(
            {
                "index": 0,
                "step": "baseline" if not run.verdicts else "trials without a verdict",
                "verdict": "",
                "reason": "",
                "kept_means": "",
                "changes": [],
                "bundle": False,
                "carried": False,
                "baseline": "baseline",
                "candidate": "",
                "description": "",
                "more_trials": None,
                "interval": "",
                "ci_header": "CI",
                "deltas": [],
                "search": None,
                "anchor": "trials-loose",
                "trials": _trial_rows(run, loose, "throughput.output_tok_s"),
                "charts": _section_charts(run, [t for t in loose if t not in superseded], "throughput.output_tok_s"),
                "notes": _notes(run, loose),
                "nodes": any(run.trials[t].node for t in loose),
            }
        )
    return out
