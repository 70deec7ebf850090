"""One load run, warm-up then measured phase, on a client sized to the load: the load generator's entry (run_load_sync)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Iterable
from dataclasses import replace

import httpx
import numpy as np

from llmplay.loadgen.arrivals import RequestFeed, closed_loop, open_loop, trace_loop
from llmplay.loadgen.clock import now_ns
from llmplay.loadgen.records import LoadResult, RequestRecord, after_warmup
from llmplay.loadgen.send import LoadSender
from llmplay.loadgen.tokenizer import FallbackTokenizer, Tokenizer, WordRatioTokenizer
from llmplay.loadgen.trace import prefetch_requests
from llmplay.loadgen.transport import StreamingTransport
from llmplay.loadgen.workload import PlannedRequest
from llmplay.spec import Workload


class LoadInterrupted(BaseException):
    """The load was cancelled (a signal): `partial` holds every request that had finished by then.

    A BaseException, like the cancellation it replaces, so nothing between here and the runner swallows it."""

    def __init__(self, partial: LoadResult):
        super().__init__("load interrupted")
        self.partial = partial


async def _progress_loop(sender: LoadSender, total: int | None, duration_s: float | None, t0: int) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # deferred: only on a terminal

    cols = [
        TextColumn("[bold]load"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} req" if total else "{task.completed:.0f}s"),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*cols, transient=True) as bar:
        task = bar.add_task("load", total=total or duration_s or None, stats="")
        while True:
            await asyncio.sleep(0.5)
            el = max((now_ns() - t0) / 1e9, 1e-9)
            done = len(sender.records)
            stats = (
                f"{done / el:.1f} req/s  {sender.out_tokens / el:.0f} tok/s  {sender.errors} errors  "
                f"{sender.inflight} in flight"
            )
            bar.update(task, completed=done if total else min(el, duration_s or el), stats=stats)


async def _phase(
    sender: LoadSender,
    feed: RequestFeed,
    workload: Workload,
    arrival_rng: np.random.Generator,
    *,
    warmup: bool,
    until_ns: int | None,
) -> None:
    """One phase (warm-up or measured) in the workload's mode: closed loop, a trace's own times, or arrivals."""
    if workload.concurrency is not None:
        await closed_loop(sender, feed, workload.concurrency, warmup=warmup, until_ns=until_ns)
    elif workload.trace is not None:
        await trace_loop(sender, feed, warmup=warmup, until_ns=until_ns)
    else:
        await open_loop(sender, feed, arrival_rng, warmup=warmup, until_ns=until_ns)


async def run_load(
    client: httpx.AsyncClient,
    base_url: str,
    workload: Workload,
    requests: Iterable[PlannedRequest],
    *,
    progress: bool = False,
    tokenizer: Tokenizer | None = None,
    transport: StreamingTransport | None = None,
) -> LoadResult:
    """Warm-up phase (warmup_requests and/or warmup_s, flagged), then the measured phase until
    num_requests are done or duration_s has passed. Every request sent yields exactly one record.

    transport: the StreamingTransport `client` was built on, to send straight to it (see LoadSender)."""
    # A trace under a concurrency (a capacity search over users) is sent closed loop, in its order.
    if (workload.concurrency is None) == (workload.rate is None) and (workload.trace is None or workload.rate):
        raise ValueError("workload needs exactly one of concurrency (closed loop) or rate (open loop)")
    mode = "closed" if workload.concurrency is not None else "open"
    ahead = (workload.concurrency or 0) * 4 + int((workload.rate or 0) * 4) + workload.warmup_requests
    feed = RequestFeed(requests, max(ahead, prefetch_requests(workload)), conversations=workload.turns > 1)
    sender = LoadSender(client, base_url, workload, transport)
    arrival_rng = np.random.default_rng([workload.seed, 7])
    show = progress and sys.stderr.isatty()
    bar: asyncio.Task[None] | None = None
    # What exists now (prompts, client, tokenizer) lives through the run: a full collection walking it mid-run
    # stalls the loop for tens of milliseconds at a few thousand requests, each one schedule lag.
    gc.collect()
    gc.freeze()
    t_warm = start_ns = now_ns()
    interrupted = False
    try:
        if workload.warmup_requests or workload.warmup_s:
            until = t_warm + int(workload.warmup_s * 1e9) if workload.warmup_s else None
            await _phase(sender, feed, workload, arrival_rng, warmup=True, until_ns=until)
        start_ns = now_ns()
        until = start_ns + int(workload.duration_s * 1e9) if workload.duration_s is not None else None
        if show:
            bar = asyncio.ensure_future(_progress_loop(sender, workload.num_requests, workload.duration_s, start_ns))
        await _phase(sender, feed, workload, arrival_rng, warmup=False, until_ns=until)
        end_wall = now_ns()
    except asyncio.CancelledError:
        interrupted, end_wall = True, now_ns()
    finally:
        gc.unfreeze()
        if bar is not None:
            bar.cancel()
            await asyncio.gather(bar, return_exceptions=True)
        try:
            await feed.aclose()
        except asyncio.CancelledError:
            interrupted = True
    # Interrupted: no more calls to the engine (its tokenizer may be the reason we stop); keep what finished.
    records = _count_missing_tokens(sender.records, sender.texts, tokenizer, use_exact=not interrupted)
    measured = after_warmup(records)
    ends = [e for e in map(_ended_ns, measured) if e is not None]
    end_ns = max(ends) if ends else end_wall
    lag = np.array([(r.sent_ns - r.scheduled_ns) / 1e9 for r in measured]) if mode == "open" else np.array([])
    result = LoadResult(
        records=tuple(sorted(records, key=lambda r: r.index)),
        mode=mode,
        start_ns=start_ns,
        end_ns=end_ns,
        duration_s=max(end_ns - start_ns, 0) / 1e9,
        warmup_duration_s=(start_ns - t_warm) / 1e9,
        schedule_lag_p50_s=float(np.percentile(lag, 50)) if lag.size else None,
        schedule_lag_p99_s=float(np.percentile(lag, 99)) if lag.size else None,
        schedule_lag_max_s=float(lag.max()) if lag.size else None,
        tokenizer=tokenizer.name if tokenizer is not None else "none",
        counted_tokens=any(r.output_tokens_source != "usage" and r.ok for r in measured),
    )
    if interrupted:
        raise LoadInterrupted(result)
    return result


def _ended_ns(r: RequestRecord) -> int | None:
    """When a request stopped occupying the measured window: its last token chunk when it succeeded (as vLLM
    ends E2EL), else when its failure was seen, so a timeout that never sent text still lengthens the window."""
    if r.ok or r.finished_ns is None:
        return r.end_ns
    return r.finished_ns


def _estimator(tokenizer: Tokenizer | None) -> Tokenizer:
    """The approximate counter that needs no engine: the prompts' own approximate tokenizer, the ratio calibrated
    against the engine's, or the plain word ratio."""
    if isinstance(tokenizer, FallbackTokenizer):
        return tokenizer if not tokenizer.exact else tokenizer.estimate
    if tokenizer is not None and not tokenizer.exact:
        return tokenizer
    return WordRatioTokenizer()


def _count_missing_tokens(
    records: list[RequestRecord], texts: dict[int, str], tokenizer: Tokenizer | None, *, use_exact: bool
) -> list[RequestRecord]:
    """Server sent no usage: count the generated text (after the timed run) with the tokenizer that sized the
    prompts when it is exact ("counted"), else estimate it with the approximate one ("estimated"). Never text
    chunks: a server may pack several tokens into one, and TPOT would grow by that factor."""
    out = []
    estimator = _estimator(tokenizer)
    for r in records:
        if r.output_tokens_source == "counted" and r.index in texts:
            text = texts[r.index]
            # No text (a failed request) costs no call to the engine.
            if use_exact and tokenizer is not None and tokenizer.exact and text:
                n = tokenizer.count(text)
                # A FallbackTokenizer whose engine stopped answering mid-count estimated instead.
                source = "counted" if tokenizer.exact else "estimated"
            else:
                n, source = estimator.count(text), "estimated"
            r = replace(r, output_tokens=n, output_tokens_source=source)
        out.append(r)
    return out


def client_limits(workload: Workload) -> httpx.Limits:
    """One connection per user (closed loop); unbounded for open loop so no request queues in the pool."""
    if workload.concurrency is not None:
        n = workload.concurrency
        return httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=30)
    return httpx.Limits(
        max_connections=None, max_keepalive_connections=max(64, int((workload.rate or 1) * 4)), keepalive_expiry=30
    )


def make_client(workload: Workload, transport: StreamingTransport) -> httpx.AsyncClient:
    """A plain client over `transport` (which holds the connection limits: httpx gives a custom transport none)."""
    t = workload.request_timeout_s
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(t, connect=min(t, 10.0)), trust_env=False)


def run_load_sync(
    base_url: str,
    workload: Workload,
    requests: Iterable[PlannedRequest],
    *,
    progress: bool = False,
    tokenizer: Tokenizer | None = None,
) -> LoadResult:
    """run_load with its own client and transport sized to the load, on uvloop where installed."""

    async def main() -> LoadResult:
        transport = StreamingTransport(limits=client_limits(workload))
        async with make_client(workload, transport) as client:
            return await run_load(
                client, base_url, workload, requests, progress=progress, tokenizer=tokenizer, transport=transport
            )

    try:
        import uvloop  # deferred: optional, and only the event loop of a run needs it
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())
