#!/usr/bin/env bash
# Runs tests N times and prints how many of the N runs each test passed, from pytest's own
# report (-rA: one PASSED/FAILED/ERROR line per test). Usage:
#   scripts/soak_tests.sh N [TEST_ID_OR_PYTEST_ARG...]    (default: every e2e test, -m e2e)
# e.g. scripts/soak_tests.sh 20 tests/e2e/test_demo.py tests/e2e/test_faults.py::test_bucket_unreachable_for_15_seconds
# Each run's whole output stays in the printed log folder.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/soak_tests.sh N [tests...]}
shift
[ $# -gt 0 ] || set -- -m e2e
logs=$(mktemp -d "${TMPDIR:-/tmp}/soak.XXXXXX")
for i in $(seq 1 "$n"); do
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" nice "${PYTHON:-.venv/bin/python}" -m pytest \
    -p no:cacheprovider -q -rA "$@" >"$logs/run-$i.log" 2>&1
  echo "run $i/$n: $(awk 'NF { last = $0 } END { print last }' "$logs/run-$i.log")"
done
# a test passed a run when that run reports it PASSED and no FAILED/ERROR (e.g. its teardown)
awk -v n="$n" '
  $1 ~ /^(PASSED|FAILED|ERROR)$/ && $2 ~ /::/ {
    id = substr($0, length($1) + 2); sub(/ - .*/, "", id)  # ids may hold spaces; " - why"
    key = FILENAME SUBSEP id; ids[id] = 1
    if ($1 == "PASSED") passed[key] = 1; else failed[key] = 1
  }
  END {
    for (key in passed) if (!(key in failed)) { split(key, k, SUBSEP); count[k[2]]++ }
    for (id in ids) printf "%d/%d %s\n", count[id], n, id
  }' "$logs"/run-*.log | sort -t " " -k2
echo "logs: $logs"
