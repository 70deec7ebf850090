"""Diagnosing a run's final configuration from its trials: gathers model facts, memory, roofline and
scheduler facts, then applies the checklist."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np
import psutil

from llmplay.archive.model import Diagnosis, Finding, MemoryFacts, RooflineFacts, RuleChecked, Scalar
from llmplay.diagnose.checklist import diagnose, measured_only, rule_listing, targets_from_gates
from llmplay.diagnose.gpus import lookup_gpu
from llmplay.diagnose.memory import KV_DTYPE_BYTES, MemoryBreakdown, memory_breakdown
from llmplay.diagnose.model_facts import (
    ModelFacts,
    ModelFactsError,
    model_facts_from_gguf,
    model_facts_from_hf_config,
)
from llmplay.diagnose.roofline import Roofline, decode_roofline
from llmplay.diagnose.rule import SchedulerFacts
from llmplay.engines import get_engine
from llmplay.runtime.cache import default_cache_dir
from llmplay.runtime.cpu_image import model_path
from llmplay.runtime.gpus import gpu_inventory
from llmplay.spec import Config, Playbook, gpu_count
from llmplay.stats.samples import TrialSample


def model_file(config: Config) -> Path | None:
    """The weights' metadata on the host: a GGUF or a config.json under model_dir, or the CPU image's model."""
    spec = config.engine
    if spec.model_dir:
        root = Path(spec.model_dir)
        for candidate in [root / "config.json", *sorted(root.glob("*.gguf"))]:
            if candidate.is_file():
                return candidate
    if get_engine(spec.kind).model_in_cpu_image:
        try:
            path = model_path(default_cache_dir())
        except Exception:  # no usable cache directory: the diagnosis says the breakdown is unavailable
            return None
        return Path(path) if path and Path(path).is_file() else None
    return None


def _tokens_in_flight(config: Config, samples: Sequence[TrialSample]) -> float:
    w = config.workload
    out = np.concatenate([s.values.get("output_tokens", np.array([])) for s in samples]) if samples else np.array([])
    tot = np.concatenate([s.values.get("total_tokens", np.array([])) for s in samples]) if samples else np.array([])
    per_request = float(np.mean(tot - out / 2)) if tot.size else 0.0  # prompt + half the reply on average
    if w.concurrency:
        users = float(w.concurrency)
    else:
        e2el = np.concatenate([s.values.get("e2el", np.array([])) for s in samples]) if samples else np.array([])
        users = float((w.rate or 0) * (np.mean(e2el) if e2el.size else 0))  # Little's law
    slots = config.engine.args.get("parallel") or config.engine.args.get("max_num_seqs")
    if slots:
        users = min(users, float(slots))
    return users * per_request


def scheduler_facts(config: Config) -> SchedulerFacts:
    """What the engine and the load were told, for the §6 rules."""
    args = config.engine.args
    batch = args.get("max_num_seqs") or args.get("parallel")
    reserved = get_engine(config.engine.kind).kv_preallocated_frac
    return SchedulerFacts(
        continuous_batching=bool(args.get("cont_batching", True)),
        max_batch=int(batch) if isinstance(batch, (int, float)) and not isinstance(batch, bool) else None,
        concurrency=config.workload.concurrency,
        rate=config.workload.rate,
        # Every adapted engine caches prefixes by default now (vLLM V1, SGLang radix, TGI 3, llama.cpp
        # cache_prompt); only an explicit `prefix_caching: false` turns it off.
        prefix_caching=args.get("prefix_caching") is not False,
        shared_prefix_tokens=config.workload.prefix_tokens,
        # These engines reserve the KV pool up front, so a ~90% peak is by design, not pressure.
        kv_preallocated_frac=float(args.get("gpu_memory_utilization") or reserved) if reserved is not None else None,
    )


def diagnose_run(
    playbook: Playbook, config: Config, samples: Sequence[TrialSample], summary: Mapping[str, float]
) -> tuple[list[Finding], Diagnosis]:
    """Findings (most severe first) and the diagnosis (model, memory, roofline, scheduler, notes, and the rules
    checked, fired or not), as the records the archive keeps."""
    # A figure may be absent (a trial without /metrics or NVML, an archive from an older llmplay): only
    # finite numbers go in, so each rule sees a missing key and skips.
    telemetry = {
        k: v
        for s in samples
        for k, v in measured_only(s.scalars).items()
        if k.startswith(("gpu.", "engine.", "proc.", "memory."))
    }
    summary = measured_only(summary)
    notes: list[str] = []
    model: dict[str, Scalar] = {}
    memory: MemoryFacts | None = None
    roofline_facts: RooflineFacts | None = None
    facts: ModelFacts | None = None
    path = model_file(config)
    try:
        if path is not None:
            facts = (
                model_facts_from_gguf(path)
                if path.suffix == ".gguf"
                else model_facts_from_hf_config(path, str(config.engine.args.get("quantization") or "") or None)
            )
    except (ModelFactsError, OSError, ValueError) as exc:
        notes.append(f"model facts unavailable: {exc}")
    if facts is None and path is None:
        notes.append("model facts unavailable: no config.json or GGUF found on the host (set engine.model_dir)")
    gpus = gpu_count(config.engine.gpus)
    gpu = gpu_inventory() if gpus else None
    on_gpu = bool(gpus) and gpu is not None and bool(gpu.name)
    if on_gpu:
        peak, capacity, device = telemetry.get("memory.peak_bytes"), telemetry.get("memory.capacity_bytes"), "gpu"
    else:
        peak, capacity, device = telemetry.get("proc.rss_peak_bytes"), float(psutil.virtual_memory().total), "cpu"
        notes.append("CPU engine: GPU utilization, bandwidth and roofline rules were not evaluated")
    breakdown: MemoryBreakdown | None = None
    roofline: Roofline | None = None
    if facts is not None:
        model = {f.name: getattr(facts, f.name) for f in fields(facts)}
        kv_dtype = str(config.engine.args.get("kv_cache_dtype") or "auto").lower()
        kv_bytes = KV_DTYPE_BYTES.get(kv_dtype, 2.0)
        breakdown = memory_breakdown(facts, kv_bytes, _tokens_in_flight(config, samples), peak, capacity, device=device)
        memory = MemoryFacts(**{f.name: getattr(breakdown, f.name) for f in fields(breakdown)})
        spec = lookup_gpu(str(gpu.name)) if on_gpu and gpu is not None else None
        if spec is not None:
            kv_step = breakdown.kv_bytes / max(config.workload.concurrency or 1, 1)
            roofline = decode_roofline(
                facts.weight_bytes,
                kv_step * (config.workload.concurrency or 1),
                spec.memory_bandwidth_bytes_s,
                summary.get("tpot.p50"),
                bandwidth_source=f"table: {spec.model}",
            )
            roofline_facts = RooflineFacts(**{f.name: getattr(roofline, f.name) for f in fields(roofline)})
    scheduler = scheduler_facts(config)
    findings = diagnose(
        summary,
        telemetry,
        breakdown,
        roofline,
        scheduler,
        targets=targets_from_gates(playbook.goals.gates),
        notes=notes,
    )
    diagnosis = Diagnosis(
        notes=tuple(notes),
        model=model,
        memory=memory,
        roofline=roofline_facts,
        scheduler=scheduler.as_mapping(),
        rules=tuple(RuleChecked(r["id"], r["section"], r["title"]) for r in rule_listing()),
    )
    return list(findings), diagnosis
