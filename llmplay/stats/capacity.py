"""The capacity search's statistics: one probe's attainment interval over its requests and batch means, where the
attainment crosses the target across probes (an isotonic fit on log load), and that boundary's bootstrap interval.
tuning.capacity searches with them; the module's docstring there says why both intervals are taken."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from llmplay.metrics import Attainment, batch_shares
from llmplay.stats.intervals import t_mean_interval, wilson_interval

_REQUESTS_PER_BATCH = 10
_MAX_BATCHES = 10
_MIN_BATCHES = 5


class LoadAttainment(Protocol):
    """A probed load's pooled attainment, as the crossing reads it (archive.capacity.ProbeVerdict is one)."""

    @property
    def load(self) -> float: ...
    @property
    def attainment(self) -> float | None: ...
    @property
    def n_requests(self) -> int: ...
    @property
    def batches(self) -> tuple[float, ...]: ...


@dataclass(frozen=True)
class AttainmentAt:
    """A bootstrap redraw of one probe: its load and request count with a redrawn share."""

    load: float
    attainment: float | None
    n_requests: int
    batches: tuple[float, ...] = ()


def run_batches(runs: Sequence[Attainment]) -> np.ndarray:
    """Each run's batch means (at least _REQUESTS_PER_BATCH requests a batch), runs one after the other."""
    parts = [
        batch_shares(r.met, min(_MAX_BATCHES, r.n // _REQUESTS_PER_BATCH))
        for r in runs
        if r.n >= 2 * _REQUESTS_PER_BATCH
    ]
    return np.concatenate(parts) if parts else np.array([])


def attainment_interval(runs: Sequence[Attainment], level: float) -> tuple[float | None, float, float]:
    """(share, low, high) of the pooled runs' attainment at `level`: the wider of Wilson over requests and t over
    batch means (tuning.capacity's docstring says why both)."""
    met = np.concatenate([r.met for r in runs]) if runs else np.array([])
    n = int(met.size)
    if n == 0:
        return None, 0.0, 1.0
    share = float(met.mean())
    low, high = wilson_interval(int(met.sum()), n, level)
    batches = run_batches(runs)
    # Fewer than _MIN_BATCHES batch means say nothing usable about the spread (a t quantile on 1 degree of freedom
    # is 12.7): the interval is then Wilson's alone, the correlation inside the probe unaccounted for.
    if batches.size >= _MIN_BATCHES:
        t_low, t_high = t_mean_interval(batches, level)
        low, high = min(low, t_low), max(high, t_high)
    # Batch means weight runs by batch, the share by request: keep the interval around the share it is printed with.
    return share, max(0.0, min(low, share)), min(1.0, max(high, share))


def crossing(probes: Sequence[LoadAttainment], target: float) -> float | None:
    """The load where attainment crosses `target`: a decreasing isotonic fit (pool-adjacent-violators, weighted
    by requests) of the probes' attainment against load, interpolated on log load between the last load at or
    above the target and the next; None when the fit never crosses it."""
    points = [
        (p.load, p.attainment, float(max(p.n_requests, 1)))
        for p in sorted(probes, key=lambda p: p.load)
        if p.attainment is not None
    ]
    blocks: list[list[float]] = []  # [weighted sum, weight, first index, last index]
    for i, (_, a, w) in enumerate(points):
        blocks.append([a * w, w, i, i])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            merged = blocks.pop()
            blocks[-1][0] += merged[0]
            blocks[-1][1] += merged[1]
            blocks[-1][3] = merged[3]
    fitted = [0.0] * len(points)
    for block in blocks:
        for k in range(int(block[2]), int(block[3]) + 1):
            fitted[k] = block[0] / block[1]
    for k in range(len(points) - 1):
        f1, f2 = fitted[k], fitted[k + 1]
        if f1 >= target > f2:
            x1, x2 = points[k][0], points[k + 1][0]
            return math.exp(math.log(x1) + (f1 - target) / (f1 - f2) * (math.log(x2) - math.log(x1)))
    return None


_BOOTSTRAP = 400


def boundary_interval(
    probes: Sequence[LoadAttainment], target: float, level: float, seed: int = 0
) -> tuple[float | None, float | None]:
    """The crossing's interval at `level`: a bootstrap that redraws each probe's attainment from its own batch
    means (the unit the per-probe interval rests on; a probe with too few requests for batches is redrawn as a
    binomial share) and refits. A redraw whose fit never crosses counts at the edge it fell past (the lowest or
    highest load probed), so a boundary the probes do not pin down gets a wide interval, not a narrow one."""
    measured = [p for p in sorted(probes, key=lambda p: p.load) if p.attainment is not None]
    if len(measured) < 2:
        return None, None
    rng = np.random.default_rng(seed)
    lo_load, hi_load = measured[0].load, measured[-1].load
    draws = []
    for _ in range(_BOOTSTRAP):
        redrawn: list[LoadAttainment] = []
        for p in measured:
            if len(p.batches) >= 2:
                share = float(rng.choice(np.asarray(p.batches), size=len(p.batches)).mean())
            else:
                share = float(rng.binomial(max(p.n_requests, 1), p.attainment or 0.0)) / max(p.n_requests, 1)
            redrawn.append(AttainmentAt(p.load, share, p.n_requests))
        x = crossing(redrawn, target)
        if x is None:
            x = hi_load if all((q.attainment or 0) >= target for q in redrawn[:1]) else lo_load
        draws.append(math.log(x))
    tail = (1 - level) / 2
    return float(math.exp(np.quantile(draws, tail))), float(math.exp(np.quantile(draws, 1 - tail)))
