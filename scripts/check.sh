#!/usr/bin/env bash
# Static checks, as scripts/test.sh runs them before pytest: the locks against pyproject.toml
# (scripts/lock.sh --check), ruff's lint, ruff's format check, mypy (the packages and settings
# are in pyproject.toml) and the docs site's strict build (mkdocs.yml; into a temporary folder,
# removed afterwards). Runs all five, then exits 1 naming each one that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
failed=()
check() {
  echo "== $*"
  "$@" || failed+=("$*")
}
check bash scripts/lock.sh --check
check "$BIN/ruff" check .
check "$BIN/ruff" format --check .
check "$BIN/mypy"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
# not --quiet: it hides the warnings that --strict counts, and the build then passes
NO_MKDOCS_2_WARNING=1 check "$BIN/mkdocs" build --strict -d "$site"
if ((${#failed[@]})); then
  printf 'check failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "static checks passed"
