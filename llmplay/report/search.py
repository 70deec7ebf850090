"""A search step in the report: the objective's change against the incumbent by value (with intervals, the chosen
value marked), the trade-off between the objective and the first guard at every measured value, how the winner's
gain was estimated, and what the race cost against a full grid. Read from the archive's search record only."""

from __future__ import annotations

from collections.abc import Sequence

from llmplay.archive.model import SearchRecord, SearchValue, StepVerdict
from llmplay.catalog import label_of
from llmplay.report.charts import BASELINE_COLOR, CANDIDATE_COLOR, _figure, _not_measured, _styled, to_svg

CHOSEN_COLOR = "#2e8b57"
# The trade-off chart's x axis when the playbook names no guard: throughput against the objective.
DEFAULT_TRADE_OFF = "throughput.output_tok_s"


def _positions(search: SearchRecord) -> tuple[list[float], list[str], float, bool]:
    """Where each value (and the incumbent, last) sits on the x axis: its number for a numeric knob, else its rank."""
    values = [v.value for v in search.values]
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in [*values, search.incumbent_value])
    if numeric:
        return [float(x) for x in values], [str(x) for x in values], float(search.incumbent_value or 0), True  # type: ignore[arg-type]
    return [float(i) for i in range(len(values))], [str(x) for x in values], float(len(values)), False


@_styled
def value_chart(search: SearchRecord, metric: str, width_in: float = 4.6) -> str:
    """The objective's change against the incumbent at each value, over every pair it ran, with its interval
    (not corrected for selection); the incumbent at 0 and the chosen value in green."""
    fig, (ax,) = _figure(width_in, 2.8, bottom_in=0.55)
    ax.set_title(f"{label_of(metric)} against {search.target}")
    xs, labels, incumbent_x, numeric = _positions(search)
    drawn = labelled = False
    for x, value in zip(xs, search.values, strict=True):
        e = value.effect
        if e is None or e.rel_change is None:
            continue
        chosen = value.value == search.chosen
        color = CHOSEN_COLOR if chosen else CANDIDATE_COLOR
        if e.ci_low is not None and e.ci_high is not None:
            ax.vlines(x, e.ci_low * 100, e.ci_high * 100, color=color, linewidth=2, alpha=0.6)
        label = f"chosen ({value.value})" if chosen else (None if labelled else "a value, CI over its pairs")
        marker = "*" if chosen else "o"
        ax.scatter([x], [e.rel_change * 100], color=color, s=70 if chosen else 28, marker=marker, zorder=3, label=label)
        labelled = labelled or not chosen
        drawn = True
    if not drawn:
        _not_measured(ax, "no value has a measured change")
        return to_svg(fig)
    ax.scatter(
        [incumbent_x], [0.0], color=BASELINE_COLOR, s=28, zorder=3, label=f"incumbent ({search.incumbent_value})"
    )
    ax.axhline(0, color=BASELINE_COLOR, linewidth=0.8, linestyle="--")
    if numeric:
        ticks = sorted({*xs, incumbent_x})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    else:
        ax.set_xticks([*xs, incumbent_x], [*labels, "incumbent"])
    ax.set_xlabel(search.target)
    ax.set_ylabel("change vs incumbent (%)")
    ax.legend(loc="best")
    return to_svg(fig)


@_styled
def trade_off_chart(search: SearchRecord, objective: str, other: str, width_in: float = 4.6) -> str:
    """Every measured configuration's pooled objective against `other` (the first guard): the Pareto view of what
    each value buys and costs, the chosen value in green."""
    fig, (ax,) = _figure(width_in, 2.8, bottom_in=0.55)
    ax.set_title(f"{label_of(objective)} against {label_of(other)}")
    points: list[tuple[str, float, float, str]] = []
    if objective in search.incumbent_metrics and other in search.incumbent_metrics:
        inc = search.incumbent_metrics
        points.append((f"incumbent ({search.incumbent_value})", inc[other], inc[objective], BASELINE_COLOR))
    for v in search.values:
        if objective in v.metrics and other in v.metrics:
            color = CHOSEN_COLOR if v.value == search.chosen else CANDIDATE_COLOR
            points.append((str(v.value), v.metrics[other], v.metrics[objective], color))
    if not points:
        _not_measured(ax, "no value has both figures")
        return to_svg(fig)
    scale = 1000.0 if objective.startswith(("ttft", "tpot", "itl", "e2el")) else 1.0
    x_scale = 1000.0 if other.startswith(("ttft", "tpot", "itl", "e2el")) else 1.0
    for label, x, y, color in points:
        chosen = color == CHOSEN_COLOR
        size, marker = (70, "*") if chosen else (28, "o")
        ax.scatter([x * x_scale], [y * scale], color=color, s=size, marker=marker, zorder=3)
        ax.annotate(label, (x * x_scale, y * scale), textcoords="offset points", xytext=(5, 3), fontsize=7)
    ax.set_xlabel(label_of(other) + (" (ms)" if x_scale > 1 else ""))
    ax.set_ylabel(label_of(objective) + (" (ms)" if scale > 1 else ""))
    ax.margins(0.15)
    return to_svg(fig)


def _engine_text(search: SearchRecord) -> str:
    saved = 1.0 - search.engine_s / search.grid_engine_s if search.grid_engine_s > 0 else 0.0
    return (
        f"The race took {search.trials} trials over {search.rounds} rounds, {search.engine_s:.0f} engine-seconds; "
        f"measuring every value and the incumbent as often would have taken {search.grid_engine_s:.0f} s "
        f"({saved:.0%} saved), and {search.grid_max_rounds_engine_s:.0f} s at the design's "
        f"{search.max_rounds} rounds per value."
    )


def _gain_text(search: SearchRecord) -> str:
    gain = search.gain
    if gain is None or gain.rel_change is None:
        return f"No gain is reported: {search.gain_method}."
    interval = ""
    if gain.ci_low is not None and gain.ci_high is not None:
        interval = f" [{gain.ci_low:+.1%}, {gain.ci_high:+.1%}]"
    return f"The chosen value's gain, {gain.rel_change:+.1%}{interval}, is {search.gain_method}."


def _value_rows(values: Sequence[SearchValue]) -> list[dict[str, object]]:
    rows = []
    for v in values:
        e = v.effect
        change = f"{e.rel_change:+.1%}" if e is not None and e.rel_change is not None else "—"
        ci = f"[{e.ci_low:+.1%}, {e.ci_high:+.1%}]" if e and e.ci_low is not None and e.ci_high is not None else "—"
        left = f"round {v.left_at_round}" if v.left_at_round is not None else ""
        rows.append(
            {"value": str(v.value), "pairs": v.pairs, "change": change, "ci": ci, "status": v.status, "left": left}
            | {"reason": v.reason}
        )
    return rows


def search_section(verdict: StepVerdict) -> dict[str, object] | None:
    """The search block of a step section (None for a step of fixed changes)."""
    search = verdict.search
    if search is None:
        return None
    objective = verdict.objective.metric if verdict.objective else (search.gain.metric if search.gain else "")
    other = verdict.guards[0].metric if verdict.guards else DEFAULT_TRADE_OFF
    objective = objective or "ttft.p95"
    return {
        "target": search.target,
        "chosen": str(search.chosen),
        "value_chart": value_chart(search, objective),
        "trade_off_chart": trade_off_chart(search, objective, other),
        "gain": _gain_text(search),
        "engine": _engine_text(search),
        "familywise": search.familywise,
        "unimodal": search.unimodal,
        "finished": search.finished,
        "rows": _value_rows(search.values),
    }
