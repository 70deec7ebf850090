"""How well does the load generator measure? Streams from the instrument token server, whose chunk write
times are the truth, at 1/64/256/1024 concurrent streams: chunks/s, client CPU, TTFT/ITL error.

    .venv/bin/python benchmarks/loadgen.py [--streams 1,64,256,1024] [--itl-ms 20] [--seconds 6] [--peers]

The instrument runs as its own process (uvloop); truth for each request is what the server logged:
TTFT_true = first chunk write − request read, ITL_true = gaps between chunk writes. The client's error
is measured − true, per request (TTFT) and per chunk gap (ITL). With --peers, AIPerf and guidellm from
/tmp/peers-venv run against the same instrument where they install and start offline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil

from llmplay.loadgen.runner import run_load_sync
from llmplay.loadgen.tokenizer import WORDS, WordRatioTokenizer
from llmplay.loadgen.workload import build_requests
from llmplay.spec import LengthDist, Workload
from llmplay_testing.instrument import InstrumentServer

ROOT = Path(__file__).resolve().parents[1]

PEERS_VENV = Path("/tmp/peers-venv")


def measure_llmplay(
    srv: InstrumentServer, streams: int, *, ttft_ms: float, itl_ms: float, tokens: int, seconds: float
) -> dict:
    per_request_s = (ttft_ms + (tokens - 1) * itl_ms) / 1000
    per_user = max(2, round(seconds / per_request_s))
    wl = Workload(
        concurrency=streams,
        num_requests=streams * per_user,
        input=LengthDist("fixed", value=4),
        output=LengthDist("fixed", value=tokens),
        request_timeout_s=120,
    )
    reqs = tuple(replace(r, prompt=f"req {r.index}") for r in build_requests(wl, WordRatioTokenizer(), "m"))
    srv.fetch_log()
    server = psutil.Process(srv._proc.pid) if srv._proc else None
    s_cpu0 = sum(server.cpu_times()[:2]) if server else 0.0
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = run_load_sync(srv.url_for(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens), wl, reqs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    s_cpu = (sum(server.cpu_times()[:2]) - s_cpu0) if server else float("nan")
    log = {e["key"]: e for e in srv.fetch_log()}
    ttft_err, itl_err, server_late, transit = [], [], [], []
    chunks = 0
    errors = 0
    for r in res.records:
        truth = log.get(f"req {r.index}")
        if r.error_kind is not None or truth is None:
            errors += 1
            continue
        sent = np.asarray(truth["send_ns"], dtype=np.int64)
        got = np.asarray(r.chunk_ns, dtype=np.int64)
        chunks += len(got)
        if len(got) != len(sent):
            errors += 1
            continue
        # True TTFT: the server's first chunk write − the client's request write (one clock), so the
        # error is what the client adds; the server reading the request late is the server's latency.
        ttft_err.append(((got[0] - r.sent_ns) - (sent[0] - r.sent_ns)) / 1e6)
        transit.append((truth["recv_ns"] - r.sent_ns) / 1e6)
        itl_err.extend(((np.diff(got) - np.diff(sent)) / 1e6).tolist())
        scripted = truth["recv_ns"] + int(ttft_ms * 1e6) + (np.arange(len(sent)) * itl_ms * 1e6).astype(np.int64)
        server_late.extend(((sent - scripted) / 1e6).tolist())
    te, ie, sl = np.abs(ttft_err), np.abs(itl_err), np.asarray(server_late)
    return {
        "tool": "llmplay",
        "streams": streams,
        "requests": len(res.records),
        "errors": errors,
        "chunks": chunks,
        "wall_s": wall,
        "chunks_per_s": chunks / wall,
        "cpu_s_per_1k_chunks": cpu / chunks * 1000 if chunks else float("nan"),
        "server_cpu_s_per_1k_chunks": s_cpu / chunks * 1000 if chunks else float("nan"),
        "ttft_err_p50_ms": float(np.percentile(te, 50)),
        "ttft_err_p99_ms": float(np.percentile(te, 99)),
        "itl_err_p50_ms": float(np.percentile(ie, 50)) if ie.size else float("nan"),
        "itl_err_p99_ms": float(np.percentile(ie, 99)) if ie.size else float("nan"),
        "server_late_p99_ms": float(np.percentile(sl, 99)) if sl.size else float("nan"),
        "request_transit_p99_ms": float(np.percentile(transit, 99)) if transit else float("nan"),
        "ideal_chunks_per_s": streams * tokens / (per_request_s + 0.0),
    }


TOKENIZER_DIR = Path("/tmp/loadgen-peers/word-tokenizer")
_MAKE_TOKENIZER = r"""
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast
words = sys.argv[2].split(",")
vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
for w in words + [f"t{i}" for i in range(4096)] + ["req"] + [str(i) for i in range(100000)]:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
fast.save_pretrained(sys.argv[1])
"""


def peer_tokenizer() -> Path:
    """A word-level tokenizer.json made here (peers insist on a HF tokenizer; none can be downloaded)."""
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        subprocess.run(
            [
                str(PEERS_VENV / "bin" / "python"),
                "-c",
                _MAKE_TOKENIZER,
                str(TOKENIZER_DIR),
                ",".join(sorted(set(WORDS))),
            ],
            check=True,
            capture_output=True,
        )
    return TOKENIZER_DIR


def try_peer(
    name: str,
    srv: InstrumentServer,
    streams: int,
    *,
    ttft_ms: float,
    itl_ms: float,
    tokens: int,
    seconds: float,
    workdir: Path,
) -> dict:
    """Run a peer tool on the same instrument; report its own TTFT/ITL p50/p99 beside the truth."""
    exe = PEERS_VENV / "bin" / name
    if not exe.exists():
        return {"tool": name, "streams": streams, "status": f"{name} not installed in {PEERS_VENV}"}
    url = srv.url_for(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)
    per_request_s = (ttft_ms + (tokens - 1) * itl_ms) / 1000
    count = streams * max(2, round(seconds / per_request_s))
    out = workdir / f"{name}-{streams}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # Not HF_HUB_OFFLINE: aiperf then insists on a hub cache snapshot instead of the local directory.
    env = {**os.environ, "NO_COLOR": "1"}
    if name == "aiperf":
        cmd = [
            str(exe),
            "profile",
            "--model",
            "instrument",
            "--url",
            url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--concurrency",
            str(streams),
            "--request-count",
            str(count),
            "--synthetic-input-tokens-mean",
            "4",
            "--output-tokens-mean",
            str(tokens),
            "--tokenizer",
            str(peer_tokenizer()),
            "--artifact-dir",
            str(out),
            "--ui-type",
            "none",
        ]
    else:
        cmd = [
            str(exe),
            "run",
            "--backend",
            f"kind=openai_http,target={url},model=instrument",
            "--profile",
            f"kind=concurrent,streams={streams}",
            "--constraint",
            f"kind=max_requests,count={count}",
            "--tokenizer",
            f"kind=hf_auto,model={peer_tokenizer()}",
            "--data",
            f"kind=synthetic_text,prompt_tokens=4,output_tokens={tokens}",
            "--output",
            f"kind=json,path={out / 'benchmarks.json'}",
            "--disable-progress",
        ]
    srv.fetch_log()
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=out)
    except OSError as exc:
        return {"tool": name, "streams": streams, "status": f"cannot start: {exc}"}
    samples: list[tuple[int, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_tree_cpu, args=(proc.pid, samples, stop), daemon=True)
    sampler.start()
    try:
        text, _ = proc.communicate(timeout=max(240, seconds * 20))
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
    stop.set()
    sampler.join()
    wall = time.perf_counter() - t0
    log = srv.fetch_log()
    chunks = sum(len(e["send_ns"]) for e in log)
    if proc.returncode != 0 or chunks == 0:
        last = " | ".join(ln.strip() for ln in (text or "").strip().splitlines()[-3:])[:300]
        return {"tool": name, "streams": streams, "status": f"exit {proc.returncode}: {last}"}
    # The load window as the instrument saw it: first request read → last chunk written.
    w0 = min(e["recv_ns"] for e in log)
    w1 = max(e["send_ns"][-1] for e in log if e["send_ns"])
    cpu = _cpu_between(samples, w0, w1)
    true_ttft = np.array([(e["send_ns"][0] - e["recv_ns"]) / 1e6 for e in log if e["send_ns"]])
    true_itl = np.concatenate([np.diff(e["send_ns"]) / 1e6 for e in log if len(e["send_ns"]) > 1])
    row = {
        "tool": name,
        "streams": streams,
        "status": "ok",
        "chunks": chunks,
        "wall_s": wall,
        "window_s": (w1 - w0) / 1e9,
        "chunks_per_s": chunks / ((w1 - w0) / 1e9),
        "cpu_s_per_1k_chunks": cpu / chunks * 1000 if cpu is not None else float("nan"),
        "true_ttft_p50_ms": float(np.percentile(true_ttft, 50)),
        "true_ttft_p99_ms": float(np.percentile(true_ttft, 99)),
        "true_itl_p50_ms": float(np.percentile(true_itl, 50)),
        "true_itl_p99_ms": float(np.percentile(true_itl, 99)),
        "raw_output_tail": (text or "")[-2000:],
    }
    row.update(_peer_reported(name, out))
    return row


def _sample_tree_cpu(pid: int, samples: list[tuple[int, float]], stop: threading.Event) -> None:
    """CPU seconds of a process and all its descendants, sampled every 0.1 s on the perf_counter clock."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    while not stop.is_set():
        total = 0.0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
        except psutil.Error:
            return
        samples.append((time.perf_counter_ns(), total))
        stop.wait(0.1)


def _cpu_between(samples: list[tuple[int, float]], t0_ns: int, t1_ns: int) -> float | None:
    if len(samples) < 2:
        return None
    ts = np.array([s[0] for s in samples], dtype=float)
    cpu = np.array([s[1] for s in samples])
    return float(np.interp(t1_ns, ts, cpu) - np.interp(t0_ns, ts, cpu))


def _peer_reported(name: str, out: Path) -> dict:
    """The peer's own TTFT/ITL p50/p99 (ms), read from its export."""
    try:
        if name == "aiperf":
            d = json.loads((out / "profile_export_aiperf.json").read_text())
            return {
                "their_ttft_p50_ms": d["time_to_first_token"]["p50"],
                "their_ttft_p99_ms": d["time_to_first_token"]["p99"],
                "their_itl_p50_ms": d["inter_token_latency"]["p50"],
                "their_itl_p99_ms": d["inter_token_latency"]["p99"],
            }
        files = sorted(out.rglob("*.json"))
        d = json.loads(files[-1].read_text()) if files else {}
        bench = d["benchmarks"][0]["metrics"]
        ttft, itl = bench["time_to_first_token_ms"]["successful"], bench["inter_token_latency_ms"]["successful"]
        return {
            "their_ttft_p50_ms": ttft["median"],
            "their_ttft_p99_ms": ttft["percentiles"]["p99"],
            "their_itl_p50_ms": itl["median"],
            "their_itl_p99_ms": itl["percentiles"]["p99"],
        }
    except (OSError, KeyError, IndexError, TypeError, ValueError) as exc:
        return {"their_metrics": f"unreadable: {type(exc).__name__}: {exc}"}


def fmt_table(rows: list[dict], peers: list[dict]) -> str:
    head = (
        "| streams | chunks/s (ideal) | client CPU s / 1k chunks | TTFT err p50 / p99 ms | "
        "ITL err p50 / p99 ms | server CPU s / 1k | server late p99 ms | req transit p99 ms | errors |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['streams']} | {r['chunks_per_s']:,.0f} ({r['ideal_chunks_per_s']:,.0f}) | "
            f"{r['cpu_s_per_1k_chunks']:.3f} | {r['ttft_err_p50_ms']:.2f} / {r['ttft_err_p99_ms']:.2f} | "
            f"{r['itl_err_p50_ms']:.2f} / {r['itl_err_p99_ms']:.2f} | {r['server_cpu_s_per_1k_chunks']:.3f} | "
            f"{r['server_late_p99_ms']:.2f} | {r['request_transit_p99_ms']:.2f} | "
            f"{r['errors']} |"
        )
    if peers:
        lines += [
            "",
            "| peer | streams | chunks/s (ratio to llmplay) | CPU s / 1k chunks (ratio) | "
            "its TTFT p50 / p99 ms (truth) | its ITL p50 / p99 ms (truth) | status |",
            "|---|---|---|---|---|---|---|",
        ]
        ours = {r["streams"]: r for r in rows}
        for p in peers:
            if p.get("status") != "ok":
                lines.append(f"| {p['tool']} | {p['streams']} | - | - | - | - | {p['status']} |")
                continue
            o = ours.get(p["streams"])
            ratio_c = p["chunks_per_s"] / o["chunks_per_s"] if o else float("nan")
            ratio_cpu = p["cpu_s_per_1k_chunks"] / o["cpu_s_per_1k_chunks"] if o else float("nan")
            ttft = (
                f"{p.get('their_ttft_p50_ms', float('nan')):.2f} / {p.get('their_ttft_p99_ms', float('nan')):.2f}"
                f" ({p['true_ttft_p50_ms']:.2f} / {p['true_ttft_p99_ms']:.2f})"
            )
            itl = (
                f"{p.get('their_itl_p50_ms', float('nan')):.2f} / {p.get('their_itl_p99_ms', float('nan')):.2f}"
                f" ({p['true_itl_p50_ms']:.2f} / {p['true_itl_p99_ms']:.2f})"
            )
            lines.append(
                f"| {p['tool']} | {p['streams']} | {p['chunks_per_s']:,.0f} ({ratio_c:.2f}x) | "
                f"{p['cpu_s_per_1k_chunks']:.3f} ({ratio_cpu:.2f}x) | {ttft} | {itl} | "
                f"{p.get('their_metrics', 'ok')} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,64,256,1024")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=5.0, help="target length of each point")
    ap.add_argument("--peers", action="store_true", help="also run aiperf and guidellm from /tmp/peers-venv")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    rows, peers = [], []
    with InstrumentServer(process=True, use_uvloop=True) as srv:
        for n in (int(x) for x in args.streams.split(",")):
            row = measure_llmplay(
                srv, n, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens, seconds=args.seconds
            )
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.peers:
                for name in ("aiperf", "guidellm"):
                    p = try_peer(
                        name,
                        srv,
                        n,
                        ttft_ms=args.ttft_ms,
                        itl_ms=args.itl_ms,
                        tokens=args.tokens,
                        seconds=args.seconds,
                        workdir=Path("/tmp/loadgen-peers"),
                    )
                    peers.append(p)
                    print(
                        json.dumps({k: v for k, v in p.items() if k != "raw_output_tail"}), file=sys.stderr, flush=True
                    )
    print(
        f"instrument: TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, {args.tokens} tokens/request; "
        f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}"
    )
    print(fmt_table(rows, peers))
    if args.json:
        Path(args.json).write_text(json.dumps({"llmplay": rows, "peers": peers}, indent=2))


if __name__ == "__main__":
    main()
