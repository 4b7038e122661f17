#!/usr/bin/env bash
# System packages the test suite uses: Debian's Chromium (browser tests; never a downloaded
# browser) and docker-compose (validates docker/compose.yaml; no Docker engine is needed).
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
