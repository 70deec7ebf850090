#!/bin/sh
# Build (or reuse from ~/.cache/llmplay) the CPU engine: llama.cpp's server (prebuilt), a tiny GGUF, and the local
# image llmplay/llamacpp-cpu:local. Same as `llmplay engine build-cpu`. Extra arguments:
# --force, --no-image, --cache-dir DIR, --llama-cpp-python VERSION (that release built from source, as
# llmplay/llamacpp-cpu:VERSION).
set -e
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" -m llmplay.runtime.cpu_image "$@"
