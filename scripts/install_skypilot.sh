#!/usr/bin/env bash
# Creates ./.venv-skypilot from locks/skypilot.txt: SkyPilot alone, so
# tests/deploy/test_skypilot.py can check deploy/skypilot/worker.yaml against SkyPilot's own task
# schema (its Task.from_yaml) offline. Kept out of ./.venv: SkyPilot pulls many cloud SDK pins.
# Idempotent (a stamp holds the lock's digest); ~460 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SKYPILOT_VENV:-.venv-skypilot}
stamp=$( (cat locks/skypilot.txt; echo compiled) | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.installed" 2>/dev/null)" = "$stamp" ]; then
  echo "$VENV already installed"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
bash scripts/uv.sh pip sync -q --compile-bytecode --python "$VENV/bin/python" --require-hashes locks/skypilot.txt
"$VENV/bin/python" -c "import sky; print('skypilot', sky.__version__)"
echo "$stamp" >"$VENV/.installed"
