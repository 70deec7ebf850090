"""`llmplay history`: every run of a playbook oldest first with its figures and flagged changes; --accept a
reference; --check the newest run against it (exit 4 on regression, like retest and compare)."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from llmplay.archive.index import ArchiveIndex, find_run, read_reference, write_reference
from llmplay.archive.listing import archive_root
from llmplay.errors import ArchiveError, ExitCode
from llmplay.history.timeline import build_history, format_history


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


def history_command(
    target: str | None,
    *,
    archive_dir: str | None,
    accept: str | None = None,
    check: bool = False,
    noise: str = "trials",
) -> int:
    """Print the history (of one playbook, or of every playbook); with `accept`, record that run as its playbook's
    reference first; with `check`, judge the newest run against the reference: ExitCode.REGRESSION or OK."""
    root = archive_root(archive_dir)
    index = ArchiveIndex(root)
    if accept is not None:
        entry = find_run(index.runs(), accept)
        if entry is None:
            raise ArchiveError(f"{accept}: no such run under {root}; expected a run id or path as `llmplay ls` shows")
        if not entry.usable:
            why = entry.problems[0] if entry.problems else f"status {entry.status}"
            raise ArchiveError(
                f"{root / entry.path}: cannot be a reference: it fails verification or did not complete ({why})"
            )
        write_reference(root, entry)
        click.echo(f"accepted {entry.run_id} as the reference of {entry.playbook}")
        target = target or entry.playbook
    names = [playbook_name(target)] if target else index.playbooks()
    if check and not target:  # every playbook someone accepted a reference for
        names = [n for n in names if read_reference(root, n) is not None]
        if not names:
            raise ArchiveError(f"no playbook under {root} has an accepted reference; `llmplay history --accept RUN`")
    if not names:
        click.echo(f"no runs under {root}")
        return ExitCode.OK
    worst: int = ExitCode.OK
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

        result = check_newest(root, history, noise)
        click.echo("\n".join(result.lines))
        worst = max(worst, result.exit_code)
    return worst
