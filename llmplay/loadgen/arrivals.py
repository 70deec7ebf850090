"""When requests leave: the request feed, and the closed-loop (N users) and open-loop (R req/s) arrival loops.

A conversation (turns > 1) is one user in closed loop: its turns leave one after another, each after the previous
reply and the user's think time. In closed loop each of the N users runs whole conversations; in open loop the
conversations themselves arrive (a conversation of k turns is followed by a gap of k / rate on average, so the
requests still average `rate`)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from llmplay.loadgen.clock import now_ns
from llmplay.loadgen.records import RequestRecord
from llmplay.loadgen.send import LoadSender
from llmplay.loadgen.workload import PlannedRequest


class RequestFeed:
    """Hands out planned requests; a lazy iterator is drawn ahead in a thread so prompt building
    (which may call the engine's tokenizer) never blocks the event loop mid-measurement."""

    def __init__(self, requests: Iterable[PlannedRequest], ahead: int, *, conversations: bool = False):
        self._ahead = max(16, ahead)
        self._conversations = conversations  # turns > 1: next_session gathers a conversation's turns
        self._seq: Sequence[PlannedRequest] | None = None
        self._pos = 0
        self._buf: collections.deque[PlannedRequest] = collections.deque()
        self._it: Iterator[PlannedRequest] | None = None
        self._exhausted = False
        self._refill: asyncio.Future[list[PlannedRequest]] | None = None
        self._returned: collections.deque[PlannedRequest] = collections.deque()  # handed back, sent first
        if isinstance(requests, (list, tuple)):
            self._seq = requests
        else:
            self._it = iter(requests)
            self._draw(self._ahead)  # before the clock starts

    def _draw(self, n: int) -> list[PlannedRequest]:
        assert self._it is not None
        got = []
        for _ in range(n):
            try:
                got.append(next(self._it))
            except StopIteration:
                self._exhausted = True
                break
        self._buf.extend(got)
        return got

    async def upcoming(self) -> PlannedRequest | None:
        """The next request without taking it, waiting for the drawing thread when the buffer has run dry."""
        while self._seq is None and not self._buf and not self._exhausted:
            await self._start_refill()
        return self.peek()

    def peek(self) -> PlannedRequest | None:
        if self._returned:
            return self._returned[0]
        if self._seq is not None:
            return self._seq[self._pos] if self._pos < len(self._seq) else None
        return self._buf[0] if self._buf else None

    async def next(self) -> PlannedRequest | None:
        if self._returned:
            return self._returned.popleft()
        if self._seq is not None:
            if self._pos >= len(self._seq):
                return None
            self._pos += 1
            return self._seq[self._pos - 1]
        while not self._buf:
            if self._exhausted:
                return None
            await self._start_refill()
        item = self._buf.popleft()
        if len(self._buf) < self._ahead // 2 and not self._exhausted:
            await self._start_refill(wait=False)
        return item

    async def next_session(self) -> list[PlannedRequest]:
        """The next conversation's requests still to send, in turn order; empty when none is left."""
        first = await self.next()
        if first is None:
            return []
        session = [first]
        while (
            self._conversations
            and (nxt := await self._peek_drawn()) is not None
            and nxt.conversation_id == first.conversation_id
        ):
            if nxt.turn <= session[-1].turn:
                break  # the same id again is another conversation (a caller's own sequence)
            session.append(await self.next())  # type: ignore[arg-type]
        return session

    def give_back(self, requests: Sequence[PlannedRequest]) -> None:
        """Requests taken but not sent (the rest of a conversation when warm-up ended): the next ones out."""
        self._returned.extendleft(reversed(requests))

    async def _peek_drawn(self) -> PlannedRequest | None:
        """peek, drawing more from a lazy iterator first when none is buffered."""
        while self._seq is None and not self._returned and not self._buf and not self._exhausted:
            await self._start_refill()
        return self.peek()

    async def _start_refill(self, wait: bool = True) -> None:
        if self._refill is None or self._refill.done():
            self._refill = asyncio.ensure_future(asyncio.to_thread(self._draw, self._ahead))
        if wait:
            await self._refill

    async def aclose(self) -> None:
        if self._refill is not None and not self._refill.done():
            await self._refill


def _phase_over(nxt: PlannedRequest | None, at_ns: int, until_ns: int | None, *, warmup: bool) -> bool:
    """Whether `nxt`, due at `at_ns`, falls after the phase. Warm-up lasts while planned warm-up requests remain or
    warmup_s has not passed; the measured phase lasts until `until_ns` (duration_s), or while requests remain."""
    if warmup:
        return nxt is None or (not nxt.is_warmup and (until_ns is None or at_ns >= until_ns))
    return until_ns is not None and at_ns >= until_ns


async def _converse(
    sender: LoadSender,
    feed: RequestFeed,
    session: Sequence[PlannedRequest],
    scheduled_ns: int,
    *,
    warmup: bool,
    until_ns: int | None,
) -> None:
    """One user's conversation: each turn after the previous reply and the user's think time. A warm-up that ends
    mid-conversation hands the rest back to the feed; a measured window that ends, ends it."""
    replied_ns = 0
    for i, planned in enumerate(session):
        if i:
            # The pause runs from the reply's recorded end (its last text chunk), not from when the send returned,
            # and never wakes early: a turn is sent at least think_s after the reply the user read.
            deadline = replied_ns + int(planned.think_s * 1e9)
            while (left_ns := deadline - now_ns()) > 0:
                await asyncio.sleep(left_ns / 1e9)
            now = now_ns()
            if _phase_over(planned, now, until_ns, warmup=warmup):
                if warmup:
                    feed.give_back(session[i:])  # the measured phase carries the conversation on
                return
            scheduled_ns = now
        record = await sender.send(planned, scheduled_ns, warmup)
        replied_ns = record.end_ns or now_ns()


async def closed_loop(sender: LoadSender, feed: RequestFeed, users: int, *, warmup: bool, until_ns: int | None) -> None:
    """`users` users, each sending its next request as soon as its last one finished (and each running whole
    conversations, turn after turn)."""

    async def user() -> None:
        while True:
            session = await feed.next_session()
            if not session:
                return
            # One clock reading decides and becomes the schedule stamp, so every measured request was scheduled inside
            # the window: drawing a session can wait on the prompt thread for a while on a busy machine.
            now = now_ns()
            if _phase_over(session[0], now, until_ns, warmup=warmup):
                feed.give_back(session)
                return
            await _converse(sender, feed, session, now, warmup=warmup, until_ns=until_ns)

    await asyncio.gather(*(user() for _ in range(users)))


async def open_loop(
    sender: LoadSender, feed: RequestFeed, rng: np.random.Generator, *, warmup: bool, until_ns: int | None
) -> None:
    """Requests (or bursts of them; conversations when turns > 1) leave on a fixed or Poisson schedule, whether or
    not earlier ones finished."""
    wl = sender.workload
    assert wl.rate is not None and wl.rate > 0
    burst = max(1, wl.burst)
    # rate counts requests: the gap after an arrival is as long as its requests take at that rate, so bursts arrive
    # rate/burst times a second and 3-turn conversations rate/3 (a dataset's conversations, each by its own turns).
    mean_gap_s = burst / wl.rate
    tasks: set[asyncio.Task[None]] = set()
    t0 = now_ns()
    offset_s = 0.0
    first = True
    while True:
        if not first:
            offset_s += float(rng.exponential(mean_gap_s)) if wl.arrival == "poisson" else mean_gap_s
        first = False
        at_ns = t0 + int(offset_s * 1e9)
        if _phase_over(feed.peek(), at_ns, until_ns, warmup=warmup):
            break
        # Re-check after waking: the loop's timers round to the millisecond and may fire early.
        while (delay_ns := at_ns - now_ns()) > 0:
            await asyncio.sleep(delay_ns / 1e9)
        stop = False
        sent = 0
        for _ in range(burst):
            session = await feed.next_session()
            if not session:
                stop = True
                break
            sent += len(session)
            task = asyncio.ensure_future(_converse(sender, feed, session, at_ns, warmup=warmup, until_ns=until_ns))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if stop:
            break
        mean_gap_s = sent / wl.rate
    if tasks:
        await asyncio.gather(*tasks)


async def trace_loop(sender: LoadSender, feed: RequestFeed, *, warmup: bool, until_ns: int | None) -> None:
    """Trace replay, open loop: each request leaves at its own (scaled) arrival time, counted from the first
    request of the phase, whether or not earlier ones finished."""
    tasks: set[asyncio.Task[RequestRecord]] = set()
    t0 = now_ns()
    base_s: float | None = None
    while True:
        nxt = await feed.upcoming()
        if nxt is None:
            break
        arrival_s = nxt.arrival_s or 0.0
        base_s = arrival_s if base_s is None else base_s
        at_ns = t0 + int((arrival_s - base_s) * 1e9)
        if _phase_over(nxt, at_ns, until_ns, warmup=warmup):
            break
        # Re-check after waking: the loop's timers round to the millisecond and may fire early.
        while (delay_ns := at_ns - now_ns()) > 0:
            await asyncio.sleep(delay_ns / 1e9)
        planned = await feed.next()
        if planned is None:
            break
        task = asyncio.ensure_future(sender.send(planned, at_ns, warmup))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
