"""Trace replay's requests: the window the playbook's trace reader yields, each request's send time from its scaled
timestamp, and prompt text synthesised block by block, so requests whose hash ids agree share their text exactly
as far as the ids agree: a prefix cache sees the reuse the trace had, nothing more."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from llmplay.errors import LlmplayError
from llmplay.loadgen.tokenizer import WORDS, Tokenizer, WordRatioTokenizer
from llmplay.playbook.trace import read_window, replay_time_scale, scale_window
from llmplay.spec import Workload

_PURPOSE_SHARED, _PURPOSE_OWN = 11, 12  # seed streams apart from the synthetic workload's (workload.py)
DEFAULT_CACHE_TOKENS = 4_000_000  # ~20 MB of text; a block made again after eviction is the same text
# A window whose prompts hold at most this many tokens (~100 MB of text) is synthesised before the clock starts:
# drawing prompts in a thread mid-replay takes the interpreter lock from the sending loop, and a trace's send
# times are fixed, so every stall shows up as schedule lag.
PREFETCH_MAX_TOKENS = 20_000_000


class TraceReplayError(LlmplayError):
    """The trace cannot be replayed (it changed or vanished since the playbook loaded)."""

    exit_code = 2


class BlockTexts:
    """The text of each prompt block, made from the seed and the block's identity alone, so the same hash id (at
    the same length) is the same text in every request, however the cache has evicted in between."""

    def __init__(self, tokenizer: Tokenizer, seed: int, max_cached_tokens: int = DEFAULT_CACHE_TOKENS):
        self.tokenizer = _block_maker(tokenizer)
        self.seed = seed
        self.max_cached_tokens = max_cached_tokens
        self.cached_tokens = 0
        self.made = 0  # blocks synthesised (cache misses), for the benchmark
        self._cache: collections.OrderedDict[tuple[int, ...], tuple[str, int]] = collections.OrderedDict()

    def text(self, key: tuple[int, ...], n_tokens: int) -> str:
        """key: (_PURPOSE_SHARED, hash id) or (_PURPOSE_OWN, line, block) for a block only one request has."""
        full = (*key, n_tokens)
        hit = self._cache.get(full)
        if hit is not None:
            self._cache.move_to_end(full)
            return hit[0]
        text = self.tokenizer.make_text(n_tokens, np.random.default_rng([self.seed, *full]))
        self.made += 1
        self._cache[full] = (text, n_tokens)
        self.cached_tokens += n_tokens
        while self.cached_tokens > self.max_cached_tokens and len(self._cache) > 1:
            _, (_, n) = self._cache.popitem(last=False)
            self.cached_tokens -= n
        return text


def _block_maker(tokenizer: Tokenizer) -> Tokenizer:
    """What writes block text: plain words when the engine's vocabulary holds every one of them as one token (words
    are then exact and cost no call per block: a trace has tens of thousands of blocks, and an engine's tokenizer
    answers over HTTP), else the engine's tokenizer itself, exact block by block."""
    if not tokenizer.exact:
        return tokenizer
    try:
        single = tokenizer.count(" ".join(WORDS)) == len(WORDS)
    except LlmplayError:
        return tokenizer  # it failed already: its own fallback (if any) takes over from here
    return WordRatioTokenizer() if single and tokenizer.exact else tokenizer


@dataclass(frozen=True)
class TracePrompt:
    """One replayed request before it becomes a PlannedRequest: its text, lengths and send time."""

    index: int  # position in the window (warm-up first)
    line: int  # the trace line it came from
    arrival_s: float  # replay seconds after the window's first request
    text: str
    input_tokens_target: int
    output_tokens: int
    group_id: int  # the first hash id: requests opening with the same block share a prefix group
    blocks: tuple[str, ...] = ()  # the text of each hash-id block; `text` is them joined by spaces


def prefetch_requests(workload: Workload) -> int:
    """How many requests the load runner should draw before its clock starts: the whole window when its prompts
    fit PREFETCH_MAX_TOKENS (the loader measured them), else none beyond its usual read-ahead."""
    spec = workload.trace
    if spec is None or spec.facts is None or workload.num_requests is None:
        return 0
    count = workload.warmup_requests + workload.num_requests
    return count if count * spec.facts.input_mean_tokens <= PREFETCH_MAX_TOKENS else 0


def _block_key(hid: int | None, line: int, block: int) -> tuple[int, ...]:
    if hid is None:
        return (_PURPOSE_OWN, line, block)
    return (_PURPOSE_SHARED, hid % (1 << 64))  # seed entropy must be non-negative


def iter_trace_prompts(
    workload: Workload, tokenizer: Tokenizer, blocks: BlockTexts | None = None
) -> Iterator[TracePrompt]:
    """The window's requests in order (warmup_requests + num_requests of them), each with its send time: the trace
    gaps times the scale that gives workload.rate (else trace.time_scale). Deterministic from workload.seed."""
    spec = workload.trace
    if spec is None:
        raise TraceReplayError("the workload has no trace; expected workload.trace")
    wanted = workload.warmup_requests + workload.num_requests if workload.num_requests is not None else None
    try:
        requests = scale_window(read_window(spec, wanted), spec)
    except LlmplayError as exc:  # checked when the playbook loaded: the file changed since
        raise TraceReplayError(f"trace {exc}") from None
    scale = replay_time_scale(len(requests), requests[-1].arrival_s, workload.rate, spec.time_scale)
    blocks = blocks if blocks is not None else BlockTexts(tokenizer, workload.seed)
    for index, r in enumerate(requests):
        parts = [blocks.text(_block_key(hid, r.line, i), n) for i, (hid, n) in enumerate(r.blocks)]
        first = r.blocks[0][0] if r.blocks else None
        yield TracePrompt(
            index=index,
            line=r.line,
            arrival_s=r.arrival_s * scale,
            text=" ".join(parts),
            input_tokens_target=r.input_tokens,
            output_tokens=r.output_tokens,
            group_id=first if first is not None else -1 - index,
            blocks=tuple(parts),
        )
