#!/usr/bin/env bash
# Static checks, as scripts/test.sh runs them before pytest: ruff's lint, ruff's format check and
# mypy (the packages and settings are in pyproject.toml). Runs all three, then exits 1 naming
# each one that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
failed=()
check() {
  echo "== $*"
  "$@" || failed+=("$*")
}
check "$BIN/ruff" check .
check "$BIN/ruff" format --check .
check "$BIN/mypy"
if ((${#failed[@]})); then
  printf 'check failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "static checks passed"
