"""`llmplay engine ...`: the locally built engine images (llama.cpp and vLLM on CPU, with a tiny model)."""

from __future__ import annotations

import click

from llmplay.errors import ExitCode
from llmplay.runtime.cpu_image import build_cpu_engine
from llmplay.runtime.vllm_image import DEFAULT_VERSION, build_vllm_cpu_engine


def build_cpu_command(*, version: str | None = None, force: bool = False) -> int:
    """Build (or reuse from the cache) the CPU engine image (the prebuilt server, or a llama-cpp-python release built
    from source) and print what is ready."""
    result = build_cpu_engine(force=force, version=version)
    click.echo(f"CPU engine ready: {result.image} ({result.engine_version}), model {result.model_path}")
    return ExitCode.OK


def build_vllm_cpu_command(*, version: str | None = None, force: bool = False) -> int:
    """Build (or reuse from the cache) llmplay/vllm-cpu:VERSION; each step prints its time on stderr."""
    result = build_vllm_cpu_engine(version or DEFAULT_VERSION, force=force, log=lambda m: click.echo(m, err=True))
    click.echo(f"vLLM CPU engine ready: {result.image} ({result.image_id[:19]}), model {result.model_dir}")
    return ExitCode.OK
