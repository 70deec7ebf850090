"""The most power any decision rule can have when it borrows noise it cannot fully vet: a linear-programming bound.

A step of n pairs has its own mean log-ratio d and its own noise estimate s (n - 1 degrees of freedom); the borrowed
noise (the run's other steps, or the history) is an estimate h with k degrees of freedom. Whether the borrowed noise
is today's (ratio r = 1) or quieter (r < 1: a history half as noisy, or the other steps when this one is 3x noisier)
is unknown to the rule; that is why it vets. Any rule that behaves the same at every noise level (the noise is never
known, so the rule can only read ratios) sees just (d / h, s / h) and decides by a region of that plane, symmetric in
the sign of d (kept one way, rejected the other). The issue's two requirements, as one problem:

    maximise   P(kept | true change -10 %, r = 1)
    subject to P(kept or rejected | no change, r = 1) <= 5 %
               P(kept or rejected | no change, r = r_quiet) <= cap

The plane is cut into cells, the three densities integrated over the unseen scale, and the problem solved as a linear
programme over each cell's decision probability, through its two-variable dual (any dual point bounds the power from
above, so the figure can only be generous). By the Neyman-Pearson lemma with two constraints the optimum is a
likelihood-ratio region; no rule of this kind can beat it, whatever its vetting. Unconstrained, it is the t test at
the pooled degrees of freedom, which the first row of each table reproduces as a check.

    PYTHONPATH=. .venv/bin/python benchmarks/power_bound.py        # the table in RESULTS.md (about a minute)
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import minimize_scalar

from llmplay.stats.power import t_power, z_power

LEVEL = 0.05


@dataclass(frozen=True)
class Design:
    label: str
    pairs: int  # the step's own pairs (its own noise has pairs - 1 degrees of freedom)
    borrowed_df: int  # the borrowed noise's degrees of freedom
    quiet_ratio: float  # borrowed noise SD / today's when the borrowing is wrong
    sigma: float = 0.05  # per-trial log-SD; a pair's log-ratio then has SD sigma * sqrt(2)
    effect: float = -0.10


def _grid(lo: float, hi: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Log-spaced cell midpoints and widths."""
    edges = np.geomspace(lo, hi, n + 1)
    return (edges[1:] * edges[:-1]) ** 0.5, np.diff(edges)


def cell_masses(design: Design, shift: float, ratio: float, u_cells: int = 360, v_cells: int = 220) -> np.ndarray:
    """P(cell) of (u, v) = (-d / h, s / h) on the half-plane where d < 0 (the kept side), in units of the pair SD.

    `shift` is the true mean of d in pair SDs, `ratio` the borrowed noise's SD over today's."""
    n, k = design.pairs, design.borrowed_df
    u_mid, u_w = _grid(1e-3, 60.0, u_cells)
    v_mid, v_w = _grid(1e-3, 60.0, v_cells)
    t_mid, t_w = _grid(1e-3 * ratio, 40.0 * ratio, 500)  # the borrowed noise's value h
    # density of h: k h^2 / ratio^2 ~ chi2_k
    p_h = stats.chi2.pdf(k * t_mid**2 / ratio**2, k) * 2 * k * t_mid / ratio**2
    out = np.empty((u_cells, v_cells))
    for i, u in enumerate(u_mid):
        d = -u * t_mid  # d = -u h
        p_d = stats.norm.pdf(d, loc=shift, scale=1 / math.sqrt(n))
        s = v_mid[:, None] * t_mid[None, :]  # s = v h
        p_s = stats.chi2.pdf((n - 1) * s**2, n - 1) * 2 * (n - 1) * s
        # Jacobian of (d, s, h) -> (u, v, h) is h^2
        out[i] = (p_s * (p_d * p_h * t_mid**2 * t_w)[None, :]).sum(axis=1)
    return out * u_w[:, None] * v_w[None, :]


@dataclass(frozen=True)
class Bound:
    cap: float
    power: float


def best_power(design: Design, caps: list[float]) -> list[Bound]:
    """The highest power of any sign-symmetric, scale-free rule whose A/A false decisions are at most LEVEL with the
    borrowed noise right and at most each cap with it quiet."""
    pair_sd = design.sigma * math.sqrt(2)
    shift = math.log1p(design.effect) / pair_sd
    alt = cell_masses(design, shift, 1.0).ravel()
    null_right = cell_masses(design, 0.0, 1.0).ravel()
    null_quiet = cell_masses(design, 0.0, design.quiet_ratio).ravel()
    # cells no scenario reaches only make the programme ill-conditioned
    live = np.maximum(alt, np.maximum(null_right, null_quiet)) > 1e-12
    alt, null_right, null_quiet = alt[live], null_right[live], null_quiet[live]
    out = []
    for cap in caps:
        out.append(Bound(cap, _dual_bound(alt, null_right, null_quiet, LEVEL / 2, cap / 2)))
    return out


def _dual_bound(alt: np.ndarray, null_a: np.ndarray, null_b: np.ndarray, cap_a: float, cap_b: float) -> float:
    """The programme's value through its dual, min over l >= 0 of sum(max(0, alt - l_a null_a - l_b null_b)) +
    l_a cap_a + l_b cap_b: convex in (l_a, l_b), and every l gives an upper bound on the power (weak duality), so
    an inexact minimum can only overstate what a rule could reach. One side of a symmetric rule: half of each
    false-decision allowance."""

    def dual(la: float, lb: float) -> float:
        return float(np.maximum(0.0, alt - la * null_a - lb * null_b).sum() + la * cap_a + lb * cap_b)

    def best_a(lb: float) -> float:
        res = minimize_scalar(lambda x: dual(math.exp(x), lb), bounds=(-12.0, 12.0), method="bounded")
        return min(float(res.fun), dual(0.0, lb))

    res = minimize_scalar(lambda x: best_a(math.exp(x)), bounds=(-12.0, 12.0), method="bounded")
    return min(float(res.fun), best_a(0.0))


def oracles(design: Design) -> tuple[float, float, float]:
    """The t test at the design's own df, with the borrowed df added (right borrowing), and with the noise known."""
    pair_sd = design.sigma * math.sqrt(2)
    gap = abs(math.log1p(design.effect))
    se = pair_sd / math.sqrt(design.pairs)
    own = t_power(gap, se, design.pairs - 1, 1 - LEVEL)
    pooled = t_power(gap, se, design.pairs - 1 + design.borrowed_df, 1 - LEVEL)
    return own, pooled, z_power(gap, se, 1 - LEVEL)


DESIGNS = (
    Design("one step, history of 30 df, a history half as noisy", 3, 30, 0.5),
    Design("5th of 5 steps, `noise: run` (8 df from the others), this step 3x noisier", 3, 8, 1 / 3),
)
CAPS = [0.05, 0.065, 0.10, 0.15, 0.20, 1.0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    for design in DESIGNS:
        own, pooled, known = oracles(design)
        print(f"\n{design.label}: t oracle own {own:.1%}, borrowed {pooled:.1%}, known variance {known:.1%}")
        print("| A/A false allowed with the borrowed noise wrong | best power with it right |")
        print("|---|---|")
        for bound in best_power(design, CAPS):
            cap = "any (no constraint)" if bound.cap >= 1 else f"{bound.cap:.1%}"
            print(f"| {cap} | {bound.power:.1%} |")


if __name__ == "__main__":
    main()
