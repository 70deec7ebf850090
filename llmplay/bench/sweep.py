"""One workload against an already running endpoint: discover the model, build requests, run load, summarize."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from llmplay.errors import InfrastructureError
from llmplay.loadgen.records import LoadResult
from llmplay.loadgen.runner import run_load_sync
from llmplay.loadgen.tokenizer import Tokenizer, make_tokenizer
from llmplay.loadgen.workload import PlannedRequest, iter_requests
from llmplay.metrics import Summary, summarize
from llmplay.spec import Workload


@dataclass(frozen=True)
class BenchResult:
    url: str
    model: str
    workload: Workload
    tokenizer: str
    load: LoadResult
    summary: Summary

    def to_json(self) -> dict[str, object]:
        out = self.summary.to_json()
        out.update(
            {
                "url": self.url,
                "model": self.model,
                "mode": self.load.mode,
                "schedule_lag_p99_s": self.load.schedule_lag_p99_s,
                "warmup_duration_s": self.load.warmup_duration_s,
            }
        )
        return out


def discover_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model id of GET /v1/models."""
    try:
        resp = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=timeout_s, trust_env=False)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as exc:
        raise InfrastructureError(
            f"cannot list models at {url}/v1/models ({exc}); "
            "expected an OpenAI-compatible server, or pass the model name"
        ) from exc


def run_bench(
    url: str,
    workload: Workload,
    *,
    model: str | None = None,
    json_path: str | os.PathLike[str] | None = None,
    slo_s: Mapping[str, float] | None = None,
    progress: bool = True,
    tokenizer: Tokenizer | str = "auto",
) -> BenchResult:
    """Run one workload against `url` and summarize it; writes the summary JSON to json_path if given."""
    model = model or discover_model(url)
    tok = make_tokenizer(tokenizer, url) if isinstance(tokenizer, str) else tokenizer
    requests: Iterable[PlannedRequest] = iter_requests(workload, tok, model)
    if workload.num_requests is not None:
        requests = tuple(requests)  # bounded: build every prompt before the clock starts
    try:
        load = run_load_sync(url, workload, requests, progress=progress, tokenizer=tok)
    finally:
        if isinstance(tokenizer, str):
            tok.close()  # ours to close: we made it
    summary = summarize(load.records, load.duration_s, slo_s or {}, tokenizer=tok.name)
    result = BenchResult(url=url, model=model, workload=workload, tokenizer=tok.name, load=load, summary=summary)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
    return result


def run_sweep(
    url: str,
    workload: Workload,
    *,
    model: str | None = None,
    json_path: str | os.PathLike[str] | None = None,
    slo_s: Mapping[str, float] | None = None,
    progress: bool = True,
    tokenizer: Tokenizer | str = "auto",
) -> tuple[BenchResult, ...]:
    """One bench per sweep value: concurrency for closed-loop workloads, rate for open-loop ones (the summary JSON
    at `json_path` only for a workload without a sweep: one file cannot hold several points)."""
    if not workload.sweep:
        return (
            run_bench(
                url, workload, json_path=json_path, model=model, slo_s=slo_s, progress=progress, tokenizer=tokenizer
            ),
        )
    field = "concurrency" if workload.concurrency is not None else "rate"
    out = []
    for value in workload.sweep:
        point = (
            replace(workload, concurrency=int(value))
            if field == "concurrency"
            else replace(workload, rate=float(value))
        )
        out.append(run_bench(url, point, model=model, slo_s=slo_s, progress=progress, tokenizer=tokenizer))
    return tuple(out)
