"""One seed formula (protocol/seeds.py): the lease seed the one-statement grant computes in SQL on
Postgres, the one the grant's SQLite form computes in Python (server/leases/statements.py), and
the seeds the worker derives from a lease's seed are the same function of the same parts: the
first 8 bytes of sha256 of the parts joined by ":", big-endian, top bit masked off."""

from __future__ import annotations

import hashlib
import itertools
import uuid

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from protocol.seeds import derived_seed, seed_prefix, seed_sql
from tests.server.leases.helpers import make_run, make_worker
from worker.environments.backend_engine import turn_seed

RUN_IDS = [uuid.UUID(int=0), uuid.UUID("7d8f2c1e-3b4a-4c5d-8e9f-0a1b2c3d4e5f")]
SEEDS = [0, 7, 2**31 - 1]
FENCINGS = [1, 2, 99, 2**40]


def spec(*parts: object) -> int:
    """The formula as the architecture states it, written out here."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()
    return int(digest[:16], 16) % 2**63


def test_sql_seed_is_the_python_seed_on_postgres(pg_admin: Engine) -> None:
    statement = text(f"SELECT {seed_sql('CAST(:prefix AS text) || CAST(:last AS bigint)::text')}")
    with pg_admin.connect() as conn:
        for run_seed, run_id, fencing in itertools.product(SEEDS, RUN_IDS, FENCINGS):
            got = conn.execute(
                statement, {"prefix": seed_prefix(run_seed, run_id), "last": fencing}
            ).scalar_one()
            assert got == derived_seed(run_seed, run_id, fencing) == spec(run_seed, run_id, fencing)


def test_granted_seed_is_the_formula_and_the_worker_derives_the_same(
    lease_client: TestClient,
    db: Session,
    lease_path,  # type: ignore[no-untyped-def]
) -> None:
    """On every lease path (the SQL grant on Postgres, the Python one on SQLite)."""
    run = make_run(db, n_rows=4, seed=11)
    _, token = make_worker(db)
    db.commit()
    headers = {"Authorization": f"Bearer {token}"}
    for _ in range(2):
        answer = lease_client.post("/api/v1/leases/acquire", json={}, headers=headers)
        assert answer.status_code == 200, answer.text
        lease = answer.json()
        assert lease["seed"] == spec(11, run.id, lease["fencing"])
        # the worker's per-turn seeds (and per completion: derived_seed(seed, prompt, completion))
        assert turn_seed(lease["seed"], 3) == spec(lease["seed"], 3)
        assert derived_seed(lease["seed"], 1, 0) == spec(lease["seed"], 1, 0)
