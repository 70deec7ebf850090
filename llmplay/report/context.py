"""View models of one archived run: everything the report template shows, built from the archive alone.

Strings, lists and inline SVG charts, so the template only lays them out; nothing here touches the network.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from llmplay.archive.layout import PLAYBOOK_FILE, RESOLVED_FILE
from llmplay.archive.model import KEPT, TRIAL_OK, StepVerdict, TrialRecord
from llmplay.archive.reader import ArchivedRun, gpu_label
from llmplay.catalog import (
    METRIC_DEFINITIONS,
    PEAK_MEMORY_COLUMN,
    REPORT_RECORD_COLUMNS,
    SAMPLE_COUNT_KEYS,
    absence_reason,
    fmt_bytes,
    fmt_ci,
    fmt_full,
    fmt_pct,
    fmt_value,
    label_of,
    metric_info,
    sample_count_key,
    thin_sample,
)
from llmplay.metrics import per_request_arrays, request_timeline
from llmplay.report import charts
from llmplay.spec import Objective, Trials, gpu_count
from llmplay.tuning.decide import error_rates_text, kept_means
from llmplay.units import parse_fraction

LOG_TAIL_LINES = 60
_URL = re.compile(r"https?://[^\s,;]+")


NOT_MEASURED = "not measured"
THIN_MARK = "†"  # beside a percentile from too few requests; the warning itself is printed under its table


def arrow(change: str) -> str:
    return change.replace(" -> ", " → ")


@dataclass
class Remarks:
    """What a table's figures cannot say by themselves, as visible text: which figures are not measured and why,
    and which percentiles rest on too few requests (catalog.absence_reason, catalog.thin_sample)."""

    absent: dict[str, list[str]]  # reason -> labels of the figures it explains
    thin: list[str]

    @classmethod
    def new(cls) -> Remarks:
        return cls({}, [])

    def cell(self, metric: str, value: float | None, samples: Mapping[str, Any]) -> str:
        """The cell text of one figure: its value ("†" when its sample is thin), or "not measured"."""
        if value is None:
            labels = self.absent.setdefault(absence_reason(metric), [])
            if label_of(metric) not in labels:
                labels.append(label_of(metric))
            return NOT_MEASURED
        shown = fmt_value(metric, value)
        warning = thin_sample(metric, samples)
        if warning is None:
            return shown
        if warning not in self.thin:
            self.thin.append(warning)
        return f"{shown} {THIN_MARK}"

    def lines(self) -> list[str]:
        out = [f"{', '.join(labels)} not measured: {reason}" for reason, labels in self.absent.items()]
        out += [f"{THIN_MARK} {warning}: too few to mean much" for warning in self.thin]
        return out


def pooled_samples(trials: Iterable[TrialRecord]) -> dict[str, int]:
    """How many requests a configuration's pooled figures rest on: each count summed over its ok trials; a count
    some trial does not carry (an archive from before counts were kept) is left out, so nothing is marked."""
    ok = [t for t in trials if t.status == TRIAL_OK]
    return {
        key: int(sum(t.summary[key] for t in ok))
        for key in SAMPLE_COUNT_KEYS
        if ok and all(key in t.summary for t in ok)
    }


# ---------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class TrialRequests:
    """One trial's measured requests as the charts need them, computed by llmplay.metrics."""

    latency_s: Mapping[str, np.ndarray]  # per_request_arrays: ttft, tpot, itl (pooled), e2el, ... seconds
    timeline: Mapping[str, np.ndarray]  # request_timeline: done_s, ttft, input/output tokens; send_gap_s

    @classmethod
    def empty(cls) -> TrialRequests:
        return cls.of(None)

    @classmethod
    def of(cls, records: Any) -> TrialRequests:
        """From an archived records frame; tolerant of missing or extra columns (what cannot be computed is empty)."""
        if records is None or not len(records):
            records = ()
        return cls(per_request_arrays(records), request_timeline(records))


def _concat(arrays: Iterable[np.ndarray]) -> np.ndarray:
    arrays = [a for a in arrays if a.size]
    return np.concatenate(arrays) if arrays else np.array([], dtype=float)


# ---------------------------------------------------------------------------------------------- the model
class _ArchivedRunData:
    """One archived run's manifest, trials, configurations and verdicts as values, each trial's requests read from
    disk once (several sections chart them) and its telemetry on demand; every section reads through it."""

    def __init__(self, archive: ArchivedRun):
        self.archive = archive
        self.manifest = archive.manifest()
        self.trials = {t.trial_id: t for t in archive.trials()}
        self.configs = {c.config_id: c for c in archive.configs()}
        self.verdicts = archive.verdicts()
        self._requests: dict[str, TrialRequests] = {}

    def requests(self, trial_id: str) -> TrialRequests:
        if trial_id not in self._requests:
            trial = self.trials.get(trial_id)
            if trial is None or "records" not in trial.files:
                self._requests[trial_id] = TrialRequests.empty()
            else:
                self._requests[trial_id] = TrialRequests.of(self.archive.load_records(trial_id))
        return self._requests[trial_id]

    def telemetry(self, trial_id: str) -> Any:
        trial = self.trials.get(trial_id)
        if trial is None or "telemetry" not in trial.files:
            return None
        return self.archive.load_telemetry(trial_id)

    def trials_of(self, config_id: str) -> list[TrialRecord]:
        return [t for t in self.trials.values() if t.config_id == config_id and t.superseded is None]

    def gpus_of(self, config_id: str) -> int:
        config = self.configs.get(config_id)
        return gpu_count(config.engine.get("gpus") if config else 0)


def _engine_facts(run: _ArchivedRunData) -> dict[str, str]:
    final = run.manifest.get("final_config_id")
    described = [t for t in run.trials.values() if t.engine_describe]
    chosen = [t for t in described if t.config_id == final] or described
    d = dict(chosen[-1].engine_describe) if chosen else {}
    config = run.configs.get(final or "") or next(iter(run.configs.values()), None)
    engine = dict(config.engine) if config else {}
    digest = next((str(d[k]) for k in ("image_digest", "digest", "repo_digest", "image_id") if d.get(k)), "")
    images = sorted({str(t.engine_describe.get("image")) for t in described if t.engine_describe.get("image")})
    return {
        "kind": str(engine.get("kind") or ""),
        "image": str(d.get("image") or engine.get("image") or "—"),
        "digest": digest or "not recorded",
        "version": str(d.get("version") or d.get("engine_version") or "not reported"),
        "model": str(engine.get("model") or ""),
        "images": ", ".join(images),
    }


def _header(run: _ArchivedRunData) -> dict[str, Any]:
    m = run.manifest
    env = m.get("environment") or {}
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else None
    gpu_hours = sum(t.wall_s * run.gpus_of(t.config_id) for t in run.trials.values()) / 3600
    wall_hours = sum(t.wall_s for t in run.trials.values()) / 3600
    gpu_text = gpu_label(env)
    if gpu and gpu.get("name"):
        gpu_text += f" · driver {gpu.get('driver') or '?'} · CUDA {gpu.get('cuda') or '?'}"
    elif gpu and gpu.get("error"):
        gpu_text += f" ({gpu['error']})"
    docker = env.get("docker")
    if isinstance(docker, dict):
        docker = docker.get("version") or docker.get("server") or json.dumps(docker)
    return {
        "name": m["playbook"]["name"],
        "version": m["playbook"].get("version", ""),
        "started": env.get("started_utc", ""),
        "finished": m.get("finished_utc", ""),
        "who": f"{env.get('user', '?')}@{env.get('host', '?')}",
        "platform": env.get("platform", ""),
        "engine": _engine_facts(run),
        "gpu": gpu_text,
        "llmplay_version": env.get("llmplay_version", "?"),
        "python": env.get("python", ""),
        "docker": str(docker or "—"),
        "seed": env.get("seed"),
        "gpu_hours": f"{gpu_hours:.3f}" if gpu_hours else "0 (no GPU used)",
        "wall_hours": f"{wall_hours:.3f}",
        "status": m.get("status", "?"),
        "exit_code": m.get("exit_code"),
        "run_id": m.get("run_id"),
        "trials": len(run.trials),
        "failed_trials": sum(1 for t in run.trials.values() if t.status != TRIAL_OK),
        "playbook_path": m["playbook"].get("path", ""),
        "playbook_sha256": m["playbook"].get("sha256", ""),
    }


def _shared_host(run: _ArchivedRunData) -> dict[str, Any] | None:
    """Which trials other llmplay runs shared the host with: their load was in those trials' figures."""
    shared = [t for t in run.trials.values() if t.shared_with]
    if not shared:
        return None
    runs = {str(o.get("run_id")): o for t in shared for o in t.shared_with or ()}
    return {
        "trials": len(shared),
        "of": len(run.trials),
        "runs": [f"{rid} ({o.get('playbook') or '?'}, pid {o.get('pid', '?')})" for rid, o in sorted(runs.items())],
    }


def _glance(run: _ArchivedRunData) -> dict[str, Any]:
    gates = []
    for g in run.archive.gates():
        state = "not measured" if g.met is None else ("met" if g.met else "failed")
        # The runner's own note (why not measured, or a thin sample) when it wrote one; else the catalog's reason.
        note = g.note or (absence_reason(g.metric) if g.observed is None else "")
        gates.append(
            {
                "gate": g.gate,
                "note": note,
                "observed": fmt_full(g.metric, g.observed),
                "state": state,
                "margin": fmt_pct(g.margin) if g.margin is not None else "—",
                "label": label_of(g.metric),
            }
        )
    final = run.manifest.get("final_config_id")
    config = run.configs.get(final or "")
    kept = [v for v in run.verdicts if v.carried]
    return {
        "gates": gates,
        "met": sum(1 for g in gates if g["state"] == "met"),
        "total": len(gates),
        "final": final or "—",
        "docker_command": config.docker_command if config else "",
        "engine_command": " ".join(config.command) if config else "",
        "kept": [{"step": v.step, "changes": [arrow(c) for c in v.changes]} for v in kept],
        "counts": {
            k: sum(1 for v in run.verdicts if v.verdict == k) for k in ("kept", "rejected", "inconclusive", "failed")
        },
    }


def _peak_memory(run: _ArchivedRunData, config_id: str, metrics: Mapping[str, Any]) -> str:
    trials = run.trials_of(config_id)
    peak = max((t.summary["memory.peak_bytes"] for t in trials if "memory.peak_bytes" in t.summary), default=None)
    frac = metrics.get("memory.peak_frac")
    if peak is not None:
        return fmt_bytes(peak) + (f" ({frac * 100:.0f}%)" if frac is not None else "")
    rss = max((t.summary["proc.rss_peak_bytes"] for t in trials if "proc.rss_peak_bytes" in t.summary), default=None)
    if rss is not None:
        return fmt_bytes(rss) + " RSS"
    return fmt_value("memory.peak_frac", frac) if frac is not None else NOT_MEASURED


# Tuning-record columns a run with capacity searches adds: cost at the SLO beside cost at the playbook's load.
CAPACITY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("capacity.rate", "capacity req/s"),
    ("capacity.concurrency", "capacity users"),
    ("capacity.output_tok_s", "tok/s at SLO"),
    ("cost.usd_per_1m_tokens_at_slo", "$ / 1M tok at SLO"),
)


def record_columns(run: _ArchivedRunData) -> list[tuple[str, str]]:
    """The tuning record's columns: the catalog's, plus the capacity figures some trial of this run measured."""
    measured = {m for t in run.trials.values() for m in t.summary}
    return [*REPORT_RECORD_COLUMNS, *((m, label) for m, label in CAPACITY_COLUMNS if m in measured)]


def _capacity(run: _ArchivedRunData) -> dict[str, Any] | None:
    """Per configuration: its searches' attainment against load and throughput against latency, the binding
    constraint in words, and each search's bracket; None when no trial ran a capacity search."""
    by_config: dict[str, list[dict[str, Any]]] = {}
    for tid, trial in run.trials.items():
        found = run.archive.load_capacity(tid) if trial.files.get("capacity") else None
        if found is not None:
            by_config.setdefault(trial.config_id, []).append({**found, "trial_id": tid, "repeat": trial.repeat})
    if not by_config:
        return None
    first = next(iter(by_config.values()))[0]
    target, slo_s, unit = float(first["target"]), dict(first.get("slo_s") or {}), str(first.get("unit", ""))
    configs = list(by_config.items())
    rows = []
    for config, searches in configs:
        for search in sorted(searches, key=lambda s: s["repeat"]):
            trial = run.trials[search["trial_id"]]
            cost = trial.summary.get("cost.usd_per_1m_tokens_at_slo")
            rows.append(
                {
                    "config_id": config,
                    "trial_id": search["trial_id"],
                    "repeat": search["repeat"] + 1,
                    "status": search["status"],
                    "boundary": search.get("boundary_text", ""),
                    "binding": search.get("binding_sentence", ""),
                    "probes": search.get("runs", 0),
                    "engine_min": f"{float(search.get('engine_s', 0.0)) / 60:.1f}",
                    "cost": fmt_full("cost.usd_per_1m_tokens_at_slo", cost) if cost is not None else NOT_MEASURED,
                    "order": search.get("order", ""),
                    "notes": list(search.get("notes") or []),
                }
            )
    slo_text = ", ".join(f"{k.upper()} ≤ {fmt_full('ttft.p95', v)}" for k, v in slo_s.items())
    return {
        "target": f"{target:.0%} of requests within {slo_text}",
        "unit": unit,
        "rows": rows,
        "attainment_chart": charts.capacity_attainment(configs, target, unit),
        "knee_chart": charts.capacity_knee(configs, slo_s, target),
    }


def _record_rows(run: _ArchivedRunData) -> list[dict[str, Any]]:
    rows = list(run.manifest.get("tuning_record") or [])
    if not rows:  # an interrupted run has no record yet: rebuild it from the trials' own summaries
        for config_id in dict.fromkeys(t.config_id for t in run.trials.values()):
            ok = [t for t in run.trials_of(config_id) if t.status == TRIAL_OK]
            metrics = {
                m: float(np.mean([t.summary[m] for t in ok if m in t.summary]))
                for m, _ in REPORT_RECORD_COLUMNS
                if any(m in t.summary for t in ok)
            }
            rows.append(
                {"config_id": config_id, "metrics": metrics, "trials": [t.trial_id for t in ok], "rebuilt": True}
            )
    verdicts = {v.step: v for v in run.verdicts}
    out = []
    for row in rows:
        metrics = row.get("metrics") or {}
        samples = row.get("samples") or pooled_samples(
            run.trials[t] for t in row.get("trials") or [] if t in run.trials
        )
        remarks = Remarks.new()
        cells = []
        for metric, _ in record_columns(run):
            if metric == PEAK_MEMORY_COLUMN:
                text = _peak_memory(run, row["config_id"], metrics)
                if text == NOT_MEASURED:
                    remarks.cell("memory.peak_bytes", None, samples)
            else:
                text = remarks.cell(metric, metrics.get(metric), samples)
            cells.append(text)
        verdict = verdicts.get(row.get("step") or "")
        entry: dict[str, Any] = {
            "config_id": row["config_id"],
            "cells": cells,
            "verdict": row.get("verdict") or "baseline",
            "reason": row.get("reason") or "",
            "compared_with": row.get("compared_with") or "",
            "changes": [arrow(c) for c in row.get("changes") or []],
            "failed_trials": row.get("failed_trials", 0),
            "trials": len(row.get("trials") or []),
            "objective": None,
            "rebuilt": bool(row.get("rebuilt")),
            "final": row["config_id"] == run.manifest.get("final_config_id"),
            "remarks": remarks.lines(),
        }
        if verdict is not None and verdict.objective is not None:
            o = verdict.objective
            entry["objective"] = {
                "label": label_of(o.metric),
                "delta": fmt_pct(o.rel_change),
                "ci": fmt_ci(o.ci_low, o.ci_high),
            }
        out.append(entry)
    return out


def _lines(
    run: _ArchivedRunData, trial_ids: Sequence[str], metric: str, scale: float = 1.0, gpu_sum: bool = False
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


def _telemetry_chart(run: _ArchivedRunData, trial_ids: Sequence[str]) -> str:
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


def _section_charts(run: _ArchivedRunData, trial_ids: Sequence[str], objective: str | None) -> dict[str, str]:
    by_role: dict[str, list[str]] = {}
    for tid in trial_ids:
        if tid in run.trials and run.trials[tid].status == TRIAL_OK:
            by_role.setdefault(run.trials[tid].role, []).append(tid)
    cdf_panels = []
    for name, attr in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl")):
        cdf_panels.append(
            (
                f"{name} CDF",
                {role: _concat(run.requests(t).latency_s[attr] for t in tids) for role, tids in by_role.items()},
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


def _trial_rows(run: _ArchivedRunData, trial_ids: Sequence[str], objective: str | None) -> list[dict[str, Any]]:
    rows = []
    for tid in trial_ids:
        t = run.trials.get(tid)
        if t is None:
            continue
        remarks = Remarks.new()

        def cell(metric: str, t: TrialRecord = t, remarks: Remarks = remarks) -> str:
            if t.status != TRIAL_OK or t.superseded:  # measured nothing, or nothing used; its error says why
                return "—"
            return remarks.cell(metric, t.summary.get(metric), t.summary)

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
                "node": f"{t.node.get('address') or t.node.get('hostname', '')} ({t.node['id'][:8]})"
                if t.node.get("id")
                else "",
                "objective": cell(objective) if objective else "",
                "ttft": cell("ttft.p95"),
                "tok_s": cell("throughput.output_tok_s"),
                "errors": cell("errors.rate"),
                "log": _tail(run.archive.load_log(tid)) if t.status != TRIAL_OK else "",
                "remarks": remarks.lines(),
            }
        )
    return rows


def _direction(d: Any) -> str:
    """Better/worse only when the CI clears zero; a point estimate alone is noise until shown otherwise."""
    if d.better is None or d.rel_change is None:
        return "—"
    if d.ci_low is not None and d.ci_high is not None and d.ci_low <= 0 <= d.ci_high:
        return "within noise"
    return "better" if d.better else "worse"


def _delta_rows(verdict: StepVerdict) -> list[dict[str, Any]]:
    rows = []
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


def _notes(run: _ArchivedRunData, trial_ids: Sequence[str]) -> list[str]:
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


def _ci_header(verdict: StepVerdict) -> str:
    d = verdict.objective
    return f"{d.confidence:.1%} CI".replace(".0%", "%") if d is not None and d.confidence is not None else "CI"


def _kept_means(playbook_doc: Mapping[str, Any]) -> str:
    """What "kept" meant for this run, from its archived playbook (the spec's defaults where it is silent)."""
    goals = playbook_doc.get("goals") if isinstance(playbook_doc.get("goals"), Mapping) else {}
    objective = goals.get("objective") if isinstance(goals, Mapping) else None
    trials = playbook_doc.get("trials") if isinstance(playbook_doc.get("trials"), Mapping) else {}
    min_effect = Objective.min_effect
    if isinstance(objective, Mapping) and "min_effect" in objective:
        with contextlib.suppress(ValueError):
            min_effect = parse_fraction(objective["min_effect"])
    confidence = trials.get("confidence", Trials.confidence) if isinstance(trials, Mapping) else Trials.confidence
    return kept_means(min_effect, float(confidence) if isinstance(confidence, (int, float)) else Trials.confidence)


def _steps(run: _ArchivedRunData, descriptions: Mapping[str, str], kept_text: str) -> list[dict[str, Any]]:
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
                "description": descriptions.get(v.step, ""),
                "more_trials": v.more_trials_needed,
                "interval": _interval_note(v),
                "ci_header": _ci_header(v),
                "deltas": _delta_rows(v),
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
                "anchor": "trials-loose",
                "trials": _trial_rows(run, loose, "throughput.output_tok_s"),
                "charts": _section_charts(run, [t for t in loose if t not in superseded], "throughput.output_tok_s"),
                "notes": _notes(run, loose),
                "nodes": any(run.trials[t].node for t in loose),
            }
        )
    return out


def _diagnosis(run: _ArchivedRunData) -> dict[str, Any]:
    d = run.manifest.get("diagnosis") or {}
    out: dict[str, Any] = {
        "memory_chart": "",
        "memory": [],
        "roofline_chart": "",
        "roofline": [],
        "notes": list(d.get("notes") or []),
        "model": [],
        "scheduler": [],
    }
    memory = d.get("memory") or {}
    if memory.get("weights_bytes") is not None:
        parts = [("weights", float(memory["weights_bytes"])), ("KV cache", float(memory.get("kv_bytes") or 0))]
        if memory.get("other_bytes") is not None:
            parts.append(("other", float(memory["other_bytes"])))
        out["memory_chart"] = charts.memory_bar(parts, memory.get("capacity_bytes"))
        out["memory"] = [
            ("device", str(memory.get("device", ""))),
            ("KV bytes per token", f"{memory.get('kv_bytes_per_token') or 0:,.0f}"),
            ("tokens in flight (estimate)", f"{memory.get('tokens_in_flight') or 0:,.0f}"),
            ("measured peak", fmt_bytes(memory.get("peak_bytes"))),
            ("capacity", fmt_bytes(memory.get("capacity_bytes"))),
            ("KV share of peak", fmt_pct(memory.get("kv_share"), signed=False)),
            ("peak / capacity", fmt_pct(memory.get("peak_frac"), signed=False)),
        ] + [("note", str(n)) for n in memory.get("notes") or []]
    roof = d.get("roofline") or {}
    if roof.get("floor_s"):
        out["roofline_chart"] = charts.roofline_bar(float(roof["floor_s"]), roof.get("achieved_tpot_s"))
        ratio = roof.get("achieved_over_floor")
        out["roofline"] = [
            ("bytes read per decode step", fmt_bytes(roof.get("bytes_per_step"))),
            (
                "memory bandwidth",
                f"{(roof.get('bandwidth_bytes_s') or 0) / 1e12:.2f} TB/s "
                f"({roof.get('bandwidth_source') or 'source not recorded'})",
            ),
            ("decode floor per token", f"{roof['floor_s'] * 1000:.2f} ms"),
            ("achieved TPOT", fmt_full("tpot.p50", roof.get("achieved_tpot_s"))),
            ("achieved / floor", "—" if ratio is None else f"{ratio:.2f}×"),
            ("bandwidth utilization", fmt_pct(roof.get("bandwidth_util"), signed=False)),
        ]
    model = d.get("model") or {}
    # A fact the engine or the model file did not give is left out, never printed as "None".
    out["model"] = [
        (k.replace("_", " "), f"{v:,}" if isinstance(v, int) else str(v)) for k, v in model.items() if v is not None
    ]
    out["scheduler"] = [(k.replace("_", " "), str(v)) for k, v in (d.get("scheduler") or {}).items() if v is not None]
    out["findings"] = [
        {
            "id": f.id,
            "severity": f.severity,
            "title": f.title,
            "evidence": f.evidence,
            "suggestion": f.suggestion,
            "ref": f.checklist_ref,
        }
        for f in run.archive.findings()
    ]
    return out


def _describe_length(dist: Any) -> str:
    if dist is None:
        return "not recorded"
    if not isinstance(dist, Mapping):
        return str(dist)
    kind = dist.get("kind")
    if kind == "fixed":
        return f"fixed {dist.get('value')}"
    if kind == "choice":
        return f"choice {list(dist.get('values') or [])}" + (
            f" weights {list(dist['weights'])}" if dist.get("weights") else ""
        )
    if kind == "uniform":
        return f"uniform [{dist.get('min')}, {dist.get('max')}]"
    spread = "std" if kind == "normal" else "sigma"
    return (
        f"{kind} mean {dist.get('mean')} {spread} {dist.get('std')}, clipped [{dist.get('min') or 1}, "
        f"{dist.get('max') or '∞'}]"
    )


def _archived_playbook(run: _ArchivedRunData) -> dict[str, Any]:
    for name in (RESOLVED_FILE, run.manifest["playbook"].get("file") or PLAYBOOK_FILE):
        try:
            doc = yaml.safe_load(run.archive.read_text(name) or "")
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict):
            return doc
    return {}


def _method(run: _ArchivedRunData, playbook_doc: Mapping[str, Any]) -> dict[str, Any]:
    final = run.manifest.get("final_config_id") or "baseline"
    config = run.configs.get("baseline") or run.configs.get(final)
    w = dict(config.workload) if config else {}
    if w.get("concurrency"):
        load = f"closed loop, {w['concurrency']} concurrent users"
    elif w.get("rate"):
        load = f"open loop, {w['rate']} req/s, {w.get('arrival', 'poisson')} arrivals" + (
            f", bursts of {w['burst']}" if (w.get("burst") or 1) > 1 else ""
        )
    else:
        load = "—"
    rows = [
        ("API", str(w.get("api", "—"))),
        ("input tokens", "dataset " + str(w["dataset"]) if w.get("dataset") else _describe_length(w.get("input"))),
        ("output tokens", _describe_length(w.get("output")) if not w.get("dataset") else "from the dataset"),
        ("load", load),
    ]
    if w.get("sweep"):
        rows.append(("sweep", str(list(w["sweep"]))))
    if w.get("prefix_tokens"):
        rows.append(("shared prefix", f"{w['prefix_tokens']} tokens × {w.get('prefix_groups', 1)} groups"))
    if (w.get("turns") or 1) > 1:
        rows.append(("turns", str(w["turns"])))
    rows += [
        ("streaming share", fmt_pct(w.get("streaming_fraction"), signed=False)),
        (
            "sampling",
            f"temperature {w.get('temperature', 0)}, ignore_eos {w.get('ignore_eos', 'not recorded')}, "
            f"max_tokens {w.get('max_tokens') or 'from the output distribution'}",
        ),
        (
            "warm-up (discarded)",
            f"{w.get('warmup_s') or 0:g} s"
            + (f" + {w['warmup_requests']} requests" if w.get("warmup_requests") else ""),
        ),
        (
            "measured window",
            f"{w['duration_s']:g} s"
            if w.get("duration_s")
            else (f"{w['num_requests']} requests" if w.get("num_requests") else "not recorded"),
        ),
        ("seed", str(w.get("seed", "—"))),
    ]
    trials: Mapping[str, Any] = playbook_doc["trials"] if isinstance(playbook_doc.get("trials"), Mapping) else {}
    overrides = run.manifest.get("overrides") or {}
    repeats = overrides.get("repeats") or trials.get("repeats", 3)
    trial_rows = [
        ("repeats per side", str(repeats) + (" (overridden)" if "repeats" in overrides else "")),
        (
            "order",
            "interleaved pairs, which side starts drawn per pair from the run id (an advantage of starting second "
            "is noise, not an effect); runs archived before that alternated A B | B A"
            if trials.get("interleave", True)
            else "blocked A A … B B …",
        ),
        ("each trial", "a fresh engine start; warm-up discarded"),
        ("sequential", str(trials.get("sequential", False))),
        ("confidence", str(trials.get("confidence", Trials.confidence))),
        (
            "what the verdicts are worth",
            error_rates_text(
                [v.verdict for v in run.verdicts],
                float(trials.get("confidence", Trials.confidence)),
                bool(trials.get("sequential", Trials.sequential)),
            ),
        ),
        (
            "guards",
            "a guard rejects only when its interval's better bound is past its tolerance (the regression is shown), "
            "holds when its worse bound is within it, and otherwise leaves the step inconclusive; a step's guard "
            "rejections are one family (Holm); a rate's tolerance is in percentage points, on a Newcombe interval "
            "over the pooled requests",
        ),
    ]
    if trials.get("pool_noise"):
        trial_rows.append(
            (
                "pooled noise",
                "each step's paired variance moderated toward the run's earlier steps (empirical Bayes, limma-style): "
                "more degrees of freedom when the steps' noise is alike, too narrow an interval for a step whose "
                "noise is larger than the rest's",
            )
        )
    measured = [run.requests(t).timeline for t in run.trials if run.trials[t].status == TRIAL_OK]
    histograms = charts.histograms(
        [
            ("input tokens per request", "tokens", _concat(line["input_tokens"] for line in measured)),
            ("output tokens per request", "tokens", _concat(line["output_tokens"] for line in measured)),
            ("gap between request sends", "ms", _concat(line["send_gap_s"] for line in measured) * 1000),
        ]
    )
    return {
        "workload": rows,
        "trials": trial_rows,
        "histograms": histograms,
        "overrides": [(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in overrides.items()],
        "definitions": METRIC_DEFINITIONS,
        "slo": ", ".join(f"{k} {v}" for k, v in (playbook_doc.get("goals", {}) or {}).get("slo", {}).items())
        if isinstance(playbook_doc.get("goals"), Mapping) and isinstance(playbook_doc["goals"].get("slo"), Mapping)
        else "",
    }


def _goals(run: _ArchivedRunData, playbook_doc: Mapping[str, Any]) -> dict[str, str]:
    goals: Mapping[str, Any] = playbook_doc["goals"] if isinstance(playbook_doc.get("goals"), Mapping) else {}
    objective: Mapping[str, Any] = goals["objective"] if isinstance(goals.get("objective"), Mapping) else {}
    obj = next((f"{k} {v}" for k, v in objective.items() if k in ("minimize", "maximize")), "")
    guards = []
    for g in goals.get("guards") or []:
        if isinstance(g, Mapping):
            guards.append(f"{g.get('metric')} within {g.get('tolerance')}")
    return {"objective": obj, "guards": "; ".join(guards) or "none"}


def build_context(archive: ArchivedRun, *, unverified: Sequence[str] = ()) -> dict[str, Any]:
    """Everything the template shows, as strings, lists and inline SVG; nothing here touches the network.

    `unverified`: what verification found wrong with a run rendered anyway (the page opens with it)."""
    run = _ArchivedRunData(archive)
    playbook_doc = _archived_playbook(run)
    descriptions = {
        str(s["name"]): str(s.get("description") or "")
        for s in playbook_doc.get("steps") or []
        if isinstance(s, Mapping) and "name" in s
    }
    manifest = run.manifest
    return {
        "header": _header(run),
        "glance": _glance(run),
        "goals": _goals(run, playbook_doc),
        "columns": [label for _, label in record_columns(run)],
        "record": _record_rows(run),
        "capacity": _capacity(run),
        "steps": _steps(run, descriptions, _kept_means(playbook_doc)),
        "diagnosis": _diagnosis(run),
        "method": _method(run, playbook_doc),
        "overridden": bool(manifest.get("overrides")),
        "shared_host": _shared_host(run),
        "audit": {
            "run_dir": str(archive.run_dir),
            "files": len(manifest.get("files") or {}),
            "manifest_sha256": manifest.get("manifest_sha256", ""),
            "report_error": manifest.get("report_error"),
            "signed": archive.signed(),
        },
        "unverified": list(unverified),
        "playbook_text": archive.read_text(manifest["playbook"].get("file") or PLAYBOOK_FILE) or "",
    }
