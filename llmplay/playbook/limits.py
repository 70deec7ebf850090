"""Whole configurations checked while the playbook loads: the baseline and each step's configuration (applied over
the steps before it, as the plan shows them) keep one kind of load and fit their longest request in the engine's
context, where the knobs say what that context is."""

from __future__ import annotations

from collections.abc import Sequence

from llmplay.engines.base import Engine
from llmplay.files import display_path
from llmplay.playbook.dataset import DatasetRow
from llmplay.playbook.problems import Problems
from llmplay.playbook.source import YamlPath
from llmplay.spec import Config, LengthDist, Playbook, Workload, apply_step


def check_configurations(playbook: Playbook, engine: Engine, dataset: Sequence[DatasetRow], problems: Problems) -> None:
    """A problem at the workload (baseline) or at the step whose configuration breaks a rule."""
    config = Config("baseline", playbook.engine, playbook.workload)
    _check(config, engine, dataset, ("workload",), "", problems)
    for i, step in enumerate(playbook.steps):
        config, _ = apply_step(config, step)
        _check(config, engine, dataset, ("steps", i, "set"), f"with step '{step.name}', ", problems)


def longest(dist: LengthDist) -> int | None:
    """The longest length `dist` can draw; None for a normal or lognormal tail without a max."""
    if dist.kind == "fixed":
        return dist.value
    if dist.kind == "choice":
        return max(dist.values) if dist.values else None
    return dist.max


def _check(
    config: Config, engine: Engine, dataset: Sequence[DatasetRow], path: YamlPath, where: str, problems: Problems
) -> None:
    w = config.workload
    if w.concurrency is not None and w.rate is not None:
        problems.add(
            path,
            f"{where}both workload.concurrency ({w.concurrency}) and workload.rate ({w.rate:g}) are set; "
            "expected one kind of load throughout: a step changes the playbook's own (concurrency or rate)",
        )
    limit = engine.context_tokens(config.engine.args)
    if limit is None:
        return
    if w.trace is not None:
        _check_trace(w, limit.tokens, limit.because, path, where, problems)
        return
    output: int | None
    if w.max_tokens is not None:
        output = w.max_tokens
    elif dataset:
        # A row without output_tokens takes the workload's output length.
        outs = [r.output_tokens for r in dataset]
        fallback = longest(w.output) if None in outs else 0
        output = None if fallback is None else max([o for o in outs if o is not None] + [fallback])
    else:
        output = longest(w.output)
    # A dataset's prompts are counted only by the engine's tokenizer, at run time: here only what is known.
    prompt = 0 if dataset else longest(w.input)
    if output is None or prompt is None:
        return  # an unbounded tail: the longest request is not known before it is drawn
    turns = max(1, w.turns)
    need = w.prefix_tokens + turns * (prompt + output)
    if need > limit.tokens:
        parts = [f"prefix {w.prefix_tokens}"] if w.prefix_tokens else []
        per_turn = f"output {output}" if dataset else f"input {prompt} + output {output}"
        parts.append(f"{turns} turns x ({per_turn})" if turns > 1 else per_turn)
        problems.add(
            path,
            f"{where}the longest request holds {need} tokens ({' + '.join(parts)}); expected at most "
            f"{limit.tokens}, the context one request gets with {limit.because}",
        )


def _check_trace(w: Workload, limit: int, because: str, path: YamlPath, where: str, problems: Problems) -> None:
    """The trace's longest request after scaling (the loader measured it) must fit: named by the trace's line."""
    facts = w.trace.facts if w.trace is not None else None
    if facts is None:
        return
    output = facts.longest_output_tokens if w.max_tokens is None else w.max_tokens
    need = facts.longest_tokens if w.max_tokens is None else facts.longest_input_tokens + w.max_tokens
    if need > limit:
        assert w.trace is not None
        problems.add(
            (*path, "trace") if path == ("workload",) else path,
            f"{where}{display_path(w.trace.file)}:{facts.longest_line}: a request holds {need} tokens after scaling "
            f"(up to input {facts.longest_input_tokens} + output {output}); expected at most {limit}, the context one "
            f"request gets with {because}: lower trace.input_scale or set trace.max_input_tokens / max_output_tokens",
        )
