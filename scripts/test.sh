#!/usr/bin/env bash
# Installs everything, runs the static checks (scripts/check.sh), then the whole test suite
# (the command .ci/run calls). Arguments go to pytest; pytest does not run when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/check.sh || { echo "scripts/test.sh: static checks failed; pytest not run" >&2; exit 1; }
bash scripts/install_system.sh
[ -f scripts/install_vllm.sh ] && bash scripts/install_vllm.sh
bash scripts/install_skypilot.sh
bash scripts/services.sh
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
set +e
# Four workers by file, longest first: 37 min serially -> under 14 on 2 cores
# (docs/guides/developing.md, "Parallel workers"); ASYNCGRPO_TEST_WORKERS=0 runs serially.
# --durations=30: every run ends with the table of what cost the time (the suite's budget,
# docs/guides/developing.md).
.venv/bin/python -m pytest -p no:cacheprovider -n "${ASYNCGRPO_TEST_WORKERS:-4}" \
  --dist loadfile --no-loadscope-reorder --durations=30 "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": a suite that ran nothing has failed.
exit $rc
