"""Each adapter's knob map: every remedy the diagnosis can name has a knob on llama.cpp and vLLM, every mapped value
passes the adapter's own check, and no module outside engines/ picks behaviour by an engine's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmplay.diagnose.steps import CATALOGUE
from llmplay.engines import ENGINES, get_engine
from llmplay.engines.knobs import Remedy, Risk, knobs_for

# What the diagnosis can name: every catalogue step that carries a remedy.
NAMED_BY_DIAGNOSIS = sorted({s.remedy for s in CATALOGUE if s.remedy is not None})
# A weight-quantization step on llama.cpp changes the GGUF file (`model`), not a flag.
NOT_A_FLAG = {"model"}


def test_the_diagnosis_names_every_remedy() -> None:
    assert set(NAMED_BY_DIAGNOSIS) == set(Remedy) - {Remedy.CHUNKED_PREFILL}


@pytest.mark.parametrize("kind", ["llamacpp", "vllm"])
@pytest.mark.parametrize("remedy", NAMED_BY_DIAGNOSIS)
def test_every_named_remedy_has_a_knob_or_is_built_in(kind: str, remedy: Remedy) -> None:
    engine = get_engine(kind)
    assert knobs_for(engine.knob_map, remedy) or remedy in engine.built_in, f"{kind}: nothing implements {remedy}"


@pytest.mark.parametrize("kind", list(ENGINES))
def test_every_mapped_knob_and_value_passes_the_adapters_check(kind: str) -> None:
    engine = get_engine(kind)
    assert engine.knob_map, f"{kind} has no knob map"
    for spec in engine.knob_map:
        assert spec.remedy not in engine.built_in
        if spec.knob in NOT_A_FLAG:
            continue
        engine.check_knob(spec.knob)
        for value in (*spec.values, spec.default):
            if value is not None:
                engine.check_value(spec.knob, value)


@pytest.mark.parametrize("kind", list(ENGINES))
def test_remedies_that_change_outputs_are_quality_risks(kind: str) -> None:
    for spec in get_engine(kind).knob_map:
        if spec.remedy in (Remedy.KV_DTYPE, Remedy.WEIGHT_QUANTIZATION):
            assert spec.risk is Risk.QUALITY
        if spec.remedy is Remedy.SCALE_OUT:
            assert spec.risk is Risk.HARDWARE


def test_a_switch_names_the_value_that_means_already_on() -> None:
    for engine in ENGINES.values():
        for spec in engine.knob_map:
            if spec.kind == "bool":
                assert spec.values == (True,) and spec.already_when is True, (engine.kind, spec.knob)


ENGINE_NAME = re.compile(r"""(\bkind|engine)\s*(==|!=|\bin\b)\s*[(\[{]?\s*["'](vllm|sglang|tgi|trtllm|llamacpp)["']""")


def test_nothing_outside_engines_tests_an_engine_by_name() -> None:
    package = Path(__file__).resolve().parents[2] / "llmplay"
    offenders = [
        f"{path.relative_to(package)}:{n}"
        for path in package.rglob("*.py")
        if "engines" not in path.relative_to(package).parts[:1]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ENGINE_NAME.search(line) and "tokenizer" not in path.name  # the tokenizer's own kinds, not engines
    ]
    assert offenders == []
