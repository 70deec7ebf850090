"""Untrusted playbooks: whatever the bytes, the loader answers with one clear PlaybookError, fast."""

from __future__ import annotations

import copy
import re
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplay.errors import PlaybookError
from llmplay.playbook.load import load_playbook
from llmplay.playbook.source import display_path

VALID = {
    "apiVersion": "llmplay/v1",
    "kind": "Playbook",
    "metadata": {"name": "fuzz"},
    "engine": {"kind": "llamacpp", "model": "/models/tiny.gguf", "args": {"parallel": 1}},
    "workload": {"concurrency": 2, "num_requests": 4, "input": {"fixed": 16}},
    "goals": {"gates": ["ttft.p95 < 500ms"], "objective": {"maximize": "throughput.output_tok_s"}},
    "steps": [{"name": "p4", "set": {"parallel": 4}}],
}
FUZZ_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=True), st.text(max_size=20)
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


# A YAML path as Problems writes it: plain keys joined by dots, list indices and odd keys (repr) in brackets.
_BRACKET = r"""\[(?:\d+|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]"""
YAML_PATH = rf"(?:\(document\)|(?:[A-Za-z0-9_.$-]+|{_BRACKET})(?:\.[A-Za-z0-9_.$-]+|{_BRACKET})*)"
# Problems found before the document has YAML paths: in the YAML text (with a line) or in the file as a whole.
TEXT_PROBLEMS = (
    "YAML syntax error: ",
    "duplicate key '",
    "unsupported YAML tag (",
    "document expands to more than ",
    "found a ",
    "the file is empty; ",
)
FILE_PROBLEMS = ("not UTF-8 text (byte ", "nesting is too deep; ", "YAML error: ", "file is ")


def assert_message_format(message: str, path) -> None:
    """Every line is `FILE:LINE: YAML.PATH: problem`, or one of the closed list of YAML-level problems that have
    no path yet (`FILE:LINE: problem`, `FILE: problem`); FILE is the playbook as the loader shows it."""
    assert message and "Traceback" not in message
    file = re.escape(display_path(str(path)))
    for line in message.splitlines():
        if m := re.fullmatch(rf"{file}:([1-9]\d*): {YAML_PATH}: (\S.*)", line):
            continue
        if m := re.fullmatch(rf"{file}:([1-9]\d*): (.+)", line):
            assert m.group(2).startswith(TEXT_PROBLEMS), line
            continue
        m = re.fullmatch(rf"{file}: (.+)", line)
        assert m and m.group(1).startswith(FILE_PROBLEMS), line


def check_one_clear_error(path, text: str | bytes) -> None:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    # No input makes the loader work without end: bounded in this process's own CPU time, which another process on
    # the machine does not inflate, where wall-clock time on a shared 2-core machine would be its noise.
    started = time.process_time()
    try:
        load_playbook(path)
    except PlaybookError as exc:
        assert_message_format(str(exc), path)
    assert time.process_time() - started < 5


@FUZZ_SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes(tmp_path_factory, data):
    check_one_clear_error(tmp_path_factory.mktemp("f") / "p.yaml", data)


@FUZZ_SETTINGS
@given(documents)
def test_random_yaml_documents(tmp_path_factory, doc):
    check_one_clear_error(tmp_path_factory.mktemp("f") / "p.yaml", yaml.safe_dump(doc))


def _mutations():
    paths = [
        ("engine", "kind"),
        ("engine", "args", "parallel"),
        ("workload", "concurrency"),
        ("workload", "input"),
        ("goals", "gates"),
        ("steps",),
        ("metadata", "name"),
        ("workload", "duration"),
        ("trials",),
    ]
    return st.tuples(st.sampled_from(paths), documents)


@FUZZ_SETTINGS
@given(_mutations())
def test_valid_playbook_with_one_field_replaced(tmp_path_factory, mutation):
    (path, value) = mutation
    doc = copy.deepcopy(VALID)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    check_one_clear_error(tmp_path_factory.mktemp("f") / "p.yaml", yaml.safe_dump(doc))


def test_huge_numbers_and_deep_nesting(tmp_path):
    deep = "workload: " + "[" * 5000 + "]" * 5000 + "\n"
    check_one_clear_error(tmp_path / "deep.yaml", "apiVersion: llmplay/v1\nkind: Playbook\n" + deep)
    huge = yaml.safe_dump({**VALID, "workload": {"concurrency": 10**100, "num_requests": 4}})
    check_one_clear_error(tmp_path / "huge.yaml", huge)


def test_billion_laughs_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    check_one_clear_error(tmp_path / "lol.yaml", "apiVersion: llmplay/v1\n" + "\n".join(lines) + "\n")


def test_the_message_format_check_refuses_what_it_should(tmp_path):
    f = tmp_path / "p.yaml"
    shown = display_path(str(f))
    assert_message_format(f"{shown}:3: workload.input['a b'][0]: found 1; expected a mapping", f)
    assert_message_format(f"{shown}:1: YAML syntax error: mapping values are not allowed here", f)
    for bad in (
        "elsewhere.yaml:3: workload: found 1",
        f"{shown}: workload: found 1",
        f"{shown}:0: workload: found 1",
        f"{shown}:3: something else",
        f"prefix {shown}:3: workload: found 1",
        "p.yaml",
    ):
        with pytest.raises(AssertionError):
            assert_message_format(bad, f)


def test_valid_seed_document_loads(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(VALID))
    assert load_playbook(tmp_path / "p.yaml").steps[0].name == "p4"
