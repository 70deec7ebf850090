"""Secrets enter only by reference (`${env:NAME}`), are resolved at launch, and are redacted wherever text is written."""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import overload

from llmplay.errors import PlaybookError

ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
# A name is secret when it *ends* in a secret word (HF_TOKEN, OPENAI_API_KEY, db_password, GITHUBTOKEN, x-api-key):
# `tokenizer`, `prefix_tokens` or `max_tokens` are not, and blanking them would make an archived playbook unloadable.
# AUTH counts only as a whole part (proxy_auth, X-AUTH): a longer word that merely ends in it need not be a secret.
# KEY, PAT, PASS and PWD count only as a whole last part too (OPENAI_KEY, GITHUB_PAT, DB_PASS, MYSQL_PWD; not
# `monkey`, `compass`); `num_key_value_heads` does not end in a secret word at all.
SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|SECRET[_-]?KEY|"
    r"CREDENTIALS?|(^|[_.-])(AUTH|KEY|PAT|PASS)|[_.-]PWD)$",
    re.I,
)
# An environment variable or a command-line flag is a credential's home when any whole part of its name is one of
# these (HF_TOKEN_PATH, AWS_SECRET_ACCESS_KEY, --api-key, --hf-token): stricter than SECRET_NAME, which must not
# blank ordinary document keys. TOKENIZERS_PARALLELISM, PYTHONPATH and --max-num-batched-tokens have no such part.
_CREDENTIAL_PARTS = {
    "TOKEN", "SECRET", "PASS", "PASSWORD", "PASSWD", "PASSPHRASE", "PWD", "KEY", "APIKEY", "PAT", "CREDENTIAL",
    "CREDENTIALS", "AUTH", "PRIVATE",
}  # fmt: skip
# Values that are switches, not secrets, even under such a name (NCCL_PAT_ENABLE=1, AUTH_DISABLED=true).
_SWITCH = re.compile(r"(true|false|yes|no|on|off|0|1|-1|)", re.I)
# Credential formats their issuers publish so that leaks can be found: Hugging Face, OpenAI and Anthropic, GitHub,
# GitLab, Slack, AWS access key ids, Google API keys, PEM private keys, JSON Web Tokens. A prefix counts with any
# length from eight characters after it: the full-length forms as issued, and shorter ones that carry a digit
# (sk-live-LITERAL-888888 is a key by its shape whatever its length; `hf_transfer` is a word).
_TOKEN_PREFIX = r"(?:sk-|hf_|gh[pousr]_|github_pat_|glpat-|xox[abposr]-)"
KNOWN_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|"
    r"glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}|"
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
    r")"
    rf"|(?<![A-Za-z0-9_-]){_TOKEN_PREFIX}(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{{8,}}"
    r"|(?<![A-Za-z0-9_-])(?:AKIA|ASIA)(?=[0-9A-Z]*[0-9])[0-9A-Z]{8,}"
)
_RANDOM_RUN = re.compile(r"[A-Za-z0-9+]{20,}")
_CONFIG_KEYS = frozenset({"env", "extra_args"})  # where a configuration keeps free-form text
_HEX = re.compile(r"[0-9a-fA-F]+")
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@", re.I)
REDACTED = "***"
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s:]+:[^/@\s]+@", re.I)
# In YAML text: `KEY: value` lines (a list item or quoted key too), and the values that are plain data, never secret.
_YAML_KEY_LINE = re.compile(r"^(?P<head>\s*-?\s*[\"']?(?P<key>[A-Za-z0-9_.-]+)[\"']?\s*:\s*)(?P<value>\S.*?)\s*$")
_PLAIN_SCALAR = re.compile(r"(-?[0-9][0-9_.eE+-]*|true|false|null|~)(\s+#.*)?", re.I)


def is_credential_name(name: str) -> bool:
    """Whether an environment variable or flag named `name` holds a credential (by any whole part of its name)."""
    parts = [p.upper() for p in re.split(r"[^A-Za-z0-9]+", name) if p]
    if parts == ["PWD"]:
        return False  # the shell's working directory
    return bool(set(parts) & _CREDENTIAL_PARTS) or bool(SECRET_NAME.search(name.strip("-")))


def is_switch(value: str) -> bool:
    """true/false/yes/no/on/off/0/1/-1 or nothing: a setting, never a secret."""
    return bool(_SWITCH.fullmatch(value.strip()))


def credential_kind(value: str) -> str | None:
    """What in `value` looks like a credential ("a token in a known format", "a random-looking string"), or None."""
    if KNOWN_TOKEN.search(value):
        return "a token in a known credential format"
    if _URL_PASSWORD.search(value):
        return "a URL with a password"
    if random_runs(value):
        return "a random-looking string (like a key or token)"
    return None


def random_runs(value: str) -> list[str]:
    """The runs of `value` that look random, like a key or token in a format not listed.

    A run of 20+ letters and digits that is not hex (digests, commit ids), mixes letter cases or digits, and changes
    character class at least every other character (random text does about 6 times in 10; model names like
    DeepSeekR1DistillQwen32B under half)."""
    found = []
    for run in _RANDOM_RUN.findall(value):
        if _HEX.fullmatch(run):
            continue
        kinds = ["a" if c.islower() else "A" if c.isupper() else "0" if c.isdigit() else "+" for c in run]
        classes = len(set(kinds))
        if classes < 2:
            continue
        changes = sum(a != b for a, b in itertools.pairwise(kinds)) / (len(run) - 1)
        if _entropy_bits(run) >= 3.5 and changes >= (0.5 if classes >= 3 else 0.3):
            found.append(run)
    return found


def shaped_secrets(obj: object) -> list[str]:
    """Values under an `env` or `extra_args` key anywhere in `obj` that look like a credential by their shape (a
    random-looking run), whatever the name they sit under: a configuration's free text holds no such thing unless
    it is one. They are then blanked wherever they appear (a docker line repeats them), like known secrets."""
    found: list[str] = []
    stack: list[tuple[object, bool]] = [(obj, False)]
    while stack:
        node, in_config = stack.pop()
        if isinstance(node, str):
            if in_config:
                found.extend(random_runs(node))
        elif isinstance(node, Mapping):
            stack.extend((v, in_config or k in _CONFIG_KEYS) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, in_config) for v in node)
    return found


def _entropy_bits(text: str) -> float:
    counts: dict[str, int] = {}
    for c in text:
        counts[c] = counts.get(c, 0) + 1
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def resolve_args(
    args: Sequence[str], environ: Mapping[str, str] | None = None, where: str = "engine.extra_args"
) -> tuple[str, ...]:
    """Command-line arguments with `${env:NAME}` replaced from the caller's environment, as env values are."""
    resolved = resolve_env({str(i): arg for i, arg in enumerate(args)}, environ, where)
    return tuple(resolved[str(i)] for i in range(len(args)))


def resolve_env(
    env: Mapping[str, str], environ: Mapping[str, str] | None = None, where: str = "engine.env"
) -> dict[str, str]:
    """Replace `${env:NAME}` with the caller's environment; a missing variable is the user's error, named at
    `where` (the YAML path the values came from)."""
    source = os.environ if environ is None else environ

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in source:
            raise PlaybookError(f"{where}: {unset_reference(name)}")
        return source[name]

    return {k: ENV_REF.sub(sub, str(v)) for k, v in env.items()}


def unset_reference(name: str) -> str:
    """The message for a `${env:NAME}` whose variable is not set."""
    return (
        f"references ${{env:{name}}} but {name} is not set in llmplay's environment; "
        f"expected `export {name}=...` before running"
    )


def unset_names(value: object, environ: Mapping[str, str] | None = None) -> list[str]:
    """The names of the `${env:NAME}` references in `value` whose variables are not set."""
    source = os.environ if environ is None else environ
    return [name for name in ENV_REF.findall(str(value)) if name not in source]


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values that must never be written: resolved secret-named vars and anything that came from a reference."""
    out = []
    for name, value in env.items():
        if value and (SECRET_NAME.search(name)) and len(value) >= 4:
            out.append(value)
    return out


def referenced_values(values: object, environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of every `${env:NAME}` found in `values` (strings, nested mappings/sequences): whatever
    a playbook pulls from the environment is secret, whatever the key it lands under is called."""
    source = os.environ if environ is None else environ
    names: set[str] = set()

    def walk(obj: object) -> None:
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
    """Known secret values, URL credentials and tokens in a known credential format blanked (the loader refuses
    those in a playbook; a comment, a log line or an engine's echo may still carry one)."""
    for value in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = KNOWN_TOKEN.sub(REDACTED, text)
    return URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


@overload
def redact(
    obj: Mapping[str, object], secrets: Sequence[str] = (), found: list[str] | None = None, where: str = ""
) -> dict[str, object]: ...
@overload
def redact(
    obj: list[object] | tuple[object, ...], secrets: Sequence[str] = (), found: list[str] | None = None, where: str = ""
) -> list[object]: ...
@overload
def redact(obj: object, secrets: Sequence[str] = (), found: list[str] | None = None, where: str = "") -> object: ...
def redact(obj: object, secrets: Sequence[str] = (), found: list[str] | None = None, where: str = "") -> object:
    """Deep copy with secret-named keys and secret values blanked; keeps `${env:X}` references (they are not secret).

    Blanked too, by shape: tokens in a known format anywhere, and random-looking values under `env` or
    `extra_args` whatever their name. `found` (when given) gets the path of every value changed, from `where`
    (`configs[baseline].engine.env.MODEL_NOTE`): a reader learns which values were redacted, never their text."""
    secrets = [*secrets, *shaped_secrets(obj)]
    return _redact(obj, secrets, [] if found is None else found, where)


def _redact(obj: object, secrets: Sequence[str], found: list[str], where: str) -> object:
    if isinstance(obj, Mapping):
        out: dict[object, object] = {}
        for key, value in obj.items():
            path = f"{where}.{key}" if where else str(key)
            if (
                isinstance(key, str)
                and SECRET_NAME.search(key)
                and isinstance(value, str)
                and not ENV_REF.fullmatch(value)
            ):
                out[key] = REDACTED
                if value != REDACTED:
                    found.append(path)
            else:
                out[key] = _redact(value, secrets, found, path)
        return out
    if isinstance(obj, (list, tuple)):
        return [_redact(v, secrets, found, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, str):
        text = redact_text(obj, secrets)
        if text != obj:
            found.append(where or "(value)")
        return text
    return obj


def redact_yaml_text(text: str, secrets: Sequence[str] = (), found: list[int] | None = None) -> str:
    """YAML text as archived: known secret values, URL credentials and literal values of secret-named keys blanked;
    `${env:X}` references, numbers, booleans, nested blocks and comments are kept, so the text still loads.
    `found` (when given) gets the 1-based number of every line changed."""
    lines = []
    original = text.splitlines(keepends=True)
    redacted = redact_text(text, secrets).splitlines(keepends=True)
    aligned = len(original) == len(redacted)  # a secret with a line break in it shifts every line after it
    for lineno, line in enumerate(redacted, start=1):
        before = original[lineno - 1] if aligned else None
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
        if found is not None and (line != before if before is not None else REDACTED in line):
            found.append(lineno)
        lines.append(line)
    return "".join(lines)
