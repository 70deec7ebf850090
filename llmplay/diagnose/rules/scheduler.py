"""§6 scheduler rules: continuous batching, load beyond the engine's batch, prefix caching, a persistent queue."""

from __future__ import annotations

from llmplay.diagnose.rule import Outcome, Rule, RunFacts, pct
from llmplay.diagnose.steps import S_BATCH, S_CONT_BATCH, S_PREFIX, S_SCALE, S_WEIGHT_QUANT, steps

# Without a per-sample share of time queued, a mean of one waiting request counts as "persistently".
_PERSISTENT_MEAN_WAITING = 1.0
# A prefix-cache hit rate below this, with prefixes to share, means they are not being reused.
_PREFIX_HIT_FLOOR = 0.1
# A workload repeating less of its prompt tokens than this does not count as sharing prefixes.
_REUSE_FLOOR = 0.05

NO_CONTINUOUS_BATCHING = Rule(
    "sched.no_continuous_batching",
    "§6",
    "continuous batching off: the engine runs static batches",
    lambda f: f.scheduler.continuous_batching is False,
    lambda f: Outcome("warn", "Continuous batching is off", "engine runs static batches", steps(S_CONT_BATCH)),
)


def _over_batch(f: RunFacts) -> bool:
    batch, users = f.scheduler.max_batch, f.scheduler.concurrency
    return bool(batch and users and users > batch)


def _over_batch_finding(f: RunFacts) -> Outcome:
    batch, users = f.scheduler.max_batch or 0, f.scheduler.concurrency or 0
    return Outcome(
        "info",
        "Load concurrency exceeds the engine's max batch",
        f"concurrency {users} > max batch {batch}: {users - batch} requests wait in the engine queue",
        steps(S_BATCH, S_SCALE),
    )


CONCURRENCY_OVER_BATCH = Rule(
    "sched.concurrency_over_batch",
    "§6",
    "load concurrency above the engine's max batch: requests wait in the engine queue",
    _over_batch,
    _over_batch_finding,
)


def _prefix_reuse(f: RunFacts) -> tuple[bool, str]:
    """Whether the workload reuses prefixes, and how much: its own measured reuse (shared prefixes, conversations
    resending their history), or the configured shared prefix where an older summary has no such figure."""
    expected = f.summary.get("prefix_reuse.expected")
    if expected is not None:
        return expected >= _REUSE_FLOOR, f"the workload repeats {pct(expected)} of its prompt tokens"
    shared = f.scheduler.shared_prefix_tokens
    return shared > 0, f"{shared} shared prefix tokens per request"


def _prefix_hit_rate(f: RunFacts) -> float | None:
    """What the engine served from its prefix cache: as the responses said, else its /metrics hit rate."""
    achieved = f.summary.get("prefix_reuse.achieved")
    return achieved if achieved is not None else f.telemetry.get("engine.prefix_cache_hit_rate")


PREFIX_CACHE_OFF = Rule(
    "sched.prefix_cache_off",
    "§6",
    "prompts share a prefix but prefix caching is off",
    lambda f: f.scheduler.prefix_caching is False and _prefix_reuse(f)[0],
    lambda f: Outcome("info", "Prompts share a prefix but prefix caching is off", _prefix_reuse(f)[1], steps(S_PREFIX)),
)


def _prefix_misses(f: RunFacts) -> bool:
    if f.scheduler.prefix_caching is False or not _prefix_reuse(f)[0]:
        return False
    hit, expected = _prefix_hit_rate(f), f.summary.get("prefix_reuse.expected")
    if hit is None:
        return False
    # Against the workload's own reuse where measured (half of it served from cache is a miss), else a floor.
    return hit < expected / 2 if expected is not None else hit < _PREFIX_HIT_FLOOR


PREFIX_CACHE_MISSES = Rule(
    "sched.prefix_cache_misses",
    "§6",
    "shared prefixes miss the prefix cache (served under half the workload's own reuse, or a hit rate below 10%)",
    _prefix_misses,
    lambda f: Outcome(
        "info",
        "Shared prefixes are not being hit in the prefix cache",
        f"prefix-cache hit rate {pct(_prefix_hit_rate(f) or 0)} where {_prefix_reuse(f)[1]}",
        steps(S_PREFIX),
    ),
)


def _queue_persistent(f: RunFacts) -> bool:
    share = f.telemetry.get("engine.waiting_nonzero_frac")
    if share is not None:
        return share >= f.thresholds.queue_persistent_frac
    mean = f.telemetry.get("engine.waiting_mean")
    return mean is not None and mean >= _PERSISTENT_MEAN_WAITING


def _queue_finding(f: RunFacts) -> Outcome:
    share = f.telemetry.get("engine.waiting_nonzero_frac")
    mean, most = f.telemetry.get("engine.waiting_mean"), f.telemetry.get("engine.waiting_max")
    evidence = f"waiting queue > 0 in {pct(share)} of samples" if share is not None else ""
    if mean is not None:
        evidence += (
            f"{'; ' if evidence else ''}mean {mean:.1f}"
            + (f", max {most:.0f}" if most is not None else "")
            + " waiting"
        )
    return Outcome(
        "warn",
        "Requests queue persistently in the engine",
        evidence,
        steps(S_BATCH, S_PREFIX, S_WEIGHT_QUANT, S_SCALE),
    )


QUEUE_PERSISTENT = Rule(
    "queue.persistent",
    "§6",
    "requests queue persistently in the engine (waiting > 0 in half the samples, or 1 waiting on average)",
    _queue_persistent,
    _queue_finding,
)

RULES = (NO_CONTINUOUS_BATCHING, CONCURRENCY_OVER_BATCH, PREFIX_CACHE_OFF, PREFIX_CACHE_MISSES, QUEUE_PERSISTENT)
