"""Greedy probes sent to a running engine (goals.quality): each prompt once at temperature 0, its answer's text,
tokens and log-probabilities as the engine gives them, in the chat or the completions shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from llmplay.jsonvalue import as_list, as_mapping, as_text


@dataclass(frozen=True)
class ProbeResult:
    """One probe's greedy answer: its text, its tokens and, where the engine gives them, their log-probabilities."""

    prompt: str
    text: str
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...] | None
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "text": self.text,
            "tokens": list(self.tokens),
            "logprobs": None if self.logprobs is None else list(self.logprobs),
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> ProbeResult:
        lp = raw.get("logprobs")
        return cls(
            str(raw["prompt"]),
            str(raw["text"]),
            tuple(str(t) for t in as_list(raw["tokens"])),
            None if lp is None else tuple(v for v in as_list(lp) if isinstance(v, (int, float))),
            as_text(raw.get("error")),
        )


def _probe_request(api: str, model: str, prompt: str, max_tokens: int, top: int) -> tuple[str, dict[str, object]]:
    # temperature 0 and a fixed seed: greedy decoding, so any change in the answer comes from the configuration.
    common: dict[str, object] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0}
    if api == "chat":
        body = {**common, "messages": [{"role": "user", "content": prompt}], "logprobs": True, "top_logprobs": top}
        return "/v1/chat/completions", body
    return "/v1/completions", {**common, "prompt": prompt, "logprobs": top}


def _parse_answer(api: str, prompt: str, doc: Mapping[str, object]) -> ProbeResult:
    choice = as_mapping((as_list(doc.get("choices")) or [{}])[0])
    answer = as_mapping(choice.get("message")).get("content") if api == "chat" else choice.get("text")
    text = str(answer) if answer else ""
    logprobs_doc = as_mapping(choice.get("logprobs"))
    content = [as_mapping(c) for c in as_list(logprobs_doc.get("content"))]
    if content:
        tokens = tuple(str(c.get("token", "")) for c in content)
        values = [c.get("logprob") for c in content]
        numbers = [float(v) for v in values if isinstance(v, (int, float))]
        return ProbeResult(prompt, text, tokens, tuple(numbers) if len(numbers) == len(values) else None)
    legacy_tokens = as_list(logprobs_doc.get("tokens"))
    if legacy_tokens:  # the OpenAI completions shape: parallel tokens / token_logprobs lists
        values = as_list(logprobs_doc.get("token_logprobs"))
        numbers = [v for v in values if isinstance(v, (int, float))]
        ok = len(values) == len(legacy_tokens) and len(numbers) == len(values)
        return ProbeResult(prompt, text, tuple(str(t) for t in legacy_tokens), tuple(numbers) if ok else None)
    # No token list: the text's characters stand in for tokens, so agreement still means "reproduced up to here".
    return ProbeResult(prompt, text, tuple(text), None)


def run_probes(
    client: httpx.Client, api: str, model: str, prompts: Sequence[str], max_tokens: int, top_logprobs: int = 1
) -> list[ProbeResult]:
    """Each prompt once, greedily, in order; a probe the engine refuses is kept with its error, never dropped."""
    results = []
    for prompt in prompts:
        path, body = _probe_request(api, model, prompt, max_tokens, top_logprobs)
        try:
            response = client.post(path, json=body)
            response.raise_for_status()
            results.append(_parse_answer(api, prompt, response.json()))
        except (httpx.HTTPError, ValueError) as exc:
            results.append(ProbeResult(prompt, "", (), None, error=f"{type(exc).__name__}: {exc}"[:300]))
    return results
