#!/usr/bin/env bash
# Static checks, the same locally and in CI: lint, format, import layering (no cycles), types.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLMPLAY_VENV:-.venv}/bin
"$BIN/ruff" check .
"$BIN/ruff" format --check .
"$BIN/lint-imports"
"$BIN/mypy"
