"""The `llmplay` command line: each command parses options, makes one core call, and returns an exit code."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from llmplay import __version__
from llmplay.errors import LlmplayError

EXIT_OK, EXIT_INFRA, EXIT_PLAYBOOK, EXIT_GATES, EXIT_REGRESSION = 0, 1, 2, 3, 4


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


def handles_errors(func):
    """Known errors become one line on stderr and their exit code; --debug shows the traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        try:
            return func(*args, **kwargs)
        except LlmplayError as exc:
            if ctx.find_root().params.get("debug"):
                raise
            _echo_err(f"error: {exc}" if "\n" not in str(exc) else f"error:\n{exc}")
            ctx.exit(exc.exit_code)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmplay")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Executable, auditable LLM inference tuning playbooks."""


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--allow-outside-extends", is_flag=True, help="Allow extends: to leave the playbook's directory.")
def validate(files: tuple[Path, ...], allow_outside_extends: bool) -> None:
    """Check playbooks against the llmplay/v1 schema and the engine's knobs."""
    from llmplay.playbook.load import load_playbook

    failed = 0
    for file in files:
        try:
            pb = load_playbook(file, allow_outside_extends=allow_outside_extends)
        except LlmplayError as exc:
            failed += 1
            _echo_err(str(exc))
            continue
        click.echo(f"{file}: ok ({pb.metadata.name}, engine {pb.engine.kind}, {len(pb.steps)} steps, "
                   f"{len(pb.goals.gates)} gates)")
    sys.exit(EXIT_PLAYBOOK if failed else EXIT_OK)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--allow-outside-extends", is_flag=True)
@handles_errors
def plan(file: Path, allow_outside_extends: bool) -> None:
    """Print the baseline, each step's configuration and command line, and the gates; starts nothing."""
    from llmplay.playbook.load import load_playbook
    from llmplay.plan import build_plan
    from llmplay.commands.plan import render_plan

    click.echo(render_plan(build_plan(load_playbook(file, allow_outside_extends=allow_outside_extends))))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help="Archive root (default $LLMPLAY_ARCHIVE or ./reports).")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path), help="Continue an interrupted run.")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--only", multiple=True, help="Run only this step (repeatable); the report marks the run overridden.")
@click.option("--repeats", type=click.IntRange(1, 50), help="Override trials.repeats.")
@click.option("--duration", "duration", help="Override workload.duration (e.g. 10s).")
@click.option("--warmup", "warmup", help="Override workload.warmup (e.g. 2s).")
@click.option("--allow-outside-extends", is_flag=True)
@handles_errors
def run(file: Path | None, archive_dir: str | None, resume: Path | None, dry_run: bool, only: tuple[str, ...],
        repeats: int | None, duration: str | None, warmup: str | None, allow_outside_extends: bool) -> None:
    """Run a tuning playbook: baseline, then each step, with repeats, verdicts and gates.

    Exit 0: the final configuration meets every gate; 3: a gate fails; 2: playbook error;
    1: infrastructure failure; 130: interrupted (resume with --resume).
    """
    from llmplay.commands.run import run_command

    sys.exit(run_command(file, archive_dir=archive_dir, resume=resume, dry_run=dry_run, only=only, repeats=repeats,
                         duration=duration, warmup=warmup, allow_outside_extends=allow_outside_extends))
@cli.command()
@click.option("--url", required=True, help="Base URL of a running OpenAI-compatible engine, e.g. http://127.0.0.1:8080")
@click.option("--workload", "workload_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="A playbook, or a YAML file holding a workload mapping.")
@click.option("--model", help="Model name to request (default: the first of GET /v1/models).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the summary as JSON.")
@handles_errors
def bench(url: str, workload_file: Path, model: str | None, json_path: str | None) -> None:
    """Run one workload against an already running endpoint and print the summary."""
    from rich.console import Console

    from llmplay.tuning.sweep import format_summary_table, run_sweep
    from llmplay.playbook.load import load_workload

    workload, goals = load_workload(workload_file)
    results = run_sweep(url, workload, model=model, json_path=json_path, slo_s=goals.slo_s,
                        progress=sys.stderr.isatty())
    console = Console(width=None if sys.stdout.isatty() else 120)  # pipes and CI logs: wide enough for the table
    for result in results:
        console.print(format_summary_table(result.summary))


@cli.command()
@handles_errors
def gc() -> None:
    """Remove containers left behind by llmplay runs that died."""
    from llmplay.runtime.docker import gc as docker_gc

    removed = docker_gc()
    click.echo(f"removed {len(removed)} container(s)" + (": " + ", ".join(removed) if removed else ""))


@cli.group()
def engine() -> None:
    """Engine images."""


@engine.command("build-cpu")
@click.option("--force", is_flag=True, help="Rebuild even when the cache is current.")
@handles_errors
def build_cpu(force: bool) -> None:
    """Build the embedded CPU engine image (llama.cpp + tiny model), cached under ~/.cache/llmplay."""
    from llmplay.runtime.cpu_image import build_cpu_engine

    result = build_cpu_engine(force=force)
    click.echo(f"CPU engine ready: {result}")
@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--image", help="Engine image to re-test on (the engine-upgrade case).")
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False))
@click.option("--repeats", type=click.IntRange(1, 50))
@click.option("--duration")
@click.option("--html", type=click.Path(dir_okay=False, path_type=Path), help="Also write the comparison as HTML.")
@handles_errors
def retest(run_dir: Path, image: str | None, archive_dir: str | None, repeats: int | None, duration: str | None,
           html: Path | None) -> None:
    """Re-run an archived run's final configuration and compare; exit 4 on regression."""
    from llmplay.commands.run import retest_command

    sys.exit(retest_command(run_dir, image=image, archive_dir=archive_dir, repeats=repeats, duration=duration, html=html))


def _register_archive_commands() -> None:
    from llmplay.commands.archive import register

    register(cli)


_register_archive_commands()


def main() -> None:
    try:
        cli(prog_name="llmplay")
    except Exception as exc:  # noqa: BLE001 - a bug must still be one line; --debug shows the traceback
        if "--debug" in sys.argv[1:]:
            raise
        _echo_err(f"internal error: {type(exc).__name__}: {exc} (re-run with --debug for the traceback)")
        sys.exit(EXIT_INFRA)

