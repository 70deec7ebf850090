"""Secrets enter only by reference (`${env:NAME}`), are resolved at launch, and are redacted wherever text is written."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from llmplay.errors import PlaybookError

ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
# A name is secret when it *ends* in a secret word (HF_TOKEN, OPENAI_API_KEY, db_password, GITHUBTOKEN, x-api-key):
# `tokenizer`, `prefix_tokens` or `max_tokens` are not, and blanking them would make an archived playbook unloadable.
# AUTH counts only as a whole part (proxy_auth, X-AUTH): a longer word that merely ends in it need not be a secret.
SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|SECRET[_-]?KEY|"
    r"CREDENTIALS?|(^|[_.-])AUTH)$",
    re.I,
)
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@", re.I)
REDACTED = "***"
# In YAML text: `KEY: value` lines (a list item or quoted key too), and the values that are plain data, never secret.
_YAML_KEY_LINE = re.compile(r"^(?P<head>\s*-?\s*[\"']?(?P<key>[A-Za-z0-9_.-]+)[\"']?\s*:\s*)(?P<value>\S.*?)\s*$")
_PLAIN_SCALAR = re.compile(r"(-?[0-9][0-9_.eE+-]*|true|false|null|~)(\s+#.*)?", re.I)


def resolve_env(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Replace `${env:NAME}` with the caller's environment; a missing variable is the user's error."""
    source = os.environ if environ is None else environ

    def sub(match: re.Match) -> str:
        name = match.group(1)
        if name not in source:
            raise PlaybookError(
                f"engine.env references ${{env:{name}}} but {name} is not set in llmplay's "
                f"environment; expected `export {name}=...` before running"
            )
        return source[name]

    return {k: ENV_REF.sub(sub, str(v)) for k, v in env.items()}


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values that must never be written: resolved secret-named vars and anything that came from a reference."""
    out = []
    for name, value in env.items():
        if value and (SECRET_NAME.search(name)) and len(value) >= 4:
            out.append(value)
    return out


def referenced_values(values: Any, environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of every `${env:NAME}` found in `values` (strings, nested mappings/sequences): whatever
    a playbook pulls from the environment is secret, whatever the key it lands under is called."""
    source = os.environ if environ is None else environ
    names: set[str] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, str):
            names.update(ENV_REF.findall(obj))
        elif isinstance(obj, Mapping):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(values)
    return [source[n] for n in sorted(names) if len(source.get(n, "")) >= 4]


def redact_text(text: str, secrets: Sequence[str] = ()) -> str:
    for value in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact(obj: Any, secrets: Sequence[str] = ()) -> Any:
    """Deep copy with secret-named keys and secret values blanked; keeps `${env:X}` references (they are not secret)."""
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if (
                isinstance(key, str)
                and SECRET_NAME.search(key)
                and isinstance(value, str)
                and not ENV_REF.fullmatch(value)
            ):
                out[key] = REDACTED
            else:
                out[key] = redact(value, secrets)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    return obj


def redact_yaml_text(text: str, secrets: Sequence[str] = ()) -> str:
    """YAML text as archived: known secret values, URL credentials and literal values of secret-named keys blanked;
    `${env:X}` references, numbers, booleans, nested blocks and comments are kept, so the text still loads."""
    lines = []
    for line in redact_text(text, secrets).splitlines(keepends=True):
        end = "\n" if line.endswith("\n") else ""
        match = _YAML_KEY_LINE.match(line.rstrip("\n"))
        if match and SECRET_NAME.search(match.group("key")):
            value = match.group("value")
            bare = value.strip("\"'")
            if (
                not ENV_REF.fullmatch(bare)
                and not value.startswith(("{", "[", "#", "|", ">"))
                and not _PLAIN_SCALAR.fullmatch(value)
            ):
                line = f"{match.group('head')}{REDACTED}{end}"
        lines.append(line)
    return "".join(lines)
