"""Untrusted playbooks: whatever the bytes, the loader answers with one clear PlaybookError, fast."""
from __future__ import annotations

import time

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmplay.errors import PlaybookError
from llmplay.playbook.load import load_playbook

VALID = {
    "apiVersion": "llmplay/v1", "kind": "Playbook", "metadata": {"name": "fuzz"},
    "engine": {"kind": "llamacpp", "model": "/models/tiny.gguf", "args": {"parallel": 1}},
    "workload": {"concurrency": 2, "num_requests": 4, "input": {"fixed": 16}},
    "goals": {"gates": ["ttft.p95 < 500ms"], "objective": {"maximize": "throughput.output_tok_s"}},
    "steps": [{"name": "p4", "set": {"parallel": 4}}],
}
FUZZ_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                    st.text(max_size=20))
documents = st.recursive(scalars, lambda children: st.one_of(
    st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)), max_leaves=30)


def check_one_clear_error(path, text: str | bytes) -> None:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    started = time.perf_counter()
    try:
        load_playbook(path)
    except PlaybookError as exc:
        message = str(exc)
        assert message and "Traceback" not in message
        for line in message.splitlines():
            assert line.startswith(str(path.name)) or str(path) in line or line.startswith(str(path.parent.name)) \
                or ".yaml" in line, line
    assert time.perf_counter() - started < 5


@FUZZ_SETTINGS
@given(st.binary(max_size=400))
def test_random_bytes(tmp_path_factory, data):
    check_one_clear_error(tmp_path_factory.mktemp("f") / "p.yaml", data)


@FUZZ_SETTINGS
@given(documents)
def test_random_yaml_documents(tmp_path_factory, doc):
    check_one_clear_error(tmp_path_factory.mktemp("f") / "p.yaml", yaml.safe_dump(doc))


def _mutations():
    paths = [("engine", "kind"), ("engine", "args", "parallel"), ("workload", "concurrency"), ("workload", "input"),
             ("goals", "gates"), ("steps",), ("metadata", "name"), ("workload", "duration"), ("trials",)]
    return st.tuples(st.sampled_from(paths), documents)


@FUZZ_SETTINGS
@given(_mutations())
def test_valid_playbook_with_one_field_replaced(tmp_path_factory, mutation):
    import copy

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


def test_valid_seed_document_loads(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(VALID))
    assert load_playbook(tmp_path / "p.yaml").steps[0].name == "p4"
