"""The report's diagnosis of the final configuration: memory breakdown, decode roofline, findings, model facts,
scheduler, and the checklist rules that were evaluated."""

from __future__ import annotations

from collections.abc import Sequence

from llmplay.archive.model import Diagnosis, Finding, MemoryFacts, RooflineFacts
from llmplay.catalog import fmt_bytes, fmt_full, fmt_pct
from llmplay.report import charts


def _memory(memory: MemoryFacts) -> tuple[str, list[tuple[str, str]]]:
    if memory.weights_bytes is None:
        return "", []
    parts = [("weights", memory.weights_bytes), ("KV cache", memory.kv_bytes or 0.0)]
    if memory.other_bytes is not None:
        parts.append(("other", memory.other_bytes))
    rows = [
        ("device", memory.device),
        ("KV bytes per token", f"{memory.kv_bytes_per_token or 0:,.0f}"),
        ("tokens in flight (estimate)", f"{memory.tokens_in_flight or 0:,.0f}"),
        ("measured peak", fmt_bytes(memory.peak_bytes)),
        ("capacity", fmt_bytes(memory.capacity_bytes)),
        ("KV share of peak", fmt_pct(memory.kv_share, signed=False)),
        ("peak / capacity", fmt_pct(memory.peak_frac, signed=False)),
    ] + [("note", n) for n in memory.notes]
    return charts.memory_bar(parts, memory.capacity_bytes), rows


def _roofline(roof: RooflineFacts) -> tuple[str, list[tuple[str, str]]]:
    ratio = roof.achieved_over_floor
    rows = [
        ("bytes read per decode step", fmt_bytes(roof.bytes_per_step)),
        (
            "memory bandwidth",
            f"{(roof.bandwidth_bytes_s or 0) / 1e12:.2f} TB/s ({roof.bandwidth_source or 'source not recorded'})",
        ),
        ("decode floor per token", f"{roof.floor_s * 1000:.2f} ms"),
        ("achieved TPOT", fmt_full("tpot.p50", roof.achieved_tpot_s)),
        ("achieved / floor", "—" if ratio is None else f"{ratio:.2f}×"),
        ("bandwidth utilization", fmt_pct(roof.bandwidth_util, signed=False)),
    ]
    return charts.roofline_bar(roof.floor_s, roof.achieved_tpot_s), rows


def diagnosis(d: Diagnosis, findings: list[Finding]) -> dict[str, object]:
    memory_chart, memory = _memory(d.memory) if d.memory is not None else ("", [])
    roofline_chart, roofline = _roofline(d.roofline) if d.roofline is not None else ("", [])
    return {
        "memory_chart": memory_chart,
        "memory": memory,
        "roofline_chart": roofline_chart,
        "roofline": roofline,
        "notes": list(d.notes),
        # A fact the engine or the model file did not give is left out (the reader drops it), never "None".
        "model": [(k.replace("_", " "), f"{v:,}" if isinstance(v, int) else str(v)) for k, v in d.model.items()],
        "scheduler": [(k.replace("_", " "), str(v)) for k, v in d.scheduler.items()],
        "findings": finding_rows(findings),
    }


def finding_rows(findings: Sequence[Finding]) -> list[dict[str, str]]:
    """The findings as the findings table shows them (the run's report and the tuning session's)."""
    return [
        {
            "id": f.id,
            "severity": f.severity,
            "title": f.title,
            "evidence": f.evidence,
            "suggestion": f.suggestion,
            "ref": f.checklist_ref,
        }
        for f in findings
    ]


def rules_checked(d: Diagnosis) -> list[tuple[str, str]]:
    """The checklist rules the diagnosis evaluated, as (section, title); empty for archives that did not list them."""
    return [(f"{r.section} {r.id}".strip(), r.title) for r in d.rules or ()]
