#!/usr/bin/env bash
# Development only (before the first release): regenerate migrations/versions/0001 from the
# models against a scratch Postgres database, then check both databases upgrade without drift.
set -euo pipefail
cd "$(dirname "$0")/.."
DB=agr_regen_$$
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $DB" >/dev/null
trap 'psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null' EXIT
rm -f migrations/versions/0001_initial_schema.py
export ASYNCGRPO_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1/$DB
export ASYNCGRPO_SECURITY__SECRET_KEY=regen-regen-regen-regen-regen-regen-00
.venv/bin/alembic revision --autogenerate -m "initial schema" --rev-id 0001 >/dev/null
sed -i "s/server_default=sa.text('clock_timestamp()')/server_default=server.db_types.db_now()/" \
  migrations/versions/0001_initial_schema.py
.venv/bin/ruff format -q migrations/versions/0001_initial_schema.py || true
psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
.venv/bin/python - <<PY
from server.db import make_engine
from server.migrate import upgrade, check
import tempfile, os
for url in ["$ASYNCGRPO_DATABASE_URL", "sqlite:///" + os.path.join(tempfile.mkdtemp(), "x.db")]:
    e = make_engine(url); upgrade(e); check(e); e.dispose()
print("0001 regenerated; upgrade + check clean on Postgres and SQLite")
PY
