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
    from llmplay.playbook import load_playbook

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
    from llmplay.playbook import load_playbook
    from llmplay.plan import build_plan
    from llmplay.planview import render_plan

    click.echo(render_plan(build_plan(load_playbook(file, allow_outside_extends=allow_outside_extends))))


def _not_yet(name: str, issue: str):
    @handles_errors
    def command(**_: object) -> None:
        _echo_err(f"llmplay {name}: not implemented yet ({issue})")
        sys.exit(EXIT_INFRA)

    command.__name__ = name
    return command


cli.command("run", context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
            help="Run a tuning playbook (not implemented yet).")(_not_yet("run", "the tuning-run issue"))
cli.command("bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
            help="Benchmark a running endpoint (not implemented yet).")(_not_yet("bench", "the load-generator issue"))
for _name in ("report", "compare", "retest", "verify", "ls"):
    cli.command(_name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                help=f"{_name} (not implemented yet).")(_not_yet(_name, "the report and archive issue"))


def main() -> None:
    cli(prog_name="llmplay")
