"""A finished capacity search as the archive keeps it: every probe's pooled verdict, the bracket and boundary, what
bound it, and the words the console and the report use for them (tuning.capacity runs the search and makes it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmplay.catalog import fmt_full

FEASIBLE, INFEASIBLE, INDETERMINATE = "feasible", "infeasible", "indeterminate"
FOUND, UNDECIDED, ABOVE_BOUNDS, BELOW_BOUNDS = "found", "indeterminate", "above_bounds", "below_bounds"
STATUSES = (FOUND, UNDECIDED, ABOVE_BOUNDS, BELOW_BOUNDS)
UNITS = {"rate": "req/s", "concurrency": "users"}
SLO_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "E2EL"}


@dataclass(frozen=True)
class ProbeVerdict:
    """Every run at one load pooled, and what they decided."""

    load: float
    first_run: int  # position of its first run in the search, for "how probes were ordered"
    runs: int
    n_requests: int
    attainment: float | None
    ci_low: float | None  # None: an archive from before the interval was kept
    ci_high: float | None
    verdict: str
    per_slo: Mapping[str, float]
    at_quantile_s: Mapping[str, float | None]
    output_tok_s: float | None
    req_s: float | None
    engine_s: float
    batches: tuple[float, ...] = ()  # batch-mean attainments, every run's, for the boundary's bootstrap

    def as_dict(self) -> dict[str, object]:
        return {
            "batches": list(self.batches),
            "load": self.load,
            "first_run": self.first_run,
            "runs": self.runs,
            "n_requests": self.n_requests,
            "attainment": self.attainment,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "verdict": self.verdict,
            "per_slo": dict(self.per_slo),
            "at_quantile_s": dict(self.at_quantile_s),
            "output_tok_s": self.output_tok_s,
            "req_s": self.req_s,
            "engine_s": self.engine_s,
        }


@dataclass(frozen=True)
class CapacityResult:
    """A finished search: the bracket, what bound it, every probe, and what it cost."""

    search: str  # rate | concurrency
    status: str  # found | indeterminate | above_bounds | below_bounds
    target: float
    confidence: float
    precision: float
    low: float
    high: float
    slo_s: Mapping[str, float]
    feasible_max: float | None
    infeasible_min: float | None
    probes: tuple[ProbeVerdict, ...]  # by load
    runs: int  # load runs, replicates and the re-check included
    engine_s: float  # load time of the search, settles included
    binding: str | None  # the SLO that broke first (lowest attainment at the infeasible minimum)
    binding_value_s: float | None  # its figure at the target quantile there
    order: str  # how the probes were ordered, in words
    run_loads: tuple[float, ...] = ()  # every run's load, in the order run
    notes: tuple[str, ...] = ()
    per_slo_limits: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    estimate: float | None = None  # where the fitted attainment crosses the target, inside the bracket
    ci: tuple[float | None, float | None] = (None, None)  # the boundary's bootstrap interval at `confidence`
    # The bracket and the binding SLO in the words the archive holds (capacity.json's boundary_text and
    # binding_sentence): a search read back shows what it said when written; "" for one just measured.
    said_boundary: str = ""
    said_binding: str = ""

    @property
    def unit(self) -> str:
        return UNITS[self.search]

    @property
    def capacity(self) -> float | None:
        """The figure capacity.* reports: once the bracket [feasible max, infeasible min] is within the precision,
        the load where the attainment crosses the target inside it (estimate); the upper bound when even it met
        the SLOs (a lower bound on capacity, flagged censored); None otherwise: an undecided bracket, or a
        configuration that misses the SLOs at the lower bound, has no number to give."""
        if self.status == FOUND:
            return self.estimate if self.estimate is not None else self.feasible_max
        if self.status == ABOVE_BOUNDS:
            return self.high
        return None

    @property
    def censored(self) -> bool:
        return self.status == ABOVE_BOUNDS

    def probe_at(self, load: float | None) -> ProbeVerdict | None:
        return next((p for p in self.probes if load is not None and p.load == load), None)

    @property
    def output_tok_s(self) -> float | None:
        """Output throughput at the capacity (capacity.output_tok_s): the boundary probes' throughput per unit of
        load, interpolated to the capacity like the capacity itself; the feasible maximum's when that is all."""
        cap = self.capacity
        if self.status == ABOVE_BOUNDS:
            top = self.probe_at(self.high)
            return top.output_tok_s if top else None
        below, above = self.probe_at(self.feasible_max), self.probe_at(self.infeasible_min)
        if cap is None or below is None or below.output_tok_s is None:
            return None
        if above is None or above.output_tok_s is None or above.load == below.load:
            return below.output_tok_s
        frac = math.log(cap / below.load) / math.log(above.load / below.load)
        return below.output_tok_s + frac * (above.output_tok_s - below.output_tok_s)

    def boundary_text(self) -> str:
        """The bracket in words: "6.0 req/s [6.0, 6.3]", "≥ 16 req/s", "< 0.5 req/s", "undecided in [4, 8]"."""
        u = self.unit
        if self.status == ABOVE_BOUNDS:
            return f"≥ {fmt_load(self.high)} {u} (met the SLOs at the upper bound)"
        if self.status == BELOW_BOUNDS:
            return f"< {fmt_load(self.low)} {u} (missed the SLOs at the lower bound)"
        lo = fmt_load(self.feasible_max) if self.feasible_max is not None else f"< {fmt_load(self.low)}"
        hi = fmt_load(self.infeasible_min) if self.infeasible_min is not None else f"> {fmt_load(self.high)}"
        ci = f", CI [{fmt_load(self.ci[0])}, {fmt_load(self.ci[1])}]" if self.ci[0] is not None else ""
        if self.status == FOUND:
            return f"{fmt_load(self.capacity)} {u} (feasible max {lo}, infeasible min {hi}{ci})"
        return f"indeterminate: between {lo} and {hi} {u}{ci}, not pinned within ±{self.precision:.0%} in the time cap"

    @property
    def boundary_words(self) -> str:
        return self.said_boundary or self.boundary_text()

    @property
    def binding_words(self) -> str:
        return self.said_binding or self.binding_sentence()

    def binding_sentence(self) -> str:
        """ "TTFT breaks at 6.2 req/s (P95 TTFT 812 ms, SLO 500 ms); TPOT would hold until 9 req/s"."""
        if self.binding is None:
            probed = max((p.load for p in self.probes), default=None)
            return "no SLO broke within the bounds" + (f" (up to {fmt_load(probed)} {self.unit})" if probed else "")
        q = f"P{self.target * 100:g}"
        label = SLO_LABELS.get(self.binding, self.binding)
        observed = "" if self.binding_value_s is None else f"{q} {label} {fmt_full('ttft.p95', self.binding_value_s)}, "
        parts = [
            f"{label} breaks at {fmt_load(self.infeasible_min)} {self.unit} "
            f"({observed}SLO {fmt_full('ttft.p95', self.slo_s.get(self.binding))})"
        ]
        for key, limits in self.per_slo_limits.items():
            if key == self.binding:
                continue
            other = SLO_LABELS.get(key, key)
            holds, breaks = limits.get("holds_until"), limits.get("breaks_at")
            if breaks is None and holds is not None:
                parts.append(f"{other} would hold until at least {fmt_load(holds)} {self.unit} (held at every probe)")
            elif holds is not None:
                parts.append(f"{other} would hold until {fmt_load(holds)} {self.unit} (breaks by {fmt_load(breaks)})")
            elif breaks is not None:
                parts.append(f"{other} also breaks by {fmt_load(breaks)} {self.unit}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, object]:
        """The search as capacity.json (and `bench --capacity --json`) hold it."""
        return {
            "search": self.search,
            "unit": self.unit,
            "status": self.status,
            "capacity": self.capacity,
            "censored": self.censored,
            "target": self.target,
            "confidence": self.confidence,
            "precision": self.precision,
            "bounds": [self.low, self.high],
            "slo_s": dict(self.slo_s),
            "estimate": self.estimate,
            "feasible_max": self.feasible_max,
            "infeasible_min": self.infeasible_min,
            "bracket": [self.feasible_max, self.infeasible_min],
            "boundary_ci": list(self.ci),
            "output_tok_s": self.output_tok_s,
            "binding": self.binding,
            "binding_value_s": self.binding_value_s,
            "binding_sentence": self.binding_sentence(),
            "boundary_text": self.boundary_text(),
            "per_slo_limits": {k: dict(v) for k, v in self.per_slo_limits.items()},
            "probes": [p.as_dict() for p in self.probes],
            "runs": self.runs,
            "run_loads": list(self.run_loads),
            "engine_s": self.engine_s,
            "order": self.order,
            "notes": list(self.notes),
        }


def fmt_load(x: float | None) -> str:
    """A load as boundaries and orders show it (3 significant digits); "—" when there is none."""
    return "—" if x is None else f"{x:.3g}"
