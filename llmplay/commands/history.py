"""`llmplay history`: every run of a playbook oldest first with its figures and flagged changes; --accept a
reference; --check the newest run against it (exit 4 on regression, like retest and compare)."""

from __future__ import annotations

from pathlib import Path

import click
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from llmplay.archive.index import ArchiveIndex
from llmplay.archive.listing import archive_root
from llmplay.archive.reader import ArchivedRun
from llmplay.archive.references import find_run, read_reference, write_reference
from llmplay.archive.signing import public_key_from
from llmplay.archive.verify import check as verify_run
from llmplay.errors import ArchiveError, ExitCode
from llmplay.history.timeline import build_history, format_history
from llmplay.outputs.files import NO_OUTPUTS, OutputFiles


def playbook_name(target: str) -> str:
    """The playbook a history is asked for: a playbook file's metadata.name, else the name as given."""
    path = Path(target)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
            name = document["metadata"]["name"]
        except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
            raise ArchiveError(f"{path}: no metadata.name to find its runs by ({type(exc).__name__})") from None
        return str(name)
    return target


def accept_run(root: Path, index: ArchiveIndex, key: str, public_key: Ed25519PublicKey | None) -> str:
    """Record a run as its playbook's reference once it verifies again from the archive (never on the index's
    word) and completed; its playbook's name."""
    entry = find_run(index.runs(), key)
    if entry is None:
        raise ArchiveError(f"{key}: no such run under {root}; expected a run id or path as `llmplay ls` shows")
    run_dir = root / entry.path
    verification = verify_run(run_dir, public_key)
    if not verification.ok:
        raise ArchiveError(
            f"{run_dir}: cannot be a reference: it fails verification: {verification.one_line()}; "
            f"`llmplay verify {run_dir}` lists every problem"
        )
    status = ArchivedRun.open(run_dir).info.status
    if status != "complete":
        raise ArchiveError(f"{run_dir}: cannot be a reference: it did not complete (status {status})")
    write_reference(root, entry)
    click.echo(f"accepted {entry.run_id} as the reference of {entry.playbook}")
    return entry.playbook


def history_command(
    target: str | None,
    *,
    archive_dir: str | None,
    accept: str | None = None,
    check: bool = False,
    outputs: OutputFiles = NO_OUTPUTS,
    public_key: Path | None = None,
    noise: str = "trials",
) -> int:
    """Print the history (of one playbook, or of every playbook); with `accept`, record that run as its playbook's
    reference first; with `check`, judge the newest run against the reference: ExitCode.REGRESSION or OK.
    Verification (with the public key, when one is configured) decides which runs count, as `verify` would."""
    if outputs.wanted and not check:
        raise click.UsageError(f"{outputs.named}: written by `history --check` only; add --check")
    root = archive_root(archive_dir)
    key = public_key_from(public_key)
    index = ArchiveIndex(root, public_key=key)
    if accept is not None:
        accepted = accept_run(root, index, accept, key)
        target = target or accepted
    names = [playbook_name(target)] if target else index.playbooks()
    if check and not target:  # every playbook someone accepted a reference for
        names = [n for n in names if read_reference(root, n) is not None]
        if not names:
            unreadable = index.unreadable()  # a run that cannot even be indexed may be the one to judge
            why = (
                f"; {len(unreadable)} run(s) not read: {unreadable[0].path} ({unreadable[0].why})" if unreadable else ""
            )
            raise ArchiveError(
                f"no playbook under {root} has an accepted reference; `llmplay history --accept RUN`{why}"
            )
    if not names:
        click.echo(f"no runs under {root}")
        return ExitCode.OK
    worst: int = ExitCode.OK
    checked = []
    for name in names:
        entries = index.runs(name)
        if not entries:
            raise ArchiveError(f"{name}: no runs of this playbook under {root}; `llmplay ls` lists what is there")
        history = build_history(name, entries, read_reference(root, name))
        if not check:
            click.echo(format_history(history))
            click.echo("")
            continue
        from llmplay.history.check import check_newest  # deferred: compare pulls in pandas and matplotlib

        result = check_newest(root, history, key, index.unreadable(), noise)
        click.echo("\n".join(result.lines))
        worst = max(worst, result.exit_code)
        checked.append((history, result))
    if checked:
        from llmplay.commands.ci_outputs import check_section, write_guarded  # deferred: reads archives with pandas

        return write_guarded(outputs, lambda: [check_section(root, h, r) for h, r in checked], worst)
    return worst
