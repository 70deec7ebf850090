"""Builds a large archive of one playbook's runs for history tests and benchmarks/history.py.

One run is written through the real RunArchive API (playbook copy, configuration, trials with summaries, finish);
every other run is that manifest cloned with its own run id, date, engine build and per-trial figures, and its own
manifest hash, so each verifies as llmplay wrote it. No per-request files: history reads trial summaries only.
Figures are lognormal around a level that an engine build may change (a planted regression), so the history has
something true to find and noise it must not flag.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from llmplay.archive.layout import MANIFEST
from llmplay.archive.model import ConfigRecord, Diagnosis, EngineDescription, GateResult, TrialRecord
from llmplay.archive.run_facts import RunEnvironment, RunOverrides
from llmplay.archive.verify import manifest_sha256
from llmplay.archive.writer import RunArchive
from llmplay.playbook.load import load_playbook

PLAYBOOK_NAME = "nightly-tiny"
PLAYBOOK_TEXT = textwrap.dedent("""\
    apiVersion: llmplay/v1
    kind: Playbook
    metadata:
      name: nightly-tiny
      version: "1.0"
      owner: tests
    goals:
      gates:
        - ttft.p95 < 2s
        - errors.rate < 1%
      objective: {minimize: ttft.p95, min_effect: 10%}
      guards:
        - {metric: throughput.output_tok_s, tolerance: 15%}
        - {metric: errors.rate, tolerance: 2pp}
    workload:
      api: completions
      input: {fixed: 64}
      output: {fixed: 32}
      concurrency: 4
      seed: 42
      warmup: 1s
      duration: 8s
    trials:
      repeats: 3
    cost:
      host_usd_per_hour: $0.10
    runtime: docker
    engine:
      kind: llamacpp
      image: llmplay/llamacpp-cpu:local
      model: /models/tiny.gguf
      args: {parallel: 4, threads: 1}
    """)


@dataclass(frozen=True)
class Build:
    """An engine build the runs ran on: its version, digest and how it scales TTFT (1.0: as fast as the first)."""

    version: str
    digest: str
    ttft_factor: float = 1.0


BUILDS = (
    Build("llama-cpp-python 0.3.36, ggml 0.25.3", "sha256:" + "a1" * 32),
    Build("llama-cpp-python 0.3.40, ggml 0.26.0", "sha256:" + "b2" * 32, 1.6),  # the upgrade that regressed
)


def _summary(rng: np.random.Generator, ttft_s: float, tok_s: float) -> dict[str, float]:
    ttft = ttft_s * float(np.exp(rng.normal(0, 0.05)))
    tput = tok_s * float(np.exp(rng.normal(0, 0.03)))
    total = 200
    return {
        "ttft.p95": ttft,
        "ttft.p50": ttft * 0.6,
        "throughput.output_tok_s": tput,
        "errors.rate": 0.0,
        "errors.count": 0,
        "requests.total": total,
        "cost.usd_per_1m_tokens": 0.1 / (tput * 3600) * 1e6,
        "duration_s": 8.0,
    }


def template_run(root: Path, *, playbook_text: str = PLAYBOOK_TEXT) -> Path:
    """One real run written through RunArchive: the manifest every clone starts from."""
    root = Path(root)
    source = root.parent / f"{PLAYBOOK_NAME}.yaml"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(playbook_text)
    playbook = load_playbook(source)
    env = RunEnvironment(host="bench-01", llmplay_version="0.1.0", seed=42)
    archive = RunArchive.create(root, playbook, overrides=RunOverrides(), environment=env, secrets=[])
    engine = replace(playbook.engine, image="llmplay/llamacpp-cpu:local", args={"parallel": 4, "threads": 1})
    archive.write_config(ConfigRecord("baseline", engine, playbook.workload, (), ""))
    rng = np.random.default_rng(0)
    for i in range(3):
        trial = TrialRecord(
            f"t{i + 1:03d}",
            "baseline",
            None,
            "baseline",
            i,
            "ok",
            "2026-01-01T00:00:00Z",
            10.0,
            _summary(rng, 0.06, 600.0),
            engine_describe=EngineDescription(engine_version=BUILDS[0].version, image_digest=BUILDS[0].digest),
        )
        archive.write_trial(trial, None, None, "")
    gates = [GateResult("ttft.p95 < 2s", "ttft.p95", "<", 2.0, 0.06, True, 0.97)]
    archive.finish(
        status="complete",
        exit_code=0,
        final_config_id="baseline",
        gates=gates,
        findings=[],
        diagnosis=Diagnosis(),
        tuning_record=[],
    )
    return archive.run_dir


def clone_run(
    template: Path,
    root: Path,
    *,
    when: dt.datetime,
    build: Build,
    rng: np.random.Generator,
    llmplay_version: str = "0.1.0",
    host: str = "bench-01",
) -> Path:
    """A copy of the template run with its own id, date, engine build and figures; it verifies."""
    manifest: dict[str, Any] = json.loads((template / MANIFEST).read_text())
    run_id = f"{when.strftime('%Y%m%dT%H%M%SZ')}-{rng.integers(0, 1 << 24):06x}"
    run_dir = Path(root) / template.parent.name / run_id
    run_dir.mkdir(parents=True)
    for relpath in manifest["files"]:
        target = run_dir / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template / relpath, target)
    manifest["run_id"] = run_id
    manifest["environment"] = {
        **manifest["environment"],
        "started_utc": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "llmplay_version": llmplay_version,
        "host": host,
    }
    manifest.pop("owner", None)
    for trial in manifest["trials"]:
        trial["summary"] = _summary(rng, 0.06 * build.ttft_factor, 600.0)
        trial["engine_describe"] = {"engine_version": build.version, "image_digest": build.digest}
    manifest.pop("manifest_sha256", None)
    manifest["manifest_sha256"] = manifest_sha256(manifest)
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return run_dir


def make_history_archive(
    root: Path, runs: int, *, upgrade_at: int | None = None, builds: Sequence[Build] = BUILDS, seed: int = 1
) -> list[Path]:
    """`runs` runs of one playbook, an hour apart, on the first build until `upgrade_at` (default: the last fifth),
    then on the second (which is slower). Returns the run directories oldest first (the template is the first)."""
    rng = np.random.default_rng(seed)
    template = template_run(Path(root))
    upgrade = upgrade_at if upgrade_at is not None else runs - max(1, runs // 5)
    start = dt.datetime(2025, 1, 1, 2, 0, tzinfo=dt.UTC)
    out = [template]
    first = json.loads((template / MANIFEST).read_text())
    first_date = dt.datetime.strptime(first["environment"]["started_utc"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    for i in range(1, runs):
        when = max(start, first_date) + dt.timedelta(hours=i)
        out.append(clone_run(template, Path(root), when=when, build=builds[1 if i >= upgrade else 0], rng=rng))
    return out
