"""Turns a Workload into a deterministic sequence of PlannedRequests: lengths, datasets, shared prefixes, turns."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from llmplay.errors import LlmplayError, PlaybookError
from llmplay.loadgen.tokenizer import Tokenizer
from llmplay.loadgen.trace import iter_trace_prompts
from llmplay.playbook.dataset import read_dataset
from llmplay.spec import LengthDist, ThinkTime, Workload

MAX_LENGTH_TOKENS = 10_000_000  # the playbook schema's `tokens` maximum: the longest length any request draws


class WorkloadError(LlmplayError):
    """The workload cannot be turned into requests (bad dataset file, impossible lengths)."""

    exit_code = 2


@dataclass(frozen=True)
class PlannedRequest:
    """One request as planned. A first turn is sent unchanged; a later turn of a conversation is sent as
    `resend(history)`, with the replies the server actually gave (its planned replies are a stand-in).

    Exactly one of `prompt` (completions API) and `messages` (chat API: (role, content) pairs) is set.
    """

    index: int  # position in the sequence, warm-up included
    conversation_id: int
    group_id: int  # shared-prefix group
    turn: int  # 0-based turn within the conversation
    prompt: str | None
    messages: tuple[tuple[str, str], ...] | None
    input_tokens_target: int  # prefix + history + new text, as planned
    input_tokens: int  # as counted by the tokenizer (exact or approximate, see tokenizer name)
    max_tokens: int
    stream: bool
    is_warmup: bool
    model: str
    arrival_s: float | None = None  # trace replay: send time, seconds after the trace window's first request
    prefix: str = ""  # the group's shared prefix (system prompt); empty when none
    user_text: str = ""  # this turn's own new text, after the prefix and the history
    think_s: float = 0.0  # the user's pause after the previous turn's reply, before sending this one
    final_turn: bool = True  # the conversation's last turn: nothing resends its reply
    # A trace request's prompt as its hash-id blocks' texts (joined by spaces): its reuse is fingerprinted block by
    # block, so a prompt sharing only its first blocks with an earlier one counts those as reused.
    blocks: tuple[str, ...] = ()

    def resend(self, history: Sequence[tuple[str, str]]) -> PlannedRequest:
        """This turn after the given (user text, reply) turns: what a user in conversation really sends.
        input_tokens stays as planned (the server's usage replaces it once the request is answered)."""
        prompt, messages = compose_prompt(self.messages is not None, self.prefix, history, self.user_text)
        return replace(self, prompt=prompt, messages=messages)

    def body(self, *, temperature: float, ignore_eos: bool) -> dict[str, object]:
        """The OpenAI JSON body for this request."""
        body: dict[str, object] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": temperature,
            "stream": self.stream,
        }
        if self.messages is not None:
            body["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        else:
            body["prompt"] = self.prompt
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if ignore_eos:
            # llama.cpp and vLLM honour it; others ignore unknown fields.
            body["ignore_eos"] = True
        return body


def compose_prompt(
    chat: bool, prefix: str, history: Sequence[tuple[str, str]], user_text: str
) -> tuple[str | None, tuple[tuple[str, str], ...] | None]:
    """(prompt, messages) of one turn: chat messages (system prefix, user/assistant pairs, the new user text), or
    the same pieces joined by newlines for the completions API. prompt_segments splits them back."""
    segments = prompt_segments(chat, prefix, history, user_text)
    if chat:
        return None, segments
    return "\n".join(content for _, content in segments), None


def prompt_segments(
    chat: bool, prefix: str, history: Sequence[tuple[str, str]], user_text: str | None
) -> tuple[tuple[str, str], ...]:
    """The pieces a turn's prompt is made of, in order, as (role, text); user_text None stops after the history.
    A prefix cache can reuse an earlier prompt only up to the first piece that differs."""
    pieces: list[tuple[str, str]] = [("system", prefix)] if prefix else []
    for user, reply in history:
        pieces += [("user", user), ("assistant", reply)]
    if user_text is not None:
        pieces.append(("user", user_text))
    if not chat:
        # The completions API has no roles: the text alone is what the engine sees.
        return tuple(("", text) for _, text in pieces)
    return tuple(pieces)


def draw_think_s(think: ThinkTime, rng: np.random.Generator) -> float:
    """One pause in seconds >= 0 from the distribution (exponential/lognormal clipped to [min, max])."""
    if think.kind == "fixed":
        value = think.value_s
    elif think.kind == "uniform":
        if think.min_s is None or think.max_s is None:
            raise WorkloadError("uniform think_time needs min and max")
        value = float(rng.uniform(think.min_s, think.max_s))
    elif think.kind == "exponential":
        if think.mean_s is None:
            raise WorkloadError("exponential think_time needs mean")
        value = float(rng.exponential(think.mean_s))
    elif think.kind == "lognormal":
        if think.mean_s is None or think.sigma is None or think.mean_s <= 0:
            raise WorkloadError("lognormal think_time needs mean (> 0, of the pauses) and sigma")
        sigma = float(think.sigma)
        value = float(rng.lognormal(math.log(think.mean_s) - sigma * sigma / 2, sigma))
    else:
        raise WorkloadError(
            f"unknown think_time distribution {think.kind!r}; expected fixed, uniform, exponential or lognormal"
        )
    if think.min_s is not None:
        value = max(value, think.min_s)
    if think.max_s is not None:
        value = min(value, think.max_s)
    return max(value, 0.0)


def draw_length(dist: LengthDist, rng: np.random.Generator) -> int:
    """One length >= 1 from the distribution (normal/lognormal clipped to [min, max])."""
    lo = dist.min if dist.min is not None else 1
    hi = dist.max
    if dist.kind == "fixed":
        value = float(dist.value if dist.value is not None else 1)
    elif dist.kind == "uniform":
        if dist.min is None or dist.max is None:
            raise WorkloadError("uniform length needs min and max")
        value = float(rng.integers(dist.min, dist.max + 1))
    elif dist.kind == "normal":
        if dist.mean is None or dist.std is None:
            raise WorkloadError("normal length needs mean and std")
        value = float(np.round(rng.normal(dist.mean, dist.std)))
    elif dist.kind == "lognormal":
        if dist.mean is None or dist.std is None:
            raise WorkloadError("lognormal length needs mean (of lengths) and std (sigma of log-lengths)")
        sigma = float(dist.std)
        # mean is the mean of the lengths: E[X] = exp(mu + sigma^2/2).
        mu = math.log(dist.mean) - sigma * sigma / 2
        value = float(np.round(rng.lognormal(mu, sigma)))
    elif dist.kind == "choice":
        if not dist.values:
            raise WorkloadError("choice length needs values")
        p = None
        if dist.weights:
            w = np.asarray(dist.weights, dtype=float)
            p = w / w.sum()
        value = float(dist.values[int(rng.choice(len(dist.values), p=p))])
    else:
        raise WorkloadError(
            f"unknown length distribution {dist.kind!r}; expected fixed, uniform, normal, lognormal or choice"
        )
    value = max(value, float(lo), 1.0)
    # An unbounded normal or lognormal tail must not ask for a prompt bigger than memory (or an infinite one).
    value = min(value, float(hi if hi is not None else MAX_LENGTH_TOKENS), float(MAX_LENGTH_TOKENS))
    return int(value)


@dataclass(frozen=True)
class DatasetEntry:
    prompt: str
    output_tokens: int | None  # None: take the output distribution / max_tokens
    # A ShareGPT conversation's later human turns and the replies that followed (counted only when sent).
    later_turns: tuple[tuple[str, str | None], ...] = ()


def load_dataset(path: str, tokenizer: Tokenizer) -> tuple[DatasetEntry, ...]:
    """JSONL of {prompt, output_tokens} or ShareGPT (JSONL or a JSON array) conversations, read by the playbook's
    own reader (the loader checked the file with it already); a ShareGPT reply's length is its token count."""
    try:
        rows = read_dataset(path)
    except PlaybookError as exc:  # the file changed since the playbook loaded
        raise WorkloadError(f"dataset {exc}") from None
    if not rows:
        raise WorkloadError(f"dataset {path}: no usable rows; expected {{prompt, output_tokens}} or ShareGPT")
    return tuple(
        DatasetEntry(
            row.prompt,
            row.output_tokens if row.reply is None else max(1, tokenizer.count(row.reply)),
            row.later_turns,
        )
        for row in rows
    )


class _SharedTexts:
    """The texts requests share, each made once and drawn the same however lazily requests are: every prefix
    group's system prompt, and the dataset's rows in a fresh seeded permutation per pass."""

    def __init__(self, workload: Workload, tokenizer: Tokenizer):
        self.workload, self.tokenizer = workload, tokenizer
        self.dataset = load_dataset(workload.dataset, tokenizer) if workload.dataset else ()
        self._order: list[int] = []
        self._prefixes: dict[int, str] = {}

    def prefix(self, group: int) -> str:
        if group not in self._prefixes:
            # Each group's prefix is its own text (system prompt), identical across its requests.
            rng = _sub_rng(self.workload.seed, _PURPOSE_PREFIX, group)
            self._prefixes[group] = self.tokenizer.make_text(self.workload.prefix_tokens, rng)
        return self._prefixes[group]

    def dataset_entry(self, conv: int) -> DatasetEntry:
        size = len(self.dataset)
        while len(self._order) <= conv:
            passes = len(self._order) // size
            self._order.extend(_sub_rng(self.workload.seed, _PURPOSE_DATASET, passes).permutation(size).tolist())
        return self.dataset[self._order[conv]]


def _sub_rng(seed: int, *keys: int) -> np.random.Generator:
    # Independent stream per (purpose, index): request i is the same however lazily it is drawn.
    return np.random.default_rng([seed, *keys])


_PURPOSE_PLAN, _PURPOSE_TEXT, _PURPOSE_PREFIX, _PURPOSE_DATASET, _PURPOSE_REPLY, _PURPOSE_THINK = 1, 2, 3, 4, 5, 6


def iter_requests(workload: Workload, tokenizer: Tokenizer, model: str) -> Iterator[PlannedRequest]:
    """Every request the workload can send, in order: warm-up first, then measured; endless when
    the workload is bounded by duration_s instead of num_requests. Deterministic from workload.seed."""
    if workload.trace is not None:
        yield from _trace_requests(workload, tokenizer, model)
        return
    total: int | None = None
    if workload.num_requests is not None:
        total = workload.warmup_requests + workload.num_requests
    shared = _SharedTexts(workload, tokenizer)
    turns = max(1, workload.turns)
    index = 0
    for conv in itertools.count():
        rng = _sub_rng(workload.seed, _PURPOSE_PLAN, conv)
        group = int(rng.integers(0, max(1, workload.prefix_groups))) if workload.prefix_tokens > 0 else 0
        prefix = shared.prefix(group) if workload.prefix_tokens > 0 else ""
        history: list[tuple[str, str]] = []  # (user, assistant) turns already sent
        history_tokens = 0
        entry = shared.dataset_entry(conv) if shared.dataset else None
        # A dataset conversation sends each of its human turns, up to `turns`; a synthetic one exactly `turns`.
        conv_turns = min(turns, 1 + len(entry.later_turns)) if entry is not None else turns
        for turn in range(conv_turns):
            if total is not None and index >= total:
                return
            text_rng = _sub_rng(workload.seed, _PURPOSE_TEXT, conv, turn)
            if entry is not None and turn == 0:
                user_text = entry.prompt
                user_tokens = tokenizer.count(user_text)
                planned_out = entry.output_tokens
            elif entry is not None:
                user_text, reference = entry.later_turns[turn - 1]
                user_tokens = tokenizer.count(user_text)
                planned_out = max(1, tokenizer.count(reference)) if reference is not None else None
            else:
                user_tokens = draw_length(workload.input, rng)
                user_text = tokenizer.make_text(user_tokens, text_rng)
                planned_out = None
            if planned_out is None:
                planned_out = draw_length(workload.output, rng)
            max_tokens = workload.max_tokens if workload.max_tokens is not None else planned_out
            stream = bool(rng.random() < workload.streaming_fraction)
            target = workload.prefix_tokens + history_tokens + user_tokens
            prompt, msgs = compose_prompt(workload.api == "chat", prefix, history, user_text)
            counted = sum(tokenizer.count(c) for _, c in msgs) if msgs is not None else tokenizer.count(prompt or "")
            # Its own stream per turn, so adding think time changes no other draw of an existing workload.
            think_s = (
                draw_think_s(workload.think_time, _sub_rng(workload.seed, _PURPOSE_THINK, conv, turn)) if turn else 0.0
            )
            yield PlannedRequest(
                index=index,
                conversation_id=conv,
                group_id=group,
                turn=turn,
                prompt=prompt,
                messages=msgs,
                input_tokens_target=target,
                input_tokens=counted,
                max_tokens=max_tokens,
                stream=stream,
                is_warmup=index < workload.warmup_requests,
                model=model,
                prefix=prefix,
                user_text=user_text,
                think_s=think_s,
                final_turn=turn + 1 == conv_turns,
            )
            index += 1
            if turn + 1 < conv_turns:
                # A stand-in reply of the planned length: the load runner resends the server's real one instead.
                reply = tokenizer.make_text(max_tokens, _sub_rng(workload.seed, _PURPOSE_REPLY, conv, turn))
                history.append((user_text, reply))
                history_tokens += user_tokens + max_tokens


def _trace_requests(workload: Workload, tokenizer: Tokenizer, model: str) -> Iterator[PlannedRequest]:
    """A trace's window as planned requests: one single-turn request per row, sent at its (scaled) time."""
    for p in iter_trace_prompts(workload, tokenizer):
        stream = bool(_sub_rng(workload.seed, _PURPOSE_PLAN, p.index).random() < workload.streaming_fraction)
        chat = workload.api == "chat"
        yield PlannedRequest(
            index=p.index,
            conversation_id=p.index,
            group_id=p.group_id,
            turn=0,
            prompt=None if chat else p.text,
            messages=(("user", p.text),) if chat else None,
            input_tokens_target=p.input_tokens_target,
            input_tokens=tokenizer.count(p.text),
            max_tokens=workload.max_tokens if workload.max_tokens is not None else p.output_tokens,
            stream=stream,
            is_warmup=p.index < workload.warmup_requests,
            model=model,
            arrival_s=p.arrival_s,
            blocks=p.blocks,
        )


def build_requests(workload: Workload, tokenizer: Tokenizer, model: str) -> tuple[PlannedRequest, ...]:
    """All requests of a num_requests-bound workload (warm-up requests first, flagged).

    A duration-bound workload has no fixed count: pass `iter_requests(...)` to the load runner instead.
    """
    if workload.num_requests is None:
        raise WorkloadError(
            "workload is bounded by duration, not num_requests; use iter_requests() so the load runner can keep drawing"
        )
    return tuple(iter_requests(workload, tokenizer, model))
