"""The checklist made executable: the table of rules, and the diagnosis that checks each against one configuration.

Everything here is a pure function of plain inputs (numbers, dicts, frozen dataclasses), so the report can re-run a
diagnosis on any archived run. Thresholds are CHECKLIST.md §4 and §6; each finding carries the numbers that triggered
it and the next step from the §7 catalogue, cheapest first. The rules themselves live in diagnose.rules, one
module per checklist section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmplay.archive.model import Finding
from llmplay.diagnose.memory import MemoryBreakdown
from llmplay.diagnose.roofline import Roofline
from llmplay.diagnose.rule import (
    CHECKLIST_THRESHOLDS,
    Rule,
    RunFacts,
    SchedulerFacts,
    Thresholds,
    measured_only,
    targets_from_gates,
)
from llmplay.diagnose.rules import gpu as gpu_rules
from llmplay.diagnose.rules import memory as memory_rules
from llmplay.diagnose.rules import roofline as roofline_rules
from llmplay.diagnose.rules import scheduler as scheduler_rules

# Every rule, in the checklist's order: §4 memory, §5 roofline, §6 scheduler and queue, §6 GPU utilization.
RULES: tuple[Rule, ...] = (*memory_rules.RULES, *roofline_rules.RULES, *scheduler_rules.RULES, *gpu_rules.RULES)

__all__ = ["RULES", "SchedulerFacts", "Thresholds", "diagnose", "measured_only", "rule_listing", "targets_from_gates"]

_SEVERITY_ORDER = {"critical": 0, "warn": 1, "info": 2}


def rule_listing(rules: Sequence[Rule] = RULES) -> list[dict[str, str]]:
    """Every rule a diagnosis checks, fired or not, as {id, section, title}: the diagnosis's `rules`."""
    return [rule.listing() for rule in rules]


def diagnose(
    summary: Mapping[str, float],
    telemetry: Mapping[str, float],
    breakdown: MemoryBreakdown | None,
    roofline: Roofline | None,
    scheduler_info: SchedulerFacts | Mapping[str, object] | None = None,
    *,
    targets: Mapping[str, float] | None = None,
    notes: Sequence[str] = (),
    prefill_mfu_frac: float | None = None,
    thresholds: Thresholds = CHECKLIST_THRESHOLDS,
) -> list[Finding]:
    """Findings for one configuration, most severe first (the checklist's order within a severity).

    summary: the metrics summary (ttft.p50, ttft.p95, tpot.p95, throughput.output_tok_s, errors.rate, ...).
    telemetry: TelemetrySeries.summary() — absent keys mean "not measured" and skip the rules needing them.
    scheduler_info: what the engine was told (SchedulerFacts; an archived diagnosis's dict is read into one).
    targets: latency limits / throughput floors, see targets_from_gates.
    notes: telemetry notes, quoted when a rule could not be evaluated (e.g. "no NVML: ...").
    """
    if scheduler_info is None:
        sched = SchedulerFacts()
    elif isinstance(scheduler_info, SchedulerFacts):
        sched = scheduler_info
    else:
        sched = SchedulerFacts.from_mapping(scheduler_info)
    facts = RunFacts(
        summary=measured_only(summary),
        telemetry=measured_only(telemetry),
        breakdown=breakdown,
        roofline=roofline,
        scheduler=sched,
        targets=dict(targets or {}),
        notes=tuple(notes),
        prefill_mfu_frac=prefill_mfu_frac,
        thresholds=thresholds,
    )
    found = [finding for rule in RULES if (finding := rule.check(facts)) is not None]
    found.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    return found
