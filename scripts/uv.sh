#!/usr/bin/env bash
# Runs the locked uv (locks/uv.txt), installing it first into ./.venv-uv with pip and hashes:
#   bash scripts/uv.sh pip sync ...
# Every install script and scripts/lock.sh go through this, so all of them use one uv version.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv=${ASYNCGRPO_UV_VENV:-$root/.venv-uv}
want=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' "$root/locks/uv.txt")
if [ "$("$venv/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$want" ]; then
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-deps --require-hashes -r "$root/locks/uv.txt" >&2
fi
exec "$venv/bin/uv" "$@"
