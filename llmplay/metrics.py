"""Per-request records → summary metrics, with `vllm bench serve`'s definitions (numpy, linear percentiles).

A "token message" is an SSE message with non-empty `choices`, text or not (a role-only first chunk, an empty
finish chunk that carries the EOS token); usage-only messages and [DONE] are none. The clock starts when the
request reaches the transport, before it acquires a connection (RequestRecord.sent_ns).
- TTFT: sent → first token message (streamed requests only; non-streamed ones are reported apart as
  ttft_nonstream, where TTFT = E2EL). ttft_content: sent → first chunk carrying text, content or reasoning
  (AIPerf's TTFT); ttfo: sent → first non-reasoning content (AIPerf's TTFO).
- E2EL: sent → last token message (stream) or the full body (non-stream).
- TPOT: (E2EL − TTFT) / (output_tokens − 1), streamed requests with more than one output token.
- ITL: every gap between successive token messages, pooled over requests.
- Output tokens: the server's usage; without it, the text counted by the exact tokenizer or estimated
  by the approximate one (output_tokens_source, tokens.output_estimated), never token messages.
- Throughput: completed requests, output tokens, input + output tokens ÷ benchmark duration
  (warm-up excluded; it ends when the last measured request ended, failures included).
  Goodput: completed requests meeting every SLO in slo_s ÷ duration.
- Errors are counted over every measured request sent; errors.rate = errors / requests sent.
- Prefix reuse: prefix_reuse.expected is the workload's own, the share of prompt tokens that repeat the start of an
  earlier prompt (or an earlier prompt and its reply), piece by piece (prompt_prefix_reuse); prefix_reuse.achieved
  is what the engine reported serving from its prefix cache (cached prompt tokens ÷ prompt tokens).
- Sessions (conversations of more than one turn): turns and duration (first send → last reply) per conversation,
  and TTFT by turn index, the cost of a growing context.
Only completed (error-free), non-warm-up requests enter latency and throughput figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from llmplay.loadgen.records import (
    ERROR_KINDS,
    RequestRecord,
    after_warmup,
    records_from_dataframe,
    records_to_dataframe,
)

if TYPE_CHECKING:
    import pandas as pd

    # A run's records as the load generator returns them, or as a frame read back from an archive.
    Records: TypeAlias = pd.DataFrame | Iterable[RequestRecord]

PERCENTILES = (50, 90, 95, 99)
STAT_NAMES = ("mean", "std", "p50", "p90", "p95", "p99")
SLO_KEYS = ("ttft", "tpot", "e2el")


def _stats(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return dict.fromkeys(STAT_NAMES)
    pct = np.percentile(values, PERCENTILES)  # numpy's default: linear interpolation
    out: dict[str, float | None] = {"mean": float(values.mean()), "std": float(values.std())}
    out.update({f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)})
    return out


def _as_records(records: Records) -> Sequence[RequestRecord]:
    if isinstance(records, (list, tuple)):
        return tuple(records)
    import pandas as pd  # deferred: a load run's records are a tuple, and pandas takes a second to import

    if isinstance(records, pd.DataFrame):
        return records_from_dataframe(records)
    return tuple(records)


def measured_requests(records: Records) -> list[RequestRecord]:
    """Every request sent after the warm-up: what errors.rate and the request counts are over."""
    return list(after_warmup(_as_records(records)))


def completed(r: RequestRecord) -> bool:
    """Error-free and timed from send to its first and last token message: what latency, throughput and goodput
    count. (A failed request is `not r.ok`: it counts toward errors.)"""
    return r.error_kind is None and r.end_ns is not None and r.first_chunk_ns is not None


def _e2el_s(r: RequestRecord) -> float:
    return (r.end_ns - r.sent_ns) / 1e9  # type: ignore[operator]


def _ttft_s(r: RequestRecord) -> float:
    return (r.first_chunk_ns - r.sent_ns) / 1e9  # type: ignore[operator]


def _tpot_s(r: RequestRecord, ttft_s: float, e2el_s: float) -> float | None:
    """Defined for streamed requests with more than one output token."""
    return (e2el_s - ttft_s) / (r.output_tokens - 1) if r.stream and r.output_tokens > 1 else None


def per_request_arrays(records: Records) -> dict[str, np.ndarray]:
    """Per-request values (seconds) of measured, completed requests: the pooled percentiles, and one trial's figure.

    ttft/tpot: streamed requests (tpot only with > 1 output token); e2el: every completed request;
    ttft_nonstream: non-streamed requests; itl: pooled gaps between token messages; ttft_content: first text
    (content or reasoning); ttfo: first non-reasoning content.
    """
    ttft, tpot, e2el, nonstream, content, ttfo, itl, qwait = [], [], [], [], [], [], [], []
    for r in measured_requests(records):
        if not completed(r):
            continue
        e = _e2el_s(r)
        e2el.append(e)
        qwait.append(r.queue_wait_s)
        if not r.stream:
            nonstream.append(e)
            continue
        t = _ttft_s(r)
        ttft.append(t)
        if r.first_text_ns is not None:
            content.append((r.first_text_ns - r.sent_ns) / 1e9)
        if r.first_content_ns is not None:
            ttfo.append((r.first_content_ns - r.sent_ns) / 1e9)
        tp = _tpot_s(r, t, e)
        if tp is not None:
            tpot.append(tp)
        if len(r.chunk_ns) > 1:
            itl.append(np.diff(np.asarray(r.chunk_ns, dtype=np.int64)) / 1e9)
    return {
        "ttft": np.asarray(ttft, dtype=float),
        "tpot": np.asarray(tpot, dtype=float),
        "e2el": np.asarray(e2el, dtype=float),
        "ttft_nonstream": np.asarray(nonstream, dtype=float),
        "ttft_content": np.asarray(content, dtype=float),
        "ttfo": np.asarray(ttfo, dtype=float),
        "queue_wait": np.asarray(qwait, dtype=float),
        "itl": np.concatenate(itl) if itl else np.asarray([], dtype=float),
    }


def per_request_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """The per-request table a trial archives: every record column, plus each request's ttft_s, ttft_content_s
    and e2el_s (sent → first token message / first text / last token message; NA where that never happened) and
    schedule_lag_s (scheduled → sent)."""
    df = records_to_dataframe(records)
    sent = df["sent_ns"].astype("Int64")
    df["ttft_s"] = ((df["first_chunk_ns"] - sent) / 1e9).astype("Float64")
    df["ttft_content_s"] = ((df["first_text_ns"] - sent) / 1e9).astype("Float64")
    df["e2el_s"] = ((df["end_ns"] - sent) / 1e9).astype("Float64")
    df["schedule_lag_s"] = (df["sent_ns"] - df["scheduled_ns"]) / 1e9
    return df


def _slo_values(r: RequestRecord) -> dict[str, float]:
    """The figures a completed request is judged on by goals.slo (TTFT of a non-streamed request is its E2EL)."""
    e2el = _e2el_s(r)
    ttft = _ttft_s(r) if r.stream else e2el
    values = {"ttft": ttft, "e2el": e2el}
    tpot = _tpot_s(r, ttft, e2el)
    if tpot is not None:
        values["tpot"] = tpot
    return values


def meets_slo(r: RequestRecord, slo_s: Mapping[str, float]) -> bool:
    values = _slo_values(r)
    # A metric undefined for this request (TPOT of a one-token reply) cannot violate its SLO.
    return all(values.get(k) is None or values[k] <= limit for k, limit in slo_s.items() if k in SLO_KEYS)


@dataclass(frozen=True)
class Attainment:
    """SLO attainment of one load run: which measured requests met every SLO, in send order.

    A request sent that failed or never finished is a miss: at a load past capacity the requests that time out are
    exactly the ones that did not meet the SLO, and dropping them would make an overloaded engine look healthy."""

    met: np.ndarray  # 1.0 / 0.0 per measured request sent, in send order
    per_slo: Mapping[str, float]  # share of the requests sent meeting each SLO on its own
    # Each SLO's figure at the attainment quantile over the completed requests (P95 TTFT for a 95% target).
    at_quantile_s: Mapping[str, float | None]
    output_tok_s: float | None
    req_s: float | None

    @property
    def n(self) -> int:
        return int(self.met.size)

    @property
    def share(self) -> float | None:
        return float(self.met.mean()) if self.met.size else None


def slo_attainment(records: Records, duration_s: float, slo_s: Mapping[str, float], target: float) -> Attainment:
    """Attainment of every SLO in slo_s by the measured requests of one load run (capacity search probes)."""
    recs = sorted(measured_requests(records), key=lambda r: r.sent_ns)
    done = [completed(r) for r in recs]
    values = [_slo_values(r) if ok else {} for r, ok in zip(recs, done, strict=True)]
    keys = [k for k in slo_s if k in SLO_KEYS]

    def meets(v: Mapping[str, float], ok: bool, key: str) -> bool:
        return ok and (v.get(key) is None or v[key] <= slo_s[key])

    met = np.asarray(
        [float(all(meets(v, ok, k) for k in keys)) for v, ok in zip(values, done, strict=True)], dtype=float
    )
    per_slo = {
        k: float(np.mean([meets(v, ok, k) for v, ok in zip(values, done, strict=True)])) if recs else 0.0 for k in keys
    }
    at_q: dict[str, float | None] = {}
    for k in keys:
        observed = np.asarray([v[k] for v in values if v.get(k) is not None], dtype=float)
        at_q[k] = float(np.percentile(observed, target * 100)) if observed.size else None
    ok = [r for r, d in zip(recs, done, strict=True) if d]
    dur = duration_s if duration_s > 0 else None
    return Attainment(
        met=met,
        per_slo=MappingProxyType(per_slo),
        at_quantile_s=MappingProxyType(at_q),
        output_tok_s=sum(r.output_tokens for r in ok) / dur if dur else None,
        req_s=len(ok) / dur if dur else None,
    )


def batch_shares(met: np.ndarray, n_batches: int) -> np.ndarray:
    """The share met in each of `n_batches` consecutive runs of requests (send order): batch means, because
    requests inside a probe share a queue and are not independent draws, while batches far enough apart nearly are."""
    n_batches = max(1, min(n_batches, int(met.size)))
    return np.asarray([chunk.mean() for chunk in np.array_split(met, n_batches)], dtype=float)


def good_mask(records: Records, slo_s: Mapping[str, float]) -> np.ndarray:
    """1.0 per record that completed with text and met every SLO (goodput's numerator), else 0.0."""
    return np.asarray([float(completed(r) and meets_slo(r, slo_s)) for r in _as_records(records)], dtype=float)


@dataclass(frozen=True)
class Summary:
    """Flat metric paths → values (seconds, req/s, tok/s, counts, fractions); None where undefined."""

    values: Mapping[str, float | int | None]
    duration_s: float
    tokenizer: str = "none"  # which tokenizer sized the prompts (exact or approximate)
    output_tokens_source: str = "usage"  # usage | counted (exact tokenizer) | estimated (approximate) | mixed
    slo_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def as_dict(self) -> dict[str, float | int | None]:
        return dict(self.values)

    def __getitem__(self, key: str) -> float | int | None:
        return self.values[key]

    def get(self, key: str, default: float | None = None) -> float | int | None:
        return self.values.get(key, default)

    def to_json(self) -> dict[str, object]:
        """Metrics plus the facts a reader needs to trust them."""
        return {
            "metrics": self.as_dict(),
            "duration_s": self.duration_s,
            "tokenizer": self.tokenizer,
            "output_tokens_source": self.output_tokens_source,
            "slo_s": dict(self.slo_s),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)


def summarize(
    records: Records, duration_s: float, slo_s: Mapping[str, float] | None = None, *, tokenizer: str = "none"
) -> Summary:
    """records: a list of RequestRecord or their DataFrame; duration_s: the benchmark duration (warm-up
    excluded, LoadResult.duration_s); slo_s: per-request SLOs in seconds keyed ttft/tpot/e2el."""
    slo = dict(slo_s or {})
    unknown = set(slo) - set(SLO_KEYS)
    if unknown:
        raise ValueError(f"unknown SLO keys {sorted(unknown)}; expected {', '.join(SLO_KEYS)}")
    every = _as_records(records)
    recs = measured_requests(every)
    ok = [r for r in recs if completed(r)]
    arrays = per_request_arrays(ok)
    values: dict[str, float | int | None] = {}
    for name in ("ttft", "tpot", "itl", "e2el", "ttft_nonstream", "ttft_content", "ttfo"):
        for stat, v in _stats(arrays[name]).items():
            values[f"{name}.{stat}"] = v
        # How many requests the percentiles rest on (ITL pools gaps, but its unit is still the request).
        values[f"{name}.n"] = arrays[name].size
    values["itl.n"] = sum(1 for r in ok if r.stream and len(r.chunk_ns) > 1)
    q = _stats(arrays["queue_wait"])
    values["queue_wait.mean"], values["queue_wait.p95"] = q["mean"], q["p95"]
    dur = duration_s if duration_s > 0 else None
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.input_tokens for r in ok)
    good = sum(1 for r in ok if meets_slo(r, slo)) if slo else len(ok)
    values["throughput.req_s"] = len(ok) / dur if dur else None
    values["throughput.output_tok_s"] = out_tokens / dur if dur else None
    values["throughput.total_tok_s"] = (in_tokens + out_tokens) / dur if dur else None
    values["goodput.req_s"] = good / dur if dur else None
    values["goodput.fraction"] = good / len(recs) if recs else None
    errors = [r for r in recs if not r.ok]
    values["errors.count"] = len(errors)
    values["errors.rate"] = len(errors) / len(recs) if recs else 0.0
    for kind in ERROR_KINDS:
        values[f"errors.{kind}"] = sum(1 for r in errors if r.error_kind == kind)
    values["requests.total"] = len(recs)
    values["requests.completed"] = len(ok)
    streamed = sum(1 for r in ok if r.stream)
    values["requests.streamed"] = streamed
    values["requests.nonstreamed"] = len(ok) - streamed
    values["tokens.input_total"] = in_tokens
    values["tokens.output_total"] = out_tokens
    values["tokens.output_mean"] = out_tokens / len(ok) if ok else None
    lag = np.asarray([(r.sent_ns - r.scheduled_ns) / 1e9 for r in recs], dtype=float)
    values["schedule_lag.p99"] = float(np.percentile(lag, 99)) if lag.size else None
    values["schedule_lag.max"] = float(lag.max()) if lag.size else None
    values["duration_s"] = duration_s
    sources = {r.output_tokens_source for r in ok}
    source = "mixed" if len(sources) > 1 else next(iter(sources), "usage")
    values["tokens.output_counted"] = int(source != "usage")
    # Counted by an approximate tokenizer (no usage, no exact tokenizer): the token figures are estimates.
    values["tokens.output_estimated"] = int("estimated" in sources)
    values.update(prefix_reuse_figures(every))
    values.update(session_figures(recs))
    return Summary(
        values=MappingProxyType(values),
        duration_s=duration_s,
        tokenizer=tokenizer,
        output_tokens_source=source,
        slo_s=MappingProxyType(slo),
    )


def usd_per_1m_tokens(usd_per_hour: float, output_tok_s: float | None) -> float | None:
    """Cost of a million output tokens at the measured throughput; None when unpriced or nothing was produced."""
    if usd_per_hour <= 0 or not output_tok_s:
        return None
    return usd_per_hour / (output_tok_s * 3600) * 1e6


def usd_per_1m_tokens_at_slo(usd_per_hour: float, capacity_output_tok_s: float | None) -> float | None:
    """cost.usd_per_1m_tokens_at_slo: the same price per token, at the throughput of the capacity boundary (the most
    load that still meets the SLOs) rather than at whatever load the playbook happened to run."""
    return usd_per_1m_tokens(usd_per_hour, capacity_output_tok_s)


def usd_per_hour_from_cost(usd_per_1m: float | None, output_tok_s: float | None) -> float:
    """The hourly price a recorded cost figure was computed from (archives keep the cost, not the price)."""
    if not usd_per_1m or not output_tok_s:
        return 0.0
    return usd_per_1m * output_tok_s * 3600 / 1e6


def request_timeline(records: Records) -> dict[str, np.ndarray]:
    """Measured requests on the run's own clock, for charts over time and of the workload's shape.

    Per completed request, in record order: done_s (end since the first measured send), ttft (NaN when not
    streamed), input_tokens, output_tokens. send_gap_s: gaps between successive sends of every measured request.
    """
    measured = measured_requests(records)
    sends = np.sort(np.asarray([r.sent_ns for r in measured], dtype=float))
    # Every request that ended without an error, timed to its first token or not (an old archive's frame may lack
    # the first-token column): the timeline charts when requests finished.
    done = [r for r in measured if r.ok and r.end_ns is not None]
    start = sends[0] if sends.size else 0.0
    return {
        "done_s": np.asarray([(r.end_ns - start) / 1e9 for r in done], dtype=float),  # type: ignore[operator]
        "ttft": np.asarray(
            [
                (r.first_chunk_ns - r.sent_ns) / 1e9 if r.stream and r.first_chunk_ns is not None else np.nan
                for r in done
            ],
            dtype=float,
        ),
        "input_tokens": np.asarray([r.input_tokens for r in done], dtype=float),
        "output_tokens": np.asarray([r.output_tokens for r in done], dtype=float),
        "send_gap_s": np.diff(sends) / 1e9,
    }


# ---------------------------------------------------------------------------------------------- prefix reuse
def prompt_prefix_reuse(records: Records) -> np.ndarray:
    """Per request, in record order: the prompt tokens that repeat the start of a prompt sent earlier (warm-up
    included: the engine saw it), or of an earlier prompt followed by its reply (the engine computed that too, and a
    conversation's next turn resends it). Compared piece by piece (system prompt, each message, the new text: the
    prompt fingerprint the sender recorded), so a piece shared only in part counts as not shared; tokens are the
    prompt's own (usage) split in proportion to characters. 0 for a request without a fingerprint."""
    recs = _as_records(records)
    seen: set[int] = set()
    reused = np.zeros(len(recs), dtype=float)
    for i in sorted(range(len(recs)), key=lambda k: recs[k].sent_ns):
        r = recs[i]
        chars = 0
        for h, n in zip(r.prompt_hashes, r.prompt_chars, strict=False):
            if h not in seen:
                break
            chars = n
        if chars and r.prompt_chars:
            reused[i] = r.input_tokens * min(chars / r.prompt_chars[-1], 1.0)
        seen.update(r.prompt_hashes)
        if r.reply_hash is not None:
            seen.add(r.reply_hash)
    return reused


def prefix_reuse_figures(records: Sequence[RequestRecord]) -> dict[str, float | int | None]:
    """prefix_reuse.expected (the workload's own reuse) and prefix_reuse.achieved (the engine's cached share, where
    it reported cached tokens on every such request), over measured completed requests."""
    reused = prompt_prefix_reuse(records)
    done = [i for i, r in enumerate(records) if not r.is_warmup and completed(r)]
    prompt = sum(records[i].input_tokens for i in done)
    values: dict[str, float | int | None] = {}
    if any(records[i].prompt_hashes for i in done) and prompt > 0:
        values["prefix_reuse.expected"] = float(sum(reused[i] for i in done)) / prompt
    reported = [records[i] for i in done if records[i].cached_tokens is not None]
    if reported and len(reported) == len(done) and prompt > 0:
        values["prefix_reuse.achieved"] = sum(r.cached_tokens or 0 for r in reported) / prompt
    return values


def engine_prefix_reuse(summary: Mapping[str, object]) -> dict[str, float]:
    """prefix_reuse.achieved from the engine's /metrics counters (vLLM's prefix-cache hits ÷ queries over the
    measured window, telemetry's engine.prefix_cache_hit_rate) where the responses themselves did not say. With no
    lookup at all (vLLM with prefix caching off counts no queries) but prompts prefilled and no hit counted, it is a
    measured 0: nothing was served from cache, which is what a tuner comparing caching off and on needs to see."""
    if summary.get("prefix_reuse.achieved") is not None:
        return {}
    rate = summary.get("engine.prefix_cache_hit_rate")
    if isinstance(rate, (int, float)) and np.isfinite(rate):
        return {"prefix_reuse.achieved": float(rate)}
    hits, prompt = summary.get("engine.prefix_cache_hits"), summary.get("engine.prompt_tokens")
    if hits == 0 and isinstance(prompt, (int, float)) and prompt > 0:
        return {"prefix_reuse.achieved": 0.0}
    return {}


def prefix_reuse_text(summary: Mapping[str, object]) -> str | None:
    """ "prefix reuse 62% expected, 58% achieved" for a trial's console line; None when the workload reuses nothing
    and the engine reported no hits."""
    expected, achieved = summary.get("prefix_reuse.expected"), summary.get("prefix_reuse.achieved")
    if not expected and not achieved:
        return None

    def said(value: object, what: str) -> str:
        return f"{value * 100:.0f}% {what}" if isinstance(value, (int, float)) else f"{what} not measured"

    return f"prefix reuse {said(expected, 'expected')}, {said(achieved, 'achieved')}"


# ---------------------------------------------------------------------------------------------- sessions
MAX_TURN_FIGURES = 16  # TTFT by turn index for the first turns only: a 1,000-turn chat must not swell the summary


def session_figures(records: Sequence[RequestRecord]) -> dict[str, float | int | None]:
    """Conversations of a multi-turn workload (measured requests): session.count, session.turns_mean (turns sent),
    session.duration_s.{mean,p50,p95} (first send → last reply or failure), and per turn index k (1-based) the
    TTFT of streamed completed requests, ttft_turn.k.{p50,mean,n}. Empty for single-turn workloads."""
    measured = measured_requests(records)
    if not any(r.turn > 0 for r in measured):
        return {}
    sessions: dict[int, list[RequestRecord]] = {}
    for r in measured:
        sessions.setdefault(r.conversation_id, []).append(r)
    durations = []
    for turns in sessions.values():
        ends = [e for e in (r.end_ns if r.ok else (r.finished_ns or r.end_ns) for r in turns) if e is not None]
        if ends:
            durations.append((max(ends) - min(r.sent_ns for r in turns)) / 1e9)
    values: dict[str, float | int | None] = {
        "session.count": len(sessions),
        "session.turns_mean": float(np.mean([len(t) for t in sessions.values()])),
    }
    stats = _stats(np.asarray(durations, dtype=float))
    for stat in ("mean", "p50", "p95"):
        values[f"session.duration_s.{stat}"] = stats[stat]
    by_turn: dict[int, list[float]] = {}
    for r in measured:
        if r.ok and r.stream and r.first_chunk_ns is not None and r.turn < MAX_TURN_FIGURES:
            by_turn.setdefault(r.turn, []).append(_ttft_s(r))
    for turn in sorted(by_turn):
        ttft = np.asarray(by_turn[turn], dtype=float)
        values[f"ttft_turn.{turn + 1}.p50"] = float(np.percentile(ttft, 50))
        values[f"ttft_turn.{turn + 1}.mean"] = float(ttft.mean())
        values[f"ttft_turn.{turn + 1}.n"] = int(ttft.size)
    return values
