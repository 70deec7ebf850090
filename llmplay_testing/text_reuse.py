"""An instrument for tests and benchmarks: a workload's prefix reuse measured on the raw text of the prompts it
sent (the product's own figure, prefix_reuse.expected, is metrics.prompt_prefix_reuse over the sent records). It is the
share of prompt text that repeats a prefix an earlier request already sent (what a prefix cache of unbounded
size could serve from cache, nothing more).

It reads only the text, so it holds for every kind of workload: a trace's shared hash ids, a synthetic workload's
shared prefix groups, multi-turn histories. Characters stand in for tokens: the synthesised prompts are words of
nearly one token each, so the two shares agree to within a word per request.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from llmplay.loadgen.workload import PlannedRequest


def request_text(planned: PlannedRequest) -> str:
    """What the engine's prefix cache sees of a request, up to its chat template: the prompt, or the messages in
    order with their roles."""
    if planned.messages is not None:
        return "\n".join(f"{role}: {content}" for role, content in planned.messages)
    return planned.prompt or ""


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection on slices (C-speed compares, not a per-character loop)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _whole_words(text: str, other: str, n: int) -> int:
    """n cut back to a word boundary in both texts: half a shared word is a different token."""
    if (n == len(text) or text[n] == " ") and (n == len(other) or other[n] == " "):
        return n
    return max(text.rfind(" ", 0, n), 0)


def prefix_reuse(texts: Iterable[str]) -> float:
    """The share of the texts' characters that repeat the longest prefix some earlier text had; 0.0 for none.

    The earlier texts are kept sorted: the one sharing the longest prefix with a new text is its neighbour in
    that order, so each text costs two comparisons and a sorted insert."""
    earlier: list[str] = []
    total = reused = 0
    for text in texts:
        total += len(text)
        at = bisect.bisect_left(earlier, text)
        best = 0
        for other in earlier[max(at - 1, 0) : at + 1]:
            best = max(best, _whole_words(text, other, _common_prefix(text, other)))
        reused += best
        earlier.insert(at, text)
    return reused / total if total else 0.0


def sent_prefix_reuse(requests: Iterable[PlannedRequest], sent: Iterable[int] | None = None) -> float:
    """prefix_reuse of the requests a trial sent, in order (`sent`: their indices; None: all of them), warm-up
    included: what the warm-up put in the cache is there for the measured requests too."""
    keep = set(sent) if sent is not None else None
    return prefix_reuse(request_text(r) for r in requests if keep is None or r.index in keep)
