"""A Markdown job summary (GitHub's $GITHUB_STEP_SUMMARY, a GitLab or Buildkite annotation, a chat message): the
verdict first, then gates, steps or judged metrics, the final configuration and where the report is. Appended to
an existing file, so several steps of one job can write to the same summary."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmplay.catalog import TUNING_RECORD_METRICS, fmt_ci, fmt_full, fmt_pct, label_of
from llmplay.errors import ExitCode
from llmplay.outputs.cases import gate_state, objective_text, trial_range
from llmplay.outputs.facts import RunFacts, Section

_OUTCOME: dict[int, str] = {
    ExitCode.OK: "✅ passed",
    ExitCode.GATES: "❌ a gate failed",
    ExitCode.REGRESSION: "❌ regression",
    ExitCode.INFRA: "⚠️ could not judge",
}


def cell(text: object) -> str:
    """Text safe inside a Markdown table cell: no pipe ends the cell, no newline ends the row."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip() or " "


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    return [
        "| " + " | ".join(h.removeprefix(">") for h in headers) + " |",
        "|" + "|".join(" ---: " if h.startswith(">") else " --- " for h in headers) + "|",
        *("| " + " | ".join(cell(c) for c in row) + " |" for row in rows),
    ]


def _heading(section: Section) -> list[str]:
    run = section.run
    outcome = _OUTCOME.get(section.exit_code, "❌ failed")
    lines = [f"### llmplay {section.command} · {run.playbook} · {outcome} (exit {section.exit_code})", ""]
    where = f"on `{run.engine.label}`, {run.hardware}" + (f", host `{run.host}`" if run.host else "")
    if section.reference is not None:
        lines.append(f"Run `{run.run_id}` against the reference `{section.reference.run_id}` {where}.")
    else:
        lines.append(f"Run `{run.run_id}` {where}; status {run.status}.")
    return [*lines, ""]


def _gates(run: RunFacts) -> list[str]:
    if not run.gates:
        return ["No gates declared.", ""]
    rows = []
    for gate in run.gates:
        state = gate_state(gate)
        mark = "✅" if gate.met else ("⚠️" if gate.met is None else "❌")
        margin = "" if gate.margin is None else f"{gate.margin:+.0%}"
        spread = trial_range(run, gate.metric, gate=True).removeprefix("per-trial ")
        observed = fmt_full(gate.metric, gate.observed)
        rows.append([f"`{gate.gate}`", observed, spread, f"{mark} {state}", margin])
    return [*_table(["gate", ">observed", ">per-trial range", "result", ">margin"], rows), ""]


def _steps(run: RunFacts) -> list[str]:
    if not run.verdicts:
        return []
    rows = [
        [
            f"{v.index} {v.step}",
            ", ".join(f"`{c}`" for c in v.changes),
            f"**{v.verdict}**",
            objective_text(v, run.confidence),
            v.reason,
        ]
        for v in run.verdicts
    ]
    return [*_table(["step", "change", "verdict", "objective [CI]", "why"], rows), ""]


def _judged(section: Section) -> list[str]:
    comparison = section.comparison
    assert comparison is not None
    rows = []
    for m in comparison.metrics:
        if not m.role:
            continue
        state = "❌ REGRESSION" if m.regression else ("⚠️ not judged" if m.a is None or m.b is None else "✅ holds")
        rows.append(
            [
                f"{m.role} {m.label}",
                fmt_full(m.metric, m.a),
                fmt_full(m.metric, m.b),
                f"{fmt_pct(m.rel_change)} {fmt_ci(m.ci_low, m.ci_high)}".strip(),
                m.tolerance_text,
                state,
            ]
        )
    for g in comparison.gates:
        a, b = (gate_state(r) if r is not None else "—" for r in (g.a, g.b))
        state = "❌ REGRESSION" if g.regression else ("✅ holds" if g.b is not None and g.b.met else "⚠️ not judged")
        rows.append([f"gate `{g.gate}`", a, b, "", "", state])
    headers = ["judged", ">reference", ">this run", f">change [{comparison.ci_label}]", ">tolerance", "result"]
    lines = [*_table(headers, rows), ""]
    lines += [f"- ❌ {message}" for _, message in section.failures]
    if section.error:
        lines.append(f"- ⚠️ {section.error}")
    lines += [f"- note: {note}" for note in comparison.notes]
    return [*lines, ""] if lines[-1] != "" else lines


def _final(run: RunFacts) -> list[str]:
    kept = ", ".join(f"{v.step} ({', '.join(v.changes)})" for v in run.kept)
    lines = [
        f"**Final configuration:** `{run.final_config}`" + (f" — kept on the baseline: {kept}" if kept else ""),
        "",
    ]
    rows = [
        [label_of(m), fmt_full(m, run.figures[m]), trial_range(run, m).removeprefix("per-trial ")]
        for m in TUNING_RECORD_METRICS
        if m in run.figures
    ]
    if rows:
        lines += [*_table(["figure", ">value", ">per-trial range"], rows), ""]
    if run.config is not None and run.config.docker_command:
        lines += ["```", run.config.docker_command, "```", ""]
    return lines


def _links(section: Section) -> list[str]:
    paths = [("report", section.run.report), *section.extra_links]
    shown = [f"{what}: `{path}`" for what, path in paths if path is not None]
    archive = f"archive: `{section.run.run_dir}`"
    return [" · ".join([*shown, archive]), ""]


def section_markdown(section: Section) -> str:
    lines = _heading(section)
    if section.nothing_newer is not None:
        lines += [section.nothing_newer, ""]
    elif section.comparison is not None:
        lines += _judged(section)
    else:
        lines += _gates(section.run) + _steps(section.run)
    lines += _final(section.run) + _links(section)
    return "\n".join(lines)


def summary_markdown(sections: Sequence[Section]) -> str:
    return "\n".join(section_markdown(s) for s in sections)


def append_summary(path: Path, sections: Sequence[Section]) -> Path:
    """Append to `path` (created when absent): $GITHUB_STEP_SUMMARY already exists and other steps add to it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = summary_markdown(sections)
    separator = "\n" if path.is_file() and path.stat().st_size > 0 else ""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(separator + text)
    return path
