"""Builds a synthetic but realistic run archive through the real RunArchive API, for archive/report/compare tests.

Three steps on a baseline: one kept, one rejected (with a failed trial and its engine log), one inconclusive;
per-request records with seeded random timings, telemetry with NVML on some trials and without on others.
Secrets are planted where a careless writer would leak them (env, log, URLs, error messages).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from llmplay.archive.model import (
    ConfigRecord,
    Diagnosis,
    EngineDescription,
    Finding,
    GateResult,
    MemoryFacts,
    MetricDelta,
    RooflineFacts,
    RuleChecked,
    StepVerdict,
    TrialRecord,
    TuningRow,
)
from llmplay.archive.run_facts import ClusterFacts, GpuInventory, RunEnvironment, RunOverrides
from llmplay.archive.writer import RunArchive
from llmplay.catalog import RECORD_METRICS
from llmplay.loadgen.records import RequestRecord, records_to_dataframe
from llmplay.metrics import summarize, usd_per_1m_tokens
from llmplay.playbook.load import load_playbook
from llmplay.report import publish_report
from llmplay.spec import ThinkTime, TraceFacts, TraceSpec, Workload
from llmplay.stats.decide import TrialSample, evaluate_gates, sample_from_records
from llmplay.stats.intervals import PAIRED_LOG
from llmplay.telemetry.sampler import TelemetrySeries
from llmplay.tuning.steps import tuning_record_row

SECRET = "hf_sEcReTvAlUe0123456789"
URL_PASSWORD = "pa55w0rdXYZ"
SECRETS = (SECRET, URL_PASSWORD)

PLAYBOOK_TEXT = textwrap.dedent("""\
    apiVersion: llmplay/v1
    kind: Playbook
    metadata:
      name: synthetic-tune
      version: "2.1"
      owner: tests
      description: Synthetic archive for report tests
    goals:
      gates:
        - ttft.p95 < 2s
        - throughput.output_tok_s > 20
        - errors.rate < 1%
      objective: {maximize: throughput.output_tok_s, min_effect: 5%}
      guards:
        - {metric: ttft.p95, tolerance: 50%}
        - {metric: errors.rate, tolerance: 1pp}
      slo: {ttft: 2s, tpot: 200ms}
    workload:
      api: completions
      input: {lognormal: {mean: 96, sigma: 0.4, min: 16, max: 256}}
      output: {fixed: 32}
      prefix_tokens: 32
      concurrency: 4
      seed: 42
      warmup: 1s
      duration: 8s
    trials:
      repeats: 2
      interleave: true
    cost:
      host_usd_per_hour: $0.10
    runtime: docker
    engine:
      kind: llamacpp
      image: llmplay/llamacpp-cpu:local
      model: /models/tiny.gguf
      args: {parallel: 1, ctx_size: 4096, threads: 2}
      env: {HF_TOKEN: "${env:HF_TOKEN}"}
    steps:
      - name: parallel-4
        description: Four decode slots.
        set: {parallel: 4}
      - name: flash-attention
        set: {flash_attn: true}
      - name: kv-cache-q8
        set: {kv_cache_dtype: q8_0}
    """)


@dataclass(frozen=True)
class Speed:
    """How a configuration behaves: first-token and per-token latency in seconds."""

    ttft_s: float
    itl_s: float


SPEEDS = {
    "baseline": Speed(0.30, 0.030),
    "parallel-4": Speed(0.12, 0.012),
    "flash-attention": Speed(0.16, 0.017),
    "kv-cache-q8": Speed(0.12, 0.0121),
}


def fake_records(
    rng: np.random.Generator,
    speed: Speed,
    *,
    n: int = 48,
    errors: int = 0,
    concurrency: int = 4,
    output_tokens: int = 32,
    streamed: bool = True,
) -> tuple[list[RequestRecord], float]:
    """Closed-loop requests with lognormal TTFT and jittered inter-token gaps; returns records and measured duration.

    streamed=False: every request non-streamed (one body, no chunks), so the trials have no streamed TTFT."""
    t0 = 10_000_000_000_000  # perf_counter_ns-like origin
    users = [t0] * concurrency
    records = []
    warmup = concurrency
    for i in range(n + warmup):
        u = int(np.argmin(users))
        sent = users[u] + int(rng.uniform(0, 2e6))
        in_tok = int(np.clip(rng.lognormal(np.log(96), 0.4), 16, 256))
        ttft = speed.ttft_s * rng.lognormal(0, 0.25) * (1 + in_tok / 400)
        gaps = speed.itl_s * rng.lognormal(0, 0.15, size=output_tokens - 1)
        first = sent + int(ttft * 1e9)
        chunks = (first, *(first + np.cumsum(gaps * 1e9).astype(np.int64)).tolist())
        failed = i >= warmup and (i - warmup) < errors
        if failed:
            end = first
            rec = RequestRecord(
                i,
                i < warmup,
                True,
                users[u],
                sent,
                None,
                None,
                (),
                None,
                in_tok,
                0,
                "usage",
                None,
                503,
                "http_5xx",
                f"503 from http://admin:{URL_PASSWORD}@127.0.0.1:8080/v1",
                0.0,
            )
        else:
            end = int(chunks[-1])
            rec = RequestRecord(
                i,
                i < warmup,
                streamed,
                users[u],
                sent,
                first if streamed else end,
                first if streamed else end,
                tuple(int(c) for c in chunks) if streamed else (end,),
                end,
                in_tok,
                output_tokens,
                "usage",
                "length",
                200,
                None,
                None,
                0.0,
                2048,
                first_text_ns=first if streamed else end,
            )
        records.append(rec)
        users[u] = end + int(rng.uniform(0, 1e6))
    measured = [r for r in records if not r.is_warmup]
    duration_s = (max((r.end_ns or r.sent_ns) for r in measured) - min(r.sent_ns for r in measured)) / 1e9
    return records, duration_s


def fake_telemetry(rng: np.random.Generator, duration_s: float, *, nvml: bool, busy: float) -> pd.DataFrame:
    rows: list[tuple[float, str, str, Any, float]] = []
    cpu = 0.0
    for t in np.arange(0.0, duration_s, 0.5):
        cpu += 0.5 * 2 * busy
        rows += [
            (t, "proc", "proc.cpu_s", None, cpu),
            (t, "proc", "proc.rss_bytes", None, 6.0e8 + 1e6 * t),
            (t, "engine", "engine.kv_cache_usage_frac", None, float(np.clip(busy * rng.uniform(0.3, 0.6), 0, 1))),
            (t, "engine", "engine.running", None, float(rng.integers(1, 5))),
            (t, "engine", "engine.waiting", None, float(max(0, int(rng.integers(-2, 3))))),
        ]
        if nvml:
            rows += [
                (t, "nvml", "gpu.util_frac", 0, float(np.clip(busy + rng.normal(0, 0.05), 0, 1))),
                (t, "nvml", "memory.used_bytes", 0, 6.2e10 + 1e8 * rng.random()),
                (t, "nvml", "memory.total_bytes", 0, 8.0e10),
            ]
    df = pd.DataFrame(rows, columns=["t_s", "source", "metric", "gpu", "value"])
    df["gpu"] = df["gpu"].astype("Int64")
    return df


PRICE_USD_PER_HOUR = 0.10  # the synthetic run's GPU and host together


def _summary(records: list[RequestRecord], duration_s: float, telemetry: pd.DataFrame | None) -> dict[str, float]:
    out = {
        k: v for k, v in summarize(records, duration_s, {"ttft": 2.0, "tpot": 0.2}).as_dict().items() if v is not None
    }
    out["duration_s"] = duration_s
    if telemetry is not None:
        out.update(TelemetrySeries.from_frame(telemetry, duration_s=duration_s).summary())
    cost = usd_per_1m_tokens(PRICE_USD_PER_HOUR, out.get("throughput.output_tok_s"))
    if cost is not None:
        out["cost.usd_per_1m_tokens"] = cost
    return out


LOG_TAIL = (
    f"llama server listening at http://0.0.0.0:8080\nHF_TOKEN={SECRET}\n"
    "ggml_vulkan: no devices\nerror: flash attention not supported on this build\nexit 1\n"
)


# A replayed trace window's facts, as the playbook loader measures them (llmplay.playbook.trace.window_facts).
TRACE_FACTS = TraceFacts(
    requests=76,
    span_s=19.556,
    input_mean_tokens=129.8,
    output_mean_tokens=14.8,
    longest_input_tokens=564,
    longest_output_tokens=32,
    longest_line=41,
    longest_tokens=580,
    prefix_reuse=0.048,
)


def _shaped(workload: Workload, shape: str) -> Workload:
    """The playbook's workload as a trace replay ("trace") or three-turn conversations ("chat")."""
    if shape == "trace":
        trace = TraceSpec(
            "/data/traces/mooncake.jsonl", "mooncake", duration_s=20.0, input_scale=0.01, facts=TRACE_FACTS
        )
        return replace(workload, trace=trace, rate=2.0, concurrency=None, prefix_tokens=0)
    if shape == "chat":
        return replace(workload, api="chat", turns=3, think_time=ThinkTime("fixed", 0.5), session_header="x-session-id")
    return workload


def _shape_figures(rng: np.random.Generator, shape: str, cached: bool) -> dict[str, float]:
    """What a shaped workload adds to a trial's summary: reuse expected and achieved; for conversations the
    session figures and TTFT by turn (later turns resend the conversation so far, so they reuse more)."""
    if not shape:
        return {}
    expected = 0.05 if shape == "trace" else 0.6
    out = {"prefix_reuse.expected": expected, "prefix_reuse.achieved": expected * 0.9 if cached else 0.0}
    out["engine.prefix_cache_hit_rate"] = out["prefix_reuse.achieved"]
    if shape == "chat":
        out |= {"session.count": 16.0, "session.turns_mean": 3.0}
        out |= {"session.duration_s.p50": float(rng.uniform(2, 3)), "session.duration_s.p95": float(rng.uniform(3, 4))}
        for turn in (1, 2, 3):
            out[f"ttft_turn.{turn}.p50"] = 0.2 * turn * (0.5 if cached else 1.0)
            out[f"ttft_turn.{turn}.mean"] = 0.22 * turn * (0.5 if cached else 1.0)
    return out


def _capacity_figures(rng: np.random.Generator, summary: dict[str, float]) -> dict[str, float]:
    """What a capacity search adds to a trial's summary (tuning.capacity): the boundary and its cost."""
    rate = float(summary.get("throughput.req_s", 1.0)) * float(rng.uniform(1.1, 1.3))
    tok_s = rate * 32
    return {
        "capacity.rate": rate,
        "capacity.concurrency": float(rng.integers(2, 9)),
        "capacity.output_tok_s": tok_s,
        "cost.usd_per_1m_tokens_at_slo": PRICE_USD_PER_HOUR / (tok_s * 3600) * 1e6,
    }


def make_archive(
    root: Path,
    *,
    seed: int = 7,
    slowdown: float = 1.0,
    name_suffix: str = "",
    streamed: bool = True,
    shape: str = "",
    capacity: bool = False,
) -> Path:
    """Build a finished archive under root and return its run directory. slowdown > 1 makes every config slower
    (a planted regression for compare); streamed=False sends every request non-streamed (no streamed TTFT);
    shape "trace" or "chat" archives a trace replay or three-turn conversations with their reuse figures;
    capacity=True gives every trial capacity figures too, as a run of capacity searches has (the widest record)."""
    root = Path(root)
    pb_path = root / f"synthetic{name_suffix}.yaml"
    root.mkdir(parents=True, exist_ok=True)
    pb_path.write_text(PLAYBOOK_TEXT)
    playbook = load_playbook(pb_path)
    gpu = "NVIDIA H100 80GB HBM3"
    env = RunEnvironment(
        host="bench-01",
        docker="26.1.4",
        user="tester",
        llmplay_version="0.1.0",
        python="3.11.9",
        gpu=GpuInventory(name=gpu, names=(gpu,), count=1, driver="550.54.15", cuda="12.4"),
        seed=42,
        started_utc="2025-01-02T03:04:05Z",
        # A cluster address with credentials in it: the header's one place a secret can come from, redacted.
        cluster=ClusterFacts(f"ray://bob:{URL_PASSWORD}@ray.internal:10001", "2.40.0", "docker", None, 1.0, ()),
    )
    archive = RunArchive.create(
        root / "reports", playbook, overrides=RunOverrides(repeats=2), environment=env, secrets=list(SECRETS)
    )
    rng = np.random.default_rng(seed)

    def config(cid: str, args: dict[str, Any]) -> ConfigRecord:
        # The playbook's own engine and workload, as the runner archives them (the secret resolved, to be redacted).
        argv = ("llama-server", "-m", "/models/tiny.gguf", *(f"--{k.replace('_', '-')}={v}" for k, v in args.items()))
        return ConfigRecord(
            cid,
            replace(playbook.engine, gpus=1, args=args, env={"HF_TOKEN": SECRET}),
            _shaped(playbook.workload, shape),
            argv,
            "docker run --rm -e HF_TOKEN=*** llmplay/llamacpp-cpu:local " + " ".join(argv[1:]),
        )

    args = {"parallel": 1, "ctx_size": 4096, "threads": 2}
    archive.write_config(config("baseline", args))
    counter = [0]
    by_config: dict[str, list[dict[str, float]]] = {}
    samples: dict[str, list[TrialSample]] = {}

    def trial(cid: str, step: str | None, role: str, repeat: int, *, fail: bool = False, errors: int = 0) -> str:
        counter[0] += 1
        tid = f"t{counter[0]:03d}"
        if fail:
            rec = TrialRecord(
                tid,
                cid,
                step,
                role,
                repeat,
                "failed",
                "2025-01-02T03:05:00Z",
                3.2,
                {},
                error="engine exited with code 1 before becoming healthy",
            )
            archive.write_trial(rec, None, None, LOG_TAIL)
            return tid
        sp = SPEEDS[cid]
        sp = Speed(sp.ttft_s * slowdown, sp.itl_s * slowdown)
        records, duration = fake_records(rng, sp, errors=errors, streamed=streamed)
        nvml = counter[0] % 3 != 0
        tele = fake_telemetry(rng, duration, nvml=nvml, busy=0.9 if cid != "baseline" else 0.35)
        summary = _summary(records, duration, tele) | _shape_figures(rng, shape, cid != "baseline")
        if capacity:
            summary |= _capacity_figures(rng, summary)
        by_config.setdefault(cid, []).append(summary)
        frame = records_to_dataframe(records)
        samples.setdefault(cid, []).append(
            sample_from_records(frame, duration, summary, playbook.goals.slo_s, PRICE_USD_PER_HOUR, repeat=repeat)
        )
        notes = () if nvml else ("no NVML: libnvidia-ml.so.1 not found",)
        rec = TrialRecord(
            tid,
            cid,
            step,
            role,
            repeat,
            "ok",
            "2025-01-02T03:05:00Z",
            duration + 4.0,
            summary,
            engine_describe=EngineDescription(
                engine_version="b4567 (abc123)",
                image="llmplay/llamacpp-cpu:local",
                image_digest="sha256:" + "ab" * 32,
                container_id="c0ffee",
            ),
            notes=(*notes, "tokenizer: engine /tokenize"),
        )
        archive.write_trial(rec, frame, tele, f"server started\nHF_TOKEN={SECRET}\nslot 0 ready\n")
        return tid

    def delta(metric: str, a: float, b: float, spread: float, lower_better: bool) -> MetricDelta:
        rel = (b - a) / a
        return MetricDelta(
            metric,
            a,
            b,
            rel,
            rel - spread,
            rel + spread,
            better=(rel < 0) == lower_better,
            units=2,
            method=PAIRED_LOG,
            confidence=0.95,
        )

    def mean(cid: str, metric: str) -> float:
        vals = [s[metric] for s in by_config[cid] if metric in s]
        return float(np.mean(vals))

    def row(cid: str, trials: list[str], verdict: StepVerdict | None, failed: int = 0) -> TuningRow:
        # The runner's own row, so report tests read the shape a real run writes.
        return tuning_record_row(cid, trials, failed, samples.get(cid, []), verdict)

    plan: list[tuple[str, dict[str, Any], str, str]] = [
        ("parallel-4", {"parallel": 4}, "kept", "args.parallel: 1 -> 4"),
        ("flash-attention", {"flash_attn": True}, "rejected", "args.flash_attn: (unset) -> true"),
        ("kv-cache-q8", {"kv_cache_dtype": "q8_0"}, "inconclusive", "args.kv_cache_dtype: (unset) -> q8_0"),
    ]
    best, best_args = "baseline", args
    rows = []
    verdicts = []
    for index, (step, change, verdict_kind, described) in enumerate(plan, start=1):
        cand_args = {**best_args, **change}
        archive.write_config(config(step, cand_args))
        tb, tc = [], []
        for rep in range(2):
            tb.append(trial(best, step, "baseline", rep))
            fail = step == "flash-attention" and rep == 0
            tc.append(trial(step, step, "candidate", rep, fail=fail, errors=1 if step == "flash-attention" else 0))
        a, b = mean(best, "throughput.output_tok_s"), mean(step, "throughput.output_tok_s")
        objective = delta("throughput.output_tok_s", a, b, 0.04 if verdict_kind != "inconclusive" else 0.06, False)
        guard_t = (
            delta("ttft.p95", mean(best, "ttft.p95"), mean(step, "ttft.p95"), 0.1, True)
            if streamed
            else MetricDelta("ttft.p95", None, None, None, None, None, None, None)
        )
        guard_e = MetricDelta(
            "errors.rate", mean(best, "errors.rate"), mean(step, "errors.rate"), None, None, None, None, None
        )
        deltas = tuple(
            delta(m, mean(best, m), mean(step, m), 0.05, m.split(".")[0] not in ("throughput", "goodput"))
            for m in RECORD_METRICS
            if m in by_config[step][0] and mean(best, m)
        )
        pct = f"{objective.rel_change:+.0%} [{objective.ci_low:+.0%}, {objective.ci_high:+.0%}]"
        reason = {
            "kept": f"output tokens/s {pct}, no guard regressed; kept",
            "rejected": f"output tokens/s {pct}; error rate regressed beyond its 0% tolerance; rejected",
            "inconclusive": f"output tokens/s {pct}: within noise; about 4 more trials per side would decide",
        }[verdict_kind]
        verdict = StepVerdict(
            step,
            index,
            verdict_kind,
            reason,
            (described,),
            False,
            best,
            step,
            objective,
            (guard_t, guard_e),
            deltas,
            tuple(tb),
            tuple(tc),
            more_trials_needed=4 if verdict_kind == "inconclusive" else None,
            carried=verdict_kind == "kept",
        )
        archive.write_verdict(verdict)
        verdicts.append(verdict)
        if index == 1:
            rows.append(row(best, tb, None))
        rows.append(row(step, tc, verdict, failed=1 if step == "flash-attention" else 0))
        if verdict.carried:
            best, best_args = step, cand_args
    final = {m: mean(best, m) for m in RECORD_METRICS if any(m in s for s in by_config[best])}
    gates: list[GateResult] = evaluate_gates(playbook.goals.gates, final)
    findings = [
        Finding(
            "kv-share-high",
            "warn",
            "KV cache holds most of the memory",
            "KV share 71% of peak (threshold 60%)",
            "quantize the KV cache (kv_cache_dtype q8_0)",
            "§4",
        ),
        Finding(
            "queueing",
            "info",
            "Requests queue in the engine",
            "waiting > 0 in 55% of samples",
            "raise parallel slots or scale out",
            "§6",
        ),
    ]
    diagnosis = Diagnosis(
        notes=("synthetic diagnosis",),
        model={
            "name": "tiny",
            "architecture": "llama",
            "layers": 4,
            "heads": 8,
            "kv_heads": 4,
            "head_dim": 64,
            "hidden_size": 512,
            "params": 30_000_000,
            "weight_bytes": 60_000_000,
            "quantization": "f16",
            "source": "GGUF /models/tiny.gguf",
        },
        memory=MemoryFacts(
            weights_bytes=1.4e10,
            kv_bytes_per_token=131072.0,
            tokens_in_flight=400000.0,
            kv_bytes=5.2e10,
            other_bytes=0.3e10,
            peak_bytes=6.9e10,
            capacity_bytes=8.0e10,
            kv_share=0.75,
            peak_frac=0.86,
            device="gpu",
        ),
        roofline=RooflineFacts(
            floor_s=0.0045,
            bytes_per_step=1.5e10,
            bandwidth_bytes_s=3.35e12,
            achieved_tpot_s=final.get("tpot.p95"),
            achieved_over_floor=2.7,
            bandwidth_util=0.37,
            achieved_bandwidth_bytes_s=1.24e12,
            bandwidth_source="table: H100 SXM",
        ),
        scheduler={"continuous_batching": True, "max_batch": 4, "concurrency": 4},
        rules=(
            RuleChecked("kv-share-high", "§4", "KV cache holds most of the memory"),
            RuleChecked("queueing", "§6", "Requests queue in the engine"),
            RuleChecked("decode-far-from-roofline", "§5", "Decode far above its bandwidth floor"),
        ),
    )
    archive.finish(
        status="complete",
        exit_code=0 if all(g.met for g in gates) else 3,
        final_config_id=best,
        gates=gates,
        findings=findings,
        diagnosis=diagnosis,
        tuning_record=rows,
    )
    publish_report(archive.run_dir)
    return archive.run_dir


_BUILT: dict[tuple[Any, ...], Path] = {}


def shared_archive(tmp_path_factory: Any, **kwargs: Any) -> Path:
    """One archive per distinct kwargs per test session (they take seconds to build); copy it before changing it."""
    key = tuple(sorted(kwargs.items()))
    if key not in _BUILT or not _BUILT[key].is_dir():
        _BUILT[key] = make_archive(tmp_path_factory.mktemp("archive"), **kwargs)
    return _BUILT[key]
