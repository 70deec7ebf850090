"""The shape of a checklist rule and what every rule reads: the run's facts, the scheduler's settings, thresholds.

A rule is one object (id, CHECKLIST.md section, what it checks, a condition, the finding it makes), so each can be
tested alone and the report can list every rule the diagnosis checked, fired or not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llmplay.archive.model import Finding, Scalar
from llmplay.diagnose.memory import MemoryBreakdown
from llmplay.diagnose.roofline import Roofline
from llmplay.diagnose.steps import Suggestion
from llmplay.spec import Gate


@dataclass(frozen=True)
class Thresholds:
    peak_frac: float = 0.90  # §4: above → memory-bound first
    kv_share: float = 0.60  # §4: above → concurrency / length limited
    util_high: float = 0.80  # §6
    util_low: float = 0.50  # §6
    queue_persistent_frac: float = 0.50  # share of samples with waiting > 0 that counts as "persistently"
    ttft_tail_ratio: float = 3.0  # without latency targets: P95/P50 TTFT this large signals queueing
    decode_headroom: float = 1.5  # achieved TPOT / floor above this: headroom left (§5)
    throughput_ok_bandwidth_util: float = 0.5  # without a throughput target: decode at ≥ half the roofline


CHECKLIST_THRESHOLDS = Thresholds()


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return int(number) if math.isfinite(number) else None


def _fraction(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class SchedulerFacts:
    """What the engine and the load were told (CHECKLIST §6); None: not known for this engine or archive."""

    continuous_batching: bool | None = None
    max_batch: int | None = None  # max_num_seqs / llama.cpp --parallel
    concurrency: int | None = None  # closed-loop users of the load
    rate: float | None = None  # open-loop requests per second
    prefix_caching: bool | None = None
    shared_prefix_tokens: int = 0  # per request, from workload.prefix_tokens
    kv_preallocated_frac: float | None = None  # vLLM / SGLang / TRT-LLM reserve this share of memory up front

    @classmethod
    def from_mapping(cls, raw: Mapping[str, object]) -> SchedulerFacts:
        """An archived diagnosis's `scheduler` dict (or a hand-written one): an unknown or odd value is "not known"."""
        return cls(
            continuous_batching=_flag(raw.get("continuous_batching")),
            max_batch=_count(raw.get("max_batch")),
            concurrency=_count(raw.get("concurrency")),
            rate=_fraction(raw.get("rate")),
            prefix_caching=_flag(raw.get("prefix_caching")),
            shared_prefix_tokens=_count(raw.get("shared_prefix_tokens")) or 0,
            kv_preallocated_frac=_fraction(raw.get("kv_preallocated_frac")),
        )

    def as_mapping(self) -> dict[str, Scalar | None]:
        """The diagnosis's `scheduler` facts: kv_preallocated_frac only for the engines that preallocate."""
        out: dict[str, Scalar | None] = {
            "continuous_batching": self.continuous_batching,
            "max_batch": self.max_batch,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "prefix_caching": self.prefix_caching,
            "shared_prefix_tokens": self.shared_prefix_tokens,
        }
        if self.kv_preallocated_frac is not None:
            out["kv_preallocated_frac"] = self.kv_preallocated_frac
        return out


LATENCY_PREFIXES = ("ttft.", "tpot.", "itl.", "e2el.")


def measured_only(values: Mapping[str, object]) -> dict[str, float]:
    """The finite numbers of a summary or telemetry mapping: a None, NaN or non-number is "not measured", which
    every rule already reads as an absent key (so it skips, never crashes)."""
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def targets_from_gates(gates: Sequence[Gate]) -> dict[str, float]:
    """Latency limits (`ttft.p95 < 0.5`) and throughput floors (`throughput.output_tok_s > 3000`)
    from playbook gates (spec.Gate), the yardsticks for "latency high" and "tokens/s low"."""
    out: dict[str, float] = {}
    for g in gates:
        if (g.metric.startswith(LATENCY_PREFIXES) and g.op in ("<", "<=")) or (
            g.metric.startswith("throughput.") and g.op in (">", ">=")
        ):
            out[g.metric] = g.value
    return out


@dataclass(frozen=True)
class RunFacts:
    """Everything a rule may read about one configuration; an absent key or None means "not measured".

    summary: the metrics summary (ttft.p50, tpot.p95, throughput.output_tok_s, errors.rate, ...), finite numbers only.
    telemetry: TelemetrySeries.summary(), finite numbers only.
    targets: latency limits / throughput floors (targets_from_gates).
    notes: telemetry notes, quoted when a rule could not be evaluated (e.g. "no NVML: ...")."""

    summary: Mapping[str, float] = field(default_factory=dict)
    telemetry: Mapping[str, float] = field(default_factory=dict)
    breakdown: MemoryBreakdown | None = None
    roofline: Roofline | None = None
    scheduler: SchedulerFacts = SchedulerFacts()
    targets: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    prefill_mfu_frac: float | None = None
    thresholds: Thresholds = Thresholds()

    def gpu_utilization(self) -> tuple[float, str] | None:
        """(utilization, what measured it): SM activity from GPM when there is one, NVML's utilization else."""
        sm = self.telemetry.get("gpu.sm_activity_mean")
        if sm is not None:
            return sm, "SM activity (GPM)"
        util = self.telemetry.get("gpu.util_mean")
        return (util, "GPU utilization (NVML)") if util is not None else None

    def peak_over_threshold(self) -> bool:
        b = self.breakdown
        return b is not None and b.peak_frac is not None and b.peak_frac > self.thresholds.peak_frac


@dataclass(frozen=True)
class Outcome:
    """What a rule that fired says: the finding without the id and section the rule itself carries."""

    severity: str  # info | warn | critical
    title: str
    evidence: str  # the numbers that triggered it
    suggestion: Suggestion = field(default_factory=Suggestion)  # next step(s), cheapest first (CHECKLIST §7)


@dataclass(frozen=True)
class Rule:
    """One checklist rule. `id` is the id of the finding it makes, named after its CHECKLIST.md section (memory.*
    §4, roofline.* §5, sched.* / queue.* / gpu.* §6); `title` says what it checks, for the report's method."""

    id: str
    section: str  # "§4", "§5", "§6"
    title: str
    condition: Callable[[RunFacts], bool]
    finding: Callable[[RunFacts], Outcome]

    def check(self, facts: RunFacts) -> Finding | None:
        if not self.condition(facts):
            return None
        said = self.finding(facts)
        candidates = said.suggestion.candidates(self.id, said.evidence)
        return Finding(
            self.id, said.severity, said.title, said.evidence, said.suggestion.text, self.section, candidates
        )

    def listing(self) -> dict[str, str]:
        """The rule as the diagnosis lists it: {id, section, title}."""
        return {"id": self.id, "section": self.section, "title": self.title}


def pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"
