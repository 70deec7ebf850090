"""The loader: every shipped playbook loads; every bad one fails with file:line, path and a fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmplay import units
from llmplay.cli import cli
from llmplay.errors import PlaybookError
from llmplay.playbook.extends import deep_merge
from llmplay.playbook.load import load_playbook, load_workload
from llmplay.playbook.source import display_path

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yaml"))
BAD = sorted((ROOT / "tests" / "data" / "bad").glob("*.yaml"))


def expected_fragment(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path} must start with '# expect: <fragment>'"
    return first[len("# expect: ") :]


def test_there_are_enough_bad_playbooks():
    assert len(BAD) >= 20


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_shipped_playbooks_load(path):
    # vllm-cpu-trace replays the trace in ../shared beside the repository, outside its tree (--allow-outside-tree).
    pb = load_playbook(path, allow_outside_extends=path.name == "vllm-cpu-trace.yaml")
    assert pb.metadata.name == path.stem
    assert pb.api_version == "llmplay/v1"


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_playbook_message(path):
    with pytest.raises(PlaybookError) as info:
        load_playbook(path)
    message = str(info.value)
    assert expected_fragment(path) in message
    # Every line names the file and a line number.
    for line in message.splitlines():
        assert re.match(
            rf"^{re.escape(str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path))}(:\d+)?: ",
            line,
        ), line


def test_misspelled_key_is_one_line_with_line_number_and_hint(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: p}\n"
        "engine: {kind: llamacpp, model: m}\nworkload:\n  concurrency: 1\n  num_requets: 3\n"
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(f)
    lines = str(info.value).splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(
        "p.yaml:7: workload.num_requets: unknown key 'num_requets' (did you mean 'num_requests'?); "
        "expected one of: api, arrival, burst, concurrency, dataset, duration, ignore_eos, input, "
        "max_tokens, num_requests, output, prefix_groups, prefix_tokens, rate, request_timeout, "
        "seed, session_header, streaming_fraction, sweep, temperature, think_time, trace, turns, warmup, warmup_requests"
    )


def test_extends_merges_and_child_wins():
    pb = load_playbook(ROOT / "playbooks" / "chat-7b.yaml")
    assert pb.goals.gates[0].text == "ttft.p95 < 500ms"  # from the base
    assert pb.goals.gates[0].value == pytest.approx(0.5)
    assert pb.engine.image.startswith("vllm/")  # from the child
    assert pb.workload.concurrency == 64
    assert [s.name for s in pb.steps] == [
        "prefix-caching",
        "max-num-seqs-256",
        "fp8-weights",
        "fp8-kv-cache",
        "cuda-graphs",
    ]


def test_extends_error_points_into_the_base_file(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: b}\n"
        "engine: {kind: llamacpp, model: m}\nworkload:\n  concurrency: 0\n"
    )
    (tmp_path / "child.yaml").write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nextends: base.yaml\nmetadata: {name: c}\nworkload: {num_requests: 3}\n"
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(tmp_path / "child.yaml")
    assert "base.yaml:6: workload.concurrency: found 0; expected a number >= 1" in str(info.value)


def test_extends_outside_allowed_with_flag(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: b}\n"
        "engine: {kind: llamacpp, model: m}\nworkload: {concurrency: 1, num_requests: 2}\n"
    )
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "p.yaml").write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nextends: ../base.yaml\nmetadata: {name: p}\n"
    )
    with pytest.raises(PlaybookError, match="points outside"):
        load_playbook(tmp_path / "team" / "p.yaml")
    assert load_playbook(tmp_path / "team" / "p.yaml", allow_outside_extends=True).workload.num_requests == 2


def test_deep_merge_does_not_mutate_inputs():
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    over = {"a": {"b": 2}, "e": 3}
    merged = deep_merge(base, over)
    assert merged == {"a": {"b": 2, "c": [1]}, "d": 1, "e": 3}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


@pytest.mark.parametrize("text,seconds", [("500ms", 0.5), ("0.5s", 0.5), ("2m", 120), ("1h", 3600), (3, 3.0)])
def test_durations(text, seconds):
    assert units.parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["500", "5 ms", "ms", "-1s", "1d", True])
def test_durations_strict(bad):
    with pytest.raises(units.UnitError):
        units.parse_duration_s(bad, unit_required=True)


def test_money_and_fraction():
    assert units.parse_money_usd("$0.5") == 0.5
    assert units.parse_fraction("1%") == pytest.approx(0.01)
    with pytest.raises(units.UnitError):
        units.parse_money_usd("0.5$")
    with pytest.raises(units.UnitError):
        units.parse_fraction("1 %")


def test_bundle_allows_several_knobs(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: p}\n"
        "engine: {kind: llamacpp, model: m}\nworkload: {concurrency: 1, num_requests: 2}\n"
        "steps:\n  - name: both\n    bundle: true\n    set: {parallel: 4, flash_attn: true}\n"
    )
    pb = load_playbook(f)
    assert pb.steps[0].bundle and len(pb.steps[0].changes) == 2


def test_secret_reference_is_accepted(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(
        "apiVersion: llmplay/v1\nkind: Playbook\nmetadata: {name: p}\n"
        "engine: {kind: llamacpp, model: m, env: {HF_TOKEN: '${env:HF_TOKEN}'}}\n"
        "workload: {concurrency: 1, num_requests: 2}\n"
    )
    assert load_playbook(f).engine.env["HF_TOKEN"] == "${env:HF_TOKEN}"


def test_load_workload_from_a_bare_workload_file(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text("concurrency: 2\nnum_requests: 5\ninput: {uniform: {min: 10, max: 20}}\n")
    workload, _ = load_workload(f)
    assert workload.concurrency == 2 and workload.input.kind == "uniform"
    workload, goals = load_workload(ROOT / "playbooks" / "cpu-tiny.yaml")
    assert workload.concurrency == 4 and goals.gates


# -- knob values: refused while the playbook loads, so `validate` catches what `plan` and `run` would ----

KNOB_PLAYBOOK = """apiVersion: llmplay/v1
kind: Playbook
metadata: {{name: p}}
engine:
  kind: {kind}
  model: m
  args:
    {args}
workload: {{concurrency: 1, num_requests: 2}}
steps:
  - name: s
    set: {{{step}}}
"""


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "kind,args,step,lines",
    [
        (
            "llamacpp",
            "flash_attn: maybe",
            "flash_attn: true",
            [
                "8: engine.args.flash_attn: found 'maybe'; expected true, false or auto (engine 'llamacpp' knob 'flash_attn')"
            ],
        ),
        (
            "llamacpp",
            "threads: 2",
            "kv_cache_dtype: q9_0",
            [
                "12: steps[0].set.kv_cache_dtype: found 'q9_0'; expected one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, "
                "q5_0, q5_1 (engine 'llamacpp' knob 'kv_cache_dtype')"
            ],
        ),
        (
            "vllm",
            "kv_cache_dtype: fp4",
            "args.max_num_seqs: 256.0",
            [
                "8: engine.args.kv_cache_dtype: found 'fp4'; expected one of auto, fp8, fp8_e4m3, fp8_e5m2 "
                "(engine 'vllm' knob 'kv_cache_dtype')",
                "12: steps[0].set.args.max_num_seqs: found 256.0; expected an integer >= 1 (engine 'vllm' knob 'max_num_seqs')",
            ],
        ),
        (
            "sglang",
            "prefix_caching: 'on'",
            "tensor_parallel: 0",
            [
                "8: engine.args.prefix_caching: found 'on'; expected true or false (engine 'sglang' knob 'prefix_caching')",
                "12: steps[0].set.tensor_parallel: found 0; expected an integer >= 1 (engine 'sglang' knob 'tensor_parallel')",
            ],
        ),
        (
            "tgi",
            "quantization: fp4",
            "cuda_graphs: 1",
            [
                "8: engine.args.quantization: found 'fp4'; expected one of awq, compressed-tensors, eetq, exl2, gptq, marlin, "
                "bitsandbytes, bitsandbytes-nf4, bitsandbytes-fp4, fp8 (engine 'tgi' knob 'quantization')",
                "12: steps[0].set.cuda_graphs: found 1; expected true or false (engine 'tgi' knob 'cuda_graphs')",
            ],
        ),
        (
            "trtllm",
            "gpu_memory_utilization: 1.5",
            "max_model_len: '4096'",
            [
                "8: engine.args.gpu_memory_utilization: found 1.5; expected a number > 0 and <= 1 "
                "(engine 'trtllm' knob 'gpu_memory_utilization')",
                "12: steps[0].set.max_model_len: found '4096'; expected an integer >= 1 (engine 'trtllm' knob 'max_model_len')",
            ],
        ),
    ],
    ids=["llamacpp-args", "llamacpp-step", "vllm", "sglang", "tgi", "trtllm"],
)
def test_bad_knob_value_is_refused_by_validate_and_plan_alike(tmp_path, kind, args, step, lines):
    f = tmp_path / "p.yaml"
    f.write_text(KNOB_PLAYBOOK.format(kind=kind, args=args, step=step))
    expected = [f"{display_path(str(f))}:{line}" for line in lines]
    code, output = run_cli("validate", str(f))
    assert (code, output.splitlines()) == (2, expected)
    code, output = run_cli("plan", str(f))  # once a BadKnobValue escaped here as "internal error"
    assert code == 2 and output.startswith("error:") and "internal error" not in output
    assert output.removeprefix("error:").strip().splitlines() == expected
