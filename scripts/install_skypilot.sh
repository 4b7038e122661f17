#!/usr/bin/env bash
# Creates ./.venv-skypilot: SkyPilot alone, so tests/deploy/test_skypilot.py can check
# deploy/skypilot/worker.yaml against SkyPilot's own task schema (its Task.from_yaml) offline.
# Kept out of ./.venv: SkyPilot pulls many cloud SDK pins. Idempotent; ~35 s and ~460 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SKYPILOT_VENV:-.venv-skypilot}
VERSION=0.14.1
if [ -f "$VENV/.installed-$VERSION" ]; then
  echo "$VENV already installed"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q "skypilot==$VERSION"
"$VENV/bin/python" -c "import sky; print('skypilot', sky.__version__)"
touch "$VENV/.installed-$VERSION"
