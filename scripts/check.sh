#!/usr/bin/env bash
# Static checks, the same locally and in CI: lint, format, import layering (no cycles), types.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLMPLAY_VENV:-.venv}/bin
"$BIN/ruff" check .
"$BIN/ruff" format --check .
"$BIN/lint-imports"
"$BIN/mypy"
# The project's static tests (typing comments, README, layout) take seconds; run them with the linters so a change
# that passes ruff and mypy cannot still fail CI on them.
"$BIN/python" -m pytest -q -p no:cacheprovider -m "not slow" tests/project
