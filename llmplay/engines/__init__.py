"""The engine registry: one adapter per engine kind, looked up by the playbook's `engine.kind`."""

from __future__ import annotations

from llmplay.engines import llamacpp, sglang, tgi, trtllm, vllm
from llmplay.engines.base import Engine, MetricNames, UnknownKnob
from llmplay.errors import PlaybookError

ENGINES: dict[str, Engine] = {m.ENGINE.kind: m.ENGINE for m in (vllm, sglang, tgi, trtllm, llamacpp)}


def get_engine(kind: str) -> Engine:
    try:
        return ENGINES[kind]
    except KeyError:
        raise PlaybookError(f"unknown engine kind '{kind}'; expected one of: {', '.join(ENGINES)}") from None


__all__ = ["ENGINES", "Engine", "MetricNames", "UnknownKnob", "get_engine"]
