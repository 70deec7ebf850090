"""Simulated engines with known response surfaces, for TuningRun's `measure_trial` seam: a function of the engine's
knobs gives each trial's true latency, throughput, errors, queue and prefix reuse, and the trial draws its requests
around them with noise (per round drift shared by its trials, per trial and per request noise). The run's own
statistics, diagnosis and archive then see them as they would a real engine's."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from llmplay.spec import Config, Scalar
from llmplay.stats.samples import TrialSample
from llmplay.tuning.trial import TrialResult
from llmplay_testing.synthetic import scripted_trial


@dataclass(frozen=True)
class Response:
    """What an engine configuration truly does under the load (the simulated engine's ground truth)."""

    ttft_s: float
    tpot_s: float = 0.02
    output_tok_s: float = 100.0
    error_rate: float = 0.0
    waiting_frac: float = 0.0  # share of telemetry samples with requests waiting in the engine
    waiting_mean: float = 0.0
    preemptions: float = 0.0
    reuse_expected: float | None = None
    reuse_achieved: float | None = None
    kv_usage_max: float | None = None


# The engine's knobs and the load's closed-loop users (1 for the unloaded probe) -> what the engine does.
Surface = Callable[[Mapping[str, Scalar], int], Response]


class SimulatedEngine:
    """A MeasureTrial whose trials follow `surface`; `engine_s` adds up each trial's simulated wall time."""

    def __init__(
        self,
        surface: Surface,
        seed: int = 0,
        requests: int = 200,
        noise: float = 0.03,
        trial_s: float = 15.0,
        output_tokens: int = 32,
    ):
        self.surface, self.requests, self.noise, self.trial_s = surface, requests, noise, trial_s
        self.output_tokens = output_tokens
        self.seed = seed
        self.trials = 0
        self.engine_s = 0.0

    def __call__(self, config: Config, *, trial_id: str, step: str | None, role: str, repeat: int) -> TrialResult:
        truth = self.surface(config.engine.args, config.workload.concurrency or 1)
        self.trials += 1
        self.engine_s += self.trial_s
        # One round's trials share a drift (the same request sequence on the same host minutes apart).
        drift = np.random.default_rng([self.seed, config.workload.seed, repeat]).normal(0, self.noise)
        # Each trial's own draws come from what the trial is, not from when it is called: which side of a pair goes
        # first is drawn from the run id, and a resumed run re-measures only some trials, so draws taken in call order
        # would change a test's data, and its verdict, from one run to the next.
        rng = np.random.default_rng([self.seed, config.workload.seed, repeat, _trial_key(config, step, role)])
        level = np.exp(drift + rng.normal(0, self.noise / 2))
        n = self.requests
        ttft = rng.lognormal(np.log(truth.ttft_s * level), 0.25, n)
        tpot = rng.lognormal(np.log(truth.tpot_s * level), 0.1, n)
        out = np.full(n, float(self.output_tokens))
        e2el = ttft + tpot * (out - 1)
        tok_s = truth.output_tok_s / level
        duration = float(out.sum() / tok_s)
        errors = int(rng.binomial(n, truth.error_rate)) if truth.error_rate > 0 else 0
        values = {"ttft": ttft, "tpot": tpot, "e2el": e2el, "itl": tpot, "output_tokens": out}
        values |= {"total_tokens": out * 4, "good": np.ones(n)}
        scalars: dict[str, float] = {
            "engine.waiting_nonzero_frac": truth.waiting_frac,
            "engine.waiting_mean": truth.waiting_mean,
            "engine.preemptions": truth.preemptions,
        }
        if truth.kv_usage_max is not None:
            scalars["engine.kv_cache_usage_max"] = truth.kv_usage_max
        if truth.reuse_expected is not None:
            scalars["prefix_reuse.expected"] = truth.reuse_expected
            scalars["prefix_reuse.achieved"] = truth.reuse_achieved or 0.0
        summary = {
            "ttft.p95": float(np.percentile(ttft, 95)),
            "throughput.output_tok_s": float(out.sum() / duration),
            "errors.rate": errors / n,
            **scalars,
        }
        trial = scripted_trial(
            config, trial_id=trial_id, step=step, role=role, repeat=repeat, summary=summary, wall_s=self.trial_s
        )
        sample = TrialSample(duration, values, n + errors, errors, scalars=scalars, repeat=repeat)
        return TrialResult(trial, sample=sample)


def _trial_key(config: Config, step: str | None, role: str) -> int:
    """A stable number for what a trial measures: the engine's knobs, the load's users, its step and side."""
    knobs = sorted((name, repr(value)) for name, value in config.engine.args.items())
    return zlib.crc32(repr((knobs, config.workload.concurrency, step, role)).encode())


def slots_of(args: Mapping[str, Scalar], default: int = 4) -> int:
    """The decode slots a llama.cpp-like engine runs with: `parallel` (or `max_num_seqs`), -1 or unset its default."""
    value = args.get("parallel", args.get("max_num_seqs"))
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
