"""Trace replay: how closely requests leave at their trace times, and what prompt synthesis costs.

    .venv/bin/python benchmarks/trace_replay.py [--trace PATH] [--requests 2000] [--rate 200] [--repeats 3]
        [--scales 1/64,1/8,1] [--big-mb 1024] [--json out.json]

Replay: a window of --requests of the shared Mooncake trace (lengths scaled to a test box: input / 64, output
capped at 8 tokens) against the instrument server in its own process, at a mean rate of --rate req/s; the
schedule lag of each request is when it left minus when the scaled trace says it should, on the load generator's
own clock. The prompts are drawn lazily in the feed's thread, as in a trial.
Synthesis: the whole trace turned into prompts at each --scales input scale with the word tokenizer (the prompts
streamed, not kept): requests/s, tokens/s, and the peak Python memory (tracemalloc) of the reader, the block
cache and one request at a time; plus the validate-time read of the whole trace.
Big trace (--big-mb N): the shared trace repeated, timestamps shifted, to N MB in /tmp; a window of 2,000 requests
at its very end is read (every line before it parsed and checked) and the process's peak memory reported: the
reader streams, so the peak stays the window's, not the file's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
import tracemalloc
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np

from llmplay.loadgen.runner import run_load_sync
from llmplay.loadgen.tokenizer import WordRatioTokenizer
from llmplay.loadgen.trace import BlockTexts, iter_trace_prompts
from llmplay.loadgen.workload import iter_requests
from llmplay.playbook.trace import read_window, scale_window, window_facts
from llmplay.spec import TraceSpec, Workload
from llmplay_testing.instrument import InstrumentServer

SHARED = Path("/work/shared/traces/mooncake-synthetic.jsonl")


def replay(trace: Path, requests: int, rate: float, repeats: int) -> list[dict[str, float]]:
    spec = TraceSpec(str(trace), "mooncake", input_scale=1 / 64, max_output_tokens=8)
    spec = replace(spec, facts=window_facts(scale_window(read_window(spec, requests), spec)))
    workload = Workload(trace=spec, rate=rate, num_requests=requests, request_timeout_s=30)
    out = []
    with InstrumentServer(process=True, use_uvloop=True) as srv:
        url = srv.url_for(ttft_ms=20, itl_ms=5)
        for _ in range(repeats):
            cpu0, t0 = time.process_time(), time.perf_counter()
            switches0, load0 = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw, os.getloadavg()[0]
            res = run_load_sync(url, workload, iter_requests(workload, WordRatioTokenizer(), "m"))
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            # Involuntary context switches: the kernel took the CPU from the sender (other processes wanted it).
            preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches0
            lag_ms = np.array([(r.sent_ns - r.scheduled_ns) / 1e6 for r in res.records])
            sched = sorted(r.scheduled_ns for r in res.records)
            out.append(
                {
                    "requests": len(res.records),
                    "errors": sum(not r.ok for r in res.records),
                    "scheduled_rate_req_s": (len(sched) - 1) / ((sched[-1] - sched[0]) / 1e9),
                    "lag_p50_ms": float(np.percentile(lag_ms, 50)),
                    "lag_p99_ms": float(np.percentile(lag_ms, 99)),
                    "lag_max_ms": float(lag_ms.max()),
                    "wall_s": wall,
                    "client_cpu_s": cpu,
                    "preempted": preempted,
                    "load_average": (load0 + os.getloadavg()[0]) / 2,
                }
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def synthesis(trace: Path, input_scale: float) -> dict[str, float]:
    spec = TraceSpec(str(trace), "mooncake", input_scale=input_scale)
    t0 = time.perf_counter()
    rows = read_window(spec)
    read_s = time.perf_counter() - t0
    facts = window_facts(scale_window(rows, spec))
    workload = Workload(trace=spec, rate=10.0, num_requests=facts.requests)
    tok = WordRatioTokenizer()
    blocks = BlockTexts(tok, workload.seed)
    tracemalloc.start()
    t0 = time.perf_counter()
    n = tokens = 0
    for p in iter_trace_prompts(workload, tok, blocks):
        n += 1
        tokens += tok.count(p.text)  # the load generator counts every prompt it sends
    wall = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The same pass again without tracemalloc, whose bookkeeping slows allocation: the speed figure.
    t0 = time.perf_counter()
    for p in iter_trace_prompts(workload, tok):
        tok.count(p.text)
    fast = time.perf_counter() - t0
    row = {
        "input_scale": input_scale,
        "requests": n,
        "prompt_tokens": tokens,
        "read_and_check_s": read_s,
        "requests_per_s": n / fast,
        "tokens_per_s": tokens / fast,
        "peak_mib": peak / 2**20,
        "blocks_made": blocks.made,
        "traced_wall_s": wall,
    }
    print(json.dumps(row), flush=True)
    return row


def big_trace(trace: Path, megabytes: int) -> dict[str, float]:
    big = Path(f"/tmp/trace-replay-{megabytes}mb.jsonl")
    lines = trace.read_text().splitlines()
    span_ms = json.loads(lines[-1])["timestamp"] + 1
    with big.open("w") as out:
        written, shift = 0, 0
        while written < megabytes << 20:
            for line in lines:
                row = json.loads(line)
                row["timestamp"] += shift
                text = json.dumps(row) + "\n"
                out.write(text)
                written += len(text)
            shift += span_ms
    try:
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        spec = TraceSpec(str(big), "mooncake", start_s=(shift - span_ms) / 1000, input_scale=1 / 64)
        t0 = time.perf_counter()
        rows = read_window(spec, 2000)
        wall = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        size = big.stat().st_size
        big.unlink()
    row = {
        "file_mib": size / 2**20,
        "window_requests": len(rows),
        "read_s": wall,
        "mib_per_s": size / 2**20 / wall,
        "peak_rss_before_mib": rss0,
        "peak_rss_after_mib": rss1,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=SHARED)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scales", default="1/64,1/8,1")
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument("--big-mb", type=int, default=0, help="also stream a trace of this many MB (0: no)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
        "big_trace": big_trace(args.trace, args.big_mb) if args.big_mb else None,
        "replay": [] if args.skip_replay else replay(args.trace, args.requests, args.rate, args.repeats),
        "synthesis": [synthesis(args.trace, float(Fraction(s))) for s in args.scales.split(",") if s],
        "load_average_at_end": os.getloadavg()[0],
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
