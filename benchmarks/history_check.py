"""How often `history --check` alarms when nothing changed, and how often it catches a regression: simulated nights
judged by `history.judge.judge`, the function `history --check` decides with, on index entries as the archive holds
them (one value per trial and metric).

The accepted reference is a run of `--ref-trials` trials on the reference's engine image, with `--ref-retests` more
runs of that image in the history (re-tests of the reference, on other days) and `--nights` earlier nightly runs on
other images. Tonight's run has `trials` trials on a new image. Every trial's P95 TTFT is exp(level + day + sigma z)
(sigma .15: the project's own real A/A median) and its output tokens/s exp(level + day + .045 z); `day` (sd tau)
moves every trial of one run alike, a day-to-day shift. The playbook is vllm-cpu-tiny's: P95 TTFT objective with a
10 % min_effect, throughput within 15 %, gate P95 TTFT < G with the true level 2.5 % under G ("gates within 2.5 %").

Reported per row, over `--references` accepted references of `--nights-per-reference` nights each:
- false alarm: nights with nothing changed that exit 4 (any goal or gate); worst reference: the highest rate of one
  accepted reference (the unluckiest draw of its day)
- caught +20%: nights with a true +20 % P95 TTFT that exit 4 through the objective (shown beyond its 10 %), and
  through anything (the gate 2.5 % above the old level fails too)
- not judged: nights that exit 5 (too few trials for an interval); "no regression" on 1 trial without an interval:
  must be 0

    PYTHONPATH=. .venv/bin/python benchmarks/history_check.py    # 16 rows, about 6 minutes on 2 loaded cores
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import numpy as np

from llmplay.archive.run_entry import Goals, GuardGoal, RunEntry
from llmplay.history.judge import HISTORY, TRIALS, GateLimit, judge

GOALS = Goals(
    GuardGoal("ttft.p95", 0.10, True, False),
    (GuardGoal("throughput.output_tok_s", 0.15, False, False),),
    0.95,
    ("ttft.p95",),
    0,
)
TTFT_S, TOK_S = 0.5, 200.0
GATE = GateLimit("ttft.p95 < G", "ttft.p95", "<", TTFT_S * 1.025, True)  # the true level 2.5 % under the gate
GUARD_SIGMA = 0.045


def _entry(run_id: str, hour: int, image: str, ttft: Sequence[float], tok: Sequence[float]) -> RunEntry:
    return RunEntry(
        run_id=run_id,
        path=run_id,
        playbook="vllm-cpu-tiny",
        playbook_version="1.1",
        playbook_sha256="",
        kind="retest",
        status="complete",
        started_utc=f"2026-{1 + hour // 600:02d}-{1 + (hour // 24) % 25:02d}T{hour % 24:02d}:{hour % 60:02d}:00Z",
        engine="vllm",
        engine_version=image,
        image_digest=image,
        llmplay_version="0.1",
        host="h",
        hardware="CPU only",
        config_id="baseline",
        config_fingerprint="f",
        config={},
        goals=GOALS,
        gates=(),
        verified=True,
        problems=(),
        figures={"ttft.p95": tuple(ttft), "throughput.output_tok_s": tuple(tok)},
    )


def _run(rng: np.random.Generator, n: int, sigma: float, tau: float, change: float = 0.0) -> tuple[list, list]:
    day = tau * rng.standard_normal()
    ttft = TTFT_S * np.exp(math.log1p(change) + day + sigma * rng.standard_normal(n))
    tok = TOK_S * np.exp(-day + GUARD_SIGMA * rng.standard_normal(n))
    return list(ttft), list(tok)


def _history(rng: np.random.Generator, args: argparse.Namespace, sigma: float, tau: float) -> list[RunEntry]:
    """The accepted reference (first), its re-tests, and earlier nights on other images."""
    runs = [_entry("ref", 0, "img-ref", *_run(rng, args.ref_trials, sigma, tau))]
    for i in range(args.ref_retests):
        runs.append(_entry(f"ref-{i}", 1 + i, "img-ref", *_run(rng, args.ref_trials, sigma, tau)))
    for i in range(args.nights):
        runs.append(_entry(f"night-{i}", 100 + i, f"img-{i}", *_run(rng, args.trials_history, sigma, tau)))
    return runs


def row(args: argparse.Namespace, trials: int, noise: str, sigma: float, tau: float, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    alarms, caught, caught_objective, unjudged, silent_single = [], 0, 0, 0, 0
    checks = 0
    for _ in range(args.references):
        history = _history(rng, args, sigma, tau)
        reference = history[0]
        per_reference = 0
        for night in range(args.nights_per_reference):
            for change in (0.0, 0.20):
                tonight = _entry(f"t{night}", 5000 + night, "img-new", *_run(rng, trials, sigma, tau, change))
                judged = judge(reference, tonight, [GATE], noise=noise, entries=[*history, tonight])
                regression, cannot = bool(judged.regressions), bool(judged.unjudged)
                if change == 0.0:
                    per_reference += regression
                    checks += 1
                    unjudged += cannot and not regression
                else:
                    caught += regression
                    caught_objective += any(r.startswith("objective") for r in judged.regressions)
                if trials == 1 and not regression and not cannot and noise == TRIALS:
                    silent_single += 1
        alarms.append(per_reference / args.nights_per_reference)
    total = args.references * args.nights_per_reference
    return {
        "false": float(np.mean(alarms)),
        "worst": float(np.max(alarms)),
        "caught": caught / total,
        "caught_objective": caught_objective / total,
        "unjudged": unjudged / checks,
        "silent_single": silent_single,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--references", type=int, default=40)
    parser.add_argument("--nights-per-reference", type=int, default=25)
    parser.add_argument("--ref-trials", type=int, default=10)
    parser.add_argument("--ref-retests", type=int, default=9, help="runs of the reference's image besides it")
    parser.add_argument("--nights", type=int, default=10, help="earlier nights on other images")
    parser.add_argument("--trials-history", type=int, default=10, help="trials of each earlier night")
    parser.add_argument("--seed", type=int, default=38)
    args = parser.parse_args()
    total = args.references * args.nights_per_reference
    print(
        f"history --check: {args.references} references x {args.nights_per_reference} nights = {total} checks a "
        f"row and change; reference {args.ref_trials} trials + {args.ref_retests} re-tests of its image, "
        f"{args.nights} earlier nights of {args.trials_history} trials; P95 TTFT min_effect 10 %, gate 2.5 % above "
        "the true level"
    )
    print(
        f"{'trials':>6} {'noise':>8} {'sigma':>5} {'tau':>5} {'false alarm':>11} {'worst ref':>9} "
        f"{'caught +20%: objective':>22} {'any':>6} {'not judged':>10} {'1 trial silent':>14}"
    )
    started = time.perf_counter()
    for tau in (0.0, 0.05):
        for trials in (1, 3, 10, 20):
            for noise in (TRIALS, HISTORY):
                r = row(args, trials, noise, 0.15, tau, args.seed + trials * 7 + int(tau * 100))
                print(
                    f"{trials:>6} {noise:>8} {0.15:>5.2f} {tau:>5.2f} {r['false']:>11.1%} {r['worst']:>9.1%} "
                    f"{r['caught_objective']:>22.1%} {r['caught']:>6.1%} {r['unjudged']:>10.1%} "
                    f"{int(r['silent_single']):>14}",
                    flush=True,
                )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
