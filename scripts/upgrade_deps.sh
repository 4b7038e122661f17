#!/usr/bin/env bash
# The one deliberate way to move the pinned versions (docs/guides/developing.md, "Moving the
# locks"): every lock re-resolved to the newest versions its inputs allow, then the whole
# suite on them, then the wheel alone on its ranges (scripts/wheel_smoke.sh). The moved locks
# stay in the work tree: commit them with whatever the suite made you fix, or undo them with
# `git checkout locks/`.
#   scripts/upgrade_deps.sh [PYTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== re-resolving every lock to the newest versions"
bash scripts/lock.sh --upgrade
git --no-pager diff --stat -- locks/ || true
echo "== the suite on the new locks (scripts/test.sh)"
bash scripts/test.sh "$@"
echo "== the wheel on its ranges (scripts/wheel_smoke.sh)"
bash scripts/wheel_smoke.sh
echo "upgrade_deps: the suite and the wheel smoke test passed on the new locks"
