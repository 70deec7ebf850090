"""engine.model_dir checked while the playbook loads: the host directory is mounted into a container whose image the
playbook chooses, so it must hold a model, never the host's system or credentials.

Refused, before and after resolving symlinks: `/`; system trees (/etc, /usr, /var, /proc, /sys, /dev, /boot, /run,
/bin, /sbin, /lib*); home directories themselves (/home, /root, a user's home, $HOME and its parents); any path
through a credential directory (.ssh, .aws, .docker, .config, .gnupg, .kube, ...); a directory that holds one (it
is somebody's home). An existing model_dir must be a directory; a missing one is refused where the engine will run
on this host (Docker would otherwise create it, empty and owned by root, and the run would fail only after an
engine start).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

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


def check_model_dir(
    written: str, base_dir: Path, resolved: str, runtime: RuntimeSpec, on_this_host: bool, problems: Problems
) -> None:
    """Problems for `written` (as in the playbook, relative to `base_dir`) whose symlink-resolved form is `resolved`."""
    lexical = PurePosixPath(os.path.abspath(os.path.join(base_dir, os.path.expanduser(written))))
    real = PurePosixPath(resolved)
    for candidate in dict.fromkeys((lexical, real)):
        why = _dangerous(candidate)
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
        problems.add(
            PATH,
            f"'{written}' does not exist on this host (looked for {resolved}); expected the directory holding the "
            "model's files (Docker would create an empty one, owned by root, and the engine would fail)",
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


def _engine_runs_here(runtime: RuntimeSpec) -> bool:
    # A ray node or a remote Docker daemon mounts its own filesystem's path; an endpoint mounts nothing.
    if runtime.kind not in ("docker", "process"):
        return False
    return runtime.docker_host is None or runtime.docker_host.startswith("unix://")
