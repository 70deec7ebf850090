"""The report's method section (the workload as measured, the trial design, what the verdicts are worth, the metric
definitions) and the goals it quotes, from the archived configuration and the archived playbook as written."""

from __future__ import annotations

from llmplay.archive.model import TRIAL_OK, PlaybookAsRun
from llmplay.archive.verdicts import error_rates_text
from llmplay.catalog import METRIC_DEFINITIONS, fmt_pct
from llmplay.report import charts
from llmplay.report.data import RunData, concat
from llmplay.spec import LengthDist, Workload

Rows = list[tuple[str, str]]

# What the trial design rows say in words; the numbers beside them come from the archived playbook.
_INTERLEAVED = (
    "interleaved pairs, which side starts drawn per pair from the run id (an advantage of starting second "
    "is noise, not an effect); runs archived before that alternated A B | B A"
)
_GUARDS = (
    "a guard rejects only when its interval's better bound is past its tolerance (the regression is shown), "
    "holds when its worse bound is within it, and otherwise leaves the step inconclusive; a step's guard "
    "rejections are one family (Holm); a rate's tolerance is in percentage points, on a Newcombe interval "
    "over the pooled requests"
)
_POOLED_NOISE = (
    "each step's paired variance moderated toward the run's earlier steps (empirical Bayes, limma-style): "
    "more degrees of freedom when the steps' noise is alike, too narrow an interval for a step whose "
    "noise is larger than the rest's"
)
_NOISE_SOURCES = {
    "step": "each step's interval rests on its own pairs alone (assumes nothing about other steps or runs)",
    "run": "the run's steps' paired noise pooled (assumes the steps are about as noisy as each other)",
    "history": (
        "the paired noise of earlier runs of this playbook file on the same engine image and hardware class, pooled "
        "with this run's steps (assumes a step now is as noisy as then; checked step by step against this run's own "
        "noise, one-sided F test at 10%, and not used where it disagrees: that step's method says so)"
    ),
}

# A run stopped before its first configuration was archived: every workload row says so.
_NOT_RECORDED: Rows = [
    ("API", "—"),
    ("input tokens", "not recorded"),
    ("output tokens", "not recorded"),
    ("load", "—"),
    ("streaming share", "—"),
    ("sampling", "temperature 0, ignore_eos not recorded, max_tokens from the output distribution"),
    ("warm-up (discarded)", "0 s"),
    ("measured window", "not recorded"),
    ("seed", "—"),
]


def describe_length(dist: LengthDist) -> str:
    if dist.kind == "fixed":
        return f"fixed {dist.value}"
    if dist.kind == "choice":
        return f"choice {list(dist.values)}" + (f" weights {list(dist.weights)}" if dist.weights else "")
    if dist.kind == "uniform":
        return f"uniform [{dist.min}, {dist.max}]"
    spread = "std" if dist.kind == "normal" else "sigma"
    return f"{dist.kind} mean {dist.mean} {spread} {dist.std}, clipped [{dist.min or 1}, {dist.max or '∞'}]"


def _load(w: Workload) -> str:
    if w.concurrency:
        return f"closed loop, {w.concurrency} concurrent users"
    if w.rate:
        return f"open loop, {w.rate} req/s, {w.arrival} arrivals" + (f", bursts of {w.burst}" if w.burst > 1 else "")
    return "—"


def workload_rows(w: Workload) -> Rows:
    rows = [
        ("API", w.api),
        ("input tokens", f"dataset {w.dataset}" if w.dataset else describe_length(w.input)),
        ("output tokens", describe_length(w.output) if not w.dataset else "from the dataset"),
        ("load", _load(w)),
    ]
    if w.sweep:
        rows.append(("sweep", str(list(w.sweep))))
    if w.prefix_tokens:
        rows.append(("shared prefix", f"{w.prefix_tokens} tokens × {w.prefix_groups} groups"))
    if w.turns > 1:
        rows.append(("turns", str(w.turns)))
    warmup = f"{w.warmup_s or 0:g} s" + (f" + {w.warmup_requests} requests" if w.warmup_requests else "")
    window = (
        f"{w.duration_s:g} s" if w.duration_s else (f"{w.num_requests} requests" if w.num_requests else "not recorded")
    )
    return [
        *rows,
        ("streaming share", fmt_pct(w.streaming_fraction, signed=False)),
        (
            "sampling",
            f"temperature {w.temperature}, ignore_eos {w.ignore_eos}, "
            f"max_tokens {w.max_tokens or 'from the output distribution'}",
        ),
        ("warm-up (discarded)", warmup),
        ("measured window", window),
        ("seed", str(w.seed)),
    ]


def trial_rows(run: RunData, playbook: PlaybookAsRun) -> Rows:
    trials = playbook.trials
    repeats = run.info.repeats_override or trials.repeats
    rows = [
        (
            "repeats per side",
            str(repeats) + (" (overridden)" if any(name == "repeats" for name, _ in run.info.overrides) else ""),
        ),
        ("order", _INTERLEAVED if trials.interleave else "blocked A A … B B …"),
        ("each trial", "a fresh engine start; warm-up discarded"),
        ("sequential", str(trials.sequential)),
        ("confidence", str(trials.confidence)),
        (
            "what the verdicts are worth",
            error_rates_text([v.verdict for v in run.verdicts], trials.confidence, trials.sequential),
        ),
        ("guards", _GUARDS),
    ]
    source = trials.noise or ("run" if trials.pool_noise else "step")
    rows.append(("noise source", f"{source}: {_NOISE_SOURCES.get(source, 'as the playbook wrote it')}"))
    if source == "run":
        rows.append(("pooled noise", _POOLED_NOISE))
    used = sorted({r for v in run.verdicts for r in v.noise_runs})
    if source == "history":
        rows.append(("history runs", ", ".join(used) if used else "none pooled (no comparable earlier run agreed)"))
    return rows


def _histograms(run: RunData) -> str:
    measured = [run.requests(t).timeline for t in run.trials if run.trials[t].status == TRIAL_OK]
    return charts.histograms(
        [
            ("input tokens per request", "tokens", concat(line["input_tokens"] for line in measured)),
            ("output tokens per request", "tokens", concat(line["output_tokens"] for line in measured)),
            ("gap between request sends", "ms", concat(line["send_gap_s"] for line in measured) * 1000),
        ]
    )


def method(run: RunData, playbook: PlaybookAsRun, diagnosis_rules: Rows) -> dict[str, object]:
    config = run.config("baseline") or run.config(run.final or "baseline")
    return {
        "workload": workload_rows(config.workload) if config else _NOT_RECORDED,
        "trials": trial_rows(run, playbook),
        "histograms": _histograms(run),
        "overrides": list(run.info.overrides),
        "definitions": METRIC_DEFINITIONS,
        "slo": playbook.slo,
        "rules": diagnosis_rules,
    }


def goals(playbook: PlaybookAsRun) -> dict[str, str]:
    return {"objective": playbook.objective, "guards": "; ".join(playbook.guards) or "none"}
