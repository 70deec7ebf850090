"""`llmplay tune`: the checklist's loop on a playbook with a `tune:` section; `--dry-run --baseline RUN` prints the
first round's ranking from an archived baseline without starting an engine."""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from llmplay.archive.listing import archive_root
from llmplay.archive.reader import ArchivedRun
from llmplay.commands.run import stdout_console
from llmplay.errors import ExitCode, PlaybookError
from llmplay.history.site import publish_run
from llmplay.playbook.load import load_playbook
from llmplay.spec import Playbook
from llmplay.tune import trail
from llmplay.tune.loop import TuneLoop, rank_incumbent, ranking_lines
from llmplay.tuning.run import RunOptions, RunOutcome, run_playbook
from llmplay.tuning.schedule import pairs_at_once


def tune_command(
    file: Path | None,
    *,
    archive_dir: str | None,
    resume: Path | None,
    dry_run: bool,
    baseline: Path | None,
    allow_outside_extends: bool = False,
) -> int:
    """Run the tuning loop (or, with dry_run and baseline, print its first ranking); the exit code."""
    console = stdout_console()
    root = archive_root(archive_dir)

    def say(line: str) -> None:
        console.print(line, markup=False)

    if resume is not None:
        state = trail.load(resume)
        playbook = load_playbook(file or Path(state.playbook), allow_outside_extends=allow_outside_extends)
        tune_dir = resume
    elif file is None:
        raise PlaybookError("llmplay tune: expected a playbook FILE (or --resume TUNE_DIR)")
    else:
        playbook = load_playbook(file, allow_outside_extends=allow_outside_extends, on_this_host=not dry_run)
        state = None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        tune_dir = root / playbook.metadata.name / f"tune-{stamp}"
    if playbook.tune is None:
        raise PlaybookError(f"{file}: tune: not found; expected e.g. tune: {{budget: {{engine_time: 30m}}}}")
    if dry_run:
        if baseline is None:
            raise PlaybookError(
                "llmplay tune --dry-run: expected --baseline RUN_DIR (an archived run of this playbook)"
            )
        for line in dry_run_ranking(playbook, baseline):
            say(line)
        return ExitCode.OK

    def run(pb: Playbook, options: RunOptions) -> RunOutcome:
        return run_playbook(pb, replace(options, progress=sys.stderr.isatty()), publish=publish_run, report=say)

    outcome = TuneLoop(playbook, tune_dir, run, say, state, archive_root=root, room=pairs_at_once).execute()
    say(
        f"tune: {sum(len(r.candidates) for r in outcome.trail.rounds)} steps chosen, {outcome.trail.engine_s / 60:.1f} engine minutes"
    )
    say(f"tune: stop reason: {outcome.trail.stop}")
    if outcome.tuned is not None:
        say(f"tuned playbook: {outcome.tuned}")
    if outcome.report is not None:
        say(f"report: {outcome.report}")
    return ExitCode.GATES if outcome.trail.infeasible else ExitCode.OK


def dry_run_ranking(playbook: Playbook, baseline: Path) -> list[str]:
    """The first round's ranking from an archived run's final configuration: its findings, knobs, figures, gates."""
    run = ArchivedRun.open(baseline)
    final = run.info.final_config_id
    args = next((dict(c.engine.args) for c in run.configs() if c.config_id == final), dict(playbook.engine.args))
    row = next((r for r in run.tuning_record() if r.config_id == final), None)
    summary = dict(row.metrics) if row is not None else {}
    ranked = rank_incumbent(playbook, run.findings(), args, summary, run.gates(), ())
    return [f"tune --dry-run: round 1 ranking from {baseline} (final configuration {final})"] + [
        f"  {line}" for line in ranking_lines(ranked)
    ]
