"""`llmplay plan`: the human-readable text of a plan (also what `llmplay run --dry-run` prints), with a warning for
each goal percentile the workload as written measures on too few requests; starts nothing."""

from __future__ import annotations

from pathlib import Path

import click

from llmplay.archive.listing import archive_root
from llmplay.catalog import label_of
from llmplay.errors import ExitCode, LlmplayError
from llmplay.plan import (
    Plan,
    SampleShortfall,
    build_plan,
    docker_run_argv,
    format_argv,
    prefix_cache_notes,
    sample_shortfalls,
)
from llmplay.playbook.load import load_playbook
from llmplay.playbook.trace import describe_trace
from llmplay.redaction import redact_text
from llmplay.spec import Config, LengthDist, Playbook, ThinkTime, Workload
from llmplay.stats.power import plan_text
from llmplay.tuning.history_noise import HistoryNoise, history_noise


def plan_command(file: Path, *, allow_outside_extends: bool = False) -> int:
    """Print the playbook's plan: baseline, each step's configuration and command line, the gates, and the
    sample-size warnings, with what each step's pairs can show from the archive's earlier runs of it."""
    playbook = load_playbook(file, allow_outside_extends=allow_outside_extends)
    click.echo(render_plan(build_plan(playbook), power_line(playbook)))
    return ExitCode.OK


def power_line(playbook: Playbook) -> str:
    """The power a step's planned pairs have, from the noise the archive's earlier runs of this playbook measured
    (stats.power.plan_text); says so when there is none yet."""
    goals = playbook.goals
    metrics = [goals.objective.metric, *(g.metric for g in goals.guards)]
    try:
        history = history_noise(archive_root(None), playbook, metrics, sha256=playbook.sha256, hardware=None)
    except LlmplayError:
        history = HistoryNoise()
    if not history.runs:
        return "Power: no earlier run of this playbook in the archive: each step's first pairs measure its noise"
    source = f"{len(history.runs)} earlier run(s) of this playbook"
    return "Power " + plan_text(goals, playbook.trials, history.noise, source).removeprefix("power ")


def describe_length(dist: LengthDist) -> str:
    if dist.kind == "fixed":
        return f"fixed {dist.value}"
    if dist.kind == "choice":
        weights = f" weights {list(dist.weights)}" if dist.weights else ""
        return f"choice {list(dist.values)}{weights}"
    if dist.kind == "uniform":
        return f"uniform [{dist.min}, {dist.max}]"
    bounds = f", clipped [{dist.min or 1}, {dist.max or '∞'}]"
    spread = "std" if dist.kind == "normal" else "sigma"
    return f"{dist.kind} mean {dist.mean:g} {spread} {dist.std:g}{bounds}"


def describe_think_time(think: ThinkTime) -> str:
    if think.kind == "fixed":
        return f"{think.value_s:g}s"
    bounds = f" clipped [{think.min_s or 0:g}s, {f'{think.max_s:g}s' if think.max_s is not None else '∞'}]"
    if think.kind == "uniform":
        return f"uniform [{think.min_s:g}s, {think.max_s:g}s]"
    if think.kind == "exponential":
        return f"exponential mean {think.mean_s:g}s" + (bounds if think.max_s is not None else "")
    return f"lognormal mean {think.mean_s:g}s sigma {think.sigma:g}{bounds}"


def describe_workload(w: Workload) -> str:
    if w.trace is not None:
        length = f"{w.num_requests} requests" + (f", at most {w.duration_s:g}s" if w.duration_s else "")
        return f"{w.api}, {describe_trace(w)}, {length}, streaming {w.streaming_fraction:.0%}, seed {w.seed}"
    load = f"concurrency {w.concurrency} (closed loop)" if w.concurrency else f"rate {w.rate:g} req/s {w.arrival}"
    if w.sweep:
        load += f", sweep {list(w.sweep)}"
    shape = (
        f"dataset {w.dataset}" if w.dataset else f"input {describe_length(w.input)}, output {describe_length(w.output)}"
    )
    length = f"duration {w.duration_s:g}s" if w.duration_s else f"{w.num_requests} requests"
    extras = []
    if w.prefix_tokens:
        extras.append(f"shared prefix {w.prefix_tokens} tokens x {w.prefix_groups} groups")
    if w.turns > 1:
        think = f", think time {describe_think_time(w.think_time)}" if w.think_time != ThinkTime() else ""
        extras.append(f"{w.turns} turns{think}")
    if w.session_header:
        extras.append(f"session header {w.session_header}")
    extras.append(f"streaming {w.streaming_fraction:.0%}")
    warm = f"warm-up {w.warmup_s:g}s" + (f" + {w.warmup_requests} requests" if w.warmup_requests else "")
    return f"{w.api}, {shape}, {load}, {length}, {warm}, {', '.join(extras)}, seed {w.seed}"


def _config_lines(config: Config, plan: Plan) -> list[str]:
    spec = config.engine
    args = ", ".join(f"{k}={v!r}" for k, v in spec.args.items()) or "(engine defaults)"
    return [f"  engine args: {args}", f"  $ {format_argv(docker_run_argv(spec, plan.engine))}"]


def describe_shortfall(short: SampleShortfall) -> str:
    """One warning line: the metric, the requests it will rest on (and how that was worked out), the minimum."""
    label, roles = label_of(short.metric), ", ".join(short.roles)
    kind = f"{short.kind} " if short.kind else ""
    share = f" × {short.share:.0%} {short.kind}" if short.kind and short.share < 1 else ""
    head = f"warning: {label} ({roles})"
    if short.share <= 0:
        fraction = 1.0 - short.share if short.kind == "non-streamed" else short.share
        return f"{head} will not be measured: the workload sends no {kind}requests (streaming_fraction {fraction:g})"
    per_trial, pooled, bound = short.per_trial, short.pooled, short.expected.bound
    if per_trial is not None and pooled is not None:
        return (
            f"{head} rests on {bound} {per_trial:.3g} {kind}requests per trial ({short.expected.basis}{share}), "
            f"{bound} {pooled:.3g} over the {short.trials} trial(s) pooled per configuration; "
            f"it needs at least {short.need}"
        )
    return (
        f"{head}: how many {kind}requests it rests on depends on the latency ({short.expected.basis}{share} "
        f"per trial); {short.trials} trial(s) pooled per configuration reach the {short.need} it needs only if "
        f"requests average under {short.latency_s:.3g} s"
    )


def sample_size_lines(plan: Plan) -> list[str]:
    """Warnings for the percentiles the goals use that the workload, as written, measures on too few requests:
    the baseline's workload, and each step's where the step changes the workload."""
    pb = plan.playbook
    lines = [describe_shortfall(s) for s in sample_shortfalls(pb.workload, pb.goals, pb.trials)]
    seen = [pb.workload]
    for planned in plan.steps:
        workload = planned.cumulative.workload
        if workload in seen:
            continue
        seen.append(workload)
        for short in sample_shortfalls(workload, pb.goals, pb.trials):
            lines.append(f"{describe_shortfall(short)} (with step {planned.index} {planned.step.name}'s workload)")
    return lines


def render_plan(plan: Plan, power: str = "") -> str:
    pb = plan.playbook
    goals = pb.goals
    lines = [
        f"Playbook {pb.metadata.name} v{pb.metadata.version} ({pb.path}, sha256 {pb.sha256[:12]})",
        f"Engine: {pb.engine.kind}, model {pb.engine.model}, GPUs {pb.engine.gpus or 0}, runtime {pb.runtime.kind}",
        f"Workload: {describe_workload(pb.workload)}",
        f"Trials: {pb.trials.repeats} per configuration, "
        f"{'interleaved A/B' if pb.trials.interleave else 'sequential blocks'}, "
        f"each a fresh engine start{', sequential stopping' if pb.trials.sequential else ''}",
        *([power] if power else []),
        f"Objective: {goals.objective.direction} {goals.objective.metric} (min effect {goals.objective.min_effect:.0%})",
        "Guards: " + (", ".join(f"{g.metric} within {g.tolerance_text}" for g in goals.guards) or "none"),
        "Gates:" if goals.gates else "Gates: none",
    ]
    lines += [f"  {gate.text}" for gate in goals.gates]
    lines += sample_size_lines(plan)
    lines += ["", "Baseline", *_config_lines(plan.baseline, plan)]
    reuse_notes = prefix_cache_notes(plan)
    for planned in plan.steps:
        step = planned.step
        flag = " [bundle: several knobs]" if step.bundle else ""
        lines += ["", f"Step {planned.index}: {step.name}{flag} (carry {step.carry})"]
        lines += [f"  changes {e.describe()}" for e in planned.effects]
        if (how := step.choice.describe()) is not None:
            lines.append(f"  {how}")
        if step.description:
            lines.append(f"  why: {step.description}")
        if planned.index in reuse_notes:
            lines.append(f"  {reuse_notes[planned.index]}")
        lines += _config_lines(planned.cumulative, plan)
    if plan.steps:
        lines += [
            "",
            "Command lines assume every earlier step is kept; the run applies each step to the best "
            "configuration so far.",
        ]
    # The loader refuses literal secrets; this catches any token format that still reached a line (defense in depth).
    return redact_text("\n".join(lines))
