#!/usr/bin/env bash
# Installs everything and runs the whole test suite (the command .ci/run calls).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/services.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m pytest -p no:cacheprovider "$@"
