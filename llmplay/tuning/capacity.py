"""Capacity under SLO: the search for the most load one replica takes while a target share of requests meets
every goals.slo, each probe decided with an interval on its attainment.

The search (AIPerf's and guidellm's shape, decided statistically):
1. exponential probe: from the lower bound, double the load until a probe is infeasible or the upper bound is met;
2. bisection of the bracket between the feasible maximum and the infeasible minimum (geometric midpoints, since
   capacity is a ratio scale) until its relative width is within `precision`;
3. a re-check of the feasible maximum (one more run pooled with the first): a boundary that does not hold twice
   is demoted and the bisection goes on.

Each probe is one run of `probe_s` at one load. Its attainment's interval is the wider of a Wilson interval over
its requests and a t interval over batch means (consecutive runs of requests in send order): requests inside a
probe share a queue, so they are positively correlated near capacity and Wilson alone is too narrow, while batch
means with few requests per batch are too coarse far from it. A probe is feasible when the interval's low end
reaches the target, infeasible when its high end is below it, and indeterminate otherwise; only an indeterminate
probe is replicated (pooled), up to `replicates` runs. The whole search stops at `max_engine_s` of load; a bracket
still wider than the precision then is "indeterminate", never a number the data did not decide.

A step decided on capacity (`maximize: capacity.rate`) makes each trial one whole search, so the trial stays the
experimental unit: the runner interleaves baseline and candidate searches (A B B A), each repeat sends the same
request sequence on both sides (common random numbers, the trial's seed), and stats.decide puts the paired t
interval of stats.intervals on the per-repeat log ratio of the two boundaries, the rule every other metric uses.
A bootstrap over probe replicates would treat the runs of one search as independent draws of the boundary, which
they are not (one engine start, one bracket); a search without a boundary leaves its pair out, like a failed trial.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from llmplay.archive.capacity import (
    ABOVE_BOUNDS,
    BELOW_BOUNDS,
    FEASIBLE,
    FOUND,
    INDETERMINATE,
    INFEASIBLE,
    UNDECIDED,
    UNITS,
    CapacityResult,
    ProbeVerdict,
    fmt_load,
)
from llmplay.catalog import CAPACITY_METRICS
from llmplay.loadgen.records import LoadResult
from llmplay.metrics import Attainment, usd_per_1m_tokens_at_slo
from llmplay.spec import CapacitySpec, Goals, Workload
from llmplay.stats.capacity import attainment_interval, boundary_interval, crossing, run_batches

_MAX_RECHECKS = 3


@dataclass(frozen=True)
class ProbeRun:
    """One run of one load: its attainment, and what it cost."""

    load: float
    replicate: int
    attainment: Attainment
    duration_s: float  # the measured window
    engine_s: float  # load time it took, its drain included
    load_result: LoadResult  # the run's raw records, kept for the trial's archive


def classify(share: float | None, low: float, high: float, target: float) -> str:
    if share is None:
        return INDETERMINATE
    if target >= 1.0:
        # No interval's low end reaches 1 with finitely many requests: a 100% target is met only by every request.
        return FEASIBLE if share >= 1.0 else INFEASIBLE
    if low >= target:
        return FEASIBLE
    if high < target:
        return INFEASIBLE
    return INDETERMINATE


def pool(load: float, runs: Sequence[ProbeRun], first_run: int, target: float, level: float) -> ProbeVerdict:
    atts = [r.attainment for r in runs]
    share, low, high = attainment_interval(atts, level)
    n = sum(a.n for a in atts)
    weights = [a.n for a in atts]

    def mean_of(values: Sequence[float | None]) -> float | None:
        pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and w > 0]
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else None

    keys = list(atts[0].per_slo) if atts else []
    return ProbeVerdict(
        load=load,
        first_run=first_run,
        runs=len(runs),
        n_requests=n,
        attainment=share,
        ci_low=low,
        ci_high=high,
        verdict=classify(share, low, high, target),
        per_slo={k: mean_of([a.per_slo.get(k) for a in atts]) or 0.0 for k in keys},
        at_quantile_s={k: mean_of([a.at_quantile_s.get(k) for a in atts]) for k in keys},
        output_tok_s=mean_of([a.output_tok_s for a in atts]),
        req_s=mean_of([a.req_s for a in atts]),
        engine_s=sum(r.engine_s for r in runs),
        batches=tuple(float(b) for b in run_batches(atts)),
    )


# ------------------------------------------------------------------------------------------------- the search
Measure = Callable[[float, int], ProbeRun]


class _Search:
    def __init__(
        self, spec: CapacitySpec, slo_s: Mapping[str, float], measure: Measure, settle: Callable[[float], object]
    ):
        self.spec, self.slo_s, self.measure, self.settle = spec, dict(slo_s), measure, settle
        self.runs: dict[float, list[ProbeRun]] = {}
        self.first: dict[float, int] = {}
        self.order: list[float] = []
        self.spent_s = 0.0
        self.rechecked: set[float] = set()
        self.out_of_time = False

    def load(self, x: float) -> float:
        return float(max(1, round(x))) if self.spec.search == "concurrency" else float(x)

    def verdict(self, x: float) -> ProbeVerdict:
        return pool(x, self.runs[x], self.first[x], self.spec.attainment, self.spec.confidence)

    def _run(self, x: float) -> bool:
        """One more run at x; False when the time cap leaves no room for it."""
        settle = self.spec.settle_s if self.order else 0.0
        # The first run always happens: a search that measured nothing would have nothing to say.
        if self.order and self.spent_s + settle + self.spec.probe_s > self.spec.max_engine_s:
            self.out_of_time = True
            return False
        if settle:
            self.settle(settle)
            self.spent_s += settle
        run = self.measure(x, len(self.runs.get(x, ())))
        self.spent_s += run.engine_s
        self.first.setdefault(x, len(self.order))
        self.order.append(x)
        self.runs.setdefault(x, []).append(run)
        return True

    def probe(self, x: float, *, rising: bool = False) -> str | None:
        """The verdict at x, replicating only while it is indeterminate; None when no run at x fits the cap.

        `rising` (the exponential phase): a load whose point estimate meets the target is not replicated, since
        the next, higher probe decides it more cheaply (capacity is monotone: feasible there is feasible here)."""
        while x not in self.runs or (
            self.verdict(x).verdict == INDETERMINATE
            and len(self.runs[x]) < self.spec.replicates
            and not (rising and (self.verdict(x).attainment or 0.0) >= self.spec.attainment)
        ):
            if not self._run(x):
                break
        return self.verdict(x).verdict if x in self.runs else None

    def bracket(self) -> tuple[float | None, float | None, list[float]]:
        verdicts = {x: self.verdict(x).verdict for x in self.runs}
        infeasible = [x for x, v in verdicts.items() if v == INFEASIBLE]
        i_min = min(infeasible) if infeasible else None
        feasible = [x for x, v in verdicts.items() if v == FEASIBLE and (i_min is None or x < i_min)]
        f_max = max(feasible) if feasible else None
        zone = sorted(
            x
            for x, v in verdicts.items()
            if v == INDETERMINATE and (f_max is None or x > f_max) and (i_min is None or x < i_min)
        )
        return f_max, i_min, zone

    def resolved(self, f_max: float | None, i_min: float | None) -> bool:
        """The decided bracket is within the precision (or one user wide)."""
        if f_max is None or i_min is None:
            return False
        if self.spec.search == "concurrency" and i_min - f_max <= 1:
            return True
        return i_min / f_max - 1 <= self.spec.precision * (1 + 1e-9)

    def boundary(self) -> tuple[float | None, float | None, float | None]:
        """(estimate, CI low, CI high) of the crossing, the estimate clipped into the decided bracket."""
        probes = [self.verdict(x) for x in self.runs]
        f_max, i_min, _ = self.bracket()
        estimate = crossing(probes, self.spec.attainment)
        if estimate is not None and f_max is not None and i_min is not None:
            estimate = min(max(estimate, f_max), i_min)
        low, high = boundary_interval(probes, self.spec.attainment, self.spec.confidence)
        if low is not None and high is not None and f_max is not None and i_min is not None:
            # The decided probes bound the boundary too: it cannot be below a feasible load or above an infeasible one.
            low, high = max(low, f_max), min(high, i_min)
        return estimate, low, high

    def pinned(self) -> bool:
        """The boundary is known within the precision: the decided bracket is, or the crossing's interval is
        within +/- precision of the estimate."""
        f_max, i_min, _ = self.bracket()
        if self.resolved(f_max, i_min):
            return True
        if i_min is None:
            return False
        estimate, low, high = self.boundary()
        if estimate is None or low is None or high is None:
            return False
        p = self.spec.precision * (1 + 1e-9)
        return high / estimate - 1 <= p and 1 - low / estimate <= p

    def next_load(self) -> float | None:
        """The geometric midpoint of the widest gap next to a decided end of the bracket, or None when every such
        gap is within the precision (an indeterminate zone may remain between them)."""
        f_max, i_min, zone = self.bracket()
        if i_min is None:
            return None
        lower = f_max if f_max is not None else None
        gaps = []
        if zone:
            if lower is not None:
                gaps.append((lower, zone[0]))
            gaps.append((zone[-1], i_min))
        elif lower is not None:
            gaps.append((lower, i_min))
        # The gap holding the current crossing estimate first (that is where the boundary most likely is), then
        # the widest: with F=2, indeterminate 4..8, I=16 and the attainment crossing near 10, probe 11, not 3.
        estimate = crossing([self.verdict(x) for x in self.runs], self.spec.attainment)
        best = None
        for a, b in gaps:
            if self.resolved(a, b):
                continue
            mid = self.load(math.sqrt(a * b))
            if mid in (a, b) or mid in self.runs:
                continue
            holds = estimate is not None and a <= estimate <= b
            rank = (holds, b / a)
            if best is None or rank > best[1]:
                best = (mid, rank)
        return best[0] if best else None

    def run(self) -> CapacityResult:
        spec = self.spec
        low, high = self.load(spec.low), self.load(spec.high)
        x = low
        # 1. exponential probe, increasing load
        while True:
            verdict = self.probe(x, rising=x < high)
            if verdict is None or verdict == INFEASIBLE or x >= high:
                break
            x = min(self.load(x * 2), high)
        # 2. bisection; 3. a re-check of the feasible maximum (demoted if it does not hold twice); 4. while the
        # boundary is not pinned within the precision, one more run at the load nearest the estimate that has
        # runs left (the most informative place for it).
        while not self.out_of_time:
            mid = self.next_load()
            if mid is not None:
                if self.probe(mid) is None:
                    break
                continue
            f_max, i_min, zone = self.bracket()
            if i_min is None:
                break
            if f_max is not None and f_max not in self.rechecked and len(self.rechecked) < _MAX_RECHECKS:
                self.rechecked.add(f_max)
                if not self._run(f_max):
                    break
                continue
            if self.pinned():
                break
            lower = f_max if f_max is not None else (zone[0] if zone else i_min)
            estimate = self.boundary()[0] or math.sqrt(lower * i_min)
            edges = (*((f_max,) if f_max is not None else ()), *zone, i_min)
            open_loads = [z for z in edges if len(self.runs[z]) < spec.replicates]
            if not open_loads:
                break
            if not self._run(min(open_loads, key=lambda z: abs(math.log(z / estimate)))):
                break
        return self.result(low, high)

    def result(self, low: float, high: float) -> CapacityResult:
        spec = self.spec
        f_max, i_min, zone = self.bracket()
        verdicts = {x: self.verdict(x) for x in self.runs}
        notes = []
        if low in verdicts and verdicts[low].verdict == INFEASIBLE:
            status = BELOW_BOUNDS
        elif i_min is None and high in verdicts and verdicts[high].verdict == FEASIBLE:
            status = ABOVE_BOUNDS
        elif self.pinned():
            status = FOUND
        else:
            status = UNDECIDED
            why = (
                f"the time cap ({spec.max_engine_s:.0f} s of load) ran out"
                if self.out_of_time
                else f"attainment near the target stayed within noise after {spec.replicates} run(s) per load near it"
            )
            notes.append(f"not pinned within ±{spec.precision:.0%}: {why}")
        if zone:
            notes.append(
                "indeterminate at "
                + ", ".join(fmt_load(z) for z in zone)
                + f" {UNITS[spec.search]} (CI straddles the target)"
            )
        binding, binding_value = None, None
        broken = verdicts.get(i_min) if i_min is not None else None
        if broken is not None and broken.per_slo:
            binding = min(broken.per_slo, key=lambda k: broken.per_slo[k])
            binding_value = broken.at_quantile_s.get(binding)
        limits: dict[str, dict[str, float | None]] = {}
        for key in self.slo_s:
            loads = sorted(verdicts)
            breaks = next((x for x in loads if verdicts[x].per_slo.get(key, 1.0) < spec.attainment), None)
            held = [
                x
                for x in loads
                if verdicts[x].per_slo.get(key, 0.0) >= spec.attainment and (breaks is None or x < breaks)
            ]
            limits[key] = {"holds_until": max(held) if held else None, "breaks_at": breaks}
        settle = f"; {spec.settle_s:g} s settle between probes" if spec.settle_s else ""
        engine = (
            "one engine start for the whole search"
            if spec.engine == "shared"
            else "a fresh engine start for every probe"
        )
        order = (
            f"{engine}; exponential probe up from {fmt_load(low)} {UNITS[spec.search]} (doubling) until a probe "
            f"missed the target, then bisection of the bracket, a re-check of the feasible maximum, and more runs next to the "
            f"estimate while its interval was wider than ±{spec.precision:.0%}{settle}; "
            "runs in order: " + ", ".join(fmt_load(x) for x in self.order)
        )
        estimate, ci_low, ci_high = self.boundary() if i_min is not None else (None, None, None)
        if estimate is None and f_max is not None and i_min is not None:
            estimate = f_max
        if spec.search == "concurrency" and estimate is not None and f_max is not None:
            estimate = float(max(f_max, math.floor(estimate)))  # whole users
        return CapacityResult(
            estimate=estimate,
            ci=(ci_low, ci_high),
            search=spec.search,
            status=status,
            target=spec.attainment,
            confidence=spec.confidence,
            precision=spec.precision,
            low=low,
            high=high,
            slo_s=self.slo_s,
            feasible_max=f_max,
            infeasible_min=i_min,
            probes=tuple(verdicts[x] for x in sorted(verdicts)),
            runs=len(self.order),
            engine_s=self.spent_s,
            binding=binding,
            binding_value_s=binding_value,
            order=order,
            run_loads=tuple(self.order),
            notes=tuple(notes),
            per_slo_limits=limits,
        )


def search_capacity(
    spec: CapacitySpec,
    slo_s: Mapping[str, float],
    measure: Measure,
    *,
    settle: Callable[[float], object] = time.sleep,
) -> tuple[CapacityResult, dict[float, list[ProbeRun]]]:
    """Search the capacity with `measure(load, replicate)` running one probe; the result and every run by load."""
    search = _Search(spec, slo_s, measure, settle)
    result = search.run()
    return result, search.runs


def boundary_run(result: CapacityResult, runs: Mapping[float, Sequence[ProbeRun]]) -> ProbeRun | None:
    """The run whose raw records stand for the configuration at its capacity: the feasible maximum's last run, else
    the highest feasible load's, else the lowest load's (a configuration below its bounds)."""
    for load in (result.capacity, result.feasible_max, min(runs, default=None)):
        if load is not None and runs.get(load):
            return runs[load][-1]
    return None


def capacity_goal(goals: Goals) -> bool:
    """Whether a goal names a capacity metric: then every trial of the run is a capacity search."""
    named = [goals.objective.metric, *(g.metric for g in goals.gates), *(g.metric for g in goals.guards)]
    return goals.capacity is not None and any(m in CAPACITY_METRICS for m in named)


# Replicates of one load draw different request sequences (else a replicate repeats the same requests and adds
# no information); replicate r of every load and of both sides of an A/B uses the same one (common random numbers).
_REPLICATE_SEED_STRIDE = 7919


def probe_workload(workload: Workload, spec: CapacitySpec, load: float, replicate: int) -> Workload:
    """The workload of one probe: the playbook's requests at `load` for probe_s, after the workload's own warm-up
    at that load (so each probe is measured in its steady state, not while the queue fills)."""
    rate, concurrency = (float(load), None) if spec.search == "rate" else (None, int(load))
    return replace(
        workload,
        rate=rate,
        concurrency=concurrency,
        duration_s=spec.probe_s,
        num_requests=None,
        sweep=(),
        seed=workload.seed + _REPLICATE_SEED_STRIDE * replicate,
    )


def capacity_summary(result: CapacityResult, usd_per_hour: float) -> dict[str, float]:
    """The capacity.* figures of one search for a trial's summary (absent ones left out: not measured)."""
    out: dict[str, float] = {
        "capacity.runs": float(result.runs),
        "capacity.engine_s": result.engine_s,
        "capacity.censored": float(result.censored),
    }
    if result.capacity is not None:
        out[f"capacity.{result.search}"] = result.capacity
    if result.output_tok_s is not None and result.capacity is not None:
        out["capacity.output_tok_s"] = result.output_tok_s
        cost = usd_per_1m_tokens_at_slo(usd_per_hour, result.output_tok_s)
        if cost is not None:
            out["cost.usd_per_1m_tokens_at_slo"] = cost
    return out
