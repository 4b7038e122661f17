#!/usr/bin/env bash
# What a user who `pip install`s the wheel gets, today: builds the wheel, installs it into a
# fresh virtualenv on pyproject.toml's ranges with the newest versions they allow (no lock),
# and runs scripts/wheel_smoke.py there, outside the repository: the server starts on the
# embedded default and a worker and a learner round trip through the typed client.
# A release of a dependency that breaks the product shows here as a failing smoke test.
#   scripts/wheel_smoke.sh [EXTRAS]     # default server,worker,learner
# torch comes from the local CPU wheel folder (ASYNCGRPO_TORCH_WHEELS, /opt/wheels) when it
# exists; elsewhere PyPI's build, which on Linux is the CUDA one (several GB).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
extras=${1:-server,worker,learner}
wheels=${ASYNCGRPO_TORCH_WHEELS:-/opt/wheels}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
uv() { bash "$root/scripts/uv.sh" "$@"; }
echo "== building the wheel"
# from a copy: setuptools writes build/ and *.egg-info into the tree it builds, and a stale
# build/ would put old files into the next wheel
mkdir "$tmp/src"
tar -C "$root" --exclude='./.*' --exclude=./build --exclude=./dist --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=./bucket --exclude='./asyncgrpo.db*' -cf - . | tar -C "$tmp/src" -xf -
uv build -q --wheel --out-dir "$tmp/dist" "$tmp/src"
wheel=$(ls "$tmp"/dist/asyncgrpo-*.whl)
echo "== installing $(basename "$wheel")[$extras] on its ranges, newest versions"
uv venv -q --python "${PYTHON:-python3}" "$tmp/venv"
links=()
[ -d "$wheels" ] && links=(--find-links "$wheels")
uv pip install -q --python "$tmp/venv/bin/python" "${links[@]}" "$wheel[$extras]"
uv pip freeze --python "$tmp/venv/bin/python" >"$tmp/freeze.txt"
echo "   $(wc -l <"$tmp/freeze.txt") packages; httpx $(grep -i '^httpx==' "$tmp/freeze.txt" | cut -d= -f3)"
echo "== smoke test"
cd "$tmp"
env -u PYTHONPATH "$tmp/venv/bin/python" "$root/scripts/wheel_smoke.py" "$tmp/scratch"
