"""`llmplay retest`: re-run an archived run's final configuration (optionally on a new image) and compare."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace
from pathlib import Path

from llmplay.archive.listing import archive_root
from llmplay.archive.model import RunInfo
from llmplay.archive.paths import MAX_TEXT_BYTES
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.signing import public_key_from
from llmplay.archive.verify import require_verified
from llmplay.commands.ci_outputs import comparison_sections, write_guarded
from llmplay.commands.run import duration_option_s, print_gates, stdout_console
from llmplay.compare import compare_runs, format_comparison_table, render_comparison_html
from llmplay.engines import get_engine
from llmplay.errors import ArchiveError, ExitCode
from llmplay.history.site import publish_run
from llmplay.outputs.facts import run_section
from llmplay.outputs.files import NO_OUTPUTS, OutputFiles
from llmplay.playbook.convert import check_image_option
from llmplay.playbook.load import load_playbook
from llmplay.runtime.docker import connect as connect_docker
from llmplay.runtime.image_flags import image_flags
from llmplay.spec import Config, Playbook, apply_step
from llmplay.tuning.quality import changed_outputs
from llmplay.tuning.run import RunOptions, run_playbook


def _unchanged_since(path: Path, info: RunInfo, run_dir: Path) -> None:
    """The playbook file (on the host, named by the manifest) hashes as the run recorded, before anything parses
    it: a parse error would otherwise echo a file the archive merely named."""
    if not path.is_file():  # also refuses a FIFO or a device, which a read would block on or never finish
        raise ArchiveError(f"{path}: the playbook of {run_dir} is not a file here; restore it to re-test")
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_TEXT_BYTES + 1).decode("utf-8", errors="replace")
    except OSError as exc:
        raise ArchiveError(f"{path}: cannot read the playbook of {run_dir} ({exc.strerror})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # as load_playbook reads it (universal newlines)
    if hashlib.sha256(text.encode()).hexdigest() != info.playbook.sha256:
        raise ArchiveError(
            f"{path} changed since {run_dir} was run (sha256 differs); "
            "restore it or re-run the playbook instead of re-testing"
        )


def final_playbook_of(run_dir: Path, playbook_file: Path | None = None) -> tuple[Playbook, RunInfo]:
    """The archived run's final configuration as a step-less playbook: the baseline with every carried step applied."""
    archived = ArchivedRun.open(run_dir)
    info = archived.info
    path = playbook_file or Path(info.playbook.path)  # the file it was run from, on this host
    _unchanged_since(path, info, run_dir)
    playbook = load_playbook(path, archived=playbook_file is None, on_this_host=True)
    carried = [v.step for v in archived.verdicts() if v.carried]
    config = Config("baseline", playbook.engine, playbook.workload)
    for step in playbook.steps:
        if step.name in carried:
            config, _ = apply_step(config, step)
    return replace(playbook, engine=config.engine, workload=config.workload, steps=()), info


def flag_changes(playbook: Playbook, new_image: str) -> str | None:
    """One line naming the two releases and the flags the upgrade added and removed (the preflight then says
    whether the run uses a removed one); None when either image is not on this machine or not in Docker."""
    if playbook.runtime.kind != "docker":
        return None
    engine = get_engine(playbook.engine.kind)
    old_image = playbook.engine.image or engine.default_image
    client = connect_docker(playbook.runtime.docker_host)
    try:
        old, new = image_flags(client, old_image, engine), image_flags(client, new_image, engine)
    finally:
        client.close()
    if old is None or new is None:
        return None
    gone, added = sorted(old.flags - new.flags), sorted(new.flags - old.flags)
    shown = ", ".join(gone[:8]) + (f" and {len(gone) - 8} more" if len(gone) > 8 else "")
    return (
        f"engine change: {engine.kind} {old.version or old_image} -> {new.version or new_image}; "
        f"{len(added)} flag(s) added, {len(gone)} removed" + (f" ({shown})" if gone else "")
    )


def retest_command(
    run_dir: Path,
    *,
    image: str | None,
    archive_dir: str | None,
    repeats: int | None,
    duration: str | None,
    html: Path | None = None,
    unverified: bool = False,
    public_key: Path | None = None,
    outputs: OutputFiles = NO_OUTPUTS,
) -> int:
    """Re-run the archived final configuration and compare; ExitCode.REGRESSION when the new run regressed.

    The archived run must verify first (nothing of it is read before), unless `unverified`, which says so."""
    if image is not None:
        check_image_option(image)
    verification = require_verified(run_dir, allow_unverified=unverified, public_key=public_key_from(public_key))
    console = stdout_console()
    if not verification.ok:
        console.print(
            f"WARNING: {run_dir}: this archive failed verification: {verification.one_line()}; re-testing anyway",
            markup=False,
        )
    playbook, info = final_playbook_of(run_dir)
    console.print(
        f"re-testing {run_dir} final configuration '{info.final_config_id}'" + (f" on image {image}" if image else ""),
        markup=False,
    )
    if image:
        changes = flag_changes(playbook, image)
        if changes:
            console.print(changes, markup=False)
    repeats = repeats or info.repeats_override or playbook.trials.repeats
    options = RunOptions(
        archive_root=archive_root(archive_dir),
        repeats=repeats,
        duration_s=duration_option_s("duration", duration),
        image=image,
        progress=sys.stderr.isatty(),
    )
    outcome = run_playbook(
        playbook, options, publish=publish_run, report=lambda line: console.print(line, markup=False)
    )
    print_gates(console, outcome.gates)
    if outcome.status != "complete":
        console.print(f"re-test did not complete ({outcome.status}); archive {outcome.run_dir}", markup=False)
        code = outcome.exit_code or ExitCode.INFRA
        return write_guarded(outputs, lambda: [run_section(outcome.run_dir, code, "retest")], code)
    comparison = compare_runs(run_dir, outcome.run_dir)
    console.print(format_comparison_table(comparison), markup=False)
    if html is not None:
        render_comparison_html(comparison, html)
    # Latency can be fine while the engine says something else: changed greedy outputs are a regression too.
    changed = changed_outputs(run_dir, str(info.final_config_id), outcome.run_dir, outcome.final_config_id)
    if changed is not None:
        console.print(f"quality: {changed}", markup=False)
    if comparison.has_regression or changed is not None:
        console.print(f"REGRESSION against {run_dir}; new run {outcome.run_dir}", markup=False)
        code = ExitCode.REGRESSION
    else:
        console.print(f"no regression against {run_dir}; new run {outcome.run_dir}", markup=False)
        code = ExitCode.OK
    return write_guarded(
        outputs, lambda: comparison_sections("retest", comparison, code, changed_outputs=changed, html=html), code
    )
