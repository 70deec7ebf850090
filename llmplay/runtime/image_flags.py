"""What an engine image says about itself before any trial: its id, version label and the flags its server
accepts, read from `--help` in a throw-away container (no network, removed at once) and cached per image id,
so asking again costs a file read."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.errors

from llmplay.engines.base import IMAGE_VERSION_LABELS, Engine
from llmplay.errors import InfrastructureError
from llmplay.runtime.cache import default_cache_dir
from llmplay.runtime.docker import owner_labels
from llmplay.runtime.labels import LABEL_INSTANCE, LABEL_RUN

if TYPE_CHECKING:
    from docker import DockerClient

HELP_TIMEOUT_S = 300.0  # importing vLLM on two busy cores takes tens of seconds
# A flag as argparse, llama.cpp's arg.cpp, clap (TGI) and click print it: `--name`, not `---` rules.
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)")


@dataclass(frozen=True)
class ImageFlags:
    image: str
    image_id: str
    version: str | None  # from the image's labels; None when it has none
    flags: frozenset[str]
    help_s: float  # how long `--help` took when it ran (0 when read from the cache)
    cached: bool


def flags_in_help(text: str) -> frozenset[str]:
    """Every flag a help text names (its usage lines and its option lists)."""
    return frozenset(m.group(1) for m in _FLAG.finditer(text))


def _cache_file(cache: Path, image_id: str, argv: list[str]) -> Path:
    key = hashlib.sha256(json.dumps([image_id, argv]).encode()).hexdigest()[:24]
    return cache / "preflight" / f"{key}.json"


def image_flags(client: DockerClient, image_ref: str, engine: Engine, cache: Path | None = None) -> ImageFlags | None:
    """The image's accepted flags, or None when the image is not on this machine (the trial says how to get it)."""
    try:
        image = client.images.get(image_ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise InfrastructureError(f"Docker could not inspect image {image_ref}: {exc.explanation or exc}") from None
    labels = image.labels or {}
    version = next((str(labels[k]) for k in IMAGE_VERSION_LABELS if labels.get(k)), None)
    argv = [*engine.entrypoint, *engine.help_args]
    path = _cache_file(cache or default_cache_dir(), image.id, argv)
    if path.is_file():
        with contextlib.suppress(ValueError, KeyError, OSError):
            data = json.loads(path.read_text())
            return ImageFlags(image_ref, image.id, version, frozenset(data["flags"]), 0.0, True)
    t0 = time.perf_counter()
    text = _run_help(client, image_ref, argv)
    flags = flags_in_help(text)
    if len(flags) < 3:
        raise InfrastructureError(
            f"`{' '.join(argv) or '--help'}` in image {image_ref} printed no flag list; its start of output: "
            f"{text.strip()[:200]!r}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"image": image_ref, "image_id": image.id, "argv": argv, "flags": sorted(flags)}))
    tmp.replace(path)
    return ImageFlags(image_ref, image.id, version, flags, time.perf_counter() - t0, False)


def _run_help(client: DockerClient, image_ref: str, argv: list[str]) -> str:
    instance = uuid.uuid4().hex[:12]
    container = client.containers.create(
        image_ref,
        command=argv,
        labels={LABEL_RUN: "preflight", LABEL_INSTANCE: instance, **owner_labels()},
        name=f"llmplay-preflight-{instance}",
        network_disabled=True,
    )
    try:
        container.start()
        try:
            container.wait(timeout=HELP_TIMEOUT_S)
        except Exception as exc:  # the SDK raises requests' timeout types, not its own
            raise InfrastructureError(
                f"`--help` in image {image_ref} did not finish within {HELP_TIMEOUT_S:.0f}s ({type(exc).__name__})"
            ) from None
        return str(container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace"))
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
