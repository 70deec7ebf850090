"""Every metric path: its unit, which direction is better, its label, how to show it, and the lists that pick from it."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from llmplay import units


@dataclass(frozen=True)
class MetricInfo:
    path: str
    unit: str  # "s" | "tok/s" | "req/s" | "usd" | "fraction" | "bytes" | "count"
    lower_is_better: bool
    label: str

    def parse_value(self, raw: object) -> float:
        if self.unit == "s":
            return units.parse_duration_s(raw, unit_required=True)
        if self.unit == "usd":
            return units.parse_money_usd(raw)
        if self.unit == "fraction":
            return units.parse_fraction(raw)
        return units.parse_plain_number(raw)

    def format(self, value: float | None) -> str:
        if value is None:
            return "not measured"
        if self.unit == "s":
            return f"{value * 1000:.1f} ms"
        if self.unit == "usd":
            return f"${value:.4g}"
        if self.unit == "fraction":
            return f"{value * 100:.1f}%"
        if self.unit == "bytes":
            return f"{value / 2**30:.2f} GiB"
        return f"{value:.4g} {self.unit}" if self.unit != "count" else f"{value:.4g}"


_LATENCY_LABELS = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2el": "E2E latency",
    "ttft_nonstream": "TTFT (non-streamed)",
    "ttft_content": "TTFT to first text",
    "queue_wait": "client queue wait",
}
_STATS = ("mean", "std", "p50", "p90", "p95", "p99")

METRICS: dict[str, MetricInfo] = {}
for _name, _label in _LATENCY_LABELS.items():
    for _stat in _STATS:
        _path = f"{_name}.{_stat}"
        METRICS[_path] = MetricInfo(_path, "s", True, f"{_stat.upper()} {_label}")
for _info in (
    MetricInfo("throughput.output_tok_s", "tok/s", False, "output tokens/s"),
    MetricInfo("throughput.total_tok_s", "tok/s", False, "total tokens/s"),
    MetricInfo("throughput.req_s", "req/s", False, "requests/s"),
    MetricInfo("goodput.req_s", "req/s", False, "goodput"),
    MetricInfo("cost.usd_per_1m_tokens", "usd", True, "$ per 1M tokens"),
    MetricInfo("memory.peak_frac", "fraction", True, "peak memory / capacity"),
    MetricInfo("memory.peak_bytes", "bytes", True, "peak memory"),
    MetricInfo("memory.kv_share", "fraction", True, "KV-cache share of memory"),
    MetricInfo("errors.rate", "fraction", True, "error rate"),
    MetricInfo("engine.preemptions", "count", True, "preemptions"),
    MetricInfo("engine.kv_cache_usage_max", "fraction", True, "peak KV-cache usage"),
    MetricInfo("engine.waiting_mean", "count", True, "mean waiting requests"),
    MetricInfo("capacity.rate", "req/s", False, "capacity under SLO (req/s)"),
    MetricInfo("capacity.concurrency", "users", False, "capacity under SLO (users)"),
    MetricInfo("capacity.output_tok_s", "tok/s", False, "output tokens/s at the SLO boundary"),
    MetricInfo("cost.usd_per_1m_tokens_at_slo", "usd", True, "$ per 1M tokens at the SLO boundary"),
    MetricInfo("quality.exact_match", "fraction", False, "probes answered exactly as the baseline"),
    MetricInfo("quality.token_agreement", "fraction", False, "baseline tokens reproduced before divergence"),
    MetricInfo("quality.logprob_shift", "nats", True, "mean |change| of the baseline tokens' log-probabilities"),
    # The workload's own reuse is no better or worse; the engine's share of it served from cache is better higher.
    MetricInfo("prefix_reuse.expected", "fraction", False, "prefix reuse expected"),
    MetricInfo("prefix_reuse.achieved", "fraction", False, "prefix reuse achieved"),
    MetricInfo("engine.prefix_cache_hit_rate", "fraction", False, "prefix-cache hit rate (/metrics)"),
    MetricInfo("session.count", "count", False, "conversations"),
    MetricInfo("session.turns_mean", "count", False, "turns per conversation"),
    MetricInfo("session.duration_s.mean", "s", True, "MEAN conversation time"),
    MetricInfo("session.duration_s.p50", "s", True, "P50 conversation time"),
    MetricInfo("session.duration_s.p95", "s", True, "P95 conversation time"),
):
    METRICS[_info.path] = _info

# TTFT by turn index (metrics.session_figures): ttft_turn.<k>.p50 / .mean for the k-th turn of a conversation.
_TURN_METRIC = re.compile(r"^ttft_turn\.([1-9][0-9]*)\.(p50|mean)$")


def turn_ttft_p50s(summary: Mapping[str, float | None]) -> list[tuple[int, float]]:
    """(turn, P50 TTFT s) of each turn a summary measured, in turn order; a turn whose requests all fell in the
    warm-up has none."""
    turns = []
    for key, value in summary.items():
        m = _TURN_METRIC.match(key)
        if m and m.group(2) == "p50" and (number := measured(value)) is not None:
            turns.append((int(m.group(1)), number))
    return sorted(turns)


def metric_info(path: str) -> MetricInfo | None:
    info = METRICS.get(path)
    if info is None and (m := _TURN_METRIC.match(path)):
        return MetricInfo(path, "s", True, f"{m.group(2).upper()} TTFT of turn {m.group(1)}")
    return info


# ---------------------------------------------------------------------------------------------- metric lists
# The figures only a capacity search measures (tuning.capacity): a goal naming one makes each trial a search of
# the load one replica takes under goals.slo; each trial gives one value, the unit its intervals rest on.
CAPACITY_METRICS: tuple[str, ...] = (
    "capacity.rate",
    "capacity.concurrency",
    "capacity.output_tok_s",
    "cost.usd_per_1m_tokens_at_slo",
)
# Rates of requests (count over count, and 0 is a normal value): a guard on one takes percentage points, decided with
# an interval for a difference of two proportions over the pooled requests (stats.intervals.newcombe_difference).
RATE_METRICS: tuple[str, ...] = ("errors.rate",)
# The greedy-probe figures (stats.quality): measured per configuration against the baseline's answers, outside the
# timed window; their tolerances are absolute in the metric's unit, not relative.
QUALITY_METRICS: tuple[str, ...] = ("quality.exact_match", "quality.token_agreement", "quality.logprob_shift")
# The metrics the archive keeps for the tuning record: each configuration's row and each step's deltas
# (stats.decide, tuning.run); the console and the HTML report show the subsets below.
RECORD_METRICS: tuple[str, ...] = (
    "ttft.p50",
    "ttft.p95",
    "ttft.p99",
    "tpot.p95",
    "itl.p99",
    "e2el.p95",
    "throughput.output_tok_s",
    "throughput.req_s",
    "goodput.req_s",
    "errors.rate",
    "cost.usd_per_1m_tokens",
    "memory.peak_frac",
    "memory.kv_share",
    "prefix_reuse.expected",
    "prefix_reuse.achieved",
)
# The figures of a conversation workload (turns > 1) a report shows beside the per-request ones; TTFT by turn
# index adds ttft_turn.<k>.p50 for each turn measured (metrics.session_figures).
SESSION_METRICS: tuple[str, ...] = (
    "session.count",
    "session.turns_mean",
    "session.duration_s.p50",
    "session.duration_s.p95",
)
# The tuning record as printed on the console after a run (commands.run).
TUNING_RECORD_METRICS: tuple[str, ...] = (
    "ttft.p50",
    "ttft.p95",
    "tpot.p95",
    "itl.p99",
    "e2el.p95",
    "throughput.output_tok_s",
    "throughput.req_s",
    "goodput.req_s",
    "cost.usd_per_1m_tokens",
    "errors.rate",
    "prefix_reuse.expected",
    "prefix_reuse.achieved",
)
# What `llmplay compare` shows of each run's final configuration, besides the goals' own metrics.
COMPARED_METRICS: tuple[str, ...] = (
    "ttft.p50",
    "ttft.p95",
    "ttft.p99",
    "tpot.p50",
    "tpot.p95",
    "itl.p50",
    "itl.p99",
    "e2el.p50",
    "e2el.p95",
    "throughput.output_tok_s",
    "throughput.total_tok_s",
    "throughput.req_s",
    "goodput.req_s",
    "errors.rate",
    "cost.usd_per_1m_tokens",
    "memory.peak_frac",
    "memory.peak_bytes",
    "memory.kv_share",
    "engine.kv_cache_usage_max",
    "engine.preemptions",
)
# The HTML report's tuning-record table as CHECKLIST §3 asks for: (metric path, column header). "memory.peak"
# is no metric of its own: the report shows peak bytes with their share of capacity, or the engine's RSS.
PEAK_MEMORY_COLUMN = "memory.peak"
REPORT_RECORD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ttft.p50", "TTFT P50"),
    ("ttft.p95", "TTFT P95"),
    ("ttft.p99", "TTFT P99"),
    ("tpot.p95", "TPOT P95"),
    ("itl.p99", "ITL P99"),
    ("e2el.p95", "E2EL P95"),
    ("throughput.output_tok_s", "output tok/s"),
    ("throughput.req_s", "req/s"),
    ("goodput.req_s", "goodput req/s"),
    (PEAK_MEMORY_COLUMN, "peak memory"),
    ("memory.kv_share", "KV share"),
    ("cost.usd_per_1m_tokens", "$ / 1M tok"),
    ("errors.rate", "errors"),
    # The workload's reuse beside the engine's: what prefix caching could serve, and what it did.
    ("prefix_reuse.expected", "reuse expected"),
    ("prefix_reuse.achieved", "reuse achieved"),
)

# What each figure means (DESIGN.md's definitions), as the report's method section states them.
METRIC_DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "TTFT",
        "request handed to the transport (connection set-up included) → first SSE message with non-empty choices, "
        "text or not, as vllm bench serve (streamed requests).",
    ),
    (
        "TTFT to first text",
        "the same clock → first chunk carrying text, content or reasoning (ttft_content); it differs from TTFT "
        "when a server sends its role-only chunk before the first token.",
    ),
    (
        "E2EL",
        "the same clock → last message with non-empty choices (an empty finish chunk counts; usage-only and "
        "[DONE] do not).",
    ),
    ("TPOT", "per request (E2EL − TTFT) / (output tokens − 1), requests with more than one output token."),
    ("ITL", "every gap between successive messages with non-empty choices, pooled over requests."),
    (
        "Output tokens",
        "the server's usage figures; where the server sent none, the generated text counted with the prompts' tokenizer "
        "(an estimate when that tokenizer is approximate), never the number of chunks (the trial notes say which).",
    ),
    (
        "Throughput",
        "completed requests, output tokens, and input + output tokens ÷ benchmark duration; "
        "the duration excludes warm-up.",
    ),
    ("Goodput", "requests per second that met every per-request SLO."),
    ("Percentiles", "P50/P90/P95/P99 with numpy's linear interpolation, never nearest-rank; means alone mislead."),
    (
        "Errors",
        "HTTP errors, timeouts and truncated streams are counted and gated (errors.rate); "
        "they never vanish from the sample.",
    ),
    (
        "CI",
        "of the candidate's relative change against the configuration it was compared to, with the trial as the "
        "unit: a paired t interval on the log ratios of interleaved A/B pairs (Welch's t between archived runs), "
        "at trials.confidence, or at the lower per-look level that keeps sequential mode's error rate. A step is "
        "kept only when the objective's CI clears zero and every guard's worse bound is within its tolerance.",
    ),
)


# ---------------------------------------------------------------------------------------------- formatters
def label_of(metric: str) -> str:
    info = metric_info(metric)
    return info.label if info else metric


def fmt_value(metric: str, value: float | None) -> str:
    """Compact cell text: latencies in ms, fractions in %, throughput to one decimal; "—" when not measured."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    info = metric_info(metric)
    unit = info.unit if info else ""
    if unit == "s":
        ms = value * 1000
        return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"
    if unit == "fraction":
        return f"{value * 100:.1f}%" if value < 0.1 else f"{value * 100:.0f}%"
    if unit == "usd":
        return f"${value:.3g}"
    if unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    if unit in ("tok/s", "req/s"):
        return f"{value:.1f}" if value >= 1 else f"{value:.3g}"
    return f"{value:.4g}"


def fmt_full(metric: str, value: float | None) -> str:
    """Text with its unit ("225.4 ms", "12.0%"); "not measured" when there is no value."""
    if value is None:
        return "not measured"
    info = metric_info(metric)
    return info.format(value) if info else f"{value:.4g}"


def fmt_pct(x: float | None, signed: bool = True) -> str:
    """A fraction as a percentage ("+12.3%"); "—" when missing or not finite."""
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    """A relative change's confidence interval ("[-3.0%, +1.2%]"); empty when there is none."""
    if lo is None or hi is None:
        return ""
    return f"[{fmt_pct(lo)}, {fmt_pct(hi)}]"


def fmt_bytes(value: float | None) -> str:
    """GiB from 1 GiB up, MiB below; "—" when not measured."""
    if value is None:
        return "—"
    return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.1f} MiB"


# The fewest requests a percentile needs before it says anything about the tail: with fewer than ~1/(1-q)·2
# values the P-q estimate is one of the largest two observations, i.e. an anecdote, not a percentile.
MIN_SAMPLES: dict[str, int] = {"p90": 10, "p95": 20, "p99": 100}

# Why a latency family has no values, in the words the console and the report use for "not measured".
ABSENCE_REASONS: dict[str, str] = {
    "ttft": "no streamed request completed",
    "ttfo": "no streamed request carried content",
    "tpot": "no streamed request produced more than one output token",
    "itl": "no streamed request produced more than one chunk",
    "e2el": "no request completed",
    "ttft_nonstream": "no non-streamed request completed",
    "ttft_content": "no streamed request carried text",
    "queue_wait": "no request completed",
    "ttft_turn": "no streamed request of that turn completed",
    "session": "no conversation of more than one turn was measured (workload.turns is 1)",
}


def sample_count_key(metric: str) -> str | None:
    """The summary key holding how many requests `metric` rests on ("ttft.p95" -> "ttft.n"); None for non-latency."""
    family = metric.partition(".")[0]
    return f"{family}.n" if family in _LATENCY_LABELS or family == "ttfo" else None


def thin_sample(metric: str, summary: Mapping[str, float | None]) -> str | None:
    """A warning when a percentile rests on too few requests to mean anything, e.g. "P95 TTFT from 2 request(s)
    (needs at least 20)"; None when the sample is large enough or empty, the metric is no percentile, or no count
    is known."""
    stat = metric.partition(".")[2]
    need = MIN_SAMPLES.get(stat)
    key = sample_count_key(metric)
    n = summary.get(key) if key else None
    # A percentile from no request at all is absent, not thin: absence_reason says why.
    if need is None or n is None or n <= 0 or n >= need:
        return None
    return f"{label_of(metric)} from {int(n)} request(s) (needs at least {need})"


# Which requests each latency family is measured on: TTFT (both), TPOT, ITL and TTFO exist only for streamed requests,
# TTFT (non-streamed) only for non-streamed ones; E2E latency and queue wait for every completed request.
STREAMED_ONLY: frozenset[str] = frozenset({"ttft", "tpot", "itl", "ttft_content", "ttfo"})
NONSTREAMED_ONLY: frozenset[str] = frozenset({"ttft_nonstream"})
# The request counts a summary keeps beside its figures (metrics.summarize per trial, the pooled configuration
# row of stats.decide): what each percentile rests on, and how many requests were streamed or not.
SAMPLE_COUNT_KEYS: tuple[str, ...] = (
    *(f"{family}.n" for family in ("ttft", "tpot", "itl", "e2el", "ttft_nonstream", "ttft_content", "ttfo")),
    "requests.total",
    "requests.completed",
    "requests.streamed",
    "requests.nonstreamed",
)


def min_samples(metric: str) -> int | None:
    """The fewest requests `metric` needs to mean anything (MIN_SAMPLES); None when it is no tail percentile."""
    return MIN_SAMPLES.get(metric.partition(".")[2]) if sample_count_key(metric) else None


def thin_comparison(metric: str, n_baseline: int | None, n_candidate: int | None) -> str | None:
    """For a decision's sentence: "P95 TTFT rests on 12 requests per side (needs at least 20)", or "... on 12 vs
    40 requests ..." when the sides differ; None when both sides are large enough or a count is unknown."""
    need = min_samples(metric)
    if need is None or n_baseline is None or n_candidate is None or min(n_baseline, n_candidate) >= need:
        return None
    counts = (
        f"{n_baseline} requests per side" if n_baseline == n_candidate else f"{n_baseline} vs {n_candidate} requests"
    )
    return f"{label_of(metric)} rests on {counts} (needs at least {need})"


def absence_reason(metric: str) -> str:
    """Why `metric` can be absent from a summary, for "not measured (reason)"."""
    family = metric.partition(".")[0]
    if family in ABSENCE_REASONS:
        return ABSENCE_REASONS[family]
    if family in ("throughput", "goodput"):
        return "no request completed in the measured window"
    if family == "errors":
        return "no request was sent (every trial failed before its load)"
    if metric == "cost.usd_per_1m_tokens_at_slo":
        return "no price in the playbook, or no capacity found under the SLOs"
    if family == "capacity":
        return "no capacity search (goals.capacity), or no load within its bounds met the SLOs"
    if family == "cost":
        return "no price in the playbook, or no output tokens"
    if metric == "prefix_reuse.expected":
        return "no request completed, or its records predate prompt fingerprints"
    if metric == "prefix_reuse.achieved":
        return (
            "the engine reported no cached prompt tokens (no usage.prompt_tokens_details, and no prefix-cache "
            "counters on /metrics)"
        )
    if family == "engine":
        return "the engine exposed no such figure on /metrics"
    if family == "quality":
        return "the playbook declares no goals.quality, or no probe was answered on a side"
    if family == "memory":
        return "no GPU memory telemetry (no NVML, or the engine exposed none)"
    return "no data"


# ------------------------------------------------------------------ figures of a summary, as lines show them
def measured(value: object) -> float | None:
    """A summary value as a number, or None when it is absent (None, NaN, inf, or not a number at all)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def figure(metric: str, summary: Mapping[str, float | None]) -> str:
    """One figure as a console line shows it: "12.0 ms", or "not measured (why)" when the summary lacks it."""
    value = measured(summary.get(metric))
    if value is None:
        return f"not measured ({absence_reason(metric)})"
    return fmt_full(metric, value)


def thin_warning(metric: str, summary: Mapping[str, float | None]) -> str | None:
    """The warning when a measured percentile rests on too few requests; None otherwise."""
    key = sample_count_key(metric)
    count = measured(summary.get(key)) if key else None
    if key is None or count is None or measured(summary.get(metric)) is None:
        return None  # an absent figure already says why; an unknown count warns of nothing
    return thin_sample(metric, {key: count})
