"""Untrusted playbooks and datasets (issue #25): whatever a shared playbook or dataset holds, `llmplay validate`
refuses it with exit 2 and one line per problem naming FILE:LINE and the YAML path, before any engine starts.

Each case here reproduces a defect: reading a device or FIFO, datasets outside the tree or malformed, workload
and knob values the load generator or the engine would choke on, literal secrets, dangerous mounts."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from llmplay.cli import cli
from llmplay.errors import PlaybookError
from llmplay.files import read_bounded
from llmplay.playbook.dataset import read_dataset
from llmplay.playbook.load import load_playbook
from llmplay.playbook.source import MAX_FILE_BYTES
from llmplay_testing.playbooks import MINIMAL_PLAYBOOK as BASE
from llmplay_testing.playbooks import assert_refused, validate
from llmplay_testing.playbooks import write_playbook as playbook


# ------------------------------------------------------------------------------------------ 7. bounded reads
def test_a_device_is_refused_without_reading_it(tmp_path):
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    for target in ("/dev/zero", str(link)):
        code, out = validate(target)
        assert code == 2 and "not a regular file (a character device)" in out, out


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    done: list[tuple[int, str]] = []
    worker = threading.Thread(target=lambda: done.append(validate(str(fifo))), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("validate blocked on a FIFO")
    assert done[0][0] == 2 and "not a regular file (a FIFO)" in done[0][1]


def test_the_size_limit_applies_while_reading(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(PlaybookError, match=rf"file is {MAX_FILE_BYTES + 1} bytes; expected at most"):
        load_playbook(big)
    small = tmp_path / "small.txt"
    small.write_bytes(b"x" * 100)
    assert read_bounded(small, 100, "a file") == b"x" * 100
    with pytest.raises(PlaybookError, match="expected at most 99"):
        read_bounded(small, 99, "a file")


def test_a_dataset_that_is_a_device_or_fifo_is_refused(tmp_path):
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.jsonl")
    for name, kind in (("zero.jsonl", "a character device"), ("fifo.jsonl", "a FIFO")):
        path = playbook(tmp_path, workload={"dataset": name})
        assert_refused(path, "workload.dataset", f"not a regular file ({kind})", "--allow-outside-tree")


# --------------------------------------------------------------------------------- 8. datasets at validate
@pytest.mark.parametrize(
    "content,fragment",
    [
        (b'{"prompt": "a"}\n{broken\n', "data.jsonl:2: invalid JSON"),
        (b'{"prompt": "a", "output_tokens": -5}\n', 'data.jsonl:1: "output_tokens": found -5; expected a whole number'),
        (b'{"prompt": "a", "output_tokens": "many"}\n', "data.jsonl:1: \"output_tokens\": found 'many'"),
        (b'{"prompt": "a", "output_tokens": 2.5}\n', 'data.jsonl:1: "output_tokens": found 2.5'),
        (b'{"prompt": ""}\n', "data.jsonl:1: \"prompt\": found ''; expected non-empty text"),
        (b'{"prompt": "a"}\n[1, 2]\n', "data.jsonl:2: found list; expected an object"),
        (b'{"prompt": "a"}\n\x00\xff\xfe binary\n', "data.jsonl:2: not UTF-8 text (byte 17)"),
        (b'{"text": "a"}\n', 'data.jsonl:1: no "prompt" or "conversations"'),
        (b"", "workload.dataset: found no usable row"),
        (b'[{"prompt": "a"},\n {"prompt": 7}]', 'data.jsonl:2: "prompt": found 7'),
        (b'[{"prompt": "a"},\n {"prompt": "b"}', "data.jsonl:2: invalid JSON array"),
    ],
    ids=[
        "bad-json",
        "negative-output",
        "text-output",
        "float-output",
        "empty-prompt",
        "not-an-object",
        "binary",
        "no-prompt",
        "empty-file",
        "array-bad-row",
        "array-unclosed",
    ],
)
def test_a_bad_dataset_is_refused_at_validate_with_its_line(tmp_path, content, fragment):
    (tmp_path / "data.jsonl").write_bytes(content)
    code, out = validate(str(playbook(tmp_path, workload={"dataset": "data.jsonl"})))
    assert code == 2 and fragment in out and "Traceback" not in out, out


def test_a_good_dataset_and_sharegpt_validate(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "output_tokens": 4}\n\n{"prompt": "b"}\n')
    assert validate(str(playbook(tmp_path, workload={"dataset": "data.jsonl"})))[0] == 0
    (tmp_path / "share.json").write_text(
        '[\n{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},\n'
        '{"conversations": [{"from": "gpt", "value": "no human turn"}]}\n]\n'
    )
    rows = read_dataset(tmp_path / "share.json")
    assert [(r.line, r.prompt, r.reply) for r in rows] == [(2, "hi", "yo")]


def test_a_dataset_outside_the_playbook_tree_is_refused_like_extends(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a"}\n')
    (tmp_path / "team").mkdir()
    for written in ("../../../../etc/shadow", "../data.jsonl", "/etc/passwd"):
        path = playbook(tmp_path / "team", workload={"dataset": written})
        assert_refused(path, "workload.dataset", "points outside")
    path = playbook(tmp_path / "team", workload={"dataset": "../data.jsonl"})
    for flag in ("--allow-outside-tree", "--allow-outside-extends"):
        assert validate(str(path), flag)[0] == 0


def test_probe_files_are_confined_too(tmp_path):
    path = playbook(tmp_path, goals={"quality": {"probes": "../../../../etc/passwd"}})
    assert_refused(path, "goals.quality.probes", "points outside")


# ------------------------------------------------------------------------ 8. workload and knob values at validate
STEP = "steps"


@pytest.mark.parametrize(
    "sections,yaml_path,fragment",
    [
        ({"workload": {"concurrency": None, "rate": float("nan")}}, "workload.rate", "found nan; expected a finite"),
        ({"workload": {"rate": float("inf"), "concurrency": None}}, "workload.rate", "found inf; expected a finite"),
        ({"workload": {"input": {"fixed": 10**10}}}, "workload.input", "1 to 10000000"),
        ({"workload": {"input": 10**10}}, "workload.input", "1 to 10000000"),
        (
            {"workload": {"output": {"lognormal": {"mean": 50, "sigma": 1e6}}}},
            "workload.output",
            "1 to 10000000",
        ),
        ({"workload": {"duration": "0s", "num_requests": None}}, "workload.duration", "a length of time above zero"),
        ({"workload": {"duration": 0, "num_requests": None}}, "workload.duration", "a length of time above zero"),
        ({"workload": {"request_timeout": "0ms"}}, "workload.request_timeout", "above zero"),
        ({"engine": {"args": {"parallel": -4}}}, "engine.args.parallel", "expected an integer >= 1, or -1 for"),
        ({"engine": {"args": {"threads": 0}}}, "engine.args.threads", "expected an integer >= 1, or -1 for"),
        ({"engine": {"args": {"max_num_seqs": 0}}}, "engine.args.max_num_seqs", "expected an integer >= 1"),
        ({"goals": {"gates": ["errors.rate < 150%"]}}, "goals.gates[0]", "expected a share from 0 to 100%"),
        ({"goals": {"gates": ["memory.peak_frac < 200%"]}}, "goals.gates[0]", "expected a share from 0 to 100%"),
        ({"goals": {"gates": [{"metric": "errors.rate", "op": "<", "value": -0.5}]}}, "goals.gates[0]", "share"),
        ({STEP: [{"name": "zero", "set": {"workload.concurrency": 0}}]}, "steps[0].set.workload.concurrency", ">= 1"),
        (
            {STEP: [{"name": "nan", "set": {"workload.temperature": float("nan")}}]},
            "steps[0].set.workload.temperature",
            "finite",
        ),
        ({STEP: [{"name": "neg", "set": {"parallel": -4}}]}, "steps[0].set.parallel", "expected an integer >= 1"),
        (
            {STEP: [{"name": "neg", "set": {"args.threads": 0}}]},
            "steps[0].set.args.threads",
            "expected an integer >= 1",
        ),
        ({STEP: [{"name": "img", "set": {"image": ""}}]}, "steps[0].set.image", "a Docker image reference"),
        ({STEP: [{"name": "env", "set": {"env.X": [1]}}]}, "steps[0].set.env.X", "expected a string"),
        (
            {STEP: [{"name": "rate", "set": {"workload.rate": 4}}]},
            "steps[0].set",
            "with step 'rate', both workload.concurrency",
        ),
        (
            {"workload": {"input": {"fixed": 4000}, "output": {"fixed": 200}}},
            "workload",
            "the longest request holds 4200 tokens (input 4000 + output 200); expected at most 4096, the context one "
            "request gets with ctx_size 4096",
        ),
        (
            {
                "workload": {"input": {"uniform": {"min": 10, "max": 950}}, "prefix_tokens": 100},
                STEP: [{"name": "p4", "set": {"parallel": 4}}],
            },
            "steps[0].set",
            "with step 'p4', the longest request holds 1058 tokens (prefix 100 + input 950 + output 8); expected at "
            "most 1024",
        ),
        (
            {"workload": {"turns": 3, "input": {"choice": {"values": [100, 700]}}, "output": {"fixed": 800}}},
            "workload",
            "4500 tokens (3 turns x (input 700 + output 800))",
        ),
        (
            {
                "engine": {"kind": "vllm", "model": "m", "args": {"max_model_len": 2048}},
                "workload": {"max_tokens": 4096},
            },
            "workload",
            "with max_model_len 2048",
        ),
    ],
    ids=[
        "rate-nan",
        "rate-inf",
        "fixed-1e10",
        "length-1e10",
        "sigma-huge",
        "duration-0s",
        "duration-0",
        "timeout-0",
        "parallel-neg",
        "threads-0",
        "max-num-seqs-0",
        "gate-150pct",
        "gate-frac-2",
        "gate-negative",
        "step-concurrency-0",
        "step-nan",
        "step-parallel-neg",
        "step-threads-0",
        "step-image-empty",
        "step-env-list",
        "step-both-loads",
        "ctx-base",
        "ctx-step-slots",
        "ctx-turns",
        "vllm-max-model-len",
    ],
)
def test_bad_values_are_refused_at_validate_with_line_and_path(tmp_path, sections, yaml_path, fragment):
    assert_refused(playbook(tmp_path, **sections), yaml_path, fragment)


@pytest.mark.parametrize(
    "sections",
    [
        {"engine": {"args": {"parallel": -1, "threads": -1, "ctx_size": 0}}},  # llama.cpp's automatic choices
        {"workload": {"input": {"lognormal": {"mean": 600, "sigma": 0.7}}}},  # an unbounded tail is not refused
        {"workload": {"warmup": 0}},
        {"goals": {"gates": ["errors.rate < 100%", "throughput.output_tok_s > 3000"]}},
    ],
    ids=["auto-counts", "unbounded-tail", "warmup-0", "gates-in-range"],
)
def test_ordinary_values_still_validate(tmp_path, sections):
    code, out = validate(str(playbook(tmp_path, **sections)))
    assert code == 0, out


def test_a_dataset_output_longer_than_the_context_is_refused(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "output_tokens": 8000}\n')
    path = playbook(tmp_path, workload={"dataset": "data.jsonl"})
    assert_refused(path, "workload", "8000 tokens (output 8000); expected at most 4096")


@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--duration", "0s"], "--duration: found '0s'; expected a length above zero"),
        (["--duration", "0"], "--duration: found '0'"),
        (["--duration", "soon"], "--duration:"),
        (["--warmup", "-5"], "--warmup:"),
        (["--only", "nope"], "--only nope: no such step"),
    ],
    ids=["duration-0s", "duration-0", "duration-word", "warmup-negative", "only-unknown"],
)
def test_dry_run_checks_overrides_as_a_run_would(tmp_path, flags, fragment):
    path = playbook(tmp_path, steps=[{"name": "p2", "set": {"parallel": 2}}])
    result = CliRunner().invoke(cli, ["run", str(path), "--dry-run", *flags], catch_exceptions=False)
    assert result.exit_code == 2 and fragment in result.output and "Traceback" not in result.output, result.output
    ok = CliRunner().invoke(cli, ["run", str(path), "--dry-run", "--duration", "5s", "--only", "p2"])
    assert ok.exit_code == 0 and "duration 5s" in ok.output, ok.output


# --------------------------------------------------------------------------------------------- 5. literal secrets
GHP = "ghp_" + "A1b2C3d4" * 5  # a GitHub token's format (made up)
RANDOM_KEY = "tQ5YWKfW34py5s2c8T8BEhlv6Z3e3fJVj1WbG7Z"


@pytest.mark.parametrize(
    "sections,yaml_path,fragment",
    [
        ({"engine": {"env": {"DB_PASS": "hunter2hunter2"}}}, "engine.env.DB_PASS", "${env:DB_PASS}"),
        ({"engine": {"env": {"OPENAI_KEY": "plainvalue"}}}, "engine.env.OPENAI_KEY", "looks like a secret"),
        ({"engine": {"env": {"GITHUB_PAT": "plainvalue"}}}, "engine.env.GITHUB_PAT", "looks like a secret"),
        ({"engine": {"env": {"HF_TOKEN_VALUE": "x1"}}}, "engine.env.HF_TOKEN_VALUE", "looks like a secret"),
        ({"engine": {"env": {"MIRROR_SETTING": GHP}}}, "engine.env.MIRROR_SETTING", "known credential format"),
        ({"engine": {"env": {"EXTRA": RANDOM_KEY}}}, "engine.env.EXTRA", "random-looking string"),
        ({"engine": {"env": {"MIRROR": "https://bob:plainvalue@host/m"}}}, "engine.env.MIRROR", "URL with a password"),
        ({"engine": {"extra_args": ["--api-key", "abc"]}}, "engine.extra_args[1]", "'--api-key' takes a secret"),
        ({"engine": {"extra_args": ["--hf-token=abc"]}}, "engine.extra_args[0]", "${env:HF_TOKEN}"),
        ({"engine": {"extra_args": ["--header", f"Bearer {GHP}"]}}, "engine.extra_args[1]", "known credential"),
        ({"engine": {"args": {"parallel": 1, "flash_attn": GHP}}}, "engine.args.flash_attn", "known credential"),
        ({STEP: [{"name": "s", "set": {"env.DB_PASSWORD": "x"}}]}, "steps[0].set.env.DB_PASSWORD", "looks like a"),
        ({STEP: [{"name": "s", "set": {"extra_args": ["--api-key", "k"]}}]}, "steps[0].set.extra_args[1]", "secret"),
        ({STEP: [{"name": "s", "set": {"env.X": RANDOM_KEY}}]}, "steps[0].set.env.X", "random-looking"),
    ],
    ids=[
        "db-pass",
        "openai-key",
        "github-pat",
        "token-part",
        "known-format-any-name",
        "random-any-name",
        "url-password",
        "flag-then-value",
        "flag-equals",
        "token-in-arg",
        "token-in-knob",
        "step-env",
        "step-extra-args",
        "step-random",
    ],
)
def test_literal_secrets_are_refused_without_being_repeated(tmp_path, sections, yaml_path, fragment):
    out = assert_refused(playbook(tmp_path, **sections), yaml_path, fragment)
    for secret in ("hunter2hunter2", GHP, RANDOM_KEY, "plainvalue"):
        assert secret not in out


def test_a_token_in_a_comment_is_refused(tmp_path):
    path = playbook(tmp_path)
    path.write_text(path.read_text() + f"# my token, for later: {GHP}\n")
    code, out = validate(str(path))
    assert code == 2 and re.search(r"p\.yaml:\d+: found a token in a known credential format", out), out
    assert GHP not in out


def test_ordinary_values_are_not_taken_for_secrets(tmp_path):
    digest = "sha256:" + "0123456789abcdef" * 4
    path = playbook(
        tmp_path,
        engine={
            "image": f"llmplay/llamacpp-cpu@{digest}",
            "model": "/models/DeepSeekR1DistillQwen32B-Q4_K_M.gguf",
            "served_model_name": "meta-llama/Meta-Llama-3.1-8B-Instruct",
            "env": {
                "HF_TOKEN": "${env:HF_TOKEN}",
                "AUTH_HEADER": "Bearer ${env:SERVICE_TOKEN}",
                "MIRROR": "https://bob:${env:MIRROR_PASSWORD}@host/models",
                "NCCL_PAT_ENABLE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": "/opt/lib",
                "PWD": "/app",
                "HF_HUB_ENABLE_HF_TRANSFER": True,
                "MODEL_REVISION": "0123456789abcdef0123456789abcdef01234567",
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            },
            "extra_args": [
                "--api-key",
                "${env:API_KEY}",
                "--chat-template-file",
                "/models/turns.jinja",
                "--jinja",
                "--disable-auth",
                "--enable-auth",
                "true",
            ],
        },
    )
    code, out = validate(str(path))
    assert code == 0, out


def test_redaction_covers_known_formats_names_and_references():
    from llmplay.redaction import REDACTED, redact, redact_text, redact_yaml_text, resolve_args

    assert redact_text(f"log: token={GHP} done") == f"log: token={REDACTED} done"
    assert redact(
        {"DB_PASS": "x", "GITHUB_PAT": "y", "OPENAI_KEY": "z", "max_tokens": "8", "num_key_value_heads": "8"}
    ) == {
        "DB_PASS": REDACTED,
        "GITHUB_PAT": REDACTED,
        "OPENAI_KEY": REDACTED,
        "max_tokens": "8",
        "num_key_value_heads": "8",
    }
    text = "env:\n  DB_PASS: hunter2\n  HF_TOKEN: ${env:HF_TOKEN}\n# old: " + GHP + "\n"
    assert redact_yaml_text(text) == f"env:\n  DB_PASS: {REDACTED}\n  HF_TOKEN: ${{env:HF_TOKEN}}\n# old: {REDACTED}\n"
    assert resolve_args(["--api-key", "${env:K}", "x"], {"K": "v"}) == ("--api-key", "v", "x")


def test_referenced_secrets_never_reach_plan_manifest_playbook_copies_or_report(tmp_path, monkeypatch):
    """Secrets by reference under names that do not look secret, in extra_args and in a base playbook: the run
    (synthetic trials whose error text echoes them, as an engine log might) archives none of them anywhere."""
    from llmplay.tuning.run import RunOptions, TuningRun
    from llmplay_testing.synthetic import scripted_trial

    values = {"MIRROR_URL_PART": "mv" + "Zq8" * 6, "API_KEY": "ak" + "Xw3" * 6, "BASE_VALUE": "bv" + "Lp7" * 6}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "base.yaml").write_text(
        yaml.safe_dump({**BASE, "engine": {**BASE["engine"], "env": {"FROM_BASE": "${env:BASE_VALUE}"}}})
    )
    path = tmp_path / "p.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llmplay/v1",
                "kind": "Playbook",
                "extends": "base.yaml",
                "metadata": {"name": "secrets"},
                "runtime": "process",
                "engine": {
                    "env": {"MIRROR": "https://host/${env:MIRROR_URL_PART}"},
                    "extra_args": ["--api-key", "${env:API_KEY}"],
                },
                "trials": {"repeats": 1},
            }
        )
    )
    plan = CliRunner().invoke(cli, ["plan", str(path)])
    assert plan.exit_code == 0 and "${env:API_KEY}" in plan.output, plan.output
    echo = " ".join(values.values())

    def leaky_trial(config, *, trial_id, step, role, repeat):
        from llmplay.tuning.trial import TrialResult

        record = scripted_trial(
            config, trial_id=trial_id, step=step, role=role, repeat=repeat, summary={}, status="failed",
            error=f"engine said: {echo}",
        )  # fmt: skip
        return TrialResult(record, sample=None)

    lines: list[str] = []
    outcome = TuningRun(
        load_playbook(path), RunOptions(archive_root=tmp_path / "r"), report=lines.append, measure_trial=leaky_trial
    ).execute()
    from llmplay.report import publish_report

    publish_report(outcome.run_dir)
    files = [p for p in outcome.run_dir.rglob("*") if p.is_file()]
    assert {"manifest.json", "playbook.yaml", "report.html"} <= {p.name for p in files}, files
    for value in values.values():
        assert value not in plan.output and all(value not in line for line in lines)
        for f in files:
            assert value.encode() not in f.read_bytes(), f


# ------------------------------------------------------------------------------------------------ 6. model_dir
@pytest.mark.parametrize(
    "written,fragment",
    [
        ("/", "is the root of the filesystem"),
        ("/etc", "inside the system directory /etc"),
        ("/etc/passwd", "inside the system directory /etc"),
        ("/var/run", "inside the system directory /var"),
        ("/usr/share", "inside the system directory /usr"),
        ("/root", "a home directory"),
        ("/home", "a home directory"),
        ("/home/alice", "a home directory"),
        ("~", "a home directory"),
        ("~/.ssh", "inside the credential directory .ssh"),
        ("~/.aws/models", "inside the credential directory .aws"),
        ("link-to-etc", "(it resolves to /etc) is inside the system directory /etc"),
        ("a-home", "a directory holding .ssh"),
        ("weights.bin", "is not a directory"),
        ("../../../../../../../../etc", "inside the system directory /etc"),
    ],
)
def test_a_dangerous_model_dir_is_refused_at_validate(tmp_path, monkeypatch, written, fragment):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "link-to-etc").symlink_to("/etc")
    (tmp_path / "a-home" / ".ssh").mkdir(parents=True)
    (tmp_path / "weights.bin").write_bytes(b"\0")
    assert_refused(playbook(tmp_path, engine={"model_dir": written}), "engine.model_dir", fragment)


def test_a_missing_model_dir_fails_validate_here_and_stops_run_before_any_engine(tmp_path):
    (tmp_path / "models").mkdir()
    assert validate(str(playbook(tmp_path, engine={"model_dir": "models"})))[0] == 0
    path = playbook(tmp_path, engine={"model_dir": "no-such-dir"})
    assert_refused(path, "engine.model_dir", "does not exist on this host")
    assert validate(str(path), "--any-host")[0] == 0  # a playbook for another machine: what holds on any host
    result = CliRunner().invoke(cli, ["run", str(path), "--archive", str(tmp_path / "r")], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert re.search(r"p\.yaml:\d+: engine\.model_dir: 'no-such-dir' does not exist on this host", result.output)
    assert not (tmp_path / "r").exists() and not (tmp_path / "no-such-dir").exists()


def test_a_refused_dataset_is_not_read_for_quality_probes_either(tmp_path, monkeypatch):
    import llmplay.playbook.convert as convert

    read: list[Path] = []
    monkeypatch.setattr(convert, "read_dataset", lambda file: read.append(file) or ())
    path = playbook(
        tmp_path,
        workload={"dataset": "../../../../etc/passwd"},
        goals={"quality": {"from_workload": {"seed": 1}}},
    )
    assert_refused(path, "workload.dataset", "points outside")
    assert read == []


def test_a_bench_workload_file_keeps_its_dataset_inside_its_tree(tmp_path):
    from llmplay.playbook.load import load_workload

    (tmp_path / "data.jsonl").write_text('{"prompt": "a"}\n')
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "w.yaml").write_text("concurrency: 1\nnum_requests: 2\ndataset: ../data.jsonl\n")
    with pytest.raises(PlaybookError, match=r"w\.yaml:3: dataset: .*points outside"):
        load_workload(tmp_path / "w" / "w.yaml")
    workload, _ = load_workload(tmp_path / "w" / "w.yaml", allow_outside_tree=True)
    assert workload.dataset == str(tmp_path / "data.jsonl")
