"""engine.model_dir checked while the playbook loads: the host directory is mounted into a container whose image the
playbook chooses, so it must hold a model, never the host's system or credentials.

Refused, before and after resolving symlinks: `/`; system trees (/etc, /usr, /var, /proc, /sys, /dev, /boot, /run,
/bin, /sbin, /lib*); home directories themselves (/home, /root, a user's home, $HOME and its parents); any path
through a credential directory (.ssh, .aws, .docker, .config, .gnupg, .kube, ...); a directory that holds one (it
is somebody's home); a directory that is or holds the folder of $LLMPLAY_SIGNING_KEY, ~/.ssh, or the archive root
(the private key, the user's keys, or the runs a check judges by would be handed to that image). An existing model_dir must be a directory; a missing one is refused where the engine will run
on this host (Docker would otherwise create it, empty and owned by root, and the run would fail only after an
engine start).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from llmplay.cache_dir import CACHE_REFERENCE, expand_cache, how_to_make
from llmplay.playbook.problems import Problems
from llmplay.spec import RuntimeSpec

SYSTEM_TREES = tuple(
    PurePosixPath(p)
    for p in ("/etc", "/usr", "/var", "/proc", "/sys", "/dev", "/boot", "/run", "/bin", "/sbin", "/lib", "/lib32",
              "/lib64", "/libx32", "/snap")
)  # fmt: skip
HOME_ROOTS = (PurePosixPath("/home"), PurePosixPath("/root"), PurePosixPath("/Users"))
CREDENTIAL_DIRS = frozenset(
    {".ssh", ".aws", ".docker", ".config", ".gnupg", ".kube", ".azure", ".gcloud", ".password-store", ".vault-token"}
)
PATH: tuple[str, ...] = ("engine", "model_dir")
# The names llmplay.archive.layout gives these variables (this stage may not import the archive; a test ties them).
ENV_SIGNING_KEY = "LLMPLAY_SIGNING_KEY"
ENV_ARCHIVE = "LLMPLAY_ARCHIVE"


def protected_dirs(archive_root: Path | None = None) -> dict[PurePosixPath, str]:
    """Folders no mount may be or hold, each with what it is: the signing key's folder, ~/.ssh, the archive root
    (`archive_root`, else $LLMPLAY_ARCHIVE, else ./reports, as the commands choose it)."""
    found: dict[PurePosixPath, str] = {}
    key = os.environ.get(ENV_SIGNING_KEY)
    if key:
        found[_real(os.path.dirname(os.path.abspath(os.path.expanduser(key))))] = (
            f"the folder of ${ENV_SIGNING_KEY} (the private signing key)"
        )
    found[_real(os.path.expanduser("~/.ssh"))] = "~/.ssh"
    root = archive_root if archive_root is not None else Path(os.environ.get(ENV_ARCHIVE) or "reports")
    found[_real(os.path.abspath(os.path.expanduser(root)))] = "the archive root"
    return found


def _real(path: str) -> PurePosixPath:
    return PurePosixPath(os.path.realpath(path))


def host_path(written: str) -> str:
    """model_dir as written, with `${cache}` (this machine's llmplay cache) and `~` expanded; still relative to the
    playbook's directory when written so."""
    return os.path.expanduser(expand_cache(written))


def check_model_dir(
    written: str,
    base_dir: Path,
    resolved: str,
    runtime: RuntimeSpec,
    on_this_host: bool,
    problems: Problems,
    archive_root: Path | None = None,
) -> None:
    """Problems for `written` (as in the playbook, relative to `base_dir`) whose symlink-resolved form is `resolved`."""
    if "${" in expand_cache(written):
        problems.add(
            PATH,
            f"'{written}': only {CACHE_REFERENCE} is expanded here (this machine's llmplay cache, $LLMPLAY_CACHE or "
            f"~/.cache/llmplay); expected a path, or one starting with {CACHE_REFERENCE}/",
        )
        return
    lexical = PurePosixPath(os.path.abspath(os.path.join(base_dir, host_path(written))))
    real = PurePosixPath(resolved)
    protected = protected_dirs(archive_root)
    for candidate in dict.fromkeys((lexical, real)):
        why = _dangerous(candidate) or _holds_protected(candidate, protected)
        if why:
            via = "" if candidate == lexical else f" (it resolves to {candidate})"
            problems.add(
                PATH,
                f"'{written}'{via} is {why}; expected a directory that holds only the model's files (it is mounted "
                "into the engine's container)",
            )
            return
    path = Path(resolved)
    if path.exists() and not path.is_dir():
        problems.add(PATH, f"'{written}' is not a directory; expected the directory holding the model's files")
    elif not path.exists() and on_this_host and _engine_runs_here(runtime):
        made = how_to_make(path)
        get_it = f"{made}" if made else "copy or download the model's files there"
        problems.add(
            PATH,
            f"'{written}' does not exist on this host (looked for {resolved}); expected the directory holding the "
            f"model's files (Docker would create an empty one, owned by root, and the engine would fail): {get_it}; "
            "for a playbook meant for another machine, `llmplay validate --any-host` checks everything else",
        )


def _dangerous(path: PurePosixPath) -> str | None:
    if path == PurePosixPath("/"):
        return "the root of the filesystem"
    for tree in SYSTEM_TREES:
        if path == tree or tree in path.parents:
            return f"inside the system directory {tree}"
    home = PurePosixPath(os.path.abspath(os.path.expanduser("~")))
    if path in HOME_ROOTS or path.parent in HOME_ROOTS or path == home or path in home.parents:
        return "a home directory (or above one), with its keys and credentials"
    through = CREDENTIAL_DIRS.intersection(path.parts)
    if through:
        return f"inside the credential directory {sorted(through)[0]}"
    try:
        held = sorted(name for name in CREDENTIAL_DIRS if os.path.lexists(os.path.join(path, name)))
    except OSError:
        held = []
    if held:
        return f"a directory holding {held[0]} (somebody's home)"
    return None


def _holds_protected(path: PurePosixPath, protected: dict[PurePosixPath, str]) -> str | None:
    for folder, what in protected.items():
        if path == folder:
            return f"{what} ({folder})"
        if path in folder.parents:
            return f"a directory above {what} ({folder})"
    return None


def _engine_runs_here(runtime: RuntimeSpec) -> bool:
    # A ray node or a remote Docker daemon mounts its own filesystem's path; an endpoint mounts nothing.
    if runtime.kind not in ("docker", "process"):
        return False
    return runtime.docker_host is None or runtime.docker_host.startswith("unix://")
