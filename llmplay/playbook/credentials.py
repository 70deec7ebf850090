"""Literal credentials refused while the playbook loads: a secret enters a playbook only as `${env:NAME}`, resolved at
launch and redacted from every output, so a shared playbook, its archive and its report never hold one.

What looks like a credential (names, known token formats, random-looking strings) is llmplay.redaction's; which
places of a playbook are checked, and the messages, are here. A message never repeats the value it refuses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from llmplay.files import display_path
from llmplay.playbook.problems import Problems
from llmplay.playbook.source import YamlPath
from llmplay.redaction import (
    ENV_REF,
    KNOWN_TOKEN,
    credential_kind,
    is_credential_name,
    is_switch,
    unset_names,
    unset_reference,
)
from llmplay.spec import Playbook


def _reference_hint(name: str) -> str:
    var = re.sub(r"[^A-Za-z0-9]+", "_", name.strip("-")).strip("_").upper() or "NAME"
    return f"a reference like ${{env:{var}}} (export {var}=... before running), so the value never enters the file"


def check_env(env: Mapping[str, object], path: YamlPath, problems: Problems) -> None:
    """engine.env (or a step's env.NAME): under a credential-like name only a reference or a switch; under any
    name no value that looks like a credential."""
    for name, raw in env.items():
        check_env_value(str(name), raw, (*path, str(name)), problems)


def check_env_value(name: str, raw: object, path: YamlPath, problems: Problems) -> None:
    if not isinstance(raw, str):
        return  # numbers and booleans are settings
    if is_credential_name(name) and not ENV_REF.search(raw) and not is_switch(raw):
        problems.add(path, f"'{name}' looks like a secret written in the playbook; expected {_reference_hint(name)}")
        return
    kind = credential_kind(ENV_REF.sub("", raw))
    if kind:
        problems.add(path, f"found {kind} written literally; expected {_reference_hint(name)}")


def check_args(args: Sequence[object], path: YamlPath, problems: Problems) -> None:
    """extra_args: a credential-like flag (`--api-key X`, `--hf-token=X`) takes only a reference; no argument may
    look like a credential. References in extra_args are resolved at launch, as env's are."""
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            continue
        flag, eq, inline = arg.partition("=")
        if flag.startswith("-") and is_credential_name(flag):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
            if (
                isinstance(value, str)
                and not value.startswith("-")
                and not ENV_REF.search(value)
                and (eq or not is_switch(value))  # `--enable-auth true`: a switch, not a secret
            ):
                where = (*path, i) if eq else (*path, i + 1)
                problems.add(
                    where,
                    f"'{flag}' takes a secret written in the playbook; expected {_reference_hint(flag)}",
                )
                continue
        kind = credential_kind(ENV_REF.sub("", arg))
        if kind:
            problems.add((*path, i), f"found {kind} written literally; expected {_reference_hint('secret')}")


def check_knob_value(value: object, path: YamlPath, problems: Problems) -> None:
    """engine.args (or a step's knob): knob values are settings; one that looks like a credential is a leak."""
    if isinstance(value, str) and (kind := credential_kind(value)):
        problems.add(
            path,
            f"found {kind} written literally; expected a setting here, and any secret passed through "
            f"engine.env as {_reference_hint('secret')}",
        )


def check_text(text: str, file: str, problems: Problems) -> None:
    """Tokens in a known credential format anywhere in the file's text, comments included: the archive keeps the
    playbook's text as it was written."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if KNOWN_TOKEN.search(line):
            problems.lines.append(
                f"{display_path(file)}:{lineno}: found a token in a known credential format in the text; "
                f"expected none in a playbook, not even in a comment (use {_reference_hint('secret')})"
            )


def unset_references(playbook: Playbook, environ: Mapping[str, str] | None = None) -> list[str]:
    """`FILE:LINE: YAML.PATH: references ${env:X} but X is not set ...` for every reference the engine's env and
    extra_args take (the base's and each step's) whose variable is not set: a run checks these before it makes an
    archive, so a missing variable leaves neither an archive nor an engine start behind."""
    values: list[tuple[str, object]] = [(f"engine.env.{k}", v) for k, v in playbook.engine.env.items()]
    values += [(f"engine.extra_args[{i}]", arg) for i, arg in enumerate(playbook.engine.extra_args)]
    for i, step in enumerate(playbook.steps):
        values += [
            (f"steps[{i}].set.{c.target}", c.value)
            for c in step.changes
            if c.target.startswith("env.") or c.target == "extra_args"
        ]
    lines = []
    for path, value in values:
        site = _site(playbook, path)
        lines += [f"{site}: {path}: {unset_reference(name)}" for name in dict.fromkeys(unset_names(value, environ))]
    return lines


def _site(playbook: Playbook, path: str) -> str:
    """`FILE:LINE` where `path` (or the nearest block around it) was written."""
    for cut in (path, path.split("[")[0], path.rsplit(".", 1)[0], "engine"):
        if cut in playbook.sites:
            return playbook.sites[cut]
    return display_path(playbook.path)
